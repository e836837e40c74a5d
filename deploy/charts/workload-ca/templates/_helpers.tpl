{{/* Chart name, at most 63 characters. */}}
{{- define "workload-ca.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: the release name, or <release>-<chart> when the release
name does not contain the chart name. At most 63 characters (a DNS label).
*/}}
{{- define "workload-ca.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "workload-ca.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "workload-ca.selectorLabels" -}}
app.kubernetes.io/name: {{ include "workload-ca.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the helm test objects: not the Deployment's selector. */}}
{{- define "workload-ca.testLabels" -}}
helm.sh/chart: {{ include "workload-ca.chart" . }}
app.kubernetes.io/name: {{ include "workload-ca.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
app.kubernetes.io/part-of: workload-ca
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "workload-ca.labels" -}}
helm.sh/chart: {{ include "workload-ca.chart" . }}
{{ include "workload-ca.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: certificate-authority
app.kubernetes.io/part-of: workload-ca
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "workload-ca.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "workload-ca.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Name of the CA state Secret (ca.mode=secret). */}}
{{- define "workload-ca.caSecretName" -}}
{{- default (printf "%s-ca" (include "workload-ca.fullname" .)) .Values.ca.secret.name }}
{{- end }}

{{/* Name of the leader election Lease. */}}
{{- define "workload-ca.leaseName" -}}
{{- default (include "workload-ca.fullname" .) .Values.leaderElection.id }}
{{- end }}

{{/* DNS names of the serving certificate, comma-separated. */}}
{{- define "workload-ca.servingDNSNames" -}}
{{- $names := .Values.serving.dnsNames }}
{{- if not $names }}
{{- $svc := printf "%s.%s.svc" (include "workload-ca.fullname" .) .Release.Namespace }}
{{- $names = list $svc (printf "%s.cluster.local" $svc) }}
{{- end }}
{{- concat $names .Values.serving.extraDNSNames | uniq | join "," }}
{{- end }}

{{/* Signers the ClusterRole may attest for, as a JSON list. */}}
{{- define "workload-ca.signers" -}}
{{- $signers := list (required "trustBundle.signerName is required" .Values.trustBundle.signerName) }}
{{- if .Values.trustBundle.istioCompatible }}
{{- $signers = append $signers "istio.io/istiod-ca" }}
{{- end }}
{{- $signers | uniq | toJson }}
{{- end }}

{{- define "workload-ca.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Selector of the CA's own series in alert and dashboard queries: the job is the
Service name (the Prometheus Operator's default for a ServiceMonitor).
*/}}
{{- define "workload-ca.promSelector" -}}
job="{{ include "workload-ca.fullname" . }}",namespace="{{ .Release.Namespace }}"
{{- end }}

{{/* Fails rendering on values that cannot work. */}}
{{- define "workload-ca.validate" -}}
{{- if not (has .Values.ca.mode (list "secret" "plugin")) }}
{{- fail (printf "ca.mode must be secret or plugin, not %q" .Values.ca.mode) }}
{{- end }}
{{- if and (eq .Values.ca.mode "plugin") (not .Values.ca.plugin.secretName) }}
{{- fail "ca.plugin.secretName is required when ca.mode is plugin" }}
{{- end }}
{{- if and .Values.ca.keyURI (eq .Values.ca.mode "secret") (not .Values.ca.secret.rootSecretName) }}
{{- fail "ca.keyURI needs ca.mode plugin, or ca.secret.rootSecretName in secret mode: it is the key of that Secret's certificate" }}
{{- end }}
{{- if not .Values.nodeAgents }}
{{- fail "nodeAgents must name at least one namespace/serviceaccount" }}
{{- end }}
{{- range .Values.nodeAgents }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$" .) }}
{{- fail (printf "nodeAgents: %q is not namespace/serviceaccount" .) }}
{{- end }}
{{- end }}
{{- if .Values.admissionPolicy.enabled }}
{{- range .Values.extraArgs }}
{{- if regexMatch "^--?(ca-secret|leader-election-id|leader-election-namespace|signer-name|istio-compatible|istio-root-configmap)(=|$)" (toString .) }}
{{- fail (printf "extraArgs: %s changes an object the admission policies name; set it through the chart's values (or admissionPolicy.enabled=false)" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The binding that enforces (Deny) the ValidatingAdmissionPolicy .policy;
.root is the chart's context. With .namespaces (a label selector in the
syntax of --istio-root-configmap-namespaces), it binds only in the
namespaces that selector matches.
*/}}
{{- define "workload-ca.policyBinding" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .policy }}
  labels:
    {{- include "workload-ca.labels" .root | nindent 4 }}
spec:
  policyName: {{ .policy }}
  validationActions: [Deny]
  {{- with .namespaces }}
  matchResources:
    namespaceSelector:
      {{- include "workload-ca.labelSelector" . | nindent 6 }}
  {{- end }}
{{- end }}

{{/*
The LabelSelector (matchExpressions) of a label selector string as the CA
reads it (k8s.io/apimachinery labels.Parse): requirements joined by commas,
each "k=v", "k==v", "k!=v", "k in (v1,v2)", "k notin (v1,v2)", "k" or "!k".
Rendering fails on anything else (the "<" and ">" of labels.Parse have no
LabelSelector form), rather than the admission policies covering more or
fewer namespaces than the CA serves.
*/}}
{{- define "workload-ca.labelSelector" -}}
{{- $key := `[A-Za-z0-9][-A-Za-z0-9_./]*` -}}
{{- $value := `[-A-Za-z0-9_.]*` -}}
{{- $notExists := printf `!\s*(%s)` $key -}}
{{- $set := printf `(%s)\s+(in|notin)\s*\(\s*(%s(?:\s*,\s*%s)*)\s*\)` $key $value $value -}}
{{- $eq := printf `(%s)\s*(==|=|!=)\s*(%s)` $key $value -}}
{{- $reqs := regexFindAll (printf `%s|%s|%s|%s` $notExists $set $eq $key) . -1 -}}
{{- if ne (join "," $reqs | nospace) (nospace .) -}}
{{- fail (printf "istioRootConfigMap.namespaces: %q is not a label selector of =, ==, !=, in, notin, exists and !exists requirements joined by commas, which the admission policies need (or set admissionPolicy.enabled=false)" .) -}}
{{- end -}}
{{- $notExists = printf `^%s$` $notExists -}}
{{- $set = printf `^%s$` $set -}}
{{- $eq = printf `^%s$` $eq -}}
matchExpressions:
{{- range $reqs }}
{{- if regexMatch $notExists . }}
  - key: {{ regexReplaceAll $notExists . "${1}" | quote }}
    operator: DoesNotExist
{{- else if regexMatch $set . }}
  - key: {{ regexReplaceAll $set . "${1}" | quote }}
    operator: {{ ternary "In" "NotIn" (eq (regexReplaceAll $set . "${2}") "in") }}
    values:
    {{- range splitList "," (regexReplaceAll $set . "${3}") }}
      - {{ trim . | quote }}
    {{- end }}
{{- else if regexMatch $eq . }}
  - key: {{ regexReplaceAll $eq . "${1}" | quote }}
    operator: {{ ternary "NotIn" "In" (eq (regexReplaceAll $eq . "${2}") "!=") }}
    values: [{{ regexReplaceAll $eq . "${3}" | quote }}]
{{- else }}
  - key: {{ . | quote }}
    operator: Exists
{{- end }}
{{- end }}
{{- end }}

{{/*
A CEL expression, for a ValidatingAdmissionPolicy that declares the
variable nsLabels (the labels of the request's namespace), that is true
where the label selector string . matches: the LabelSelector of
workload-ca.labelSelector, requirement by requirement, as Kubernetes
defines In, NotIn, Exists and DoesNotExist.
*/}}
{{- define "workload-ca.selectorCEL" -}}
{{- $terms := list -}}
{{- range (include "workload-ca.labelSelector" . | fromYaml).matchExpressions -}}
{{- $key := printf "'%s'" .key -}}
{{- $values := list -}}
{{- range .values }}{{ $values = append $values (printf "'%s'" .) }}{{ end -}}
{{- $has := printf "%s in variables.nsLabels" $key -}}
{{- $in := printf "variables.nsLabels[%s] in [%s]" $key (join ", " $values) -}}
{{- if eq .operator "In" }}{{ $terms = append $terms (printf "(%s && %s)" $has $in) }}
{{- else if eq .operator "NotIn" }}{{ $terms = append $terms (printf "(!(%s) || !(%s))" $has $in) }}
{{- else if eq .operator "Exists" }}{{ $terms = append $terms (printf "(%s)" $has) }}
{{- else }}{{ $terms = append $terms (printf "!(%s)" $has) }}
{{- end -}}
{{- end -}}
{{- if $terms }}{{ join " && " $terms }}{{ else }}true{{ end -}}
{{- end }}

{{/*
Whether the binary has work only its leader does, and so runs leader
election: rotation of the CA Secret (ca.mode=secret), publishing bundles or
root ConfigMaps, signing PodCertificateRequests. Empty when it has none.
*/}}
{{/*
"true" when the CA publishes ClusterTrustBundles: trustBundle.publish true,
or auto and the cluster serves the API (v1, or v1beta1).
*/}}
{{- define "workload-ca.publishBundles" -}}
{{- $p := .Values.trustBundle.publish }}
{{- if eq (toString $p) "true" }}true
{{- else if and (eq (toString $p) "auto") (or (.Capabilities.APIVersions.Has "certificates.k8s.io/v1/ClusterTrustBundle") (.Capabilities.APIVersions.Has "certificates.k8s.io/v1beta1/ClusterTrustBundle")) }}true
{{- end }}
{{- end }}

{{- define "workload-ca.hasLeaderTasks" -}}
{{- if or (eq .Values.ca.mode "secret") (include "workload-ca.publishBundles" .) .Values.istioRootConfigMap.enabled .Values.podCertificates.enabled .Values.istiodCertificate.enabled }}true{{ end }}
{{- end }}
