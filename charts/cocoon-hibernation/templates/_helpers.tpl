{{/*
Names, labels and the webhook's TLS material. Cluster-scoped objects (ClusterRole,
ClusterRoleBinding, ValidatingWebhookConfiguration) are named after the fullname, so
two releases need different release names.
*/}}

{{/*
S11: a safety value that the values lack is its safe default, never off. `helm upgrade
--reuse-values` rebuilds the values from the previous chart's values.yaml, so a key that
chart did not have (vmIdentityPolicy.enabled before 0.4.0) arrives absent, and a template
reading it as false would silently drop the safety it guards: S3's policy, the S8 stall
limit. Every template that reads one of these includes this first (it fills them into
.Values once, whatever order Helm renders in). Turning one off takes an explicit value.
Keep the defaults equal to values.yaml: tests/s11_upgrade_test.yaml renders both ways.
*/}}
{{- define "cocoon-hibernation.safetyDefaults" -}}
{{- $defaults := dict
  "vmIdentityPolicy" (dict "enabled" true)
  "controller" (dict "informerStallLimit" "5m")
  "leaderElection" (dict "enabled" true "leaseDuration" "15s")
  "webhook" (dict "failurePolicy" "Fail") }}
{{- range $section, $keys := $defaults }}
{{- $cur := index $.Values $section }}
{{- if not (kindIs "map" $cur) }}
{{- $cur = dict }}
{{- $_ := set $.Values $section $cur }}
{{- end }}
{{- range $key, $value := $keys }}
{{- if kindIs "invalid" (index $cur $key) }}
{{- $_ := set $cur $key $value }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cocoon-hibernation.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cocoon-hibernation.fullname" -}}
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

{{- define "cocoon-hibernation.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cocoon-hibernation.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cocoon-hibernation.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cocoon-hibernation.labels" -}}
helm.sh/chart: {{ include "cocoon-hibernation.chart" . }}
{{ include "cocoon-hibernation.selectorLabels" . }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: cocoonstack
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cocoon-hibernation.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cocoon-hibernation.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cocoon-hibernation.serviceName" -}}
{{- include "cocoon-hibernation.fullname" . }}
{{- end }}

{{- define "cocoon-hibernation.leaseName" -}}
{{- default (include "cocoon-hibernation.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* Secret holding the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{/* S10: this install's name in the registry's owner marker, and in its install ConfigMap. */}}
{{- define "cocoon-hibernation.installName" -}}
{{- printf "%s/%s" .Release.Namespace .Release.Name }}
{{- end }}

{{- define "cocoon-hibernation.tlsSecretName" -}}
{{- if eq .Values.tls.mode "secret" }}
{{- required "tls.secret.name is required with tls.mode=secret" .Values.tls.secret.name }}
{{- else }}
{{- printf "%s-tls" (include "cocoon-hibernation.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "cocoon-hibernation.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* DNS names the serving certificate must cover: the Service, as the apiserver dials it. */}}
{{- define "cocoon-hibernation.dnsNames" -}}
{{- $svc := include "cocoon-hibernation.serviceName" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/*
Self-signed TLS material (tls.mode=self-signed), as YAML: caCrt, tlsCrt, tlsKey (all
base64), expires (unix seconds), fingerprint (of the DNS names).
- An existing Secret is reused when it still covers the same DNS names and has more than
  renewBeforeDays left, so upgrades do not rotate the CA needlessly.
- Otherwise a new CA and serving certificate are generated with genCA/genSignedCert.
- Memoized in .Values for this render: the Secret, the webhook's caBundle and the
  Deployment's checksum all see the same certificate whatever order Helm renders them in.
*/}}
{{- define "cocoon-hibernation.selfSignedTLS" -}}
{{- if not (hasKey .Values "__selfSignedTLS") }}
{{- $dnsNames := include "cocoon-hibernation.dnsNames" . | fromJsonArray }}
{{- $fingerprint := $dnsNames | join "," | sha256sum | trunc 16 }}
{{- $now := now | unixEpoch | int64 }}
{{- $days := int .Values.tls.selfSigned.validityDays }}
{{- $renewBefore := mul (int .Values.tls.selfSigned.renewBeforeDays) 86400 }}
{{- $out := dict }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "cocoon-hibernation.tlsSecretName" .) }}
{{- if and $existing $existing.data $existing.metadata.annotations }}
{{- $ann := $existing.metadata.annotations }}
{{- $data := $existing.data }}
{{- $expires := index $ann "cocoon-hibernation.cocoonstack.io/tls-expires" | default "0" | int64 }}
{{- $sameNames := eq (index $ann "cocoon-hibernation.cocoonstack.io/tls-names" | default "") $fingerprint }}
{{- if and $sameNames (gt (sub $expires $now) $renewBefore) (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") }}
{{- $out = dict "caCrt" (index $data "ca.crt") "tlsCrt" (index $data "tls.crt") "tlsKey" (index $data "tls.key") "expires" (toString $expires) "fingerprint" $fingerprint }}
{{- end }}
{{- end }}
{{- if not $out }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "cocoon-hibernation.fullname" .)) $days }}
{{- $cert := genSignedCert (index $dnsNames 2) nil $dnsNames $days $ca }}
{{- $out = dict "caCrt" ($ca.Cert | b64enc) "tlsCrt" ($cert.Cert | b64enc) "tlsKey" ($cert.Key | b64enc) "expires" (toString (add $now (mul $days 86400))) "fingerprint" $fingerprint }}
{{- end }}
{{- $_ := set .Values "__selfSignedTLS" ($out | toYaml) }}
{{- end }}
{{- index .Values "__selfSignedTLS" }}
{{- end }}

{{/*
The container environment: every setting the binary takes, from the values. extraEnv
entries of the same name replace these (duplicate names break server-side apply).
*/}}
{{- define "cocoon-hibernation.env" -}}
{{- include "cocoon-hibernation.safetyDefaults" . }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: COCOON_WEBHOOK_ADDR
  value: {{ printf "0.0.0.0:%d" (int .Values.webhook.port) | quote }}
- name: COCOON_ADMIN_ADDR
  value: {{ printf "0.0.0.0:%d" (int .Values.adminPort) | quote }}
- name: COCOON_TLS_CERT_FILE
  value: /etc/cocoon-hibernation/tls/tls.crt
- name: COCOON_TLS_KEY_FILE
  value: /etc/cocoon-hibernation/tls/tls.key
- name: COCOON_TLS_RELOAD_INTERVAL
  value: {{ .Values.webhook.tlsReloadInterval | quote }}
- name: COCOON_REGISTRY_BASE
  value: {{ required "registry.base is required: host[:port][/prefix] of the OCI registry holding the snapshots" .Values.registry.base | quote }}
{{- if .Values.registry.plainHTTP }}
- name: COCOON_REGISTRY_PLAIN_HTTP
  value: "true"
{{- end }}
- name: COCOON_REGISTRY_TIMEOUT
  value: {{ .Values.registry.timeout | quote }}
- name: COCOON_INSTALL_NAME
  value: {{ include "cocoon-hibernation.installName" . | quote }}
{{- if .Values.registry.credentialsSecret }}
- name: COCOON_REGISTRY_DOCKER_CONFIG
  value: /etc/cocoon-hibernation/registry-auth/config.json
{{- end }}
{{- if or .Values.registry.caSecret .Values.registry.caConfigMap }}
- name: COCOON_REGISTRY_CA_FILE
  value: /etc/cocoon-hibernation/registry-ca/ca.crt
{{- end }}
- name: COCOON_CONCURRENCY
  value: {{ .Values.controller.concurrency | quote }}
- name: COCOON_HIBERNATE_TIMEOUT
  value: {{ .Values.controller.hibernateTimeout | quote }}
- name: COCOON_WAKE_TIMEOUT
  value: {{ .Values.controller.wakeTimeout | quote }}
- name: COCOON_INFORMER_STALL_LIMIT
  value: {{ .Values.controller.informerStallLimit | quote }}
{{- with .Values.controller.watchNamespace }}
- name: COCOON_WATCH_NAMESPACE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.controller.podSelector }}
- name: COCOON_POD_SELECTOR
  value: {{ . | quote }}
{{- end }}
- name: COCOON_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: COCOON_LOG
  value: {{ .Values.log.level | quote }}
- name: COCOON_SHUTDOWN_GRACE
  value: {{ printf "%ds" (int .Values.shutdownGraceSeconds) | quote }}
- name: COCOON_LEADER_ELECTION
  value: {{ ternary "true" "false" .Values.leaderElection.enabled | quote }}
- name: COCOON_LEASE_NAME
  value: {{ include "cocoon-hibernation.leaseName" . | quote }}
- name: COCOON_LEASE_DURATION
  value: {{ .Values.leaderElection.leaseDuration | quote }}
{{- end }}

{{- define "cocoon-hibernation.validate" -}}
{{- include "cocoon-hibernation.safetyDefaults" . }}
{{- if not (has .Values.tls.mode (list "cert-manager" "self-signed" "secret")) }}
{{- fail (printf "tls.mode must be cert-manager, self-signed or secret, not %q" .Values.tls.mode) }}
{{- end }}
{{- if and (eq .Values.tls.mode "secret") (not (contains "BEGIN CERTIFICATE" .Values.tls.secret.caBundle)) }}
{{- fail "tls.secret.caBundle must hold the PEM of the CA that signed tls.secret.name (tls.mode=secret)" }}
{{- end }}
{{- if not (has .Values.log.format (list "text" "json")) }}
{{- fail (printf "log.format must be text or json, not %q" .Values.log.format) }}
{{- end }}
{{- if lt (int .Values.controller.concurrency) 1 }}
{{- fail "controller.concurrency must be at least 1 (C1)" }}
{{- end }}
{{- if contains "://" .Values.registry.base }}
{{- fail "registry.base takes host[:port][/prefix] without a scheme; set registry.plainHTTP for http" }}
{{- end }}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail "leaderElection.enabled=false with replicas > 1 would run several reconcilers at once (P2)" }}
{{- end }}
{{- if and .Values.registry.caSecret .Values.registry.caConfigMap }}
{{- fail "set only one of registry.caSecret and registry.caConfigMap" }}
{{- end }}
{{- if eq (int .Values.webhook.port) (int .Values.adminPort) }}
{{- fail "webhook.port and adminPort must differ" }}
{{- end }}
{{- end }}

{{/* The wake proxy's pods: a name label of their own, so no controller selector matches them. */}}
{{- define "cocoon-hibernation.proxySelectorLabels" -}}
app.kubernetes.io/name: {{ include "cocoon-hibernation.name" . }}-wake-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cocoon-hibernation.proxyLabels" -}}
helm.sh/chart: {{ include "cocoon-hibernation.chart" . }}
{{ include "cocoon-hibernation.proxySelectorLabels" . }}
app.kubernetes.io/component: wake-proxy
app.kubernetes.io/part-of: cocoonstack
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
