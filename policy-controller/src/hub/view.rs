//! What the hub shows: every node's plan, subscribers, report and
//! connection for the debug service and the metrics, and one pod's entry
//! for an enforcer that asks.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_proto::v1::{NodeState, PodPolicy};

use super::versions::VersionedPlan;
use super::{Hub, NotSynced};
use crate::debug::connection::ConnectionHistory;
use crate::keys::PodKey;

/// What the debug service shows of one node.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub node_name: String,
    pub plan: Arc<VersionedPlan>,
    pub subscribers: usize,
    pub reported: Option<NodeState>,
    pub connection: ConnectionHistory,
}

#[derive(Clone, Debug)]
pub struct HubView {
    pub source_synced: bool,
    pub source_revision: u64,
    pub source_marker: String,
    /// The source's problems first, then the resolution's.
    pub errors: Vec<String>,
    /// How many of `errors` are the source's (a refused manifest, a failing
    /// watch): while there are any, the view in force may be stale.
    pub source_errors: usize,
    /// The same, by kind ([`SourceError::metric_label`](crate::source::SourceError::metric_label)).
    pub source_errors_by_kind: BTreeMap<&'static str, usize>,
    pub nodes: Vec<NodeView>,
    /// When the view was taken: "connected for" is counted to it.
    pub taken_at: std::time::SystemTime,
    /// ClusterNetworkPolicies in the controller's view by (tier, API
    /// group), staged ones included.
    pub cluster_policies: BTreeMap<(&'static str, &'static str), usize>,
}

/// A pod's entry in its node's plan (None: not known on that node).
#[derive(Clone, Debug, PartialEq)]
pub struct PodLookup {
    pub pod: Option<PodPolicy>,
    pub plan_version: u64,
}

impl Hub {
    pub fn view(&self) -> HubView {
        let st = self.lock();
        HubView {
            source_synced: st.synced,
            source_revision: st.source_revision,
            source_marker: st.source_marker.clone(),
            errors: st
                .source_errors
                .iter()
                .map(|p| &p.message)
                .chain(st.errors.iter())
                .chain(st.nodes.values().flat_map(|n| n.budget_errors.iter()))
                .cloned()
                .collect(),
            source_errors: st.source_errors.len(),
            source_errors_by_kind: st.source_errors.iter().fold(
                BTreeMap::new(),
                |mut by_kind, p| {
                    *by_kind.entry(p.kind).or_default() += 1;
                    by_kind
                },
            ),
            nodes: st
                .nodes
                .iter()
                .map(|(name, e)| NodeView {
                    node_name: name.clone(),
                    plan: e.plan.borrow().clone(),
                    subscribers: e.subscribers,
                    reported: e.reported.clone(),
                    connection: e.connection,
                })
                .collect(),
            cluster_policies: st.cluster_policies.clone(),
            taken_at: std::time::SystemTime::now(),
        }
    }

    /// One pod's entry in its node's current plan, and that plan's version.
    /// Refused until the source has synced: "unknown" from an unsynced
    /// controller means nothing.
    pub fn pod_plan(&self, node: &str, pod: &PodKey) -> Result<PodLookup, NotSynced> {
        let st = self.lock();
        st.check_synced()?;
        let Some(entry) = st.nodes.get(node) else {
            return Ok(PodLookup {
                pod: None,
                plan_version: self.first_version,
            });
        };
        let plan = entry.plan.borrow();
        Ok(PodLookup {
            pod: plan.plan.pods.get(pod).map(|p| p.decode()),
            plan_version: plan.version,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::hub::Hub;
    use crate::source::SourceProblem;

    #[test]
    fn source_errors_are_shown_beside_resolution_errors() {
        let hub = Hub::new(1);
        hub.set_source_errors(vec![
            SourceProblem::new("parse", "bad.yaml: document 1: nope"),
            SourceProblem::new("watch", "watching Pods: gone"),
            SourceProblem::new("watch", "watching Services: gone"),
        ]);
        assert_eq!(
            hub.view().errors,
            vec![
                "bad.yaml: document 1: nope",
                "watching Pods: gone",
                "watching Services: gone"
            ]
        );
        assert_eq!(hub.view().source_errors, 3);
        assert_eq!(
            hub.view().source_errors_by_kind,
            BTreeMap::from([("parse", 1), ("watch", 2)])
        );
        hub.set_source_errors(vec![]);
        assert!(hub.view().errors.is_empty());
        assert_eq!(hub.view().source_errors, 0);
        assert!(hub.view().source_errors_by_kind.is_empty());
    }
}
