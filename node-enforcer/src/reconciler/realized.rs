//! What is in the datapath now, as this process wrote or adopted it: the
//! tables by content, the endpoints by interface, and the ids to allocate.
//! `converge` changes it as it writes; `recover` fills it from what a
//! previous process left.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Reconciler, DENY_ALL};
use crate::compile::{PolicySet, PortSet, Prefix};
use crate::datapath::{Datapath, EndpointEntry, PolicyId, PortSetId, LEARNED_PORTSET_BASE};
use crate::desired::{Claim, Verdict};

pub(super) struct RealizedPolicy {
    pub id: PolicyId,
    pub entries: Vec<(Prefix, PortSetId)>,
}

#[derive(Clone)]
pub(super) struct RealizedEndpoint {
    pub ifindex: u32,
    pub claim: Claim,
    pub ingress: Verdict,
    pub egress: Verdict,
    pub entry: EndpointEntry,
}

impl RealizedEndpoint {
    pub fn enforced(&self) -> crate::desired::Enforced {
        (
            self.ingress.clone(),
            self.egress.clone(),
            self.entry.pod_addrs.clone(),
        )
    }
}

/// What is in the datapath now, as this process wrote or adopted it.
#[derive(Default)]
pub(super) struct Realized {
    pub portsets: BTreeMap<PortSet, PortSetId>,
    pub policies: BTreeMap<Arc<PolicySet>, RealizedPolicy>,
    pub endpoints: BTreeMap<String, RealizedEndpoint>,
    pub next_portset: PortSetId,
    pub next_policy: PolicyId,
    /// Adopted tables whose content duplicates another's; removed once no
    /// endpoint points at them.
    pub garbage_policies: Vec<(PolicyId, Vec<(Prefix, PortSetId)>)>,
    pub garbage_portsets: Vec<(PortSetId, PortSet)>,
    /// Endpoints whose table was narrowed in place and whose epoch renewal
    /// failed, by interface: retried until done.
    pub owed_renewals: BTreeMap<String, super::in_place::OwedRenewal>,
    /// Staged (audit) entries written, by interface; their tables are
    /// referenced like enforced ones.
    pub audit: BTreeMap<String, super::audit::RealizedAudit>,
}

impl Realized {
    /// A policy id no live table has, never 0 (not isolated) nor
    /// [`DENY_ALL`], even after the counter wraps.
    pub fn alloc_policy(&mut self) -> Result<PolicyId, String> {
        let used: BTreeSet<PolicyId> = self
            .policies
            .values()
            .map(|p| p.id)
            .chain(self.garbage_policies.iter().map(|(id, _)| *id))
            .collect();
        for _ in 0..=used.len() + 2 {
            self.next_policy = self.next_policy.wrapping_add(1);
            let id = self.next_policy;
            if id != 0 && id != DENY_ALL && !used.contains(&id) {
                return Ok(id);
            }
        }
        Err("no free policy id".into())
    }

    /// [`Self::alloc_policy`], also avoiding `busy` (tables being written).
    pub fn alloc_policy_besides(&mut self, busy: &[PolicyId]) -> Result<PolicyId, String> {
        for _ in 0..=busy.len() {
            let id = self.alloc_policy()?;
            if !busy.contains(&id) {
                return Ok(id);
            }
        }
        Err("no free policy id".into())
    }

    pub fn alloc_portset(&mut self) -> Result<PortSetId, String> {
        let used: BTreeSet<PortSetId> = self
            .portsets
            .values()
            .copied()
            .chain(self.garbage_portsets.iter().map(|(id, _)| *id))
            .collect();
        for _ in 0..=used.len() + 1 {
            // Below the learner's ids (LEARNED_PORTSET_BASE), wrapping.
            self.next_portset = self.next_portset.wrapping_add(1) % LEARNED_PORTSET_BASE;
            let id = self.next_portset;
            if id != 0 && !used.contains(&id) {
                return Ok(id);
            }
        }
        Err("no free port set id".into())
    }
}

impl<D: Datapath> Reconciler<D> {
    /// A policy id for a new table: none a table has or is being written to.
    pub(super) fn alloc_policy(&mut self) -> Result<PolicyId, String> {
        let busy: Vec<PolicyId> = self.background.ids().collect();
        self.realized.alloc_policy_besides(&busy)
    }
}
