{{/* The release's name prefix: RELEASE-ndpipe, or RELEASE when it already says ndpipe. */}}
{{- define "ndpipe.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ndpipe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "pipestore"). */}}
{{- define "ndpipe.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ndpipe.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-cluster" (include "ndpipe.fullname" .)) -}}
{{- end -}}

{{- define "ndpipe.catalogSecretName" -}}
{{- .Values.postgresql.external.existingSecret | default (printf "%s-catalog" (include "ndpipe.fullname" .)) -}}
{{- end -}}

{{- define "ndpipe.catalogSecretKey" -}}
{{- if .Values.postgresql.external.existingSecret -}}{{ .Values.postgresql.external.key }}{{- else -}}url{{- end -}}
{{- end -}}

{{- define "ndpipe.scheme" -}}
{{- if .Values.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* The Tuner's gRPC URL, which every PipeStore registers with. */}}
{{- define "ndpipe.tunerUrl" -}}
{{- printf "%s://%s-tuner.%s.svc.%s:7070" (include "ndpipe.scheme" .) (include "ndpipe.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* One TOML value. Helm reads every number as a float: whole ones are written as integers. */}}
{{- define "ndpipe.tomlValue" -}}
{{- $k := kindOf . -}}
{{- if eq $k "string" -}}{{ toJson . }}
{{- else if eq $k "bool" -}}{{ . }}
{{- else if or (eq $k "float64") (eq $k "int") (eq $k "int64") -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}{{ fail (printf "config: %v is a %s; ndpipe.toml keys take strings, numbers and booleans" . $k) }}
{{- end -}}
{{- end -}}

{{/* One section of ndpipe.toml: (dict "name" "pipestore" "keys" $map). */}}
{{- define "ndpipe.tomlSection" -}}
[{{ .name }}]
{{- range $key, $value := .keys }}
{{ $key }} = {{ include "ndpipe.tomlValue" $value }}
{{- end }}
{{- end -}}

{{/* The keys the chart sets itself; values may not set them under config.*. */}}
{{- define "ndpipe.reservedKeys" -}}
data listen grpc_listen s3_listen advertise_url name tuner catalog token token_file cluster_secret_file insecure_cluster tls_cert tls_key tls_ca keys_master_file s3_staging similar_index_dir
{{- end -}}

{{/* The keys every role shares: the secret, token and TLS files. */}}
{{- define "ndpipe.commonKeys" -}}
{{- $keys := dict "cluster_secret_file" "/etc/ndpipe/secrets/cluster-secret" "token_file" "/etc/ndpipe/secrets/token" -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $keys "tls_cert" "/etc/ndpipe/tls/tls.crt" -}}
{{- $_ := set $keys "tls_key" "/etc/ndpipe/tls/tls.key" -}}
{{- $_ := set $keys "tls_ca" "/etc/ndpipe/tls/ca.crt" -}}
{{- end -}}
{{- toJson $keys -}}
{{- end -}}

{{/* ndpipe.toml: config.* with the chart's own keys over it. */}}
{{- define "ndpipe.toml" -}}
{{- $reserved := splitList " " (include "ndpipe.reservedKeys" .) -}}
{{- range $section := list "pipestore" "tuner" "gateway" -}}
{{- range $key, $_ := (get $.Values.config $section | default dict) -}}
{{- if has $key $reserved -}}
{{- fail (printf "config.%s.%s is set by the chart (it depends on where each process runs); leave it out" $section $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $common := include "ndpipe.commonKeys" . | fromJson -}}
{{- $ps := merge (dict "data" "/data" "listen" "0.0.0.0:8080" "grpc_listen" "0.0.0.0:7071" "tuner" (include "ndpipe.tunerUrl" .)) $common (deepCopy (.Values.config.pipestore | default dict)) -}}
{{- if .Values.pipestore.s3 -}}{{- $_ := set $ps "s3_listen" "0.0.0.0:9000" -}}{{- end -}}
{{- $tuner := merge (dict "data" "/data" "listen" "0.0.0.0:8090" "grpc_listen" "0.0.0.0:7070") $common (deepCopy (.Values.config.tuner | default dict)) -}}
{{- $gw := merge (dict "listen" "0.0.0.0:8080" "s3_staging" "/var/lib/ndpipe-gateway/s3-uploads" "keys_master_file" "/var/lib/ndpipe-gateway/keys.master") $common (deepCopy (.Values.config.gateway | default dict)) -}}
{{- if .Values.gateway.s3 -}}{{- $_ := set $gw "s3_listen" "0.0.0.0:9000" -}}{{- end -}}
# ndpipe.toml made by the ndpipe chart from its values (config.*); see `ndpipe config example`.
# Each PipeStore's name and advertised URL, and the catalog's URL, come from the environment.
{{ include "ndpipe.tomlSection" (dict "name" "pipestore" "keys" $ps) }}

{{ include "ndpipe.tomlSection" (dict "name" "tuner" "keys" $tuner) }}

{{ include "ndpipe.tomlSection" (dict "name" "gateway" "keys" $gw) }}
{{ end -}}

{{/* Checks across values that no single template owns. */}}
{{- define "ndpipe.validate" -}}
{{- if and (not .Values.postgresql.enabled) (not .Values.postgresql.external.url) (not .Values.postgresql.external.existingSecret) -}}
{{- fail "the cluster needs a PostgreSQL catalog: postgresql.enabled, postgresql.external.url or postgresql.external.existingSecret" -}}
{{- end -}}
{{- if and .Values.postgresql.enabled (or .Values.postgresql.external.url .Values.postgresql.external.existingSecret) -}}
{{- fail "postgresql.enabled runs a database in the chart; set it false to use postgresql.external" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName (a Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- $copies := int (.Values.config.pipestore.replicas | default 2) -}}
{{- if gt $copies (int .Values.pipestore.count) -}}
{{- fail (printf "config.pipestore.replicas (%d copies) needs at least as many PipeStores (pipestore.count is %d)" $copies (int .Values.pipestore.count)) -}}
{{- end -}}
{{- if and .Values.gateway.enabled (ne (int (.Values.config.gateway.replicas | default 2)) $copies) -}}
{{- fail (printf "config.gateway.replicas (%d) differs from config.pipestore.replicas (%d): the gateway places as many copies as the PipeStores keep" (int (.Values.config.gateway.replicas | default 2)) $copies) -}}
{{- end -}}
{{- if .Values.pipestore.gpu.enabled -}}
{{- if not (has (.Values.config.pipestore.execution_provider | default "cpu") (list "cuda" "tensorrt")) -}}
{{- fail "pipestore.gpu.enabled needs config.pipestore.execution_provider cuda or tensorrt" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod security context every ndpipe pod shares (the image's user ndpipe, 10001). */}}
{{- define "ndpipe.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  fsGroupChangePolicy: OnRootMismatch
{{- end -}}

{{- define "ndpipe.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end -}}

{{/* Pod annotations: the config's checksum (a change rolls the pods), Prometheus' scrape. */}}
{{- define "ndpipe.podAnnotations" -}}
checksum/config: {{ include "ndpipe.toml" .root | sha256sum }}
{{- if .root.Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Mounts of the config, the secrets and (with TLS) the certificates. */}}
{{- define "ndpipe.configMounts" -}}
- name: config
  mountPath: /etc/ndpipe/config
  readOnly: true
- name: secrets
  mountPath: /etc/ndpipe/secrets
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/ndpipe/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "ndpipe.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "ndpipe.fullname" . }}-config
- name: secrets
  secret:
    secretName: {{ include "ndpipe.secretName" . }}
    defaultMode: 0400
- name: tmp
  emptyDir: {}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0400
{{- end }}
{{- end -}}

{{/* An init container that copies the cluster's keys.master to DEST once, mode 0600. */}}
{{- define "ndpipe.keysInit" -}}
- name: keys-master
  image: {{ printf "%s:%s" .root.Values.image.repository .root.Values.image.tag | quote }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command:
    - sh
    - -c
    - test -e {{ .dest }} || { cp /etc/ndpipe/secrets/keys.master {{ .dest }} && chmod 600 {{ .dest }}; }
  {{- include "ndpipe.containerSecurity" . | nindent 2 }}
  volumeMounts:
    - name: secrets
      mountPath: /etc/ndpipe/secrets
      readOnly: true
    - name: {{ .volume }}
      mountPath: {{ dir .dest }}
{{- end -}}

{{/* Readiness and liveness probes on the HTTP port. */}}
{{- define "ndpipe.probes" -}}
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: http}
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 5
  failureThreshold: 60
{{- end -}}

{{- define "ndpipe.image" -}}
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end -}}

{{- define "ndpipe.env" -}}
- name: NDPIPE_CONFIG
  value: /etc/ndpipe/config/ndpipe.toml
{{- end -}}

{{- define "ndpipe.catalogEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "ndpipe.catalogSecretName" .root }}
      key: {{ include "ndpipe.catalogSecretKey" .root }}
{{- end -}}

{{/* A volume claim per pod: (dict "root" $ "storage" .Values.X.storage). Uninstalling keeps it. */}}
{{- define "ndpipe.volumeClaim" -}}
- metadata:
    name: data
    labels:
      app.kubernetes.io/name: {{ .root.Chart.Name }}
      app.kubernetes.io/instance: {{ .root.Release.Name }}
  spec:
    accessModes: [ReadWriteOnce]
    {{- with .storage.storageClassName }}
    storageClassName: {{ . }}
    {{- end }}
    resources:
      requests:
        storage: {{ .storage.size }}
{{- end -}}
