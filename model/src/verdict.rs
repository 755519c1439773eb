//! The reference model of NetworkPolicy v1 and ClusterNetworkPolicy:
//! whether one connection is allowed, read straight off the Kubernetes
//! objects. It is deliberately naive — one connection at a time, no
//! precomputation, no sharing with `resolve` — so that it can serve as the
//! oracle the resolver, the compiler and the datapath are tested against.
//!
//! Each direction is judged for the pod whose hook it is (the client's
//! egress, the server's ingress), top to bottom:
//!
//! 1. a host-network pod has no hook of its own: allowed;
//! 2. traffic between the pod and its own node: allowed (kubelet probes);
//! 3. the Admin tier: the ClusterNetworkPolicies of tier Admin that select
//!    the pod, in precedence order, their rules in order: the first rule
//!    that matches decides (Accept, Deny), or with Pass skips the rest of
//!    the tier;
//! 4. NetworkPolicy: if one (not staged) isolates the pod in this
//!    direction, it decides: allowed iff one of their rules allows;
//! 5. the Baseline tier, as the Admin tier (Pass goes on to the default);
//! 6. the default: allowed, or denied in strict mode.
//!
//! Connections to a Service's ClusterIP are judged by
//! [`egress_to_service_allowed`]: the client's egress hook sees the
//! ClusterIP, the server's ingress hook the backend (where [`allowed`]
//! applies as for any pod-to-pod connection).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use palisade_apis::{Action, Tier};

use crate::cluster::ClusterState;
use crate::selector::selector_matches;
use crate::tiers::{self, Mode, Other};

/// One side of a connection. A host-network pod's address is its node's.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint<'a> {
    pub pod: &'a Pod,
    pub ip: IpAddr,
}

/// Is a connection from `src` to `dst` on `protocol` ("TCP", "UDP", "SCTP")
/// and `port` allowed? Both the client's egress and the server's ingress
/// must allow it. Standard mode: see [`allowed_in`].
pub fn allowed(
    cluster: &ClusterState,
    src: Endpoint<'_>,
    dst: Endpoint<'_>,
    protocol: &str,
    port: u16,
) -> bool {
    allowed_in(cluster, Mode::Standard, src, dst, protocol, port)
}

/// [`allowed`] with the enforcer's mode: what a direction no tier decides
/// gets.
pub fn allowed_in(
    cluster: &ClusterState,
    mode: Mode,
    src: Endpoint<'_>,
    dst: Endpoint<'_>,
    protocol: &str,
    port: u16,
) -> bool {
    direction_allows(
        cluster,
        mode,
        src,
        dst,
        dst,
        protocol,
        port,
        Direction::Egress,
    ) && direction_allows(
        cluster,
        mode,
        dst,
        src,
        dst,
        protocol,
        port,
        Direction::Ingress,
    )
}

/// A rule's peers and ports, whichever direction it is for.
pub(crate) type Rule<'a> = (
    Option<&'a Vec<NetworkPolicyPeer>>,
    Option<&'a Vec<NetworkPolicyPort>>,
);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

/// Whether `subject`'s hook allows traffic with `peer` in `dir` (see the
/// module comment for the order). `server` is the destination, whose
/// container ports give named ports their meaning.
#[allow(clippy::too_many_arguments)]
fn direction_allows(
    cluster: &ClusterState,
    mode: Mode,
    subject: Endpoint<'_>,
    peer: Endpoint<'_>,
    server: Endpoint<'_>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> bool {
    if tiers::host_network(subject.pod) {
        return true;
    }
    if tiers::own_node_addresses(cluster, subject.pod).contains(&peer.ip) {
        return true;
    }
    let other = Other {
        pod: Some(peer.pod),
        ip: peer.ip,
    };
    let server_pod = Some(server.pod);
    match tier_decides(
        cluster,
        Tier::Admin,
        subject.pod,
        other,
        server_pod,
        protocol,
        port,
        dir,
    ) {
        Some(Action::Accept) => return true,
        Some(Action::Deny) => return false,
        Some(Action::Pass) | None => {}
    }
    if let Some(allowed) =
        network_policies_decide(cluster, subject, peer, server, protocol, port, dir)
    {
        return allowed;
    }
    match tier_decides(
        cluster,
        Tier::Baseline,
        subject.pod,
        other,
        server_pod,
        protocol,
        port,
        dir,
    ) {
        Some(Action::Accept) => return true,
        Some(Action::Deny) => return false,
        Some(Action::Pass) | None => {}
    }
    mode == Mode::Standard
}

/// The action of the first rule of `tier` that matches, if any: a Pass ends
/// the tier as surely as an Accept or a Deny.
#[allow(clippy::too_many_arguments)]
fn tier_decides(
    cluster: &ClusterState,
    tier: Tier,
    subject: &Pod,
    other: Other<'_>,
    server: Option<&Pod>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> Option<Action> {
    for policy in tiers::applying(cluster, tier, subject, false) {
        for rule in tiers::rules(policy, dir) {
            if let Some(action) = tiers::rule_matches(cluster, rule, other, server, protocol, port)
            {
                return Some(action);
            }
        }
    }
    None
}

/// The NetworkPolicy tier: None when no (enforced) NetworkPolicy isolates
/// `subject` in `dir`, else whether one of their rules allows the traffic.
fn network_policies_decide(
    cluster: &ClusterState,
    subject: Endpoint<'_>,
    peer: Endpoint<'_>,
    server: Endpoint<'_>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> Option<bool> {
    let mut isolated = false;
    // A staged policy is judged for logs, never enforced.
    for policy in &cluster.policies {
        if !selects(policy, subject.pod, dir) || crate::explain::is_staged(policy) {
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
                return Some(true);
            }
        }
    }
    isolated.then_some(false)
}

pub(crate) fn namespace(ns: Option<&str>) -> &str {
    ns.unwrap_or("default")
}

pub(crate) fn selects(policy: &NetworkPolicy, pod: &Pod, dir: Direction) -> bool {
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

pub(crate) fn peers_match(
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
        // Host-network pods are no pods of a selector (only their address,
        // the node's, can match).
        if pod_host_network(peer.pod) {
            return false;
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

pub(crate) fn namespace_labels(cluster: &ClusterState, ns: &str) -> BTreeMap<String, String> {
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

pub(crate) fn ports_match(
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

/// Does `src`'s egress allow a connection to `vip`, a Service's ClusterIP,
/// on `protocol` and `port`? Standard mode: see
/// [`egress_to_service_allowed_in`].
pub fn egress_to_service_allowed(
    cluster: &ClusterState,
    src: Endpoint<'_>,
    vip: IpAddr,
    protocol: &str,
    port: u16,
) -> bool {
    egress_to_service_allowed_in(cluster, Mode::Standard, src, vip, protocol, port)
}

/// [`egress_to_service_allowed`] with the enforcer's mode. The tiers are
/// walked as in [`allowed`]; what differs is when a rule matches the
/// ClusterIP.
///
/// NetworkPolicy: either a rule allows `vip` as a plain address (an
/// ipBlock, or no `to`), or one rule covers every backend the kernel may
/// translate that service port to, each on its target port: a pod backend
/// (Service with a selector) when the rule's pod/namespace selectors select
/// it, an address backend (EndpointSlice of a Service without a selector)
/// when it is a selected pod's address or lies in the rule's ipBlocks. A
/// service port without backends allows nothing; a headless Service has no
/// ClusterIP.
///
/// ClusterNetworkPolicy: a rule matches `vip` when its `networks` or
/// `nodes` hold it, or, through the backends as above: an Accept or Pass
/// rule when it matches every backend (narrower, never wider), a Deny rule
/// as soon as it matches one (the kernel may pick that one).
pub fn egress_to_service_allowed_in(
    cluster: &ClusterState,
    mode: Mode,
    src: Endpoint<'_>,
    vip: IpAddr,
    protocol: &str,
    port: u16,
) -> bool {
    if tiers::host_network(src.pod) {
        return true;
    }
    if tiers::own_node_addresses(cluster, src.pod).contains(&vip) {
        return true;
    }
    match service_tier_decides(cluster, Tier::Admin, src.pod, vip, protocol, port) {
        Some(Action::Accept) => return true,
        Some(Action::Deny) => return false,
        Some(Action::Pass) | None => {}
    }
    if let Some(allowed) = service_network_policies_decide(cluster, src, vip, protocol, port) {
        return allowed;
    }
    match service_tier_decides(cluster, Tier::Baseline, src.pod, vip, protocol, port) {
        Some(Action::Accept) => return true,
        Some(Action::Deny) => return false,
        Some(Action::Pass) | None => {}
    }
    mode == Mode::Standard
}

/// The action of the first egress rule of `tier` that matches `vip`.
fn service_tier_decides(
    cluster: &ClusterState,
    tier: Tier,
    src: &Pod,
    vip: IpAddr,
    protocol: &str,
    port: u16,
) -> Option<Action> {
    use palisade_apis::cluster_network_policy::Effective;
    for policy in tiers::applying(cluster, tier, src, false) {
        for rule in &policy.egress {
            let rule = match rule.effective() {
                Effective::Nothing => continue,
                Effective::DenyAll => return Some(Action::Deny),
                Effective::AsWritten(rule) => rule,
            };
            let as_address = tiers::address_peers_hold(cluster, rule, vip)
                && tiers::ports_match(rule, None, protocol, port);
            let through_backends = service_backends(cluster, vip, protocol, port).iter().any(
                |(backends, target_proto)| {
                    let covered =
                        |b: &ModelBackend<'_>| tier_covers(cluster, rule, b, target_proto);
                    match rule.action {
                        Action::Deny => backends.iter().any(covered),
                        Action::Accept | Action::Pass => {
                            !backends.is_empty() && backends.iter().all(covered)
                        }
                    }
                },
            );
            if as_address || through_backends {
                return Some(rule.action);
            }
        }
    }
    None
}

/// Whether a ClusterNetworkPolicy rule matches one backend (as [`covers`]
/// for NetworkPolicy: `networks` and `nodes` stand for ipBlocks).
fn tier_covers(
    cluster: &ClusterState,
    rule: &palisade_apis::Rule,
    backend: &ModelBackend<'_>,
    protocol: &str,
) -> bool {
    let selects = |pod: &Pod| {
        rule.peers
            .iter()
            .any(|p| tiers::selector_peer_selects(cluster, p, pod))
    };
    match backend {
        ModelBackend::Pod(pod, target) => {
            selects(pod) && tiers::ports_match(rule, Some(pod), protocol, *target)
        }
        ModelBackend::Address(ip, target) => {
            let by_pod = cluster.pods.iter().any(|pod| {
                pod_ips(pod).contains(ip)
                    && selects(pod)
                    && tiers::ports_match(rule, Some(pod), protocol, *target)
            });
            let by_block = tiers::address_peers_hold(cluster, rule, *ip)
                && tiers::ports_match(rule, None, protocol, *target);
            by_pod || by_block
        }
    }
}

/// The NetworkPolicy tier for a ClusterIP: None when no (enforced)
/// NetworkPolicy isolates `src`'s egress.
fn service_network_policies_decide(
    cluster: &ClusterState,
    src: Endpoint<'_>,
    vip: IpAddr,
    protocol: &str,
    port: u16,
) -> Option<bool> {
    let mut isolated = false;
    for policy in &cluster.policies {
        if !selects(policy, src.pod, Direction::Egress) || crate::explain::is_staged(policy) {
            continue;
        }
        isolated = true;
        let spec = policy.spec.as_ref().expect("selects checked spec");
        let ns = namespace(policy.metadata.namespace.as_deref());
        for rule in spec.egress.iter().flatten() {
            let peers = rule.to.as_ref();
            let ports = rule.ports.as_ref();
            if !ports_valid(ports) || !peers_valid(peers) {
                continue;
            }
            if address_in_peers(peers, vip) && numbered_ports_match(ports, protocol, port) {
                return Some(true);
            }
            for (backends, target_proto) in service_backends(cluster, vip, protocol, port) {
                if !backends.is_empty()
                    && backends
                        .iter()
                        .all(|b| covers(cluster, peers, ports, ns, b, &target_proto))
                {
                    return Some(true);
                }
            }
        }
    }
    isolated.then_some(false)
}

/// A backend of one service port: a pod or an address, and the port the
/// connection is translated to.
enum ModelBackend<'a> {
    Pod(&'a Pod, u16),
    Address(IpAddr, u16),
}

/// A rule whose ports the resolver rejects allows nothing.
fn ports_valid(ports: Option<&Vec<NetworkPolicyPort>>) -> bool {
    ports.into_iter().flatten().all(|p| {
        let proto_ok = matches!(
            p.protocol.as_deref().unwrap_or("TCP"),
            "TCP" | "UDP" | "SCTP"
        );
        let port_ok = match (&p.port, p.end_port) {
            (None, None) => true,
            (None, Some(_)) => false,
            (Some(IntOrString::String(s)), end) => match s.parse::<i32>() {
                Ok(n) => end.is_none() && (1..=65535).contains(&n),
                Err(_) => end.is_none(),
            },
            (Some(IntOrString::Int(n)), end) => {
                (1..=65535).contains(n) && end.is_none_or(|e| (*n..=65535).contains(&e))
            }
        };
        proto_ok && port_ok
    })
}

/// Peers with an invalid selector are dropped by the resolver; a rule
/// whose peers were all dropped allows nothing.
fn peers_valid(peers: Option<&Vec<NetworkPolicyPeer>>) -> bool {
    let Some(peers) = peers.filter(|p| !p.is_empty()) else {
        return true;
    };
    peers.iter().any(peer_valid)
}

fn peer_valid(p: &NetworkPolicyPeer) -> bool {
    if let Some(block) = &p.ip_block {
        return block.cidr.parse::<IpNet>().is_ok_and(|c| c.trunc() == c);
    }
    let known = |s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
        s.iter()
            .flat_map(|s| s.match_expressions.iter().flatten())
            .all(|e| {
                matches!(
                    e.operator.as_str(),
                    "In" | "NotIn" | "Exists" | "DoesNotExist"
                )
            })
    };
    (p.pod_selector.is_some() || p.namespace_selector.is_some())
        && known(&p.pod_selector)
        && known(&p.namespace_selector)
}

pub(crate) fn block_contains(p: &NetworkPolicyPeer, ip: IpAddr) -> bool {
    let Some(block) = &p.ip_block else {
        return false;
    };
    let Ok(cidr) = block.cidr.parse::<IpNet>() else {
        return false;
    };
    cidr.contains(&ip)
        && !block
            .except
            .iter()
            .flatten()
            .filter_map(|e| e.parse::<IpNet>().ok())
            .any(|e| e.contains(&ip))
}

/// Whether the rule's peers take in `ip` as an address: no `to`, or an
/// ipBlock that holds it.
pub(crate) fn address_in_peers(peers: Option<&Vec<NetworkPolicyPeer>>, ip: IpAddr) -> bool {
    match peers.filter(|p| !p.is_empty()) {
        None => true,
        Some(peers) => peers.iter().any(|p| block_contains(p, ip)),
    }
}

/// Port match for a destination that is no pod: named ports never match.
pub(crate) fn numbered_ports_match(
    ports: Option<&Vec<NetworkPolicyPort>>,
    protocol: &str,
    port: u16,
) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|p| {
        p.protocol.as_deref().unwrap_or("TCP") == protocol
            && match (&p.port, p.end_port) {
                (None, _) => true,
                (Some(IntOrString::Int(n)), None) => i32::from(port) == *n,
                (Some(IntOrString::Int(n)), Some(end)) => (*n..=end).contains(&i32::from(port)),
                (Some(IntOrString::String(s)), _) => s.parse::<i32>() == Ok(i32::from(port)),
            }
    })
}

/// Whether one selector peer (not an ipBlock) selects `pod`.
fn selector_selects(
    cluster: &ClusterState,
    p: &NetworkPolicyPeer,
    policy_ns: &str,
    pod: &Pod,
) -> bool {
    if p.ip_block.is_some() || !peer_valid(p) || pod_host_network(pod) {
        return false;
    }
    let peer_ns = namespace(pod.metadata.namespace.as_deref());
    let ns_ok = match &p.namespace_selector {
        None => peer_ns == policy_ns,
        Some(sel) => selector_matches(sel, &namespace_labels(cluster, peer_ns)).unwrap_or(false),
    };
    let pod_ok = match &p.pod_selector {
        None => true,
        Some(sel) => {
            selector_matches(sel, &pod.metadata.labels.clone().unwrap_or_default()).unwrap_or(false)
        }
    };
    ns_ok && pod_ok
}

pub(crate) fn pod_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// A pod's addresses, or none for a finished pod.
fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return vec![];
    };
    if matches!(status.phase.as_deref(), Some("Succeeded") | Some("Failed")) || pod.spec.is_none() {
        return vec![];
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|i| i.ip.parse().ok())
        .chain(status.pod_ip.as_deref().and_then(|i| i.parse().ok()))
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// Whether the rule covers one backend.
fn covers(
    cluster: &ClusterState,
    peers: Option<&Vec<NetworkPolicyPeer>>,
    ports: Option<&Vec<NetworkPolicyPort>>,
    policy_ns: &str,
    backend: &ModelBackend<'_>,
    protocol: &str,
) -> bool {
    let selectors: Vec<&NetworkPolicyPeer> = peers
        .into_iter()
        .flatten()
        .filter(|p| p.ip_block.is_none())
        .collect();
    match backend {
        ModelBackend::Pod(pod, target) => {
            selectors
                .iter()
                .any(|p| selector_selects(cluster, p, policy_ns, pod))
                && ports_match(ports, pod, protocol, *target)
        }
        ModelBackend::Address(ip, target) => {
            let by_pod = cluster.pods.iter().any(|pod| {
                pod_ips(pod).contains(ip)
                    && selectors
                        .iter()
                        .any(|p| selector_selects(cluster, p, policy_ns, pod))
                    && ports_match(ports, pod, protocol, *target)
            });
            let by_block =
                address_in_peers(peers, *ip) && numbered_ports_match(ports, protocol, *target);
            by_pod || by_block
        }
    }
}

/// For each Service port that `vip`, `protocol` and `port` reach, its
/// backends (and the protocol they are reached with).
fn service_backends<'a>(
    cluster: &'a ClusterState,
    vip: IpAddr,
    protocol: &str,
    port: u16,
) -> Vec<(Vec<ModelBackend<'a>>, String)> {
    let mut out = Vec::new();
    for svc in &cluster.services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let ips: Vec<&String> = match &spec.cluster_ips {
            Some(ips) if !ips.is_empty() => ips.iter().collect(),
            _ => spec.cluster_ip.iter().collect(),
        };
        if ips.iter().any(|i| i.as_str() == "None")
            || !ips.iter().any(|i| i.parse::<IpAddr>().ok() == Some(vip))
        {
            continue;
        }
        for sp in spec.ports.iter().flatten() {
            if sp.protocol.as_deref().unwrap_or("TCP") != protocol || sp.port != i32::from(port) {
                continue;
            }
            out.push((backends_of(cluster, svc, sp), protocol.to_string()));
        }
    }
    out
}

fn backends_of<'a>(
    cluster: &'a ClusterState,
    svc: &Service,
    sp: &k8s_openapi::api::core::v1::ServicePort,
) -> Vec<ModelBackend<'a>> {
    let ns = namespace(svc.metadata.namespace.as_deref());
    let protocol = sp.protocol.as_deref().unwrap_or("TCP");
    let selector = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty());
    let mut out = Vec::new();
    match selector {
        Some(sel) => {
            for pod in &cluster.pods {
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                if namespace(pod.metadata.namespace.as_deref()) != ns
                    || pod_ips(pod).is_empty()
                    || !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
                {
                    continue;
                }
                let target = match &sp.target_port {
                    None => Some(sp.port),
                    Some(IntOrString::Int(n)) => Some(*n),
                    Some(IntOrString::String(name)) => pod
                        .spec
                        .iter()
                        .flat_map(|s| s.containers.iter())
                        .flat_map(|c| c.ports.iter().flatten())
                        .find(|cp| {
                            cp.name.as_deref() == Some(name.as_str())
                                && cp.protocol.as_deref().unwrap_or("TCP") == protocol
                        })
                        .map(|cp| cp.container_port),
                };
                if let Some(t) = target
                    .and_then(|t| u16::try_from(t).ok())
                    .filter(|t| *t != 0)
                {
                    out.push(ModelBackend::Pod(pod, t));
                }
            }
        }
        None => {
            let name = svc.metadata.name.as_deref().unwrap_or_default();
            for slice in &cluster.endpoint_slices {
                let owner = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"));
                if namespace(slice.metadata.namespace.as_deref()) != ns
                    || owner.map(String::as_str) != Some(name)
                    || !matches!(slice.address_type.as_str(), "IPv4" | "IPv6")
                {
                    continue;
                }
                for ep in slice.ports.iter().flatten() {
                    if ep.name.as_deref().unwrap_or("") != sp.name.as_deref().unwrap_or("")
                        || ep.protocol.as_deref().unwrap_or("TCP") != protocol
                    {
                        continue;
                    }
                    let Some(t) = ep
                        .port
                        .and_then(|t| u16::try_from(t).ok())
                        .filter(|t| *t != 0)
                    else {
                        continue;
                    };
                    for e in &slice.endpoints {
                        for a in &e.addresses {
                            if let Ok(ip) = a.parse() {
                                out.push(ModelBackend::Address(ip, t));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}
