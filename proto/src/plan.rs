//! A node's plan as both ends hold it: each pod's policy by namespace and
//! name. One [`apply_delta`] for the enforcer, which realizes the deltas it
//! receives, and for the controller's tests, which check that its deltas
//! rebuild its plans: were they two, the tests could pass against a delta
//! the enforcer applies differently.

use std::collections::{BTreeMap, BTreeSet};

use crate::v1::{PlanDelta, PodPolicy, PodRef};

/// A pod: (namespace, name).
pub type PodKey = (String, String);

pub fn pod_key(r: &PodRef) -> PodKey {
    (r.namespace.clone(), r.name.clone())
}

/// Applies `delta` to `pods` and returns the pods it touched. Removals go
/// first, so a pod both removed and upserted ends upserted; an upserted
/// policy without a pod names nothing and is skipped. The delta is taken
/// by value so that its policies (a big one holds ~100,000 rules) move
/// into the plan uncopied; `P` is what the plan holds them in (the
/// controller shares them in `Arc`s). Whether the delta follows the plan
/// (its base version and term) is the caller's to check.
pub fn apply_delta<P: From<PodPolicy>>(
    pods: &mut BTreeMap<PodKey, P>,
    delta: PlanDelta,
) -> BTreeSet<PodKey> {
    let mut touched = BTreeSet::new();
    for r in &delta.removed {
        let k = pod_key(r);
        pods.remove(&k);
        touched.insert(k);
    }
    for p in delta.upserted {
        if let Some(k) = p.pod.as_ref().map(pod_key) {
            pods.insert(k.clone(), P::from(p));
            touched.insert(k);
        }
    }
    touched
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::v1::DirectionPolicy;

    fn pod(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn key(ns: &str, name: &str) -> PodKey {
        (ns.into(), name.into())
    }

    fn policy(ns: &str, name: &str, isolated: bool) -> PodPolicy {
        PodPolicy {
            pod: Some(pod(ns, name)),
            ingress: isolated.then(DirectionPolicy::default),
            ..Default::default()
        }
    }

    fn plan(pods: &[PodPolicy]) -> BTreeMap<PodKey, PodPolicy> {
        pods.iter()
            .map(|p| (pod_key(p.pod.as_ref().unwrap()), p.clone()))
            .collect()
    }

    #[test]
    fn a_delta_adds_replaces_and_removes_pods_and_names_each_it_touched() {
        let mut pods = plan(&[
            policy("x", "a", true),
            policy("x", "b", true),
            policy("x", "c", true),
        ]);
        let touched = apply_delta(
            &mut pods,
            PlanDelta {
                base_version: 1,
                version: 2,
                // b un-isolated (still listed), d new.
                upserted: vec![policy("x", "b", false), policy("y", "d", true)],
                // c gone; e was never there and is touched all the same.
                removed: vec![pod("x", "c"), pod("x", "e")],
                ..Default::default()
            },
        );
        assert_eq!(
            pods,
            plan(&[
                policy("x", "a", true),
                policy("x", "b", false),
                policy("y", "d", true),
            ])
        );
        assert_eq!(
            touched,
            BTreeSet::from([key("x", "b"), key("x", "c"), key("x", "e"), key("y", "d")])
        );
        // Nothing to do touches nothing.
        assert!(apply_delta(&mut pods, PlanDelta::default()).is_empty());
    }

    #[test]
    fn a_pod_removed_and_upserted_ends_upserted_and_a_policy_without_a_pod_is_skipped() {
        let mut pods: BTreeMap<PodKey, Arc<PodPolicy>> = BTreeMap::new();
        pods.insert(key("x", "a"), Arc::new(policy("x", "a", false)));
        let touched = apply_delta(
            &mut pods,
            PlanDelta {
                upserted: vec![
                    policy("x", "a", true),
                    PodPolicy {
                        pod: None,
                        ..policy("x", "z", true)
                    },
                ],
                removed: vec![pod("x", "a")],
                ..Default::default()
            },
        );
        assert_eq!(pods.len(), 1);
        assert_eq!(*pods[&key("x", "a")], policy("x", "a", true));
        assert_eq!(touched, BTreeSet::from([key("x", "a")]));
    }
}
