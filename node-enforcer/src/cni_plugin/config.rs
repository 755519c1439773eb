//! Pure input handling: the CNI_* environment, the network config on stdin,
//! and what palisade-cni needs from the previous plugin's result.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::error::{code, CniError};

/// 0.3.x results have the shape 0.4.0's do (`version` in each ip, which
/// palisade-cni does not read); many primary CNIs (flannel, Calico,
/// kindnet) still ship 0.3.1 conflists.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];
/// CHECK was added in spec 0.4.0; a config of an older version must fail it.
const CHECK_SINCE: &[&str] = &["0.4.0", "1.0.0"];
pub const DEFAULT_ENFORCER_SOCKET: &str = "/run/palisade/cni.sock";
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 10;
/// Beyond this the runtime's own pod-sandbox deadline has long passed, so a
/// larger value is a typo rather than a wish.
pub const MAX_TIMEOUT_SECONDS: u64 = 600;
/// Linux IFNAMSIZ minus the terminating NUL.
const MAX_IFNAME_LEN: usize = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    /// The spelling CNI_COMMAND uses, so messages quote what the runtime sent.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Status => "STATUS",
            Self::Gc => "GC",
        }
    }

    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, CniError> {
        let raw = env
            .get("CNI_COMMAND")
            .map(String::as_str)
            .unwrap_or_default();
        match raw {
            "ADD" => Ok(Self::Add),
            "DEL" => Ok(Self::Del),
            "CHECK" => Ok(Self::Check),
            "VERSION" => Ok(Self::Version),
            "STATUS" => Ok(Self::Status),
            "GC" => Ok(Self::Gc),
            "" => Err(CniError::invalid_env(
                "CNI_COMMAND is not set: palisade-cni must be run by a CNI runtime",
            )),
            other => Err(
                CniError::invalid_env(format!("unknown command CNI_COMMAND={other:?}"))
                    .with_details("supported commands: ADD, DEL, CHECK, VERSION, STATUS, GC"),
            ),
        }
    }
}

/// The pod as Kubernetes names it, from CNI_ARGS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

/// Everything the runtime passed through the environment that we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// Always set for ADD and CHECK; DEL tolerates its absence so a runtime
    /// cleaning up a sandbox it never fully created is not blocked.
    pub pod: Option<PodName>,
}

/// Splits CNI_ARGS (`K=V;K=V`). Empty segments are tolerated because some
/// runtimes leave a trailing `;`.
pub fn parse_cni_args(raw: &str) -> Result<HashMap<String, String>, CniError> {
    let mut out = HashMap::new();
    for segment in raw.split(';') {
        if segment.is_empty() {
            continue;
        }
        let Some((key, value)) = segment.split_once('=') else {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS entry {segment:?} is not KEY=VALUE"
            ))
            .with_details(format!("CNI_ARGS={raw:?}")));
        };
        if key.is_empty() {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS entry {segment:?} has an empty key"
            ))
            .with_details(format!("CNI_ARGS={raw:?}")));
        }
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

fn non_empty(env: &HashMap<String, String>, key: &str) -> Option<String> {
    env.get(key).filter(|v| !v.is_empty()).cloned()
}

fn required(
    env: &HashMap<String, String>,
    key: &str,
    command: Command,
) -> Result<String, CniError> {
    non_empty(env, key).ok_or_else(|| {
        CniError::invalid_env(format!(
            "{key} is required for {} but is not set",
            command.as_str()
        ))
    })
}

impl Invocation {
    pub fn from_env(command: Command, env: &HashMap<String, String>) -> Result<Self, CniError> {
        let strict = matches!(command, Command::Add | Command::Check);
        let container_id = required(env, "CNI_CONTAINERID", command)?;
        let (netns, ifname) = if strict {
            (
                required(env, "CNI_NETNS", command)?,
                required(env, "CNI_IFNAME", command)?,
            )
        } else {
            (
                non_empty(env, "CNI_NETNS").unwrap_or_default(),
                non_empty(env, "CNI_IFNAME").unwrap_or_default(),
            )
        };

        let args = parse_cni_args(env.get("CNI_ARGS").map(String::as_str).unwrap_or_default());
        let pod = match args {
            Ok(args) => {
                let namespace = args.get("K8S_POD_NAMESPACE").filter(|v| !v.is_empty());
                let name = args.get("K8S_POD_NAME").filter(|v| !v.is_empty());
                match (namespace, name) {
                    (Some(namespace), Some(name)) => Some(PodName {
                        namespace: namespace.clone(),
                        name: name.clone(),
                    }),
                    _ if strict => {
                        let missing = if namespace.is_none() {
                            "K8S_POD_NAMESPACE"
                        } else {
                            "K8S_POD_NAME"
                        };
                        return Err(CniError::invalid_env(format!(
                            "CNI_ARGS has no {missing}: palisade-cni enforces Kubernetes \
                             policy and needs the pod's namespace and name"
                        ))
                        .with_details(format!(
                            "CNI_ARGS={:?}",
                            env.get("CNI_ARGS").map(String::as_str).unwrap_or_default()
                        )));
                    }
                    _ => None,
                }
            }
            Err(e) if strict => return Err(e),
            // DEL must still reach the enforcer; the container id identifies it.
            Err(_) => None,
        };

        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            pod,
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawNetConf {
    cni_version: Option<String>,
    enforcer_socket: Option<String>,
    timeout_seconds: Option<u64>,
    // Kept raw so ADD can hand it back exactly as received.
    prev_result: Option<Box<RawValue>>,
}

/// The validated network config.
#[derive(Debug)]
pub struct NetConf {
    pub cni_version: String,
    pub enforcer_socket: PathBuf,
    pub timeout: Duration,
    pub prev_result: Option<Box<RawValue>>,
}

/// The config's cniVersion if it is one we support, for labelling errors
/// raised before (or while) the full config is validated.
pub fn sniff_version(input: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(input).ok()?;
    let version = value.get("cniVersion")?.as_str()?;
    SUPPORTED_VERSIONS
        .contains(&version)
        .then(|| version.to_string())
}

pub fn parse_net_conf(input: &str) -> Result<NetConf, CniError> {
    if input.trim().is_empty() {
        return Err(CniError::decode(
            "no network configuration on stdin: expected the CNI network config JSON",
        ));
    }
    let raw: RawNetConf = serde_json::from_str(input).map_err(|e| {
        CniError::decode("failed to decode the network configuration on stdin")
            .with_details(e.to_string())
    })?;

    let cni_version = raw
        .cni_version
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CniError::invalid_config("network configuration has no cniVersion"))?;
    check_version(&cni_version)?;
    let enforcer_socket = enforcer_socket(raw.enforcer_socket)?;
    let timeout = timeout(raw.timeout_seconds)?;

    Ok(NetConf {
        cni_version,
        enforcer_socket,
        timeout,
        prev_result: raw.prev_result,
    })
}

/// The rule for `cniVersion`, shared with `install`, which must not chain
/// palisade-cni into a list the plugin would then refuse on every call.
pub fn check_version(cni_version: &str) -> Result<(), CniError> {
    if SUPPORTED_VERSIONS.contains(&cni_version) {
        return Ok(());
    }
    Err(CniError::new(
        code::INCOMPATIBLE_VERSION,
        format!("cniVersion {cni_version:?} is not supported by palisade-cni"),
    )
    .with_details(format!(
        "supported versions: {}",
        SUPPORTED_VERSIONS.join(", ")
    )))
}

/// The spec's rule (as libcni's skel applies it): CHECK under a config older
/// than 0.4.0 is an incompatible version, whatever else the config says.
pub fn check_allows_check(cni_version: &str) -> Result<(), CniError> {
    if CHECK_SINCE.contains(&cni_version) {
        return Ok(());
    }
    Err(CniError::new(
        code::INCOMPATIBLE_VERSION,
        format!("cniVersion {cni_version:?} does not allow CHECK"),
    )
    .with_details(format!(
        "CHECK exists from cniVersion 0.4.0; supported for CHECK: {}",
        CHECK_SINCE.join(", ")
    )))
}

/// The rule for `enforcerSocket` (absent: the default), shared with `install`.
pub fn enforcer_socket(raw: Option<String>) -> Result<PathBuf, CniError> {
    match raw {
        None => Ok(PathBuf::from(DEFAULT_ENFORCER_SOCKET)),
        Some(path) if path.starts_with('/') => Ok(PathBuf::from(path)),
        Some(path) => Err(CniError::invalid_config(format!(
            "enforcerSocket {path:?} must be an absolute path"
        ))),
    }
}

/// The rule for `timeoutSeconds` (absent: the default), shared with `install`.
pub fn timeout(raw: Option<u64>) -> Result<Duration, CniError> {
    let timeout_seconds = raw.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if timeout_seconds == 0 || timeout_seconds > MAX_TIMEOUT_SECONDS {
        return Err(CniError::invalid_config(format!(
            "timeoutSeconds {timeout_seconds} is out of range 1..={MAX_TIMEOUT_SECONDS}"
        )));
    }
    Ok(Duration::from_secs(timeout_seconds))
}

/// Where a DEL whose config [`parse_net_conf`] refused sends its PodDown:
/// each option the config gives that passes its own rule, else the default.
/// Nothing here fails, so no config can block a sandbox's teardown.
pub fn del_target(input: &str) -> (PathBuf, Duration) {
    let value: Option<serde_json::Value> = serde_json::from_str(input).ok();
    let field = |key: &str| value.as_ref().and_then(|v| v.get(key));
    let socket = field("enforcerSocket")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    let socket = enforcer_socket(socket).unwrap_or_else(|_| PathBuf::from(DEFAULT_ENFORCER_SOCKET));
    let timeout = timeout(field("timeoutSeconds").and_then(serde_json::Value::as_u64))
        .unwrap_or(Duration::from_secs(DEFAULT_TIMEOUT_SECONDS));
    (socket, timeout)
}

#[derive(Deserialize)]
struct PrevResult {
    interfaces: Option<Vec<ResultInterface>>,
    ips: Option<Vec<ResultIp>>,
}

#[derive(Deserialize)]
struct ResultInterface {
    name: Option<String>,
    sandbox: Option<String>,
}

#[derive(Deserialize)]
struct ResultIp {
    address: Option<String>,
    interface: Option<usize>,
}

/// What the previous plugin set up, as the enforcer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetwork {
    /// Host-side interfaces (no `sandbox`), in prevResult order.
    pub host_interfaces: Vec<String>,
    /// The pod's own addresses, host-length prefixes.
    pub pod_ips: Vec<IpNet>,
}

/// A result interface without a sandbox lives in the host namespace: that is
/// the veth end palisade attaches its programs to.
pub fn pod_network(prev_result: &RawValue) -> Result<PodNetwork, CniError> {
    let prev: PrevResult = serde_json::from_str(prev_result.get())
        .map_err(|e| CniError::decode("failed to decode prevResult").with_details(e.to_string()))?;
    let interfaces = prev.interfaces.unwrap_or_default();
    let ips = prev.ips.unwrap_or_default();

    let mut host_interfaces = Vec::new();
    let mut is_host = Vec::with_capacity(interfaces.len());
    for (index, iface) in interfaces.iter().enumerate() {
        let host = iface.sandbox.as_deref().unwrap_or_default().is_empty();
        is_host.push(host);
        if !host {
            continue;
        }
        let name = iface.name.as_deref().unwrap_or_default();
        validate_ifname(name).map_err(|why| {
            CniError::invalid_config(format!(
                "prevResult interfaces[{index}] has an invalid name {name:?}: {why}"
            ))
        })?;
        if !host_interfaces.iter().any(|n| n == name) {
            host_interfaces.push(name.to_string());
        }
    }
    if host_interfaces.is_empty() {
        return Err(CniError::invalid_config(
            "prevResult has no host-side interface (an interface without \"sandbox\"): \
             palisade-cni must be chained after a plugin that creates a host veth, such as ptp",
        )
        .with_details(format!("interfaces in prevResult: {}", interfaces.len())));
    }

    let mut pod_ips = Vec::new();
    for (index, ip) in ips.iter().enumerate() {
        // An address bound to a host-side interface (e.g. a gateway) is not
        // the pod's, and attributing it to the pod would misdirect policy.
        match ip.interface {
            Some(i) if i >= interfaces.len() => {
                return Err(CniError::invalid_config(format!(
                    "prevResult ips[{index}] refers to interface {i}, but there are only {}",
                    interfaces.len()
                )))
            }
            Some(i) if is_host[i] => continue,
            _ => {}
        }
        let address = ip.address.as_deref().unwrap_or_default();
        let net: IpNet = address.parse().map_err(|e| {
            CniError::invalid_config(format!(
                "prevResult ips[{index}].address {address:?} is not an address in CIDR form"
            ))
            .with_details(format!("{e}"))
        })?;
        validate_pod_ip(net.addr()).map_err(|why| {
            CniError::invalid_config(format!(
                "prevResult ips[{index}].address {address:?} cannot be a pod address: {why}"
            ))
        })?;
        // The pod owns its address, not the subnet it was allocated from.
        let host = IpNet::from(net.addr());
        if !pod_ips.contains(&host) {
            pod_ips.push(host);
        }
    }
    if pod_ips.is_empty() {
        return Err(CniError::invalid_config(
            "prevResult has no pod IP address: policy cannot be enforced for a pod without one",
        ));
    }

    Ok(PodNetwork {
        host_interfaces,
        pod_ips,
    })
}

fn validate_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err("longer than 15 bytes");
    }
    if name == "."
        || name == ".."
        || name.contains(['/', ':'])
        || name.contains(char::is_whitespace)
    {
        return Err("not a valid Linux interface name");
    }
    Ok(())
}

fn validate_pod_ip(addr: IpAddr) -> Result<(), &'static str> {
    if addr.is_unspecified() {
        return Err("unspecified address");
    }
    if addr.is_multicast() {
        return Err("multicast address");
    }
    if addr.is_loopback() {
        return Err("loopback address");
    }
    if let IpAddr::V4(v4) = addr {
        if v4.is_broadcast() {
            return Err("broadcast address");
        }
    }
    Ok(())
}

/// Host interfaces as sets, so CHECK tolerates the enforcer reporting them in
/// a different order.
pub fn same_interfaces(a: &[String], b: &[String]) -> bool {
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}
