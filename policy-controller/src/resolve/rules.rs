//! One rule of a NetworkPolicy as plan rules: its peers' addresses on its
//! ports, named ports resolved per pod (the guarded pod's on ingress, each
//! destination's on egress), and on egress the ClusterIPs of the Services
//! whose backends it allows (`services.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort};
use palisade_proto::v1::{IpPrefix, PortRange, Rule};

use super::objects::PodInfo;
use super::peers::{block, block_contains, peer_blocks, PeerSelection, PeerSpec};
use super::ports::{named, PortSpec};
use super::services;
use crate::keys::PodKey;

/// A field's path (`PARENT.KEY[INDEX]`), written out only when an error
/// names it: every target of a policy walks its rules, and most rules have
/// no error.
#[derive(Clone, Copy)]
pub(super) struct Path<'a> {
    pub parent: &'a dyn Display,
    pub key: &'static str,
    pub index: usize,
}

impl Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}[{}]", self.parent, self.key, self.index)
    }
}

/// What evaluating one policy's rules for one target needs: how peers are
/// found, the policy (errors name it), and where errors go.
pub(super) struct RuleContext<'a> {
    pub selection: &'a mut dyn PeerSelection,
    pub policy_ns: &'a str,
    /// How errors name the policy: `NetworkPolicy ns/name`,
    /// `ClusterNetworkPolicy/name`.
    pub label: &'a dyn Display,
    pub errors: &'a mut Vec<String>,
    /// When an egress rule matches a Service's ClusterIP (see `services`).
    pub services: ServiceCoverage,
}

/// When an egress rule that matches a Service's backends matches its
/// ClusterIP too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServiceCoverage {
    /// When it matches every backend: what allows (narrower, never wider).
    Every,
    /// When it matches one: what denies (the kernel may pick that one).
    Any,
}

impl RuleContext<'_> {
    pub(super) fn error(&mut self, field: &dyn Display, msg: impl Display) {
        self.errors.push(format!("{}: {field}: {msg}", self.label));
    }

    pub(super) fn ingress_rule(
        &mut self,
        field: &dyn Display,
        from: Option<&[NetworkPolicyPeer]>,
        ports: Option<&[NetworkPolicyPort]>,
        target: &PodInfo,
    ) -> Vec<Rule> {
        let Some(port_specs) = self.ports(field, ports) else {
            return vec![];
        };
        // Named ports of an ingress rule name ports of the pod being guarded.
        let mut resolved = Vec::new();
        for spec in &port_specs {
            match spec {
                PortSpec::Numbered(p) => resolved.push(*p),
                PortSpec::Named(proto, name) => resolved.extend(named(target, *proto, name)),
            }
        }
        if !port_specs.is_empty() && resolved.is_empty() {
            // The rule names ports, none of which exists here: it allows
            // nothing. An empty list would mean "every port".
            return vec![];
        }
        let peers = self.peers(field, "from", from);
        let blocks = peer_blocks(&peers);
        if blocks.is_empty() {
            return vec![];
        }
        vec![Rule {
            peers: blocks,
            ports: resolved,
            ..Default::default()
        }]
    }

    pub(super) fn egress_rule(
        &mut self,
        field: &dyn Display,
        to: Option<&[NetworkPolicyPeer]>,
        ports: Option<&[NetworkPolicyPort]>,
    ) -> Vec<Rule> {
        let Some(port_specs) = self.ports(field, ports) else {
            return vec![];
        };
        let peers = self.peers(field, "to", to);
        let numbered: Vec<PortRange> = port_specs
            .iter()
            .filter_map(|p| match p {
                PortSpec::Numbered(r) => Some(*r),
                PortSpec::Named(..) => None,
            })
            .collect();
        let mut rules = Vec::new();
        if port_specs.is_empty() || !numbered.is_empty() {
            let blocks = peer_blocks(&peers);
            if !blocks.is_empty() {
                rules.push(Rule {
                    peers: blocks,
                    ports: numbered,
                    ..Default::default()
                });
            }
        }
        // Named ports of an egress rule are resolved per destination pod, so
        // each pod the peers cover (by selector, or by address for an
        // ipBlock or an absent `to`) gets a rule of its own.
        if port_specs.iter().any(|p| matches!(p, PortSpec::Named(..))) {
            self.named_port_rules(&peers, &port_specs, &mut rules);
        }
        // The ClusterIPs of Services the rule allows the backends of: the
        // client's hook sees those before DNAT.
        rules.extend(services::service_rules(
            &mut *self.selection,
            &peers,
            &port_specs,
            self.services,
        ));
        rules
    }

    /// An egress rule's peers by name (an ApplicationNetworkPolicy's
    /// `domainNames`, as written) on its ports: one plan rule whose peers
    /// are what the pod resolved them to. A name DNS cannot have, or a
    /// named port (a port of which pod?), is an error and drops the part it
    /// spoils: a name that cannot match, the whole rule by name for a port.
    pub(super) fn name_rule(
        &mut self,
        field: &dyn Display,
        names: &[String],
        ports: Option<&[NetworkPolicyPort]>,
    ) -> Option<Rule> {
        let mut patterns = Vec::new();
        for name in names {
            match name.parse::<palisade_dns::Pattern>() {
                Ok(p) => patterns.push(p.to_string()),
                Err(e) => self.error(field, format!("domainNames: {e}; it matches nothing")),
            }
        }
        patterns.sort();
        patterns.dedup();
        if patterns.is_empty() {
            return None;
        }
        let port_specs = self.ports(field, ports)?;
        let mut numbered = Vec::new();
        for spec in port_specs {
            match spec {
                PortSpec::Numbered(p) => numbered.push(p),
                PortSpec::Named(_, name) => {
                    self.error(
                        field,
                        format!("port {name:?} is named, which a peer by domain name cannot have; the names allow nothing"),
                    );
                    return None;
                }
            }
        }
        Some(Rule {
            ports: numbered,
            domain_names: patterns,
            ..Default::default()
        })
    }

    fn named_port_rules(
        &mut self,
        peers: &[PeerSpec],
        port_specs: &[PortSpec],
        rules: &mut Vec<Rule>,
    ) {
        let names: BTreeSet<&str> = port_specs
            .iter()
            .filter_map(|p| match p {
                PortSpec::Named(_, name) => Some(name.as_str()),
                PortSpec::Numbered(_) => None,
            })
            .collect();
        for (pod, ips) in self.pods_covered(peers, &names) {
            let ports: Vec<PortRange> = port_specs
                .iter()
                .filter_map(|p| match p {
                    PortSpec::Named(proto, name) => Some(named(&pod, *proto, name)),
                    PortSpec::Numbered(_) => None,
                })
                .flatten()
                .collect();
            if !ports.is_empty() {
                rules.push(Rule {
                    peers: ips
                        .iter()
                        .map(|ip| block(IpPrefix::host(*ip), vec![]))
                        .collect(),
                    ports,
                    ..Default::default()
                });
            }
        }
    }

    /// Pods with one of the port `names` (and which of their addresses)
    /// the peers of a rule cover; pods without such a port could not add a
    /// rule, so only those are looked at.
    fn pods_covered(
        &mut self,
        peers: &[PeerSpec],
        names: &BTreeSet<&str>,
    ) -> Vec<(Arc<PodInfo>, Vec<IpAddr>)> {
        let mut candidates: BTreeMap<PodKey, Arc<PodInfo>> = BTreeMap::new();
        if peers.iter().any(|p| matches!(p, PeerSpec::Block(_))) {
            // An address block may cover any pod with such a port.
            for name in names {
                for pod in self.selection.with_port_name(name) {
                    candidates.insert(pod.key(), pod);
                }
            }
        } else {
            // Only selected pods are covered: look at those alone.
            let selected = peers.iter().filter_map(|p| match p {
                PeerSpec::Pods(s) => Some(s),
                PeerSpec::Block(_) => None,
            });
            for pod in selected.flat_map(|s| s.pods.iter()) {
                if names.iter().any(|n| pod.named_ports.contains_key(*n)) {
                    candidates.insert(pod.key(), pod.clone());
                }
            }
        }
        let selected: BTreeSet<(&str, &str)> = peers
            .iter()
            .filter_map(|p| match p {
                PeerSpec::Pods(s) => Some(s),
                PeerSpec::Block(_) => None,
            })
            .flat_map(|s| s.pods.iter())
            .map(|p| (p.namespace.as_str(), p.name.as_str()))
            .collect();
        let mut out = Vec::new();
        for pod in candidates.into_values() {
            let in_selection = selected.contains(&(pod.namespace.as_str(), pod.name.as_str()));
            let ips: Vec<IpAddr> = pod
                .ips
                .iter()
                .copied()
                .filter(|ip| {
                    in_selection
                        || peers.iter().any(|peer| match peer {
                            PeerSpec::Pods(_) => false,
                            PeerSpec::Block(b) => block_contains(b, *ip),
                        })
                })
                .collect();
            if !ips.is_empty() {
                out.push((pod, ips));
            }
        }
        out
    }
}
