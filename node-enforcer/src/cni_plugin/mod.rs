//! `palisade-cni`, a CNI (spec 1.0.0, also 0.4.0) chained plugin.
//!
//! It runs after an interface plugin such as ptp, reads the host-side veth(s)
//! and pod IPs from `prevResult`, and asks the node-enforcer (over its unix
//! socket) to enforce the pod's policy before the runtime starts the pod. ADD
//! returns only once the enforcer says the policy is in the datapath, so a pod
//! never runs unprotected.
//!
//! Network config (stdin):
//! ```json
//! {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "palisade-cni",
//!  "enforcerSocket": "/run/palisade/cni.sock", "timeoutSeconds": 10,
//!  "prevResult": {...}}
//! ```
//!
//! Everything except [`client`] is pure so it can be tested without a runtime.

pub mod client;
pub mod config;
pub mod error;
pub mod host_veth;
pub mod install;
pub mod seccomp_install;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::Read;

use ipnet::IpNet;
use palisade_proto::v1::{
    IpPrefix, PodCheckRequest, PodCheckResponse, PodDownRequest, PodRef, PodUpRequest,
};

pub use client::EnforcerClient;
pub use config::{
    Command, Invocation, NetConf, PodName, PodNetwork, DEFAULT_ENFORCER_SOCKET,
    DEFAULT_TIMEOUT_SECONDS, SUPPORTED_VERSIONS,
};
pub use error::{code, CniError};

/// The network config is a few KiB; anything near this is not one.
const MAX_STDIN_BYTES: u64 = 4 << 20;

/// What the plugin prints on success.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    pub stdout: String,
}

/// The whole plugin: the process environment and stdin in, stdout or a CNI
/// error out. `main` only prints and picks the exit code.
pub fn run(env: &HashMap<String, String>, stdin: impl Read) -> Result<Output, CniError> {
    run_with(env, stdin, &host_veth::Kernel)
}

/// [`run`] with the way the pod's host interface is found given.
pub fn run_with(
    env: &HashMap<String, String>,
    stdin: impl Read,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    let command = Command::from_env(env)?;
    if command == Command::Version {
        // VERSION may be invoked with no config at all; don't wait on stdin.
        return Ok(Output {
            stdout: version_json(),
        });
    }
    let input = read_input(stdin)?;
    let version = config::sniff_version(&input);
    execute(command, env, &input, host).map_err(|mut e| {
        if e.cni_version.is_none() {
            e.cni_version = version;
        }
        e
    })
}

pub fn version_json() -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string()
}

fn read_input(stdin: impl Read) -> Result<String, CniError> {
    let mut bytes = Vec::new();
    stdin
        .take(MAX_STDIN_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            CniError::decode("failed to read the network configuration from stdin")
                .with_details(e.to_string())
        })?;
    if bytes.len() as u64 > MAX_STDIN_BYTES {
        return Err(CniError::decode(format!(
            "network configuration on stdin is larger than {MAX_STDIN_BYTES} bytes"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        CniError::decode("network configuration on stdin is not UTF-8").with_details(e.to_string())
    })
}

fn execute(
    command: Command,
    env: &HashMap<String, String>,
    input: &str,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    match command {
        Command::Add => add(env, input, host),
        Command::Del => del(env, input),
        Command::Check => check(env, input),
        // The enforcer reconciles its own state and reports readiness through
        // its health service, so there is nothing for these to do.
        Command::Status | Command::Gc | Command::Version => Ok(Output::default()),
    }
}

fn client_for(conf: &NetConf) -> EnforcerClient {
    EnforcerClient::new(&conf.enforcer_socket, conf.timeout)
}

fn add(
    env: &HashMap<String, String>,
    input: &str,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    let conf = config::parse_net_conf(input)?;
    let invocation = Invocation::from_env(Command::Add, env)?;
    let prev_result = conf.prev_result.as_deref().ok_or_else(|| {
        CniError::invalid_config(
            "prevResult is required for ADD: palisade-cni must be chained after an \
             interface plugin such as ptp",
        )
    })?;
    let mut network = config::pod_network(prev_result)?;
    // The kernel, not prevResult, says which host interface is the pod's.
    let veth = host
        .host_interface(&invocation.netns, &invocation.ifname)
        .map_err(|e| {
            CniError::new(
                code::INTERNAL,
                format!(
                    "cannot find the host side of {} in {}",
                    invocation.ifname, invocation.netns
                ),
            )
            .with_details(e)
        })?;
    network.host_interfaces = vec![veth];
    client_for(&conf).pod_up(pod_up_request(&invocation, &network)?)?;
    Ok(Output {
        stdout: prev_result.get().to_string(),
    })
}

fn del(env: &HashMap<String, String>, input: &str) -> Result<Output, CniError> {
    let conf = config::parse_net_conf(input)?;
    let invocation = Invocation::from_env(Command::Del, env)?;
    match client_for(&conf).pod_down(pod_down_request(&invocation)) {
        Ok(_) => Ok(Output::default()),
        // Nothing this DEL can do while the enforcer is down, and failing it
        // would block the sandbox's teardown: the next enforcer forgets pods
        // whose interfaces are gone.
        Err(e) if e.code == code::TRY_AGAIN_LATER => {
            eprintln!(
                "palisade-cni: DEL: {}; the enforcer cleans up when it returns",
                e.msg
            );
            Ok(Output::default())
        }
        Err(e) => Err(e),
    }
}

fn check(env: &HashMap<String, String>, input: &str) -> Result<Output, CniError> {
    let conf = config::parse_net_conf(input)?;
    let invocation = Invocation::from_env(Command::Check, env)?;
    let prev_result = conf.prev_result.as_deref().ok_or_else(|| {
        CniError::invalid_config(
            "prevResult is required for CHECK: palisade-cni must be chained after an \
             interface plugin such as ptp",
        )
    })?;
    let network = config::pod_network(prev_result)?;
    let response = client_for(&conf).pod_check(pod_check_request(&invocation)?)?;
    verify_check(&invocation, &network, &response)?;
    Ok(Output::default())
}

fn pod_ref(pod: &PodName) -> PodRef {
    PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    }
}

fn required_pod(invocation: &Invocation) -> Result<PodRef, CniError> {
    invocation
        .pod
        .as_ref()
        .map(pod_ref)
        .ok_or_else(|| CniError::invalid_env("CNI_ARGS has no K8S_POD_NAMESPACE/K8S_POD_NAME"))
}

pub fn ip_prefix(net: &IpNet) -> IpPrefix {
    let addr = match net.addr() {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    IpPrefix {
        addr,
        prefix_len: u32::from(net.prefix_len()),
    }
}

pub fn pod_up_request(
    invocation: &Invocation,
    network: &PodNetwork,
) -> Result<PodUpRequest, CniError> {
    Ok(PodUpRequest {
        pod: Some(required_pod(invocation)?),
        container_id: invocation.container_id.clone(),
        netns: invocation.netns.clone(),
        host_interfaces: network.host_interfaces.clone(),
        pod_ips: network.pod_ips.iter().map(ip_prefix).collect(),
    })
}

/// `pod` is omitted when the runtime gave no Kubernetes names; the enforcer
/// then has only the container id to go on.
pub fn pod_down_request(invocation: &Invocation) -> PodDownRequest {
    PodDownRequest {
        pod: invocation.pod.as_ref().map(pod_ref),
        container_id: invocation.container_id.clone(),
    }
}

pub fn pod_check_request(invocation: &Invocation) -> Result<PodCheckRequest, CniError> {
    Ok(PodCheckRequest {
        pod: Some(required_pod(invocation)?),
        container_id: invocation.container_id.clone(),
    })
}

/// The enforcer answering PodCheck is not enough: its view must match what
/// the runtime believes the pod has, or policy is on the wrong veth.
pub fn verify_check(
    invocation: &Invocation,
    network: &PodNetwork,
    response: &PodCheckResponse,
) -> Result<(), CniError> {
    let Some(state) = response.state.as_ref() else {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            "the enforcer returned no state for the pod",
        ));
    };
    if !state.error.is_empty() {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            format!("the pod's policy is not enforced: {}", state.error),
        ));
    }
    if !state.container_id.is_empty() && state.container_id != invocation.container_id {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            "the enforcer knows the pod under a different container",
        )
        .with_details(format!(
            "enforcer: {:?}, runtime: {:?}",
            state.container_id, invocation.container_id
        )));
    }
    if !config::same_interfaces(&state.host_interfaces, &network.host_interfaces) {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            "the enforcer's host interfaces for the pod differ from prevResult",
        )
        .with_details(format!(
            "enforcer: {:?}, prevResult: {:?}",
            state.host_interfaces, network.host_interfaces
        )));
    }
    Ok(())
}
