//! A rendered pod template, read strictly: every field the runner knows
//! becomes a typed value, and any other field is refused with its path, so
//! a chart change the runner does not translate cannot be skipped silently.
//!
//! Fields that only matter to the scheduler or the registry (tolerations,
//! affinity, priorityClassName, imagePullSecrets) are known and kept, with
//! no effect on one node; [`super::run`] says what each field becomes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

/// A field of the template the runner cannot take, named by its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct SpecError {
    pub path: String,
    pub reason: String,
}

fn err(path: &str, reason: impl Into<String>) -> SpecError {
    SpecError {
        path: path.to_string(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodTemplate {
    pub labels: BTreeMap<String, String>,
    pub host_network: bool,
    pub dns_policy: DnsPolicy,
    /// Scheduling and eviction only: no effect on one node.
    pub priority_class: Option<String>,
    /// `None`: the API's default, true.
    pub automount_service_account_token: Option<bool>,
    pub service_account: Option<String>,
    pub termination_grace: Duration,
    /// Registry credentials: nothing is pulled here.
    pub image_pull_secrets: Vec<String>,
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
    pub node_selector: BTreeMap<String, String>,
    /// Scheduling only, kept as given.
    pub tolerations: Vec<Value>,
    pub affinity: Option<Value>,
    pub security: PodSecurity,
    pub volumes: Vec<Volume>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsPolicy {
    ClusterFirst,
    ClusterFirstWithHostNet,
    Default,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodSecurity {
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: Option<bool>,
    pub seccomp: Option<Seccomp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    RuntimeDefault,
    Unconfined,
    /// Relative to the kubelet's seccomp directory.
    Localhost(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub pull_policy: Option<String>,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub ports: Vec<Port>,
    pub readiness: Option<Probe>,
    pub liveness: Option<Probe>,
    pub security: ContainerSecurity,
    pub resources: Resources,
    pub mounts: Vec<Mount>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: EnvValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    Literal(String),
    Field(FieldRef),
}

/// The downward API fields the runner can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldRef {
    NodeName,
    PodName,
    PodNamespace,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub name: Option<String>,
    pub container_port: u16,
    pub protocol: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub action: ProbeAction,
    pub period: Duration,
    pub failure_threshold: u32,
    pub initial_delay: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    Exec(Vec<String>),
    Grpc { port: u16, service: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSecurity {
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: Option<bool>,
    pub allow_privilege_escalation: Option<bool>,
    pub read_only_root_filesystem: bool,
    /// `None`: the runtime's default set.
    pub capabilities: Option<Capabilities>,
    pub seccomp: Option<Seccomp>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub drop: Vec<String>,
    pub add: Vec<String>,
}

/// Quantities in their base units: millicores and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request_milli: Option<u64>,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request: Option<u64>,
    pub memory_limit: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub volume: String,
    pub path: String,
    pub read_only: bool,
    pub propagation: Propagation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    None,
    HostToContainer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    HostPath {
        path: String,
        kind: HostPathType,
    },
    Secret {
        name: String,
    },
    ConfigMap {
        name: String,
    },
    /// A directory of the pod's own, empty when the pod is made.
    EmptyDir,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// No check (the API's empty string).
    Unchecked,
    Directory,
    DirectoryOrCreate,
}

/// Reads `template` (a PodTemplateSpec: metadata and spec); `at` names it
/// in errors (e.g. `DaemonSet palisade-enforcer .spec.template`).
pub fn parse_template(template: &Value, at: &str) -> Result<PodTemplate, SpecError> {
    let t = Obj::new(template, at.to_string(), &["metadata", "spec"])?;
    let mut labels = BTreeMap::new();
    if let Some(m) = t.obj("metadata", &["labels"])? {
        labels = m.string_map("labels")?;
    }
    let spec = t
        .obj(
            "spec",
            &[
                "hostNetwork",
                "dnsPolicy",
                "priorityClassName",
                "automountServiceAccountToken",
                "serviceAccountName",
                "terminationGracePeriodSeconds",
                "imagePullSecrets",
                "initContainers",
                "containers",
                "nodeSelector",
                "tolerations",
                "affinity",
                "securityContext",
                "volumes",
            ],
        )?
        .ok_or_else(|| err(at, "no spec"))?;
    let host_network = spec.bool("hostNetwork")?.unwrap_or(false);
    let dns_policy = match spec.str("dnsPolicy")? {
        None | Some("ClusterFirst") => DnsPolicy::ClusterFirst,
        Some("ClusterFirstWithHostNet") => DnsPolicy::ClusterFirstWithHostNet,
        Some("Default") => DnsPolicy::Default,
        Some(other) => {
            return Err(err(
                &spec.at("dnsPolicy"),
                format!("{other:?} is not translated (known: ClusterFirst, ClusterFirstWithHostNet, Default)"),
            ))
        }
    };
    let grace = spec.uint("terminationGracePeriodSeconds")?.unwrap_or(30);
    let mut image_pull_secrets = Vec::new();
    for (path, s) in spec.list("imagePullSecrets")? {
        let s = Obj::new(s, path, &["name"])?;
        image_pull_secrets.push(s.required_str("name")?.to_string());
    }
    let mut security = PodSecurity::default();
    if let Some(s) = spec.obj(
        "securityContext",
        &["runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"],
    )? {
        security = PodSecurity {
            run_as_user: s.id("runAsUser")?,
            run_as_group: s.id("runAsGroup")?,
            run_as_non_root: s.bool("runAsNonRoot")?,
            seccomp: seccomp(&s)?,
        };
    }
    let containers = spec
        .list("containers")?
        .into_iter()
        .map(|(p, c)| container(c, p))
        .collect::<Result<Vec<_>, _>>()?;
    if containers.is_empty() {
        return Err(err(&spec.at("containers"), "a pod needs a container"));
    }
    let init_containers = spec
        .list("initContainers")?
        .into_iter()
        .map(|(p, c)| container(c, p))
        .collect::<Result<Vec<_>, _>>()?;
    for c in &init_containers {
        if c.readiness.is_some() || c.liveness.is_some() {
            return Err(err(
                &spec.at("initContainers"),
                format!(
                    "init container {} has a probe, which the API refuses",
                    c.name
                ),
            ));
        }
    }
    let volumes = spec
        .list("volumes")?
        .into_iter()
        .map(|(p, v)| volume(v, p))
        .collect::<Result<Vec<_>, _>>()?;
    for c in containers.iter().chain(&init_containers) {
        for m in &c.mounts {
            if !volumes.iter().any(|v| v.name == m.volume) {
                return Err(err(
                    at,
                    format!(
                        "container {} mounts volume {:?}, which the pod does not declare",
                        c.name, m.volume
                    ),
                ));
            }
        }
    }
    Ok(PodTemplate {
        labels,
        host_network,
        dns_policy,
        priority_class: spec.str("priorityClassName")?.map(str::to_string),
        automount_service_account_token: spec.bool("automountServiceAccountToken")?,
        service_account: spec.str("serviceAccountName")?.map(str::to_string),
        termination_grace: Duration::from_secs(grace),
        image_pull_secrets,
        init_containers,
        containers,
        node_selector: spec.string_map("nodeSelector")?,
        tolerations: spec
            .list("tolerations")?
            .into_iter()
            .map(|(_, v)| v.clone())
            .collect(),
        affinity: spec.value("affinity").cloned(),
        security,
        volumes,
    })
}

fn container(value: &Value, path: String) -> Result<Container, SpecError> {
    let c = Obj::new(
        value,
        path,
        &[
            "name",
            "image",
            "imagePullPolicy",
            "command",
            "args",
            "env",
            "ports",
            "readinessProbe",
            "livenessProbe",
            "securityContext",
            "resources",
            "volumeMounts",
        ],
    )?;
    let mut env = Vec::new();
    for (path, e) in c.list("env")? {
        let e = Obj::new(e, path, &["name", "value", "valueFrom"])?;
        let name = e.required_str("name")?.to_string();
        let value = match (e.str("value")?, e.obj("valueFrom", &["fieldRef"])?) {
            (Some(v), None) => EnvValue::Literal(v.to_string()),
            (None, Some(from)) => {
                let f = from
                    .obj("fieldRef", &["fieldPath", "apiVersion"])?
                    .ok_or_else(|| err(&from.path, "valueFrom without fieldRef"))?;
                EnvValue::Field(match f.required_str("fieldPath")? {
                    "spec.nodeName" => FieldRef::NodeName,
                    "metadata.name" => FieldRef::PodName,
                    "metadata.namespace" => FieldRef::PodNamespace,
                    other => {
                        return Err(err(
                            &f.at("fieldPath"),
                            format!("{other:?} is not translated (known: spec.nodeName, metadata.name, metadata.namespace)"),
                        ))
                    }
                })
            }
            // The API allows neither both nor none ("" is a value).
            (None, None) => EnvValue::Literal(String::new()),
            (Some(_), Some(_)) => return Err(err(&e.path, "both value and valueFrom")),
        };
        env.push(EnvVar { name, value });
    }
    let mut ports = Vec::new();
    for (path, p) in c.list("ports")? {
        let p = Obj::new(p, path, &["name", "containerPort", "protocol"])?;
        ports.push(Port {
            name: p.str("name")?.map(str::to_string),
            container_port: p
                .port("containerPort")?
                .ok_or_else(|| err(&p.path, "no containerPort"))?,
            protocol: p.str("protocol")?.unwrap_or("TCP").to_string(),
        });
    }
    let mut mounts = Vec::new();
    for (path, m) in c.list("volumeMounts")? {
        let m = Obj::new(
            m,
            path,
            &["name", "mountPath", "readOnly", "mountPropagation"],
        )?;
        mounts.push(Mount {
            volume: m.required_str("name")?.to_string(),
            path: m.required_str("mountPath")?.to_string(),
            read_only: m.bool("readOnly")?.unwrap_or(false),
            propagation: match m.str("mountPropagation")? {
                None | Some("None") => Propagation::None,
                Some("HostToContainer") => Propagation::HostToContainer,
                Some(other) => {
                    return Err(err(
                        &m.at("mountPropagation"),
                        format!("{other:?} is not translated (known: None, HostToContainer)"),
                    ))
                }
            },
        });
    }
    let mut security = ContainerSecurity::default();
    if let Some(s) = c.obj(
        "securityContext",
        &[
            "runAsUser",
            "runAsGroup",
            "runAsNonRoot",
            "allowPrivilegeEscalation",
            "readOnlyRootFilesystem",
            "capabilities",
            "seccompProfile",
            "privileged",
        ],
    )? {
        if s.bool("privileged")? == Some(true) {
            return Err(err(
                &s.at("privileged"),
                "privileged containers are not translated",
            ));
        }
        let capabilities = match s.obj("capabilities", &["add", "drop"])? {
            Some(caps) => Some(Capabilities {
                drop: caps.strings("drop")?,
                add: caps.strings("add")?,
            }),
            None => None,
        };
        security = ContainerSecurity {
            run_as_user: s.id("runAsUser")?,
            run_as_group: s.id("runAsGroup")?,
            run_as_non_root: s.bool("runAsNonRoot")?,
            allow_privilege_escalation: s.bool("allowPrivilegeEscalation")?,
            read_only_root_filesystem: s.bool("readOnlyRootFilesystem")?.unwrap_or(false),
            capabilities,
            seccomp: seccomp(&s)?,
        };
    }
    let mut resources = Resources::default();
    if let Some(r) = c.obj("resources", &["requests", "limits"])? {
        if let Some(q) = r.obj("requests", &["cpu", "memory"])? {
            resources.cpu_request_milli = q.quantity("cpu", Unit::Milli)?;
            resources.memory_request = q.quantity("memory", Unit::Bytes)?;
        }
        if let Some(q) = r.obj("limits", &["cpu", "memory"])? {
            resources.cpu_limit_milli = q.quantity("cpu", Unit::Milli)?;
            resources.memory_limit = q.quantity("memory", Unit::Bytes)?;
        }
    }
    Ok(Container {
        name: c.required_str("name")?.to_string(),
        image: c.required_str("image")?.to_string(),
        pull_policy: c.str("imagePullPolicy")?.map(str::to_string),
        command: c.strings("command")?,
        args: c.strings("args")?,
        env,
        ports,
        readiness: probe(&c, "readinessProbe")?,
        liveness: probe(&c, "livenessProbe")?,
        security,
        resources,
        mounts,
    })
}

fn probe(c: &Obj, key: &str) -> Result<Option<Probe>, SpecError> {
    let Some(p) = c.obj(
        key,
        &[
            "exec",
            "grpc",
            "periodSeconds",
            "failureThreshold",
            "initialDelaySeconds",
            "timeoutSeconds",
        ],
    )?
    else {
        return Ok(None);
    };
    let action = match (
        p.obj("exec", &["command"])?,
        p.obj("grpc", &["port", "service"])?,
    ) {
        (Some(e), None) => ProbeAction::Exec(e.strings("command")?),
        (None, Some(g)) => ProbeAction::Grpc {
            port: g.port("port")?.ok_or_else(|| err(&g.path, "no port"))?,
            service: g.str("service")?.unwrap_or("").to_string(),
        },
        _ => return Err(err(&p.path, "a probe needs exactly one of exec and grpc")),
    };
    // The API's defaults.
    Ok(Some(Probe {
        action,
        period: Duration::from_secs(p.uint("periodSeconds")?.unwrap_or(10)),
        failure_threshold: p.uint("failureThreshold")?.unwrap_or(3) as u32,
        initial_delay: Duration::from_secs(p.uint("initialDelaySeconds")?.unwrap_or(0)),
        timeout: Duration::from_secs(p.uint("timeoutSeconds")?.unwrap_or(1)),
    }))
}

fn seccomp(s: &Obj) -> Result<Option<Seccomp>, SpecError> {
    let Some(p) = s.obj("seccompProfile", &["type", "localhostProfile"])? else {
        return Ok(None);
    };
    let local = p.str("localhostProfile")?;
    Ok(Some(match (p.required_str("type")?, local) {
        ("RuntimeDefault", None) => Seccomp::RuntimeDefault,
        ("Unconfined", None) => Seccomp::Unconfined,
        ("Localhost", Some(path)) => {
            // The API's rule: a descending path, relative to the kubelet's
            // seccomp directory.
            if path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return Err(err(&p.at("localhostProfile"), "must be a descending relative path"));
            }
            Seccomp::Localhost(path.to_string())
        }
        ("Localhost", None) => return Err(err(&p.path, "Localhost needs localhostProfile")),
        (t, _) => {
            return Err(err(
                &p.at("type"),
                format!("{t:?} with these fields is not translated (known: RuntimeDefault, Unconfined, Localhost with localhostProfile)"),
            ))
        }
    }))
}

fn volume(value: &Value, path: String) -> Result<Volume, SpecError> {
    let v = Obj::new(
        value,
        path,
        &["name", "hostPath", "secret", "configMap", "emptyDir"],
    )?;
    let name = v.required_str("name")?.to_string();
    let host = v.obj("hostPath", &["path", "type"])?;
    let secret = v.obj("secret", &["secretName"])?;
    let config_map = v.obj("configMap", &["name"])?;
    // Only the default medium: a directory of the pod's, empty at start.
    let empty = v.obj("emptyDir", &[])?;
    let source = match (host, secret, config_map, empty) {
        (None, None, None, Some(_)) => VolumeSource::EmptyDir,
        (Some(h), None, None, None) => VolumeSource::HostPath {
            path: h.required_str("path")?.to_string(),
            kind: match h.str("type")? {
                None | Some("") => HostPathType::Unchecked,
                Some("Directory") => HostPathType::Directory,
                Some("DirectoryOrCreate") => HostPathType::DirectoryOrCreate,
                Some(other) => {
                    let known = "known: \"\", Directory, DirectoryOrCreate";
                    return Err(err(
                        &h.at("type"),
                        format!("{other:?} is not translated ({known})"),
                    ));
                }
            },
        },
        (None, Some(s), None, None) => VolumeSource::Secret {
            name: s.required_str("secretName")?.to_string(),
        },
        (None, None, Some(c), None) => VolumeSource::ConfigMap {
            name: c.required_str("name")?.to_string(),
        },
        _ => {
            return Err(err(
                &v.path,
                "a volume needs exactly one of hostPath, secret, configMap, emptyDir",
            ))
        }
    };
    Ok(Volume { name, source })
}

#[derive(Clone, Copy)]
enum Unit {
    Milli,
    Bytes,
}

/// A Kubernetes quantity (`100m`, `2`, `256Mi`, `1G`) in millis or bytes.
fn parse_quantity(s: &str, unit: Unit) -> Option<u64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return None,
    };
    let value = number * scale;
    let value = match unit {
        Unit::Milli => value * 1000.0,
        Unit::Bytes => value,
    };
    (value >= 0.0 && value.is_finite()).then(|| value.ceil() as u64)
}

/// One JSON object of the template, with its path, whose keys were all
/// checked against the ones the runner knows.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn new(value: &'a Value, path: String, known: &[&str]) -> Result<Self, SpecError> {
        let map = value
            .as_object()
            .ok_or_else(|| err(&path, format!("expected an object, got {value}")))?;
        for (key, v) in map {
            if !v.is_null() && !known.contains(&key.as_str()) {
                return Err(err(
                    &format!("{path}.{key}"),
                    format!(
                        "a field the pod runner does not translate (it knows {})",
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(Self { path, map })
    }

    fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn value(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn obj(&self, key: &str, known: &[&str]) -> Result<Option<Obj<'a>>, SpecError> {
        self.value(key)
            .map(|v| Obj::new(v, self.at(key), known))
            .transpose()
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, SpecError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(err(
                &self.at(key),
                format!("expected a string, got {other}"),
            )),
        }
    }

    fn required_str(&self, key: &str) -> Result<&'a str, SpecError> {
        self.str(key)?.ok_or_else(|| err(&self.at(key), "missing"))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, SpecError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(err(
                &self.at(key),
                format!("expected a boolean, got {other}"),
            )),
        }
    }

    fn uint(&self, key: &str) -> Result<Option<u64>, SpecError> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                err(
                    &self.at(key),
                    format!("expected a non-negative integer, got {v}"),
                )
            }),
        }
    }

    fn id(&self, key: &str) -> Result<Option<u32>, SpecError> {
        self.uint(key)?
            .map(|v| {
                u32::try_from(v).map_err(|_| err(&self.at(key), format!("{v} is out of range")))
            })
            .transpose()
    }

    fn port(&self, key: &str) -> Result<Option<u16>, SpecError> {
        self.uint(key)?
            .map(|v| {
                u16::try_from(v)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| err(&self.at(key), format!("{v} is not a port")))
            })
            .transpose()
    }

    fn quantity(&self, key: &str, unit: Unit) -> Result<Option<u64>, SpecError> {
        let Some(v) = self.value(key) else {
            return Ok(None);
        };
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(err(
                    &self.at(key),
                    format!("expected a quantity, got {other}"),
                ))
            }
        };
        parse_quantity(&text, unit)
            .map(Some)
            .ok_or_else(|| err(&self.at(key), format!("{text:?} is not a quantity")))
    }

    fn list(&self, key: &str) -> Result<Vec<(String, &'a Value)>, SpecError> {
        match self.value(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("{}[{i}]", self.at(key)), v))
                .collect()),
            Some(other) => Err(err(&self.at(key), format!("expected a list, got {other}"))),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, SpecError> {
        self.list(key)?
            .into_iter()
            .map(|(path, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err(&path, format!("expected a string, got {v}")))
            })
            .collect()
    }

    fn string_map(&self, key: &str) -> Result<BTreeMap<String, String>, SpecError> {
        match self.value(key) {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    v.as_str()
                        .map(|s| (k.clone(), s.to_string()))
                        .ok_or_else(|| err(&format!("{}.{k}", self.at(key)), "expected a string"))
                })
                .collect(),
            Some(other) => Err(err(
                &self.at(key),
                format!("expected an object, got {other}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn minimal() -> Value {
        json!({"spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn quantities_in_millis_and_bytes() {
        assert_eq!(parse_quantity("100m", Unit::Milli), Some(100));
        assert_eq!(parse_quantity("2", Unit::Milli), Some(2000));
        assert_eq!(parse_quantity("0.5", Unit::Milli), Some(500));
        assert_eq!(parse_quantity("256Mi", Unit::Bytes), Some(256 << 20));
        assert_eq!(parse_quantity("1Gi", Unit::Bytes), Some(1 << 30));
        assert_eq!(parse_quantity("1G", Unit::Bytes), Some(1_000_000_000));
        assert_eq!(parse_quantity("12Qi", Unit::Bytes), None);
        assert_eq!(parse_quantity("", Unit::Bytes), None);
    }

    #[test]
    fn the_api_defaults_apply_to_a_minimal_pod() {
        let pod = parse_template(&minimal(), "t").unwrap();
        assert!(!pod.host_network);
        assert_eq!(pod.dns_policy, DnsPolicy::ClusterFirst);
        assert_eq!(pod.termination_grace, Duration::from_secs(30));
        assert_eq!(pod.containers[0].name, "c");
        assert!(pod.containers[0].security.capabilities.is_none());
    }

    /// Every object of the template refuses a key it does not know, and
    /// the error names the whole path.
    #[test]
    fn an_unknown_field_anywhere_is_refused_by_path() {
        let cases: &[(&str, Value)] = &[
            (
                "t.spec.shareProcessNamespace",
                json!({"spec": {"shareProcessNamespace": true, "containers": [{"name": "c", "image": "i"}]}}),
            ),
            (
                "t.metadata.annotations",
                json!({"metadata": {"annotations": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
            ),
            (
                "t.spec.containers[0].workingDir",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "workingDir": "/"}]}}),
            ),
            (
                "t.spec.containers[0].securityContext.procMount",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"procMount": "Default"}}]}}),
            ),
            (
                "t.spec.containers[0].securityContext.capabilities.keep",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"capabilities": {"keep": []}}}]}}),
            ),
            (
                "t.spec.containers[0].ports[0].hostPort",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 1, "hostPort": 1}]}]}}),
            ),
            (
                "t.spec.containers[0].readinessProbe.httpGet",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "readinessProbe": {"httpGet": {"port": 1}}}]}}),
            ),
            (
                "t.spec.containers[0].volumeMounts[0].subPath",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "x"}]}], "volumes": [{"name": "v", "hostPath": {"path": "/v"}}]}}),
            ),
            (
                "t.spec.containers[0].env[0].valueFrom.secretKeyRef",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "E", "valueFrom": {"secretKeyRef": {}}}]}]}}),
            ),
            (
                "t.spec.containers[0].resources.limits.hugepages-2Mi",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"hugepages-2Mi": "1Mi"}}}]}}),
            ),
            (
                "t.spec.volumes[0].emptyDir.medium",
                json!({"spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [{"name": "v", "emptyDir": {"medium": "Memory"}}]}}),
            ),
            (
                "t.spec.volumes[0].secret.items",
                json!({"spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [{"name": "v", "secret": {"secretName": "s", "items": []}}]}}),
            ),
            (
                "t.spec.securityContext.fsGroup",
                json!({"spec": {"securityContext": {"fsGroup": 1}, "containers": [{"name": "c", "image": "i"}]}}),
            ),
            (
                "t.spec.initContainers[0].lifecycle",
                json!({"spec": {"initContainers": [{"name": "i", "image": "i", "lifecycle": {}}], "containers": [{"name": "c", "image": "i"}]}}),
            ),
        ];
        for (path, template) in cases {
            let e = parse_template(template, "t").expect_err(path);
            assert_eq!(e.path, *path, "{e}");
            assert!(e.reason.contains("does not translate"), "{e}");
        }
    }

    #[test]
    fn values_it_cannot_translate_are_refused() {
        let cases: &[(&str, Value)] = &[
            (
                "t.spec.dnsPolicy",
                json!({"spec": {"dnsPolicy": "None", "containers": [{"name": "c", "image": "i"}]}}),
            ),
            (
                "t.spec.containers[0].securityContext.privileged",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"privileged": true}}]}}),
            ),
            (
                "t.spec.containers[0].volumeMounts[0].mountPropagation",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v", "mountPropagation": "Bidirectional"}]}], "volumes": [{"name": "v", "hostPath": {"path": "/v"}}]}}),
            ),
            (
                "t.spec.volumes[0].hostPath.type",
                json!({"spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [{"name": "v", "hostPath": {"path": "/v", "type": "Socket"}}]}}),
            ),
            (
                "t.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "E", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]}]}}),
            ),
            (
                "t.spec.securityContext.seccompProfile.localhostProfile",
                json!({"spec": {"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "../x.json"}}, "containers": [{"name": "c", "image": "i"}]}}),
            ),
            (
                "t.spec.containers[0].resources.limits.memory",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"memory": "lots"}}}]}}),
            ),
        ];
        for (path, template) in cases {
            let e = parse_template(template, "t").expect_err(path);
            assert_eq!(e.path, *path, "{e}");
        }
        let undeclared = json!({"spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}});
        assert!(parse_template(&undeclared, "t")
            .unwrap_err()
            .reason
            .contains("does not declare"));
    }

    #[test]
    fn every_field_the_chart_uses_is_read() {
        let template = json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {
                "hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet",
                "priorityClassName": "system-node-critical", "automountServiceAccountToken": false,
                "serviceAccountName": "sa", "terminationGracePeriodSeconds": 7,
                "imagePullSecrets": [{"name": "regcred"}], "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"operator": "Exists"}], "affinity": {"nodeAffinity": {}},
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": [{"name": "init", "image": "i", "command": ["/x", "install"]}],
                "containers": [{
                    "name": "c", "image": "i", "imagePullPolicy": "IfNotPresent", "command": ["/c"], "args": ["-v"],
                    "env": [{"name": "A", "value": "1"}, {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                    "ports": [{"name": "grpc", "containerPort": 7443, "protocol": "TCP"}],
                    "readinessProbe": {"grpc": {"port": 7444, "service": "s"}, "periodSeconds": 2},
                    "livenessProbe": {"exec": {"command": ["/h"]}, "periodSeconds": 10, "failureThreshold": 6},
                    "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                        "capabilities": {"drop": ["ALL"], "add": ["BPF"]},
                                        "seccompProfile": {"type": "Localhost", "localhostProfile": "p/e.json"}},
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                    "volumeMounts": [{"name": "h", "mountPath": "/h", "mountPropagation": "HostToContainer"}, {"name": "s", "mountPath": "/s", "readOnly": true}]
                }],
                "volumes": [{"name": "h", "hostPath": {"path": "/h", "type": "Directory"}}, {"name": "s", "secret": {"secretName": "tls"}}, {"name": "m", "configMap": {"name": "cm"}}]
            }
        });
        let pod = parse_template(&template, "t").unwrap();
        assert!(pod.host_network);
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.termination_grace, Duration::from_secs(7));
        assert_eq!(pod.security.seccomp, Some(Seccomp::RuntimeDefault));
        let c = &pod.containers[0];
        assert_eq!(c.env[1].value, EnvValue::Field(FieldRef::NodeName));
        assert_eq!(
            c.readiness.as_ref().unwrap().action,
            ProbeAction::Grpc {
                port: 7444,
                service: "s".into()
            }
        );
        assert_eq!(c.liveness.as_ref().unwrap().failure_threshold, 6);
        assert_eq!(
            c.security.seccomp,
            Some(Seccomp::Localhost("p/e.json".into()))
        );
        assert_eq!(c.resources.memory_limit, Some(512 << 20));
        assert_eq!(c.resources.cpu_request_milli, Some(50));
        assert_eq!(c.mounts[0].propagation, Propagation::HostToContainer);
        assert_eq!(
            pod.volumes[2].source,
            VolumeSource::ConfigMap { name: "cm".into() }
        );
    }
}
