//! Taking over what a previous process left (DESIGN invariant 6): the
//! datapath's tables and pinned links, and the checkpointed inputs.
//!
//! The kernel is the source of truth for what is enforced; the checkpoint
//! only says why. So a damaged or missing checkpoint never detaches a live
//! interface: an attached interface no saved pod explains keeps the policy
//! it has (shown as unexplained in the dump) until the plan explains it by
//! its addresses or the interface goes away. Only links whose interface is
//! gone, and tables nothing references, are removed.
//!
//! "Gone" is what the kernel answered (ENODEV), never a reading that
//! failed: a new process that cannot read which interfaces exist stops
//! before it changes anything ([`RecoverError`]), as taking "unknown" for
//! "gone" would forget every pod and detach every interface on the node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::converge::renamed_warning;
use super::dump::Counted;
use super::plan::key;
use super::realized::{RealizedEndpoint, RealizedPolicy};
use super::{Reconciler, DENY_ALL};
use crate::checkpoint::Saved;
use crate::compile::PolicySet;
use crate::datapath::{Adopted, Datapath, DatapathError, EndpointEntry, PolicyId};
use crate::desired::{Claim, PodKey, Verdict};

/// Why a new process could not take the node over. Returned before
/// anything is detached or unpinned: the pinned programs keep enforcing
/// what they enforce, and the process exits to be restarted.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The datapath's tables, links or filters could not be read.
    #[error("reading the datapath left by the previous enforcer: {0}")]
    Adopt(#[source] DatapathError),
    /// Which of the interfaces the datapath and the saved pods name exist
    /// could not be read (the lookup failed; none was said to be gone).
    #[error("reading which of the {count} interfaces with our programs or saved pods exist: {source}; nothing was detached, the pinned programs keep enforcing")]
    Interfaces {
        count: usize,
        #[source]
        source: DatapathError,
    },
}

impl<D: Datapath> Reconciler<D> {
    pub fn recover(&mut self, mut saved: Saved) -> Result<(), RecoverError> {
        let adopted = self
            .datapath
            .adopt()
            .counted(&mut self.health)
            .map_err(RecoverError::Adopt)?;
        // Read once, before anything changes: an interface missing from the
        // answer is gone; a failed reading stops here.
        let names: BTreeSet<&str> = adopted
            .attached
            .keys()
            .chain(saved.pods.values().flat_map(|p| &p.host_interfaces))
            .map(String::as_str)
            .collect();
        let names: Vec<&str> = names.into_iter().collect();
        let mut live = self
            .datapath
            .interfaces_named(&names)
            .counted(&mut self.health)
            .map_err(|source| RecoverError::Interfaces {
                count: names.len(),
                source,
            })?;
        let renamed = self.renamed_while_down(&adopted.attached, &live)?;
        for (was, (index, now)) in &renamed {
            self.health.warn(renamed_warning(was, *index, now));
            // Live under the name it was attached by, unless a newer
            // interface has that name (whose pod-up waits for it to go).
            live.entry(was.clone()).or_insert(*index);
        }
        for w in std::mem::take(&mut saved.damage)
            .into_iter()
            .chain(adopted.warnings.clone())
        {
            self.health.warn(w);
        }
        self.forget_adopted_audit();
        // Kept without a plan too: a plan that could not be saved removed
        // plan.pb, and plans of older terms stay refused.
        self.plan.term = saved.highest_term();
        self.plan.saved_term = saved.term;
        if let Some(plan) = saved.plan {
            self.plan.entries = plan
                .pods
                .into_iter()
                .filter_map(|p| Some((key(p.pod.as_ref())?, p)))
                .collect();
            self.plan.version = plan.version;
            self.plan.realized_version = plan.version;
            self.plan.received = true;
        }
        self.pods.runtime = saved.pods;

        let r = &mut self.realized;
        for (id, set) in &adopted.portsets {
            if r.portsets.contains_key(set) {
                r.garbage_portsets.push((*id, set.clone()));
            } else {
                r.portsets.insert(set.clone(), *id);
            }
            r.next_portset = r.next_portset.max(*id);
        }
        let mut by_id: BTreeMap<PolicyId, Arc<PolicySet>> = BTreeMap::new();
        for (id, entries) in &adopted.policies {
            if *id == DENY_ALL || *id == 0 {
                continue;
            }
            let set = Arc::new(PolicySet::new(
                entries
                    .iter()
                    .map(|(p, ps)| (*p, adopted.portsets.get(ps).cloned().unwrap_or_default()))
                    .collect(),
            ));
            if r.policies.contains_key(&set) {
                r.garbage_policies.push((*id, entries.clone()));
            } else {
                r.policies.insert(
                    set.clone(),
                    RealizedPolicy {
                        id: *id,
                        entries: entries.clone(),
                    },
                );
            }
            by_id.insert(*id, set);
            if *id < DENY_ALL / 2 {
                r.next_policy = r.next_policy.max(*id);
            }
        }
        // An id with no entries is an empty table: it denies everything.
        let verdict = |id: PolicyId| -> Verdict {
            match id {
                0 => Verdict::Open,
                DENY_ALL => Verdict::Deny,
                id => Verdict::Policy(
                    by_id
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| Arc::new(PolicySet::default())),
                ),
            }
        };

        let claimant =
            |ifname: &str, ifindex: u32, pods: &BTreeMap<PodKey, crate::desired::PodRuntime>| {
                pods.iter()
                    .find(|(_, rt)| {
                        rt.host_interfaces.iter().any(|i| i == ifname)
                            && rt.ifindexes.get(ifname).is_none_or(|w| *w == ifindex)
                    })
                    .map(|(k, _)| k.clone())
            };
        let mut claimed = BTreeSet::new();
        for ifname in adopted.attached.keys() {
            let at = match renamed.get(ifname) {
                Some((index, _)) => Some(*index),
                None => live.get(ifname).copied(),
            };
            let Some(ifindex) = at else {
                // The interface is gone, and its link with it: unpin.
                if let Err(e) = self.datapath.detach(ifname, 0).counted(&mut self.health) {
                    self.health
                        .warn(format!("unpinning the link of vanished {ifname}: {e}"));
                }
                continue;
            };
            claimed.insert(ifindex);
            let entry = match adopted.endpoints.get(&ifindex) {
                Some(e) => e.clone(),
                None => {
                    // Attached with no entry passes everything: deny now,
                    // before anything else.
                    let deny = EndpointEntry {
                        ingress: DENY_ALL,
                        egress: DENY_ALL,
                        pod_addrs: Vec::new(),
                    };
                    if let Err(e) = self
                        .datapath
                        .set_endpoint(ifindex, &deny)
                        .counted(&mut self.health)
                    {
                        self.health.warn(format!("{ifname}: attached without an endpoint entry, and denying it failed: {e}"));
                    }
                    deny
                }
            };
            let claim = match claimant(ifname, ifindex, &self.pods.runtime) {
                Some(k) => Claim::Pod(k),
                None => {
                    self.health.warn(format!(
                        "{ifname} (index {ifindex}) has our programs but no saved pod explains it; it keeps its policy until the plan explains it or it goes away"
                    ));
                    Claim::Unexplained
                }
            };
            self.realized.endpoints.insert(
                ifname.clone(),
                RealizedEndpoint {
                    ifindex,
                    claim,
                    ingress: verdict(entry.ingress),
                    egress: verdict(entry.egress),
                    entry,
                },
            );
        }
        self.unclaimed_entries(&adopted, &claimed);
        self.renew_after_recovery();
        self.refresh_node_addresses();
        // A pod whose interfaces are all gone was deleted while we were down.
        // One on links that could not be read may not be: kept, so a
        // restart that reads them finds whose they are.
        self.pods.live = live;
        self.pods.renamed = renamed;
        let (live, renamed) = (&self.pods.live, &self.pods.renamed);
        self.pods.runtime.retain(|_, rt| {
            rt.host_interfaces.iter().any(|i| {
                if adopted.unlocated.contains(i) {
                    return true;
                }
                let at = renamed.get(i).map(|(idx, _)| idx).or(live.get(i));
                at.is_some_and(|idx| rt.ifindexes.get(i).is_none_or(|w| w == idx))
            })
        });
        tracing::info!(
            pods = self.pods.runtime.len(),
            interfaces = self.realized.endpoints.len(),
            policy_sets = self.realized.policies.len(),
            plan_version = self.plan.version,
            "recovered the previous enforcer's state"
        );
        self.adopt_unexplained_after_recovery();
        self.converge();
        self.save_pods();
        Ok(())
    }

    /// The adopted interfaces whose links are on an interface that lives
    /// under another name now: renamed while no enforcer ran. Each is
    /// followed by index, under the name its links are pinned by, as a
    /// rename at runtime is (`refresh_links`). A failed reading stops the
    /// recovery: taking them for gone would unpin live pods' links.
    fn renamed_while_down(
        &mut self,
        attached: &BTreeMap<String, u32>,
        live: &BTreeMap<String, u32>,
    ) -> Result<BTreeMap<String, (u32, String)>, RecoverError> {
        // Index 0: the datapath could not say; the name decides.
        let moved: BTreeMap<&String, u32> = attached
            .iter()
            .filter(|(n, i)| **i != 0 && live.get(*n) != Some(*i))
            .map(|(n, i)| (n, *i))
            .collect();
        if moved.is_empty() {
            return Ok(BTreeMap::new());
        }
        let indexes: Vec<u32> = moved.values().copied().collect();
        let now = self
            .datapath
            .interfaces_indexed(&indexes)
            .counted(&mut self.health)
            .map_err(|source| RecoverError::Interfaces {
                count: indexes.len(),
                source,
            })?;
        Ok(moved
            .into_iter()
            .filter_map(|(was, index)| {
                let now = now.get(&index).filter(|now| *now != was)?;
                Some((was.clone(), (index, now.clone())))
            })
            .collect())
    }

    /// The endpoint entries no adopted link is on. Dead weight, removed,
    /// when every pinned link could be read. Otherwise one of them may be
    /// an unreadable link's, whose programs pass everything without it
    /// (and a table it names may be freed and reused): all are set to
    /// deny, and stay until a restart can read the links.
    fn unclaimed_entries(&mut self, adopted: &Adopted, claimed: &BTreeSet<u32>) {
        let unclaimed = adopted.endpoints.keys().filter(|i| !claimed.contains(i));
        if adopted.unlocated.is_empty() {
            for ifindex in unclaimed {
                let _ = self.datapath.remove_endpoint(*ifindex);
            }
            return;
        }
        let deny = EndpointEntry {
            ingress: DENY_ALL,
            egress: DENY_ALL,
            pod_addrs: Vec::new(),
        };
        let mut denied = Vec::new();
        for ifindex in unclaimed {
            match self
                .datapath
                .set_endpoint(*ifindex, &deny)
                .counted(&mut self.health)
            {
                Ok(()) => denied.push(*ifindex),
                Err(e) => self.health.warn(format!(
                    "denying ifindex {ifindex}, an endpoint entry no readable link is on: {e}"
                )),
            }
        }
        if !denied.is_empty() {
            self.health.warn(format!(
                "the endpoint entries of ifindexes {denied:?} are on no link this enforcer could read; the pinned links of {:?} could not be read, and may be theirs, so they deny everything until a restart reads them",
                adopted.unlocated
            ));
        }
    }

    fn adopt_unexplained_after_recovery(&mut self) {
        if self.plan.received {
            self.adopt_unexplained_interfaces();
        }
    }
}
