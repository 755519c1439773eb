//! The desired datapath: a pure function of the node's plan and the pods the
//! CNI told us about. Nothing here depends on the order events arrived in.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_proto::v1::{DirectionPolicy, PodPolicy};

use crate::compile::{compile, PolicySet, Prefix};

pub type PodKey = (String, String);

/// A pod as the CNI plugin reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodRuntime {
    pub container_id: String,
    pub netns: String,
    pub host_interfaces: Vec<String>,
    pub ips: Vec<Prefix>,
}

/// What one host interface must have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredEndpoint {
    pub pod: PodKey,
    /// None: not isolated in that direction.
    pub ingress: Option<Arc<PolicySet>>,
    pub egress: Option<Arc<PolicySet>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub endpoints: BTreeMap<String, DesiredEndpoint>,
    /// Pods whose plan could not be compiled. They are denied in the broken
    /// direction rather than left open.
    pub errors: BTreeMap<PodKey, String>,
}

/// `node_addresses` are the node's own addresses, always allowed in an
/// isolated direction (see `compile`).
pub fn desired(
    plan: &BTreeMap<PodKey, PodPolicy>,
    pods: &BTreeMap<PodKey, PodRuntime>,
    node_addresses: &[Prefix],
) -> Desired {
    let mut out = Desired::default();
    // Pods with equal policies get the same Arc, so sharing is by content.
    let mut interned: BTreeMap<PolicySet, Arc<PolicySet>> = BTreeMap::new();
    let mut intern = |set: PolicySet| {
        interned
            .entry(set.clone())
            .or_insert_with(|| Arc::new(set))
            .clone()
    };
    for (key, pod) in pods {
        let policy = plan.get(key);
        let mut direction = |d: Option<&DirectionPolicy>, name: &str| -> Option<Arc<PolicySet>> {
            let d = d?;
            match compile(d, node_addresses) {
                Ok(set) => Some(intern(set)),
                Err(e) => {
                    out.errors.insert(
                        key.clone(),
                        format!("{name} policy of {}/{}: {e}", key.0, key.1),
                    );
                    // Deny, but never the node itself.
                    let fallback =
                        compile(&DirectionPolicy::default(), node_addresses).unwrap_or_default();
                    Some(intern(fallback))
                }
            }
        };
        let ingress = direction(policy.and_then(|p| p.ingress.as_ref()), "ingress");
        let egress = direction(policy.and_then(|p| p.egress.as_ref()), "egress");
        for ifname in &pod.host_interfaces {
            out.endpoints.insert(
                ifname.clone(),
                DesiredEndpoint {
                    pod: key.clone(),
                    ingress: ingress.clone(),
                    egress: egress.clone(),
                },
            );
        }
    }
    out
}
