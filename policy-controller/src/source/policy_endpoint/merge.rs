//! The slices of one policy, unioned into what the engine enforces for it:
//! the pods it selects, the directions it isolates and the rules it adds.
//!
//! Bad input never widens what is allowed. An entry with a malformed CIDR,
//! an unknown protocol, a port out of range or an action other than Allow is
//! left out (its peers lose that grant only), with an error naming the
//! object and the field. An egress entry with a `domainName` goes to the
//! plan as a rule by name (with the names of the same ports), which matches
//! what the pod resolved those names to. Slices that disagree on `podIsolation` (the AWS
//! controller patches slices one at a time, so this is seen for a moment
//! during every change of policyTypes) isolate in the union of their
//! directions: isolation only ever removes traffic.
//!
//! A policy selects the pods its slices list and the pods its `podSelector`
//! (which every slice of a NetworkPolicy carries) matches in its namespace.
//! The list alone lags: the AWS controller adds a new pod to it only once
//! the pod has an address and the controller has caught up, and until then
//! the pod would run unisolated. Selecting by both isolates it from the
//! start, with the rules the policy gives every pod it selects.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use palisade_proto::v1::{PeerBlock, PortRange, Rule};

use super::{display_name, EndpointInfo, PolicyEndpointSpec, Port};
use crate::cidr::{self, prefix};
use crate::keys::{ObjectKey, PodKey};
use crate::resolve::{block, parse_protocol, selector_matches, validate_selector};

/// One policy as its slices define it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointPolicy {
    /// `namespace/name` of the NetworkPolicy the slices came from.
    pub name: String,
    /// The pods the slices list, all in the policy's namespace.
    pub pods: BTreeSet<PodKey>,
    /// The slices' podSelectors (valid ones; distinct).
    pub selectors: Vec<LabelSelector>,
    /// Some when the policy isolates its pods for ingress: the rules it adds.
    pub ingress: Option<Vec<Rule>>,
    pub egress: Option<Vec<Rule>>,
    pub errors: Vec<String>,
}

impl EndpointPolicy {
    /// Whether the policy selects a pod of its namespace, by name or by
    /// labels.
    pub fn selects(&self, pod: &PodKey, labels: &BTreeMap<String, String>) -> bool {
        self.pods.contains(pod)
            || self
                .selectors
                .iter()
                .any(|s| selector_matches(s, labels).unwrap_or(false))
    }
}

/// One slice: its name (in the policy's namespace) and its parsed spec.
pub type Slice<'a> = (&'a str, &'a PolicyEndpointSpec);

/// Unions the slices of the policy `policy` (namespace, name). The slices
/// must all refer to it; which slice holds what does not matter.
pub fn merge_slices(policy: &ObjectKey, slices: &[Slice<'_>]) -> EndpointPolicy {
    let (ns, name) = policy;
    let mut out = EndpointPolicy {
        name: format!("{ns}/{name}"),
        ..Default::default()
    };
    let mut isolation: BTreeMap<Vec<String>, Vec<&str>> = BTreeMap::new();
    let mut selectors: Vec<(LabelSelector, Vec<&str>)> = Vec::new();
    let mut ingress = Entries::default();
    let mut egress = Entries::default();
    let mut has_egress_entries = false;
    let mut isolates = (false, false);
    for (slice, spec) in slices {
        let display = display_name(ns, slice);
        let mut types: Vec<String> = spec.pod_isolation.clone().unwrap_or_default();
        types.sort();
        types.dedup();
        isolation.entry(types.clone()).or_default().push(slice);
        for (i, t) in types.iter().enumerate() {
            match t.as_str() {
                "Ingress" => isolates.0 = true,
                "Egress" => isolates.1 = true,
                other => {
                    out.errors.push(format!(
                        "{display}: spec.podIsolation[{i}]: unknown policy type {other:?} \
                         (want Ingress or Egress); isolating both directions"
                    ));
                    isolates = (true, true);
                }
            }
        }
        if let Some(sel) = &spec.pod_selector {
            match validate_selector(sel) {
                Err(e) => out.errors.push(format!(
                    "{display}: spec.podSelector: {e}; only the listed pods are selected"
                )),
                Ok(()) => match selectors.iter_mut().find(|(s, _)| s == sel) {
                    Some((_, names)) => names.push(slice),
                    None => selectors.push((sel.clone(), vec![slice])),
                },
            }
        }
        if spec.is_global == Some(true) {
            out.errors.push(format!(
                "{display}: spec.isGlobal: admin policies are not supported; \
                 only their Allow entries are enforced, as for a NetworkPolicy"
            ));
        }
        for (i, pod) in spec.pod_selector_endpoints.iter().flatten().enumerate() {
            let field = format!("spec.podSelectorEndpoints[{i}]");
            let pod_ns = if pod.namespace.is_empty() {
                ns.as_str()
            } else {
                pod.namespace.as_str()
            };
            if pod.name.is_empty() {
                out.errors
                    .push(format!("{display}: {field}.name: missing; entry ignored"));
            } else if pod_ns != ns {
                out.errors.push(format!(
                    "{display}: {field}.namespace: {pod_ns:?} is not the policy's namespace \
                     {ns:?}; entry ignored"
                ));
            } else {
                out.pods.insert((ns.clone(), pod.name.clone()));
            }
        }
        for (key, list, into) in [
            ("ingress", &spec.ingress, &mut ingress),
            ("egress", &spec.egress, &mut egress),
        ] {
            for (i, entry) in list.iter().flatten().enumerate() {
                let field = format!("spec.{key}[{i}]");
                match parse_entry(entry, key == "egress") {
                    Ok((peer, ports)) => into.add(peer, ports),
                    Err(e) => out
                        .errors
                        .push(format!("{display}: {field}{e}; entry ignored")),
                }
            }
        }
        has_egress_entries |= spec.egress.as_ref().is_some_and(|e| !e.is_empty());
    }
    if isolation.len() > 1 {
        let groups: Vec<String> = isolation
            .iter()
            .map(|(types, slices)| format!("[{}] in {}", types.join(", "), slices.join(", ")))
            .collect();
        out.errors.push(format!(
            "NetworkPolicy {}: its PolicyEndpoints disagree on podIsolation ({}); \
             isolating every direction any of them names",
            out.name,
            groups.join("; ")
        ));
    }
    if selectors.len() > 1 {
        let groups: Vec<String> = selectors
            .iter()
            .map(|(s, slices)| {
                format!(
                    "{} in {}",
                    serde_json::to_string(s).unwrap_or_default(),
                    slices.join(", ")
                )
            })
            .collect();
        out.errors.push(format!(
            "NetworkPolicy {}: its PolicyEndpoints disagree on podSelector ({}); \
             selecting the pods any of them matches",
            out.name,
            groups.join("; ")
        ));
    }
    out.selectors = selectors.into_iter().map(|(s, _)| s).collect();
    if isolation.contains_key(&Vec::new()) {
        // Without podIsolation, as NetworkPolicy defaults policyTypes:
        // ingress always, egress when there are egress rules.
        isolates.0 = true;
        isolates.1 |= has_egress_entries;
    }
    out.ingress = isolates.0.then(|| ingress.rules());
    out.egress = isolates.1.then(|| egress.rules());
    out.errors.sort();
    out.errors.dedup();
    out
}

/// The entries of one direction, grouped by their ports so that the peers
/// granted the same ports share one rule (and the names another).
#[derive(Default)]
struct Entries(BTreeMap<Vec<PortKey>, Peers>);

#[derive(Default)]
struct Peers {
    blocks: BTreeSet<BlockKey>,
    /// Domain name patterns, as the plan carries them.
    names: BTreeSet<String>,
}

/// What an entry grants: an address block, or the addresses a pod resolved
/// a name to.
enum EntryPeer {
    Block(PeerBlock),
    Name(String),
}

/// PortRange and PeerBlock are prost messages without Ord.
type PortKey = (i32, u32, u32);
type BlockKey = (Vec<u8>, u32, Vec<(Vec<u8>, u32)>);

impl Entries {
    fn add(&mut self, peer: EntryPeer, ports: Vec<PortRange>) {
        let mut ports: Vec<PortKey> = ports
            .into_iter()
            .map(|p| (p.protocol, p.port, p.end_port))
            .collect();
        ports.sort();
        ports.dedup();
        let peers = self.0.entry(ports).or_default();
        let b = match peer {
            EntryPeer::Name(pattern) => {
                peers.names.insert(pattern);
                return;
            }
            EntryPeer::Block(b) => b,
        };
        let cidr = b.cidr.expect("parse_entry sets a cidr");
        let mut except: Vec<(Vec<u8>, u32)> = b
            .except
            .into_iter()
            .map(|e| (e.addr, e.prefix_len))
            .collect();
        except.sort();
        except.dedup();
        peers.blocks.insert((cidr.addr, cidr.prefix_len, except));
    }

    fn rules(self) -> Vec<Rule> {
        let as_prefix =
            |addr: Vec<u8>, prefix_len: u32| palisade_proto::v1::IpPrefix { addr, prefix_len };
        let mut out = Vec::new();
        for (ports, peers) in self.0 {
            let ports: Vec<PortRange> = ports
                .into_iter()
                .map(|(protocol, port, end_port)| PortRange {
                    protocol,
                    port,
                    end_port,
                })
                .collect();
            if !peers.blocks.is_empty() {
                out.push(Rule {
                    peers: peers
                        .blocks
                        .into_iter()
                        .map(|(addr, len, except)| {
                            block(
                                as_prefix(addr, len),
                                except.into_iter().map(|(a, l)| as_prefix(a, l)).collect(),
                            )
                        })
                        .collect(),
                    ports: ports.clone(),
                    // A PolicyEndpoint does not say which policy rule an
                    // entry came from.
                    ..Default::default()
                });
            }
            if !peers.names.is_empty() {
                out.push(Rule {
                    ports,
                    domain_names: peers.names.into_iter().collect(),
                    ..Default::default()
                });
            }
        }
        out
    }
}

/// An entry's peer and ports (a name only in `egress`); the error starts
/// with the field below the entry (".cidr: ...").
fn parse_entry(entry: &EndpointInfo, egress: bool) -> Result<(EntryPeer, Vec<PortRange>), String> {
    match entry.action.as_deref() {
        None | Some("") | Some("Allow") => {}
        Some(other) => {
            return Err(format!(
                ".action: {other:?} cannot be enforced (only Allow)"
            ))
        }
    }
    let mut ports = Vec::new();
    for (i, p) in entry.ports.iter().flatten().enumerate() {
        ports.push(parse_port(p).map_err(|e| format!(".ports[{i}]{e}"))?);
    }
    if let Some(name) = entry.domain_name.as_deref().filter(|n| !n.is_empty()) {
        if !egress {
            return Err(format!(
                ".domainName: {name:?}: a name is an egress peer only"
            ));
        }
        if !entry.cidr.is_empty() {
            return Err(format!(
                ".domainName: {name:?} beside cidr {:?}: an entry is one or the other",
                entry.cidr
            ));
        }
        let pattern = name
            .parse::<palisade_dns::Pattern>()
            .map_err(|e| format!(".domainName: {e}"))?;
        return Ok((EntryPeer::Name(pattern.to_string()), ports));
    }
    let cidr = cidr::parse_strict_or_address(&entry.cidr).map_err(|e| format!(".cidr: {e}"))?;
    let mut except = Vec::new();
    for (i, e) in entry.except.iter().flatten().enumerate() {
        let net = cidr::parse_strict_or_address(e).map_err(|m| format!(".except[{i}]: {m}"))?;
        if !cidr.contains(&net) {
            return Err(format!(
                ".except[{i}]: {e:?} is not inside cidr {:?}",
                entry.cidr
            ));
        }
        except.push(prefix(net));
    }
    Ok((EntryPeer::Block(block(prefix(cidr), except)), ports))
}

pub(crate) fn parse_port(p: &Port) -> Result<PortRange, String> {
    let protocol = parse_protocol(p.protocol.as_deref()).map_err(|e| format!(".protocol: {e}"))?;
    let in_range = |n: i64| (1..=65535).contains(&n);
    let (port, end_port) = match (p.port, p.end_port) {
        (None, None) => (0, 0),
        (None, Some(_)) => return Err(".endPort: requires port".into()),
        (Some(n), _) if !in_range(n) => return Err(format!(".port: {n} is out of range 1-65535")),
        (Some(n), None) => (n, 0),
        (Some(n), Some(e)) if !in_range(e) || e < n => {
            return Err(format!(".endPort: {e} must be between port {n} and 65535"))
        }
        (Some(n), Some(e)) => (n, e),
    };
    Ok(PortRange {
        protocol: protocol as i32,
        port: port as u32,
        end_port: end_port as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::policy_endpoint::parse_spec;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PolicyEndpointSpec {
        parse_spec("ns", "s", &v).unwrap()
    }

    fn key() -> ObjectKey {
        ("ns".into(), "p".into())
    }

    fn host(a: [u8; 4]) -> palisade_proto::v1::IpPrefix {
        palisade_proto::v1::IpPrefix {
            addr: a.to_vec(),
            prefix_len: 32,
        }
    }

    #[test]
    fn slices_are_unioned_and_peers_with_the_same_ports_share_a_rule() {
        let a = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Ingress"],
            "podSelectorEndpoints": [{"name": "x", "namespace": "ns", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}],
            "ingress": [{"cidr": "10.0.0.9", "ports": [{"protocol": "TCP", "port": 80}]}],
        }));
        let b = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Ingress"],
            "podSelectorEndpoints": [{"name": "y", "namespace": "ns", "podIP": "10.0.0.2", "hostIP": "192.168.0.1"}],
            "ingress": [
                {"cidr": "10.0.0.8/32", "ports": [{"port": 80}]},
                {"cidr": "10.1.0.0/16", "except": ["10.1.2.0/24"]},
            ],
            "egress": [{"cidr": "0.0.0.0/0"}],
        }));
        let p = merge_slices(&key(), &[("a", &a), ("b", &b)]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.name, "ns/p");
        assert_eq!(
            p.pods.iter().map(|k| k.1.as_str()).collect::<Vec<_>>(),
            ["x", "y"]
        );
        assert_eq!(p.egress, None, "podIsolation does not name Egress");
        let rules = p.ingress.unwrap();
        assert_eq!(rules.len(), 2);
        assert!(rules[0].ports.is_empty());
        assert_eq!(rules[0].peers[0].except.len(), 1);
        assert_eq!(
            rules[1]
                .peers
                .iter()
                .map(|b| b.cidr.clone().unwrap())
                .collect::<Vec<_>>(),
            [host([10, 0, 0, 8]), host([10, 0, 0, 9])]
        );
        assert_eq!(rules[1].ports.len(), 1);
    }

    #[test]
    fn egress_names_become_rules_by_name_beside_the_addresses() {
        let s = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Ingress", "Egress"],
            "ingress": [{"cidr": "", "domainName": "in.example.com"}],
            "egress": [
                {"cidr": "10.0.0.7", "ports": [{"port": 443, "protocol": "TCP"}]},
                {"cidr": "", "domainName": "API.example.com.", "ports": [{"port": 443, "protocol": "TCP"}]},
                {"domainName": "*.example.org", "ports": [{"port": 443, "protocol": "TCP"}]},
                {"domainName": "dns.example.net"},
                {"cidr": "10.0.0.8", "domainName": "both.example.com"},
            ],
        }));
        let p = merge_slices(&key(), &[("s", &s)]);
        let errors: Vec<&str> = p.errors.iter().map(String::as_str).collect();
        assert_eq!(
            errors,
            [
                "PolicyEndpoint ns/s: spec.egress[4].domainName: \"both.example.com\" beside cidr \"10.0.0.8\": an entry is one or the other; entry ignored",
                "PolicyEndpoint ns/s: spec.ingress[0].domainName: \"in.example.com\": a name is an egress peer only; entry ignored",
            ]
        );
        assert_eq!(p.ingress, Some(vec![]), "isolated, nothing allowed");
        let shape: Vec<_> = p
            .egress
            .unwrap()
            .into_iter()
            .map(|r| (r.peers.len(), r.ports.len(), r.domain_names))
            .collect();
        assert_eq!(
            shape,
            [
                (0, 0, vec!["dns.example.net".to_string()]),
                (1, 1, vec![]),
                (
                    0,
                    1,
                    vec!["*.example.org".to_string(), "api.example.com".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn bad_entries_are_left_out_with_an_error_naming_object_and_field() {
        let s = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Ingress", "Egress"],
            "podSelectorEndpoints": [
                {"name": "x", "namespace": "other", "podIP": "10.0.0.3", "hostIP": "192.168.0.1"},
                {"name": "", "namespace": "ns", "podIP": "10.0.0.4", "hostIP": "192.168.0.1"},
                {"name": "ok", "namespace": "ns", "podIP": "10.0.0.5", "hostIP": "192.168.0.1"},
            ],
            "ingress": [
                {"cidr": "10.0.0.300"},
                {"cidr": "10.0.0.1/24"},
                {"cidr": "10.0.0.0/24", "except": ["10.9.0.0/24"]},
                {"cidr": "10.0.0.2", "ports": [{"protocol": "ICMP", "port": 1}]},
                {"cidr": "10.0.0.3", "ports": [{"port": 70000}]},
                {"cidr": "10.0.0.4", "ports": [{"port": 90, "endPort": 80}]},
                {"cidr": "10.0.0.5", "ports": [{"endPort": 80}]},
                {"cidr": "10.0.0.6", "action": "Deny"},
            ],
            "egress": [{"cidr": "10.0.0.7", "ports": [{"port": 53, "protocol": "UDP"}]}],
        }));
        let p = merge_slices(&key(), &[("s", &s)]);
        let want = [
            "spec.egress",
            "spec.ingress[0].cidr: \"10.0.0.300\" is not an address",
            "spec.ingress[1].cidr: \"10.0.0.1/24\" has host bits set",
            "spec.ingress[2].except[0]: \"10.9.0.0/24\" is not inside cidr",
            "spec.ingress[3].ports[0].protocol: unknown protocol \"ICMP\"",
            "spec.ingress[4].ports[0].port: 70000 is out of range",
            "spec.ingress[5].ports[0].endPort: 80 must be between port 90",
            "spec.ingress[6].ports[0].endPort: requires port",
            "spec.ingress[7].action: \"Deny\" cannot be enforced",
            "spec.podSelectorEndpoints[0].namespace: \"other\" is not the policy's namespace",
            "spec.podSelectorEndpoints[1].name: missing",
        ];
        for w in &want[1..] {
            assert!(
                p.errors
                    .iter()
                    .any(|e| e.starts_with(&format!("PolicyEndpoint ns/s: {w}"))),
                "no error {w:?} in {:?}",
                p.errors
            );
        }
        assert_eq!(p.errors.len(), want.len() - 1);
        assert_eq!(p.pods.len(), 1);
        // Every ingress entry was bad: isolated, nothing allowed.
        assert_eq!(p.ingress, Some(vec![]));
        assert_eq!(p.egress.unwrap().len(), 1);
    }

    #[test]
    fn disagreeing_isolation_isolates_the_union_and_says_so() {
        let a = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Ingress"],
        }));
        let b = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Egress", "Ingress"],
            "egress": [{"cidr": "::/0"}],
        }));
        let p = merge_slices(&key(), &[("a", &a), ("b", &b)]);
        assert_eq!(p.ingress, Some(vec![]));
        assert_eq!(p.egress.as_ref().unwrap().len(), 1);
        assert_eq!(p.errors.len(), 1);
        assert!(
            p.errors[0]
                .contains("disagree on podIsolation ([Egress, Ingress] in b; [Ingress] in a)"),
            "{:?}",
            p.errors
        );
    }

    #[test]
    fn without_pod_isolation_directions_default_as_policy_types_do() {
        let bare = spec(json!({"policyRef": {"name": "p", "namespace": "ns"}}));
        let p = merge_slices(&key(), &[("a", &bare)]);
        assert_eq!((p.ingress, p.egress), (Some(vec![]), None));
        let with_egress = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "egress": [{"cidr": "10.0.0.0/8"}],
        }));
        let p = merge_slices(&key(), &[("a", &with_egress)]);
        assert_eq!(p.ingress, Some(vec![]));
        assert_eq!(p.egress.unwrap().len(), 1);
        let unknown = spec(json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "podIsolation": ["Sideways"],
        }));
        let p = merge_slices(&key(), &[("a", &unknown)]);
        assert_eq!((p.ingress, p.egress), (Some(vec![]), Some(vec![])));
        assert!(p.errors[0].contains("spec.podIsolation[0]: unknown policy type"));
    }
}
