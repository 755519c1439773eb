{{- define "palisade.name" -}}palisade{{- end -}}

{{- define "palisade.labels" -}}
app.kubernetes.io/name: palisade
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{- define "palisade.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "palisade.controllerName" -}}{{ .Release.Name }}-controller{{- end -}}
{{- define "palisade.enforcerName" -}}{{ .Release.Name }}-enforcer{{- end -}}

{{- define "palisade.controllerSelector" -}}
app.kubernetes.io/name: palisade
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "palisade.enforcerSelector" -}}
app.kubernetes.io/name: palisade
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: enforcer
{{- end -}}

{{- /* The enforcer's Localhost seccomp profile, named by its content: a pod
       (and a restart of its container) always gets the profile of its own
       chart version, even while another version's pods install theirs.
       install-seccomp writes only content that hashes to the name (the
       ConfigMap changes in place on upgrade), so keep sha256 and 16. */}}
{{- define "palisade.seccompProfileName" -}}
palisade/enforcer-{{ .Files.Get "files/enforcer-seccomp.json" | sha256sum | trunc 16 }}.json
{{- end -}}

{{- /* What the schema cannot say, refused at install naming the values: the
       controller refuses to start with these out of order, and a pod-up
       deadline as long as the plugin's would have the runtime give up first. */}}
{{- define "palisade.validate" -}}
{{- with .Values.controller.leaderElection }}
{{- if .enabled }}
{{- if ge (int .renewDeadlineSeconds) (int .leaseDurationSeconds) }}
{{- fail (printf "controller.leaderElection.renewDeadlineSeconds (%d) must be less than leaseDurationSeconds (%d)" (int .renewDeadlineSeconds) (int .leaseDurationSeconds)) }}
{{- end }}
{{- if ge (int .retryPeriodSeconds) (int .renewDeadlineSeconds) }}
{{- fail (printf "controller.leaderElection.retryPeriodSeconds (%d) must be less than renewDeadlineSeconds (%d)" (int .retryPeriodSeconds) (int .renewDeadlineSeconds)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if ge (int64 .Values.podUpDeadlineMs) (mul (int64 .Values.cni.timeoutSeconds) 1000) }}
{{- fail (printf "podUpDeadlineMs (%d) must be less than cni.timeoutSeconds (%d s): the runtime would give up on the pod before the enforcer answers" (int64 .Values.podUpDeadlineMs) (int64 .Values.cni.timeoutSeconds)) }}
{{- end }}
{{- end -}}

{{- /* The arguments of palisade-cni install, for the install-cni init
       container and the cni-watch container alike: the watch must chain
       exactly what the first install chained. */}}
{{- define "palisade.cniInstallArgs" -}}
- --bin-dir
- /host/cni/bin
- --conf-dir
- /host/cni/net.d
- --enforcer-socket
- {{ printf "%s/cni.sock" .Values.enforcer.runDir | quote }}
- --timeout-seconds
- {{ int64 .Values.cni.timeoutSeconds | quote }}
{{- if .Values.cni.confFile }}
- --conf-file
- {{ .Values.cni.confFile | quote }}
{{- end }}
{{- end -}}
