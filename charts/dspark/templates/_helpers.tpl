{{/* Names: the RayService name must stay within 47 characters (KubeRay appends a cluster suffix). */}}
{{- define "dspark.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 47 | trimSuffix "-" -}}
{{- end -}}

{{- define "dspark.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 47 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dspark.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dspark.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dspark.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dspark.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dspark.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s-cuda" .Chart.AppVersion) -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "dspark.apiKeysSecret" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "dspark.fullname" .)) -}}
{{- end -}}

{{- define "dspark.apiKeysEnabled" -}}
{{- if or .Values.apiKeys.existingSecret .Values.apiKeys.keys -}}true{{- end -}}
{{- end -}}

{{/*
Replica counts of the target deployment: fixed (num_replicas) or Serve's autoscaling bounds.
Returns a dict {min, max, initial} as JSON.
*/}}
{{- define "dspark.replicaCounts" -}}
{{- $args := .Values.app.args -}}
{{- with $args.autoscaling_config -}}
{{- $min := int (hasKey . "min_replicas" | ternary .min_replicas 1) -}}
{{- $max := int (hasKey . "max_replicas" | ternary .max_replicas 1) -}}
{{- $initial := int (.initial_replicas | default $min) -}}
{{- dict "min" $min "max" $max "initial" $initial | toJson -}}
{{- else -}}
{{- $n := int ($args.num_replicas | default 1) -}}
{{- dict "min" $n "max" $n "initial" $n | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Worker pods for the target replicas: a pod holds gpusPerNode / tensor_parallel_size replicas (all
shards of a replica on one pod, STRICT_PACK), or cpuReplicasPerNode on CPU-only workers.
With KubeRay's autoscaler the pod count follows the replicas between the bounds; without it the group
is sized for the most replicas Serve may ask for.
*/}}
{{- define "dspark.replicasPerPod" -}}
{{- $tp := int (.Values.app.args.tensor_parallel_size | default 1) -}}
{{- $gpus := int .Values.workers.gpusPerNode -}}
{{- $perPod := int .Values.workers.cpuReplicasPerNode -}}
{{- if gt $gpus 0 -}}
{{- if or (gt $tp $gpus) (ne (mod $gpus $tp) 0) -}}
{{- fail (printf "app.args.tensor_parallel_size (%d) must divide workers.gpusPerNode (%d): a replica's shards share one pod" $tp $gpus) -}}
{{- end -}}
{{- $perPod = div $gpus $tp -}}
{{- end -}}
{{- $perPod -}}
{{- end -}}

{{- define "dspark.workerPods" -}}
{{- $perPod := int (include "dspark.replicasPerPod" .) -}}
{{- $counts := include "dspark.replicaCounts" . | fromJson -}}
{{- $pods := dict -}}
{{- range $key := list "min" "max" "initial" -}}
{{- $n := int (get $counts $key) -}}
{{- $_ := set $pods $key (div (add $n (sub $perPod 1)) $perPod) -}}
{{- end -}}
{{- if not $.Values.autoscaler.enabled -}}
{{- $_ := set $pods "min" $pods.max -}}
{{- $_ := set $pods "initial" $pods.max -}}
{{- end -}}
{{- toJson $pods -}}
{{- end -}}

{{/* The controller's OTLP receiver is on (controller.otlp_port): "true" or "". */}}
{{- define "dspark.controllerReceiver" -}}
{{- if and .Values.controller .Values.controller.otlp_port -}}true{{- end -}}
{{- end -}}

{{/* Where the replicas (or a Collector) reach the controller's receiver: its Service's DNS name. */}}
{{- define "dspark.controllerHost" -}}
{{- printf "%s-controller.%s.svc" (include "dspark.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The application's args: app.args plus what the chart wires in (keys file, router, controller). */}}
{{- define "dspark.appArgs" -}}
{{- $args := deepCopy .Values.app.args -}}
{{- if include "dspark.apiKeysEnabled" . -}}
{{- $_ := set $args "api_keys_file" (printf "/etc/dspark/api-keys/%s" .Values.apiKeys.secretKey) -}}
{{- end -}}
{{- with .Values.router }}{{ $_ := set $args "router" (deepCopy .) }}{{ end -}}
{{- with .Values.controller -}}
{{- $controller := deepCopy . -}}
{{- if include "dspark.controllerReceiver" $ -}}
{{- /* Its OTLP receiver sits behind the <fullname>-controller Service (controller.yaml): the actor is pinned
to the head pod by a Ray resource only the head offers, and the replicas are told the Service's name. */ -}}
{{- $_ := set $controller "otlp_host" ($controller.otlp_host | default (include "dspark.controllerHost" $)) -}}
{{- $_ := set $controller "resources" (mergeOverwrite (dict "dspark_controller" 1) ($controller.resources | default dict)) -}}
{{- with $.Values.telemetry.otlpEndpoint -}}
{{- /* A Collector of yours: the replicas keep exporting to it (build_app leaves them on the app's own
endpoint), and it fans out to the controller's Service as well (NOTES.txt). */ -}}
{{- $named := dict "otlp_endpoint" . "otlp_protocol" $.Values.telemetry.otlpProtocol -}}
{{- $_ := set $args "telemetry" (mergeOverwrite $named ($args.telemetry | default dict)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $args "controller" $controller -}}
{{- end -}}
{{- $args = mergeOverwrite $args (deepCopy .Values.app.extraArgs) -}}
{{- toYaml $args -}}
{{- end -}}

{{/* The Ray Serve config (the schema of configs/local.yaml); KubeRay deploys it as serveConfigV2. */}}
{{- define "dspark.serveConfig" -}}
proxy_location: {{ .Values.serve.proxyLocation }}
http_options:
  host: 0.0.0.0
  port: {{ int .Values.serve.httpPort }}
grpc_options:
  port: {{ int .Values.serve.grpcPort }}
  # What deployments/app.py GRPC_SERVICERS lists (a test keeps the two equal).
  grpc_servicer_functions:
    - dspark_client.proto.add_GenerationServicer_to_server
    - dspark_client.proto.add_ControllerAdminServicer_to_server
    - grpc_health.v1.health_pb2_grpc.add_HealthServicer_to_server
applications:
  - name: {{ .Values.app.name }}
    route_prefix: {{ .Values.app.routePrefix }}
    import_path: deployments.app:build_app
    {{- with .Values.telemetry.otlpEndpoint }}
    runtime_env:
      env_vars:
        OTEL_EXPORTER_OTLP_ENDPOINT: {{ . | quote }}
        OTEL_EXPORTER_OTLP_PROTOCOL: {{ $.Values.telemetry.otlpProtocol | quote }}
        OTEL_SERVICE_NAME: {{ $.Values.telemetry.serviceName | quote }}
        OTEL_TRACES_SAMPLER: {{ $.Values.telemetry.sampler | quote }}
        OTEL_TRACES_SAMPLER_ARG: {{ $.Values.telemetry.samplerArg | quote }}
    {{- end }}
    args:
      {{- include "dspark.appArgs" . | nindent 6 }}
{{- end -}}

{{/* Environment every Ray container shares: who this pod is (for telemetry), where SPS tables go. */}}
{{- define "dspark.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),k8s.node.name=$(NODE_NAME)
- name: DSPARK_CACHE_DIR
  value: /var/cache/dspark
{{- /* Serve's proxies route on their main loop: one thread hop less per streamed message
(deployments/app.py PROXY_ENV; an app cannot set a proxy's environment, the container can). */}}
- name: RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP
  value: "0"
{{- if .Values.metrics.replicaPort }}
- name: DSPARK_PROMETHEUS_PORT
  value: {{ .Values.metrics.replicaPort | quote }}
{{- end }}
{{- end -}}

{{/*
The Prometheus ports of the target replicas on one worker pod: each replica serves its own /metrics
(GenAI latency and the dspark: speculation metrics the dashboard reads), the first on
metrics.replicaPort and the next ones on the ports after it (dspark/telemetry/prometheus.py).
*/}}
{{- define "dspark.replicaMetricsPorts" -}}
{{- if .Values.metrics.replicaPort -}}
{{- $first := int .Values.metrics.replicaPort -}}
{{- range $i := until (int (include "dspark.replicasPerPod" .)) }}
- {name: {{ printf "replica-m%d" $i }}, port: {{ add $first $i }}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dspark.volumeMounts" -}}
{{- if ne .Values.models.source "image" }}
- name: models
  mountPath: {{ .Values.models.mountPath }}
  readOnly: true
  {{- if and (eq .Values.models.source "pvc") .Values.models.pvc.subPath }}
  subPath: {{ .Values.models.pvc.subPath }}
  {{- end }}
{{- end }}
- name: cache
  mountPath: /var/cache/dspark
{{- if include "dspark.apiKeysEnabled" . }}
- name: api-keys
  mountPath: /etc/dspark/api-keys
  readOnly: true
{{- end }}
{{- end -}}

{{- define "dspark.volumes" -}}
{{- if eq .Values.models.source "pvc" }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .Values.models.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.models.source "init" }}
- name: models
  emptyDir:
    sizeLimit: {{ .Values.models.init.sizeLimit }}
{{- end }}
- name: cache
  emptyDir: {}
{{- if include "dspark.apiKeysEnabled" . }}
- name: api-keys
  secret:
    secretName: {{ include "dspark.apiKeysSecret" . }}
    defaultMode: 0440
    items:
      - {key: {{ .Values.apiKeys.secretKey }}, path: {{ .Values.apiKeys.secretKey }}}
{{- end }}
{{- end -}}

{{/* The init container that fills the models emptyDir (models.source: init). */}}
{{- define "dspark.initContainers" -}}
{{- if eq .Values.models.source "init" }}
initContainers:
  - name: fetch-models
    image: {{ .Values.models.init.image }}
    {{- with .Values.models.init.command }}
    command: {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with .Values.models.init.args }}
    args: {{- toYaml . | nindent 6 }}
    {{- end }}
    env:
      - {name: MODELS_DIR, value: {{ .Values.models.mountPath | quote }}}
      {{- with .Values.models.init.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    volumeMounts:
      - {name: models, mountPath: {{ .Values.models.mountPath }}}
{{- end }}
{{- end -}}

{{/* Pod-level settings both groups share. */}}
{{- define "dspark.podCommon" -}}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
