{{/* Namespace of every object: Argo CD's namespace. */}}
{{- define "agent.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Labels every object carries: the kustomize base's part-of label and Helm's own. */}}
{{- define "agent.labels" -}}
app.kubernetes.io/part-of: argocd-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of the principal's workload objects (Deployment, Services, pods). */}}
{{- define "agent.componentLabels" -}}
app.kubernetes.io/name: argocd-agent-agent
app.kubernetes.io/component: agent
{{- end -}}

{{- define "agent.serviceAccountName" -}}
{{- default "argocd-agent-agent" .Values.serviceAccount.name -}}
{{- end -}}

{{/* true when a mesh sidecar terminates the agents' mTLS. */}}
{{- define "agent.mesh" -}}
{{- if has .Values.identity.mode (list "istio" "linkerd") }}true{{ end -}}
{{- end -}}

{{/* The image reference. */}}
{{- define "agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Refuses an unknown identity mode and a configuration the agent would refuse at start. */}}
{{- define "agent.validate" -}}
{{- if not (has .Values.identity.mode (list "spire" "pem-files" "istio" "linkerd")) -}}
{{- fail (printf "identity.mode must be spire, pem-files, istio or linkerd, not %q" .Values.identity.mode) -}}
{{- end -}}
{{- if not .Values.server -}}
{{- fail "server (the principal's address) is required" -}}
{{- end -}}
{{- if and (not (include "agent.mesh" .)) (not .Values.principalSpiffeId) (not .Values.principalTrustDomain) -}}
{{- fail "principalSpiffeId (or principalTrustDomain) is required: the agent refuses to start without knowing which principal to trust" -}}
{{- end -}}
{{- end -}}
