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
