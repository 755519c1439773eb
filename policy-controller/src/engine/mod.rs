//! The incremental engine: the cluster's objects in indexes, peer selections
//! shared between rules, and every node's plan, kept up to date change by
//! change. A change recomputes only the targets it can affect:
//!
//! - a pod added, deleted or changed: itself, and the targets whose rules
//!   used a selection that held it or now holds it (or resolved a named
//!   port it carries);
//! - a namespace relabelled: the targets whose rules used a namespace
//!   selector that now decides differently for it;
//! - a policy added, edited or deleted: the pods of its namespace that the
//!   old or the new version selects;
//! - a ClusterNetworkPolicy added, edited or deleted: the pods the old or
//!   the new version's subject selects; a namespace relabelled while any
//!   exists: the pods of that namespace too (a subject may select by
//!   namespace labels); a node added, changed or deleted: the pods of the
//!   policies with a `nodes` peer;
//! - a Service added, edited or deleted, or a pod that starts or stops
//!   backing one (or backs it with other addresses or named ports): the
//!   targets whose egress rules read the Services of its namespace; a
//!   Service without a selector or one of its EndpointSlices: the targets
//!   that read those (see `services`).
//!
//! Each target is computed by the same code as the full computation
//! (`resolve::resolve_pod`); only how peers are found differs. The full
//! computation stays the oracle: the property tests check that after any
//! sequence of changes the plans and errors here equal a full recompute.

mod cluster_policy_endpoints;
mod objects;
mod pass;
mod policy_endpoints;
mod selection;
mod services;
mod view;

use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::cluster::{ClusterState, Object};
use crate::keys::{ObjectKey, PodKey};
use crate::plan::{Entry, Plan};
use crate::resolve::{
    is_selectorless, namespace_of, node_ips, ns_labels, pod_info, resolve_pod, selector_matches,
    slice_service, PodInfo, Resolution, TieredPolicy, AUDIT_ANNOTATION,
};
use crate::source::cluster_policy_endpoint::merge::ClusterEndpointPolicy;
use crate::source::cluster_policy_endpoint::ClusterPolicyEndpoint;
use crate::source::policy_endpoint::merge::EndpointPolicy;
use crate::source::policy_endpoint::PolicyEndpoint;
use cluster_policy_endpoints::ClusterEndpointPolicies;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use objects::{Labels, Objects};
use palisade_apis::application_network_policy::DOMAIN_NAMES_ANNOTATION;
use palisade_apis::{ApiGroup, ClusterNetworkPolicy};
use policy_endpoints::EndpointPolicies;
use selection::{Selections, Selector, Used};
use services::ServiceCache;

/// One change to the cluster.
// Changes are short-lived on the way into the engine; boxing the large Pod
// variant would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Change {
    ApplyNamespace(Namespace),
    DeleteNamespace(String),
    ApplyPod(Pod),
    DeletePod(PodKey),
    ApplyPolicy(NetworkPolicy),
    DeletePolicy(ObjectKey),
    ApplyService(Service),
    DeleteService(ObjectKey),
    ApplyEndpointSlice(EndpointSlice),
    DeleteEndpointSlice(ObjectKey),
    /// A slice of a policy resolved by the AWS network policy controller.
    ApplyPolicyEndpoint(PolicyEndpoint),
    DeletePolicyEndpoint(ObjectKey),
    /// A slice of a ClusterNetworkPolicy resolved by the AWS network policy
    /// controller (cluster-scoped: by name).
    ApplyClusterPolicyEndpoint(ClusterPolicyEndpoint),
    DeleteClusterPolicyEndpoint(String),
    /// A ClusterNetworkPolicy of either API group, read.
    ApplyClusterPolicy(ClusterNetworkPolicy),
    DeleteClusterPolicy(ApiGroup, String),
    ApplyNode(Node),
    DeleteNode(String),
}

/// Pods that resolve alike: resolution reads of its target only the
/// namespace, the labels and the named ports (besides the name and the
/// addresses, which are the entry's own fields), and the PolicyEndpoint
/// and ClusterPolicyEndpoint policies that select it (which may list pods
/// by name).
struct Class(
    Arc<PodInfo>,
    Vec<Arc<EndpointPolicy>>,
    Vec<Arc<ClusterEndpointPolicy>>,
);

impl PartialEq for Class {
    fn eq(&self, other: &Class) -> bool {
        let (a, b) = (&*self.0, &*other.0);
        a.namespace == b.namespace
            && a.labels == b.labels
            && a.named_ports == b.named_ports
            && self.1.len() == other.1.len()
            && self.1.iter().zip(&other.1).all(|(x, y)| Arc::ptr_eq(x, y))
            && self.2.len() == other.2.len()
            && self.2.iter().zip(&other.2).all(|(x, y)| Arc::ptr_eq(x, y))
    }
}

impl Eq for Class {}

impl std::hash::Hash for Class {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.namespace.hash(state);
        self.0.labels.hash(state);
        self.0.named_ports.hash(state);
        for p in &self.1 {
            p.name.hash(state);
        }
        for p in &self.2 {
            p.name.hash(state);
        }
    }
}

/// What computing one class gave, shared by its pods.
struct ClassResult {
    entry: Entry,
    /// Shared by the pods of a class.
    used: Arc<Used>,
    errors: Vec<String>,
}

impl From<Object> for Change {
    /// The object created or updated.
    fn from(object: Object) -> Change {
        match object {
            Object::Namespace(ns) => Change::ApplyNamespace(ns),
            Object::Pod(pod) => Change::ApplyPod(pod),
            Object::NetworkPolicy(np) => Change::ApplyPolicy(np),
            Object::Service(svc) => Change::ApplyService(svc),
            Object::EndpointSlice(slice) => Change::ApplyEndpointSlice(slice),
            Object::ClusterNetworkPolicy(p) => Change::ApplyClusterPolicy(p),
            Object::Node(n) => Change::ApplyNode(n),
        }
    }
}

/// A target's result and what computing it used.
struct Target {
    node: String,
    used: Arc<Used>,
    errors: Vec<String>,
}

#[derive(Default)]
pub struct Engine {
    objects: Objects,
    selections: Selections,
    services: ServiceCache,
    endpoint_policies: EndpointPolicies,
    cluster_endpoint_policies: ClusterEndpointPolicies,
    targets: HashMap<Arc<PodKey>, Target>,
    plans: HashMap<String, Arc<Plan>>,
    /// Every distinct problem, with how many targets found it.
    errors: BTreeMap<String, usize>,
    /// Targets that changes taken by [`Engine::stage`] may affect, computed
    /// by the next [`Engine::apply`].
    staged: HashSet<PodKey>,
}

/// The nodes whose plan changed, with their new plans.
#[derive(Debug, Default)]
pub struct Outcome {
    pub changed: BTreeMap<String, Arc<Plan>>,
    /// How many targets were recomputed.
    pub recomputed: usize,
}

impl Engine {
    /// The full computation through the indexes: every object added, then
    /// every pod computed once.
    pub fn from_state(state: &ClusterState) -> (Engine, Outcome) {
        let mut engine = Engine::default();
        let objects = state
            .namespaces
            .iter()
            .cloned()
            .map(Object::Namespace)
            .chain(state.pods.iter().cloned().map(Object::Pod))
            .chain(state.policies.iter().cloned().map(Object::NetworkPolicy))
            .chain(state.services.iter().cloned().map(Object::Service))
            .chain(
                state
                    .endpoint_slices
                    .iter()
                    .cloned()
                    .map(Object::EndpointSlice),
            )
            .chain(
                state
                    .cluster_policies
                    .iter()
                    .cloned()
                    .map(Object::ClusterNetworkPolicy),
            )
            .chain(state.nodes.iter().cloned().map(Object::Node));
        engine.stage(objects.map(Change::from));
        let outcome = engine.apply([]);
        (engine, outcome)
    }

    /// Applies changes, then recomputes what they (and the changes staged
    /// before) can affect.
    pub fn apply(&mut self, changes: impl IntoIterator<Item = Change>) -> Outcome {
        let mut dirty = HashSet::new();
        for change in changes {
            self.take(change, &mut dirty);
        }
        self.recompute(dirty)
    }

    /// Takes changes in without computing anything yet: a source's first
    /// list arrives in pieces, and resolving after each piece would
    /// recompute the same targets over and over (and with half the cluster
    /// listed). The next [`Engine::apply`] computes what they affect.
    pub fn stage(&mut self, changes: impl IntoIterator<Item = Change>) {
        let mut dirty = std::mem::take(&mut self.staged);
        for change in changes {
            self.take(change, &mut dirty);
        }
        self.staged = dirty;
    }

    /// Brings the engine to `state`, by the changes that lead there. The
    /// diff itself looks at every object; what is recomputed is only what
    /// changed.
    pub fn sync(&mut self, state: &ClusterState) -> Outcome {
        let changes = self.diff(state);
        self.apply(changes)
    }

    /// Every node's plan as the engine holds it.
    pub fn plans(&self) -> &HashMap<String, Arc<Plan>> {
        &self.plans
    }

    pub fn errors(&self) -> Vec<String> {
        let mut errors: Vec<String> = self.errors.keys().cloned().collect();
        let mut from_slices = self.endpoint_policies.errors();
        from_slices.extend(self.cluster_endpoint_policies.errors());
        if !from_slices.is_empty() {
            errors.extend(from_slices);
            errors.sort();
            errors.dedup();
        }
        errors
    }

    /// Plans and errors in the shape of the full computation, for
    /// comparing with it. Nodes left without pods are left out, as there.
    pub fn resolution(&self) -> Resolution {
        Resolution {
            plans: self
                .plans
                .iter()
                .filter(|(_, p)| !p.pods.is_empty())
                .map(|(n, p)| (n.clone(), p.decode()))
                .collect(),
            errors: self.errors(),
        }
    }

    /// ClusterNetworkPolicies held, by (tier, API group).
    pub fn cluster_policy_counts(&self) -> BTreeMap<(&'static str, &'static str), usize> {
        let mut out = BTreeMap::new();
        for t in self.objects.tiered() {
            *out.entry((t.policy.tier.as_str(), t.policy.group.group()))
                .or_default() += 1;
        }
        // Policies read from ClusterPolicyEndpoints (policySource:
        // policyendpoint) are the AWS group's, counted as the objects are.
        for tier in self.cluster_endpoint_policies.tiers() {
            *out.entry((tier.as_str(), ApiGroup::Aws.group()))
                .or_default() += 1;
        }
        out
    }

    /// Sizes, for the benchmark and the debug log.
    pub fn stats(&self) -> Stats {
        Stats {
            pods: self.objects.pod_count(),
            policies: self.objects.policy_count(),
            selections: self.selections.len(),
            nodes: self.plans.len(),
        }
    }

    fn diff(&self, state: &ClusterState) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut seen_ns = HashSet::new();
        for ns in &state.namespaces {
            let name = ns.metadata.name.clone().unwrap_or_default();
            if self.objects.ns_object_labels(&name) != Some(&ns_labels(ns)) {
                changes.push(Change::ApplyNamespace(ns.clone()));
            }
            seen_ns.insert(name);
        }
        for name in self.objects.namespaces() {
            if self.objects.ns_object_labels(name).is_some() && !seen_ns.contains(name) {
                changes.push(Change::DeleteNamespace(name.clone()));
            }
        }
        let mut seen_pods = HashSet::new();
        for pod in &state.pods {
            let info = pod_info(pod);
            let key = (
                namespace_of(&pod.metadata),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            if self.objects.pod(&key).map(|p| &**p) != info.as_ref() {
                changes.push(match info {
                    Some(_) => Change::ApplyPod(pod.clone()),
                    None => Change::DeletePod(key.clone()),
                });
            }
            seen_pods.insert(key);
        }
        for pod in self.objects.all_pods() {
            let key = pod.key();
            if !seen_pods.contains(&key) {
                changes.push(Change::DeletePod(key));
            }
        }
        let mut seen_policies = HashSet::new();
        for np in &state.policies {
            let key = (
                namespace_of(&np.metadata),
                np.metadata.name.clone().unwrap_or_default(),
            );
            let known = self
                .objects
                .policy(&key.0, &key.1)
                .map(|p| (&p.spec, read_annotations(&p.metadata)));
            if known != Some((&np.spec, read_annotations(&np.metadata))) {
                changes.push(Change::ApplyPolicy(np.clone()));
            }
            seen_policies.insert(key);
        }
        for key in self.objects.policy_keys() {
            if !seen_policies.contains(&key) {
                changes.push(Change::DeletePolicy(key));
            }
        }
        let mut seen_services = HashSet::new();
        for svc in &state.services {
            let key = object_key(&svc.metadata);
            if self.objects.service(&key.0, &key.1).map(|s| &s.spec) != Some(&svc.spec) {
                changes.push(Change::ApplyService(svc.clone()));
            }
            seen_services.insert(key);
        }
        for key in self.objects.service_keys() {
            if !seen_services.contains(&key) {
                changes.push(Change::DeleteService(key));
            }
        }
        let mut seen_slices = HashSet::new();
        for slice in &state.endpoint_slices {
            let key = object_key(&slice.metadata);
            if self.objects.slice(&key).map(|s| slice_content(s)) != Some(slice_content(slice)) {
                changes.push(Change::ApplyEndpointSlice(slice.clone()));
            }
            seen_slices.insert(key);
        }
        for key in self.objects.slice_keys() {
            if !seen_slices.contains(key) {
                changes.push(Change::DeleteEndpointSlice(key.clone()));
            }
        }
        let mut seen_tiered = HashSet::new();
        for p in &state.cluster_policies {
            let key = (p.group, p.name.clone());
            if self.objects.tiered_policy(&key).map(|t| &t.policy) != Some(p) {
                changes.push(Change::ApplyClusterPolicy(p.clone()));
            }
            seen_tiered.insert(key);
        }
        for t in self.objects.tiered() {
            let key = (t.policy.group, t.policy.name.clone());
            if !seen_tiered.contains(&key) {
                changes.push(Change::DeleteClusterPolicy(key.0, key.1));
            }
        }
        let mut seen_nodes = HashSet::new();
        for n in &state.nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let known = self
                .objects
                .node(&name)
                .map(|k| (k.metadata.labels.clone(), node_ips(k)));
            if known != Some((n.metadata.labels.clone(), node_ips(n))) {
                changes.push(Change::ApplyNode(n.clone()));
            }
            seen_nodes.insert(name);
        }
        for n in self.objects.nodes() {
            let name = n.metadata.name.clone().unwrap_or_default();
            if !seen_nodes.contains(&name) {
                changes.push(Change::DeleteNode(name));
            }
        }
        changes
    }

    /// Records one change in the objects and marks what it can affect.
    fn take(&mut self, change: Change, dirty: &mut HashSet<PodKey>) {
        match change {
            Change::ApplyNamespace(ns) => {
                let name = ns.metadata.name.clone().unwrap_or_default();
                self.set_namespace(&name, Some(ns_labels(&ns)), dirty);
            }
            Change::DeleteNamespace(name) => self.set_namespace(&name, None, dirty),
            Change::ApplyPod(pod) => {
                let key = (
                    namespace_of(&pod.metadata),
                    pod.metadata.name.clone().unwrap_or_default(),
                );
                self.set_pod(&key, pod_info(&pod).map(Arc::new), dirty);
            }
            Change::DeletePod(key) => self.set_pod(&key, None, dirty),
            Change::ApplyPolicy(mut np) => {
                let ns = namespace_of(&np.metadata);
                let name = np.metadata.name.clone().unwrap_or_default();
                let read = read_annotations(&np.metadata);
                np.metadata = bare_meta(&ns, &name);
                np.metadata.annotations = (!read.is_empty()).then_some(read);
                self.set_policy(&ns, &name, Some(Arc::new(np)), dirty);
            }
            Change::DeletePolicy((ns, name)) => self.set_policy(&ns, &name, None, dirty),
            Change::ApplyService(mut svc) => {
                let (ns, name) = object_key(&svc.metadata);
                svc.metadata = bare_meta(&ns, &name);
                svc.status = None;
                self.set_service(&ns, &name, Some(Arc::new(svc)), dirty);
            }
            Change::DeleteService((ns, name)) => self.set_service(&ns, &name, None, dirty),
            Change::ApplyEndpointSlice(slice) => {
                let key = object_key(&slice.metadata);
                self.set_slice(&key, Some(Arc::new(slice)), dirty);
            }
            Change::DeleteEndpointSlice(key) => self.set_slice(&key, None, dirty),
            Change::ApplyPolicyEndpoint(pe) => {
                self.endpoint_policies.apply(&pe, &self.objects, dirty)
            }
            Change::DeletePolicyEndpoint(key) => {
                self.endpoint_policies.delete(&key, &self.objects, dirty)
            }
            Change::ApplyClusterPolicyEndpoint(cpe) => {
                self.cluster_endpoint_policies
                    .apply(&cpe, &self.objects, dirty)
            }
            Change::DeleteClusterPolicyEndpoint(name) => {
                self.cluster_endpoint_policies
                    .delete(&name, &self.objects, dirty)
            }
            Change::ApplyClusterPolicy(p) => {
                let key = (p.group, p.name.clone());
                self.set_tiered(key, Some(Arc::new(TieredPolicy::new(p))), dirty);
            }
            Change::DeleteClusterPolicy(group, name) => self.set_tiered((group, name), None, dirty),
            Change::ApplyNode(mut node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                // Only what a `nodes` peer reads: labels and addresses.
                node.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(name.clone()),
                    labels: node.metadata.labels.take(),
                    ..Default::default()
                };
                node.spec = None;
                node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                    addresses: node.status.and_then(|s| s.addresses),
                    ..Default::default()
                });
                self.set_node(&name, Some(Arc::new(node)), dirty);
            }
            Change::DeleteNode(name) => self.set_node(&name, None, dirty),
        }
    }

    fn set_tiered(
        &mut self,
        key: objects::TieredKey,
        policy: Option<Arc<TieredPolicy>>,
        dirty: &mut HashSet<PodKey>,
    ) {
        if let Some(new) = &policy {
            dirty.extend(self.objects.subject_pods(new));
        }
        let old = self.objects.set_tiered(key, policy.clone());
        if let Some(old) = old {
            // An edit that keeps the subject selects the same pods: the walk
            // over them (every pod, for a cluster-wide policy) is done once.
            let same_subject = policy
                .as_ref()
                .is_some_and(|new| new.policy.subject == old.policy.subject);
            if !same_subject {
                dirty.extend(self.objects.subject_pods(&old));
            }
        }
    }

    fn set_node(&mut self, name: &str, node: Option<Arc<Node>>, dirty: &mut HashSet<PodKey>) {
        let before = self
            .objects
            .node(name)
            .map(|n| (n.metadata.labels.clone(), node_ips(n)));
        let after = node
            .as_ref()
            .map(|n| (n.metadata.labels.clone(), node_ips(n)));
        self.objects.set_node(name, node);
        if before == after {
            return;
        }
        let readers: Vec<Arc<TieredPolicy>> = self
            .objects
            .tiered()
            .filter(|t| t.reads_nodes())
            .cloned()
            .collect();
        for t in readers {
            dirty.extend(self.objects.subject_pods(&t));
        }
    }

    fn set_service(
        &mut self,
        ns: &str,
        name: &str,
        svc: Option<Arc<Service>>,
        dirty: &mut HashSet<PodKey>,
    ) {
        let new = svc.clone();
        let old = self.objects.set_service(ns, name, svc);
        if old.as_ref().map(|s| &s.spec) == new.as_ref().map(|s| &s.spec) {
            return;
        }
        let versions = || old.iter().chain(new.iter());
        if versions().any(|s| !is_selectorless(s)) {
            self.services.namespace_changed(ns, dirty);
        }
        if versions().any(|s| is_selectorless(s)) {
            self.services.selectorless_changed(dirty);
        }
    }

    fn set_slice(
        &mut self,
        key: &ObjectKey,
        slice: Option<Arc<EndpointSlice>>,
        dirty: &mut HashSet<PodKey>,
    ) {
        let new = slice.clone();
        let old = self.objects.set_slice(key, slice);
        if old.as_deref().map(slice_content) == new.as_deref().map(slice_content) {
            return;
        }
        // Only a Service without a selector reads its slices.
        let read = old
            .iter()
            .chain(new.iter())
            .filter_map(|s| slice_service(s))
            .any(|svc| {
                self.objects
                    .service(&key.0, svc)
                    .is_some_and(|s| is_selectorless(s))
            });
        if read {
            self.services.selectorless_changed(dirty);
        }
    }

    fn set_namespace(&mut self, ns: &str, labels: Option<Labels>, dirty: &mut HashSet<PodKey>) {
        let before = self.objects.ns_labels(ns);
        self.objects.set_namespace(ns, labels);
        let after = self.objects.ns_labels(ns);
        if before != after {
            self.selections
                .namespace_changed(ns, before.as_ref(), after.as_ref(), dirty);
            // A ClusterNetworkPolicy's subject may select by namespace labels.
            if self.objects.tiered().next().is_some()
                || self.cluster_endpoint_policies.reads_namespaces()
            {
                dirty.extend(self.objects.pods_in(ns).map(|p| p.key()));
            }
        }
    }

    fn set_pod(&mut self, key: &PodKey, pod: Option<Arc<PodInfo>>, dirty: &mut HashSet<PodKey>) {
        // A pod changes its namespace's labels only when the namespace has
        // no object (then the pods make it exist); otherwise the labels are
        // read once, without a copy.
        let ns_object = self.objects.ns_object_labels(&key.0).is_some();
        let ns_before = (!ns_object)
            .then(|| self.objects.ns_labels(&key.0))
            .flatten();
        let old = self.objects.set_pod(key, pod.clone());
        if old.as_deref() == pod.as_deref() {
            return;
        }
        if ns_object {
            let labels = self.objects.ns_object_labels(&key.0);
            self.selections.pod_changed(
                &key.0,
                (old.as_deref(), labels),
                (pod.as_deref(), labels),
                dirty,
            );
        } else {
            let ns_after = self.objects.ns_labels(&key.0);
            self.selections.pod_changed(
                &key.0,
                (old.as_deref(), ns_before.as_ref()),
                (pod.as_deref(), ns_after.as_ref()),
                dirty,
            );
            if ns_before != ns_after {
                self.selections.namespace_changed(
                    &key.0,
                    ns_before.as_ref(),
                    ns_after.as_ref(),
                    dirty,
                );
            }
        }
        if ServiceCache::pod_changes_backends(&self.objects, &key.0, old.as_deref(), pod.as_deref())
        {
            self.services.namespace_changed(&key.0, dirty);
        }
        dirty.insert(key.clone());
    }

    fn set_policy(
        &mut self,
        ns: &str,
        name: &str,
        policy: Option<Arc<NetworkPolicy>>,
        dirty: &mut HashSet<PodKey>,
    ) {
        let new = policy.clone();
        let old = self.objects.set_policy(ns, name, policy);
        let selects = |np: &Option<Arc<NetworkPolicy>>, pod: &PodInfo| {
            np.as_ref().is_some_and(|np| match np.spec.as_ref() {
                None => false,
                // An invalid selector is reported for every pod it meets.
                Some(spec) => spec
                    .pod_selector
                    .as_ref()
                    .is_none_or(|s| selector_matches(s, &pod.labels).unwrap_or(true)),
            })
        };
        for pod in self.objects.pods_in(ns) {
            if selects(&old, pod) || selects(&new, pod) {
                dirty.insert(pod.key());
            }
        }
    }

    fn recompute(&mut self, mut dirty: HashSet<PodKey>) -> Outcome {
        dirty.extend(self.staged.drain());
        let mut outcome = Outcome {
            recomputed: dirty.len(),
            ..Default::default()
        };
        let mut changed_nodes = BTreeSet::new();
        // Pods that resolve alike are resolved once per pass: the objects do
        // not change during a pass, so neither does what a class resolves to
        // (nor a ClusterNetworkPolicy's rules, see `pass`). A class is of
        // one namespace, and targets come a namespace at a time, so the
        // classes of the namespaces before are not asked for again: kept,
        // they made a table of every class of the cluster for a change that
        // reaches every pod.
        let mut memo: HashMap<Class, ClassResult> = HashMap::new();
        let mut tiers = pass::TierMemo::default();
        // In namespace order: pods of one namespace share their policies,
        // selections and Services, which then stay in cache from one target
        // to the next (a hash set's order jumps across the whole cluster).
        let mut order: Vec<PodKey> = dirty.into_iter().collect();
        order.sort_unstable();
        for (i, key) in order.iter().enumerate() {
            if i > 0 && order[i - 1].0 != key.0 {
                memo.clear();
            }
            self.recompute_target(key, &mut memo, &mut tiers, &mut changed_nodes);
        }
        self.selections.end_pass();
        for node in changed_nodes {
            let plan = self.plans.get(&node).cloned().unwrap_or_default();
            outcome.changed.insert(node, plan);
        }
        outcome
    }

    fn recompute_target(
        &mut self,
        key: &PodKey,
        memo: &mut HashMap<Class, ClassResult>,
        tiers: &mut pass::TierMemo,
        changed: &mut BTreeSet<String>,
    ) {
        let (shared, old) = match self.targets.remove_entry(key) {
            Some((k, t)) => (selection::Target(k), Some(t)),
            None => (selection::Target(Arc::new(key.clone())), None),
        };
        let pod = self
            .objects
            .pod(key)
            .filter(|p| !p.host_network && p.node.is_some())
            .cloned();
        let (new, entry) = match pod {
            None => (None, None),
            Some(pod) => {
                let node = pod.node.clone().expect("filtered above");
                let class = Class(
                    pod.clone(),
                    self.endpoint_policies.selecting(&pod),
                    self.cluster_endpoint_policies
                        .selecting(&pod, &self.objects),
                );
                let computed = match memo.get(&class) {
                    Some(r) => ClassResult {
                        entry: r.entry.sibling(&pod.namespace, &pod.name, &pod.ips),
                        used: r.used.clone(),
                        errors: r.errors.clone(),
                    },
                    None => {
                        let r = self.compute_class(&pod, &class.1, &class.2, tiers);
                        memo.insert(
                            class,
                            ClassResult {
                                entry: r.entry.clone(),
                                used: r.used.clone(),
                                errors: r.errors.clone(),
                            },
                        );
                        r
                    }
                };
                let target = Target {
                    node,
                    used: computed.used,
                    errors: computed.errors,
                };
                (Some(target), Some(computed.entry))
            }
        };
        let empty = Used::default();
        let (used_before, used_now) = (
            old.as_ref().map_or(&empty, |t| &*t.used),
            new.as_ref().map_or(&empty, |t| &*t.used),
        );
        // A target recomputed to what it used before (most of them, when a
        // ClusterNetworkPolicy edit recomputes every pod) keeps its links.
        if used_before != used_now {
            self.selections.depend(&shared, used_before, used_now);
            self.services.depend(&shared, used_before, used_now);
        }
        for e in old.iter().flat_map(|t| &t.errors) {
            if let Some(n) = self.errors.get_mut(e) {
                *n -= 1;
                if *n == 0 {
                    self.errors.remove(e);
                }
            }
        }
        for e in new.iter().flat_map(|t| &t.errors) {
            *self.errors.entry(e.clone()).or_default() += 1;
        }
        if let Some(old) = &old {
            if new.as_ref().map(|t| &t.node) != Some(&old.node) {
                self.set_entry(&old.node, &shared, None, changed);
            }
        }
        if let (Some(new), Some(entry)) = (&new, entry) {
            self.set_entry(&new.node, &shared, Some(entry), changed);
        }
        if let Some(t) = new {
            self.targets.insert(shared.0, t);
        }
    }

    /// One pod's policy, through the indexes and the selection cache, with
    /// what the PolicyEndpoint policies that select it add.
    fn compute_class(
        &mut self,
        pod: &PodInfo,
        endpoint_policies: &[Arc<EndpointPolicy>],
        cluster_endpoint_policies: &[Arc<ClusterEndpointPolicy>],
        tiers: &mut pass::TierMemo,
    ) -> ClassResult {
        let mut selector = Selector {
            objects: &self.objects,
            cache: &mut self.selections,
            services: &mut self.services,
            used: Used::default(),
        };
        let mut errors = Vec::new();
        let policies: Vec<Arc<NetworkPolicy>> =
            self.objects.policies_in(&pod.namespace).cloned().collect();
        let objects = &self.objects;
        let tiered = tiers.selecting(
            pod,
            || objects.ns_labels(&pod.namespace).unwrap_or_default(),
            objects.tiered(),
            &mut errors,
        );
        let tiered: Vec<_> = tiered
            .iter()
            .map(|t| (&**t, tiers.rules(t, pod, &mut selector, &mut errors)))
            .collect();
        let mut policy = resolve_pod(
            pod,
            policies.iter().map(|p| &**p),
            tiered,
            &mut selector,
            &mut errors,
        );
        policy_endpoints::add_to(&mut policy, endpoint_policies);
        cluster_policy_endpoints::add_to(&mut policy, cluster_endpoint_policies);
        errors.sort();
        errors.dedup();
        ClassResult {
            entry: Entry::new(policy),
            used: Arc::new(selector.used),
            errors,
        }
    }

    fn set_entry(
        &mut self,
        node: &str,
        key: &selection::Target,
        entry: Option<Entry>,
        changed: &mut BTreeSet<String>,
    ) {
        // Looked up before inserting: `entry` would copy the node's name for
        // every pod.
        let plan = match self.plans.get_mut(node) {
            Some(plan) => plan,
            None => self.plans.entry(node.to_string()).or_default(),
        };
        let changed_here = match (Arc::get_mut(plan), entry) {
            // This pass already copied the plan: one lookup does it.
            (Some(owned), Some(e)) => match owned.pods.entry(key.0.clone()) {
                btree_map::Entry::Occupied(mut slot) if *slot.get() != e => {
                    slot.insert(e);
                    true
                }
                btree_map::Entry::Occupied(_) => false,
                btree_map::Entry::Vacant(slot) => {
                    slot.insert(e);
                    true
                }
            },
            (Some(owned), None) => owned.pods.remove(&key.0).is_some(),
            (None, entry) => {
                if plan.pods.get(&key.0) == entry.as_ref() {
                    return;
                }
                // Copy-on-write: the hub shares the previous plan until it
                // is replaced.
                let plan = Arc::make_mut(plan);
                match entry {
                    Some(e) => plan.pods.insert(key.0.clone(), e),
                    None => plan.pods.remove(&key.0),
                };
                true
            }
        };
        if changed_here && !changed.contains(node) {
            changed.insert(node.to_string());
        }
    }
}

/// The annotations of a policy that resolution reads: staging, and an
/// ApplicationNetworkPolicy's names (see `palisade_apis`).
fn read_annotations(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    const READ: [&str; 2] = [AUDIT_ANNOTATION, DOMAIN_NAMES_ANNOTATION];
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| READ.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Only what resolution reads of a policy's or a Service's metadata: the
/// rest (annotations such as kubectl's last-applied-configuration, managed
/// fields, labels) can be most of an object, and the engine holds every one.
/// A policy keeps the annotations resolution reads besides (see `take`).
fn bare_meta(ns: &str, name: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        namespace: Some(ns.to_string()),
        name: Some(name.to_string()),
        ..Default::default()
    }
}

fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    (namespace_of(meta), meta.name.clone().unwrap_or_default())
}

/// What of an EndpointSlice resolution reads.
type SliceContent<'a> = (
    Option<&'a BTreeMap<String, String>>,
    &'a str,
    &'a Vec<k8s_openapi::api::discovery::v1::Endpoint>,
    Option<&'a Vec<k8s_openapi::api::discovery::v1::EndpointPort>>,
);

fn slice_content(s: &EndpointSlice) -> SliceContent<'_> {
    (
        s.metadata.labels.as_ref(),
        s.address_type.as_str(),
        &s.endpoints,
        s.ports.as_ref(),
    )
}

#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub pods: usize,
    pub policies: usize,
    pub selections: usize,
    pub nodes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Object;
    use crate::resolve::resolve_cluster;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    fn pod(ns: &str, name: &str, app: &str, node: &str, ip: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"podIP": ip}
        }))
        .unwrap()
    }

    fn allow_from_same_app(ns: &str, name: &str, app: &str) -> NetworkPolicy {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "podSelector": {"matchLabels": {"app": app}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": app}}}]}]
            }
        }))
        .unwrap()
    }

    fn cluster() -> ClusterState {
        let mut objects = Vec::new();
        for (i, ns) in ["a", "b", "c"].iter().enumerate() {
            for j in 0..4 {
                let app = if j < 2 { "one" } else { "two" };
                objects.push(Object::Pod(pod(
                    ns,
                    &format!("p{j}"),
                    app,
                    &format!("n{}", (i * 4 + j) % 5),
                    &format!("10.0.{i}.{j}"),
                )));
            }
            objects.push(Object::NetworkPolicy(allow_from_same_app(ns, "one", "one")));
            objects.push(Object::NetworkPolicy(allow_from_same_app(ns, "two", "two")));
        }
        ClusterState::from_objects(objects, String::new())
    }

    #[test]
    fn full_build_equals_the_oracle_and_shares_selections() {
        let state = cluster();
        let (engine, outcome) = Engine::from_state(&state);
        assert_eq!(engine.resolution(), resolve_cluster(&state));
        assert_eq!(outcome.recomputed, 12);
        // One selection per (namespace, app), used by two targets each.
        assert_eq!(engine.stats().selections, 6);
    }

    #[test]
    fn a_relabel_recomputes_only_its_namespace_peers_and_reaches_their_nodes() {
        let mut state = cluster();
        let (mut engine, _) = Engine::from_state(&state);
        let moved = pod("b", "p0", "two", "n4", "10.0.1.0");
        let outcome = engine.apply([Change::ApplyPod(moved.clone())]);
        // b/p0 itself, b/p1 (lost a peer) and b/p2, b/p3 (gained one).
        assert_eq!(outcome.recomputed, 4);
        let nodes: Vec<&String> = outcome.changed.keys().collect();
        assert_eq!(nodes, ["n0", "n1", "n2", "n4"]);
        let i = state
            .pods
            .iter()
            .position(|p| {
                p.metadata.namespace.as_deref() == Some("b")
                    && p.metadata.name.as_deref() == Some("p0")
            })
            .unwrap();
        state.pods[i] = moved;
        assert_eq!(engine.resolution(), resolve_cluster(&state));
    }

    #[test]
    fn an_unchanged_view_recomputes_nothing() {
        let state = cluster();
        let (mut engine, _) = Engine::from_state(&state);
        let outcome = engine.sync(&state);
        assert_eq!(outcome.recomputed, 0);
        assert!(outcome.changed.is_empty());
    }

    fn service(ns: &str, name: &str, selector: Option<&str>, ip: &str) -> Service {
        let mut spec = serde_json::json!({"clusterIP": ip, "ports": [{"name": "p", "port": 80}]});
        if let Some(app) = selector {
            spec["selector"] = serde_json::json!({"app": app});
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns}, "spec": spec
        }))
        .unwrap()
    }

    fn slice(ns: &str, name: &str, service: &str, ip: &str) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip]}],
            "ports": [{"name": "p", "port": 80}]
        }))
        .unwrap()
    }

    /// The cluster above, and a client in "x" whose egress goes to `app=one`
    /// pods of namespace "a".
    fn cluster_with_client() -> ClusterState {
        let mut state = cluster();
        state
            .pods
            .push(pod("x", "client", "client", "n0", "10.0.9.1"));
        state.policies.push(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "out", "namespace": "x"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "client"}},
                    "policyTypes": ["Egress"],
                    "egress": [{"to": [{
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "a"}},
                        "podSelector": {"matchLabels": {"app": "one"}}
                    }]}]
                }
            }))
            .unwrap(),
        );
        state
    }

    fn client_rules(engine: &Engine) -> usize {
        let plan = &engine.plans()["n0"];
        let client = plan.pods[&("x".to_string(), "client".to_string())].decode();
        client.egress.as_ref().unwrap().rules.len()
    }

    #[test]
    fn service_changes_recompute_only_the_targets_that_read_them() {
        let mut state = cluster_with_client();
        let (mut engine, _) = Engine::from_state(&state);
        assert_eq!(client_rules(&engine), 1, "the pods alone");

        // A Service in "a" backed by the client's peers: only the client reads
        // the Services of "a".
        let svc = service("a", "one", Some("one"), "10.96.0.1");
        let outcome = engine.apply([Change::ApplyService(svc.clone())]);
        assert_eq!(outcome.recomputed, 1);
        assert_eq!(client_rules(&engine), 2, "the pods and the ClusterIP");
        state.services.push(svc);
        assert_eq!(engine.resolution(), resolve_cluster(&state));

        // A Service where no egress rule looks: nothing to recompute.
        let other = service("b", "one", Some("one"), "10.96.0.2");
        assert_eq!(engine.apply([Change::ApplyService(other)]).recomputed, 0);

        // A slice of a Service with a selector is not read.
        let mirrored = slice("a", "one-1", "one", "10.0.0.0");
        assert_eq!(
            engine
                .apply([Change::ApplyEndpointSlice(mirrored)])
                .recomputed,
            0
        );

        // A label no selector reads, on a backend: a0 itself only.
        let mut relabelled = pod("a", "p0", "one", "n0", "10.0.0.0");
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "x".into());
        let outcome = engine.apply([Change::ApplyPod(relabelled)]);
        assert_eq!(outcome.recomputed, 1);

        // A selectorless Service whose slice lists a peer's address: read by
        // every target with egress rules, i.e. the client.
        let ext = service("c", "ext", None, "10.96.0.3");
        assert_eq!(
            engine.apply([Change::ApplyService(ext.clone())]).recomputed,
            1
        );
        assert_eq!(client_rules(&engine), 2);
        let ext_slice = slice("c", "ext-1", "ext", "10.0.0.1");
        assert_eq!(
            engine
                .apply([Change::ApplyEndpointSlice(ext_slice.clone())])
                .recomputed,
            1
        );
        assert_eq!(client_rules(&engine), 3, "and the selectorless ClusterIP");
        state
            .services
            .push(service("b", "one", Some("one"), "10.96.0.2"));
        state.services.push(ext);
        state
            .endpoint_slices
            .push(slice("a", "one-1", "one", "10.0.0.0"));
        state.endpoint_slices.push(ext_slice);
        let i = state
            .pods
            .iter()
            .position(|p| {
                p.metadata.name.as_deref() == Some("p0")
                    && p.metadata.namespace.as_deref() == Some("a")
            })
            .unwrap();
        state.pods[i]
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "x".into());
        assert_eq!(engine.resolution(), resolve_cluster(&state));

        // A backend relabelled out of the client's peers and out of the
        // Services of "a": the client is recomputed; a/one keeps a0 alone,
        // still allowed; the slice address 10.0.0.1 is no peer's any more.
        let outcome = engine.apply([Change::ApplyPod(pod("a", "p1", "two", "n0", "10.0.0.1"))]);
        assert!(outcome.recomputed < 8, "{}", outcome.recomputed);
        assert_eq!(client_rules(&engine), 2);
        engine.apply([Change::DeleteService(("a".into(), "one".into()))]);
        assert_eq!(client_rules(&engine), 1);
    }

    fn staged(mut np: NetworkPolicy, value: Option<&str>) -> NetworkPolicy {
        np.metadata.annotations = value.map(|v| {
            BTreeMap::from([(crate::resolve::AUDIT_ANNOTATION.to_string(), v.to_string())])
        });
        np
    }

    #[test]
    fn only_the_audit_annotation_changing_moves_the_policy_between_staged_and_enforced() {
        let mut state = cluster();
        let (mut engine, _) = Engine::from_state(&state);
        let a_p0 = |engine: &Engine| {
            engine.plans()["n0"].pods[&("a".to_string(), "p0".to_string())].decode()
        };
        let enforced = a_p0(&engine);
        assert_eq!(enforced.policies, vec!["a/one"]);

        // Staging the policy: only its annotation changes, and the pods it
        // selects (a/p0, a/p1) are recomputed and reach their nodes.
        let np = staged(allow_from_same_app("a", "one", "one"), Some("true"));
        let outcome = engine.apply([Change::ApplyPolicy(np.clone())]);
        assert_eq!(outcome.recomputed, 2);
        let nodes: Vec<&String> = outcome.changed.keys().collect();
        assert_eq!(nodes, ["n0", "n1"]);
        let staged_p0 = a_p0(&engine);
        assert_eq!(staged_p0.ingress, None);
        assert_eq!(staged_p0.staged_policies, vec!["a/one"]);
        assert_eq!(staged_p0.audit_ingress, enforced.ingress);
        let i = state
            .policies
            .iter()
            .position(|p| {
                p.metadata.namespace.as_deref() == Some("a")
                    && p.metadata.name.as_deref() == Some("one")
            })
            .unwrap();
        state.policies[i] = np;
        assert_eq!(engine.resolution(), resolve_cluster(&state));
        // sync sees the annotation as a change too, and nothing else.
        assert_eq!(engine.sync(&state).recomputed, 0);

        // Removing it enforces the same rules again.
        let np = staged(allow_from_same_app("a", "one", "one"), None);
        state.policies[i] = np;
        let outcome = engine.sync(&state);
        assert_eq!(outcome.recomputed, 2);
        assert_eq!(a_p0(&engine), enforced);
        assert_eq!(engine.resolution(), resolve_cluster(&state));

        // Other annotations are not kept and change nothing.
        let mut np = allow_from_same_app("a", "one", "one");
        np.metadata.annotations = Some(BTreeMap::from([("note".to_string(), "x".to_string())]));
        assert!(engine.apply([Change::ApplyPolicy(np)]).changed.is_empty());
    }
}
