//! What resolution produces: a plan per node, and the problems it found.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_proto::v1::PodPolicy;

use crate::keys::PodKey;

/// Everything one node must enforce.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePlan {
    /// Shared, so that copying a node's plan to change one pod copies
    /// pointers, not rules.
    pub pods: BTreeMap<PodKey, Arc<PodPolicy>>,
}

impl NodePlan {
    /// Equality that skips entries both plans share.
    pub fn same_as(&self, other: &NodePlan) -> bool {
        self.pods.len() == other.pods.len()
            && self
                .pods
                .iter()
                .zip(other.pods.iter())
                .all(|((ka, va), (kb, vb))| ka == kb && (Arc::ptr_eq(va, vb) || va == vb))
    }
}

/// The plans of every node, and the problems found in the input. A problem
/// never widens what is allowed: an invalid peer or port is left out of its
/// rule (or the rule is dropped), while the policy still isolates its pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolution {
    pub plans: BTreeMap<String, NodePlan>,
    pub errors: Vec<String>,
}
