//! One typed reading of a ClusterNetworkPolicy, whichever API group it
//! came from: what the reference model, the controller's resolution and
//! explain work on.
//!
//! The reading is total: a field the API group allows but this version does
//! not know how to read (a newer CRD's peer or protocol) becomes
//! [`Peer::Unknown`] or [`PortMatch::Unknown`], and [`Rule::effective`]
//! fails closed on it as the API asks: an Accept rule then matches nothing,
//! a Deny or Pass rule everything, as a Deny.
//!
//! Precedence between policies ([`ClusterNetworkPolicy::precedence`]):
//! tier (Admin, then Baseline), priority (lower first), then name, then API
//! group (upstream first). The API leaves policies of one priority that
//! match the same connection to the implementation; Palisade decides by
//! name so that the outcome is the same on every node and every run.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::wire;

/// Which API group a policy came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiGroup {
    /// `policy.networking.k8s.io/v1alpha2` (network-policy-api).
    Upstream,
    /// `networking.k8s.aws/v1alpha1` (the AWS network policy controller).
    Aws,
}

impl ApiGroup {
    pub fn group(self) -> &'static str {
        match self {
            ApiGroup::Upstream => "policy.networking.k8s.io",
            ApiGroup::Aws => "networking.k8s.aws",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Before NetworkPolicy; a decision here is final.
    Admin,
    /// After NetworkPolicy, for pods no NetworkPolicy isolates.
    Baseline,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Allowed (replies too); an egress Accept does not override the
    /// destination's ingress.
    Accept,
    Deny,
    /// Skips the rest of this tier.
    Pass,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Accept => "Accept",
            Action::Deny => "Deny",
            Action::Pass => "Pass",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NamespacedPods {
    pub namespaces: LabelSelector,
    pub pods: LabelSelector,
}

/// The pods a policy applies to (host-network pods never are).
#[derive(Clone, Debug, PartialEq)]
pub enum Subject {
    Namespaces(LabelSelector),
    Pods(NamespacedPods),
    /// Neither field, or both: the API refuses it; read as selecting no pod.
    Unknown,
}

/// One peer of a rule. Host-network pods are never pods of a namespace or
/// pod peer.
#[derive(Clone, Debug, PartialEq)]
pub enum Peer {
    Namespaces(LabelSelector),
    Pods(NamespacedPods),
    /// Egress: these CIDRs, pod addresses included.
    Networks(Vec<IpNet>),
    /// Egress (experimental): the addresses in the selected nodes'
    /// `status.addresses`.
    Nodes(LabelSelector),
    /// Egress by name (experimental upstream, Accept only; AWS also Pass).
    DomainNames(Vec<String>),
    /// A peer this version cannot read: see [`Rule::effective`].
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// "TCP", "UDP", "SCTP", as Kubernetes spells them.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// What destination a rule's protocol entry matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortMatch {
    /// Every port of the protocol.
    Protocol(Protocol),
    /// `start..=end` of the protocol (a single port: start == end).
    Ports {
        protocol: Protocol,
        start: u16,
        end: u16,
    },
    /// A container port of the destination pod, by name (any protocol
    /// the port has).
    Named(String),
    /// An entry this version cannot read: see [`Rule::effective`].
    Unknown,
}

impl PortMatch {
    /// Whether it matches `protocol`/`port` at a destination whose named
    /// ports are `named` (name -> (protocol, port)); None: no pod, so no
    /// named port.
    pub fn matches(
        &self,
        protocol: Protocol,
        port: u16,
        named: Option<&BTreeMap<String, (Protocol, u16)>>,
    ) -> bool {
        match self {
            PortMatch::Protocol(p) => *p == protocol,
            PortMatch::Ports {
                protocol: p,
                start,
                end,
            } => *p == protocol && (*start..=*end).contains(&port),
            PortMatch::Named(name) => named.and_then(|n| n.get(name)) == Some(&(protocol, port)),
            PortMatch::Unknown => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// The rule's `name`, or empty.
    pub name: String,
    pub action: Action,
    /// OR'ed; never empty in a valid object.
    pub peers: Vec<Peer>,
    /// None: every protocol and port (ICMP too). Some: OR'ed.
    pub ports: Option<Vec<PortMatch>>,
}

/// A rule as it is enforced (see [`Rule::effective`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Effective<'a> {
    /// As written.
    AsWritten(&'a Rule),
    /// A Deny or Pass rule with a part this version cannot read: a Deny of
    /// everything, from or to anyone.
    DenyAll,
    /// An Accept rule with such a part: it matches nothing.
    Nothing,
}

impl Rule {
    /// The rule as enforced: fail closed on what this version cannot read
    /// (an unknown peer or protocol entry). A domain-name peer is read in
    /// an Accept rule (it matches the addresses the subject resolved those
    /// names to); in a Pass rule (AWS's), which this version does not
    /// enforce, it counts as unknown.
    pub fn effective(&self) -> Effective<'_> {
        let unreadable = self.peers.is_empty()
            || self.peers.iter().any(|p| match p {
                Peer::Unknown => true,
                Peer::DomainNames(_) => self.action != Action::Accept,
                _ => false,
            })
            || self
                .ports
                .as_ref()
                .is_some_and(|ps| ps.is_empty() || ps.contains(&PortMatch::Unknown));
        match (unreadable, self.action) {
            (false, _) => Effective::AsWritten(self),
            (true, Action::Accept) => Effective::Nothing,
            (true, Action::Deny | Action::Pass) => Effective::DenyAll,
        }
    }
}

/// A ClusterNetworkPolicy of either group, read.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterNetworkPolicy {
    pub group: ApiGroup,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    pub tier: Tier,
    /// 0..=1000; lower first.
    pub priority: u32,
    pub subject: Subject,
    /// In order: the first that matches decides.
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

impl ClusterNetworkPolicy {
    /// The order policies are judged in (see the module comment).
    pub fn precedence(&self) -> (Tier, u32, &str, ApiGroup) {
        (self.tier, self.priority, &self.name, self.group)
    }

    /// How operators name it: `ClusterNetworkPolicy/NAME` (upstream) or
    /// `ClusterNetworkPolicy.networking.k8s.aws/NAME`, as kubectl does.
    pub fn id(&self) -> String {
        match self.group {
            ApiGroup::Upstream => format!("ClusterNetworkPolicy/{}", self.name),
            ApiGroup::Aws => format!("ClusterNetworkPolicy.{}/{}", self.group.group(), self.name),
        }
    }

    /// Reads an upstream object (validated or not: what it cannot read
    /// fails closed, see the module comment).
    pub fn from_upstream(o: &wire::UpstreamClusterNetworkPolicy) -> Self {
        let s = &o.spec;
        ClusterNetworkPolicy {
            group: ApiGroup::Upstream,
            name: o.metadata.name.clone().unwrap_or_default(),
            annotations: o.metadata.annotations.clone().unwrap_or_default(),
            tier: tier(&s.tier),
            priority: priority(s.priority),
            subject: subject(&s.subject),
            ingress: s
                .ingress
                .iter()
                .flatten()
                .map(|r| Rule {
                    name: r.name.clone().unwrap_or_default(),
                    action: action(&r.action),
                    peers: r.from.iter().map(ingress_peer).collect(),
                    ports: r
                        .protocols
                        .as_ref()
                        .map(|ps| ps.iter().map(upstream_port).collect()),
                })
                .collect(),
            egress: s
                .egress
                .iter()
                .flatten()
                .map(|r| Rule {
                    name: r.name.clone().unwrap_or_default(),
                    action: action(&r.action),
                    peers: r.to.iter().map(upstream_egress_peer).collect(),
                    ports: r
                        .protocols
                        .as_ref()
                        .map(|ps| ps.iter().map(upstream_port).collect()),
                })
                .collect(),
        }
    }

    /// Reads an AWS object (as [`Self::from_upstream`]).
    pub fn from_aws(o: &wire::AwsClusterNetworkPolicy) -> Self {
        let s = &o.spec;
        ClusterNetworkPolicy {
            group: ApiGroup::Aws,
            name: o.metadata.name.clone().unwrap_or_default(),
            annotations: o.metadata.annotations.clone().unwrap_or_default(),
            tier: tier(&s.tier),
            priority: priority(s.priority),
            subject: subject(&s.subject),
            ingress: s
                .ingress
                .iter()
                .flatten()
                .map(|r| Rule {
                    name: r.name.clone().unwrap_or_default(),
                    action: action(&r.action),
                    peers: r.from.iter().map(ingress_peer).collect(),
                    ports: r.ports.as_ref().map(|ps| ps.iter().map(aws_port).collect()),
                })
                .collect(),
            egress: s
                .egress
                .iter()
                .flatten()
                .map(|r| Rule {
                    name: r.name.clone().unwrap_or_default(),
                    action: action(&r.action),
                    peers: r.to.iter().map(aws_egress_peer).collect(),
                    ports: r.ports.as_ref().map(|ps| ps.iter().map(aws_port).collect()),
                })
                .collect(),
        }
    }
}

/// An unknown tier reads as Admin: its rules then decide first, and an
/// unknown action (below) is a Deny, so an object the API should have
/// refused can only take access away.
fn tier(s: &str) -> Tier {
    match s {
        "Baseline" => Tier::Baseline,
        _ => Tier::Admin,
    }
}

/// Out of range reads as the nearest end.
fn priority(p: i64) -> u32 {
    p.clamp(0, 1000) as u32
}

/// An unknown action reads as Deny (fail closed).
fn action(s: &str) -> Action {
    match s {
        "Accept" => Action::Accept,
        "Pass" => Action::Pass,
        _ => Action::Deny,
    }
}

fn namespaced(p: &wire::NamespacedPod) -> NamespacedPods {
    NamespacedPods {
        namespaces: p.namespace_selector.clone(),
        pods: p.pod_selector.clone(),
    }
}

fn subject(s: &wire::Subject) -> Subject {
    match (&s.namespaces, &s.pods) {
        (Some(ns), None) => Subject::Namespaces(ns.clone()),
        (None, Some(p)) => Subject::Pods(namespaced(p)),
        _ => Subject::Unknown,
    }
}

fn ingress_peer(p: &wire::IngressPeer) -> Peer {
    match (&p.namespaces, &p.pods) {
        (Some(ns), None) => Peer::Namespaces(ns.clone()),
        (None, Some(pods)) => Peer::Pods(namespaced(pods)),
        _ => Peer::Unknown,
    }
}

fn networks(cidrs: &[String]) -> Peer {
    let parsed: Option<Vec<IpNet>> = cidrs.iter().map(|c| c.parse().ok()).collect();
    match parsed {
        Some(nets) if !nets.is_empty() => Peer::Networks(nets),
        _ => Peer::Unknown,
    }
}

fn upstream_egress_peer(p: &wire::UpstreamEgressPeer) -> Peer {
    let set = [
        p.namespaces.is_some(),
        p.pods.is_some(),
        p.nodes.is_some(),
        p.networks.is_some(),
        p.domain_names.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Peer::Unknown;
    }
    if let Some(ns) = &p.namespaces {
        return Peer::Namespaces(ns.clone());
    }
    if let Some(pods) = &p.pods {
        return Peer::Pods(namespaced(pods));
    }
    if let Some(nodes) = &p.nodes {
        return Peer::Nodes(nodes.clone());
    }
    if let Some(n) = &p.networks {
        return networks(n);
    }
    Peer::DomainNames(p.domain_names.clone().unwrap_or_default())
}

fn aws_egress_peer(p: &wire::AwsEgressPeer) -> Peer {
    let set = [
        p.namespaces.is_some(),
        p.pods.is_some(),
        p.networks.is_some(),
        p.domain_names.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Peer::Unknown;
    }
    if let Some(ns) = &p.namespaces {
        return Peer::Namespaces(ns.clone());
    }
    if let Some(pods) = &p.pods {
        return Peer::Pods(namespaced(pods));
    }
    if let Some(n) = &p.networks {
        return networks(n);
    }
    Peer::DomainNames(p.domain_names.clone().unwrap_or_default())
}

fn port_number(n: i64) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p >= 1)
}

fn ports(protocol: Protocol, start: i64, end: i64) -> PortMatch {
    match (port_number(start), port_number(end)) {
        (Some(start), Some(end)) if start <= end => PortMatch::Ports {
            protocol,
            start,
            end,
        },
        _ => PortMatch::Unknown,
    }
}

fn upstream_port(p: &wire::UpstreamProtocol) -> PortMatch {
    let set = [
        p.tcp.is_some(),
        p.udp.is_some(),
        p.sctp.is_some(),
        p.destination_named_port.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return PortMatch::Unknown;
    }
    if let Some(name) = &p.destination_named_port {
        return PortMatch::Named(name.clone());
    }
    let (protocol, holder) = match (&p.tcp, &p.udp, &p.sctp) {
        (Some(h), _, _) => (Protocol::Tcp, h),
        (_, Some(h), _) => (Protocol::Udp, h),
        (_, _, Some(h)) => (Protocol::Sctp, h),
        _ => return PortMatch::Unknown,
    };
    match &holder.destination_port {
        // `tcp: {}` is refused by the API (at least one field); read as
        // every port of the protocol would widen an Accept, so fail closed.
        None => PortMatch::Unknown,
        Some(wire::UpstreamPort {
            number: Some(n),
            range: None,
        }) => ports(protocol, *n, *n),
        Some(wire::UpstreamPort {
            number: None,
            range: Some(r),
        }) => ports(protocol, r.start, r.end),
        Some(_) => PortMatch::Unknown,
    }
}

fn aws_protocol(p: &Option<String>) -> Option<Protocol> {
    match p {
        None => Some(Protocol::Tcp),
        Some(s) => Protocol::parse(s),
    }
}

fn aws_port(p: &wire::AwsPort) -> PortMatch {
    match (&p.port_number, &p.port_range, &p.named_port) {
        (Some(n), None, None) => match aws_protocol(&n.protocol) {
            Some(protocol) => ports(protocol, n.port, n.port),
            None => PortMatch::Unknown,
        },
        (None, Some(r), None) => match aws_protocol(&r.protocol) {
            Some(protocol) => ports(protocol, r.start, r.end),
            None => PortMatch::Unknown,
        },
        (None, None, Some(name)) => PortMatch::Named(name.clone()),
        _ => PortMatch::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(spec: serde_json::Value) -> ClusterNetworkPolicy {
        let o: wire::UpstreamClusterNetworkPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": wire::UPSTREAM_API_VERSION,
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "p"},
            "spec": spec,
        }))
        .unwrap();
        ClusterNetworkPolicy::from_upstream(&o)
    }

    #[test]
    fn an_upstream_policy_reads_into_tiers_rules_peers_and_ports() {
        let p = upstream(serde_json::json!({
            "tier": "Baseline", "priority": 7,
            "subject": {"namespaces": {"matchLabels": {"a": "b"}}},
            "ingress": [{"name": "r0", "action": "Pass",
                "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"x": "y"}}}}],
                "protocols": [{"tcp": {"destinationPort": {"number": 80}}},
                              {"udp": {"destinationPort": {"range": {"start": 5000, "end": 5010}}}},
                              {"destinationNamedPort": "web"}]}],
            "egress": [{"action": "Accept", "to": [{"networks": ["10.0.0.0/8", "fd00::/8"]}, {"nodes": {}}]}],
        }));
        assert_eq!(p.tier, Tier::Baseline);
        assert_eq!(p.priority, 7);
        assert_eq!(p.id(), "ClusterNetworkPolicy/p");
        let r = &p.ingress[0];
        assert_eq!((r.name.as_str(), r.action), ("r0", Action::Pass));
        assert!(matches!(r.peers[0], Peer::Pods(_)));
        assert_eq!(
            r.ports.as_deref().unwrap(),
            &[
                PortMatch::Ports {
                    protocol: Protocol::Tcp,
                    start: 80,
                    end: 80
                },
                PortMatch::Ports {
                    protocol: Protocol::Udp,
                    start: 5000,
                    end: 5010
                },
                PortMatch::Named("web".into()),
            ]
        );
        assert_eq!(r.effective(), Effective::AsWritten(r));
        let e = &p.egress[0];
        assert!(matches!(&e.peers[0], Peer::Networks(n) if n.len() == 2));
        assert!(matches!(&e.peers[1], Peer::Nodes(_)));
        assert_eq!(e.ports, None);
    }

    #[test]
    fn what_cannot_be_read_fails_closed_by_action() {
        // A peer with no known field (a newer CRD's), and one with two.
        let p = upstream(serde_json::json!({
            "tier": "Admin", "priority": 1,
            "subject": {"namespaces": {}},
            "ingress": [
                {"action": "Accept", "from": [{}]},
                {"action": "Pass", "from": [{}]},
                {"action": "Deny", "from": [{"namespaces": {}, "pods": {"podSelector": {}}}]},
            ],
            "egress": [
                {"action": "Accept", "to": [{"networks": ["10.0.0.0/33"]}]},
                {"action": "Accept", "to": [{"namespaces": {}}], "protocols": [{"tcp": {}}]},
                {"action": "Accept", "to": [{"domainNames": ["example.com"]}]},
                {"action": "Maybe", "to": [{"namespaces": {}}]},
            ],
        }));
        assert_eq!(p.ingress[0].effective(), Effective::Nothing);
        assert_eq!(p.ingress[1].effective(), Effective::DenyAll);
        assert_eq!(p.ingress[2].effective(), Effective::DenyAll);
        assert_eq!(p.egress[0].effective(), Effective::Nothing, "a bad CIDR");
        assert_eq!(p.egress[1].effective(), Effective::Nothing, "tcp: {{}}");
        assert_eq!(
            p.egress[2].effective(),
            Effective::AsWritten(&p.egress[2]),
            "domain names in an Accept"
        );
        assert_eq!(p.egress[3].action, Action::Deny, "an unknown action");
    }

    #[test]
    fn an_aws_policy_reads_its_own_port_shapes() {
        let o: wire::AwsClusterNetworkPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": wire::AWS_API_VERSION, "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "q"},
            "spec": {"tier": "Admin", "priority": 0,
                "subject": {"pods": {"namespaceSelector": {}, "podSelector": {}}},
                "egress": [{"action": "Pass", "to": [{"domainNames": ["*.example.com"]}]},
                           {"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}],
                            "ports": [{"portNumber": {"port": 22}},
                                      {"portRange": {"protocol": "UDP", "start": 1, "end": 9}},
                                      {"namedPort": "dns"},
                                      {"portNumber": {"protocol": "ICMP", "port": 1}}]}]},
        }))
        .unwrap();
        let p = ClusterNetworkPolicy::from_aws(&o);
        assert_eq!(p.id(), "ClusterNetworkPolicy.networking.k8s.aws/q");
        assert_eq!(
            p.egress[0].effective(),
            Effective::DenyAll,
            "Pass by name: not enforced yet"
        );
        assert_eq!(
            p.egress[1].ports.as_deref().unwrap(),
            &[
                PortMatch::Ports {
                    protocol: Protocol::Tcp,
                    start: 22,
                    end: 22
                },
                PortMatch::Ports {
                    protocol: Protocol::Udp,
                    start: 1,
                    end: 9
                },
                PortMatch::Named("dns".into()),
                PortMatch::Unknown,
            ]
        );
    }

    #[test]
    fn named_ports_match_the_destinations_port_of_that_protocol() {
        let named: BTreeMap<String, (Protocol, u16)> =
            [("web".to_string(), (Protocol::Tcp, 8080))].into();
        let m = PortMatch::Named("web".into());
        assert!(m.matches(Protocol::Tcp, 8080, Some(&named)));
        assert!(!m.matches(Protocol::Udp, 8080, Some(&named)));
        assert!(
            !m.matches(Protocol::Tcp, 8080, None),
            "no pod, no named port"
        );
        assert!(PortMatch::Protocol(Protocol::Sctp).matches(Protocol::Sctp, 1, None));
    }

    #[test]
    fn precedence_is_tier_priority_name_then_group() {
        let mut a = upstream(
            serde_json::json!({"tier": "Baseline", "priority": 0, "subject": {"namespaces": {}}}),
        );
        let mut b = a.clone();
        b.tier = Tier::Admin;
        b.priority = 999;
        assert!(b.precedence() < a.precedence(), "Admin before Baseline");
        a.tier = Tier::Admin;
        a.name = "z".into();
        b.priority = 0;
        b.name = "a".into();
        assert!(b.precedence() < a.precedence());
        a.name = "a".into();
        a.group = ApiGroup::Aws;
        assert!(
            b.precedence() < a.precedence(),
            "upstream first at equal names"
        );
    }
}
