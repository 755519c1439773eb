//! The plan hub: the versioned plan of every node, what each node reported,
//! and the deltas between plans. Subscribers watch their node's plan and
//! compute the delta from the last plan they sent, so a slow subscriber skips
//! intermediate versions instead of queueing them, and cannot miss a change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use palisade_proto::v1::{NodeState, PlanDelta, PlanSnapshot, PodPolicy, PodRef};
use tokio::sync::watch;

use crate::cluster::ClusterState;
use crate::debug::connection::ConnectionHistory;
use crate::engine::{Change, Engine, Outcome};
use crate::plan::Plan;
use crate::resolve::PodKey;
use crate::telemetry::{PlanTrace, PolicyChange};

/// A node's plan at one version.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VersionedPlan {
    pub version: u64,
    /// The source revision at which this version was published. Every
    /// node's plan is current as of the hub's latest revision; a plan that
    /// a revision did not change keeps its version and this number.
    pub source_revision: u64,
    /// Shared with the engine until the engine changes it.
    pub plan: Arc<Plan>,
    /// The span that published this version (empty when tracing is off).
    pub trace: PlanTrace,
}

/// One node's plan as a publication changed it.
#[derive(Clone, Debug)]
pub struct PlanChange {
    pub node: String,
    pub before: Arc<VersionedPlan>,
    pub after: Arc<VersionedPlan>,
}

impl VersionedPlan {
    pub fn snapshot(&self) -> PlanSnapshot {
        PlanSnapshot {
            version: self.version,
            pods: self.plan.pods.values().map(|p| p.decode()).collect(),
            // Plans exist for a subscriber only once the hub has synced (see
            // `Hub::subscribe`), so every snapshot that leaves is synced.
            source_synced: true,
            // The server stamps the term of the leader sending it.
            term: 0,
            trace_context: Default::default(),
        }
    }
}

/// The delta that turns `old` into `new`; None when the plans are equal.
pub fn delta(old: &VersionedPlan, new: &VersionedPlan) -> Option<PlanDelta> {
    if old.plan.same_as(&new.plan) {
        return None;
    }
    let upserted: Vec<PodPolicy> = new
        .plan
        .pods
        .iter()
        .filter(|(k, v)| old.plan.pods.get(*k) != Some(*v))
        .map(|(_, v)| v.decode())
        .collect();
    let removed: Vec<PodRef> = old
        .plan
        .pods
        .keys()
        .filter(|k| !new.plan.pods.contains_key(*k))
        .map(|k| pod_ref(k))
        .collect();
    Some(PlanDelta {
        base_version: old.version,
        version: new.version,
        upserted,
        removed,
        term: 0,
        trace_context: Default::default(),
    })
}

/// Pods upserted and removed between two plans, for a trace.
fn pods_changed(old: &Plan, new: &Plan) -> (usize, usize) {
    let upserted = new
        .pods
        .iter()
        .filter(|(k, v)| old.pods.get(*k) != Some(*v))
        .count();
    let removed = old
        .pods
        .keys()
        .filter(|k| !new.pods.contains_key(*k))
        .count();
    (upserted, removed)
}

fn pod_ref(k: &PodKey) -> PodRef {
    PodRef {
        namespace: k.0.clone(),
        name: k.1.clone(),
    }
}

struct NodeEntry {
    plan: watch::Sender<Arc<VersionedPlan>>,
    reported: Option<NodeState>,
    subscribers: usize,
    /// Changes on the first subscriber arriving and the last one leaving.
    connection: ConnectionHistory,
    /// What the plan budget left out of this node's plan ([`crate::budget`]).
    budget_errors: Vec<String>,
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
    source_errors: Vec<String>,
    nodes: BTreeMap<String, NodeEntry>,
    counters: Counters,
}

/// How the hub has been fed: a source that delivers whole views costs a
/// diff of the cluster per view; one that delivers changes costs what the
/// changes touch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Whole views diffed against the engine ([`Hub::update`]).
    pub views: u64,
    /// Batches of changes resolved and published ([`Hub::apply`]).
    pub batches: u64,
    /// Changes in those batches.
    pub changes: u64,
    /// Changes staged before the source had synced ([`Hub::stage`]).
    pub staged: u64,
}

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
    pub nodes: Vec<NodeView>,
    /// When the view was taken: "connected for" is counted to it.
    pub taken_at: std::time::SystemTime,
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

    /// Brings the plans to a new view of the cluster and publishes the
    /// plans that changed. The first view is a full computation; later ones
    /// recompute only what differs from the previous view.
    pub fn update(&self, cluster: &ClusterState) -> Vec<PlanChange> {
        let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        self.lock().counters.views += 1;
        let change = PolicyChange::start("view", 0);
        let outcome = match engine.as_mut() {
            Some(engine) => engine.sync(cluster),
            None => {
                let (built, outcome) = Engine::from_state(cluster);
                *engine = Some(built);
                outcome
            }
        };
        let errors = engine.as_ref().expect("built above").errors();
        // Published under the engine lock, so views reach the hub in order.
        self.publish(outcome, cluster.marker.clone(), errors, change)
    }

    /// Applies changes one by one as a source that watches events would,
    /// and publishes the plans that changed.
    pub fn apply(&self, changes: Vec<Change>, marker: String) -> Vec<PlanChange> {
        let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut st = self.lock();
            st.counters.batches += 1;
            st.counters.changes += changes.len() as u64;
        }
        let change = PolicyChange::start("changes", changes.len());
        let engine = engine.get_or_insert_with(Engine::default);
        let outcome = engine.apply(changes);
        let errors = engine.errors();
        self.publish(outcome, marker, errors, change)
    }

    /// Takes changes into the engine without resolving or publishing
    /// anything: a source's first list, before it is complete. The next
    /// [`Hub::apply`] resolves what they affect. The hub stays unsynced.
    pub fn stage(&self, changes: Vec<Change>) {
        let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        self.lock().counters.staged += changes.len() as u64;
        engine.get_or_insert_with(Engine::default).stage(changes);
    }

    /// How the hub has been fed so far.
    pub fn counters(&self) -> Counters {
        self.lock().counters
    }

    /// Runs `f` on the engine (None before the first view), for inspection.
    pub fn with_engine<T>(&self, f: impl FnOnce(Option<&Engine>) -> T) -> T {
        f(self
            .engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref())
    }

    fn publish(
        &self,
        outcome: Outcome,
        marker: String,
        errors: Vec<String>,
        change: PolicyChange,
    ) -> Vec<PlanChange> {
        let mut st = self.lock();
        st.synced = true;
        st.source_revision += 1;
        st.source_marker = marker;
        st.errors = errors;
        let revision = st.source_revision;
        let first = self.first_version;
        let mut published = Vec::new();
        // Only nodes whose plan changed are touched: the others' subscribers
        // are not even woken.
        for (name, plan) in outcome.changed {
            let entry = st.nodes.entry(name.clone()).or_insert_with(|| NodeEntry {
                plan: watch::channel(Arc::new(VersionedPlan {
                    version: first,
                    ..Default::default()
                }))
                .0,
                reported: None,
                subscribers: 0,
                connection: ConnectionHistory::default(),
                budget_errors: Vec::new(),
            });
            let fitted = crate::budget::fit(&name, plan, self.plan_budget);
            let plan = fitted.plan;
            entry.budget_errors = fitted.errors;
            let before = entry.plan.borrow().clone();
            if before.plan.same_as(&plan) {
                continue;
            }
            let version = before.version + 1;
            let trace = change.node_plan(&name, version, || pods_changed(&before.plan, &plan));
            let after = Arc::new(VersionedPlan {
                version,
                source_revision: revision,
                plan,
                trace,
            });
            entry.plan.send_replace(after.clone());
            published.push(PlanChange {
                node: name,
                before,
                after,
            });
        }
        change.finish(revision, published.len());
        published
    }

    /// Subscribes to a node's plan; the receiver's current value is the
    /// snapshot to send first. Refused until the source has synced.
    pub fn subscribe(&self, node: &str) -> Result<Subscription, NotSynced> {
        let mut st = self.lock();
        st.check_synced()?;
        let revision = st.source_revision;
        let first = self.first_version;
        let entry = st
            .nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeEntry {
                plan: watch::channel(Arc::new(VersionedPlan {
                    version: first,
                    source_revision: revision,
                    plan: Arc::default(),
                    trace: PlanTrace::default(),
                }))
                .0,
                reported: None,
                subscribers: 0,
                connection: ConnectionHistory::default(),
                budget_errors: Vec::new(),
            });
        if entry.subscribers == 0 {
            entry.connection.connected(std::time::SystemTime::now());
        }
        entry.subscribers += 1;
        Ok(Subscription {
            rx: entry.plan.subscribe(),
            hub: self.clone(),
            node: node.to_string(),
        })
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

    pub fn report(&self, state: NodeState) {
        let mut st = self.lock();
        if let Some(entry) = st.nodes.get_mut(&state.node_name) {
            entry.reported = Some(state);
        } else {
            // Only nodes with a plan or a live subscription hold an entry,
            // so reports under random names cannot grow the table.
            tracing::debug!(node = %state.node_name, "report from a node neither planned nor subscribed; dropped");
        }
    }

    pub fn set_source_errors(&self, errors: Vec<String>) {
        self.lock().source_errors = errors;
    }

    /// Ends every subscription, so that plan streams finish and a graceful
    /// shutdown does not wait on them forever.
    pub fn close(&self) {
        let mut st = self.lock();
        st.nodes.clear();
    }

    pub fn view(&self) -> HubView {
        let st = self.lock();
        HubView {
            source_synced: st.synced,
            source_revision: st.source_revision,
            source_marker: st.source_marker.clone(),
            errors: st
                .source_errors
                .iter()
                .chain(st.errors.iter())
                .chain(st.nodes.values().flat_map(|n| n.budget_errors.iter()))
                .cloned()
                .collect(),
            source_errors: st.source_errors.len(),
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
            taken_at: std::time::SystemTime::now(),
        }
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
            self.source_errors.join("; ")
        };
        Err(NotSynced(reason))
    }
}

/// The source has not produced a complete view yet; holds why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("the controller has not synced its source yet: {0}")]
pub struct NotSynced(pub String);

/// A pod's entry in its node's plan (None: not known on that node).
#[derive(Clone, Debug, PartialEq)]
pub struct PodLookup {
    pub pod: Option<PodPolicy>,
    pub plan_version: u64,
}

/// A node's live subscription; dropping it marks the node disconnected.
pub struct Subscription {
    pub rx: watch::Receiver<Arc<VersionedPlan>>,
    hub: Hub,
    node: String,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let first = self.hub.first_version;
        let mut st = self.hub.lock();
        let unplanned = match st.nodes.get_mut(&self.node) {
            Some(e) => {
                e.subscribers = e.subscribers.saturating_sub(1);
                if e.subscribers == 0 {
                    e.connection.disconnected(std::time::SystemTime::now());
                }
                e.subscribers == 0 && e.plan.borrow().version == first
            }
            None => false,
        };
        // A node the source never gave a plan holds an entry only while
        // connected: names nobody runs cannot grow the table.
        if unplanned {
            st.nodes.remove(&self.node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Object;
    use palisade_proto::plan::apply_delta;

    fn cluster(policies: bool, marker: &str) -> ClusterState {
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
        hub.set_source_errors(vec!["bad.yaml: document 1: nope".into()]);
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

    #[test]
    fn versions_advance_only_when_a_nodes_plan_changes() {
        let hub = Hub::new(100);
        hub.update(&cluster(false, "1"));
        let mut sub = hub.subscribe("n1").unwrap();
        let v = sub.rx.borrow().clone();
        assert_eq!((v.version, v.source_revision), (101, 1));
        let open = &v.plan.decode().pods[&("x".to_string(), "a".to_string())];
        assert_eq!(
            (&open.ingress, &open.egress),
            (&None, &None),
            "listed, not isolated"
        );
        hub.update(&cluster(true, "2"));
        let v = sub.rx.borrow_and_update().clone();
        assert_eq!((v.version, v.source_revision), (102, 2));
        assert_eq!(v.plan.pods.len(), 1);
        assert!(v.plan.pods.values().all(|p| p.decode().ingress.is_some()));
        hub.update(&cluster(true, "3"));
        assert_eq!(sub.rx.borrow().version, 102);
        assert!(
            !sub.rx.has_changed().unwrap(),
            "an unchanged plan wakes no one"
        );
        let view = hub.view();
        assert_eq!(view.source_marker, "3");
        assert_eq!(view.nodes[0].subscribers, 1);
        drop(sub);
        assert_eq!(hub.view().nodes[0].subscribers, 0);
    }

    #[tokio::test]
    async fn close_ends_subscriptions() {
        let hub = Hub::new(1);
        hub.update(&ClusterState::default());
        let mut sub = hub.subscribe("n1").unwrap();
        hub.close();
        assert!(sub.rx.changed().await.is_err());
    }

    #[test]
    fn delta_applied_to_old_plan_gives_new_plan() {
        let hub = Hub::new(1);
        hub.update(&ClusterState::default());
        let sub = hub.subscribe("n1").unwrap();
        let empty = sub.rx.borrow().clone();
        hub.update(&cluster(true, "1"));
        let full = sub.rx.borrow().clone();
        let d = delta(&empty, &full).expect("plans differ");
        assert_eq!((d.base_version, d.version), (1, 2));
        let mut plan = empty.plan.decode();
        apply_delta(&mut plan.pods, d.clone());
        assert_eq!(plan, full.plan.decode());
        hub.update(&cluster(false, "2"));
        let open = sub.rx.borrow().clone();
        let d = delta(&full, &open).unwrap();
        assert_eq!(
            (d.upserted.len(), d.removed.len()),
            (1, 0),
            "un-isolated, still listed"
        );
        apply_delta(&mut plan.pods, d.clone());
        assert_eq!(plan, open.plan.decode());
        hub.update(&ClusterState::default());
        let gone = sub.rx.borrow().clone();
        let d = delta(&open, &gone).unwrap();
        assert_eq!(d.removed.len(), 1);
        apply_delta(&mut plan.pods, d.clone());
        assert_eq!(plan, gone.plan.decode());
        assert!(delta(&gone, &gone).is_none());
    }

    #[test]
    fn source_errors_are_shown_beside_resolution_errors() {
        let hub = Hub::new(1);
        hub.set_source_errors(vec!["bad.yaml: document 1: nope".into()]);
        assert_eq!(hub.view().errors, vec!["bad.yaml: document 1: nope"]);
        assert_eq!(hub.view().source_errors, 1);
        hub.set_source_errors(vec![]);
        assert!(hub.view().errors.is_empty());
        assert_eq!(hub.view().source_errors, 0);
    }

    #[test]
    fn reports_are_kept_per_known_node() {
        let hub = Hub::new(1);
        hub.update(&ClusterState::default());
        let sub = hub.subscribe("n9").unwrap();
        hub.report(NodeState {
            node_name: "n9".into(),
            realized_version: 7,
            ..Default::default()
        });
        let view = hub.view();
        assert_eq!(view.nodes[0].reported.as_ref().unwrap().realized_version, 7);
        drop(sub);
        hub.report(NodeState {
            node_name: "nobody".into(),
            ..Default::default()
        });
        assert!(hub.view().nodes.is_empty());
    }

    #[test]
    fn connection_history_follows_the_first_and_last_subscriber() {
        let hub = Hub::new(1);
        hub.update(&cluster(true, "1"));
        let node = |hub: &Hub| hub.view().nodes[0].connection;
        assert_eq!(node(&hub), ConnectionHistory::default(), "never connected");
        let before = std::time::SystemTime::now();
        let a = hub.subscribe("n1").unwrap();
        let first = node(&hub);
        let since = first.connected_since.expect("connected");
        assert!(since >= before);
        assert_eq!((first.changed_at, first.reconnects), (Some(since), 0));
        let b = hub.subscribe("n1").unwrap();
        drop(a);
        assert_eq!(node(&hub), first, "a second stream is not a new connection");
        drop(b);
        let gone = node(&hub);
        assert_eq!(gone.connected_since, None);
        assert!(gone.changed_at.unwrap() >= since);
        let _c = hub.subscribe("n1").unwrap();
        let back = node(&hub);
        assert_eq!(back.reconnects, 1);
        assert!(back.connected_since.unwrap() >= gone.changed_at.unwrap());
    }

    #[test]
    fn unplanned_nodes_are_dropped_when_their_last_subscriber_leaves() {
        let hub = Hub::new(1);
        hub.update(&cluster(true, "1"));
        for i in 0..1000 {
            let a = hub.subscribe(&format!("random-{i}")).unwrap();
            let b = hub.subscribe(&format!("random-{i}")).unwrap();
            drop(a);
            assert_eq!(hub.view().nodes.len(), 2, "still connected");
            drop(b);
        }
        let planned = hub.subscribe("n1").unwrap();
        drop(planned);
        let view = hub.view();
        assert_eq!(
            view.nodes
                .iter()
                .map(|n| n.node_name.as_str())
                .collect::<Vec<_>>(),
            vec!["n1"],
            "a planned node keeps its entry"
        );
    }
}
