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
use std::time::SystemTime;

use palisade_proto::v1::{
    GetRealizationResponse, NodeRealization, PodRealization, PodRef, PolicyRealization,
};

use super::connection::unix_ms;
use crate::hub::{HubView, NodeView};

/// The whole status; `only_policy` ("namespace/name") narrows the policy
/// list, never the node list.
pub fn realization(view: &HubView, only_policy: Option<&str>) -> GetRealizationResponse {
    let nodes: Vec<NodeRealization> = view
        .nodes
        .iter()
        .map(|n| node_realization(n, view.taken_at))
        .collect();
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

fn node_realization(n: &NodeView, now: SystemTime) -> NodeRealization {
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
        connected_since_unix_ms: unix_ms(n.connection.connected_since),
        connected_secs: n.connection.connected_for(now).map_or(0, |d| d.as_secs()),
        state_changed_unix_ms: unix_ms(n.connection.changed_at),
        reconnects: n.connection.reconnects,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::debug::connection::ConnectionHistory;

    fn node(name: &str, connection: ConnectionHistory, subscribers: usize) -> NodeView {
        NodeView {
            node_name: name.into(),
            plan: Arc::default(),
            subscribers,
            reported: None,
            connection,
        }
    }

    #[test]
    fn connection_times_are_counted_to_the_moment_of_the_view() {
        let t = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let mut steady = ConnectionHistory::default();
        steady.connected(t(1_000));
        let mut flapping = ConnectionHistory::default();
        flapping.connected(t(1_000));
        flapping.disconnected(t(1_500));
        flapping.connected(t(1_600));
        flapping.disconnected(t(1_700));
        let view = HubView {
            source_synced: true,
            source_revision: 1,
            source_marker: "1".into(),
            errors: vec![],
            source_errors: 0,
            source_errors_by_kind: Default::default(),
            nodes: vec![node("a", steady, 1), node("b", flapping, 0)],
            cluster_policies: Default::default(),
            taken_at: t(1_800) + Duration::from_millis(999),
        };
        let r = realization(&view, None);
        let (a, b) = (&r.nodes[0], &r.nodes[1]);
        assert_eq!(
            (a.connected, a.connected_since_unix_ms, a.connected_secs),
            (true, 1_000_000, 800)
        );
        assert_eq!((a.state_changed_unix_ms, a.reconnects), (1_000_000, 0));
        assert_eq!(
            (b.connected, b.connected_since_unix_ms, b.connected_secs),
            (false, 0, 0)
        );
        assert_eq!((b.state_changed_unix_ms, b.reconnects), (1_700_000, 1));
    }
}
