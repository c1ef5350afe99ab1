{{/* The image both programs and the uninstall hook run: image.repository, and image.tag or the appVersion. */}}
{{- define "reservoir.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Helm's own labels, on each object's metadata only (never on selectors or pod templates). The comparison with
     kustomize's render leaves exactly these three out (tests/e2e/test_install.py, HELM_LABELS). */}}
{{- define "reservoir.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object of one file in files/ (each a link to the deploy/ manifest it names, so kustomize and the chart
     read one text), Helm's labels added, `annotations` (a dict) merged into each object's. Arguments:
     dict "root" $ "file" "files/x.yaml" "annotations" (dict ...) "kinds" (list ...: only these kinds; empty: all)
     "labels" (dict ...: more labels on each object, e.g. the one a Prometheus selects its rules by)
     "validatingWebhooks" (list ...: webhooks appended to a ValidatingWebhookConfiguration's, as a component's
     JSON patch adds them). */}}
{{- define "reservoir.fromFile" -}}
{{- $root := .root }}
{{- $text := $root.Files.Get .file }}
{{- if not $text }}{{ fail (printf "%s is missing or empty (a link into deploy/)" .file) }}{{ end }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $text -1 }}
{{- $obj := fromYaml $doc }}
{{- if hasKey $obj "Error" }}{{ fail (printf "%s: %s" $.file (get $obj "Error")) }}{{ end }}
{{- if and $obj (or (not $.kinds) (has $obj.kind $.kinds)) }}
{{- $meta := $obj.metadata }}
{{- $_ := set $meta "labels" (merge (include "reservoir.labels" $root | fromYaml) ($.labels | default dict) ($meta.labels | default dict)) }}
{{- if $.annotations }}
{{- $_ := set $meta "annotations" (merge (deepCopy $.annotations) ($meta.annotations | default dict)) }}
{{- end }}
{{- if and $.validatingWebhooks (eq $obj.kind "ValidatingWebhookConfiguration") }}
{{- $_ := set $obj "webhooks" (concat $obj.webhooks $.validatingWebhooks) }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}

{{/* The pod security context of every pod here (the namespace enforces `restricted`). 65532: the image's user. */}}
{{- define "reservoir.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "reservoir.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end }}
