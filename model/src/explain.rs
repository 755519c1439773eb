//! Why the model allows or denies one direction of a connection: the same
//! reading of the objects as [`crate::verdict`], but answering with the
//! tier, the policy and the rule that decided, and the Pass rules that led
//! there, for operators (the controller's Explain RPC): [`explain`]. Its allow/deny is tested equal to [`crate::verdict`]'s on
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

use palisade_apis::{Action, ClusterNetworkPolicy, PortMatch, Tier};

use crate::cluster::ClusterState;
use crate::tiers::{self, Mode, Other};
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

/// How the NetworkPolicy tier decided one direction; as
/// [`explain_direction`]'s answer, a summary of the tiers (see there).
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

/// The annotation that stages a NetworkPolicy: with the value "true" it is
/// evaluated against traffic (would-deny, would-allow) but not enforced.
/// Any other value enforces it, as the controller does.
pub const AUDIT_ANNOTATION: &str = "palisade.io/audit";

/// Whether a policy is staged rather than enforced.
pub fn is_staged(policy: &NetworkPolicy) -> bool {
    policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(AUDIT_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// One question: does `subject`'s hook allow traffic with `peer` in `dir`?
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    pub subject: &'a Pod,
    pub peer: Peer<'a>,
    /// The destination pod, whose container ports give named ports their
    /// meaning; None when the destination is no pod.
    pub server: Option<&'a Pod>,
    /// "TCP", "UDP" or "SCTP".
    pub protocol: &'a str,
    pub port: u16,
    pub dir: Direction,
}

/// One ClusterNetworkPolicy rule, as explain names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierRule {
    pub tier: Tier,
    /// As operators name the policy: [`ClusterNetworkPolicy::id`].
    pub policy: String,
    pub priority: u32,
    /// The rule's index in the policy's `ingress` or `egress` list.
    pub rule: usize,
    /// The rule's `name`, or empty.
    pub name: String,
    /// What it did: Accept, Deny or Pass; Deny for a Deny or Pass rule that
    /// fails closed (a part this version cannot read).
    pub action: Action,
    /// The rule as an operator reads it, e.g. `egress[3]
    /// "deny-to-slytherin": Deny to namespaces{house=slytherin} on TCP/80`.
    pub description: String,
}

/// What decided one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decided {
    /// The pod is on its node's network: it has no hook of its own.
    HostNetwork,
    /// Traffic between the pod and its own node: always allowed (kubelet
    /// probes).
    OwnNode,
    /// An Accept or Deny rule of the Admin or Baseline tier.
    Rule(TierRule),
    /// NetworkPolicies isolate the pod: [`Decision::Allowed`] or
    /// [`Decision::Denied`].
    NetworkPolicy(Decision),
    /// No tier decided: allowed in standard mode, denied in strict.
    Default { allowed: bool },
}

/// How one direction was decided, tiers included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// The Pass rules that sent the connection on, in the order met (at
    /// most one per tier).
    pub passed: Vec<TierRule>,
    pub decided: Decided,
    /// Egress only: the Accept rules by domain name met above what decided
    /// whose protocols take the connection, in order. Any of them allows it
    /// instead when the pod resolved one of its names to the peer's
    /// address, which only the pod's node knows (its learner), not
    /// Explain.
    pub by_name: Vec<TierRule>,
    /// The same for the NetworkPolicy tier, when it denied: the rules by
    /// name (an ApplicationNetworkPolicy's) of the policies isolating the
    /// pod whose ports take the connection.
    pub by_name_network_policy: Vec<DecidingRule>,
}

impl Explanation {
    pub fn allowed(&self) -> bool {
        match &self.decided {
            Decided::HostNetwork | Decided::OwnNode => true,
            Decided::Rule(r) => r.action == Action::Accept,
            Decided::NetworkPolicy(d) => d.allowed(),
            Decided::Default { allowed } => *allowed,
        }
    }

    /// The NetworkPolicy-shaped summary [`explain_direction`] answers: an
    /// Accept rule as [`Decision::Allowed`] naming the
    /// ClusterNetworkPolicy, a Deny rule as [`Decision::Denied`] isolated by
    /// it, the default (and a host-network pod) as
    /// [`Decision::NotIsolated`], or [`Decision::Denied`] by nothing in
    /// strict mode.
    pub fn summary(&self) -> Decision {
        match &self.decided {
            Decided::HostNetwork | Decided::Default { allowed: true } => Decision::NotIsolated,
            Decided::Default { allowed: false } => Decision::Denied {
                isolated_by: vec![],
            },
            Decided::OwnNode => Decision::Allowed(DecidingRule {
                policy: String::new(),
                rule: 0,
                description: "traffic with the pod's own node is always allowed".into(),
            }),
            Decided::Rule(r) if r.action == Action::Accept => Decision::Allowed(DecidingRule {
                policy: r.policy.clone(),
                rule: r.rule,
                description: r.description.clone(),
            }),
            Decided::Rule(r) => Decision::Denied {
                isolated_by: vec![r.policy.clone()],
            },
            Decided::NetworkPolicy(d) => d.clone(),
        }
    }
}

/// Explains how `q.subject`'s hook judges the connection: the tiers top to
/// bottom, as [`crate::verdict`] walks them. Staged policies are not
/// enforced, so they are not part of the answer (see
/// [`staged_tier_change`]).
pub fn explain(cluster: &ClusterState, mode: Mode, q: &Query<'_>) -> Explanation {
    walk(cluster, mode, q, false)
}

/// [`explain`] in standard mode, summarised as the NetworkPolicy tier
/// answers (see [`Explanation::summary`]).
pub fn explain_direction(
    cluster: &ClusterState,
    subject: &Pod,
    peer: Peer<'_>,
    server: Option<&Pod>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> Decision {
    let q = Query {
        subject,
        peer,
        server,
        protocol,
        port,
        dir,
    };
    explain(cluster, Mode::Standard, &q).summary()
}

/// What [`explain`] would answer once the staged policies (NetworkPolicies
/// and ClusterNetworkPolicies) are enforced too, when that changes whether
/// the connection is allowed; None when no staged policy applies to
/// `q.subject` in `q.dir` or the answer stays the same.
pub fn staged_tier_change(
    cluster: &ClusterState,
    mode: Mode,
    q: &Query<'_>,
) -> Option<Explanation> {
    let staged_np = cluster
        .policies
        .iter()
        .any(|p| is_staged(p) && selects(p, q.subject, q.dir));
    let staged_cnp = cluster.cluster_policies.iter().any(|p| {
        tiers::is_staged(p)
            && !tiers::rules(p, q.dir).is_empty()
            && tiers::selects(cluster, p, q.subject)
    });
    if !staged_np && !staged_cnp {
        return None;
    }
    let now = walk(cluster, mode, q, false);
    let staged = walk(cluster, mode, q, true);
    (staged.allowed() != now.allowed()).then_some(staged)
}

/// [`staged_tier_change`] in standard mode, summarised (see
/// [`Explanation::summary`]).
pub fn staged_change(
    cluster: &ClusterState,
    subject: &Pod,
    peer: Peer<'_>,
    server: Option<&Pod>,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> Option<Decision> {
    let q = Query {
        subject,
        peer,
        server,
        protocol,
        port,
        dir,
    };
    staged_tier_change(cluster, Mode::Standard, &q).map(|e| e.summary())
}

fn walk(cluster: &ClusterState, mode: Mode, q: &Query<'_>, with_staged: bool) -> Explanation {
    let mut passed = Vec::new();
    let mut by_name = Vec::new();
    let mut by_name_np = Vec::new();
    let done = |passed: Vec<TierRule>, by_name: Vec<TierRule>, decided| Explanation {
        passed,
        decided,
        by_name,
        by_name_network_policy: Vec::new(),
    };
    if tiers::host_network(q.subject) {
        return done(passed, by_name, Decided::HostNetwork);
    }
    let peer_ip = match q.peer {
        Peer::Pod(p) => p.ip,
        Peer::External(ip) => ip,
    };
    if tiers::own_node_addresses(cluster, q.subject).contains(&peer_ip) {
        return done(passed, by_name, Decided::OwnNode);
    }
    if let Some(rule) = first_tier_rule(cluster, Tier::Admin, q, with_staged, &mut by_name) {
        if rule.action != Action::Pass {
            return done(passed, by_name, Decided::Rule(rule));
        }
        passed.push(rule);
    }
    match network_policies(cluster, q, with_staged, &mut by_name_np) {
        Decision::NotIsolated => {}
        decision => {
            let denied = !decision.allowed();
            let mut e = done(passed, by_name, Decided::NetworkPolicy(decision));
            if denied {
                e.by_name_network_policy = by_name_np;
            }
            return e;
        }
    }
    if let Some(rule) = first_tier_rule(cluster, Tier::Baseline, q, with_staged, &mut by_name) {
        if rule.action != Action::Pass {
            return done(passed, by_name, Decided::Rule(rule));
        }
        passed.push(rule);
    }
    let allowed = mode == Mode::Standard;
    done(passed, by_name, Decided::Default { allowed })
}

/// The first rule of `tier` (policies in precedence order, rules in order)
/// that matches the connection; the egress Accept rules by name met before
/// it whose protocols take the connection go to `by_name`.
fn first_tier_rule(
    cluster: &ClusterState,
    tier: Tier,
    q: &Query<'_>,
    with_staged: bool,
    by_name: &mut Vec<TierRule>,
) -> Option<TierRule> {
    let other = match q.peer {
        Peer::Pod(p) => Other {
            pod: Some(p.pod),
            ip: p.ip,
        },
        Peer::External(ip) => Other { pod: None, ip },
    };
    for policy in tiers::applying(cluster, tier, q.subject, with_staged) {
        for (i, rule) in tiers::rules(policy, q.dir).iter().enumerate() {
            if q.dir == Direction::Egress
                && tiers::accepting_names(rule, q.server, q.protocol, q.port).is_some()
            {
                by_name.push(TierRule {
                    tier,
                    policy: policy.id(),
                    priority: policy.priority,
                    rule: i,
                    name: rule.name.clone(),
                    action: Action::Accept,
                    description: describe_tier_rule(policy, q.dir, i),
                });
            }
            if let Some(action) =
                tiers::rule_matches(cluster, rule, other, q.server, q.protocol, q.port)
            {
                return Some(TierRule {
                    tier,
                    policy: policy.id(),
                    priority: policy.priority,
                    rule: i,
                    name: rule.name.clone(),
                    action,
                    description: describe_tier_rule(policy, q.dir, i),
                });
            }
        }
    }
    None
}

/// The NetworkPolicy tier: NotIsolated when no policy isolates the pod.
/// Egress rules by name of the policies that isolate it whose ports take
/// the connection go to `by_name` (only the node knows whether they
/// match its peer).
fn network_policies(
    cluster: &ClusterState,
    q: &Query<'_>,
    with_staged: bool,
    by_name: &mut Vec<DecidingRule>,
) -> Decision {
    let (subject, peer, server, protocol, port, dir) =
        (q.subject, q.peer, q.server, q.protocol, q.port, q.dir);
    let mut isolated_by = Vec::new();
    for policy in &cluster.policies {
        if !selects(policy, subject, dir) || (!with_staged && is_staged(policy)) {
            continue;
        }
        let name = policy_name(policy);
        let spec = policy.spec.as_ref().expect("selects checked spec");
        let ns = namespace(policy.metadata.namespace.as_deref());
        if dir == Direction::Egress {
            let names = palisade_apis::application_network_policy::domain_names(policy);
            for (i, r) in spec.egress.iter().flatten().enumerate() {
                let Some(names) = names.get(&i) else { continue };
                let port_ok = match server {
                    Some(s) => ports_match(r.ports.as_ref(), s, protocol, port),
                    None => numbered_ports_match(r.ports.as_ref(), protocol, port),
                };
                if port_ok {
                    by_name.push(DecidingRule {
                        policy: name.clone(),
                        rule: i,
                        description: describe_names_rule(i, names, r.ports.as_ref()),
                    });
                }
            }
        }
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

/// A ClusterNetworkPolicy rule as one line: `egress[3] "deny-to-slytherin":
/// Deny to namespaces{house=slytherin} on TCP/80`.
pub fn describe_tier_rule(policy: &ClusterNetworkPolicy, dir: Direction, index: usize) -> String {
    use palisade_apis::cluster_network_policy::Effective;
    let (list, word) = match dir {
        Direction::Ingress => ("ingress", "from"),
        Direction::Egress => ("egress", "to"),
    };
    let rule = &tiers::rules(policy, dir)[index];
    let name = if rule.name.is_empty() {
        String::new()
    } else {
        format!(" {:?}", rule.name)
    };
    let peers = rule
        .peers
        .iter()
        .map(describe_tier_peer)
        .collect::<Vec<_>>()
        .join("; ");
    let ports = match &rule.ports {
        None => "any port".to_string(),
        Some(ports) => ports
            .iter()
            .map(describe_port_match)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let closed = match rule.effective() {
        Effective::AsWritten(_) => "",
        Effective::DenyAll => " (a part cannot be read: fails closed, denies everything)",
        Effective::Nothing => " (a part cannot be read: fails closed, matches nothing)",
    };
    format!(
        "{list}[{index}]{name}: {} {word} {peers} on {ports}{closed}",
        rule.action.as_str()
    )
}

fn describe_tier_peer(p: &palisade_apis::Peer) -> String {
    use palisade_apis::Peer as P;
    match p {
        P::Namespaces(s) => format!("namespaces{}", describe_selector(s)),
        P::Pods(p) => format!(
            "pods{} in namespaces{}",
            describe_selector(&p.pods),
            describe_selector(&p.namespaces)
        ),
        P::Networks(nets) => format!(
            "networks {}",
            nets.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        P::Nodes(s) => format!("nodes{}", describe_selector(s)),
        P::DomainNames(names) => format!("domainNames {}", names.join(",")),
        P::Unknown => "a peer this version cannot read".into(),
    }
}

fn describe_port_match(p: &PortMatch) -> String {
    match p {
        PortMatch::Protocol(proto) => format!("{}/any", proto.as_str()),
        PortMatch::Ports {
            protocol,
            start,
            end,
        } if start == end => format!("{}/{start}", protocol.as_str()),
        PortMatch::Ports {
            protocol,
            start,
            end,
        } => format!("{}/{start}-{end}", protocol.as_str()),
        PortMatch::Named(name) => format!("named port {name}"),
        PortMatch::Unknown => "a protocol entry this version cannot read".into(),
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
    format!(
        "{list}[{index}]: {word} {peers} on {}",
        describe_ports(ports)
    )
}

/// An egress rule's peers by name as one line: `egress[1]: to
/// domainNames api.example.com, *.example.org on TCP/443`.
fn describe_names_rule(
    index: usize,
    names: &[String],
    ports: Option<&Vec<NetworkPolicyPort>>,
) -> String {
    format!(
        "egress[{index}]: to domainNames {} on {}",
        names.join(", "),
        describe_ports(ports)
    )
}

/// A rule's ports as one phrase: `TCP/80, UDP/dns`, or `any port`.
fn describe_ports(ports: Option<&Vec<NetworkPolicyPort>>) -> String {
    match ports.filter(|p| !p.is_empty()) {
        None => "any port".to_string(),
        Some(ports) => ports
            .iter()
            .map(describe_port)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn describe_peer(p: &NetworkPolicyPeer) -> String {
    if *p == palisade_apis::application_network_policy::never_peer() {
        // An ApplicationNetworkPolicy rule whose peers are all domain
        // names: what they resolve to only the node knows.
        return "no address (domainNames only)".to_string();
    }
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
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]}]},
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
    fn staged_policies_are_left_out_of_the_answer_and_said_to_change_it() {
        let mut c = cluster();
        let deny_all: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lock", "namespace": "x",
                         "annotations": {"palisade.io/audit": "true"}},
            "spec": {"podSelector": {}}
        }))
        .unwrap();
        let allow_22: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ssh", "namespace": "x",
                         "annotations": {"palisade.io/audit": "true"}},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                     "ingress": [{"ports": [{"port": 22}]}]}
        }))
        .unwrap();
        c.policies.push(deny_all);
        c.policies.push(allow_22);
        let (web, client) = (c.pods[1].clone(), c.pods[0].clone());
        let peer = Peer::Pod(Endpoint {
            pod: &client,
            ip: "10.0.0.2".parse().unwrap(),
        });
        // The client is not isolated now; the staged lock would deny it.
        let ask = |subject: &Pod, port| {
            (
                explain_direction(
                    &c,
                    subject,
                    peer,
                    Some(&web),
                    "TCP",
                    port,
                    Direction::Ingress,
                ),
                staged_change(
                    &c,
                    subject,
                    peer,
                    Some(&web),
                    "TCP",
                    port,
                    Direction::Ingress,
                ),
            )
        };
        let (now, staged) = ask(&client, 80);
        assert_eq!(now, Decision::NotIsolated);
        assert_eq!(
            staged,
            Some(Decision::Denied {
                isolated_by: vec!["x/lock".into()]
            })
        );
        // web: denied on 22 from the client now (x/web's rule 0 is an
        // ipBlock), the staged ssh policy would allow it.
        let (now, staged) = ask(&web, 22);
        assert!(!now.allowed(), "{now:?}");
        assert!(
            matches!(&staged, Some(Decision::Allowed(r)) if r.policy == "x/ssh"),
            "{staged:?}"
        );
        // Allowed now and with the staged policies: nothing to say.
        assert_eq!(ask(&web, 8080).1, None);
        // The reference verdict the datapath is tested against agrees: the
        // staged lock isolates nobody.
        let client_ep = Endpoint {
            pod: &client,
            ip: "10.0.0.2".parse().unwrap(),
        };
        assert!(crate::verdict::allowed(&c, client_ep, client_ep, "TCP", 80));
        // Any other value than "true" is enforced.
        c.policies[1]
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(AUDIT_ANNOTATION.into(), "True".into());
        let now = explain_direction(&c, &client, peer, Some(&web), "TCP", 80, Direction::Ingress);
        assert!(!now.allowed());
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
