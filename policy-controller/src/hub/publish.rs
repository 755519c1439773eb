//! The engine's side of the hub: a source's views and changes go into the
//! engine, and the plans they change come out as new versions, published to
//! the node's watchers.

use std::sync::Arc;

use super::versions::{pods_changed, PlanChange, VersionedPlan};
use super::{Hub, NodeEntry};
use crate::cluster::ClusterState;
use crate::engine::{Change, Engine, Outcome};
use crate::telemetry::PolicyChange;

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

impl Hub {
    fn lock_engine(&self) -> std::sync::MutexGuard<'_, Option<Engine>> {
        // As for the state: a panic under the lock leaves the last engine,
        // which the next view or change brings up to date.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings the plans to a new view of the cluster and publishes the
    /// plans that changed. The first view is a full computation; later ones
    /// recompute only what differs from the previous view.
    pub fn update(&self, cluster: &ClusterState) -> Vec<PlanChange> {
        let mut engine = self.lock_engine();
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
        let built = engine.as_ref().expect("built above");
        let errors = built.errors();
        self.lock().cluster_policies = built.cluster_policy_counts();
        // Published under the engine lock, so views reach the hub in order.
        self.publish(outcome, cluster.marker.clone(), errors, change)
    }

    /// Applies changes one by one as a source that watches events would,
    /// and publishes the plans that changed.
    pub fn apply(&self, changes: Vec<Change>, marker: String) -> Vec<PlanChange> {
        let mut engine = self.lock_engine();
        {
            let mut st = self.lock();
            st.counters.batches += 1;
            st.counters.changes += changes.len() as u64;
        }
        let change = PolicyChange::start("changes", changes.len());
        let engine = engine.get_or_insert_with(Engine::default);
        let outcome = engine.apply(changes);
        let errors = engine.errors();
        self.lock().cluster_policies = engine.cluster_policy_counts();
        self.publish(outcome, marker, errors, change)
    }

    /// Takes changes into the engine without resolving or publishing
    /// anything: a source's first list, before it is complete. The next
    /// [`Hub::apply`] resolves what they affect. The hub stays unsynced.
    pub fn stage(&self, changes: Vec<Change>) {
        let mut engine = self.lock_engine();
        self.lock().counters.staged += changes.len() as u64;
        engine.get_or_insert_with(Engine::default).stage(changes);
    }

    /// How the hub has been fed so far.
    pub fn counters(&self) -> Counters {
        self.lock().counters
    }

    /// Runs `f` on the engine (None before the first view), for inspection.
    pub fn with_engine<T>(&self, f: impl FnOnce(Option<&Engine>) -> T) -> T {
        f(self.lock_engine().as_ref())
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
            let entry = st
                .nodes
                .entry(name.clone())
                .or_insert_with(|| NodeEntry::new(first, 0));
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
}

#[cfg(test)]
mod tests {
    use crate::hub::{tests::cluster, Hub};

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
}
