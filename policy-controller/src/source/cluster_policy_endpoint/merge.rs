//! The slices of one ClusterNetworkPolicy, unioned into what the engine
//! enforces for it: the pods it applies to and its tier rules.
//!
//! Rule order. A slice does not say which rule an entry came from, nor in
//! what order the rules were written (see the module above). Where two
//! entries of one policy with different actions cover the same traffic,
//! the documented semantics (the first matching rule decides) cannot be
//! followed, so the policy is read fail closed: its Deny entries first,
//! then its Pass entries, then its Accept entries. That is the narrowest
//! reading of any order the rules could have had (a Pass can only lead to
//! what the next tier allows, an Accept allows), and it differs from the
//! AWS node agent, which ranks Deny, Accept, Pass, only where one policy
//! both passes and accepts the same traffic (there the agent accepts and
//! Palisade passes it on). Entries of one action are unioned: their order
//! never matters.
//!
//! Bad input never widens what is allowed. An entry that cannot be read (a
//! malformed CIDR, an unknown protocol, a port out of range) is dropped
//! when it accepts, and denies every address on every port when it denies
//! or passes (as a ClusterNetworkPolicy rule this version cannot read
//! does); either way with an error naming the object and the field. An
//! Accept `domainName` entry goes to the plan as a tier rule of names
//! (after the addresses of the same tier, priority, action and ports),
//! which matches what the pod resolved those names to; a Deny or Pass one
//! (which the schema's CEL refuses upstream of here) is read as
//! unreadable: it denies everything.
//!
//! A policy applies to the pods its slices list and to the pods its
//! `subject` (which every slice carries) selects, so that a new pod is
//! under it before the AWS controller lists it; host-network pods never are
//! (as for a ClusterNetworkPolicy). Slices that disagree on the tier,
//! priority or subject (the AWS controller rewrites them one at a time when
//! the policy changes) keep each its own: every slice's entries are placed
//! by its own tier and priority, and the subjects are unioned, with an
//! error until they agree.

use std::collections::{BTreeMap, BTreeSet};

use palisade_apis::{wire, Action, ClusterNetworkPolicy, Subject, Tier};
use palisade_proto::v1::{IpPrefix, PortRange, TierAction, TierRule};

use super::{display_name, ClusterEndpointInfo, ClusterPolicyEndpointSpec};
use crate::cidr::{self, prefix};
use crate::keys::PodKey;
use crate::resolve::{block, selector_matches, validate_selector, PodInfo};
use crate::source::policy_endpoint::merge::parse_port;

/// One ClusterNetworkPolicy as its slices define it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterEndpointPolicy {
    /// The ClusterNetworkPolicy's name.
    pub name: String,
    /// As operators name it: `ClusterNetworkPolicy.networking.k8s.aws/NAME`.
    pub id: String,
    /// The pods the slices list.
    pub pods: BTreeSet<PodKey>,
    /// The first tier and priority of its slices (they agree but while
    /// the AWS controller rewrites them): where the policy is named among
    /// a pod's policies.
    pub precedence: Option<(Tier, u32)>,
    /// The slices' subjects (readable ones; distinct).
    pub subjects: Vec<Subject>,
    /// Tier rules in the policy's own order (see the module doc).
    pub ingress: Vec<Placed>,
    pub egress: Vec<Placed>,
    pub errors: Vec<String>,
}

/// A tier rule and the tier it goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub tier: Tier,
    pub rule: TierRule,
}

impl Placed {
    /// Where the rule goes among every ClusterNetworkPolicy's rules of a
    /// pod: tier, priority, the policy's name, then Deny, Pass, Accept.
    pub fn order<'a>(&self, policy: &'a str) -> (Tier, u32, &'a str, u8) {
        (
            self.tier,
            self.rule.priority,
            policy,
            rank(self.rule.action),
        )
    }
}

/// Deny, then Pass, then Accept.
fn rank(action: i32) -> u8 {
    match TierAction::try_from(action) {
        Ok(TierAction::Accept) => 2,
        Ok(TierAction::Pass) => 1,
        _ => 0,
    }
}

impl ClusterEndpointPolicy {
    /// Whether the policy applies to `pod`, whose namespace has
    /// `ns_labels`.
    pub(crate) fn selects(&self, pod: &PodInfo, ns_labels: &BTreeMap<String, String>) -> bool {
        if pod.host_network {
            return false;
        }
        self.pods.contains(&pod.key())
            || self.subjects.iter().any(|s| match s {
                Subject::Namespaces(ns) => selector_matches(ns, ns_labels).unwrap_or(false),
                Subject::Pods(p) => {
                    selector_matches(&p.namespaces, ns_labels).unwrap_or(false)
                        && selector_matches(&p.pods, &pod.labels).unwrap_or(false)
                }
                Subject::Unknown => false,
            })
    }

    /// Whether a subject reads namespace labels (then a relabelled
    /// namespace may move pods in or out).
    pub fn reads_namespaces(&self) -> bool {
        !self.subjects.is_empty()
    }
}

/// What every slice of a policy should carry alike: tier, priority,
/// subject.
type Header = (Tier, u32, Subject);

/// One slice: its name and its parsed spec.
pub type Slice<'a> = (&'a str, &'a ClusterPolicyEndpointSpec);

/// The tier, priority and subject a slice carries, read as a
/// ClusterNetworkPolicy's are (an unknown tier as Admin, a priority out of
/// range as the nearest end).
fn header(spec: &ClusterPolicyEndpointSpec) -> Header {
    let p = ClusterNetworkPolicy::from_aws(&wire::AwsClusterNetworkPolicy {
        spec: wire::AwsSpec {
            tier: spec.tier.clone(),
            priority: spec.priority,
            subject: spec.subject.clone(),
            ingress: None,
            egress: None,
        },
        ..Default::default()
    });
    (p.tier, p.priority, p.subject)
}

/// Unions the slices of the ClusterNetworkPolicy `policy`. The slices must
/// all refer to it; which slice holds what does not matter.
pub fn merge_slices(policy: &str, slices: &[Slice<'_>]) -> ClusterEndpointPolicy {
    let id = format!("ClusterNetworkPolicy.networking.k8s.aws/{policy}");
    let mut out = ClusterEndpointPolicy {
        name: policy.to_string(),
        id: id.clone(),
        ..Default::default()
    };
    let mut headers: Vec<(Header, Vec<&str>)> = Vec::new();
    let mut ingress = Entries::default();
    let mut egress = Entries::default();
    for (slice, spec) in slices {
        let display = display_name(slice);
        let (tier, priority, subject) = header(spec);
        let place = (tier, priority);
        let h = (tier, priority, subject.clone());
        match headers.iter_mut().find(|(x, _)| *x == h) {
            Some((_, names)) => names.push(slice),
            None => headers.push((h, vec![slice])),
        }
        let readable = match &subject {
            Subject::Namespaces(s) => validate_selector(s).map_err(|e| ("namespaces", e)),
            Subject::Pods(p) => validate_selector(&p.namespaces)
                .map_err(|e| ("pods.namespaceSelector", e))
                .and_then(|()| validate_selector(&p.pods).map_err(|e| ("pods.podSelector", e))),
            Subject::Unknown => Ok(()),
        };
        match readable {
            Err((field, e)) => out.errors.push(format!(
                "{display}: spec.subject.{field}: {e}; only the listed pods are selected"
            )),
            Ok(()) => {
                if !out.subjects.contains(&subject) {
                    out.subjects.push(subject);
                }
            }
        }
        for (i, pod) in spec.pod_selector_endpoints.iter().flatten().enumerate() {
            let field = format!("spec.podSelectorEndpoints[{i}]");
            if pod.name.is_empty() || pod.namespace.is_empty() {
                let missing = if pod.name.is_empty() {
                    "name"
                } else {
                    "namespace"
                };
                out.errors.push(format!(
                    "{display}: {field}.{missing}: missing; entry ignored"
                ));
            } else {
                out.pods.insert((pod.namespace.clone(), pod.name.clone()));
            }
        }
        for (key, list, into) in [
            ("ingress", &spec.ingress, &mut ingress),
            ("egress", &spec.egress, &mut egress),
        ] {
            for (i, entry) in list.iter().flatten().enumerate() {
                let field = format!("{display}: spec.{key}[{i}]");
                into.add(place, entry, &field, &mut out.errors);
            }
        }
    }
    out.precedence = headers.iter().map(|((t, p, _), _)| (*t, *p)).min();
    if headers.len() > 1 {
        let groups: Vec<String> = headers
            .iter()
            .map(|((tier, priority, subject), slices)| {
                format!(
                    "{} {priority} {} in {}",
                    tier.as_str(),
                    subject_text(subject),
                    slices.join(", ")
                )
            })
            .collect();
        out.errors.push(format!(
            "{id}: its ClusterPolicyEndpoints disagree on tier, priority or subject ({}); \
             each slice's entries are placed by its own, and the subjects are unioned",
            groups.join("; ")
        ));
    }
    out.ingress = ingress.rules(&id);
    out.egress = egress.rules(&id);
    out.errors.sort();
    out.errors.dedup();
    out
}

fn subject_text(s: &Subject) -> String {
    let sel = |s| serde_json::to_string(s).unwrap_or_default();
    match s {
        Subject::Namespaces(ns) => format!("namespaces {}", sel(ns)),
        Subject::Pods(p) => format!("pods {} {}", sel(&p.namespaces), sel(&p.pods)),
        Subject::Unknown => "no subject".to_string(),
    }
}

/// PortRange and PeerBlock are prost messages without Ord.
type PortKey = (i32, u32, u32);
type BlockKey = (Vec<u8>, u32);
/// (tier, priority, rank, ports): the entries that become one tier rule.
type RuleKey = (Tier, u32, u8, Vec<PortKey>);

/// The entries of one direction, grouped into tier rules: one per tier,
/// priority, action and port set, holding every address with them, and one
/// more for the names with them.
#[derive(Default)]
struct Entries(BTreeMap<RuleKey, Peers>);

#[derive(Default)]
struct Peers {
    blocks: BTreeSet<BlockKey>,
    /// Domain name patterns, as the plan carries them.
    names: BTreeSet<String>,
}

impl Entries {
    fn add(
        &mut self,
        (tier, priority): (Tier, u32),
        entry: &ClusterEndpointInfo,
        field: &str,
        errors: &mut Vec<String>,
    ) {
        let action = match entry.action.as_str() {
            "Accept" => Action::Accept,
            "Pass" => Action::Pass,
            // The schema admits only these three.
            _ => Action::Deny,
        };
        let parsed = parse_entry(entry).and_then(|(peer, ports)| match peer {
            EntryPeer::Name(_) if action != Action::Accept => Err(format!(
                ".domainName: {:?}: only an Accept can name a domain",
                entry.domain_name.as_deref().unwrap_or_default()
            )),
            peer => Ok((peer, ports)),
        });
        match parsed {
            Ok((peer, ports)) => {
                let mut ports: Vec<PortKey> = ports
                    .into_iter()
                    .map(|p| (p.protocol, p.port, p.end_port))
                    .collect();
                ports.sort();
                ports.dedup();
                let r = rank(tier_action(action) as i32);
                let peers = self.0.entry((tier, priority, r, ports)).or_default();
                match peer {
                    EntryPeer::Block(cidr) => peers.blocks.insert((cidr.addr, cidr.prefix_len)),
                    EntryPeer::Name(pattern) => peers.names.insert(pattern),
                };
            }
            Err(why) => {
                if action == Action::Accept {
                    errors.push(format!("{field}{why}; entry ignored"));
                    return;
                }
                errors.push(format!(
                    "{field}{why}; this {} denies every address instead",
                    action.as_str()
                ));
                let all = self.0.entry((tier, priority, 0, Vec::new())).or_default();
                for net in ["0.0.0.0/0", "::/0"] {
                    let p = prefix(net.parse().expect("a CIDR"));
                    all.blocks.insert((p.addr, p.prefix_len));
                }
            }
        }
    }

    fn rules(self, id: &str) -> Vec<Placed> {
        let mut out = Vec::new();
        for ((tier, priority, r, ports), peers) in self.0 {
            let rule = |peers: Vec<_>, domain_names: Vec<String>| Placed {
                tier,
                rule: TierRule {
                    action: match r {
                        0 => TierAction::Deny,
                        1 => TierAction::Pass,
                        _ => TierAction::Accept,
                    } as i32,
                    peers,
                    ports: ports
                        .iter()
                        .map(|&(protocol, port, end_port)| PortRange {
                            protocol,
                            port,
                            end_port,
                        })
                        .collect(),
                    policy: id.to_string(),
                    priority,
                    domain_names,
                    // A slice does not say which rule an entry came from.
                    rule_index: 0,
                    rule_name: String::new(),
                },
            };
            if !peers.blocks.is_empty() {
                let blocks = peers.blocks.into_iter();
                out.push(rule(
                    blocks
                        .map(|(addr, prefix_len)| block(IpPrefix { addr, prefix_len }, vec![]))
                        .collect(),
                    vec![],
                ));
            }
            if !peers.names.is_empty() {
                out.push(rule(vec![], peers.names.into_iter().collect()));
            }
        }
        out
    }
}

fn tier_action(a: Action) -> TierAction {
    match a {
        Action::Accept => TierAction::Accept,
        Action::Deny => TierAction::Deny,
        Action::Pass => TierAction::Pass,
    }
}

/// What an entry matches: an address block, or the addresses a pod
/// resolved a name to (the pattern as the plan carries it).
enum EntryPeer {
    Block(IpPrefix),
    Name(String),
}

/// An entry's peer and ports; the error starts with the field below the
/// entry (".cidr: ...").
fn parse_entry(entry: &ClusterEndpointInfo) -> Result<(EntryPeer, Vec<PortRange>), String> {
    let peer = match (&entry.cidr, &entry.domain_name) {
        (Some(c), _) if !c.is_empty() => EntryPeer::Block(prefix(
            cidr::parse_strict_or_address(c).map_err(|e| format!(".cidr: {e}"))?,
        )),
        (_, Some(d)) if !d.is_empty() => EntryPeer::Name(
            d.parse::<palisade_dns::Pattern>()
                .map_err(|e| format!(".domainName: {e}"))?
                .to_string(),
        ),
        _ => return Err(".cidr: missing (and no domainName)".to_string()),
    };
    let mut ports = Vec::new();
    for (i, p) in entry.ports.iter().flatten().enumerate() {
        ports.push(parse_port(p).map_err(|e| format!(".ports[{i}]{e}"))?);
    }
    Ok((peer, ports))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::cluster_policy_endpoint::parse_spec;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ClusterPolicyEndpointSpec {
        parse_spec("s", &v).unwrap()
    }

    fn base(extra: serde_json::Value) -> serde_json::Value {
        let mut v = json!({"policyRef": {"name": "p"}, "tier": "Admin", "priority": 5,
                           "subject": {"namespaces": {"matchLabels": {"team": "a"}}}});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    fn actions(rules: &[Placed]) -> Vec<(TierAction, usize, usize)> {
        rules
            .iter()
            .map(|p| {
                (
                    TierAction::try_from(p.rule.action).unwrap(),
                    p.rule.peers.len(),
                    p.rule.ports.len(),
                )
            })
            .collect()
    }

    #[test]
    fn entries_become_tier_rules_deny_then_pass_then_accept() {
        let a = spec(base(json!({
            "podSelectorEndpoints": [{"name": "x", "namespace": "ns", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}],
            "ingress": [
                {"action": "Accept", "cidr": "10.0.0.9"},
                {"action": "Pass", "cidr": "10.0.0.8", "ports": [{"protocol": "TCP", "port": 80}]},
            ],
        })));
        let b = spec(base(json!({
            "ingress": [
                {"action": "Deny", "cidr": "10.0.0.7"},
                {"action": "Accept", "cidr": "10.0.0.6/32"},
                {"action": "Pass", "cidr": "10.0.0.5", "ports": [{"port": 80}]},
            ],
            "egress": [{"action": "Accept", "cidr": "::/0", "ports": [{"protocol": "UDP", "port": 53}]}],
        })));
        let p = merge_slices("p", &[("a", &a), ("b", &b)]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.id, "ClusterNetworkPolicy.networking.k8s.aws/p");
        assert_eq!(p.pods.len(), 1);
        assert_eq!(
            actions(&p.ingress),
            [
                (TierAction::Deny, 1, 0),
                (TierAction::Pass, 2, 1),
                (TierAction::Accept, 2, 0)
            ]
        );
        assert!(p
            .ingress
            .iter()
            .all(|r| r.tier == Tier::Admin && r.rule.priority == 5));
        assert_eq!(actions(&p.egress), [(TierAction::Accept, 1, 1)]);
    }

    #[test]
    fn unreadable_entries_fail_closed_with_an_error_naming_object_and_field() {
        let s = spec(base(json!({
            "ingress": [
                {"action": "Accept", "cidr": "10.0.0.300"},
                {"action": "Deny", "cidr": "10.0.0.1/24"},
                {"action": "Accept", "cidr": "10.0.0.2", "ports": [{"protocol": "ICMP"}]},
                {"action": "Accept", "cidr": "10.0.0.3"},
            ],
            "egress": [
                // The schema's pattern admits it; DNS does not (a 64-byte label).
                {"action": "Accept", "domainName": format!("{}.com", "a".repeat(64))},
                {"action": "Pass", "domainName": "example.org"},
            ],
        })));
        let p = merge_slices("p", &[("s", &s)]);
        let want = [
            "ClusterPolicyEndpoint s: spec.egress[0].domainName: \"aaaa",
            "ClusterPolicyEndpoint s: spec.egress[1].domainName: \"example.org\": only an Accept can name a domain; this Pass denies every address instead",
            "ClusterPolicyEndpoint s: spec.ingress[0].cidr: \"10.0.0.300\" is not an address",
            "ClusterPolicyEndpoint s: spec.ingress[1].cidr: \"10.0.0.1/24\" has host bits set",
            "ClusterPolicyEndpoint s: spec.ingress[2].ports[0].protocol: unknown protocol \"ICMP\"",
        ];
        assert_eq!(p.errors.len(), want.len(), "{:#?}", p.errors);
        for (got, want) in p.errors.iter().zip(want) {
            assert!(got.starts_with(want), "{got}\n  want {want}");
        }
        // The bad Deny denies everything; of the Accepts only the good one
        // is left.
        assert_eq!(
            actions(&p.ingress),
            [(TierAction::Deny, 2, 0), (TierAction::Accept, 1, 0)]
        );
        assert_eq!(actions(&p.egress), [(TierAction::Deny, 2, 0)]);
    }

    #[test]
    fn accepted_domain_names_follow_the_addresses_with_their_ports() {
        let s = spec(base(json!({
            "egress": [
                {"action": "Accept", "domainName": "API.example.com.", "ports": [{"protocol": "TCP", "port": 443}]},
                {"action": "Accept", "cidr": "192.0.2.1", "ports": [{"protocol": "TCP", "port": 443}]},
                {"action": "Accept", "domainName": "*.example.org"},
                {"action": "Accept", "domainName": "*.example.org"},
                {"action": "Deny", "cidr": "0.0.0.0/0"},
            ],
        })));
        let p = merge_slices("p", &[("s", &s)]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let shape: Vec<_> = p
            .egress
            .iter()
            .map(|r| {
                (
                    TierAction::try_from(r.rule.action).unwrap(),
                    r.rule.peers.len(),
                    r.rule.ports.len(),
                    r.rule.domain_names.clone(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                (TierAction::Deny, 1, 0, vec![]),
                (TierAction::Accept, 0, 0, vec!["*.example.org".to_string()]),
                (TierAction::Accept, 1, 1, vec![]),
                (
                    TierAction::Accept,
                    0,
                    1,
                    vec!["api.example.com".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn disagreeing_slices_keep_their_own_placement_and_union_subjects() {
        let a = spec(base(
            json!({"ingress": [{"action": "Deny", "cidr": "10.0.0.1"}]}),
        ));
        let b = spec(base(json!({
            "tier": "Baseline", "priority": 7,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
            "ingress": [{"action": "Deny", "cidr": "10.0.0.2"}],
        })));
        let p = merge_slices("p", &[("a", &a), ("b", &b)]);
        assert_eq!(p.subjects.len(), 2);
        let placed: Vec<(Tier, u32)> = p
            .ingress
            .iter()
            .map(|r| (r.tier, r.rule.priority))
            .collect();
        assert_eq!(placed, [(Tier::Admin, 5), (Tier::Baseline, 7)]);
        assert_eq!(p.errors.len(), 1);
        assert!(
            p.errors[0].starts_with(
                "ClusterNetworkPolicy.networking.k8s.aws/p: its ClusterPolicyEndpoints disagree \
                 on tier, priority or subject (Admin 5 namespaces {\"matchLabels\":{\"team\":\"a\"}} in a; \
                 Baseline 7 pods {} {\"matchLabels\":{\"app\":\"db\"}} in b)"
            ),
            "{:?}",
            p.errors
        );
    }

    #[test]
    fn listed_pods_and_the_subject_select_host_network_pods_never() {
        let s = spec(base(json!({
            "podSelectorEndpoints": [{"name": "x", "namespace": "other", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}],
        })));
        let p = merge_slices("p", &[("s", &s)]);
        let pod = |ns: &str, name: &str, host_network: bool| PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: BTreeMap::new(),
            node: None,
            host_network,
            ips: vec![],
            named_ports: BTreeMap::new(),
        };
        let team_a = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let none = BTreeMap::new();
        assert!(p.selects(&pod("other", "x", false), &none), "listed");
        assert!(p.selects(&pod("ns", "y", false), &team_a), "by subject");
        assert!(!p.selects(&pod("ns", "y", false), &none));
        assert!(!p.selects(&pod("other", "x", true), &none), "host network");
    }
}
