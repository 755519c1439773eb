//! A node's plan at one version, and the delta between two versions: what a
//! subscriber is sent first (a snapshot) and then (deltas from the last
//! version it was sent).

use std::sync::Arc;

use palisade_proto::v1::{PlanDelta, PlanSnapshot, PodPolicy, PodRef};

use crate::keys::PodKey;
use crate::plan::Plan;
use crate::telemetry::PlanTrace;

/// Bits of a controller's first plan version drawn at random.
const FIRST_VERSION_RANDOM_BITS: u32 = 16;

/// Where a controller's plan versions start: its start time in µs with the
/// low [`FIRST_VERSION_RANDOM_BITS`] drawn at random. A restart (more than
/// 65 ms later) still starts above its predecessor; two replicas started in
/// the same microsecond (a Deployment's, on one machine) no longer share
/// their versions, so a node's realized version names one leader's plan.
pub fn first_version(now_micros: u64, random: u64) -> u64 {
    let mask = (1u64 << FIRST_VERSION_RANDOM_BITS) - 1;
    ((now_micros & !mask) | (random & mask)).max(1)
}

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
pub(super) fn pods_changed(old: &Plan, new: &Plan) -> (usize, usize) {
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

#[cfg(test)]
mod tests {

    #[test]
    fn first_versions_differ_for_replicas_started_together_and_grow_across_restarts() {
        let now = 1_796_462_536_246_793;
        assert_ne!(first_version(now, 1), first_version(now, 2));
        for (r1, r2) in [(0xFFFF, 0), (0, 0xFFFF), (7, 7)] {
            assert!(first_version(now + 65_536, r2) > first_version(now, r1));
        }
        assert_eq!(first_version(0, 0), 1);
    }

    use super::*;
    use crate::cluster::ClusterState;
    use crate::hub::{tests::cluster, Hub};
    use palisade_proto::plan::apply_delta;

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
}
