//! Objects as resolution reads them: a pod's namespace, labels, node,
//! addresses and named ports; a namespace's labels.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use palisade_proto::v1::Protocol;

use crate::keys::PodKey;

/// The label Kubernetes puts on every namespace; manifests often omit it.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A pod as resolution needs it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub node: Option<String>,
    pub host_network: bool,
    pub ips: Vec<IpAddr>,
    /// Named container ports: name -> (protocol, number).
    pub named_ports: BTreeMap<String, Vec<(Protocol, u16)>>,
}

impl PodInfo {
    pub fn key(&self) -> PodKey {
        (self.namespace.clone(), self.name.clone())
    }
}

pub(crate) fn default_ns_labels(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(NAMESPACE_NAME_LABEL.into(), ns.to_string())])
}

pub(crate) fn ns_labels(ns: &Namespace) -> BTreeMap<String, String> {
    let mut labels = ns.metadata.labels.clone().unwrap_or_default();
    labels
        .entry(NAMESPACE_NAME_LABEL.into())
        .or_insert_with(|| ns.metadata.name.clone().unwrap_or_default());
    labels
}

pub(crate) fn namespace_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    meta.namespace.clone().unwrap_or_else(|| "default".into())
}

/// None for a pod that holds no address worth trusting (finished).
pub(crate) fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    ) {
        // Finished pods hold no address that should still be trusted.
        return None;
    }
    let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
    if let Some(status) = status {
        for ip in status.pod_ips.iter().flatten() {
            if let Ok(ip) = ip.ip.parse() {
                ips.insert(ip);
            }
        }
        if let Some(Ok(ip)) = status.pod_ip.as_deref().map(str::parse) {
            ips.insert(ip);
        }
    }
    let mut named_ports: BTreeMap<String, Vec<(Protocol, u16)>> = BTreeMap::new();
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            let (Some(name), Ok(number)) = (p.name.as_ref(), u16::try_from(p.container_port))
            else {
                continue;
            };
            if let Ok(proto) = parse_protocol(p.protocol.as_deref()) {
                named_ports
                    .entry(name.clone())
                    .or_default()
                    .push((proto, number));
            }
        }
    }
    Some(PodInfo {
        namespace: namespace_of(&pod.metadata),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        node: spec.node_name.clone().filter(|n| !n.is_empty()),
        host_network: spec.host_network.unwrap_or(false),
        ips: ips.into_iter().collect(),
        named_ports,
    })
}

/// A port's protocol that is none of TCP, UDP and SCTP.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?} (want TCP, UDP or SCTP)")]
pub struct UnknownProtocol(pub String);

/// A port's protocol; TCP when absent, as the API server defaults it.
pub(crate) fn parse_protocol(p: Option<&str>) -> Result<Protocol, UnknownProtocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(UnknownProtocol(other.to_string())),
    }
}
