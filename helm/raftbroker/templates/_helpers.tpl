{{/* Names, labels and the member list shared by the templates. */}}
{{- define "raftbroker.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "raftbroker.headless" -}}{{ include "raftbroker.fullname" . }}-headless{{- end -}}

{{- define "raftbroker.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raftbroker.labels" -}}
{{ include "raftbroker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* DNS domain of the pods: HEADLESS.NAMESPACE.svc.DOMAIN */}}
{{- define "raftbroker.podDomain" -}}
{{ include "raftbroker.headless" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end -}}

{{/* The desired members, ID=RAFT/GRPC comma-separated (pods 0..replicaCount-1) */}}
{{- define "raftbroker.members" -}}
{{- $full := include "raftbroker.fullname" . -}}
{{- $domain := include "raftbroker.podDomain" . -}}
{{- $out := list -}}
{{- range $i := until (int .Values.replicaCount) -}}
{{- $host := printf "%s-%d.%s" $full $i $domain -}}
{{- $out = append $out (printf "%s-%d=%s:%d/%s:%d" $full $i $host (int $.Values.ports.raft) $host (int $.Values.ports.grpc)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{- define "raftbroker.raftSecret" -}}
{{- default (printf "%s-raft" (include "raftbroker.fullname" .)) .Values.raft.existingSecret -}}
{{- end -}}

{{- define "raftbroker.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
