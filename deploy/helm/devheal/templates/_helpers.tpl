{{/* Names and labels shared by every template. */}}

{{- define "devheal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: the release name when it contains the chart name, else "<release>-<chart>". */}}
{{- define "devheal.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "devheal.controller.name" -}}{{ include "devheal.fullname" . }}-controller{{- end -}}
{{- define "devheal.agent.name" -}}{{ include "devheal.fullname" . }}-agent{{- end -}}

{{- define "devheal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Labels of every object; those with pods add their selector labels (devheal.*.selector) to devheal.common. */}}
{{- define "devheal.common" -}}
app.kubernetes.io/part-of: devheal
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "devheal.labels" -}}
{{ include "devheal.common" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "devheal.controller.selector" -}}
app.kubernetes.io/name: {{ include "devheal.controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "devheal.agent.selector" -}}
app.kubernetes.io/name: {{ include "devheal.agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* true when a monitoring.coreos.com object is wanted: the value true, or auto and the cluster serves the kind. */}}
{{- define "devheal.monitoring" -}}
{{- $ctx := index . 0 -}}{{- $setting := toString (index . 1) -}}{{- $kind := index . 2 -}}
{{- if eq $setting "true" -}}true
{{- else if and (eq $setting "auto") ($ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) -}}true
{{- else if not (has $setting (list "true" "false" "auto")) -}}
{{- fail (printf "metrics: enabled must be true, false or auto, got %q" $setting) -}}
{{- end -}}
{{- end -}}

{{/* A remediation template entry, checked; as YAML: templates (its resource) and objects (the resource of what it creates).
devheal addresses both as the kind, lower-cased, plus "s" (devheal.controller.node_remediation), so the resource must be that. */}}
{{- define "devheal.remediationResources" -}}
{{- $t := . -}}
{{- if not (and (kindIs "map" $t) $t.apiGroup $t.kind) -}}
{{- fail (printf "remediation.templates: each entry needs apiGroup and kind (resource optional), got %v" $t) -}}
{{- end -}}
{{- if not (hasSuffix "Template" $t.kind) -}}
{{- fail (printf "remediation.templates: kind %s must end in Template (a template creates objects of its kind without Template)" $t.kind) -}}
{{- end -}}
{{- $resource := printf "%ss" (lower $t.kind) -}}
{{- if and $t.resource (ne $t.resource $resource) -}}
{{- fail (printf "remediation.templates: resource %s of %s: devheal reads templates of that kind as %s" $t.resource $t.kind $resource) -}}
{{- end -}}
templates: {{ $resource }}
objects: {{ printf "%ss" (lower (trimSuffix "Template" $t.kind)) }}
{{- end -}}
