//! The reference model of NetworkPolicy v1: whether one connection is
//! allowed, read straight off the Kubernetes objects. It is deliberately
//! naive — one connection at a time, no precomputation, no sharing with
//! `resolve` — so that it can serve as the oracle the resolver, the compiler
//! and the datapath are tested against.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cluster::ClusterState;
use crate::resolve::selector_matches;

/// One side of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint<'a> {
    pub pod: &'a Pod,
    pub ip: IpAddr,
}

/// Is a connection from `src` to `dst` on `protocol` ("TCP", "UDP", "SCTP")
/// and `port` allowed? Both the client's egress and the server's ingress
/// must allow it.
pub fn allowed(
    cluster: &ClusterState,
    src: Endpoint<'_>,
    dst: Endpoint<'_>,
    protocol: &str,
    port: u16,
) -> bool {
    direction_allows(cluster, src, dst, dst, protocol, port, Direction::Egress)
        && direction_allows(cluster, dst, src, dst, protocol, port, Direction::Ingress)
}

/// A rule's peers and ports, whichever direction it is for.
type Rule<'a> = (
    Option<&'a Vec<NetworkPolicyPeer>>,
    Option<&'a Vec<NetworkPolicyPort>>,
);

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Ingress,
    Egress,
}

/// Whether `subject`'s policies allow traffic with `peer` in `dir`. `server`
/// is the destination, whose container ports give named ports their meaning.
fn direction_allows(
    cluster: &ClusterState,
    subject: Endpoint<'_>,
    peer: Endpoint<'_>,
    server: Endpoint<'_>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> bool {
    let mut isolated = false;
    for policy in &cluster.policies {
        if !selects(policy, subject.pod, dir) {
            continue;
        }
        isolated = true;
        let spec = policy.spec.as_ref().expect("selects checked spec");
        let ns = namespace(policy.metadata.namespace.as_deref());
        let rules: Vec<Rule<'_>> = match dir {
            Direction::Ingress => spec
                .ingress
                .iter()
                .flatten()
                .map(|r| (r.from.as_ref(), r.ports.as_ref()))
                .collect(),
            Direction::Egress => spec
                .egress
                .iter()
                .flatten()
                .map(|r| (r.to.as_ref(), r.ports.as_ref()))
                .collect(),
        };
        for (peers, ports) in rules {
            if peers_match(cluster, peers, ns, peer)
                && ports_match(ports, server.pod, protocol, port)
            {
                return true;
            }
        }
    }
    !isolated
}

fn namespace(ns: Option<&str>) -> &str {
    ns.unwrap_or("default")
}

fn selects(policy: &NetworkPolicy, pod: &Pod, dir: Direction) -> bool {
    let Some(spec) = policy.spec.as_ref() else {
        return false;
    };
    if namespace(policy.metadata.namespace.as_deref())
        != namespace(pod.metadata.namespace.as_deref())
    {
        return false;
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if !selector_matches(&spec.pod_selector.clone().unwrap_or_default(), &labels).unwrap_or(false) {
        return false;
    }
    let types = spec.policy_types.clone().unwrap_or_default();
    match dir {
        Direction::Ingress => types.is_empty() || types.iter().any(|t| t == "Ingress"),
        Direction::Egress => {
            if types.is_empty() {
                spec.egress.is_some()
            } else {
                types.iter().any(|t| t == "Egress")
            }
        }
    }
}

fn peers_match(
    cluster: &ClusterState,
    peers: Option<&Vec<NetworkPolicyPeer>>,
    policy_ns: &str,
    peer: Endpoint<'_>,
) -> bool {
    let Some(peers) = peers.filter(|p| !p.is_empty()) else {
        return true;
    };
    peers.iter().any(|p| {
        if let Some(block) = &p.ip_block {
            let Ok(cidr) = block.cidr.parse::<IpNet>() else {
                return false;
            };
            return cidr.contains(&peer.ip)
                && !block
                    .except
                    .iter()
                    .flatten()
                    .filter_map(|e| e.parse::<IpNet>().ok())
                    .any(|e| e.contains(&peer.ip));
        }
        let peer_ns = namespace(peer.pod.metadata.namespace.as_deref());
        let ns_ok = match &p.namespace_selector {
            None => peer_ns == policy_ns,
            Some(sel) => {
                selector_matches(sel, &namespace_labels(cluster, peer_ns)).unwrap_or(false)
            }
        };
        let pod_ok = match &p.pod_selector {
            None => true,
            Some(sel) => {
                selector_matches(sel, &peer.pod.metadata.labels.clone().unwrap_or_default())
                    .unwrap_or(false)
            }
        };
        ns_ok && pod_ok && (p.pod_selector.is_some() || p.namespace_selector.is_some())
    })
}

fn namespace_labels(cluster: &ClusterState, ns: &str) -> BTreeMap<String, String> {
    let mut labels = cluster
        .namespaces
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(ns))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    labels
        .entry("kubernetes.io/metadata.name".into())
        .or_insert_with(|| ns.to_string());
    labels
}

fn ports_match(
    ports: Option<&Vec<NetworkPolicyPort>>,
    server: &Pod,
    protocol: &str,
    port: u16,
) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|p| {
        if p.protocol.as_deref().unwrap_or("TCP") != protocol {
            return false;
        }
        match (&p.port, p.end_port) {
            (None, _) => true,
            (Some(IntOrString::Int(n)), None) => i32::from(port) == *n,
            (Some(IntOrString::Int(n)), Some(end)) => (*n..=end).contains(&i32::from(port)),
            (Some(IntOrString::String(name)), _) => server
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .flat_map(|c| c.ports.iter().flatten())
                .any(|cp| {
                    cp.name.as_deref() == Some(name.as_str())
                        && cp.protocol.as_deref().unwrap_or("TCP") == protocol
                        && cp.container_port == i32::from(port)
                }),
        }
    })
}
