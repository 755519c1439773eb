//! The full computation, by scanning ([`resolve_cluster`]): every selector
//! is evaluated against every pod. Deliberately simple, it is the oracle the incremental engine
//! (`crate::engine`) is checked against; both compute each pod by
//! [`resolve_pod`](super::resolve_pod), and differ only in how peers
//! are found ([`PeerSelection`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;

use super::objects::{default_ns_labels, namespace_of, ns_labels, pod_info, PodInfo};
use super::peers::{PeerSelection, Selected};
use super::services::{is_selectorless, service_info, ServiceInfo};
use super::target::resolve_pod;
use super::tiers::{node_ips, TieredPolicy};
use super::{selector_matches, NodePlan, Resolution, SelectorError};
use crate::cluster::ClusterState;

/// Every node's plan, and the problems found in the input.
pub fn resolve_cluster(state: &ClusterState) -> Resolution {
    let mut index = Scan::new(state);
    let mut errors = Vec::new();
    // In precedence order: each pod's tier rules are in this order.
    let mut tiered: Vec<TieredPolicy> = state
        .cluster_policies
        .iter()
        .cloned()
        .map(TieredPolicy::new)
        .collect();
    tiered.sort_by(|a, b| a.policy.precedence().cmp(&b.policy.precedence()));
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
        let ns_labels = index
            .namespace_labels
            .get(&target.namespace)
            .cloned()
            .unwrap_or_default();
        let tiered: Vec<&TieredPolicy> = tiered
            .iter()
            .filter(|t| match t.selects(target, &ns_labels) {
                Ok(selects) => selects,
                Err(e) => {
                    errors.push(format!("{}: {e}", t.id));
                    false
                }
            })
            .collect();
        let tiered: Vec<_> = tiered
            .into_iter()
            .map(|t| (t, t.rules_for(target, &mut index, &mut errors)))
            .collect();
        let pod = resolve_pod(target, policies, tiered, &mut index, &mut errors);
        plans.entry(node.clone()).or_default().pods.insert(
            (target.namespace.clone(), target.name.clone()),
            Arc::new(pod),
        );
    }
    errors.sort();
    errors.dedup();
    Resolution { plans, errors }
}

/// Selection by scanning every pod.
struct Scan {
    pods: Vec<Arc<PodInfo>>,
    namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    services: BTreeMap<String, Arc<Vec<Arc<ServiceInfo>>>>,
    selectorless: Arc<Vec<Arc<ServiceInfo>>>,
    /// Each node's labels and addresses.
    nodes: Vec<(BTreeMap<String, String>, Vec<std::net::IpAddr>)>,
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
            nodes: state
                .nodes
                .iter()
                .map(|n| (n.metadata.labels.clone().unwrap_or_default(), node_ips(n)))
                .collect(),
        }
    }
}

impl PeerSelection for Scan {
    fn select(
        &mut self,
        policy_ns: &str,
        peer: &NetworkPolicyPeer,
    ) -> Result<Arc<Selected>, SelectorError> {
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
                    selector_matches(sel, &labels)
                        .map_err(|e| SelectorError::new("namespaceSelector", e))?
                }
            };
            if !ns_ok {
                continue;
            }
            let pod_ok = match &peer.pod_selector {
                None => true,
                Some(sel) => selector_matches(sel, &pod.labels)
                    .map_err(|e| SelectorError::new("podSelector", e))?,
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

    fn node_addresses(
        &mut self,
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Vec<std::net::IpAddr>, SelectorError> {
        let mut out = Vec::new();
        for (labels, ips) in &self.nodes {
            if selector_matches(selector, labels).map_err(|e| SelectorError::new("nodes", e))? {
                out.extend_from_slice(ips);
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}
