//! ClusterPolicyEndpoint slices held by the ClusterNetworkPolicy they
//! belong to, each policy merged from the union of its slices
//! (`source::cluster_policy_endpoint::merge`).
//!
//! A slice changed or deleted re-merges its policy; the targets that change
//! can affect are the pods the policy selected before or selects now (in
//! any namespace). Peers are addresses, so no other pod depends on a
//! policy; a pod that appears, is relabelled, moves or goes is recomputed
//! by the engine as a target anyway, and finds its policies here. A
//! namespace relabelled may move pods in or out of a subject: the engine
//! recomputes its pods when [`ClusterEndpointPolicies::reads_namespaces`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use palisade_apis::Tier;
use palisade_proto::v1::{DirectionPolicy, PodPolicy, TierRule};

use super::objects::Objects;
use crate::keys::PodKey;
use crate::resolve::PodInfo;
use crate::source::cluster_policy_endpoint::merge::{merge_slices, ClusterEndpointPolicy, Placed};
use crate::source::cluster_policy_endpoint::{
    parse_spec, ClusterPolicyEndpoint, ClusterPolicyEndpointSpec,
};

#[derive(Default)]
pub struct ClusterEndpointPolicies {
    /// The last spec of each slice (by name) that could be used (a slice
    /// that stops parsing keeps it: nothing in force is withdrawn by bad
    /// input), with the policy it refers to.
    slices: HashMap<String, (String, Arc<ClusterPolicyEndpointSpec>)>,
    /// Slices that do not parse.
    slice_errors: BTreeMap<String, String>,
    /// Slice names by policy.
    by_policy: HashMap<String, BTreeSet<String>>,
    /// Merged policies by name.
    merged: BTreeMap<String, Arc<ClusterEndpointPolicy>>,
}

impl ClusterEndpointPolicies {
    pub fn apply(
        &mut self,
        cpe: &ClusterPolicyEndpoint,
        objects: &Objects,
        dirty: &mut HashSet<PodKey>,
    ) {
        let name = cpe.metadata.name.clone().unwrap_or_default();
        match parse_spec(&name, &cpe.spec) {
            Ok(spec) => {
                self.slice_errors.remove(&name);
                let policy = spec.policy_ref.name.clone();
                let old = self
                    .slices
                    .insert(name.clone(), (policy.clone(), Arc::new(spec)));
                if let Some((old_policy, _)) = old {
                    if old_policy != policy {
                        self.unlink(&old_policy, &name);
                        self.remerge(&old_policy, objects, dirty);
                    }
                }
                self.by_policy
                    .entry(policy.clone())
                    .or_default()
                    .insert(name);
                self.remerge(&policy, objects, dirty);
            }
            Err(e) => {
                let kept = if self.slices.contains_key(&name) {
                    "; its previous version stays in force"
                } else {
                    ""
                };
                self.slice_errors.insert(name, format!("{e}{kept}"));
            }
        }
    }

    pub fn delete(&mut self, name: &str, objects: &Objects, dirty: &mut HashSet<PodKey>) {
        self.slice_errors.remove(name);
        if let Some((policy, _)) = self.slices.remove(name) {
            self.unlink(&policy, name);
            self.remerge(&policy, objects, dirty);
        }
    }

    /// The policies that select a pod, sorted by name.
    pub fn selecting(&self, pod: &PodInfo, objects: &Objects) -> Vec<Arc<ClusterEndpointPolicy>> {
        if self.merged.is_empty() {
            return Vec::new();
        }
        let ns_labels = objects.ns_labels(&pod.namespace).unwrap_or_default();
        self.merged
            .values()
            .filter(|p| p.selects(pod, &ns_labels))
            .cloned()
            .collect()
    }

    /// The merged policies' tiers (a policy whose slices carry none yet is
    /// not counted): the AWS group's share of the tier metric.
    pub fn tiers(&self) -> impl Iterator<Item = Tier> + '_ {
        self.merged
            .values()
            .filter_map(|p| p.precedence.map(|(t, _)| t))
    }

    /// Whether a policy's subject reads namespace labels.
    pub fn reads_namespaces(&self) -> bool {
        self.merged.values().any(|p| p.reads_namespaces())
    }

    /// Every problem with the slices, sorted.
    pub fn errors(&self) -> Vec<String> {
        let mut out: Vec<String> = self.slice_errors.values().cloned().collect();
        out.extend(self.merged.values().flat_map(|p| p.errors.iter().cloned()));
        out.sort();
        out.dedup();
        out
    }

    fn unlink(&mut self, policy: &str, slice: &str) {
        if let Some(names) = self.by_policy.get_mut(policy) {
            names.remove(slice);
            if names.is_empty() {
                self.by_policy.remove(policy);
            }
        }
    }

    fn remerge(&mut self, policy: &str, objects: &Objects, dirty: &mut HashSet<PodKey>) {
        let new = self.by_policy.get(policy).map(|names| {
            let specs: Vec<(&str, &ClusterPolicyEndpointSpec)> = names
                .iter()
                .filter_map(|n| self.slices.get(n).map(|(_, s)| (n.as_str(), &**s)))
                .collect();
            Arc::new(merge_slices(policy, &specs))
        });
        let old = match &new {
            Some(p) => self.merged.insert(policy.to_string(), p.clone()),
            None => self.merged.remove(policy),
        };
        if old.as_deref() == new.as_deref() {
            return;
        }
        // When only the listed pods moved, the pods still selected resolve
        // as before: only those that came or went are recomputed.
        let same_rules = match (&old, &new) {
            (Some(a), Some(b)) => a.ingress == b.ingress && a.egress == b.egress,
            _ => false,
        };
        for pod in objects.all_pods() {
            let ns_labels = objects.ns_labels(&pod.namespace).unwrap_or_default();
            let before = old.as_ref().is_some_and(|p| p.selects(pod, &ns_labels));
            let after = new.as_ref().is_some_and(|p| p.selects(pod, &ns_labels));
            if (before || after) && !(same_rules && before == after) {
                dirty.insert(pod.key());
            }
        }
    }
}

/// Adds the tier rules of the ClusterPolicyEndpoint policies selecting a
/// pod to its policy, as a ClusterNetworkPolicy's are added: each rule in
/// its tier, by priority, then policy name, then Deny, Pass, Accept (see
/// `merge`), after any tier rule of equal or higher precedence already
/// there; the policies named after the rest, in precedence order (tier,
/// priority, name). Never staged:
/// a slice has no annotations.
pub fn add_to(policy: &mut PodPolicy, selecting: &[Arc<ClusterEndpointPolicy>]) {
    if selecting.is_empty() {
        return;
    }
    for (ingress, dir, audit) in [
        (true, &mut policy.ingress, &mut policy.audit_ingress),
        (false, &mut policy.egress, &mut policy.audit_egress),
    ] {
        let mut placed: Vec<(&Placed, &str)> = selecting
            .iter()
            .flat_map(|p| {
                let rules = if ingress { &p.ingress } else { &p.egress };
                rules.iter().map(move |r| (r, p.name.as_str()))
            })
            .collect();
        if placed.is_empty() {
            continue;
        }
        placed.sort_by(|(a, an), (b, bn)| a.order(an).cmp(&b.order(bn)));
        place(
            dir.get_or_insert_with(|| DirectionPolicy {
                not_isolated: true,
                ..Default::default()
            }),
            &placed,
        );
        if let Some(audit) = audit {
            place(audit, &placed);
        }
    }
    let mut ids: Vec<(&ClusterEndpointPolicy, _)> = selecting
        .iter()
        .map(|p| (&**p, (p.precedence, p.name.as_str())))
        .collect();
    ids.sort_by(|a, b| a.1.cmp(&b.1));
    policy
        .policies
        .extend(ids.into_iter().map(|(p, _)| p.id.clone()));
}

fn place(d: &mut DirectionPolicy, placed: &[(&Placed, &str)]) {
    for (p, _) in placed {
        let list = match p.tier {
            Tier::Admin => &mut d.admin,
            Tier::Baseline => &mut d.baseline,
        };
        insert_by_priority(list, &p.rule);
    }
}

/// After every rule of a priority not above `rule`'s (rules placed in
/// order stay in order).
fn insert_by_priority(list: &mut Vec<TierRule>, rule: &TierRule) {
    let at = list.partition_point(|r| r.priority <= rule.priority);
    list.insert(at, rule.clone());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::{Change, Engine};
    use crate::source::cluster_policy_endpoint::ClusterPolicyEndpoint;

    fn namespace(name: &str, team: &str) -> Change {
        Change::ApplyNamespace(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": team}}}))
                .unwrap(),
        )
    }

    fn pod(ns: &str, name: &str, ip: &str) -> Change {
        Change::ApplyPod(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "labels": {"app": "same"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
                "status": {"podIP": ip},
            }))
            .unwrap(),
        )
    }

    /// A slice of `policy` whose subject is the namespaces of team a,
    /// listing `pods` (in namespace x).
    fn slice(name: &str, policy: &str, priority: u32, pods: &[&str]) -> Change {
        let pods: Vec<_> = pods
            .iter()
            .map(|p| json!({"name": p, "namespace": "x", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}))
            .collect();
        Change::ApplyClusterPolicyEndpoint(
            serde_json::from_value::<ClusterPolicyEndpoint>(json!({
                "metadata": {"name": name},
                "spec": {"policyRef": {"name": policy}, "tier": "Admin", "priority": priority,
                         "subject": {"namespaces": {"matchLabels": {"team": "a"}}},
                         "podSelectorEndpoints": pods,
                         "ingress": [{"action": "Deny", "cidr": "10.0.0.9"}]},
            }))
            .unwrap(),
        )
    }

    fn policies(engine: &Engine, ns: &str, pod: &str) -> Vec<String> {
        engine.resolution().plans["n1"].pods[&(ns.to_string(), pod.to_string())]
            .policies
            .clone()
    }

    const P: &str = "ClusterNetworkPolicy.networking.k8s.aws/p";
    const Q: &str = "ClusterNetworkPolicy.networking.k8s.aws/q";

    #[test]
    fn subjects_and_listed_pods_select_and_only_what_moved_is_recomputed() {
        let mut engine = Engine::default();
        engine.apply([
            namespace("x", "b"),
            namespace("y", "a"),
            pod("x", "a", "10.0.0.1"),
            pod("x", "b", "10.0.0.2"),
            pod("y", "c", "10.0.0.3"),
            slice("p-1", "p", 10, &["a"]),
        ]);
        assert_eq!(policies(&engine, "x", "a"), [P], "listed");
        assert!(
            policies(&engine, "x", "b").is_empty(),
            "same labels, not listed"
        );
        assert_eq!(policies(&engine, "y", "c"), [P], "by its subject");
        let rules = |engine: &Engine| {
            engine.resolution().plans["n1"].pods[&("y".into(), "c".into())]
                .ingress
                .clone()
                .unwrap()
                .admin
        };
        assert_eq!(rules(&engine).len(), 1);

        // Another slice lists b: only b is recomputed.
        let outcome = engine.apply([slice("p-2", "p", 10, &["b"])]);
        assert_eq!(outcome.recomputed, 1);
        assert_eq!(policies(&engine, "x", "b"), [P]);

        // A second policy of higher priority number: named after p, its
        // rule after p's.
        engine.apply([slice("q-1", "q", 20, &[])]);
        assert_eq!(policies(&engine, "y", "c"), [P, Q]);
        let r = rules(&engine);
        assert_eq!(
            r.iter()
                .map(|r| (r.policy.as_str(), r.priority))
                .collect::<Vec<_>>(),
            [(P, 10), (Q, 20)]
        );
        let aws_admin = |engine: &Engine| {
            engine
                .cluster_policy_counts()
                .get(&("Admin", "networking.k8s.aws"))
                .copied()
        };
        assert_eq!(aws_admin(&engine), Some(2), "the tier metric counts them");

        // The namespace relabelled out of the subjects: lifted.
        engine.apply([namespace("y", "b")]);
        assert!(policies(&engine, "y", "c").is_empty());

        // Deleting a policy's last slices lifts it.
        engine.apply([
            Change::DeleteClusterPolicyEndpoint("p-1".into()),
            Change::DeleteClusterPolicyEndpoint("p-2".into()),
        ]);
        assert!(policies(&engine, "x", "a").is_empty());
        assert_eq!(aws_admin(&engine), Some(1), "only q is left");
        assert!(engine.errors().is_empty(), "{:?}", engine.errors());
    }
}
