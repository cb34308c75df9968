{{/* Names, labels and the member list shared by the templates. */}}
{{/* The objects' base name; no dots (Helm allows them in release names): Service names and the pods'
host names are DNS labels. */}}
{{- define "raftbroker.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | replace "." "-" | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" (.Release.Name | replace "." "-") .Chart.Name | trunc 50 | trimSuffix "-" -}}
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

{{/* "true" when the nodes run secured (TLS + tokens + ACL), "" when plaintext. Refuses (fail) a
half-configured security: TLS and auth go together (a TLS node without tokens is not authenticated
and would still need --insecure; tokens without TLS would cross the network in plaintext), and
each needs its Secret. Every template that depends on it includes this, so `helm template` fails
whichever file is rendered first. */}}
{{- define "raftbroker.secured" -}}
{{- $tls := .Values.tls -}}
{{- $auth := .Values.auth -}}
{{- if and $tls.enabled (not $tls.secretName) -}}
{{- fail "tls.secretName is required when tls.enabled (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if and $auth.enabled (not $auth.secretName) -}}
{{- fail "auth.secretName is required when auth.enabled (a Secret with tokens.toml and acl.toml)" -}}
{{- end -}}
{{- if and $auth.enabled (not $auth.clientSecretName) -}}
{{- fail "auth.clientSecretName is required when auth.enabled (a Secret with `token`: a cluster-admin token for the probes, the membership hooks and helm test)" -}}
{{- end -}}
{{- if and $auth.enabled (not $tls.enabled) -}}
{{- fail "auth.enabled needs tls.enabled: tokens must not cross the network in plaintext" -}}
{{- end -}}
{{- if and $tls.enabled (not $auth.enabled) -}}
{{- fail "tls.enabled needs auth.enabled: a TLS node without tokens and an ACL is not authenticated (enable both, or neither)" -}}
{{- end -}}
{{- if and $tls.principalFromCert (not $tls.clientAuth) -}}
{{- fail "tls.principalFromCert needs tls.clientAuth (only verified client certificates name a principal)" -}}
{{- end -}}
{{- if and $tls.enabled $auth.enabled -}}true{{- end -}}
{{- end -}}

{{/* Where the pods and Jobs mount the security files (paths used by the env and client.toml). */}}
{{- define "raftbroker.tlsDir" -}}/etc/raftbroker-tls{{- end -}}
{{- define "raftbroker.authDir" -}}/etc/raftbroker-auth{{- end -}}
{{- define "raftbroker.clientDir" -}}/etc/raftbroker-client{{- end -}}
{{- define "raftbroker.raftDir" -}}/etc/raftbroker-raft{{- end -}}
{{- define "raftbroker.clientConfig" -}}/etc/raftbroker/client.toml{{- end -}}

{{/* Volumes the probe clients (hook Jobs, helm test pod) need when secured: the ConfigMap with
client.toml, the CA (TLS Secret) and the admin token (client Secret). */}}
{{- define "raftbroker.clientVolumes" -}}
- name: config
  configMap:
    name: {{ include "raftbroker.fullname" . }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    {{- if not .Values.tls.clientAuth }}
    # the CA only: without mTLS these clients have no use for the node's private key
    items:
      - key: ca.crt
        path: ca.crt
    {{- end }}
- name: client
  secret:
    secretName: {{ .Values.auth.clientSecretName }}
{{- end -}}

{{- define "raftbroker.clientMounts" -}}
- name: config
  mountPath: /etc/raftbroker
  readOnly: true
- name: tls
  mountPath: {{ include "raftbroker.tlsDir" . }}
  readOnly: true
- name: client
  mountPath: {{ include "raftbroker.clientDir" . }}
  readOnly: true
{{- end -}}
