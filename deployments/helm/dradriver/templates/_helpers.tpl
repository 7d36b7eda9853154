{{/* The chart's name, overridable. */}}
{{- define "dradriver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object's name: the release name, with the chart's unless the release already holds it. */}}
{{- define "dradriver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dradriver.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The kubelet plugin's DaemonSet, ServiceAccount and ClusterRole (the policies match on this account name). */}}
{{- define "dradriver.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "dradriver.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dradriver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dradriver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dradriver.labels" -}}
{{ include "dradriver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "dradriver.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* CEL: the device is one of this driver's, of the given type ("gpu" or "mig"). */}}
{{- define "dradriver.deviceIs" -}}
device.driver == {{ .driver | quote }} &&
        device.attributes[{{ .driver | quote }}].type == {{ .type | quote }}
{{- end -}}

{{/* The driver name: NVIDIA's with compat nvidia (its manifests select on it), else driverName. */}}
{{- define "dradriver.driverName" -}}
{{- if eq .Values.compat "nvidia" -}}gpu.nvidia.com{{- else -}}{{ .Values.driverName }}{{- end -}}
{{- end -}}
