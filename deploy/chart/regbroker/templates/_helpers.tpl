{{/*
The chart name, as in app.kubernetes.io/name (regbroker, like deploy/standalone/).
*/}}
{{- define "regbroker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects (63 characters at most: some name fields are DNS
labels). A release named regbroker gives `regbroker`, so the objects keep the names of the
kustomize manifests.
*/}}
{{- define "regbroker.fullname" -}}
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

{{- define "regbroker.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "regbroker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "regbroker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "regbroker.labels" -}}
helm.sh/chart: {{ include "regbroker.chart" . }}
{{ include "regbroker.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
What this rendering produces: standalone, sidecar (the RBAC and ConfigMap for the
source-controller sidecar) or sidecarPatch (only the kustomize patches). The schema
already refuses other combinations; this also holds with --skip-schema-validation.
*/}}
{{- define "regbroker.shape" -}}
{{- if eq .Values.mode "standalone" }}
{{- if .Values.sourceControllerSidecar.renderPatch }}
{{- fail "sourceControllerSidecar.renderPatch needs mode=sourceControllerSidecar" }}
{{- end }}
{{- print "standalone" }}
{{- else if eq .Values.mode "sourceControllerSidecar" }}
{{- ternary "sidecarPatch" "sidecar" (.Values.sourceControllerSidecar.renderPatch | default false) }}
{{- else }}
{{- fail (printf "mode must be standalone or sourceControllerSidecar, not %q" (toString .Values.mode)) }}
{{- end }}
{{- end }}

{{/*
The namespace regbroker's pod runs in.
*/}}
{{- define "regbroker.podNamespace" -}}
{{- if eq .Values.mode "sourceControllerSidecar" }}
{{- .Values.sourceControllerSidecar.namespace }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- define "regbroker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "regbroker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "regbroker.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The Secrets to sync as a JSON list of {namespace, name}: syncSecrets, or the shape's one
default Secret when it is empty (regbroker needs at least one sink for --sink-registry).
*/}}
{{- define "regbroker.syncSecrets" -}}
{{- $secrets := .Values.syncSecrets }}
{{- if not $secrets }}
{{- if eq .Values.mode "sourceControllerSidecar" }}
{{- $secrets = list (dict "namespace" .Values.sourceControllerSidecar.namespace "name" "regbroker-oci") }}
{{- else }}
{{- $secrets = list (dict "namespace" .Release.Namespace "name" "regbroker-pull") }}
{{- end }}
{{- end }}
{{- toJson $secrets }}
{{- end }}

{{- define "regbroker.configMapName" -}}
{{- printf "%s-config" (include "regbroker.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Pod template annotations: podAnnotations, plus a checksum of the config file so the
pods roll when it changes (regbroker reads it once, at start).
*/}}
{{- define "regbroker.podAnnotations" -}}
{{- $annotations := deepCopy .Values.podAnnotations }}
{{- if .Values.config }}
{{- $_ := set $annotations "checksum/config" (sha256sum .Values.config) }}
{{- end }}
{{- with $annotations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
The regbroker container, shared by the standalone Deployment and the source-controller
patch so the two cannot drift. Called with (dict "root" $ "sidecar" bool). The sidecar
names its port regbroker-probe (source-controller has ports of its own) and sets the user
on the container, because source-controller's pod does not.
*/}}
{{- define "regbroker.container" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $port := ternary "regbroker-probe" "probe" .sidecar -}}
- name: regbroker
  image: {{ include "regbroker.image" $root | toJson }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - serve
    # Credentials stay on loopback: nothing else in the cluster can ask for them.
    - --listen=127.0.0.1:8477
    - --probe-listen=0.0.0.0:8478
    {{- range (include "regbroker.syncSecrets" $root | fromJsonArray) }}
    - {{ printf "--sync-secret=%s/%s" .namespace .name | toJson }}
    {{- end }}
    {{- range $v.sinkRegistries }}
    - {{ printf "--sink-registry=%s" . | toJson }}
    {{- end }}
    {{- if $v.config }}
    - --config=/etc/regbroker/config/regbroker.toml
    {{- end }}
    {{- range $v.dockerConfigSecrets }}
    - {{ printf "--docker-config=/etc/regbroker/docker-config/%s" . | toJson }}
    {{- end }}
    {{- if and (not .sidecar) $v.leaderElection.enabled }}
    - --leader-elect
    - {{ printf "--leader-elect-lease=%s" (include "regbroker.leaseName" $root) | toJson }}
    {{- with $v.leaderElection.leaseDuration }}
    - {{ printf "--leader-elect-lease-duration=%s" . | toJson }}
    {{- end }}
    {{- with $v.leaderElection.renewDeadline }}
    - {{ printf "--leader-elect-renew-deadline=%s" . | toJson }}
    {{- end }}
    {{- with $v.leaderElection.retryPeriod }}
    - {{ printf "--leader-elect-retry-period=%s" . | toJson }}
    {{- end }}
    {{- end }}
    {{- if and (not .sidecar) $v.registryCredentials.enabled }}
    - --registry-credentials
    {{- range $v.registryCredentials.namespaces }}
    - {{ printf "--registry-credentials-namespace=%s" . | toJson }}
    {{- end }}
    {{- with $v.registryCredentials.defaultServiceAccount }}
    - {{ printf "--default-service-account=%s" . | toJson }}
    {{- end }}
    {{- end }}
    {{- if and (not .sidecar) $v.readyRequiresSinks }}
    # Not ready until this replica has written its Secrets once (a follower stays ready).
    - --ready-requires-sinks
    {{- end }}
    {{- range $v.extraArgs }}
    {{- if regexMatch "^--(listen|probe-listen)(=|$)" . }}
    {{- fail (printf "extraArgs: %s is the chart's (the credential endpoint stays on loopback 127.0.0.1:8477, probes on 0.0.0.0:8478)" .) }}
    {{- end }}
    - {{ . | toJson }}
    {{- end }}
  env:
    - name: REGBROKER_LOG_FORMAT
      value: {{ $v.logFormat }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ $port }}
      containerPort: 8478
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ $port }}
    initialDelaySeconds: 5
    periodSeconds: 20
    timeoutSeconds: 2
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ $port }}
    periodSeconds: 10
    timeoutSeconds: 2
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    {{- if .sidecar }}
    runAsUser: 65532
    runAsGroup: 65532
    {{- end }}
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  {{- if or $v.config $v.dockerConfigSecrets }}
  volumeMounts:
    {{- if $v.config }}
    - name: regbroker-config
      mountPath: /etc/regbroker/config
      readOnly: true
    {{- end }}
    {{- range $i, $name := $v.dockerConfigSecrets }}
    - name: regbroker-docker-config-{{ $i }}
      mountPath: {{ printf "/etc/regbroker/docker-config/%s" $name | toJson }}
      readOnly: true
    {{- end }}
  {{- end }}
{{- end }}

{{/*
The volumes the container mounts (a list, possibly empty).
*/}}
{{- define "regbroker.volumes" -}}
{{- if .Values.config }}
- name: regbroker-config
  configMap:
    name: {{ include "regbroker.configMapName" . }}
{{- end }}
{{- range $i, $name := .Values.dockerConfigSecrets }}
- name: regbroker-docker-config-{{ $i }}
  secret:
    secretName: {{ $name }}
{{- end }}
{{- end }}

{{/*
The leader election Lease's name (standalone): leaderElection.leaseName, else the full name.
*/}}
{{- define "regbroker.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "regbroker.fullname" .) }}
{{- end }}

{{/*
Monitoring (serviceMonitor, prometheusRule). The Prometheus job regbroker's pods are
scraped as: the ServiceMonitor's jobLabel is app.kubernetes.io/name, so the job is the
chart name (`regbroker`, the job deploy/monitoring/alerts.yaml expects) unless
nameOverride changes it, and the PrometheusRule's RegbrokerTargetMissing follows.
*/}}
{{- define "regbroker.jobName" -}}
{{- include "regbroker.name" . }}
{{- end }}

{{/*
The Service the ServiceMonitor scrapes (a DNS label: the suffix always fits).
*/}}
{{- define "regbroker.metricsServiceName" -}}
{{- printf "%s-metrics" (include "regbroker.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/*
"true" when the ServiceMonitor (resp. PrometheusRule) renders: enabled, a shape with
resources (not the patches), and a cluster serving the Prometheus Operator's kind.
*/}}
{{- define "regbroker.serviceMonitor" -}}
{{- if and .Values.serviceMonitor.enabled (ne (include "regbroker.shape" .) "sidecarPatch") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") }}
{{- print "true" }}
{{- end }}
{{- end }}

{{- define "regbroker.prometheusRule" -}}
{{- if and .Values.prometheusRule.enabled (ne (include "regbroker.shape" .) "sidecarPatch") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") }}
{{- print "true" }}
{{- end }}
{{- end }}

{{/*
The labels of the pods the metrics Service selects: regbroker's own (standalone), or
source-controller's, which carry the sidecar (sourceControllerSidecar.podSelector).
*/}}
{{- define "regbroker.metricsPodSelector" -}}
{{- if eq .Values.mode "sourceControllerSidecar" }}
{{- toYaml .Values.sourceControllerSidecar.podSelector }}
{{- else }}
{{- include "regbroker.selectorLabels" . }}
{{- end }}
{{- end }}
