{{/* Names, labels and shared bits of keg's chart. */}}

{{- define "keg.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "keg.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "keg.selector" (list . "ext-proc") */}}
{{- define "keg.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "keg.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "keg.controlPlane" -}}{{ include "keg.fullname" . }}-control-plane{{- end -}}
{{- define "keg.extProc" -}}{{ include "keg.fullname" . }}-ext-proc{{- end -}}
{{- define "keg.postgres" -}}{{ include "keg.fullname" . }}-postgres{{- end -}}

{{/* The Secret holding the store URL (empty: no PostgreSQL store). */}}
{{- define "keg.storeSecret" -}}
{{- if .Values.store.existingSecret -}}
{{ .Values.store.existingSecret }}
{{- else if or .Values.store.url .Values.postgres.enabled -}}
{{ include "keg.fullname" . }}-store
{{- end -}}
{{- end -}}

{{- define "keg.tokensSecret" -}}
{{- if .Values.apiTokens.existingSecret -}}
{{ .Values.apiTokens.existingSecret }}
{{- else if .Values.apiTokens.tokens -}}
{{ include "keg.fullname" . }}-api-tokens
{{- end -}}
{{- end -}}

{{/* The ports of a group's listeners: one per broker it fronts. */}}
{{- define "keg.groupPortCount" -}}
{{- if .brokers -}}{{ len .brokers }}{{- else -}}{{ .brokerCount }}{{- end -}}
{{- end -}}

{{- define "keg.groupHost" -}}
{{- $root := index . 0 -}}{{- $group := index . 1 -}}
{{- $group.advertisedHost | default (printf "%s-envoy-%s.%s.svc" (include "keg.fullname" $root) $group.name $root.Release.Namespace) -}}
{{- end -}}

{{- define "keg.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "keg.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end -}}
