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

{{/* ComputeDomains' names (computedomain/api.py's OURS and NVIDIA): NVIDIA's with compat nvidia, so its
ComputeDomains apply unedited. cdGroup: the CRDs' API group, the labels' and the finalizer's prefix; cdSuffix: the
suffix of the driver's and the DeviceClasses' names. */}}
{{- define "dradriver.cdGroup" -}}
{{- if eq .Values.compat "nvidia" -}}resource.nvidia.com{{- else -}}resource.dradriver.dev{{- end -}}
{{- end -}}
{{- define "dradriver.cdSuffix" -}}
{{- if eq .Values.compat "nvidia" -}}nvidia.com{{- else -}}dradriver.dev{{- end -}}
{{- end -}}
{{- define "dradriver.cdDriverName" -}}
compute-domain.{{ include "dradriver.cdSuffix" . }}
{{- end -}}

{{/* The resource.k8s.io version of the DeviceClasses: the newest one the cluster serves among those its release
has (v1 from 1.34; v1beta2 from 1.33; v1beta1 from 1.32). A real install asks the API server which versions it
serves; `helm template` lists every version it knows, so there --kube-version (and --api-versions) decide. */}}
{{- define "dradriver.resourceApiVersion" -}}
{{- $kube := .Capabilities.KubeVersion.Version -}}
{{- $found := "" -}}
{{- range $version := list "v1:>=1.34.0-0" "v1beta2:>=1.33.0-0" "v1beta1:>=1.32.0-0" -}}
{{- $name := printf "resource.k8s.io/%s" (index (splitList ":" $version) 0) -}}
{{- if and (not $found) (semverCompare (index (splitList ":" $version) 1) $kube) ($.Capabilities.APIVersions.Has $name) -}}
{{- $found = $name -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "Kubernetes %s serves no resource.k8s.io version this chart can install DeviceClasses with (v1 from 1.34, v1beta2 or v1beta1 on 1.33, v1beta1 on 1.32): on 1.32 and 1.33 dynamic resource allocation is off by default; turn it on (kube-apiserver --runtime-config=resource.k8s.io/v1beta1=true, on 1.33 also resource.k8s.io/v1beta2=true, and --feature-gates=DynamicResourceAllocation=true on the API server, scheduler, controller manager and kubelets), see docs/deployment.md" $kube) -}}
{{- end -}}
{{- $found -}}
{{- end -}}

{{/* Fails the install when a value needs a newer Kubernetes release than the cluster's, naming the value and the
way out (the driver would refuse the same at start-up, after the install; src/dradriver/driver/publish/slices.py). */}}
{{- define "dradriver.releaseChecks" -}}
{{- $kube := .Capabilities.KubeVersion.Version -}}
{{- $api := include "dradriver.resourceApiVersion" . -}}
{{- if and (eq .Values.gpu.migMode "dynamic") (semverCompare "<1.33.0-0" $kube) -}}
{{- fail (printf "gpu.migMode=dynamic needs shared counters in ResourceSlices, which Kubernetes %s does not have (1.33 and newer, with the DRAPartitionableDevices feature gate before 1.36): set gpu.migMode=static" $kube) -}}
{{- end -}}
{{- if and .Values.gpu.consumableShares (semverCompare "<1.34.0-0" $kube) -}}
{{- fail (printf "gpu.consumableShares=%v needs devices that allow multiple allocations, which Kubernetes %s does not have (1.34 and newer, feature gate DRAConsumableCapacity): leave gpu.consumableShares empty" .Values.gpu.consumableShares $kube) -}}
{{- end -}}
{{- if and (eq .Values.gpu.sharing "consumable") (semverCompare "<1.34.0-0" $kube) -}}
{{- fail (printf "gpu.sharing=consumable needs devices that allow multiple allocations, which Kubernetes %s does not have (1.34 and newer, feature gate DRAConsumableCapacity): set gpu.sharing=exclusive" $kube) -}}
{{- end -}}
{{- if and .Values.listAttributes (semverCompare "<1.36.0-0" $kube) -}}
{{- fail (printf "listAttributes=true needs list-typed attributes, which Kubernetes %s does not have (1.36 and newer, feature gate DRAListTypeAttributes): set listAttributes=false" $kube) -}}
{{- end -}}
{{- if and .Values.computeDomains.enabled (ne $api "resource.k8s.io/v1") -}}
{{- fail (printf "computeDomains.enabled=true needs resource.k8s.io/v1 (Kubernetes 1.34 and newer; the ComputeDomain controller writes v1 ResourceClaimTemplates), and this cluster (Kubernetes %s) serves %s: set computeDomains.enabled=false" $kube $api) -}}
{{- end -}}
{{- end -}}
