//! The plan hub: the versioned plan of every node, what each node reported,
//! and the deltas between plans. Subscribers watch their node's plan and
//! compute the delta from the last plan they sent, so a slow subscriber skips
//! intermediate versions instead of queueing them, and cannot miss a change.
//!
//! The walk, by file:
//!
//! - `publish.rs`: views and changes into the engine, changed plans out as
//!   new versions ([`Hub::update`], [`Hub::apply`], [`Hub::stage`]);
//! - `versions.rs`: a plan at one version, its snapshot, and the [`delta`]
//!   between two versions;
//! - `subscribers.rs`: who watches a node's plan ([`Hub::subscribe`]), and
//!   the node's connection history as they come and go;
//! - `reports.rs`: what each node reports it has realized;
//! - `view.rs`: what the debug service and the metrics read.
//!
//! This file holds the shared state: one entry per node, and whether the
//! source has synced (no plan leaves the hub before).

mod publish;
mod reports;
mod subscribers;
mod versions;
mod view;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use palisade_proto::v1::NodeState;
use tokio::sync::watch;

use crate::debug::connection::ConnectionHistory;
use crate::engine::Engine;
use crate::source::SourceProblem;

pub use publish::Counters;
pub use subscribers::Subscription;
pub use versions::{delta, first_version, PlanChange, VersionedPlan};
pub use view::{HubView, NodeView, PodLookup};

/// Shared between the source loop and the gRPC handlers. Each method holds
/// the lock only for a few map operations; no I/O happens under it.
#[derive(Clone)]
pub struct Hub {
    state: Arc<Mutex<HubState>>,
    /// Held while resolving, apart from `state`, so that the gRPC handlers
    /// never wait for a computation.
    engine: Arc<Mutex<Option<Engine>>>,
    /// Versions start from the controller's start time so that they keep
    /// increasing across controller restarts.
    first_version: u64,
    /// Bytes one node's plan may take (`--max-plan-bytes-per-node`).
    plan_budget: usize,
}

#[derive(Default)]
struct HubState {
    /// Whether the source has produced one complete view. Until then every
    /// plan is empty for want of knowledge, not because nothing is isolated,
    /// so no plan may leave the hub.
    synced: bool,
    source_revision: u64,
    source_marker: String,
    /// Problems in the objects, found by resolution.
    errors: Vec<String>,
    /// Problems reading the source (a manifest that does not parse); the
    /// last good view stays in force meanwhile.
    source_errors: Vec<SourceProblem>,
    nodes: BTreeMap<String, NodeEntry>,
    counters: Counters,
    /// ClusterNetworkPolicies in the engine by (tier, API group), as of the
    /// last change: for metrics, which must not wait on the engine.
    cluster_policies: BTreeMap<(&'static str, &'static str), usize>,
}

/// One node: its plan, who watches it, what it reported.
struct NodeEntry {
    plan: watch::Sender<Arc<VersionedPlan>>,
    reported: Option<NodeState>,
    subscribers: usize,
    /// Changes on the first subscriber arriving and the last one leaving.
    connection: ConnectionHistory,
    /// What the plan budget left out of this node's plan ([`crate::budget`]).
    budget_errors: Vec<String>,
}

impl NodeEntry {
    /// A node without a plan yet: the empty plan at the first version.
    fn new(first_version: u64, source_revision: u64) -> Self {
        NodeEntry {
            plan: watch::channel(Arc::new(VersionedPlan {
                version: first_version,
                source_revision,
                ..Default::default()
            }))
            .0,
            reported: None,
            subscribers: 0,
            connection: ConnectionHistory::default(),
            budget_errors: Vec::new(),
        }
    }
}

impl Hub {
    pub fn new(first_version: u64) -> Self {
        Hub {
            state: Arc::new(Mutex::new(HubState::default())),
            engine: Arc::new(Mutex::new(None)),
            first_version: first_version.max(1),
            plan_budget: crate::limits::MAX_PLAN_BYTES_PER_NODE,
        }
    }

    /// The bytes one node's plan may take; set before the first view.
    pub fn with_plan_budget(mut self, bytes: usize) -> Self {
        self.plan_budget = bytes;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        // A panic under the lock cannot leave the maps half-updated in a way
        // that matters (each update is a whole-value replace), so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_source_errors(&self, errors: Vec<SourceProblem>) {
        self.lock().source_errors = errors;
    }

    /// Ends every subscription, so that plan streams finish and a graceful
    /// shutdown does not wait on them forever.
    pub fn close(&self) {
        let mut st = self.lock();
        st.nodes.clear();
    }
}

impl HubState {
    fn check_synced(&self) -> Result<(), NotSynced> {
        if self.synced {
            return Ok(());
        }
        let reason = if self.source_errors.is_empty() {
            "no complete view of the cluster has been read yet".to_string()
        } else {
            let messages: Vec<&str> = self
                .source_errors
                .iter()
                .map(|p| p.message.as_str())
                .collect();
            messages.join("; ")
        };
        Err(NotSynced(reason))
    }
}

/// The source has not produced a complete view yet; holds why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("the controller has not synced its source yet: {0}")]
pub struct NotSynced(pub String);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::{ClusterState, Object};

    /// One pod "x/a" on node n1; with `policies`, a policy isolating it.
    pub(crate) fn cluster(policies: bool, marker: &str) -> ClusterState {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"podIP": "10.0.0.1"}
        }))
        .unwrap();
        let mut objects = vec![Object::Pod(pod)];
        if policies {
            objects.push(Object::NetworkPolicy(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "deny", "namespace": "x"},
                    "spec": {"podSelector": {}}
                }))
                .unwrap(),
            ));
        }
        ClusterState::from_objects(objects, marker.into())
    }

    #[test]
    fn unsynced_hub_refuses_plans_and_says_why() {
        let hub = Hub::new(1);
        hub.set_source_errors(vec![SourceProblem::new(
            "parse",
            "bad.yaml: document 1: nope",
        )]);
        let err = hub.subscribe("n1").err().expect("refused before sync");
        assert_eq!(
            err.to_string(),
            "the controller has not synced its source yet: bad.yaml: document 1: nope"
        );
        let key = ("x".to_string(), "a".to_string());
        assert!(hub.pod_plan("n1", &key).is_err());
        assert!(!hub.view().source_synced);

        hub.update(&cluster(false, "1"));
        let sub = hub.subscribe("n1").expect("synced");
        assert!(sub.rx.borrow().snapshot().source_synced);
        assert!(hub.view().source_synced);
        let found = hub.pod_plan("n1", &key).unwrap();
        assert_eq!(found.plan_version, sub.rx.borrow().version);
        assert_eq!(found.pod.unwrap().policies, Vec::<String>::new());
        assert_eq!(hub.pod_plan("n2", &key).unwrap().pod, None);
    }

    #[test]
    fn an_empty_cluster_syncs_too() {
        let hub = Hub::new(1);
        assert!(hub.subscribe("n1").is_err());
        hub.update(&ClusterState::default());
        let sub = hub.subscribe("n1").expect("an empty view is still a view");
        assert!(sub.rx.borrow().plan.pods.is_empty());
    }
}
