//! Policy resolution: a pure function from the cluster's objects to the plan
//! of every node. It follows NetworkPolicy v1 as upstream defines it: a pod is
//! isolated in a direction once any policy selects it for that direction, and
//! the rules of every such policy are unioned.
//!
//! A node's plan names every pod that lives on it, isolated or not (a pod
//! missing from a plan is one the controller does not know, which an enforcer
//! must not read as "not isolated"); peers appear as addresses, so a node
//! learns nothing else about the cluster. Host-network pods are left out:
//! they share the node's interfaces, so there is nothing per pod to enforce.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use palisade_proto::v1::{
    DirectionPolicy, IpPrefix, PeerBlock, PodPolicy, PodRef, PortRange, Protocol, Rule,
};

use crate::cluster::ClusterState;

mod services;
pub(crate) use services::{is_selectorless, selector_of, service_info, slice_service, ServiceInfo};

/// Namespace and name of a pod.
pub type PodKey = (String, String);

/// Everything one node must enforce.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePlan {
    /// Shared, so that copying a node's plan to change one pod copies
    /// pointers, not rules.
    pub pods: BTreeMap<PodKey, Arc<PodPolicy>>,
}

impl NodePlan {
    /// Equality that skips entries both plans share.
    pub fn same_as(&self, other: &NodePlan) -> bool {
        self.pods.len() == other.pods.len()
            && self
                .pods
                .iter()
                .zip(other.pods.iter())
                .all(|((ka, va), (kb, vb))| ka == kb && (Arc::ptr_eq(va, vb) || va == vb))
    }
}

/// The plans of every node, and the problems found in the input. A problem
/// never widens what is allowed: an invalid peer or port is left out of its
/// rule (or the rule is dropped), while the policy still isolates its pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolution {
    pub plans: BTreeMap<String, NodePlan>,
    pub errors: Vec<String>,
}

/// The label Kubernetes puts on every namespace; manifests often omit it.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

pub fn resolve(state: &ClusterState) -> BTreeMap<String, NodePlan> {
    resolve_with_errors(state).plans
}

/// The full computation, by scanning: every selector is evaluated against
/// every pod. Deliberately simple, it is the oracle the incremental engine
/// (`crate::engine`) is checked against.
pub fn resolve_with_errors(state: &ClusterState) -> Resolution {
    let mut index = Scan::new(state);
    let mut errors = Vec::new();
    let mut plans: BTreeMap<String, NodePlan> = BTreeMap::new();
    let targets = index.pods.clone();
    for target in &targets {
        let Some(node) = target.node.as_ref() else {
            continue;
        };
        if target.host_network {
            // Host-network pods share the node's interfaces: no veth to guard.
            continue;
        }
        let policies = state
            .policies
            .iter()
            .filter(|p| namespace_of(&p.metadata) == target.namespace);
        let pod = resolve_target(target, policies, &mut index, &mut errors);
        plans.entry(node.clone()).or_default().pods.insert(
            (target.namespace.clone(), target.name.clone()),
            Arc::new(pod),
        );
    }
    errors.sort();
    errors.dedup();
    Resolution { plans, errors }
}

/// The annotation that stages a NetworkPolicy: evaluated against real
/// traffic, never enforced.
pub const AUDIT_ANNOTATION: &str = "palisade.io/audit";

/// Whether a policy is staged (annotated `palisade.io/audit: "true"`).
/// Only "true" stages it, and "false" is the explicit way to say it is not;
/// any other value (a `True` or a `yes`) is probably meant to stage it, but
/// guessing could leave a policy unenforced that its author expects to
/// enforce, so it is enforced and named as an error.
pub fn is_staged(policy: &NetworkPolicy, policy_name: &str, errors: &mut Vec<String>) -> bool {
    let value = policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(AUDIT_ANNOTATION));
    match value.map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            errors.push(format!(
                "NetworkPolicy {policy_name}: annotation {AUDIT_ANNOTATION}: {other:?} is neither \"true\" nor \"false\"; the policy is enforced"
            ));
            false
        }
    }
}

/// One direction's rules as they are collected: the enforced ones, and (when
/// some staged policy applies) all of them, enforced and staged, in the
/// order enforcement would see them once the staged policies are enforced.
#[derive(Default)]
struct DirectionRules {
    enforced: Option<DirectionPolicy>,
    all: DirectionPolicy,
    staged: bool,
}

impl DirectionRules {
    fn add(&mut self, staged: bool, rules: impl Iterator<Item = Rule>) {
        let rules: Vec<Rule> = rules.collect();
        if staged {
            self.staged = true;
        } else {
            self.enforced
                .get_or_insert_with(DirectionPolicy::default)
                .rules
                .extend(rules.iter().cloned());
        }
        self.all.rules.extend(rules);
    }

    /// (enforced, audit): the audit policy exists only where a staged policy
    /// applies; it is what removing every staged annotation would enforce.
    fn finish(self) -> (Option<DirectionPolicy>, Option<DirectionPolicy>) {
        let audit = self.staged.then_some(self.all);
        (self.enforced, audit)
    }
}

/// The policy of one pod, from the policies of its namespace (in any order
/// that is the same every time: their names are sorted in the output).
/// Problems found are appended to `errors`. Staged policies resolve exactly
/// like enforced ones (so removing the annotation enforces the same rules)
/// but land in `staged_policies` and the audit directions instead.
pub(crate) fn resolve_target<'p>(
    target: &PodInfo,
    policies: impl IntoIterator<Item = &'p NetworkPolicy>,
    selection: &mut dyn PeerSelection,
    errors: &mut Vec<String>,
) -> PodPolicy {
    let mut ingress = DirectionRules::default();
    let mut egress = DirectionRules::default();
    let mut names = Vec::new();
    let mut staged_names = Vec::new();
    for policy in policies {
        let Some(spec) = policy.spec.as_ref() else {
            continue;
        };
        let policy_ns = namespace_of(&policy.metadata);
        let policy_name = format!(
            "{}/{}",
            policy_ns,
            policy.metadata.name.as_deref().unwrap_or_default()
        );
        match selector_matches(
            spec.pod_selector.as_ref().unwrap_or(&EMPTY_SELECTOR),
            &target.labels,
        ) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                errors.push(format!(
                    "NetworkPolicy {policy_name}: spec.podSelector: {e}"
                ));
                continue;
            }
        }
        let (applies_ingress, applies_egress) = policy_types(spec);
        let staged = is_staged(policy, &policy_name, errors);
        if staged {
            staged_names.push(policy_name.clone());
        } else {
            names.push(policy_name.clone());
        }
        let over_limit = crate::limits::check_rules(
            &policy_name,
            spec.ingress.as_ref().map_or(0, Vec::len),
            spec.egress.as_ref().map_or(0, Vec::len),
            crate::limits::rules_per_policy(),
        );
        if let Some(e) = over_limit {
            // Fail closed: it still isolates the pods it selects, with none
            // of its rules, and is never resolved rule by rule.
            errors.push(e);
            if applies_ingress {
                ingress.add(staged, std::iter::empty());
            }
            if applies_egress {
                egress.add(staged, std::iter::empty());
            }
            continue;
        }
        let mut ctx = RuleContext {
            selection: &mut *selection,
            policy_ns: &policy_ns,
            policy_name: &policy_name,
            errors: &mut *errors,
        };
        if applies_ingress {
            // A policy without rules still isolates: add() marks it.
            ingress.add(staged, std::iter::empty());
            for (i, r) in spec.ingress.iter().flatten().enumerate() {
                let field = format!("spec.ingress[{i}]");
                let rules = ctx.ingress_rule(&field, r.from.as_deref(), r.ports.as_deref(), target);
                ingress.add(staged, with_origin(rules, &policy_name, i));
            }
        }
        if applies_egress {
            egress.add(staged, std::iter::empty());
            for (i, r) in spec.egress.iter().flatten().enumerate() {
                let field = format!("spec.egress[{i}]");
                let rules = ctx.egress_rule(&field, r.to.as_deref(), r.ports.as_deref());
                egress.add(staged, with_origin(rules, &policy_name, i));
            }
        }
    }
    names.sort();
    staged_names.sort();
    let (ingress, audit_ingress) = ingress.finish();
    let (egress, audit_egress) = egress.finish();
    PodPolicy {
        pod: Some(PodRef {
            namespace: target.namespace.clone(),
            name: target.name.clone(),
        }),
        pod_ips: target.ips.iter().map(|ip| IpPrefix::host(*ip)).collect(),
        ingress,
        egress,
        policies: names,
        staged_policies: staged_names,
        audit_ingress,
        audit_egress,
    }
}

/// Stamps plan rules with the policy rule they come from, so a flow log or
/// an explanation can name it.
fn with_origin(rules: Vec<Rule>, policy: &str, index: usize) -> impl Iterator<Item = Rule> + '_ {
    rules.into_iter().map(move |mut rule| {
        rule.policy = policy.to_string();
        rule.rule_index = index as u32;
        rule
    })
}

static EMPTY_SELECTOR: LabelSelector = LabelSelector {
    match_expressions: None,
    match_labels: None,
};

/// policyTypes as upstream defaults them: Ingress always, Egress when the
/// policy has egress rules.
fn policy_types(spec: &NetworkPolicySpec) -> (bool, bool) {
    match &spec.policy_types {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.is_some()),
    }
}

/// A pod as resolution needs it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub node: Option<String>,
    pub host_network: bool,
    pub ips: Vec<IpAddr>,
    /// Named container ports: name -> (protocol, number).
    pub named_ports: BTreeMap<String, Vec<(Protocol, u16)>>,
}

impl PodInfo {
    pub fn key(&self) -> PodKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// The pods a selector peer selects, and their addresses as peer blocks,
/// computed once and shared by every rule that uses the same selector.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Selected {
    /// Sorted by namespace and name; host-network pods are never peers.
    pub pods: Vec<Arc<PodInfo>>,
    pub blocks: Vec<PeerBlock>,
}

impl Selected {
    pub fn new(pods: Vec<Arc<PodInfo>>) -> Self {
        let blocks = pods
            .iter()
            .flat_map(|p| p.ips.iter().map(|ip| block(IpPrefix::host(*ip), vec![])))
            .collect();
        Selected { pods, blocks }
    }
}

/// How rules find the pods their peers name: by scanning (the oracle) or
/// through the engine's indexes and caches.
pub(crate) trait PeerSelection {
    /// The pods a peer with a podSelector and/or namespaceSelector selects.
    fn select(
        &mut self,
        policy_ns: &str,
        peer: &NetworkPolicyPeer,
    ) -> Result<Arc<Selected>, String>;
    /// Every pod (not host-network) with a container port named `name`,
    /// sorted by namespace and name.
    fn with_port_name(&mut self, name: &str) -> Vec<Arc<PodInfo>>;
    /// The Services with a selector in `ns` that have a ClusterIP, sorted by
    /// name.
    fn services_in(&mut self, ns: &str) -> Arc<Vec<Arc<ServiceInfo>>>;
    /// Every Service without a selector that has a ClusterIP, sorted by
    /// namespace and name.
    fn selectorless_services(&mut self) -> Arc<Vec<Arc<ServiceInfo>>>;
}

/// Selection by scanning every pod.
struct Scan {
    pods: Vec<Arc<PodInfo>>,
    namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    services: BTreeMap<String, Arc<Vec<Arc<ServiceInfo>>>>,
    selectorless: Arc<Vec<Arc<ServiceInfo>>>,
}

impl Scan {
    fn new(state: &ClusterState) -> Self {
        let mut namespace_labels = BTreeMap::new();
        for ns in &state.namespaces {
            namespace_labels.insert(ns.metadata.name.clone().unwrap_or_default(), ns_labels(ns));
        }
        let pods = state
            .pods
            .iter()
            .filter_map(pod_info)
            .map(Arc::new)
            .collect::<Vec<_>>();
        for pod in &pods {
            // A pod's namespace may have no object yet (or in a manifest);
            // it still has the name label the API server would give it.
            namespace_labels
                .entry(pod.namespace.clone())
                .or_insert_with(|| default_ns_labels(&pod.namespace));
        }
        let mut services: BTreeMap<String, Vec<Arc<ServiceInfo>>> = BTreeMap::new();
        let mut selectorless = Vec::new();
        let slices: Vec<&EndpointSlice> = state.endpoint_slices.iter().collect();
        let mut pods_by_ns: BTreeMap<&str, Vec<Arc<PodInfo>>> = BTreeMap::new();
        for pod in &pods {
            pods_by_ns
                .entry(pod.namespace.as_str())
                .or_default()
                .push(pod.clone());
        }
        for svc in &state.services {
            let ns = namespace_of(&svc.metadata);
            let in_ns = pods_by_ns.get(ns.as_str()).into_iter().flatten();
            let Some(info) = service_info(svc, in_ns, slices.iter().copied()) else {
                continue;
            };
            if is_selectorless(svc) {
                selectorless.push(Arc::new(info));
            } else {
                services
                    .entry(info.namespace.clone())
                    .or_default()
                    .push(Arc::new(info));
            }
        }
        selectorless.sort_by_key(|s| s.key());
        Scan {
            pods,
            namespace_labels,
            services: services
                .into_iter()
                .map(|(ns, mut v)| {
                    v.sort_by_key(|s| s.key());
                    (ns, Arc::new(v))
                })
                .collect(),
            selectorless: Arc::new(selectorless),
        }
    }
}

impl PeerSelection for Scan {
    fn select(
        &mut self,
        policy_ns: &str,
        peer: &NetworkPolicyPeer,
    ) -> Result<Arc<Selected>, String> {
        let mut out = Vec::new();
        for pod in &self.pods {
            let ns_ok = match &peer.namespace_selector {
                // Without a namespaceSelector, peers come from the policy's namespace.
                None => pod.namespace == policy_ns,
                Some(sel) => {
                    let labels = self
                        .namespace_labels
                        .get(&pod.namespace)
                        .cloned()
                        .unwrap_or_default();
                    selector_matches(sel, &labels).map_err(|e| format!("namespaceSelector: {e}"))?
                }
            };
            if !ns_ok {
                continue;
            }
            let pod_ok = match &peer.pod_selector {
                None => true,
                Some(sel) => {
                    selector_matches(sel, &pod.labels).map_err(|e| format!("podSelector: {e}"))?
                }
            };
            if pod_ok && !pod.host_network {
                out.push(pod.clone());
            }
        }
        Ok(Arc::new(Selected::new(out)))
    }

    fn with_port_name(&mut self, name: &str) -> Vec<Arc<PodInfo>> {
        self.pods
            .iter()
            .filter(|p| !p.host_network && p.named_ports.contains_key(name))
            .cloned()
            .collect()
    }

    fn services_in(&mut self, ns: &str) -> Arc<Vec<Arc<ServiceInfo>>> {
        self.services.get(ns).cloned().unwrap_or_default()
    }

    fn selectorless_services(&mut self) -> Arc<Vec<Arc<ServiceInfo>>> {
        self.selectorless.clone()
    }
}

pub(crate) fn default_ns_labels(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(NAMESPACE_NAME_LABEL.into(), ns.to_string())])
}

pub(crate) fn ns_labels(ns: &Namespace) -> BTreeMap<String, String> {
    let mut labels = ns.metadata.labels.clone().unwrap_or_default();
    labels
        .entry(NAMESPACE_NAME_LABEL.into())
        .or_insert_with(|| ns.metadata.name.clone().unwrap_or_default());
    labels
}

pub(crate) fn namespace_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    meta.namespace.clone().unwrap_or_else(|| "default".into())
}

/// None for a pod that holds no address worth trusting (finished).
pub(crate) fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    ) {
        // Finished pods hold no address that should still be trusted.
        return None;
    }
    let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
    if let Some(status) = status {
        for ip in status.pod_ips.iter().flatten() {
            if let Ok(ip) = ip.ip.parse() {
                ips.insert(ip);
            }
        }
        if let Some(Ok(ip)) = status.pod_ip.as_deref().map(str::parse) {
            ips.insert(ip);
        }
    }
    let mut named_ports: BTreeMap<String, Vec<(Protocol, u16)>> = BTreeMap::new();
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            let (Some(name), Ok(number)) = (p.name.as_ref(), u16::try_from(p.container_port))
            else {
                continue;
            };
            if let Ok(proto) = parse_protocol(p.protocol.as_deref()) {
                named_ports
                    .entry(name.clone())
                    .or_default()
                    .push((proto, number));
            }
        }
    }
    Some(PodInfo {
        namespace: namespace_of(&pod.metadata),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        node: spec.node_name.clone().filter(|n| !n.is_empty()),
        host_network: spec.host_network.unwrap_or(false),
        ips: ips.into_iter().collect(),
        named_ports,
    })
}

fn parse_protocol(p: Option<&str>) -> Result<Protocol, String> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(format!(
            "unknown protocol {other:?} (want TCP, UDP or SCTP)"
        )),
    }
}

/// Whether a selector's operators are all known (whatever labels it meets).
pub fn validate_selector(selector: &LabelSelector) -> Result<(), String> {
    for expr in selector.match_expressions.iter().flatten() {
        if !matches!(
            expr.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        ) {
            return Err(format!(
                "matchExpressions key {:?}: unknown operator {:?}",
                expr.key, expr.operator
            ));
        }
    }
    Ok(())
}

pub use palisade_model::selector::selector_matches;

struct RuleContext<'a> {
    selection: &'a mut dyn PeerSelection,
    policy_ns: &'a str,
    policy_name: &'a str,
    errors: &'a mut Vec<String>,
}

/// A port entry of a rule before named ports are resolved.
enum PortSpec {
    Numbered(PortRange),
    Named(Protocol, String),
}

/// A peer of a rule: an address block, or pods (which named ports need).
enum PeerSpec {
    Block(PeerBlock),
    Pods(Arc<Selected>),
}

impl RuleContext<'_> {
    fn error(&mut self, field: &str, msg: impl std::fmt::Display) {
        self.errors.push(format!(
            "NetworkPolicy {}: {field}: {msg}",
            self.policy_name
        ));
    }

    fn ingress_rule(
        &mut self,
        field: &str,
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

    fn egress_rule(
        &mut self,
        field: &str,
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
        ));
        rules
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

    /// The rule's ports; None when a port is invalid, which drops the rule so
    /// an error can only narrow what is allowed.
    fn ports(&mut self, field: &str, ports: Option<&[NetworkPolicyPort]>) -> Option<Vec<PortSpec>> {
        let mut out = Vec::new();
        for (i, p) in ports.unwrap_or_default().iter().enumerate() {
            let f = format!("{field}.ports[{i}]");
            let proto = match parse_protocol(p.protocol.as_deref()) {
                Ok(proto) => proto,
                Err(e) => {
                    self.error(&f, e);
                    return None;
                }
            };
            match (&p.port, p.end_port) {
                (None, None) => out.push(PortSpec::Numbered(range(proto, 0, 0))),
                (None, Some(_)) => {
                    self.error(&f, "endPort requires port");
                    return None;
                }
                (Some(IntOrString::String(name)), None) => {
                    if let Ok(n) = name.parse::<i32>() {
                        // Tolerate quoted numbers from hand-written manifests.
                        out.push(PortSpec::Numbered(self.number(&f, proto, n, None)?));
                    } else {
                        out.push(PortSpec::Named(proto, name.clone()));
                    }
                }
                (Some(IntOrString::String(_)), Some(_)) => {
                    self.error(&f, "endPort cannot be used with a named port");
                    return None;
                }
                (Some(IntOrString::Int(n)), end) => {
                    out.push(PortSpec::Numbered(self.number(&f, proto, *n, end)?));
                }
            }
        }
        Some(out)
    }

    fn number(
        &mut self,
        f: &str,
        proto: Protocol,
        port: i32,
        end: Option<i32>,
    ) -> Option<PortRange> {
        if !(1..=65535).contains(&port) {
            self.error(f, format!("port {port} is out of range 1-65535"));
            return None;
        }
        if let Some(end) = end {
            if !(1..=65535).contains(&end) || end < port {
                self.error(
                    f,
                    format!("endPort {end} must be between port {port} and 65535"),
                );
                return None;
            }
        }
        Some(range(proto, port as u32, end.map_or(0, |e| e as u32)))
    }

    fn peers(
        &mut self,
        field: &str,
        key: &str,
        peers: Option<&[NetworkPolicyPeer]>,
    ) -> Vec<PeerSpec> {
        let peers = peers.unwrap_or_default();
        if peers.is_empty() {
            // No peers listed: every address, in both families.
            return vec![
                PeerSpec::Block(block(prefix("0.0.0.0/0".parse().unwrap()), vec![])),
                PeerSpec::Block(block(prefix("::/0".parse().unwrap()), vec![])),
            ];
        }
        let mut out = Vec::new();
        for (i, peer) in peers.iter().enumerate() {
            let f = format!("{field}.{key}[{i}]");
            if let Some(ip_block) = &peer.ip_block {
                match parse_block(
                    &ip_block.cidr,
                    ip_block.except.as_deref().unwrap_or_default(),
                ) {
                    Ok(b) => out.push(PeerSpec::Block(b)),
                    Err(e) => self.error(&format!("{f}.ipBlock"), e),
                }
                continue;
            }
            if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
                self.error(
                    &f,
                    "peer has none of podSelector, namespaceSelector, ipBlock",
                );
                continue;
            }
            // Checked here, whatever pods exist, so that an invalid selector
            // is reported the same way by every selection strategy.
            if let Some(Err(e)) = peer.namespace_selector.as_ref().map(validate_selector) {
                self.error(&f, format!("namespaceSelector: {e}"));
                continue;
            }
            if let Some(Err(e)) = peer.pod_selector.as_ref().map(validate_selector) {
                self.error(&f, format!("podSelector: {e}"));
                continue;
            }
            match self.selection.select(self.policy_ns, peer) {
                Ok(selected) => out.push(PeerSpec::Pods(selected)),
                Err(e) => self.error(&f, e),
            }
        }
        out
    }
}

fn named(pod: &PodInfo, proto: Protocol, name: &str) -> Vec<PortRange> {
    pod.named_ports
        .get(name)
        .into_iter()
        .flatten()
        .filter(|(p, _)| *p == proto)
        .map(|(p, n)| range(*p, u32::from(*n), 0))
        .collect()
}

fn peer_blocks(peers: &[PeerSpec]) -> Vec<PeerBlock> {
    let mut out = Vec::new();
    for peer in peers {
        match peer {
            PeerSpec::Block(b) => out.push(b.clone()),
            PeerSpec::Pods(selected) => out.extend_from_slice(&selected.blocks),
        }
    }
    out
}

fn block_contains(b: &PeerBlock, ip: IpAddr) -> bool {
    let net = |p: &IpPrefix| -> Option<IpNet> {
        let addr = match p.addr.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(p.addr.as_slice()).ok()?),
            16 => IpAddr::from(<[u8; 16]>::try_from(p.addr.as_slice()).ok()?),
            _ => return None,
        };
        IpNet::new(addr, p.prefix_len as u8).ok()
    };
    b.cidr
        .as_ref()
        .and_then(net)
        .is_some_and(|c| c.contains(&ip))
        && !b.except.iter().filter_map(net).any(|e| e.contains(&ip))
}

fn range(proto: Protocol, port: u32, end_port: u32) -> PortRange {
    PortRange {
        protocol: proto as i32,
        port,
        end_port,
    }
}

pub(crate) fn block(cidr: IpPrefix, except: Vec<IpPrefix>) -> PeerBlock {
    PeerBlock {
        cidr: Some(cidr),
        except,
    }
}

/// Parses an ipBlock. Host bits set in a CIDR are an error, as the API server
/// would reject them; an except must lie inside the CIDR.
pub fn parse_block(cidr: &str, except: &[String]) -> Result<PeerBlock, String> {
    let net = parse_cidr(cidr)?;
    let mut out = Vec::new();
    for e in except {
        let ex = parse_cidr(e).map_err(|m| format!("except: {m}"))?;
        if !net.contains(&ex) {
            return Err(format!("except {e:?} is not inside cidr {cidr:?}"));
        }
        out.push(prefix(ex));
    }
    Ok(block(prefix(net), out))
}

fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let net: IpNet = s
        .parse()
        .map_err(|_| format!("{s:?} is not a CIDR (want e.g. 10.0.0.0/8 or fd00::/64)"))?;
    if net.trunc() != net {
        return Err(format!(
            "{s:?} has host bits set (did you mean {}?)",
            net.trunc()
        ));
    }
    Ok(net)
}

pub fn prefix(net: IpNet) -> IpPrefix {
    IpPrefix::new(net.addr(), net.prefix_len())
}

#[cfg(test)]
mod tests;
