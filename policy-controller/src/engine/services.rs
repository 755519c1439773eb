//! Services as egress resolution reads them, computed once per namespace
//! (Services with a selector) or once for the cluster (Services without
//! one), with the reverse map of which targets read them.
//!
//! A target that looked at the Services of a namespace depends on all of
//! them: a Service created there, edited, deleted, or a pod there that
//! starts or stops backing one (or changes the addresses or named ports it
//! backs with) may change its ClusterIP rules. Services without a selector
//! are few and read by every target with an egress rule, so they are one
//! dependency: any change to one of them or to its EndpointSlices.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::objects::Objects;
use super::selection::{SpreadSet, Target, Used};
use crate::keys::PodKey;
use crate::resolve::{service_info, PodInfo, ServiceInfo};

type Infos = Arc<Vec<Arc<ServiceInfo>>>;

#[derive(Default)]
pub struct ServiceCache {
    by_ns: HashMap<String, Infos>,
    selectorless: Option<Infos>,
    ns_dependents: HashMap<String, SpreadSet<Target>>,
    selectorless_dependents: SpreadSet<Target>,
}

impl ServiceCache {
    /// Records that `target` now reads what `used` says instead of `before`.
    pub fn depend(&mut self, target: &Target, before: &Used, used: &Used) {
        for ns in before
            .service_ns
            .iter()
            .filter(|n| !used.service_ns.contains(n))
        {
            if let Some(set) = self.ns_dependents.get_mut(ns) {
                set.remove(target);
                if set.is_empty() {
                    self.ns_dependents.remove(ns);
                    // Nobody reads it: the cache need not hold it either.
                    self.by_ns.remove(ns);
                }
            }
        }
        for ns in &used.service_ns {
            // Looked up before inserting: most namespaces have an entry, and
            // `entry` would copy the name for every target.
            match self.ns_dependents.get_mut(ns) {
                Some(set) => {
                    set.insert(target.clone());
                }
                None => {
                    self.ns_dependents
                        .insert(ns.clone(), SpreadSet::from_iter([target.clone()]));
                }
            }
        }
        if used.selectorless {
            self.selectorless_dependents.insert(target.clone());
        } else {
            self.selectorless_dependents.remove(target);
        }
    }

    /// The Services with a selector in `ns` may have changed.
    pub fn namespace_changed(&mut self, ns: &str, dirty: &mut HashSet<PodKey>) {
        self.by_ns.remove(ns);
        if let Some(set) = self.ns_dependents.get(ns) {
            dirty.extend(set.iter().map(Target::key));
        }
    }

    /// A Service without a selector, or one of its slices, changed.
    pub fn selectorless_changed(&mut self, dirty: &mut HashSet<PodKey>) {
        self.selectorless = None;
        dirty.extend(self.selectorless_dependents.iter().map(Target::key));
    }

    /// Whether a pod change in its namespace changes what the Services
    /// there are backed by: it matches a selector before or after, and its
    /// addresses or named ports (what a backend passes on) differ.
    pub fn pod_changes_backends(
        objects: &Objects,
        ns: &str,
        old: Option<&PodInfo>,
        new: Option<&PodInfo>,
    ) -> bool {
        objects.services_in(ns).any(|svc| {
            let Some(sel) = crate::resolve::selector_of(svc) else {
                return false;
            };
            let backing = |p: Option<&PodInfo>| {
                p.filter(|p| !p.ips.is_empty())
                    .filter(|p| sel.iter().all(|(k, v)| p.labels.get(k) == Some(v)))
                    .map(|p| (p.ips.clone(), p.named_ports.clone()))
            };
            backing(old) != backing(new)
        })
    }

    pub fn services_in(&mut self, objects: &Objects, ns: &str) -> Infos {
        if let Some(infos) = self.by_ns.get(ns) {
            return infos.clone();
        }
        let infos: Vec<Arc<ServiceInfo>> = objects
            .services_in(ns)
            .filter(|s| !crate::resolve::is_selectorless(s))
            .filter_map(|s| service_info(s, objects.pods_in(ns), std::iter::empty()))
            .map(Arc::new)
            .collect();
        let infos = Arc::new(infos);
        self.by_ns.insert(ns.to_string(), infos.clone());
        infos
    }

    pub fn selectorless(&mut self, objects: &Objects) -> Infos {
        if let Some(infos) = &self.selectorless {
            return infos.clone();
        }
        let infos: Vec<Arc<ServiceInfo>> = objects
            .selectorless_services()
            .filter_map(|s| {
                let ns = crate::resolve::namespace_of(&s.metadata);
                let name = s.metadata.name.clone().unwrap_or_default();
                service_info(s, std::iter::empty(), objects.slices_of(&ns, &name))
            })
            .map(Arc::new)
            .collect();
        let infos = Arc::new(infos);
        self.selectorless = Some(infos.clone());
        infos
    }
}
