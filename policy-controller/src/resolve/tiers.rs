//! ClusterNetworkPolicy (Admin and Baseline tiers, both API groups): which
//! policies apply to a pod, and their rules as plan tier rules.
//!
//! A rule is resolved by NetworkPolicy's own rule code (`rules.rs`): its
//! peers and ports are written once, when the policy is read, as
//! NetworkPolicy peers and ports ([`TieredPolicy::new`]): `namespaces` as a
//! namespaceSelector, `pods` as a namespaceSelector and a podSelector, a
//! named port as that name under each protocol (a ClusterNetworkPolicy's
//! named port has none). `networks` and `nodes` are address blocks, the
//! nodes' read at resolution time. So selections, named ports and Service
//! ClusterIPs mean the same in every tier, and the engine shares its
//! selections between NetworkPolicies and ClusterNetworkPolicies.
//!
//! The one difference is Services: an egress rule that matches a Service's
//! backends also matches its ClusterIP (the client's hook sees the
//! ClusterIP). An Accept or Pass rule does so only when it matches every
//! backend (as NetworkPolicy does: narrower, never wider); a Deny rule as
//! soon as it matches one, since the kernel may pick that one.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use palisade_apis::cluster_network_policy::Effective;
use palisade_apis::{Action, ClusterNetworkPolicy, Peer, PortMatch, Protocol, Subject, Tier};
use palisade_proto::v1::{Rule, TierAction, TierRule};

use super::objects::PodInfo;
use super::peers::PeerSelection;
use super::rules::{Path, RuleContext, ServiceCoverage};
use super::selector_matches;

/// A ClusterNetworkPolicy with its rules written as NetworkPolicy peers and
/// ports, made once per object: the engine's selection cache knows a peer
/// by its address for the length of a recompute.
#[derive(Debug)]
pub(crate) struct TieredPolicy {
    pub policy: ClusterNetworkPolicy,
    /// As operators name it (`ClusterNetworkPolicy/NAME`, ...).
    pub id: String,
    pub ingress: Vec<TierRuleSpec>,
    pub egress: Vec<TierRuleSpec>,
}

#[derive(Debug)]
pub(crate) struct TierRuleSpec {
    pub action: Action,
    pub name: String,
    pub matches: Matches,
}

#[derive(Debug)]
pub(crate) enum Matches {
    /// The rule as written: pods selected by `selectors`, addresses in
    /// `networks` or of nodes `nodes` selects, or that the pod resolved a
    /// name of `domains` to (patterns as the plan carries them), on
    /// `ports` (None: all).
    Written {
        selectors: Vec<NetworkPolicyPeer>,
        networks: Vec<String>,
        nodes: Vec<LabelSelector>,
        domains: Vec<String>,
        ports: Option<Vec<NetworkPolicyPort>>,
    },
    /// Fails closed: every address, every port (see `Rule::effective`).
    Everything,
    /// Fails closed: nothing.
    Nothing,
}

impl TieredPolicy {
    pub fn new(policy: ClusterNetworkPolicy) -> Self {
        let spec = |rules: &[palisade_apis::Rule]| -> Vec<TierRuleSpec> {
            rules
                .iter()
                .map(|r| TierRuleSpec {
                    action: match r.effective() {
                        Effective::DenyAll => Action::Deny,
                        _ => r.action,
                    },
                    name: r.name.clone(),
                    matches: match r.effective() {
                        Effective::AsWritten(r) => written(r),
                        Effective::DenyAll => Matches::Everything,
                        Effective::Nothing => Matches::Nothing,
                    },
                })
                .collect()
        };
        TieredPolicy {
            id: policy.id(),
            ingress: spec(&policy.ingress),
            egress: spec(&policy.egress),
            policy,
        }
    }

    /// Whether the policy applies to `pod`, whose namespace has `ns_labels`.
    /// Host-network pods are never subjects.
    pub fn selects(
        &self,
        pod: &PodInfo,
        ns_labels: &BTreeMap<String, String>,
    ) -> Result<bool, String> {
        if pod.host_network || !self.selects_namespace(ns_labels)? {
            return Ok(false);
        }
        self.selects_in_namespace(pod)
    }

    /// The half of [`Self::selects`] that reads only the namespace: whether
    /// its subject may select pods of a namespace with `ns_labels` (false:
    /// none of them, and their labels are not read).
    pub fn selects_namespace(&self, ns_labels: &BTreeMap<String, String>) -> Result<bool, String> {
        match &self.policy.subject {
            Subject::Namespaces(s) => {
                selector_matches(s, ns_labels).map_err(|e| format!("spec.subject: namespaces: {e}"))
            }
            Subject::Pods(p) => selector_matches(&p.namespaces, ns_labels)
                .map_err(|e| format!("spec.subject.pods.namespaceSelector: {e}")),
            Subject::Unknown => Ok(false),
        }
    }

    /// The namespace selector of its subject (None: it selects nothing).
    pub fn namespace_selector(&self) -> Option<&LabelSelector> {
        match &self.policy.subject {
            Subject::Namespaces(s) => Some(s),
            Subject::Pods(p) => Some(&p.namespaces),
            Subject::Unknown => None,
        }
    }

    /// The other half: whether it selects `pod` of a namespace it selects.
    pub fn selects_in_namespace(&self, pod: &PodInfo) -> Result<bool, String> {
        match &self.policy.subject {
            _ if pod.host_network => Ok(false),
            Subject::Namespaces(_) => Ok(true),
            Subject::Pods(p) => selector_matches(&p.pods, &pod.labels)
                .map_err(|e| format!("spec.subject.pods.podSelector: {e}")),
            Subject::Unknown => Ok(false),
        }
    }

    /// Whether its rules read the target's own named ports (an ingress
    /// rule with a named port): otherwise they resolve alike for every pod
    /// it selects, and an engine may resolve them once per pass.
    pub fn reads_target_ports(&self) -> bool {
        self.ingress.iter().any(|r| {
            matches!(&r.matches, Matches::Written { ports: Some(ports), .. }
                if ports.iter().any(|p| matches!(p.port, Some(IntOrString::String(_)))))
        })
    }

    /// Whether a rule has a `nodes` peer (its pods read the nodes).
    pub fn reads_nodes(&self) -> bool {
        self.ingress
            .iter()
            .chain(&self.egress)
            .any(|r| matches!(&r.matches, Matches::Written { nodes, .. } if !nodes.is_empty()))
    }
}

fn written(r: &palisade_apis::Rule) -> Matches {
    let mut selectors = Vec::new();
    let mut networks = Vec::new();
    let mut nodes = Vec::new();
    let mut domains = Vec::new();
    for peer in &r.peers {
        match peer {
            Peer::Namespaces(ns) => selectors.push(NetworkPolicyPeer {
                namespace_selector: Some(ns.clone()),
                ..Default::default()
            }),
            Peer::Pods(p) => selectors.push(NetworkPolicyPeer {
                namespace_selector: Some(p.namespaces.clone()),
                pod_selector: Some(p.pods.clone()),
                ..Default::default()
            }),
            Peer::Networks(nets) => networks.extend(nets.iter().map(|n| n.to_string())),
            Peer::Nodes(sel) => nodes.push(sel.clone()),
            // Lower-cased, no trailing dot. A name the API's pattern admits
            // but DNS does not (a label over 63 bytes) can never be
            // resolved: it is left out, and matches nothing.
            Peer::DomainNames(names) => domains.extend(
                names
                    .iter()
                    .filter_map(|n| n.parse::<palisade_dns::Pattern>().ok())
                    .map(|p| p.to_string()),
            ),
            // `effective` made a rule with one of these Everything or Nothing.
            Peer::Unknown => {}
        }
    }
    let ports = r.ports.as_ref().map(|ports| {
        ports
            .iter()
            .flat_map(|p| match p {
                PortMatch::Protocol(proto) => vec![np_port(*proto, None, None)],
                PortMatch::Ports {
                    protocol,
                    start,
                    end,
                } => vec![np_port(
                    *protocol,
                    Some(IntOrString::Int(i32::from(*start))),
                    (end != start).then_some(i32::from(*end)),
                )],
                // A ClusterNetworkPolicy's named port has no protocol: the
                // container port of that name, whichever it has.
                PortMatch::Named(name) => [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
                    .into_iter()
                    .map(|proto| np_port(proto, Some(IntOrString::String(name.clone())), None))
                    .collect(),
                PortMatch::Unknown => vec![],
            })
            .collect()
    });
    domains.sort();
    domains.dedup();
    Matches::Written {
        selectors,
        networks,
        nodes,
        domains,
        ports,
    }
}

fn np_port(proto: Protocol, port: Option<IntOrString>, end: Option<i32>) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(proto.as_str().to_string()),
        port,
        end_port: end,
    }
}

fn tier_action(a: Action) -> TierAction {
    match a {
        Action::Accept => TierAction::Accept,
        Action::Deny => TierAction::Deny,
        Action::Pass => TierAction::Pass,
    }
}

/// Every address, in both families.
fn everything() -> Vec<palisade_proto::v1::PeerBlock> {
    vec![
        super::block(
            crate::cidr::prefix("0.0.0.0/0".parse().expect("a CIDR")),
            vec![],
        ),
        super::block(crate::cidr::prefix("::/0".parse().expect("a CIDR")), vec![]),
    ]
}

/// Which tier a direction's rules go to, and whether they are staged.
pub(super) struct Placement {
    pub tier: Tier,
    pub staged: bool,
}

/// A ClusterNetworkPolicy's rules for one target, both directions, as tier
/// rules in rule order.
#[derive(Clone, Debug, Default)]
pub(crate) struct TierRules {
    pub ingress: Vec<TierRule>,
    pub egress: Vec<TierRule>,
}

impl TieredPolicy {
    /// The policy's rules for `target` (see [`Self::reads_target_ports`]
    /// for what of the target they read).
    pub(crate) fn rules_for(
        &self,
        target: &PodInfo,
        selection: &mut dyn PeerSelection,
        errors: &mut Vec<String>,
    ) -> TierRules {
        TierRules {
            ingress: self.tier_rules(true, target, &mut *selection, &mut *errors),
            egress: self.tier_rules(false, target, selection, errors),
        }
    }

    /// The policy's rules for one direction of `target`, as tier rules in
    /// rule order (one policy rule may give several, consecutive).
    fn tier_rules(
        &self,
        ingress: bool,
        target: &PodInfo,
        selection: &mut dyn PeerSelection,
        errors: &mut Vec<String>,
    ) -> Vec<TierRule> {
        let (specs, key) = if ingress {
            (&self.ingress, "ingress")
        } else {
            (&self.egress, "egress")
        };
        let mut out = Vec::new();
        for (index, spec) in specs.iter().enumerate() {
            let field = Path {
                parent: &"spec",
                key,
                index,
            };
            let (rules, by_name): (Vec<Rule>, Option<Rule>) = match &spec.matches {
                Matches::Nothing => (vec![], None),
                Matches::Everything => (
                    vec![Rule {
                        peers: everything(),
                        ..Default::default()
                    }],
                    None,
                ),
                written @ Matches::Written { .. } => self.written_rules(
                    &field,
                    ingress,
                    spec.action,
                    written,
                    target,
                    &mut *selection,
                    &mut *errors,
                ),
            };
            let tier_rule = |r: Rule, domain_names: Vec<String>| TierRule {
                action: tier_action(spec.action) as i32,
                peers: r.peers,
                ports: r.ports,
                policy: self.id.clone(),
                priority: self.policy.priority,
                rule_index: index as u32,
                rule_name: spec.name.clone(),
                domain_names,
            };
            out.extend(rules.into_iter().map(|r| tier_rule(r, vec![])));
            if let (Some(r), Matches::Written { domains, .. }) = (by_name, &spec.matches) {
                out.push(tier_rule(r, domains.clone()));
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn written_rules(
        &self,
        field: &dyn std::fmt::Display,
        ingress: bool,
        action: Action,
        matches: &Matches,
        target: &PodInfo,
        selection: &mut dyn PeerSelection,
        errors: &mut Vec<String>,
    ) -> (Vec<Rule>, Option<Rule>) {
        let Matches::Written {
            selectors,
            networks,
            nodes,
            domains,
            ports,
        } = matches
        else {
            return (vec![], None);
        };
        let ports = ports.as_deref();
        // Rules with ports that are all unknown match nothing (fail closed
        // for an Accept; a Deny or Pass with one was made Everything).
        if ports.is_some_and(<[_]>::is_empty) {
            return (vec![], None);
        }
        // Address blocks: the networks, and the nodes' addresses now.
        let mut blocks: Vec<NetworkPolicyPeer> =
            networks.iter().map(|cidr| ip_peer(cidr.clone())).collect();
        for (i, sel) in nodes.iter().enumerate() {
            match selection.node_addresses(sel) {
                Ok(ips) => blocks.extend(ips.into_iter().map(|ip| {
                    let len = if ip.is_ipv4() { 32 } else { 128 };
                    ip_peer(format!("{ip}/{len}"))
                })),
                Err(e) => errors.push(format!("{}: {field}.to: nodes[{i}]: {e}", self.id)),
            }
        }
        let mut ctx = RuleContext {
            selection: &mut *selection,
            // Selector peers always carry a namespaceSelector: the policy's
            // namespace is never read.
            policy_ns: "",
            label: &self.id,
            errors: &mut *errors,
            services: match action {
                Action::Deny => ServiceCoverage::Any,
                Action::Accept | Action::Pass => ServiceCoverage::Every,
            },
        };
        let mut rules = Vec::new();
        // Two calls when a rule has both kinds of peers: its selector peers
        // live in the policy (see `TieredPolicy`), the blocks only here.
        // Consecutive rules of one action match what the one rule matches.
        for peers in [selectors, blocks.as_slice()] {
            if peers.is_empty() {
                continue;
            }
            rules.extend(if ingress {
                ctx.ingress_rule(field, Some(peers), ports, target)
            } else {
                ctx.egress_rule(field, Some(peers), ports)
            });
        }
        // The names part: its ports, numbered (the API refuses named ports
        // beside domainNames; one here drops the part, failing closed).
        let by_name = if domains.is_empty() || ingress {
            None
        } else {
            ctx.numbered_ports(field, ports).map(|ports| Rule {
                ports,
                ..Default::default()
            })
        };
        (rules, by_name)
    }
}

fn ip_peer(cidr: String) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock { cidr, except: None }),
        ..Default::default()
    }
}

/// Where a policy's rules go.
pub(super) fn placement(p: &TieredPolicy, errors: &mut Vec<String>) -> Placement {
    Placement {
        tier: p.policy.tier,
        staged: super::staging::staged_by(Some(&p.policy.annotations), &p.id, errors),
    }
}

/// The nodes' addresses a `nodes` peer selects: those in
/// `status.addresses` that are addresses (not host names).
pub(crate) fn node_ips(node: &k8s_openapi::api::core::v1::Node) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| a.address.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}
