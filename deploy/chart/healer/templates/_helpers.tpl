{{/* The install's name: the release name, with "-healer" unless it already says healer. */}}
{{- define "healer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the pods: stable across upgrades. */}}
{{- define "healer.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "healer.labels" -}}
{{ include "healer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: healer
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "healer.serviceAccountName" -}}
{{- default (include "healer.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The image: a repository is required, since no healer image is published for you. */}}
{{- define "healer.image" -}}
{{- $repository := required "image.repository is required: build the image (make image), push it to your registry, and set --set image.repository=REGISTRY/healer (deploy/README.md)" .Values.image.repository -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the Secret files are mounted; providers' secret_file, callback_secret_file and
     detection.alertmanager_token_file point here. */}}
{{- define "healer.secretsDir" -}}/etc/healer/secrets{{- end -}}

{{/* Where the Xid catalog ConfigMap (rules.xidCatalog) is mounted, and its file. */}}
{{- define "healer.xidCatalogDir" -}}/etc/healer/catalog{{- end -}}
{{- define "healer.xidCatalogPath" -}}{{ include "healer.xidCatalogDir" . }}/xid-catalog.yaml{{- end -}}

{{/* The settings file (healer/config.py): values.settings merged under what the chart manages. */}}
{{- define "healer.settings" -}}
{{- $fullname := include "healer.fullname" . -}}
{{- $rulesPaths := list -}}
{{- if .Values.rules.defaultPack -}}
{{- $rulesPaths = append $rulesPaths "/etc/healer/rules/default" -}}
{{- end -}}
{{- range .Values.rules.extraConfigMaps -}}
{{- $rulesPaths = append $rulesPaths (printf "/etc/healer/rules/%s" .) -}}
{{- end -}}
{{- $providers := list -}}
{{- range .Values.tickets.providers -}}
{{- $provider := omit . "secret" -}}
{{- if .secret -}}
{{- $_ := set $provider "secret_file" (printf "%s/providers/%s" (include "healer.secretsDir" $) .name) -}}
{{- end -}}
{{- $providers = append $providers $provider -}}
{{- end -}}
{{- $tickets := dict
    "cluster_name" .Values.tickets.clusterName
    "dashboard_url" (default (printf "http://%s.%s.svc:%d" $fullname .Release.Namespace (int .Values.service.port)) .Values.tickets.dashboardUrl)
    "providers" $providers -}}
{{- if .Values.tickets.callbackSecret.name -}}
{{- $_ := set $tickets "callback_secret_file" (printf "%s/callback-hmac" (include "healer.secretsDir" .)) -}}
{{- end -}}
{{- $api := dict "anonymous_role" .Values.api.anonymousRole -}}
{{- with .Values.api.proxyUserHeader }}{{ $_ := set $api "proxy_user_header" . }}{{ end -}}
{{- with .Values.api.proxyGroupsHeader }}{{ $_ := set $api "proxy_groups_header" . }}{{ end -}}
{{- with .Values.api.operatorGroups }}{{ $_ := set $api "operator_groups" . }}{{ end -}}
{{- $managed := dict
    "rules_paths" $rulesPaths
    "prometheus" (dict "url" .Values.prometheus.url)
    "tickets" $tickets
    "api" $api -}}
{{- if (dig "validation" "enabled" false .Values.settings) -}}
{{- $_ := set $managed "validation" (dict "namespace" .Release.Namespace) -}}
{{- end -}}
{{- $repair := dict -}}
{{- if .Values.agent.enabled -}}
{{- $repair = dict "actions" .Values.agent.actions "secret_file" (printf "%s/repair-hmac" (include "healer.secretsDir" .)) -}}
{{- end -}}
{{- if and .Values.rules.xidCatalog (not (dig "repair" "xid_catalog" "" .Values.settings)) -}}
{{- $_ := set $repair "xid_catalog" (include "healer.xidCatalogPath" .) -}}
{{- end -}}
{{- if $repair -}}
{{- $_ := set $managed "repair" $repair -}}
{{- end -}}
{{- if .Values.alertmanagerToken.name -}}
{{- $_ := set $managed "detection" (dict "alertmanager_token_file" (printf "%s/alertmanager-token" (include "healer.secretsDir" .))) -}}
{{- end -}}
{{- toYaml (mergeOverwrite (deepCopy .Values.settings) $managed) -}}
{{- end -}}
