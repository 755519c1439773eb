//! Why the model allows or denies one direction of a connection: the same
//! reading of the objects as [`crate::verdict`], but answering with the
//! policy and the rule that decided, for operators (the controller's
//! Explain RPC). Its allow/deny is tested equal to [`crate::verdict`]'s on
//! random clusters; the verdict function stays the oracle and is not built
//! on this one, so that the two readings check each other.
//!
//! Unlike [`crate::verdict`], the peer may be an address outside the
//! cluster ([`Peer::External`]): only ipBlocks (or a rule without peers)
//! can match it, and a named port never matches a destination that is no
//! pod, as there is no container port to give the name its meaning.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cluster::ClusterState;
use crate::verdict::{
    address_in_peers, namespace, numbered_ports_match, peers_match, ports_match, selects,
    Direction, Endpoint, Rule,
};

/// The other side of the connection, as seen from the pod whose policies
/// are asked.
#[derive(Clone, Copy, Debug)]
pub enum Peer<'a> {
    Pod(Endpoint<'a>),
    /// An address that belongs to no pod the cluster knows.
    External(IpAddr),
}

/// How one direction was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No policy selects the pod for this direction: everything is allowed.
    NotIsolated,
    /// The first rule (in the order of policies by namespace/name, then
    /// rules in the policy) that allows the connection.
    Allowed(DecidingRule),
    /// Policies isolate the pod and none of their rules allows the
    /// connection; `isolated_by` lists them (namespace/name).
    Denied { isolated_by: Vec<String> },
}

impl Decision {
    pub fn allowed(&self) -> bool {
        !matches!(self, Decision::Denied { .. })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecidingRule {
    /// namespace/name
    pub policy: String,
    /// The rule's index in the policy's `ingress` or `egress` list.
    pub rule: usize,
    /// The rule as an operator reads it, e.g. `ingress[0]: from
    /// podSelector{app=web} on TCP/80`.
    pub description: String,
}

/// Explains whether `subject`'s policies allow traffic with `peer` in
/// `dir`. `server` is the destination pod, whose container ports give named
/// ports their meaning; None when the destination is no pod.
pub fn explain_direction(
    cluster: &ClusterState,
    subject: &Pod,
    peer: Peer<'_>,
    server: Option<&Pod>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> Decision {
    let mut isolated_by = Vec::new();
    for policy in &cluster.policies {
        if !selects(policy, subject, dir) {
            continue;
        }
        let name = policy_name(policy);
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
        let found = rules.iter().position(|(peers, ports)| {
            let peer_ok = match peer {
                Peer::Pod(p) => peers_match(cluster, *peers, ns, p),
                Peer::External(ip) => address_in_peers(*peers, ip),
            };
            let port_ok = match server {
                Some(s) => ports_match(*ports, s, protocol, port),
                None => numbered_ports_match(*ports, protocol, port),
            };
            peer_ok && port_ok
        });
        if let Some(i) = found {
            let (peers, ports) = rules[i];
            return Decision::Allowed(DecidingRule {
                policy: name,
                rule: i,
                description: describe_rule(dir, i, peers, ports),
            });
        }
        isolated_by.push(name);
    }
    if isolated_by.is_empty() {
        Decision::NotIsolated
    } else {
        Decision::Denied { isolated_by }
    }
}

fn policy_name(policy: &NetworkPolicy) -> String {
    format!(
        "{}/{}",
        namespace(policy.metadata.namespace.as_deref()),
        policy.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A rule as one line: `ingress[1]: from podSelector{app=web} in
/// namespaces{team=red}; ipBlock 10.0.0.0/8 except 10.1.0.0/16 on TCP/80,
/// UDP/dns`.
pub fn describe_rule(
    dir: Direction,
    index: usize,
    peers: Option<&Vec<NetworkPolicyPeer>>,
    ports: Option<&Vec<NetworkPolicyPort>>,
) -> String {
    let (list, word) = match dir {
        Direction::Ingress => ("ingress", "from"),
        Direction::Egress => ("egress", "to"),
    };
    let peers = match peers.filter(|p| !p.is_empty()) {
        None => "any peer".to_string(),
        Some(peers) => peers
            .iter()
            .map(describe_peer)
            .collect::<Vec<_>>()
            .join("; "),
    };
    let ports = match ports.filter(|p| !p.is_empty()) {
        None => "any port".to_string(),
        Some(ports) => ports
            .iter()
            .map(describe_port)
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!("{list}[{index}]: {word} {peers} on {ports}")
}

fn describe_peer(p: &NetworkPolicyPeer) -> String {
    if let Some(block) = &p.ip_block {
        let except = block.except.as_deref().unwrap_or_default();
        return if except.is_empty() {
            format!("ipBlock {}", block.cidr)
        } else {
            format!("ipBlock {} except {}", block.cidr, except.join(","))
        };
    }
    let pods = match &p.pod_selector {
        Some(s) => format!("pods{}", describe_selector(s)),
        None => "all pods".to_string(),
    };
    let namespaces = match &p.namespace_selector {
        Some(s) => format!("namespaces{}", describe_selector(s)),
        None => "the policy's namespace".to_string(),
    };
    format!("{pods} in {namespaces}")
}

fn describe_selector(s: &LabelSelector) -> String {
    let mut terms: Vec<String> = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        terms.push(match e.operator.as_str() {
            "Exists" => format!("{} exists", e.key),
            "DoesNotExist" => format!("{} does not exist", e.key),
            op => format!("{} {op} ({values})", e.key),
        });
    }
    if terms.is_empty() {
        "{all}".to_string()
    } else {
        format!("{{{}}}", terms.join(", "))
    }
}

fn describe_port(p: &NetworkPolicyPort) -> String {
    let protocol = p.protocol.as_deref().unwrap_or("TCP");
    match (&p.port, p.end_port) {
        (None, _) => format!("{protocol}/any"),
        (Some(IntOrString::Int(n)), None) => format!("{protocol}/{n}"),
        (Some(IntOrString::Int(n)), Some(end)) => format!("{protocol}/{n}-{end}"),
        (Some(IntOrString::String(name)), _) => format!("{protocol}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Object;

    fn pod(ns: &str, name: &str, app: &str, ip: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": ip}
        }))
        .unwrap()
    }

    fn cluster() -> ClusterState {
        let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "x"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 22}]},
                    {"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": "http"}]}
                ]
            }
        }))
        .unwrap();
        ClusterState::from_objects(
            [
                Object::Pod(pod("x", "web", "web", "10.0.0.1")),
                Object::Pod(pod("x", "client", "client", "10.0.0.2")),
                Object::NetworkPolicy(np),
            ],
            "1".into(),
        )
    }

    #[test]
    fn names_the_deciding_rule_and_resolves_named_ports_on_the_destination() {
        let c = cluster();
        let (web, client) = (&c.pods[1], &c.pods[0]);
        let peer = Peer::Pod(Endpoint {
            pod: client,
            ip: "10.0.0.2".parse().unwrap(),
        });
        let d = explain_direction(&c, web, peer, Some(web), "TCP", 8080, Direction::Ingress);
        assert_eq!(
            d,
            Decision::Allowed(DecidingRule {
                policy: "x/web".into(),
                rule: 1,
                description:
                    "ingress[1]: from pods{app=client} in the policy's namespace on TCP/http".into(),
            })
        );
        let d = explain_direction(&c, web, peer, Some(web), "TCP", 80, Direction::Ingress);
        assert_eq!(
            d,
            Decision::Denied {
                isolated_by: vec!["x/web".into()]
            }
        );
        let d = explain_direction(&c, client, peer, Some(web), "TCP", 80, Direction::Ingress);
        assert_eq!(d, Decision::NotIsolated);
    }

    #[test]
    fn an_external_peer_matches_only_ip_blocks() {
        let c = cluster();
        let web = &c.pods[1];
        let outside = Peer::External("192.0.2.9".parse().unwrap());
        let d = explain_direction(&c, web, outside, Some(web), "TCP", 22, Direction::Ingress);
        assert!(
            matches!(d, Decision::Allowed(ref r) if r.rule == 0),
            "{d:?}"
        );
        let d = explain_direction(&c, web, outside, Some(web), "TCP", 8080, Direction::Ingress);
        assert!(!d.allowed(), "a pod selector never selects an address");
    }
}
