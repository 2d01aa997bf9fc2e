{{/* The agent's command-line arguments: the base's, then the identity mode's. */}}
{{- define "agent.args" -}}
- agent
- --metrics-host=$(POD_IP)
{{- $mode := .Values.identity.mode }}
{{- if eq $mode "pem-files" }}
- --tls-cert=/etc/argocd-agent/svid/tls.crt
- --tls-key=/etc/argocd-agent/svid/tls.key
- --root-ca=/etc/argocd-agent/svid/ca.crt
{{- else if include "agent.mesh" . }}
- --insecure-plaintext-any-address
{{- end }}
{{- with .Values.guard }}
{{- range $flag, $value := dict "guard-configmap" .configMap "guard-reload-interval" .reloadInterval "guard-allowed-repos" .allowedRepos "guard-allowed-destinations" .allowedDestinations "guard-allowed-projects" .allowedProjects "guard-cluster-resources" .clusterResources "guard-require-service-account" .requireServiceAccount "guard-local-repositories" .localRepositories }}
{{- if ne (toString $value) "" }}
- {{ printf "--%s=%s" $flag (toString $value) | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.additionalArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Environment: the pod's own facts, then every params key as deploy/agent maps it. */}}
{{- define "agent.env" -}}
- name: POD_IP
  valueFrom:
    fieldRef: {fieldPath: status.podIP}
{{- if eq .Values.identity.mode "spire" }}
- name: SPIFFE_ENDPOINT_SOCKET
  value: unix:///spiffe-workload-api/{{ .Values.identity.spire.socketName }}
{{- end }}
{{- include "agent.paramsEnv" (list
  "ARGOCD_AGENT_MODE=agent.mode"
  "ARGOCD_AGENT_REMOTE_SERVER=agent.server.address"
  "ARGOCD_AGENT_REMOTE_PORT=agent.server.port"
  "ARGOCD_AGENT_CREDS=agent.creds"
  "ARGOCD_AGENT_PRINCIPAL_SPIFFE_ID=agent.principal.spiffe-id"
  "ARGOCD_AGENT_PRINCIPAL_TRUST_DOMAIN=agent.principal.trust-domain"
  "ARGOCD_AGENT_NAMESPACE=agent.namespace"
  "ARGOCD_AGENT_LABEL_SELECTOR=agent.label-selector"
  "ARGOCD_AGENT_KEEP_ALIVE_PING_INTERVAL=agent.keep-alive.interval"
  "ARGOCD_AGENT_METRICS_PORT=agent.metrics.port"
  "ARGOCD_AGENT_LOG_LEVEL=agent.log.level"
  "ARGOCD_AGENT_LOG_FORMAT=agent.log.format"
  "ARGOCD_AGENT_TLS_SECRET_NAME=agent.tls.secret-name"
  "ARGOCD_AGENT_TLS_CLIENT_CERT_PATH=agent.tls.client.cert-path"
  "ARGOCD_AGENT_TLS_CLIENT_KEY_PATH=agent.tls.client.key-path"
  "ARGOCD_AGENT_TLS_INSECURE=agent.tls.client.insecure"
  "ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME=agent.tls.root-ca-secret-name"
  "ARGOCD_AGENT_TLS_ROOT_CA_PATH=agent.tls.root-ca-path"
  "ARGOCD_AGENT_TLS_MIN_VERSION=agent.tls.min-version"
  "ARGOCD_AGENT_TLS_MAX_VERSION=agent.tls.max-version"
  "ARGOCD_AGENT_TLS_CIPHERSUITES=agent.tls.ciphersuites"
  "ARGOCD_AGENT_HEALTH_CHECK_PORT=agent.healthz.port"
  "ARGOCD_AGENT_ENABLE_WEBSOCKET=agent.websocket.enable"
  "ARGOCD_AGENT_ENABLE_COMPRESSION=agent.compression.enable"
  "ARGOCD_AGENT_PPROF_PORT=agent.pprof.port"
  "REDIS_ADDR=agent.redis.address"
  "ARGOCD_AGENT_REDIS_TLS_ENABLED=agent.redis.tls.enabled"
  "ARGOCD_AGENT_REDIS_TLS_CA_PATH=agent.redis.tls.ca-path"
  "ARGOCD_AGENT_REDIS_TLS_INSECURE=agent.redis.tls.insecure"
  "ARGOCD_AGENT_ENABLE_RESOURCE_PROXY=agent.resource-proxy.enable"
  "ARGOCD_AGENT_DESTINATION_BASED_MAPPING=agent.destination-based-mapping"
  "ARGOCD_AGENT_CREATE_NAMESPACE=agent.create-namespace"
  "ARGOCD_AGENT_ALLOWED_NAMESPACES=agent.allowed-namespaces"
  "ARGOCD_AGENT_INSECURE_PLAINTEXT=agent.tls.insecure-plaintext"
  "ARGOCD_AGENT_INFORMER_SYNC_TIMEOUT=agent.informer-sync-timeout") }}
{{- end -}}

{{/* One optional configMapKeyRef variable per "ENV=key" of the list. */}}
{{- define "agent.paramsEnv" -}}
{{- range . }}
{{- $pair := splitn "=" 2 . }}
- name: {{ $pair._0 }}
  valueFrom:
    configMapKeyRef: {name: argocd-agent-params, key: {{ $pair._1 }}, optional: true}
{{- end }}
{{- end -}}

{{/* Probes: start-up and liveness check the listener accepts connections (a disconnected
agent must not be restarted), readiness is /readyz. */}}
{{- define "agent.probes" -}}
startupProbe:
  tcpSocket: {port: metrics}
  periodSeconds: 5
  failureThreshold: 60
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 10
livenessProbe:
  tcpSocket: {port: metrics}
  periodSeconds: 20
  failureThreshold: 3
{{- end -}}
