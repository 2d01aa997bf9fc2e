{{/* The principal's command-line arguments: the base's, then the identity mode's. */}}
{{- define "principal.args" -}}
- principal
- --identity-rules=/etc/argocd-agent/rules/rules.yaml
- --metrics-host=$(POD_IP)
{{- $mode := .Values.identity.mode }}
{{- if eq $mode "pem-files" }}
- --tls-cert=/etc/argocd-agent/svid/tls.crt
- --tls-key=/etc/argocd-agent/svid/tls.key
- --root-ca=/etc/argocd-agent/svid/ca.crt
{{- else if eq $mode "istio" }}
- --auth=header:istio
- --listen-host=127.0.0.1
- --listen-port={{ .Values.identity.istio.upstreamPort }}
{{- else if eq $mode "linkerd" }}
- --auth=header:linkerd
- --listen-host=$(POD_IP)
- --insecure-header-auth-any-address
- --header-auth-trusted-proxy=$(POD_IP)
{{- end }}
{{- if not .Values.principal.redisProxy.enabled }}
- --disable-redis-proxy
{{- end }}
{{- with .Values.principal.resourceProxy.enabled }}
- --resource-proxy-address=:{{ $.Values.principal.resourceProxy.port }}
{{- end }}
{{- range .Values.principal.additionalArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Environment: the pod's own facts, then every params key as deploy/principal maps it. */}}
{{- define "principal.env" -}}
- name: POD_IP
  valueFrom:
    fieldRef: {fieldPath: status.podIP}
- name: ARGOCD_PRINCIPAL_REPLICA_ID
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
{{- include "principal.paramsEnv" (list "ARGOCD_PRINCIPAL_HA=principal.ha.enable" "ARGOCD_PRINCIPAL_AGENT_EVENT_RATE=principal.agent-event.rate" "ARGOCD_PRINCIPAL_AGENT_EVENT_BURST=principal.agent-event.burst") }}
{{- if eq .Values.identity.mode "spire" }}
- name: SPIFFE_ENDPOINT_SOCKET
  value: unix:///spiffe-workload-api/{{ .Values.identity.spire.socketName }}
{{- end }}
- name: ARGOCD_PRINCIPAL_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .Values.redisSecretName }}, key: {{ .Values.redisPasswordKey }}, optional: true}
{{- include "principal.paramsEnv" (list
  "ARGOCD_PRINCIPAL_LISTEN_HOST=principal.listen.host"
  "ARGOCD_PRINCIPAL_LISTEN_PORT=principal.listen.port"
  "ARGOCD_PRINCIPAL_AUTH=principal.auth"
  "ARGOCD_PRINCIPAL_METRICS_PORT=principal.metrics.port"
  "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE=principal.namespace-create.enable"
  "ARGOCD_PRINCIPAL_LABEL_SELECTOR=principal.label-selector"
  "ARGOCD_PRINCIPAL_LOG_LEVEL=principal.log.level"
  "ARGOCD_PRINCIPAL_LOG_FORMAT=principal.log.format"
  "ARGOCD_PRINCIPAL_HEALTH_CHECK_PORT=principal.healthz.port"
  "ARGOCD_PRINCIPAL_NAMESPACE=principal.namespace"
  "ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES=principal.allowed-namespaces"
  "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN=principal.namespace-create.pattern"
  "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS=principal.namespace-create.labels"
  "ARGOCD_PRINCIPAL_TLS_SECRET_NAME=principal.tls.secret-name"
  "ARGOCD_PRINCIPAL_TLS_SERVER_CERT_PATH=principal.tls.server.cert-path"
  "ARGOCD_PRINCIPAL_TLS_SERVER_KEY_PATH=principal.tls.server.key-path"
  "ARGOCD_PRINCIPAL_TLS_SERVER_ALLOW_GENERATE=principal.tls.server.allow-generate"
  "ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_REQUIRE=principal.tls.client-cert.require"
  "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME=principal.tls.server.root-ca-secret-name"
  "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_PATH=principal.tls.server.root-ca-path"
  "ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_MATCH_SUBJECT=principal.tls.client-cert.match-subject"
  "ARGOCD_PRINCIPAL_TLS_MIN_VERSION=principal.tls.min-version"
  "ARGOCD_PRINCIPAL_TLS_MAX_VERSION=principal.tls.max-version"
  "ARGOCD_PRINCIPAL_TLS_CIPHERSUITES=principal.tls.ciphersuites"
  "ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME=principal.resource-proxy.secret-name"
  "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT_PATH=principal.resource-proxy.tls.cert-path"
  "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_KEY_PATH=principal.resource-proxy.tls.key-path"
  "ARGOCD_PRINCIPAL_RESOURCE_PROXY_CA_SECRET_NAME=principal.resource-proxy.ca.secret-name"
  "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CA_PATH=principal.resource-proxy.ca.path"
  "ARGOCD_PRINCIPAL_JWT_ALLOW_GENERATE=principal.jwt.allow-generate"
  "ARGOCD_PRINCIPAL_JWT_SECRET_NAME=principal.jwt.secret-name"
  "ARGOCD_PRINCIPAL_JWT_KEY_PATH=principal.jwt.key-path"
  "ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET=principal.websocket.enable"
  "ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE=principal.redis.compression.type"
  "ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS=principal.redis.server.address"
  "ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY=principal.resource-proxy.enable"
  "ARGOCD_PRINCIPAL_KEEP_ALIVE_MIN_INTERVAL=principal.keep-alive.min-interval"
  "ARGOCD_PRINCIPAL_PPROF_PORT=principal.pprof.port"
  "ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING=principal.destination-based-mapping"
  "ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT=principal.tls.insecure-plaintext"
  "ARGOCD_PRINCIPAL_EVENT_PROCESSORS=principal.event-processors"
  "ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED=principal.redis.tls.enabled"
  "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT_PATH=principal.redis.proxy.server.tls.cert-path"
  "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY_PATH=principal.redis.proxy.server.tls.key-path"
  "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_SECRET_NAME=principal.redis.proxy.server.tls.secret-name"
  "ARGOCD_PRINCIPAL_REDIS_CA_PATH=principal.redis.ca-path"
  "ARGOCD_PRINCIPAL_REDIS_CA_SECRET_NAME=principal.redis.ca-secret-name"
  "ARGOCD_PRINCIPAL_REDIS_TLS_INSECURE=principal.redis.tls.insecure") }}
{{- end -}}

{{/* One optional configMapKeyRef variable per "ENV=key" of the list. */}}
{{- define "principal.paramsEnv" -}}
{{- range . }}
{{- $pair := splitn "=" 2 . }}
- name: {{ $pair._0 }}
  valueFrom:
    configMapKeyRef: {name: argocd-agent-params, key: {{ $pair._1 }}, optional: true}
{{- end }}
{{- end -}}

{{/* Probes: start-up waits for the first SVID (up to 5 minutes), readiness is /readyz. */}}
{{- define "principal.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 5
  failureThreshold: 60
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 5
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 20
  failureThreshold: 3
{{- end -}}
