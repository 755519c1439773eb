//! Peer selections computed once per distinct (namespace selector, pod
//! selector) and shared by every rule and target that uses them, with the
//! reverse map (which targets used which selection) that tells a change
//! which targets it can affect.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::objects::{required_ns_labels, Labels, Objects};
use super::services::ServiceCache;
use crate::keys::PodKey;
use crate::resolve::{
    selector_matches, PeerSelection, PodInfo, Selected, SelectorError, ServiceInfo,
};

/// Hashes values that are spread already: an address (a [`Target`]) or a
/// hash computed with a per-process seed (a [`SelKey`]). Running SipHash
/// over them again was a visible part of a full computation; neither can be
/// chosen by whoever writes the objects.
#[derive(Default)]
pub struct Spread(u64);

impl std::hash::Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by the keys above; kept correct for any other caller.
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let h = (self.0.rotate_left(29) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
}

pub type SpreadSet<T> = HashSet<T, std::hash::BuildHasherDefault<Spread>>;
pub type SpreadMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Spread>>;

/// A target's key, shared by every dependency set that holds it: a pod
/// depends on several selections, and a copy of its key in each would cost
/// more than the rest of the entry. The engine keeps one per target for
/// the target's whole life, so the sets compare and hash it by address.
#[derive(Clone, Debug)]
pub struct Target(pub Arc<PodKey>);

impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Target {}

impl std::hash::Hash for Target {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state)
    }
}

impl Target {
    pub fn key(&self) -> PodKey {
        PodKey::clone(&self.0)
    }
}

/// What a selector peer selects, as a cache key. Without a namespace
/// selector the policy's namespace is part of the key (`scope`).
/// Shared: every target that uses a selection holds its key.
#[derive(Clone, Debug)]
pub struct SelKey(Arc<SelKeyParts>);

#[derive(Debug, PartialEq, Eq)]
pub struct SelKeyParts {
    scope: Option<String>,
    ns_selector: Option<String>,
    pod_selector: Option<String>,
    /// Of the three above, computed once: keys are looked up for every
    /// target that uses them, and hashing the serialized selectors each time
    /// was a large part of a full computation.
    hash: u64,
}

impl SelKeyParts {
    fn new(
        scope: Option<String>,
        ns_selector: Option<String>,
        pod_selector: Option<String>,
    ) -> Self {
        use std::hash::BuildHasher;
        // Seeded per process, so that selectors cannot be written to collide.
        static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let hash =
            SEED.get_or_init(Default::default)
                .hash_one((&scope, &ns_selector, &pod_selector));
        SelKeyParts {
            scope,
            ns_selector,
            pod_selector,
            hash,
        }
    }
}

impl PartialEq for SelKey {
    fn eq(&self, other: &SelKey) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for SelKey {}

impl std::hash::Hash for SelKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash)
    }
}

impl std::ops::Deref for SelKey {
    type Target = SelKeyParts;
    fn deref(&self) -> &SelKeyParts {
        &self.0
    }
}

struct SelEntry {
    ns_selector: Option<LabelSelector>,
    pod_selector: Option<LabelSelector>,
    /// None once a change may have altered the selection; recomputed when a
    /// target next asks.
    result: Option<Arc<Selected>>,
    dependents: SpreadSet<Target>,
}

impl SelEntry {
    fn ns_matches(&self, scope: &Option<String>, ns: &str, labels: Option<&Labels>) -> bool {
        match (&self.ns_selector, scope) {
            (None, Some(scope)) => scope == ns,
            (Some(sel), _) => labels.is_some_and(|l| selector_matches(sel, l).unwrap_or(false)),
            (None, None) => false,
        }
    }

    fn pod_matches(&self, pod: &PodInfo) -> bool {
        !pod.host_network
            && self
                .pod_selector
                .as_ref()
                .is_none_or(|sel| selector_matches(sel, &pod.labels).unwrap_or(false))
    }
}

#[derive(Default)]
pub struct Selections {
    entries: SpreadMap<SelKey, SelEntry>,
    /// Selections without a namespace selector, by the namespace they look in.
    by_scope: HashMap<String, SpreadSet<SelKey>>,
    /// Selections with a namespace selector that requires a label, by the
    /// first label it requires: a namespace can only be selected by those
    /// filed under one of its labels.
    cross_by_label: HashMap<(String, String), SpreadSet<SelKey>>,
    /// Selections with a namespace selector that requires no label (only
    /// expressions, or none): any namespace may matter.
    cross_any: SpreadSet<SelKey>,
    /// Targets whose egress named ports were resolved against every pod
    /// with a port of that name.
    port_dependents: HashMap<String, SpreadSet<Target>>,
    /// The key of each peer met during the current pass, by the peer's
    /// address: a key is the peer's selectors serialized, and every pod the
    /// policy selects meets the same peers. Addresses are stable during a
    /// pass (the objects do not change) and are forgotten after it.
    peer_keys: HashMap<usize, SelKey>,
}

/// What one target's computation used.
#[derive(Clone, Default, PartialEq)]
pub struct Used {
    pub sels: Vec<SelKey>,
    pub ports: Vec<String>,
    /// Namespaces whose Services (with a selector) were read.
    pub service_ns: Vec<String>,
    /// Whether the Services without a selector were read.
    pub selectorless: bool,
}

impl Used {
    /// Adds what another computation used, as if this one had used it.
    pub fn extend(&mut self, other: &Used) {
        self.sels.extend(other.sels.iter().cloned());
        self.ports.extend(other.ports.iter().cloned());
        for ns in &other.service_ns {
            if !self.service_ns.contains(ns) {
                self.service_ns.push(ns.clone());
            }
        }
        self.selectorless |= other.selectorless;
    }
}

impl Selections {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// A recompute pass is over: the peers it met may go away.
    pub fn end_pass(&mut self) {
        self.peer_keys = HashMap::new();
    }

    /// Records that `target` now uses `used` instead of `before`. Every
    /// selection in `used` exists (the computation created it).
    pub fn depend(&mut self, target: &Target, before: &Used, used: &Used) {
        // New links first: a selection used before and now must not be
        // forgotten in between.
        for key in &used.sels {
            if let Some(e) = self.entries.get_mut(key) {
                e.dependents.insert(target.clone());
            }
        }
        for key in before.sels.iter().filter(|k| !used.sels.contains(k)) {
            if let Some(e) = self.entries.get_mut(key) {
                e.dependents.remove(target);
                if e.dependents.is_empty() {
                    self.forget(key);
                }
            }
        }
        for name in before.ports.iter().filter(|n| !used.ports.contains(n)) {
            if let Some(set) = self.port_dependents.get_mut(name) {
                set.remove(target);
                if set.is_empty() {
                    self.port_dependents.remove(name);
                }
            }
        }
        for name in &used.ports {
            self.port_dependents
                .entry(name.clone())
                .or_default()
                .insert(target.clone());
        }
    }

    fn forget(&mut self, key: &SelKey) {
        let Some(entry) = self.entries.remove(key) else {
            return;
        };
        match (&key.scope, required_label(entry.ns_selector.as_ref())) {
            (Some(ns), _) if key.ns_selector.is_none() => {
                if let Some(set) = self.by_scope.get_mut(ns) {
                    set.remove(key);
                    if set.is_empty() {
                        self.by_scope.remove(ns);
                    }
                }
            }
            (_, Some(label)) => {
                if let Some(set) = self.cross_by_label.get_mut(&label) {
                    set.remove(key);
                    if set.is_empty() {
                        self.cross_by_label.remove(&label);
                    }
                }
            }
            (_, None) => {
                self.cross_any.remove(key);
            }
        }
    }

    /// Files a new selection where changes will find it.
    fn index(&mut self, key: &SelKey, ns_selector: Option<&LabelSelector>) {
        match (&key.scope, required_label(ns_selector)) {
            (Some(ns), _) if ns_selector.is_none() => {
                self.by_scope
                    .entry(ns.clone())
                    .or_default()
                    .insert(key.clone());
            }
            (_, Some(label)) => {
                self.cross_by_label
                    .entry(label)
                    .or_default()
                    .insert(key.clone());
            }
            (_, None) => {
                self.cross_any.insert(key.clone());
            }
        }
    }

    /// The selections with a namespace selector that could select a
    /// namespace with any of these label sets.
    fn cross_candidates<'a>(&'a self, labels: &[Option<&Labels>]) -> SpreadSet<&'a SelKey> {
        let mut out: SpreadSet<&SelKey> = self.cross_any.iter().collect();
        for (k, v) in labels.iter().flatten().flat_map(|l| l.iter()) {
            // Borrowed lookups would need another key type; the clone is
            // per label of one namespace, not per selection.
            if let Some(set) = self.cross_by_label.get(&(k.clone(), v.clone())) {
                out.extend(set.iter());
            }
        }
        out
    }

    /// A pod in `ns` changed from `old` to `new`: drops the selections that
    /// held or now hold it and adds their targets to `dirty`.
    /// `ns_before` and `ns_after` are the namespace's labels around the
    /// change (a pod can make its namespace exist, or stop existing).
    pub fn pod_changed(
        &mut self,
        ns: &str,
        (old, ns_before): (Option<&PodInfo>, Option<&Labels>),
        (new, ns_after): (Option<&PodInfo>, Option<&Labels>),
        dirty: &mut HashSet<PodKey>,
    ) {
        let cross = self.cross_candidates(&[ns_before, ns_after]);
        let candidates: Vec<SelKey> = self
            .by_scope
            .get(ns)
            .into_iter()
            .flatten()
            .chain(cross)
            .cloned()
            .collect();
        for key in &candidates {
            let e = self.entries.get_mut(key).expect("indexed selections exist");
            let held =
                old.is_some_and(|p| e.ns_matches(&key.scope, ns, ns_before) && e.pod_matches(p));
            let holds =
                new.is_some_and(|p| e.ns_matches(&key.scope, ns, ns_after) && e.pod_matches(p));
            // A pod that stays in a selection changes it only through what
            // the selection passes on: its addresses and named ports.
            let same = held
                && holds
                && old
                    .zip(new)
                    .is_some_and(|(o, n)| o.ips == n.ips && o.named_ports == n.named_ports);
            if (held || holds) && !same {
                e.result = None;
                dirty.extend(e.dependents.iter().map(Target::key));
            }
        }
        let names = old
            .into_iter()
            .chain(new)
            .filter(|p| !p.host_network)
            .flat_map(|p| p.named_ports.keys());
        for name in names {
            if let Some(set) = self.port_dependents.get(name) {
                dirty.extend(set.iter().map(Target::key));
            }
        }
    }

    /// A namespace's labels changed: drops the selections whose namespace
    /// selector now decides differently.
    pub fn namespace_changed(
        &mut self,
        ns: &str,
        before: Option<&Labels>,
        after: Option<&Labels>,
        dirty: &mut HashSet<PodKey>,
    ) {
        let candidates: Vec<SelKey> = self
            .cross_candidates(&[before, after])
            .into_iter()
            .cloned()
            .collect();
        for key in &candidates {
            let e = self.entries.get_mut(key).expect("indexed selections exist");
            if e.ns_matches(&key.scope, ns, before) != e.ns_matches(&key.scope, ns, after) {
                e.result = None;
                dirty.extend(e.dependents.iter().map(Target::key));
            }
        }
    }
}

/// A label every namespace the selector selects must carry, if it names one.
fn required_label(ns_selector: Option<&LabelSelector>) -> Option<(String, String)> {
    ns_selector?
        .match_labels
        .as_ref()?
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.clone()))
}

/// Selection through the indexes and the cache, recording what it used.
pub struct Selector<'a> {
    pub objects: &'a Objects,
    pub cache: &'a mut Selections,
    pub services: &'a mut ServiceCache,
    pub used: Used,
}

impl PeerSelection for Selector<'_> {
    fn select(
        &mut self,
        policy_ns: &str,
        peer: &NetworkPolicyPeer,
    ) -> Result<Arc<Selected>, SelectorError> {
        let address = peer as *const NetworkPolicyPeer as usize;
        let key = match self.cache.peer_keys.get(&address) {
            Some(key) => key.clone(),
            None => {
                let json = |s: &Option<LabelSelector>| {
                    s.as_ref()
                        .map(|s| serde_json::to_string(s).expect("selectors serialize"))
                };
                let parts = SelKeyParts::new(
                    peer.namespace_selector
                        .is_none()
                        .then(|| policy_ns.to_string()),
                    json(&peer.namespace_selector),
                    json(&peer.pod_selector),
                );
                // The key already held by the cache, so that targets share it.
                let probe = SelKey(Arc::new(parts));
                let key = match self.cache.entries.get_key_value(&probe) {
                    Some((k, _)) => k.clone(),
                    None => probe,
                };
                self.cache.peer_keys.insert(address, key.clone());
                key
            }
        };
        if !self.cache.entries.contains_key(&key) {
            self.cache.index(&key, peer.namespace_selector.as_ref());
            self.cache.entries.insert(
                key.clone(),
                SelEntry {
                    ns_selector: peer.namespace_selector.clone(),
                    pod_selector: peer.pod_selector.clone(),
                    result: None,
                    dependents: SpreadSet::default(),
                },
            );
        }
        self.used.sels.push(key.clone());
        let entry = self.cache.entries.get_mut(&key).expect("inserted above");
        if let Some(result) = &entry.result {
            return Ok(result.clone());
        }
        let result = Arc::new(Selected::new(compute(self.objects, &key, entry)));
        entry.result = Some(result.clone());
        Ok(result)
    }

    fn with_port_name(&mut self, name: &str) -> Vec<Arc<PodInfo>> {
        self.used.ports.push(name.to_string());
        let mut pods: Vec<Arc<PodInfo>> = self
            .objects
            .pods_with_port(name)
            .filter(|p| !p.host_network)
            .cloned()
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    fn services_in(&mut self, ns: &str) -> Arc<Vec<Arc<ServiceInfo>>> {
        if !self.used.service_ns.iter().any(|n| n == ns) {
            self.used.service_ns.push(ns.to_string());
        }
        self.services.services_in(self.objects, ns)
    }

    fn selectorless_services(&mut self) -> Arc<Vec<Arc<ServiceInfo>>> {
        self.used.selectorless = true;
        self.services.selectorless(self.objects)
    }

    /// Not recorded in `used`: a node change recomputes the pods of every
    /// policy with a `nodes` peer (`Engine::set_node`).
    fn node_addresses(
        &mut self,
        selector: &LabelSelector,
    ) -> Result<Vec<std::net::IpAddr>, SelectorError> {
        self.objects
            .node_addresses(selector)
            .map_err(|e| SelectorError::new("nodes", e))
    }
}

/// The pods a selection holds, sorted by namespace and name, looking only at
/// the candidates the indexes give.
fn compute(objects: &Objects, key: &SelKey, e: &SelEntry) -> Vec<Arc<PodInfo>> {
    let mut out: Vec<Arc<PodInfo>> = match (&key.scope, &e.ns_selector) {
        (Some(ns), None) => objects
            .pods_in(ns)
            .filter(|p| e.pod_matches(p))
            .cloned()
            .collect(),
        (_, Some(ns_sel)) => {
            // Candidate namespaces: those with a label the selector requires
            // (its first matchLabels pair, or a value of an `In`), if any.
            let namespaces: Vec<&String> = match required_ns_labels(ns_sel) {
                Some(required) => required
                    .into_iter()
                    .flat_map(|(k, v)| objects.namespaces_with_label(k, v).into_iter().flatten())
                    .collect(),
                None => objects.namespaces().collect(),
            };
            let matched: BTreeMap<&str, ()> = namespaces
                .into_iter()
                .filter(|ns| e.ns_matches(&key.scope, ns, objects.ns_labels_ref(ns).as_deref()))
                .map(|ns| (ns.as_str(), ()))
                .collect();
            let by_label = e
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.iter().flatten().next())
                .and_then(|(k, v)| objects.pods_with_label(k, v).map(|set| (k, v, set)));
            match by_label {
                // Fewer pods carry the label than live in the namespaces.
                Some((_, _, set)) if set.len() < matched.len() * 4 => set
                    .iter()
                    .filter(|k| matched.contains_key(k.0.as_str()))
                    .filter_map(|k| objects.pod(k))
                    .filter(|p| e.pod_matches(p))
                    .cloned()
                    .collect(),
                _ => matched
                    .keys()
                    .flat_map(|ns| objects.pods_in(ns))
                    .filter(|p| e.pod_matches(p))
                    .cloned()
                    .collect(),
            }
        }
        (None, None) => Vec::new(),
    };
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}
