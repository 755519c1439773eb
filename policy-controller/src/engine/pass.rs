//! What one recompute pass resolves once and shares between the targets it
//! recomputes. The objects do not change during a pass, so neither does
//! anything resolved from them alone:
//!
//! - (in `Engine::recompute` itself) a class's whole result: pods that
//!   resolve alike, see `Class`; and here:
//! - which ClusterNetworkPolicies may select the pods of a namespace (their
//!   namespace half; targets come in namespace order, so the last
//!   namespace's answer is the one asked for again);
//! - a ClusterNetworkPolicy's rules, which are the same for every pod it
//!   selects unless they read the pod's own named ports: an edit of a
//!   policy whose subject is every namespace resolves its rules once, not
//!   once per class.
//!
//! Whatever a shared result used (selections, Services) and the errors it
//! found are kept with it and given to every target that takes it, so that
//! dependencies and error counts are those of computing it afresh.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use palisade_proto::v1::Protocol;

use super::objects::required_ns_labels;
use super::selection::{Selector, Used};
use crate::resolve::{PodInfo, TierRules, TieredPolicy};

/// A ClusterNetworkPolicy's rules as resolved for one pod, and what
/// resolving them used and found.
struct Resolved {
    rules: TierRules,
    used: Used,
    errors: Vec<String>,
    /// Holds the policy the key's address names for the pass.
    _policy: Arc<TieredPolicy>,
}

/// Which policy (by address: the objects do not change during a pass), and
/// the pod's named ports when the rules read them.
type RulesKey = (usize, Option<BTreeMap<String, Vec<(Protocol, u16)>>>);

/// The ClusterNetworkPolicies by a namespace label their subject requires
/// (one of which every namespace it selects carries, and without which it
/// answers false, never an error: `objects::required_ns_labels`), and
/// those that require none. A namespace is then checked only against the
/// policies that could select it.
#[derive(Default)]
struct SubjectIndex {
    by_label: HashMap<String, HashMap<String, Vec<Arc<TieredPolicy>>>>,
    any: Vec<Arc<TieredPolicy>>,
}

impl SubjectIndex {
    fn new<'a>(all: impl Iterator<Item = &'a Arc<TieredPolicy>>) -> Self {
        let mut index = SubjectIndex::default();
        for t in all {
            let Some(selector) = t.namespace_selector() else {
                continue; // selects nothing
            };
            match required_ns_labels(selector) {
                Some(required) => {
                    for (k, v) in required {
                        let filed = index
                            .by_label
                            .entry(k.to_string())
                            .or_default()
                            .entry(v.to_string())
                            .or_default();
                        // `In: [red, red]` names a value twice.
                        if !filed.iter().any(|p| Arc::ptr_eq(p, t)) {
                            filed.push(t.clone());
                        }
                    }
                }
                None => index.any.push(t.clone()),
            }
        }
        index
    }

    /// The policies that could select a namespace with `labels`, each once
    /// (a namespace has one value per key, and a policy is filed once under
    /// each of the values of one key).
    fn candidates(&self, labels: &BTreeMap<String, String>) -> Vec<Arc<TieredPolicy>> {
        let mut out = self.any.clone();
        for (k, v) in labels {
            if let Some(filed) = self.by_label.get(k).and_then(|values| values.get(v)) {
                out.extend(filed.iter().cloned());
            }
        }
        out
    }
}

#[derive(Default)]
pub(super) struct TierMemo {
    rules: HashMap<RulesKey, Resolved>,
    /// Built on first use in a pass.
    index: Option<SubjectIndex>,
    /// The namespace last asked about: the policies whose subject may select
    /// its pods (in precedence order) and the errors deciding that found.
    namespace: Option<(String, Vec<Arc<TieredPolicy>>, Vec<String>)>,
}

impl TierMemo {
    /// The ClusterNetworkPolicies that select `pod`, in precedence order;
    /// errors go to `errors` (a policy that cannot be evaluated for it does
    /// not apply, and the error says so).
    pub fn selecting<'a>(
        &mut self,
        pod: &PodInfo,
        ns_labels: impl FnOnce() -> BTreeMap<String, String>,
        all: impl Iterator<Item = &'a Arc<TieredPolicy>>,
        errors: &mut Vec<String>,
    ) -> Vec<Arc<TieredPolicy>> {
        if self.namespace.as_ref().map(|(ns, ..)| ns) != Some(&pod.namespace) {
            let labels = ns_labels();
            let index = self.index.get_or_insert_with(|| SubjectIndex::new(all));
            let mut candidates = Vec::new();
            let mut found = Vec::new();
            for t in index.candidates(&labels) {
                match t.selects_namespace(&labels) {
                    Ok(true) => candidates.push(t),
                    Ok(false) => {}
                    Err(e) => found.push(format!("{}: {e}", t.id)),
                }
            }
            candidates.sort_by(|a, b| a.policy.precedence().cmp(&b.policy.precedence()));
            self.namespace = Some((pod.namespace.clone(), candidates, found));
        }
        let (_, candidates, found) = self.namespace.as_ref().expect("set above");
        errors.extend(found.iter().cloned());
        let mut out = Vec::new();
        for t in candidates {
            match t.selects_in_namespace(pod) {
                Ok(true) => out.push(t.clone()),
                Ok(false) => {}
                Err(e) => errors.push(format!("{}: {e}", t.id)),
            }
        }
        out
    }

    /// `policy`'s rules for `pod`, resolved once per pass for every pod
    /// they resolve alike for; what they used is added to `selector.used`.
    pub fn rules(
        &mut self,
        policy: &Arc<TieredPolicy>,
        pod: &PodInfo,
        selector: &mut Selector<'_>,
        errors: &mut Vec<String>,
    ) -> TierRules {
        let key = (
            Arc::as_ptr(policy) as usize,
            policy.reads_target_ports().then(|| pod.named_ports.clone()),
        );
        let resolved = self.rules.entry(key).or_insert_with(|| {
            // Resolved apart, so that what it used is all its own.
            let outer = std::mem::take(&mut selector.used);
            let mut found = Vec::new();
            let rules = policy.rules_for(pod, &mut *selector, &mut found);
            Resolved {
                rules,
                used: std::mem::replace(&mut selector.used, outer),
                errors: found,
                _policy: policy.clone(),
            }
        });
        selector.used.extend(&resolved.used);
        errors.extend(resolved.errors.iter().cloned());
        resolved.rules.clone()
    }
}
