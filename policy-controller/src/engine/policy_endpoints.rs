//! PolicyEndpoint slices held by the policy they belong to, each policy
//! merged from the union of its slices (`source::policy_endpoint::merge`)
//! and indexed by its namespace.
//!
//! A slice changed or deleted re-merges its policy; the targets that
//! change can affect are the pods of its namespace the policy selected
//! before or selects now. Peers are addresses, so no other pod depends on a
//! policy; a pod that appears, is relabelled, moves or goes is recomputed by
//! the engine as a target anyway, and finds its policies here.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use std::sync::Arc;

use palisade_proto::v1::{DirectionPolicy, PodPolicy};

use super::objects::Objects;
use crate::keys::{ObjectKey, PodKey};
use crate::resolve::{namespace_of, PodInfo};
use crate::source::policy_endpoint::merge::{merge_slices, EndpointPolicy};
use crate::source::policy_endpoint::{
    display_name, parse_spec, PolicyEndpoint, PolicyEndpointSpec, SliceError,
};

#[derive(Default)]
pub struct EndpointPolicies {
    /// The last spec of each slice that could be used (a slice that stops
    /// parsing keeps it: nothing in force is withdrawn by bad input), with
    /// the policy it refers to.
    slices: HashMap<ObjectKey, (ObjectKey, Arc<PolicyEndpointSpec>)>,
    /// Problems with a slice as a whole (it does not parse, or refers to a
    /// policy of another namespace).
    slice_errors: BTreeMap<ObjectKey, String>,
    /// Slice names by policy.
    by_policy: HashMap<ObjectKey, BTreeSet<String>>,
    merged: HashMap<ObjectKey, Arc<EndpointPolicy>>,
    /// Merged policies by namespace.
    by_namespace: HashMap<String, BTreeSet<String>>,
}

impl EndpointPolicies {
    pub fn apply(&mut self, pe: &PolicyEndpoint, objects: &Objects, dirty: &mut HashSet<PodKey>) {
        let key = (
            namespace_of(&pe.metadata),
            pe.metadata.name.clone().unwrap_or_default(),
        );
        let parsed = parse_spec(&key.0, &key.1, &pe.spec).and_then(|spec| {
            let ref_ns = if spec.policy_ref.namespace.is_empty() {
                key.0.clone()
            } else {
                spec.policy_ref.namespace.clone()
            };
            let object = display_name(&key.0, &key.1);
            if spec.policy_ref.name.is_empty() {
                Err(SliceError::NoPolicyName { object })
            } else if ref_ns != key.0 {
                // Only the policy's own namespace holds its slices; a slice
                // elsewhere could grant traffic to pods its writer does not
                // own.
                Err(SliceError::ForeignPolicy {
                    object,
                    namespace: ref_ns,
                })
            } else {
                Ok(((ref_ns, spec.policy_ref.name.clone()), spec))
            }
        });
        match parsed {
            Ok((policy, spec)) => {
                self.slice_errors.remove(&key);
                let old = self
                    .slices
                    .insert(key.clone(), (policy.clone(), Arc::new(spec)));
                if let Some((old_policy, _)) = old {
                    if old_policy != policy {
                        self.unlink(&old_policy, &key.1);
                        self.remerge(&old_policy, objects, dirty);
                    }
                }
                self.by_policy
                    .entry(policy.clone())
                    .or_default()
                    .insert(key.1.clone());
                self.remerge(&policy, objects, dirty);
            }
            Err(e) => {
                let kept = if self.slices.contains_key(&key) {
                    "; its previous version stays in force"
                } else {
                    ""
                };
                self.slice_errors.insert(key, format!("{e}{kept}"));
            }
        }
    }

    pub fn delete(&mut self, key: &ObjectKey, objects: &Objects, dirty: &mut HashSet<PodKey>) {
        self.slice_errors.remove(key);
        if let Some((policy, _)) = self.slices.remove(key) {
            self.unlink(&policy, &key.1);
            self.remerge(&policy, objects, dirty);
        }
    }

    /// The policies that select a pod, sorted by name.
    pub fn selecting(&self, pod: &PodInfo) -> Vec<Arc<EndpointPolicy>> {
        let Some(names) = self.by_namespace.get(&pod.namespace) else {
            return Vec::new();
        };
        let key = pod.key();
        names
            .iter()
            .filter_map(|name| self.merged.get(&(pod.namespace.clone(), name.clone())))
            .filter(|p| p.selects(&key, &pod.labels))
            .cloned()
            .collect()
    }

    /// Every problem with the slices, sorted.
    pub fn errors(&self) -> Vec<String> {
        let mut out: Vec<String> = self.slice_errors.values().cloned().collect();
        out.extend(self.merged.values().flat_map(|p| p.errors.iter().cloned()));
        out.sort();
        out.dedup();
        out
    }

    fn unlink(&mut self, policy: &ObjectKey, slice: &str) {
        if let Some(names) = self.by_policy.get_mut(policy) {
            names.remove(slice);
            if names.is_empty() {
                self.by_policy.remove(policy);
            }
        }
    }

    fn remerge(&mut self, policy: &ObjectKey, objects: &Objects, dirty: &mut HashSet<PodKey>) {
        let new = self.by_policy.get(policy).map(|names| {
            let specs: Vec<(&str, &PolicyEndpointSpec)> = names
                .iter()
                .filter_map(|n| {
                    self.slices
                        .get(&(policy.0.clone(), n.clone()))
                        .map(|(_, s)| (n.as_str(), &**s))
                })
                .collect();
            Arc::new(merge_slices(policy, &specs))
        });
        let old = match &new {
            Some(p) => self.merged.insert(policy.clone(), p.clone()),
            None => self.merged.remove(policy),
        };
        if old.as_deref() == new.as_deref() {
            return;
        }
        match &new {
            Some(_) => {
                self.by_namespace
                    .entry(policy.0.clone())
                    .or_default()
                    .insert(policy.1.clone());
            }
            None => {
                if let Some(names) = self.by_namespace.get_mut(&policy.0) {
                    names.remove(&policy.1);
                    if names.is_empty() {
                        self.by_namespace.remove(&policy.0);
                    }
                }
            }
        }
        // When only the selection moved (a pod added to a slice, as the AWS
        // controller does for every new pod), the pods it still selects
        // resolve as before: only those that came or went are recomputed.
        let same_rules = match (&old, &new) {
            (Some(a), Some(b)) => a.ingress == b.ingress && a.egress == b.egress,
            _ => false,
        };
        for pod in objects.pods_in(&policy.0) {
            let key = pod.key();
            let before = old.as_ref().is_some_and(|p| p.selects(&key, &pod.labels));
            let after = new.as_ref().is_some_and(|p| p.selects(&key, &pod.labels));
            if (before || after) && !(same_rules && before == after) {
                dirty.insert(key);
            }
        }
    }
}

/// Adds what the PolicyEndpoint policies selecting a pod say to its policy:
/// as with NetworkPolicies, each isolates the pod in its directions and the
/// rules of all of them are unioned. A PolicyEndpoint has no annotations,
/// so it is never staged: its rules are enforced, and they join any audit
/// direction too (the audit policy is the enforced one plus the staged
/// rules).
pub fn add_to(policy: &mut PodPolicy, selecting: &[Arc<EndpointPolicy>]) {
    if selecting.is_empty() {
        return;
    }
    for p in selecting {
        for (rules, dir, audit) in [
            (&p.ingress, &mut policy.ingress, &mut policy.audit_ingress),
            (&p.egress, &mut policy.egress, &mut policy.audit_egress),
        ] {
            if let Some(rules) = rules {
                dir.get_or_insert_with(DirectionPolicy::default)
                    .rules
                    .extend(rules.iter().cloned());
                if let Some(audit) = audit {
                    audit.rules.extend(rules.iter().cloned());
                }
            }
        }
        policy.policies.push(p.name.clone());
    }
    policy.policies.sort();
    policy.policies.dedup();
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::{Change, Engine};
    use crate::source::policy_endpoint::PolicyEndpoint;

    fn pod(name: &str, ip: &str) -> Change {
        Change::ApplyPod(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "x", "labels": {"app": "same"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
                "status": {"podIP": ip},
            }))
            .unwrap(),
        )
    }

    fn slice(name: &str, policy: &str, pods: &[&str]) -> Change {
        let pods: Vec<_> = pods
            .iter()
            .map(|p| json!({"name": p, "namespace": "x", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}))
            .collect();
        Change::ApplyPolicyEndpoint(
            serde_json::from_value::<PolicyEndpoint>(json!({
                "metadata": {"name": name, "namespace": "x"},
                "spec": {"policyRef": {"name": policy, "namespace": "x"},
                         "podIsolation": ["Ingress"],
                         "podSelectorEndpoints": pods,
                         "ingress": [{"cidr": "10.0.0.9"}]},
            }))
            .unwrap(),
        )
    }

    fn policies(engine: &Engine, pod: &str) -> Vec<String> {
        engine.resolution().plans["n1"].pods[&("x".to_string(), pod.to_string())]
            .policies
            .clone()
    }

    #[test]
    fn pods_alike_but_named_by_different_slices_resolve_apart() {
        let mut engine = Engine::default();
        engine.apply([
            pod("a", "10.0.0.1"),
            pod("b", "10.0.0.2"),
            slice("p-1", "p", &["a"]),
        ]);
        assert_eq!(policies(&engine, "a"), ["x/p"]);
        assert!(policies(&engine, "b").is_empty(), "same labels, not named");

        // A second slice of the same policy names b: only b is recomputed.
        let outcome = engine.apply([slice("p-2", "p", &["b"])]);
        assert_eq!(outcome.recomputed, 1);
        assert_eq!(policies(&engine, "b"), ["x/p"]);

        // A slice moved to another policy: the pod it names leaves one and
        // joins the other, and is the only one recomputed.
        let outcome = engine.apply([slice("p-2", "q", &["b"])]);
        assert_eq!(outcome.recomputed, 1);
        assert_eq!(policies(&engine, "b"), ["x/q"]);

        // Deleting a policy's last slice lifts it.
        engine.apply([Change::DeletePolicyEndpoint(("x".into(), "p-1".into()))]);
        assert!(policies(&engine, "a").is_empty());
        assert!(engine.errors().is_empty());
    }

    #[test]
    fn a_pod_the_pod_selector_matches_is_selected_before_it_is_listed() {
        let mut engine = Engine::default();
        let Change::ApplyPolicyEndpoint(mut pe) = slice("p-1", "p", &["a"]) else {
            unreachable!()
        };
        pe.spec["podSelector"] = json!({"matchLabels": {"app": "same"}});
        engine.apply([
            pod("a", "10.0.0.1"),
            Change::ApplyPolicyEndpoint(pe.clone()),
        ]);
        // Created after the slice, not (yet) in it: isolated at once.
        engine.apply([pod("late", "10.0.0.3")]);
        assert_eq!(policies(&engine, "late"), ["x/p"]);
        // Relabelled out of the selector: lifted.
        let Change::ApplyPod(mut relabelled) = pod("late", "10.0.0.3") else {
            unreachable!()
        };
        relabelled.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
        engine.apply([Change::ApplyPod(relabelled)]);
        assert!(policies(&engine, "late").is_empty());
        // An invalid selector is an error; the listed pods stay selected.
        pe.spec["podSelector"] = json!({"matchExpressions": [{"key": "app", "operator": "Near"}]});
        engine.apply([Change::ApplyPolicyEndpoint(pe)]);
        assert_eq!(policies(&engine, "a"), ["x/p"]);
        assert_eq!(
            engine.errors(),
            [
                "PolicyEndpoint x/p-1: spec.podSelector: matchExpressions key \"app\": \
              unknown operator \"Near\"; only the listed pods are selected"
            ]
        );
    }
}
