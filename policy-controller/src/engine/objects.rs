//! The objects resolution reads, with the indexes that let a selector look
//! at candidates instead of every pod: pods by namespace, by label and by
//! named port; namespaces by label; policies by namespace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use palisade_apis::ApiGroup;

use crate::keys::{ObjectKey, PodKey};
use crate::resolve::{
    default_ns_labels, is_selectorless, node_ips, selector_matches, slice_service,
    validate_selector, PodInfo, TieredPolicy,
};

pub type Labels = BTreeMap<String, String>;
type LabelPair = (String, String);

#[derive(Default)]
pub struct Objects {
    /// Labels of namespaces that have an object (with the name label).
    ns_objects: HashMap<String, Labels>,
    /// Namespaces by label, for every namespace with an object or a pod.
    ns_by_label: HashMap<LabelPair, BTreeSet<String>>,
    pods: HashMap<PodKey, Arc<PodInfo>>,
    /// The same pods by namespace, then name.
    pods_by_ns: HashMap<String, BTreeMap<String, Arc<PodInfo>>>,
    pods_by_label: HashMap<LabelPair, BTreeSet<PodKey>>,
    pods_by_port: HashMap<String, BTreeSet<PodKey>>,
    /// Policies by namespace, then name.
    policies: HashMap<String, BTreeMap<String, Arc<NetworkPolicy>>>,
    /// Services by namespace, then name.
    services: HashMap<String, BTreeMap<String, Arc<Service>>>,
    /// Services without a selector, which EndpointSlices back.
    selectorless: BTreeSet<ObjectKey>,
    slices: HashMap<ObjectKey, Arc<EndpointSlice>>,
    /// Slice names by the (namespace, Service name) they belong to.
    slices_by_service: HashMap<ObjectKey, BTreeSet<String>>,
    /// ClusterNetworkPolicies of both groups, by group and name.
    tiered: BTreeMap<TieredKey, Arc<TieredPolicy>>,
    /// Nodes, for `nodes` peers: by name.
    nodes: BTreeMap<String, Arc<Node>>,
}

/// A ClusterNetworkPolicy's API group and name.
pub type TieredKey = (ApiGroup, String);

impl Objects {
    /// The labels a namespace selector sees: the object's, or only the name
    /// label for a namespace known from its pods; None for no namespace.
    pub fn ns_labels(&self, ns: &str) -> Option<Labels> {
        if let Some(labels) = self.ns_objects.get(ns) {
            return Some(labels.clone());
        }
        self.pods_by_ns
            .get(ns)
            .filter(|p| !p.is_empty())
            .map(|_| default_ns_labels(ns))
    }

    /// As [`Objects::ns_labels`], without copying an object's labels.
    pub fn ns_labels_ref(&self, ns: &str) -> Option<std::borrow::Cow<'_, Labels>> {
        if let Some(labels) = self.ns_objects.get(ns) {
            return Some(std::borrow::Cow::Borrowed(labels));
        }
        self.pods_by_ns
            .get(ns)
            .filter(|p| !p.is_empty())
            .map(|_| std::borrow::Cow::Owned(default_ns_labels(ns)))
    }

    pub fn ns_object_labels(&self, ns: &str) -> Option<&Labels> {
        self.ns_objects.get(ns)
    }

    /// Every namespace a selector could match.
    pub fn namespaces(&self) -> impl Iterator<Item = &String> {
        let pod_only = self
            .pods_by_ns
            .keys()
            .filter(|ns| !self.ns_objects.contains_key(*ns));
        self.ns_objects.keys().chain(pod_only)
    }

    pub fn namespaces_with_label(&self, key: &str, value: &str) -> Option<&BTreeSet<String>> {
        self.ns_by_label.get(&(key.to_string(), value.to_string()))
    }

    pub fn pod(&self, key: &PodKey) -> Option<&Arc<PodInfo>> {
        self.pods.get(key)
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn policy_count(&self) -> usize {
        self.policies.values().map(BTreeMap::len).sum()
    }

    pub fn pods_in(&self, ns: &str) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.pods_by_ns.get(ns).into_iter().flat_map(|m| m.values())
    }

    pub fn pods_with_label(&self, key: &str, value: &str) -> Option<&BTreeSet<PodKey>> {
        self.pods_by_label
            .get(&(key.to_string(), value.to_string()))
    }

    pub fn pods_with_port(&self, name: &str) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.pods_by_port
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k))
    }

    pub fn all_pods(&self) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.pods.values()
    }

    pub fn policies_in(&self, ns: &str) -> impl Iterator<Item = &Arc<NetworkPolicy>> {
        self.policies.get(ns).into_iter().flat_map(|m| m.values())
    }

    pub fn policy_keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        self.policies
            .iter()
            .flat_map(|(ns, m)| m.keys().map(move |n| (ns.clone(), n.clone())))
    }

    pub fn policy(&self, ns: &str, name: &str) -> Option<&Arc<NetworkPolicy>> {
        self.policies.get(ns)?.get(name)
    }

    /// Sets (or with None removes) a ClusterNetworkPolicy; returns the
    /// previous one.
    pub fn set_tiered(
        &mut self,
        key: TieredKey,
        policy: Option<Arc<TieredPolicy>>,
    ) -> Option<Arc<TieredPolicy>> {
        match policy {
            Some(p) => self.tiered.insert(key, p),
            None => self.tiered.remove(&key),
        }
    }

    pub fn tiered(&self) -> impl Iterator<Item = &Arc<TieredPolicy>> {
        self.tiered.values()
    }

    pub fn tiered_policy(&self, key: &TieredKey) -> Option<&Arc<TieredPolicy>> {
        self.tiered.get(key)
    }

    /// The pods a ClusterNetworkPolicy's subject selects (host-network pods
    /// never are), and those for which it cannot be evaluated: resolution
    /// gave each of them that error, which must go with the policy.
    ///
    /// Only the namespaces the subject's namespace selector can select are
    /// looked at (those with a label it requires, by the label index), and
    /// only their pods once it selects the namespace: an edit of a policy
    /// of one namespace does not read every pod of the cluster.
    pub fn subject_pods(&self, policy: &TieredPolicy) -> Vec<PodKey> {
        let Some(ns_selector) = policy.namespace_selector() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut visit = |ns: &String| {
            let Some(labels) = self.ns_labels_ref(ns) else {
                return;
            };
            // What the namespace decides for all its pods: none of them
            // when it is not selected (a pod selector is then not read).
            if selector_matches(ns_selector, &labels) == Ok(false) {
                return;
            }
            for pod in self.pods_in(ns) {
                if policy.selects(pod, &labels).unwrap_or(true) {
                    out.push(pod.key());
                }
            }
        };
        match required_ns_labels(ns_selector) {
            Some(required) => {
                let mut seen = BTreeSet::new();
                for (k, v) in required {
                    for ns in self.namespaces_with_label(k, v).into_iter().flatten() {
                        if seen.insert(ns) {
                            visit(ns);
                        }
                    }
                }
            }
            None => self.namespaces().for_each(visit),
        }
        out
    }

    /// Sets (or with None removes) a node; returns the previous one.
    pub fn set_node(&mut self, name: &str, node: Option<Arc<Node>>) -> Option<Arc<Node>> {
        match node {
            Some(n) => self.nodes.insert(name.to_string(), n),
            None => self.nodes.remove(name),
        }
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.values()
    }

    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.get(name)
    }

    /// The addresses of the nodes `selector` selects, sorted.
    pub fn node_addresses(
        &self,
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Vec<std::net::IpAddr>, String> {
        let mut out = Vec::new();
        for node in self.nodes.values() {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            if crate::resolve::selector_matches(selector, &labels)? {
                out.extend(node_ips(node));
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Sets (or with None removes) a namespace object.
    pub fn set_namespace(&mut self, ns: &str, labels: Option<Labels>) {
        let before = self.ns_labels(ns);
        match labels {
            Some(l) => self.ns_objects.insert(ns.to_string(), l),
            None => self.ns_objects.remove(ns),
        };
        self.reindex_ns(ns, before);
    }

    /// Sets (or with None removes) a pod; returns the previous one.
    pub fn set_pod(&mut self, key: &PodKey, pod: Option<Arc<PodInfo>>) -> Option<Arc<PodInfo>> {
        // Pods decide a namespace's labels only when it has no object.
        let ns_object = self.ns_objects.contains_key(&key.0);
        let ns_before = (!ns_object).then(|| self.ns_labels(&key.0)).flatten();
        let old = match &pod {
            Some(p) => self.pods.insert(key.clone(), p.clone()),
            None => self.pods.remove(key),
        };
        if let Some(old) = &old {
            for (k, v) in &old.labels {
                remove_from(&mut self.pods_by_label, &(k.clone(), v.clone()), key);
            }
            for name in old.named_ports.keys() {
                remove_from(&mut self.pods_by_port, name, key);
            }
            if pod.is_none() {
                if let Some(in_ns) = self.pods_by_ns.get_mut(&key.0) {
                    in_ns.remove(&key.1);
                    if in_ns.is_empty() {
                        self.pods_by_ns.remove(&key.0);
                    }
                }
            }
        }
        if let Some(new) = &pod {
            // Each index is looked up before inserting: nearly every label,
            // port name and namespace has an entry already, and `entry`
            // would copy the names for every pod.
            for (k, v) in &new.labels {
                let label = (k.clone(), v.clone());
                match self.pods_by_label.get_mut(&label) {
                    Some(set) => set.insert(key.clone()),
                    None => self
                        .pods_by_label
                        .entry(label)
                        .or_default()
                        .insert(key.clone()),
                };
            }
            for name in new.named_ports.keys() {
                match self.pods_by_port.get_mut(name) {
                    Some(set) => set.insert(key.clone()),
                    None => self
                        .pods_by_port
                        .entry(name.clone())
                        .or_default()
                        .insert(key.clone()),
                };
            }
            match self.pods_by_ns.get_mut(&key.0) {
                Some(in_ns) => in_ns.insert(key.1.clone(), new.clone()),
                None => self
                    .pods_by_ns
                    .entry(key.0.clone())
                    .or_default()
                    .insert(key.1.clone(), new.clone()),
            };
        }
        if !ns_object {
            self.reindex_ns(&key.0, ns_before);
        }
        old
    }

    /// Sets (or with None removes) a policy; returns the previous one.
    pub fn set_policy(
        &mut self,
        ns: &str,
        name: &str,
        policy: Option<Arc<NetworkPolicy>>,
    ) -> Option<Arc<NetworkPolicy>> {
        match policy {
            Some(p) => self
                .policies
                .entry(ns.to_string())
                .or_default()
                .insert(name.to_string(), p),
            None => {
                let in_ns = self.policies.get_mut(ns)?;
                let old = in_ns.remove(name);
                if in_ns.is_empty() {
                    self.policies.remove(ns);
                }
                old
            }
        }
    }

    pub fn service(&self, ns: &str, name: &str) -> Option<&Arc<Service>> {
        self.services.get(ns)?.get(name)
    }

    pub fn services_in(&self, ns: &str) -> impl Iterator<Item = &Arc<Service>> {
        self.services.get(ns).into_iter().flat_map(|m| m.values())
    }

    pub fn service_keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        self.services
            .iter()
            .flat_map(|(ns, m)| m.keys().map(move |n| (ns.clone(), n.clone())))
    }

    /// Services without a selector, sorted by namespace and name.
    pub fn selectorless_services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.selectorless
            .iter()
            .filter_map(|(ns, name)| self.service(ns, name))
    }

    /// Sets (or with None removes) a Service; returns the previous one.
    pub fn set_service(
        &mut self,
        ns: &str,
        name: &str,
        svc: Option<Arc<Service>>,
    ) -> Option<Arc<Service>> {
        let key = (ns.to_string(), name.to_string());
        self.selectorless.remove(&key);
        match svc {
            Some(s) => {
                if is_selectorless(&s) {
                    self.selectorless.insert(key);
                }
                self.services
                    .entry(ns.to_string())
                    .or_default()
                    .insert(name.to_string(), s)
            }
            None => {
                let in_ns = self.services.get_mut(ns)?;
                let old = in_ns.remove(name);
                if in_ns.is_empty() {
                    self.services.remove(ns);
                }
                old
            }
        }
    }

    pub fn slice(&self, key: &ObjectKey) -> Option<&Arc<EndpointSlice>> {
        self.slices.get(key)
    }

    pub fn slice_keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.slices.keys()
    }

    /// The EndpointSlices of a Service.
    pub fn slices_of(&self, ns: &str, service: &str) -> impl Iterator<Item = &EndpointSlice> {
        let ns = ns.to_string();
        self.slices_by_service
            .get(&(ns.clone(), service.to_string()))
            .into_iter()
            .flatten()
            .filter_map(move |name| self.slices.get(&(ns.clone(), name.clone())))
            .map(|s| &**s)
    }

    /// Sets (or with None removes) an EndpointSlice; returns the previous one.
    pub fn set_slice(
        &mut self,
        key: &ObjectKey,
        slice: Option<Arc<EndpointSlice>>,
    ) -> Option<Arc<EndpointSlice>> {
        let old = match &slice {
            Some(s) => self.slices.insert(key.clone(), s.clone()),
            None => self.slices.remove(key),
        };
        if let Some(service) = old.as_deref().and_then(slice_service) {
            remove_from(
                &mut self.slices_by_service,
                &(key.0.clone(), service.to_string()),
                &key.1,
            );
        }
        if let Some(service) = slice.as_deref().and_then(slice_service) {
            self.slices_by_service
                .entry((key.0.clone(), service.to_string()))
                .or_default()
                .insert(key.1.clone());
        }
        old
    }

    /// Keeps `ns_by_label` in step with a namespace's effective labels.
    fn reindex_ns(&mut self, ns: &str, before: Option<Labels>) {
        let after = self.ns_labels(ns);
        if before == after {
            return;
        }
        for (k, v) in before.iter().flatten() {
            remove_from(
                &mut self.ns_by_label,
                &(k.clone(), v.clone()),
                &ns.to_string(),
            );
        }
        for (k, v) in after.iter().flatten() {
            self.ns_by_label
                .entry((k.clone(), v.clone()))
                .or_default()
                .insert(ns.to_string());
        }
    }
}

/// Labels one of which every namespace `selector` selects carries (and
/// whose absence makes it answer false, never an error), when it says so:
/// its first matchLabels pair (checked before anything else), or the
/// values of an `In` expression of a selector whose operators are all
/// known. None: any namespace may be selected.
pub(super) fn required_ns_labels(selector: &LabelSelector) -> Option<Vec<(&str, &str)>> {
    if let Some((k, v)) = selector.match_labels.iter().flatten().next() {
        return Some(vec![(k.as_str(), v.as_str())]);
    }
    validate_selector(selector).ok()?;
    let expr = selector
        .match_expressions
        .iter()
        .flatten()
        .find(|e| e.operator == "In")?;
    Some(
        expr.values
            .iter()
            .flatten()
            .map(|v| (expr.key.as_str(), v.as_str()))
            .collect(),
    )
}

/// Removes `item` from the set at `key`, dropping the set once empty so
/// that the indexes stay proportional to what exists.
fn remove_from<K, T>(map: &mut HashMap<K, BTreeSet<T>>, key: &K, item: &T)
where
    K: std::hash::Hash + Eq,
    T: Ord,
{
    if let Some(set) = map.get_mut(key) {
        set.remove(item);
        if set.is_empty() {
            map.remove(key);
        }
    }
}
