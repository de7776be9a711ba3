{{/* The namespace is fixed: the settings, the Triggers' audiences, the admission policies and
the network policies all name it (knative/namespace.yaml). */}}
{{- define "kn-rescheduler.checkNamespace" -}}
{{- if ne .Release.Namespace "kn-rescheduler" -}}
{{- fail (printf "install into the namespace kn-rescheduler (helm install --namespace kn-rescheduler), not %q: its name is part of the settings, the Triggers' audiences and the policies" .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The labels Helm's conventions add to every object (app.kubernetes.io/name and component
stay each object's own). */}}
{{- define "kn-rescheduler.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* A function's image: image.registry/FUNCTION, by its digest from image.digests when given,
else by image.tag (the chart's appVersion when empty). */}}
{{- define "kn-rescheduler.image" -}}
{{- $root := index . 0 -}}
{{- $fn := index . 1 -}}
{{- $image := $root.Values.image -}}
{{- $digest := index ($image.digests | default dict) $fn | default "" -}}
{{- if $digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" $digest) -}}
{{- fail (printf "image.digests.%s must be sha256:<64 hex digits>, got %q" $fn $digest) -}}
{{- end -}}
{{ $image.registry }}/{{ $fn }}@{{ $digest }}
{{- else -}}
{{ $image.registry }}/{{ $fn }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The settings ConfigMap's name carries a hash of its data, as kustomize's generator does:
a change of a setting is a new ConfigMap and a new Revision of every function, and a Revision
rolled back to keeps the settings it ran with while the release still holds them. */}}
{{- define "kn-rescheduler.settingsName" -}}
kn-rescheduler-config-{{ include "kn-rescheduler.settingsData" . | sha256sum | trunc 10 }}
{{- end -}}

{{/* Which admission the values choose: the MutatingAdmissionPolicies where the API server
serves them (auto) or asked (policies), else the webhook. The webhook as a Deployment (no
Serving, or webhook.deployment) keeps the webhook: the policies would not remove it. */}}
{{- define "kn-rescheduler.admission" -}}
{{- $mode := .Values.admission.mode -}}
{{- $deployment := or (not .Values.serving.enabled) .Values.webhook.deployment -}}
{{- if eq $mode "policies" -}}
{{- if $deployment -}}
{{- fail "admission.mode=policies needs Knative Serving's webhook: not with serving.enabled=false or webhook.deployment=true, which run the webhook as a Deployment" -}}
{{- end -}}
policies
{{- else if eq $mode "webhook" -}}
webhook
{{- else if and (not $deployment) (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}
policies
{{- else -}}
webhook
{{- end -}}
{{- end -}}

{{/* Each choice of the chart, "true" or empty: the templates' conditions. */}}
{{- define "kn-rescheduler.on.withoutServing" -}}
{{- if not .Values.serving.enabled }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.webhookDeployment" -}}
{{- if and .Values.serving.enabled .Values.webhook.deployment }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.policies" -}}
{{- if eq (include "kn-rescheduler.admission" .) "policies" }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.certManager" -}}
{{- if and (ne (include "kn-rescheduler.admission" .) "policies") .Values.webhook.certManager.enabled }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.clientAuth" -}}
{{- if and (ne (include "kn-rescheduler.admission" .) "policies") .Values.webhook.clientAuth.enabled }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.networkPolicy" -}}
{{- if and (ne (include "kn-rescheduler.admission" .) "policies") .Values.webhook.networkPolicy.enabled }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.senderAuthentication" -}}
{{- if .Values.senderAuthentication.enabled }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.loadAwareScheduler" -}}
{{- if .Values.loadAwareScheduler.enabled }}true{{ end -}}
{{- end -}}
{{- define "kn-rescheduler.on.monitoring" -}}
{{- if .Values.monitoring.enabled }}true{{ end -}}
{{- end -}}
