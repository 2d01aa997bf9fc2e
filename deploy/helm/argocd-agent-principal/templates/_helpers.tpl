{{/* Namespace of every object: Argo CD's namespace. */}}
{{- define "principal.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Labels every object carries: the kustomize base's part-of label and Helm's own. */}}
{{- define "principal.labels" -}}
app.kubernetes.io/part-of: argocd-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of the principal's workload objects (Deployment, Services, pods). */}}
{{- define "principal.componentLabels" -}}
app.kubernetes.io/name: argocd-agent-principal
app.kubernetes.io/component: principal
{{- end -}}

{{- define "principal.serviceAccountName" -}}
{{- default "argocd-agent-principal" .Values.serviceAccount.name -}}
{{- end -}}

{{/* true when a mesh sidecar terminates the agents' mTLS. */}}
{{- define "principal.mesh" -}}
{{- if has .Values.identity.mode (list "istio" "linkerd") }}true{{ end -}}
{{- end -}}

{{/* Refuses an unknown identity mode and mesh rules that cannot become a mesh policy. */}}
{{- define "principal.validate" -}}
{{- if not (has .Values.identity.mode (list "spire" "pem-files" "istio" "linkerd")) -}}
{{- fail (printf "identity.mode must be spire, pem-files, istio or linkerd, not %q" .Values.identity.mode) -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.principal.ha.enable) -}}
{{- fail (printf "replicaCount %d needs principal.ha.enable=true: replicas without HA would each accept the same agent (docs/ha.md)" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if include "principal.mesh" . -}}
{{- range .Values.identity.rules -}}
{{- if not .exact -}}
{{- fail (printf "identity.mode=%s admits in its mesh policy exactly the SPIFFE IDs of `exact` rules; rule %q is a pattern rule (a mesh policy needs a finite list)" $.Values.identity.mode .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The SPIFFE IDs of the exact rules, without the spiffe:// scheme. */}}
{{- define "principal.meshIds" -}}
{{- range .Values.identity.rules }}
- {{ trimPrefix "spiffe://" .exact | quote }}
{{- end }}
{{- end -}}

{{/* The image reference. */}}
{{- define "principal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
