//! The scenario file: the Kubernetes objects a lab starts with, then steps
//! that change them and probe real traffic.
//!
//! Everything is validated here, before the lab builds anything, so a typo
//! costs a clear message instead of a half-built node.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::dump::{self, DumpCheck, RawDumpCheck};
use crate::fault::{self, Fault, Liveness, RawFault};
use crate::service::{ServiceSpec, SliceSpec};

/// Probe timeout when the scenario does not set `timeoutMs`.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Pod,
    NetworkPolicy,
    Service,
    EndpointSlice,
    /// Either API group's (`apiVersion` says which); cluster-scoped.
    ClusterNetworkPolicy,
    /// AWS's (`networking.k8s.aws/v1alpha1`): a NetworkPolicy whose egress
    /// peers may be `domainNames`.
    ApplicationNetworkPolicy,
}

/// The apiVersion of AWS's ClusterNetworkPolicy, which the lab takes too,
/// and of its ApplicationNetworkPolicy.
const AWS_CNP_API_VERSION: &str = palisade_apis::wire::AWS_API_VERSION;

impl Kind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Namespace" => Some(Self::Namespace),
            "Pod" => Some(Self::Pod),
            "NetworkPolicy" => Some(Self::NetworkPolicy),
            "Service" => Some(Self::Service),
            "EndpointSlice" => Some(Self::EndpointSlice),
            "ClusterNetworkPolicy" => Some(Self::ClusterNetworkPolicy),
            "ApplicationNetworkPolicy" => Some(Self::ApplicationNetworkPolicy),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "Namespace",
            Self::Pod => "Pod",
            Self::NetworkPolicy => "NetworkPolicy",
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::ClusterNetworkPolicy => "ClusterNetworkPolicy",
            Self::ApplicationNetworkPolicy => "ApplicationNetworkPolicy",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Self::Namespace | Self::Pod | Self::Service => "v1",
            Self::NetworkPolicy => "networking.k8s.io/v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
            Self::ClusterNetworkPolicy => "policy.networking.k8s.io/v1alpha2",
            Self::ApplicationNetworkPolicy => AWS_CNP_API_VERSION,
        }
    }

    fn namespaced(self) -> bool {
        !matches!(self, Self::Namespace | Self::ClusterNetworkPolicy)
    }
}

const SUPPORTED_KINDS: &str = "Namespace, Pod, NetworkPolicy, Service, EndpointSlice, \
     ClusterNetworkPolicy, ApplicationNetworkPolicy";

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one object. `namespace` is `None` exactly for namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    pub fn pod(name: &PodName) -> Self {
        Self {
            kind: Kind::Pod,
            namespace: Some(name.namespace.clone()),
            name: name.name.clone(),
        }
    }

    pub fn pod_name(&self) -> Option<PodName> {
        match (self.kind, &self.namespace) {
            (Kind::Pod, Some(ns)) => Some(PodName {
                namespace: ns.clone(),
                name: self.name.clone(),
            }),
            _ => None,
        }
    }

    /// The namespace this object lives in, or names, for a Namespace.
    pub fn namespace_scope(&self) -> &str {
        self.namespace.as_deref().unwrap_or(&self.name)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

impl PodName {
    /// Parses `namespace/name`.
    pub fn parse(s: &str) -> Result<Self> {
        let (namespace, name) = s
            .split_once('/')
            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| anyhow!("expected <namespace>/<pod>, got {s:?}"))?;
        Ok(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A port a pod serves: the lab listens on it and echoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServedPort {
    pub port: u16,
    pub protocol: Protocol,
}

/// A validated Kubernetes object. `body` is the object as given, with
/// defaults (apiVersion, metadata.namespace) filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    key: ObjectKey,
    body: Value,
    ports: Vec<ServedPort>,
}

impl Object {
    /// Validates one object; errors name the offending field.
    pub fn from_value(value: Value) -> Result<Self> {
        let mut body = match value {
            Value::Object(map) => map,
            other => bail!("expected a Kubernetes object (a mapping), got {other}"),
        };
        let kind_str = body
            .get("kind")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("kind: missing or not a string"))?;
        let kind = Kind::parse(kind_str).ok_or_else(|| {
            anyhow!("kind: {kind_str:?} is not supported by the lab ({SUPPORTED_KINDS})")
        })?;
        match body.get("apiVersion") {
            None => {
                body.insert("apiVersion".into(), kind.api_version().into());
            }
            Some(Value::String(v)) if v == kind.api_version() => {}
            Some(Value::String(v))
                if kind == Kind::ClusterNetworkPolicy && v == AWS_CNP_API_VERSION => {}
            Some(other) => bail!(
                "apiVersion: {kind} must be {:?}, got {other}",
                kind.api_version()
            ),
        }
        let metadata = body
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| anyhow!("metadata: missing or not a mapping"))?;
        let name = metadata
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("metadata.name: missing or not a string"))?
            .to_string();
        check_name("metadata.name", &name)?;
        let namespace = if kind.namespaced() {
            let ns = match metadata.get("namespace") {
                None => "default".to_string(),
                Some(Value::String(ns)) => ns.clone(),
                Some(other) => bail!("metadata.namespace: expected a string, got {other}"),
            };
            check_name("metadata.namespace", &ns)?;
            metadata.insert("namespace".into(), ns.clone().into());
            Some(ns)
        } else {
            if metadata.contains_key("namespace") {
                bail!("metadata.namespace: a {kind} has no namespace");
            }
            None
        };
        if let Some(labels) = metadata.get("labels") {
            check_labels(labels)?;
        }
        let ports = if kind == Kind::Pod {
            pod_ports(&body)?
        } else {
            Vec::new()
        };
        let body = Value::Object(body);
        match kind {
            Kind::Service => {
                ServiceSpec::parse(&body)?;
            }
            Kind::EndpointSlice => {
                SliceSpec::parse(&body)?;
            }
            _ => {}
        }
        Ok(Self {
            key: ObjectKey {
                kind,
                namespace,
                name,
            },
            body,
            ports,
        })
    }

    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    pub fn body(&self) -> &Value {
        &self.body
    }

    /// The ports the pod's containers declare (empty for other kinds).
    pub fn ports(&self) -> &[ServedPort] {
        &self.ports
    }
}

fn check_name(field: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    if !ok {
        bail!("{field}: {name:?} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', starting and ending alphanumeric)");
    }
    Ok(())
}

fn check_labels(labels: &Value) -> Result<()> {
    let map = labels
        .as_object()
        .ok_or_else(|| anyhow!("metadata.labels: expected a mapping, got {labels}"))?;
    for (k, v) in map {
        if !v.is_string() {
            bail!("metadata.labels.{k}: label values must be strings, got {v} (quote it)");
        }
    }
    Ok(())
}

fn pod_ports(body: &Map<String, Value>) -> Result<Vec<ServedPort>> {
    let containers = body
        .get("spec")
        .and_then(|s| s.get("containers"))
        .ok_or_else(|| anyhow!("spec.containers: missing"))?
        .as_array()
        .ok_or_else(|| anyhow!("spec.containers: expected a list"))?;
    let mut seen = BTreeSet::new();
    let mut ports = Vec::new();
    for (ci, container) in containers.iter().enumerate() {
        let Some(list) = container.get("ports") else {
            continue;
        };
        let list = list
            .as_array()
            .ok_or_else(|| anyhow!("spec.containers[{ci}].ports: expected a list"))?;
        for (pi, p) in list.iter().enumerate() {
            let field = format!("spec.containers[{ci}].ports[{pi}]");
            let port = p
                .get("containerPort")
                .and_then(Value::as_i64)
                .ok_or_else(|| anyhow!("{field}.containerPort: missing or not an integer"))?;
            let port = u16::try_from(port)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| anyhow!("{field}.containerPort: {port} is not a port (1-65535)"))?;
            let protocol = match p.get("protocol") {
                None => Protocol::Tcp,
                Some(v) => v.as_str().and_then(Protocol::parse).ok_or_else(|| {
                    anyhow!("{field}.protocol: expected TCP, UDP or SCTP, got {v}")
                })?,
            };
            let served = ServedPort { port, protocol };
            if !seen.insert(served) {
                bail!("{field}: {protocol} port {port} is declared twice in the pod");
            }
            ports.push(served);
        }
    }
    Ok(ports)
}

/// A Service of the lab, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceRef {
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            kind: Kind::Service,
            namespace: Some(self.namespace.clone()),
            name: self.name.clone(),
        }
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "svc/{}/{}", self.namespace, self.name)
    }
}

/// Where a probe goes: a pod of the lab, a Service's ClusterIP (the probe's
/// port is the service port), a literal address, or a name the probe
/// resolves first through the scenario's DNS (`name:HOST`, see
/// [`crate::dns`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pod(PodName),
    Service(ServiceRef),
    Ip(IpAddr),
    Name(String),
}

impl Target {
    pub fn parse(s: &str) -> Result<Self> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        if let Some(host) = s.strip_prefix("name:") {
            crate::dns::parse_name(host).context("name:")?;
            return Ok(Self::Name(host.to_string()));
        }
        if let Some(rest) = s.strip_prefix("svc/") {
            let p = PodName::parse(rest)
                .map_err(|_| anyhow!("expected svc/<namespace>/<service>, got {s:?}"))?;
            return Ok(Self::Service(ServiceRef {
                namespace: p.namespace,
                name: p.name,
            }));
        }
        PodName::parse(s).map(Self::Pod).map_err(|_| {
            anyhow!(
                "expected <namespace>/<pod>, svc/<namespace>/<service>, name:<host> or an IP address, got {s:?}"
            )
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pod(p) => p.fmt(f),
            Self::Service(s) => s.fmt(f),
            Self::Ip(ip) => ip.fmt(f),
            Self::Name(host) => write!(f, "name:{host}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a probe does before its real traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forge {
    /// Crafted reply-direction segments (every flag combination), the same
    /// with the target's address as source, and IPv4 fragments, sent from
    /// the source pod's eth0 with a packet socket; the probe then binds the
    /// source port those packets named.
    Reply,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub from: PodName,
    pub to: Target,
    pub port: u16,
    pub protocol: Protocol,
    pub expect: Option<Verdict>,
    pub timeout: Duration,
    pub forge: Option<Forge>,
}

impl ProbeSpec {
    pub fn new(from: &str, to: &str, port: u16, protocol: Protocol) -> Result<Self> {
        Ok(Self {
            from: PodName::parse(from).context("from")?,
            to: Target::parse(to).context("to")?,
            port,
            protocol,
            expect: None,
            timeout: DEFAULT_PROBE_TIMEOUT,
            forge: None,
        })
    }

    pub fn expect(mut self, verdict: Verdict) -> Self {
        self.expect = Some(verdict);
        self
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Step {
    pub name: String,
    /// Injected, in order, before the step's apply and delete.
    pub faults: Vec<Fault>,
    /// `dns:`: the DNS server's records from this step on, before its apply.
    pub dns: Option<crate::dns::Records>,
    /// Objects whose labels the step replaces in place (`label:`), as
    /// `kubectl label --overwrite` of every key would; before its apply.
    pub labels: Vec<(ObjectKey, BTreeMap<String, String>)>,
    pub apply: Vec<Object>,
    pub delete: Vec<ObjectKey>,
    /// `Some(text)`: the CNI ADD of the pods this step applies must fail,
    /// with an error containing `text` (empty: any error). The failed pods
    /// are withdrawn, as a runtime would.
    pub add_error: Option<String>,
    /// `Some(text)`: the controller must refuse what this step applies or
    /// deletes, with a source error containing `text`; the lab waits for
    /// that error, then for the node to settle on what the controller
    /// still serves (the last accepted manifests). A later step's change
    /// must make the manifests acceptable again.
    pub source_error: Option<String>,
    pub probes: Vec<ProbeSpec>,
    pub dump: Vec<DumpCheck>,
}

/// The enforcer's mode (`--mode`), passed only when the scenario sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Standard,
    Strict,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "standard" => Some(Self::Standard),
            "strict" => Some(Self::Strict),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Strict => "strict",
        }
    }
}

/// The enforcers' flow log (`--flow-log`), set by `flowLogs:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowLogMode {
    Off,
    Deny,
    All,
}

impl FlowLogMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Self::Off),
            "deny" => Some(Self::Deny),
            "all" => Some(Self::All),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Deny => "deny",
            Self::All => "all",
        }
    }
}

/// The plugin Palisade is chained after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CniKind {
    #[default]
    Ptp,
    Bridge,
}

impl CniKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ptp" => Some(Self::Ptp),
            "bridge" => Some(Self::Bridge),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scenario {
    /// `None`: the enforcer gets no `--mode` flag (its own default).
    pub mode: Option<Mode>,
    pub cni: CniKind,
    /// `runtime:`, who starts the pods; `None`: the lab's default (its own
    /// CNI runs), or what the command line or test asks for.
    pub runtime: Option<crate::runtime::PodRuntime>,
    /// `None`: the enforcer gets no `--pod-up-deadline-ms` flag.
    pub pod_up_deadline: Option<Duration>,
    /// Sysctls of the node's namespace (e.g. short kernel conntrack
    /// timeouts), set before anything runs; they go with the namespace.
    pub node_sysctls: Vec<(String, String)>,
    /// `None`: the enforcer gets no `--conntrack-cleanup-secs` flag.
    pub conntrack_cleanup_secs: Option<u32>,
    /// `flowLogs:`; `None`: no flow log flags (the enforcer's default, off).
    pub flow_logs: Option<FlowLogMode>,
    /// `flowLogRate:` (events per second per node); `None`: the default.
    pub flow_log_rate: Option<u32>,
    /// How many nodes the scenario asks for (`nodes:`, default 1): named
    /// `node-1` to `node-N`; pods without `spec.nodeName` are spread over
    /// them round-robin, in the order they are applied.
    pub nodes: u32,
    /// `dns:`: the lab's DNS server, resolver and records.
    pub dns: Option<crate::dns::DnsSpec>,
    pub objects: Vec<Object>,
    pub steps: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawScenario {
    mode: Option<String>,
    cni: Option<String>,
    runtime: Option<String>,
    pod_up_deadline_ms: Option<i64>,
    #[serde(default)]
    node_sysctls: BTreeMap<String, Value>,
    conntrack_cleanup_secs: Option<i64>,
    flow_logs: Option<String>,
    flow_log_rate: Option<i64>,
    nodes: Option<i64>,
    netpol: Option<crate::netpol::RawNetpol>,
    cnp: Option<crate::cnp::RawCnp>,
    dns: Option<crate::dns::RawDns>,
    #[serde(default)]
    objects: Vec<Value>,
    #[serde(default)]
    steps: Vec<RawStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawStep {
    name: Option<String>,
    #[serde(default)]
    fault: Vec<RawFault>,
    dns: Option<crate::dns::RawStepDns>,
    #[serde(default)]
    apply: Vec<Value>,
    #[serde(default)]
    delete: Vec<RawRef>,
    add_error: Option<String>,
    source_error: Option<String>,
    #[serde(default)]
    probes: Vec<RawProbe>,
    #[serde(default)]
    reachability: Vec<crate::netpol::RawMatrix>,
    #[serde(default)]
    label: RawLabels,
    #[serde(default)]
    dump: Vec<RawDumpCheck>,
}

/// A step's `label:`: one change (a mapping, as `kubectl label` users
/// write it) or a list of them.
#[derive(Default)]
struct RawLabels(Vec<RawLabel>);

impl<'de> Deserialize<'de> for RawLabels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let one =
            |v: serde_yaml::Value| serde_yaml::from_value::<RawLabel>(v).map_err(D::Error::custom);
        match serde_yaml::Value::deserialize(d)? {
            serde_yaml::Value::Sequence(list) => list
                .into_iter()
                .enumerate()
                .map(|(j, v)| one(v).map_err(|e| D::Error::custom(format_args!("label[{j}]: {e}"))))
                .collect::<Result<_, _>>()
                .map(RawLabels),
            v @ serde_yaml::Value::Mapping(_) => Ok(RawLabels(vec![one(v)?])),
            serde_yaml::Value::Null => Ok(RawLabels::default()),
            other => Err(D::Error::custom(format_args!(
                "label: expected a mapping (kind, namespace, name, labels) or a list of them, got {}",
                match other {
                    serde_yaml::Value::String(_) => "a string",
                    serde_yaml::Value::Number(_) => "a number",
                    serde_yaml::Value::Bool(_) => "a boolean",
                    _ => "something else",
                }
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLabel {
    kind: String,
    namespace: Option<String>,
    name: String,
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRef {
    kind: String,
    namespace: Option<String>,
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProbe {
    from: String,
    to: String,
    port: i64,
    protocol: Option<String>,
    expect: Option<String>,
    timeout_ms: Option<i64>,
    forge: Option<String>,
}

impl Scenario {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading scenario {}", path.display()))?;
        Self::from_yaml(&text).with_context(|| format!("scenario {}", path.display()))
    }

    pub fn from_yaml(text: &str) -> Result<Self> {
        let raw: RawScenario = serde_yaml::from_str(text)?;
        let mode = match raw.mode.as_deref() {
            None => None,
            Some(m) => Some(
                Mode::parse(m)
                    .ok_or_else(|| anyhow!("mode: expected standard or strict, got {m:?}"))?,
            ),
        };
        let cni = match raw.cni.as_deref() {
            None => CniKind::default(),
            Some(c) => CniKind::parse(c)
                .ok_or_else(|| anyhow!("cni: expected ptp or bridge, got {c:?}"))?,
        };
        let runtime = match raw.runtime.as_deref() {
            None => None,
            Some(r) => Some(crate::runtime::PodRuntime::parse(r).ok_or_else(|| {
                anyhow!(
                    "runtime: expected {}, got {r:?}",
                    crate::runtime::PodRuntime::NAMES
                )
            })?),
        };
        let pod_up_deadline = match raw.pod_up_deadline_ms {
            None => None,
            Some(ms) if (1..=60_000).contains(&ms) => Some(Duration::from_millis(ms as u64)),
            Some(ms) => bail!("podUpDeadlineMs: {ms} is out of range (1-60000)"),
        };
        let node_sysctls = raw
            .node_sysctls
            .into_iter()
            .map(|(k, v)| parse_sysctl(&k, &v).with_context(|| format!("nodeSysctls.{k}")))
            .collect::<Result<Vec<_>>>()?;
        let conntrack_cleanup_secs = match raw.conntrack_cleanup_secs {
            None => None,
            Some(s) if (1..=3600).contains(&s) => Some(s as u32),
            Some(s) => bail!("conntrackCleanupSecs: {s} is out of range (1-3600)"),
        };
        let flow_logs = match raw.flow_logs.as_deref() {
            None => None,
            Some(m) => Some(
                FlowLogMode::parse(m)
                    .ok_or_else(|| anyhow!("flowLogs: expected off, deny or all, got {m:?}"))?,
            ),
        };
        let flow_log_rate = match raw.flow_log_rate {
            None => None,
            Some(r) if (0..=1_000_000).contains(&r) => Some(r as u32),
            Some(r) => bail!("flowLogRate: {r} is out of range (0-1000000)"),
        };
        let nodes = match raw.nodes {
            None => 1,
            Some(n) if (1..=16).contains(&n) => n as u32,
            Some(n) => bail!("nodes: {n} is out of range (1-16)"),
        };
        let mut object_values = match (&raw.netpol, &raw.cnp) {
            (Some(_), Some(_)) => bail!("netpol and cnp: a scenario has one topology"),
            (Some(netpol), None) => crate::netpol::topology(netpol).context("netpol")?,
            (None, Some(cnp)) => crate::cnp::topology(cnp, nodes).context("cnp")?,
            (None, None) => Vec::new(),
        };
        let dns = raw
            .dns
            .map(|d| crate::dns::parse(d).context("dns"))
            .transpose()?;
        object_values.extend(raw.objects);
        let objects = parse_objects("objects", object_values)?;
        // The pods a matrix covers: those that exist at its step.
        let mut pods: BTreeSet<PodName> =
            objects.iter().filter_map(|o| o.key().pod_name()).collect();
        let mut steps = Vec::with_capacity(raw.steps.len());
        for (i, step) in raw.steps.into_iter().enumerate() {
            let name = step.name.unwrap_or_else(|| format!("step {}", i + 1));
            let at = format!("steps[{i}] ({name:?})");
            let faults = step
                .fault
                .into_iter()
                .enumerate()
                .map(|(j, f)| fault::parse(f).with_context(|| format!("{at}.fault[{j}]")))
                .collect::<Result<Vec<_>>>()?;
            let dump = step
                .dump
                .into_iter()
                .enumerate()
                .map(|(j, d)| dump::parse(d).with_context(|| format!("{at}.dump[{j}]")))
                .collect::<Result<Vec<_>>>()?;
            let apply = parse_objects(&format!("{at}.apply"), step.apply)?;
            let step_dns = step
                .dns
                .map(|d| crate::dns::parse_step(d).with_context(|| format!("{at}.dns")))
                .transpose()?;
            let delete = step
                .delete
                .into_iter()
                .enumerate()
                .map(|(j, r)| parse_ref(r).with_context(|| format!("{at}.delete[{j}]")))
                .collect::<Result<Vec<_>>>()?;
            let mut probes = step
                .probes
                .into_iter()
                .enumerate()
                .map(|(j, p)| parse_probe(p).with_context(|| format!("{at}.probes[{j}]")))
                .collect::<Result<Vec<_>>>()?;
            let labels = step
                .label
                .0
                .into_iter()
                .enumerate()
                .map(|(j, l)| parse_label(l).with_context(|| format!("{at}.label[{j}]")))
                .collect::<Result<Vec<_>>>()?;
            pods.extend(apply.iter().filter_map(|o| o.key().pod_name()));
            for key in &delete {
                if let Some(p) = key.pod_name() {
                    pods.remove(&p);
                }
            }
            let live: Vec<PodName> = pods.iter().cloned().collect();
            for (j, m) in step.reachability.iter().enumerate() {
                let expanded = crate::netpol::expand(m, &live)
                    .with_context(|| format!("{at}.reachability[{j}]"))?;
                for p in expanded {
                    probes.push(
                        ProbeSpec::new(&p.from.to_string(), &p.to.to_string(), p.port, p.protocol)?
                            .expect(p.expect),
                    );
                }
            }
            steps.push(Step {
                name,
                faults,
                dns: step_dns,
                labels,
                apply,
                delete,
                add_error: step.add_error,
                source_error: step.source_error,
                probes,
                dump,
            });
        }
        let scenario = Self {
            mode,
            cni,
            runtime,
            pod_up_deadline,
            node_sysctls,
            conntrack_cleanup_secs,
            flow_logs,
            flow_log_rate,
            nodes,
            dns,
            objects,
            steps,
        };
        scenario.check_references()?;
        Ok(scenario)
    }

    /// Follows the objects through the steps so that a probe from a pod that
    /// does not exist at that step, or a delete of nothing, fails before the
    /// lab starts.
    fn check_references(&self) -> Result<()> {
        let steps = self.steps.iter().map(|s| s.apply.as_slice());
        for o in std::iter::once(self.objects.as_slice())
            .chain(steps)
            .flatten()
        {
            if o.key().kind != Kind::Pod {
                continue;
            }
            if let Some(node) = o.body()["spec"]["nodeName"].as_str() {
                let k = node
                    .strip_prefix("node-")
                    .and_then(|k| k.parse::<u32>().ok());
                if !k.is_some_and(|k| (1..=self.nodes).contains(&k)) {
                    bail!(
                        "{}: spec.nodeName {node:?} is not a node of this scenario (node-1 to node-{})",
                        o.key(),
                        self.nodes
                    );
                }
            }
        }
        for (j, o) in self.objects.iter().enumerate() {
            crate::admission::verdict(o)
                .map_err(|e| anyhow!("objects[{j}]: the controller would refuse it: {e}"))?;
        }
        let mut live: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut liveness = Liveness::default();
        add_all(&mut live, &self.objects).context("objects")?;
        if let Some(dns) = &self.dns {
            if !live.contains(&ObjectKey::pod(&dns.server)) {
                bail!("dns.server: pod {} is not among the objects", dns.server);
            }
        }
        let mut services = ServiceState::default();
        services.add(&self.objects).context("objects")?;
        services.check(self.cni).context("objects")?;
        for (i, step) in self.steps.iter().enumerate() {
            let at = format!("steps[{i}] ({:?})", step.name);
            for (j, f) in step.faults.iter().enumerate() {
                liveness
                    .apply(f)
                    .with_context(|| format!("{at}.fault[{j}] ({f})"))?;
                if let Fault::Unplug(pod) = f {
                    if !live.contains(&ObjectKey::pod(pod)) {
                        bail!("{at}.fault[{j}].unplug: pod {pod} does not exist at this step");
                    }
                }
            }
            for (j, (key, _)) in step.labels.iter().enumerate() {
                if !live.contains(key) {
                    bail!("{at}.label[{j}]: {key} does not exist at this step");
                }
            }
            let new_pods: Vec<ObjectKey> = step
                .apply
                .iter()
                .map(|o| o.key().clone())
                .filter(|k| k.kind == Kind::Pod && !live.contains(k))
                .collect();
            add_all(&mut live, &step.apply).with_context(|| format!("{at}.apply"))?;
            services
                .add(&step.apply)
                .with_context(|| format!("{at}.apply"))?;
            match &step.source_error {
                None => {
                    for (j, o) in step.apply.iter().enumerate() {
                        crate::admission::verdict(o).map_err(|e| {
                            anyhow!("{at}.apply[{j}]: the controller would refuse it: {e}")
                        })?;
                    }
                }
                Some(want) => {
                    let refusals: Vec<String> = step
                        .apply
                        .iter()
                        .filter_map(|o| crate::admission::verdict(o).err())
                        .collect();
                    if !refusals.iter().any(|e| e.contains(want.as_str())) {
                        bail!(
                            "{at}.sourceError: the controller would not refuse this step with {want:?} (its errors: {refusals:?})"
                        );
                    }
                }
            }
            if step.add_error.is_some() {
                if new_pods.is_empty() {
                    bail!("{at}.addError: the step applies no new pod whose CNI ADD could fail");
                }
                // A failed ADD leaves no pod, as after a runtime's cleanup.
                for k in &new_pods {
                    live.remove(k);
                }
            }
            for (j, key) in step.delete.iter().enumerate() {
                if !live.remove(key) {
                    bail!("{at}.delete[{j}]: {key} does not exist at this step");
                }
                if key.kind == Kind::Namespace {
                    live.retain(|k| k.namespace.as_deref() != Some(&key.name));
                }
            }
            services.retain(&live);
            services.check(self.cni).with_context(|| at.clone())?;
            if let (Some(_), None) = (&step.dns, &self.dns) {
                bail!("{at}.dns: records need the scenario's dns (its server)");
            }
            for (j, probe) in step.probes.iter().enumerate() {
                if !live.contains(&ObjectKey::pod(&probe.from)) {
                    bail!(
                        "{at}.probes[{j}].from: pod {} does not exist at this step",
                        probe.from
                    );
                }
                if let Target::Pod(to) = &probe.to {
                    if !live.contains(&ObjectKey::pod(to)) {
                        bail!("{at}.probes[{j}].to: pod {to} does not exist at this step");
                    }
                }
                if let (Target::Name(_), None) = (&probe.to, &self.dns) {
                    bail!("{at}.probes[{j}].to: {} needs the scenario's dns", probe.to);
                }
                if let Target::Service(to) = &probe.to {
                    let svc = services.services.get(&to.key()).ok_or_else(|| {
                        anyhow!("{at}.probes[{j}].to: service {to} does not exist at this step")
                    })?;
                    if svc.headless {
                        bail!("{at}.probes[{j}].to: service {to} is headless (clusterIP: None); probe its pods");
                    }
                    if svc.port(probe.port, probe.protocol).is_none() {
                        bail!(
                            "{at}.probes[{j}].port: service {to} has no {} port {}",
                            probe.protocol,
                            probe.port
                        );
                    }
                }
            }
            for (j, check) in step.dump.iter().enumerate() {
                if !liveness.enforcer_up {
                    bail!("{at}.dump[{j}]: the enforcer is down at this step, there is no dump to check");
                }
                if check == &DumpCheck::BridgeClean && self.cni != CniKind::Bridge {
                    bail!("{at}.dump[{j}]: bridge: clean needs cni: bridge");
                }
                if let Some(pod) = check.pod() {
                    let listed = live.contains(&ObjectKey::pod(pod))
                        || step.apply.iter().any(|o| o.key() == &ObjectKey::pod(pod));
                    if !listed {
                        bail!("{at}.dump[{j}].pod: pod {pod} does not exist at this step");
                    }
                }
            }
        }
        Ok(())
    }
}

/// The Services and EndpointSlices alive at a point of the scenario.
#[derive(Default)]
struct ServiceState {
    services: BTreeMap<ObjectKey, ServiceSpec>,
    slices: BTreeMap<ObjectKey, SliceSpec>,
}

impl ServiceState {
    fn add(&mut self, objects: &[Object]) -> Result<()> {
        for (i, o) in objects.iter().enumerate() {
            match o.key().kind {
                Kind::Service => {
                    let spec = ServiceSpec::parse(o.body()).with_context(|| format!("[{i}]"))?;
                    self.services.insert(o.key().clone(), spec);
                }
                Kind::EndpointSlice => {
                    let spec = SliceSpec::parse(o.body()).with_context(|| format!("[{i}]"))?;
                    self.slices.insert(o.key().clone(), spec);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn retain(&mut self, live: &BTreeSet<ObjectKey>) {
        self.services.retain(|k, _| live.contains(k));
        self.slices.retain(|k, _| live.contains(k));
    }

    fn check(&self, cni: CniKind) -> Result<()> {
        let services: Vec<_> = self.services.iter().collect();
        let slices: Vec<_> = self.slices.iter().collect();
        crate::service::check_realisable(&services, &slices, cni == CniKind::Bridge)
    }
}

/// A sysctl of the node's namespace: only `net.` keys are per namespace.
fn parse_sysctl(key: &str, value: &Value) -> Result<(String, String)> {
    let ok_key = key.starts_with("net.")
        && !key.contains("..")
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if !ok_key {
        bail!("not a sysctl of the node's network namespace (net.*)");
    }
    let value = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => bail!("expected a number or a string, got {other}"),
    };
    Ok((key.to_string(), value))
}

fn add_all(live: &mut BTreeSet<ObjectKey>, objects: &[Object]) -> Result<()> {
    for o in objects {
        live.insert(o.key().clone());
    }
    for (i, o) in objects.iter().enumerate() {
        if let Some(ns) = &o.key().namespace {
            let ns_key = ObjectKey {
                kind: Kind::Namespace,
                namespace: None,
                name: ns.clone(),
            };
            if !live.contains(&ns_key) {
                bail!("[{i}] ({}): namespace {ns} is not declared", o.key());
            }
        }
    }
    Ok(())
}

fn parse_objects(field: &str, values: Vec<Value>) -> Result<Vec<Object>> {
    let mut seen = BTreeSet::new();
    let mut objects = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        let o = Object::from_value(v).with_context(|| format!("{field}[{i}]"))?;
        if !seen.insert(o.key().clone()) {
            bail!("{field}[{i}]: {} appears twice in the list", o.key());
        }
        objects.push(o);
    }
    Ok(objects)
}

fn parse_label(r: RawLabel) -> Result<(ObjectKey, BTreeMap<String, String>)> {
    let key = parse_ref(RawRef {
        kind: r.kind,
        namespace: r.namespace,
        name: r.name,
    })?;
    if !matches!(key.kind, Kind::Pod | Kind::Namespace) {
        bail!(
            "kind: only Pod and Namespace labels can be changed in place, not {}",
            key.kind
        );
    }
    let as_value = Value::Object(
        r.labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    );
    check_labels(&as_value).context("labels")?;
    Ok((key, r.labels))
}

fn parse_ref(r: RawRef) -> Result<ObjectKey> {
    let kind = Kind::parse(&r.kind)
        .ok_or_else(|| anyhow!("kind: {:?} is not supported ({SUPPORTED_KINDS})", r.kind))?;
    check_name("name", &r.name)?;
    let namespace = match (kind.namespaced(), r.namespace) {
        (true, Some(ns)) => {
            check_name("namespace", &ns)?;
            Some(ns)
        }
        (true, None) => Some("default".to_string()),
        (false, None) => None,
        (false, Some(_)) => bail!("namespace: a {kind} has no namespace"),
    };
    Ok(ObjectKey {
        kind,
        namespace,
        name: r.name,
    })
}

fn parse_probe(p: RawProbe) -> Result<ProbeSpec> {
    let from = PodName::parse(&p.from).context("from")?;
    let to = Target::parse(&p.to).context("to")?;
    let port = u16::try_from(p.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| anyhow!("port: {} is not a port (1-65535)", p.port))?;
    let protocol = match p.protocol.as_deref() {
        None => Protocol::Tcp,
        Some("TCP") => Protocol::Tcp,
        Some("UDP") => Protocol::Udp,
        Some("SCTP") => Protocol::Sctp,
        Some(other) => bail!("protocol: expected TCP, UDP or SCTP, got {other:?}"),
    };
    let expect = match p.expect.as_deref() {
        None => None,
        Some("allow") => Some(Verdict::Allow),
        Some("deny") => Some(Verdict::Deny),
        Some(other) => bail!("expect: expected allow or deny, got {other:?}"),
    };
    let timeout = match p.timeout_ms {
        None => DEFAULT_PROBE_TIMEOUT,
        Some(ms) if (1..=60_000).contains(&ms) => Duration::from_millis(ms as u64),
        Some(ms) => bail!("timeoutMs: {ms} is out of range (1-60000)"),
    };
    let forge = match p.forge.as_deref() {
        None => None,
        Some("reply") if protocol == Protocol::Tcp => Some(Forge::Reply),
        Some("reply") => bail!("forge: reply forges TCP segments; the probe must be TCP"),
        Some(other) => bail!("forge: expected reply, got {other:?}"),
    };
    if forge.is_some() && matches!(to, Target::Ip(IpAddr::V6(_))) {
        bail!("forge: reply forges IPv4 packets; the target must be IPv4");
    }
    Ok(ProbeSpec {
        from,
        to,
        port,
        protocol,
        expect,
        timeout,
        forge,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - {kind: Pod, metadata: {name: a, namespace: x, labels: {app: a}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 80}, {containerPort: 53, protocol: UDP}]}]}}
  - {kind: Pod, metadata: {name: b, namespace: x}, spec: {containers: [{name: c, image: none}]}}
steps:
  - name: first
    probes:
      - {from: x/a, to: x/b, port: 80, expect: allow}
      - {from: x/b, to: x/a, port: 53, protocol: UDP, expect: deny, timeoutMs: 300}
  - delete: [{kind: Pod, namespace: x, name: b}]
    probes:
      - {from: x/a, to: 10.0.0.1, port: 80}
"#;

    #[test]
    fn parses_a_good_scenario() {
        let s = Scenario::from_yaml(GOOD).unwrap();
        assert_eq!(s.objects.len(), 3);
        assert_eq!(
            s.objects[1].ports(),
            &[
                ServedPort {
                    port: 80,
                    protocol: Protocol::Tcp
                },
                ServedPort {
                    port: 53,
                    protocol: Protocol::Udp
                }
            ]
        );
        assert_eq!(s.objects[1].body()["apiVersion"], "v1");
        assert_eq!(s.steps[1].name, "step 2");
        assert_eq!(s.steps[0].probes[1].timeout, Duration::from_millis(300));
        assert_eq!(s.steps[0].probes[1].expect, Some(Verdict::Deny));
        assert_eq!(
            s.steps[1].probes[0].to,
            Target::Ip("10.0.0.1".parse().unwrap())
        );
    }

    fn err(text: &str) -> String {
        format!("{:#}", Scenario::from_yaml(text).unwrap_err())
    }

    #[test]
    fn errors_name_the_field() {
        let e = err("objects: [{kind: Deployment, metadata: {name: s}}]");
        assert!(e.contains("objects[0]") && e.contains("Deployment"), "{e}");
        let e = err("objects: [{kind: Namespace, metadata: {name: x}}, {kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{ports: [{containerPort: 70000}]}]}}]");
        assert!(
            e.contains("objects[1]") && e.contains("containerPort: 70000"),
            "{e}"
        );
        let e = err("steps: [{probes: [{from: a, to: x/b, port: 80}]}]");
        assert!(
            e.contains("steps[0]") && e.contains("probes[0]") && e.contains("from"),
            "{e}"
        );
        let e = err("steps: [{probes: [{from: x/a, to: x/b, port: 80, expect: maybe}]}]");
        assert!(e.contains("expect"), "{e}");
        let e = err("stepz: []");
        assert!(e.contains("stepz"), "{e}");
        let e = err(
            "objects: [{kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{name: c, image: i}]}}]",
        );
        assert!(e.contains("namespace x is not declared"), "{e}");
        let e = err("objects: [{kind: Namespace, metadata: {name: x, labels: {n: 1}}}]");
        assert!(e.contains("metadata.labels.n"), "{e}");
    }

    #[test]
    fn references_follow_the_steps() {
        let base = "objects: [{kind: Namespace, metadata: {name: x}}, {kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{name: c, image: i}]}}]\n";
        let e = err(&format!(
            "{base}steps: [{{probes: [{{from: x/a, to: x/z, port: 80}}]}}]"
        ));
        assert!(e.contains("pod x/z does not exist"), "{e}");
        let e = err(&format!(
            "{base}steps: [{{delete: [{{kind: Namespace, name: x}}], probes: [{{from: x/a, to: 10.0.0.1, port: 80}}]}}]"
        ));
        assert!(e.contains("pod x/a does not exist"), "{e}");
        let e = err(&format!(
            "{base}steps: [{{delete: [{{kind: NetworkPolicy, namespace: x, name: p}}]}}]"
        ));
        assert!(e.contains("NetworkPolicy x/p does not exist"), "{e}");
    }

    const SERVICES: &str = r#"
nodeSysctls: {net.netfilter.nf_conntrack_tcp_timeout_time_wait: 1}
conntrackCleanupSecs: 1
objects:
  - {kind: Namespace, metadata: {name: x}}
  - {kind: Pod, metadata: {name: b, namespace: x, labels: {app: b}}, spec: {containers: [{name: c, image: i, ports: [{containerPort: 8080, name: http}]}]}}
  - {kind: Service, metadata: {name: web, namespace: x}, spec: {clusterIP: 10.96.0.10, selector: {app: b}, ports: [{port: 80, targetPort: http}]}}
  - {kind: Service, metadata: {name: ext, namespace: x}, spec: {clusterIP: 10.96.0.11, ports: [{name: dns, port: 53, protocol: UDP}]}}
  - {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: ext-1, namespace: x, labels: {kubernetes.io/service-name: ext}}, addressType: IPv4, endpoints: [{addresses: [10.244.0.2]}], ports: [{name: dns, port: 53, protocol: UDP}]}
steps:
  - probes:
      - {from: x/b, to: svc/x/web, port: 80, expect: allow}
      - {from: x/b, to: svc/x/ext, port: 53, protocol: UDP}
"#;

    #[test]
    fn flow_log_settings_parse_and_are_validated() {
        let s =
            Scenario::from_yaml(&format!("flowLogs: deny\nflowLogRate: 50\n{SERVICES}")).unwrap();
        assert_eq!(
            (s.flow_logs, s.flow_log_rate),
            (Some(FlowLogMode::Deny), Some(50))
        );
        let s = Scenario::from_yaml(SERVICES).unwrap();
        assert_eq!((s.flow_logs, s.flow_log_rate), (None, None));
        let e = err(&format!("flowLogs: denied\n{SERVICES}"));
        assert!(e.contains("flowLogs") && e.contains("\"denied\""), "{e}");
        let e = err(&format!("flowLogRate: -1\n{SERVICES}"));
        assert!(e.contains("flowLogRate"), "{e}");
    }

    #[test]
    fn services_slices_and_node_settings_parse() {
        let s = Scenario::from_yaml(SERVICES).unwrap();
        assert_eq!(
            s.node_sysctls,
            [(
                "net.netfilter.nf_conntrack_tcp_timeout_time_wait".to_string(),
                "1".to_string()
            )]
        );
        assert_eq!(s.conntrack_cleanup_secs, Some(1));
        assert_eq!(s.objects[4].body()["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(
            s.steps[0].probes[0].to,
            Target::Service(ServiceRef {
                namespace: "x".into(),
                name: "web".into()
            })
        );
    }

    #[test]
    fn service_probes_and_settings_are_validated() {
        let e = err(&SERVICES.replace("to: svc/x/web, port: 80", "to: svc/x/nope, port: 80"));
        assert!(
            e.contains("probes[0].to") && e.contains("svc/x/nope does not exist"),
            "{e}"
        );
        let e = err(&SERVICES.replace("to: svc/x/web, port: 80", "to: svc/x/web, port: 8080"));
        assert!(e.contains("has no TCP port 8080"), "{e}");
        // No clusterIP: the lab allocates one, as the API server does, and
        // probes may name the Service.
        let s = Scenario::from_yaml(&SERVICES.replace("clusterIP: 10.96.0.10, ", "")).unwrap();
        assert_eq!(s.steps[0].probes[0].to.to_string(), "svc/x/web");
        let e = err(&SERVICES.replace("10.96.0.11", "10.96.0.10"));
        assert!(e.contains("clusterIP 10.96.0.10 is already"), "{e}");
        let e = err(&format!("cni: bridge\n{SERVICES}"));
        assert!(e.contains("need cni: ptp"), "{e}");
        let e = err(&SERVICES.replace("clusterIP: 10.96.0.10", "clusterIP: None"));
        assert!(e.contains("headless"), "{e}");
        let e = err(&SERVICES.replace(
            "net.netfilter.nf_conntrack_tcp_timeout_time_wait",
            "kernel.pid_max",
        ));
        assert!(e.contains("nodeSysctls.kernel.pid_max"), "{e}");
        let e = err(&SERVICES.replace("conntrackCleanupSecs: 1", "conntrackCleanupSecs: 0"));
        assert!(e.contains("conntrackCleanupSecs"), "{e}");
        let e = err(&SERVICES.replace(
            "labels: {kubernetes.io/service-name: ext}",
            "labels: {kubernetes.io/service-name: web}",
        ));
        assert!(
            e.contains("EndpointSlice x/ext-1") && e.contains("has a selector"),
            "{e}"
        );
        let e = err(&SERVICES.replace("name: ext-1", "name: web-lab"));
        assert!(e.contains("generated EndpointSlice"), "{e}");
        let e = err(&SERVICES.replace("labels: {kubernetes.io/service-name: ext}", "labels: {}"));
        assert!(
            e.contains("objects[4]") && e.contains("kubernetes.io/service-name"),
            "{e}"
        );
        let e = err(&format!("{SERVICES}  - delete: [{{kind: Service, namespace: x, name: web}}]\n    probes: [{{from: x/b, to: svc/x/web, port: 80}}]\n"));
        assert!(
            e.contains("steps[1]") && e.contains("does not exist"),
            "{e}"
        );
    }

    const ADVERSARIAL: &str = r#"
mode: strict
cni: bridge
podUpDeadlineMs: 500
objects:
  - {kind: Namespace, metadata: {name: x}}
  - {kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{name: c, image: i}]}}
  - {kind: Pod, metadata: {name: b, namespace: x}, spec: {containers: [{name: c, image: i}]}}
steps:
  - name: faults
    fault:
      - {kill: enforcer}
      - {kill: controller, restart: false}
      - {corrupt: checkpoint}
      - {start: second-enforcer}
    apply: [{kind: Pod, metadata: {name: d, namespace: x}, spec: {containers: [{name: c, image: i}]}}]
    addError: not realized
    probes:
      - {from: x/a, to: x/b, port: 80, protocol: TCP, forge: reply, expect: deny}
    dump: [{bridge: clean}, {pod: x/a, veth: attached}]
"#;

    #[test]
    fn parses_modes_faults_forgery_and_dump_checks() {
        let s = Scenario::from_yaml(ADVERSARIAL).unwrap();
        assert_eq!(s.mode, Some(Mode::Strict));
        assert_eq!(s.cni, CniKind::Bridge);
        assert_eq!(s.pod_up_deadline, Some(Duration::from_millis(500)));
        assert_eq!(s.steps[0].faults.len(), 4);
        assert_eq!(s.steps[0].add_error.as_deref(), Some("not realized"));
        assert_eq!(s.steps[0].probes[0].forge, Some(Forge::Reply));
        assert_eq!(s.steps[0].dump.len(), 2);
        let plain = Scenario::from_yaml(GOOD).unwrap();
        assert_eq!((plain.mode, plain.cni), (None, CniKind::Ptp));
    }

    #[test]
    fn objects_the_controller_would_refuse_are_errors_unless_expected() {
        let base = "objects: [{kind: Namespace, metadata: {name: x}}]\n";
        let typo = "{kind: NetworkPolicy, metadata: {name: p, namespace: x}, spec: {ingress: [{fromm: []}]}}";
        let good =
            "{kind: NetworkPolicy, metadata: {name: p, namespace: x}, spec: {ingress: [{}]}}";
        let e = err(&format!("{base}steps: [{{apply: [{typo}]}}]"));
        assert!(
            e.contains("steps[0]") && e.contains("apply[0]: the controller would refuse it: NetworkPolicy x/p: spec.ingress[0].fromm: unknown field"),
            "{e}"
        );
        let e = err(&format!("objects: [{typo}]"));
        assert!(
            e.contains("objects[0]: the controller would refuse it"),
            "{e}"
        );
        let s = Scenario::from_yaml(&format!(
            "{base}steps: [{{apply: [{typo}], sourceError: 'spec.ingress[0].fromm: unknown field'}}, {{apply: [{good}]}}]"
        ))
        .unwrap();
        assert_eq!(
            s.steps[0].source_error.as_deref(),
            Some("spec.ingress[0].fromm: unknown field")
        );
        let e = err(&format!(
            "{base}steps: [{{apply: [{good}], sourceError: fromm}}]"
        ));
        assert!(
            e.contains("sourceError: the controller would not refuse this step"),
            "{e}"
        );
        let e = err(&format!(
            "{base}steps: [{{apply: [{typo}], sourceError: 'something else'}}]"
        ));
        assert!(
            e.contains("would not refuse this step with \"something else\""),
            "{e}"
        );
    }

    #[test]
    fn adversarial_keys_are_validated() {
        let base = "objects: [{kind: Namespace, metadata: {name: x}}, {kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{name: c, image: i}]}}]\n";
        let e = err(&format!("mode: paranoid\n{base}"));
        assert!(e.contains("mode") && e.contains("paranoid"), "{e}");
        let e = err(&format!("cni: flannel\n{base}"));
        assert!(e.contains("cni") && e.contains("flannel"), "{e}");
        let e = err(&format!(
            "{base}steps: [{{fault: [{{kill: enforcer, restart: false}}]}}, {{fault: [{{kill: enforcer}}]}}]"
        ));
        assert!(
            e.contains("steps[1]") && e.contains("fault[0]") && e.contains("already down"),
            "{e}"
        );
        let e = err(&format!(
            "{base}steps: [{{fault: [{{kill: enforcer, restart: false}}], dump: [{{pod: x/a, realized: true}}]}}]"
        ));
        assert!(
            e.contains("dump[0]") && e.contains("enforcer is down"),
            "{e}"
        );
        let e = err(&format!("{base}steps: [{{dump: [{{bridge: clean}}]}}]"));
        assert!(e.contains("cni: bridge"), "{e}");
        let e = err(&format!(
            "{base}steps: [{{probes: [{{from: x/a, to: x/a, port: 53, protocol: UDP, forge: reply}}]}}]"
        ));
        assert!(e.contains("forge") && e.contains("TCP"), "{e}");
        let e = err(&format!("{base}steps: [{{addError: x}}]"));
        assert!(e.contains("addError"), "{e}");
        let e = err(&format!("{base}steps: [{{fault: [{{unplug: x/z}}]}}]"));
        assert!(e.contains("unplug") && e.contains("x/z"), "{e}");
        // A pod whose ADD was expected to fail is gone for later steps.
        let e = err(&format!(
            "{base}steps: [{{apply: [{{kind: Pod, metadata: {{name: d, namespace: x}}, spec: {{containers: [{{name: c, image: i}}]}}}}], addError: ''}}, {{probes: [{{from: x/d, to: x/a, port: 80}}]}}]"
        ));
        assert!(
            e.contains("steps[1]") && e.contains("x/d does not exist"),
            "{e}"
        );
    }

    #[test]
    fn a_label_step_may_be_one_mapping_or_a_list() {
        let base = "objects:\n  - {kind: Namespace, metadata: {name: x}}\n  - {kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{name: c, image: i}]}}\nsteps:\n";
        let one = Scenario::from_yaml(&format!(
            "{base}  - label: {{kind: Pod, namespace: x, name: a, labels: {{app: z}}}}\n"
        ))
        .unwrap();
        let list = Scenario::from_yaml(&format!(
            "{base}  - label: [{{kind: Pod, namespace: x, name: a, labels: {{app: z}}}}]\n"
        ))
        .unwrap();
        assert_eq!(one.steps[0].labels, list.steps[0].labels);
        assert_eq!(one.steps[0].labels[0].1["app"], "z");
        let e = err(&format!(
            "{base}  - label: {{kind: Pod, namespace: x, name: a, labelz: {{app: z}}}}\n"
        ));
        assert!(e.contains("unknown field `labelz`"), "{e}");
        let e = err(&format!("{base}  - label: [{{kind: Pod, name: a}}]\n"));
        assert!(e.contains("label[0]") && e.contains("labels"), "{e}");
        let e = err(&format!("{base}  - label: app=z\n"));
        assert!(e.contains("expected a mapping"), "{e}");
        let e = err(&format!(
            "{base}  - label: {{kind: Pod, namespace: x, name: b, labels: {{app: z}}}}\n"
        ));
        assert!(e.contains("label[0]: Pod x/b does not exist"), "{e}");
    }
}
