//! Realization status, like Antrea's NetworkPolicy status: per node, the
//! plan version sent against the version the node reported realized; per
//! policy, the nodes that need it (their plan lists it for a pod) and which
//! of them have not realized it yet.
//!
//! A node's plan version advances exactly when its plan changes, so the
//! node has realized every policy of its plan once it reports a
//! realized_version >= its plan version. A pod the node reports an error
//! for has not realized its policies whatever the version says.

use std::collections::{BTreeMap, BTreeSet};

use palisade_proto::v1::{
    GetRealizationResponse, NodeRealization, PodRealization, PodRef, PolicyRealization,
};

use crate::hub::{HubView, NodeView};

/// The whole status; `only_policy` ("namespace/name") narrows the policy
/// list, never the node list.
pub fn realization(view: &HubView, only_policy: Option<&str>) -> GetRealizationResponse {
    let nodes: Vec<NodeRealization> = view.nodes.iter().map(node_realization).collect();
    let mut policies: BTreeMap<String, (BTreeSet<&str>, BTreeSet<&str>)> = BTreeMap::new();
    for node in &nodes {
        for pod in &node.pods {
            for policy in &pod.policies {
                if only_policy.is_some_and(|p| p != policy) {
                    continue;
                }
                let (expected, lagging) = policies.entry(policy.clone()).or_default();
                expected.insert(&node.node_name);
                if !node.realized || !pod.error.is_empty() {
                    lagging.insert(&node.node_name);
                }
            }
        }
    }
    let mut policies: Vec<PolicyRealization> = policies
        .into_iter()
        .map(|(policy, (expected, lagging))| PolicyRealization {
            policy,
            expected_nodes: expected.len() as u32,
            realized_nodes: (expected.len() - lagging.len()) as u32,
            lagging_nodes: lagging.into_iter().map(str::to_string).collect(),
        })
        .collect();
    // A policy asked for by name that selects no pod on any node is listed
    // with nothing expected, rather than left out as if unknown.
    if let Some(p) = only_policy {
        if policies.is_empty() {
            policies.push(PolicyRealization {
                policy: p.to_string(),
                ..Default::default()
            });
        }
    }
    GetRealizationResponse {
        nodes,
        policies,
        source_synced: view.source_synced,
    }
}

fn node_realization(n: &NodeView) -> NodeRealization {
    let plan_version = n.plan.version;
    let realized_version = n.reported.as_ref().map_or(0, |r| r.realized_version);
    let realized = n.reported.is_some() && realized_version >= plan_version;
    let reported_pods: BTreeMap<(String, String), &palisade_proto::v1::PodState> = n
        .reported
        .iter()
        .flat_map(|r| r.pods.iter())
        .filter_map(|p| {
            let r = p.pod.as_ref()?;
            Some(((r.namespace.clone(), r.name.clone()), p))
        })
        .collect();
    let pods = n
        .plan
        .plan
        .pods
        .iter()
        .map(|(key, entry)| {
            let planned = entry.decode();
            let reported = reported_pods.get(&**key);
            PodRealization {
                pod: Some(PodRef {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                }),
                policies: planned.policies,
                reported_policies: reported.map(|p| p.policies.clone()).unwrap_or_default(),
                reported: reported.is_some(),
                error: reported.map(|p| p.error.clone()).unwrap_or_default(),
            }
        })
        .collect();
    NodeRealization {
        node_name: n.node_name.clone(),
        connected: n.subscribers > 0,
        plan_version,
        realized_version,
        reported: n.reported.is_some(),
        realized,
        // Before a first report there is no version to count from; `reported`
        // and `realized` say it.
        lag_versions: if n.reported.is_some() {
            plan_version.saturating_sub(realized_version)
        } else {
            0
        },
        pods,
        errors: n.reported.iter().flat_map(|r| r.errors.clone()).collect(),
    }
}
