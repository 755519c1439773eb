//! ClusterNetworkPolicy as the model reads it: which policies apply to a
//! pod, and whether one rule matches one connection. The tier walk itself
//! (Admin, NetworkPolicy, Baseline, the default) is written out where it
//! is used: [`crate::verdict`] for the oracle, [`crate::explain`] for the
//! answer operators read, so that the two check each other.
//!
//! The rules of the reading:
//! - host-network pods are never subjects, and never pods of a
//!   `namespaces` or `pods` peer (only their address can match: `networks`,
//!   `nodes`);
//! - a rule is taken as [`Rule::effective`] says: an Accept with a part
//!   this version cannot read matches nothing, a Deny or Pass with one
//!   denies everything;
//! - `networks` match any address in them, pods' included; `nodes` the
//!   addresses in the selected Nodes' `status.addresses`;
//! - a named port is the destination pod's container port of that name
//!   (whatever its protocol); a destination that is no pod has none;
//! - a policy annotated `palisade.io/audit: "true"` is staged: judged for
//!   logs, never enforced.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Pod};
use palisade_apis::cluster_network_policy::Effective;
use palisade_apis::{Action, ClusterNetworkPolicy, Peer, Protocol, Rule, Subject, Tier};

use crate::cluster::ClusterState;
use crate::explain::AUDIT_ANNOTATION;
use crate::selector::selector_matches;
use crate::verdict::{namespace, namespace_labels, Direction};

/// What the enforcer does with a direction no tier decided (`--mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Allowed: the Kubernetes default.
    #[default]
    Standard,
    /// Denied (traffic with the pod's own node stays allowed).
    Strict,
}

/// Whether a ClusterNetworkPolicy is staged (annotated `palisade.io/audit:
/// "true"`) rather than enforced, as for NetworkPolicy.
pub fn is_staged(policy: &ClusterNetworkPolicy) -> bool {
    policy
        .annotations
        .get(AUDIT_ANNOTATION)
        .is_some_and(|v| v == "true")
}

pub(crate) fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The addresses of `pod`'s own node: its Node's `status.addresses`, and
/// the pod's `status.hostIP(s)`. Traffic between a pod and these is always
/// allowed (kubelet probes), whatever any policy says.
pub fn own_node_addresses(cluster: &ClusterState, pod: &Pod) -> Vec<IpAddr> {
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let mut ips: Vec<IpAddr> = cluster
        .nodes
        .iter()
        .filter(|n| node_name.is_some() && n.metadata.name.as_deref() == node_name)
        .flat_map(node_addresses)
        .collect();
    if let Some(status) = pod.status.as_ref() {
        ips.extend(
            status
                .host_ip
                .iter()
                .chain(status.host_ips.iter().flatten().map(|h| &h.ip))
                .filter_map(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    ips.sort();
    ips.dedup();
    ips
}

/// A Node's addresses (host names left out).
pub(crate) fn node_addresses(node: &Node) -> Vec<IpAddr> {
    node.status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// Whether `policy`'s subject selects `pod`.
pub fn selects(cluster: &ClusterState, policy: &ClusterNetworkPolicy, pod: &Pod) -> bool {
    if host_network(pod) {
        return false;
    }
    let ns_labels = namespace_labels(cluster, namespace(pod.metadata.namespace.as_deref()));
    let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
    match &policy.subject {
        Subject::Namespaces(ns) => selector_matches(ns, &ns_labels).unwrap_or(false),
        Subject::Pods(p) => {
            selector_matches(&p.namespaces, &ns_labels).unwrap_or(false)
                && selector_matches(&p.pods, &pod_labels).unwrap_or(false)
        }
        Subject::Unknown => false,
    }
}

/// The policies of `tier` that apply to `subject`, in precedence order
/// (staged ones only when `with_staged`).
pub(crate) fn applying<'a>(
    cluster: &'a ClusterState,
    tier: Tier,
    subject: &Pod,
    with_staged: bool,
) -> Vec<&'a ClusterNetworkPolicy> {
    let mut out: Vec<&ClusterNetworkPolicy> = cluster
        .cluster_policies
        .iter()
        .filter(|p| {
            p.tier == tier && (with_staged || !is_staged(p)) && selects(cluster, p, subject)
        })
        .collect();
    out.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    out
}

/// The rules of one direction.
pub(crate) fn rules(policy: &ClusterNetworkPolicy, dir: Direction) -> &[Rule] {
    match dir {
        Direction::Ingress => &policy.ingress,
        Direction::Egress => &policy.egress,
    }
}

/// The other side of a connection as a rule sees it: its address, and the
/// pod it is, if the cluster knows one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Other<'a> {
    pub pod: Option<&'a Pod>,
    pub ip: IpAddr,
}

/// What a rule does to a connection, if it matches: its action, or Deny
/// for a Deny/Pass rule that fails closed.
pub(crate) fn rule_matches(
    cluster: &ClusterState,
    rule: &Rule,
    other: Other<'_>,
    server: Option<&Pod>,
    protocol: &str,
    port: u16,
) -> Option<Action> {
    match rule.effective() {
        Effective::Nothing => None,
        Effective::DenyAll => Some(Action::Deny),
        Effective::AsWritten(rule) => {
            let peer_ok = rule.peers.iter().any(|p| peer_matches(cluster, p, other));
            (peer_ok && ports_match(rule, server, protocol, port)).then_some(rule.action)
        }
    }
}

/// The names of an Accept rule by domain name whose protocols take in
/// `protocol`/`port`: the connection is allowed by it when the subject
/// resolved one of them to the peer's address (which only the node's
/// learner knows). None for any other rule.
pub(crate) fn accepting_names(
    rule: &Rule,
    server: Option<&Pod>,
    protocol: &str,
    port: u16,
) -> Option<Vec<String>> {
    let Effective::AsWritten(rule) = rule.effective() else {
        return None;
    };
    let names: Vec<String> = rule
        .peers
        .iter()
        .filter_map(|p| match p {
            Peer::DomainNames(n) => Some(n.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect();
    (rule.action == Action::Accept
        && !names.is_empty()
        && ports_match(rule, server, protocol, port))
    .then_some(names)
}

fn peer_matches(cluster: &ClusterState, peer: &Peer, other: Other<'_>) -> bool {
    match peer {
        Peer::Namespaces(_) | Peer::Pods(_) => other
            .pod
            .is_some_and(|pod| selector_peer_selects(cluster, peer, pod)),
        Peer::Networks(nets) => nets.iter().any(|n| n.contains(&other.ip)),
        Peer::Nodes(sel) => cluster.nodes.iter().any(|node| {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            selector_matches(sel, &labels).unwrap_or(false)
                && node_addresses(node).contains(&other.ip)
        }),
        // `effective` made such a rule Nothing or DenyAll.
        Peer::DomainNames(_) | Peer::Unknown => false,
    }
}

/// Whether a `namespaces` or `pods` peer selects `pod` (never a
/// host-network pod).
pub(crate) fn selector_peer_selects(cluster: &ClusterState, peer: &Peer, pod: &Pod) -> bool {
    if host_network(pod) {
        return false;
    }
    let ns_labels = namespace_labels(cluster, namespace(pod.metadata.namespace.as_deref()));
    match peer {
        Peer::Namespaces(ns) => selector_matches(ns, &ns_labels).unwrap_or(false),
        Peer::Pods(p) => {
            selector_matches(&p.namespaces, &ns_labels).unwrap_or(false)
                && selector_matches(&p.pods, &pod.metadata.labels.clone().unwrap_or_default())
                    .unwrap_or(false)
        }
        _ => false,
    }
}

/// Whether the rule's protocols take in `protocol`/`port` at `server` (None:
/// the destination is no pod, so named ports never match).
pub(crate) fn ports_match(rule: &Rule, server: Option<&Pod>, protocol: &str, port: u16) -> bool {
    let Some(ports) = &rule.ports else {
        return true;
    };
    let Some(protocol) = Protocol::parse(protocol) else {
        return false;
    };
    let named = server.filter(|s| !host_network(s)).map(named_ports);
    ports
        .iter()
        .any(|p| p.matches(protocol, port, named.as_ref()))
}

/// A pod's named container ports: name -> (protocol, port).
pub(crate) fn named_ports(pod: &Pod) -> BTreeMap<String, (Protocol, u16)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|cp| {
            let name = cp.name.clone()?;
            let protocol = Protocol::parse(cp.protocol.as_deref().unwrap_or("TCP"))?;
            let port = u16::try_from(cp.container_port).ok()?;
            Some((name, (protocol, port)))
        })
        .collect()
}

/// Whether the rule's address peers (`networks`, `nodes`) hold `ip`.
pub(crate) fn address_peers_hold(cluster: &ClusterState, rule: &Rule, ip: IpAddr) -> bool {
    rule.peers.iter().any(|p| {
        matches!(p, Peer::Networks(_) | Peer::Nodes(_))
            && peer_matches(cluster, p, Other { pod: None, ip })
    })
}
