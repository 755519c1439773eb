//! The controller's plan: snapshots and deltas from the stream, and pod
//! entries fetched on demand for pods the stream has not delivered yet.

use std::collections::{BTreeMap, BTreeSet};

use palisade_proto::v1::{PlanDelta, PlanSnapshot, PodPolicy, PodRef};

use super::Reconciler;
use crate::compile::Prefix;
use crate::datapath::Datapath;
use crate::desired::{Claim, PodKey, PodRuntime};

/// A message from the controller's plan stream.
#[derive(Clone, Debug)]
pub enum PlanMessage {
    Snapshot(PlanSnapshot),
    Delta(PlanDelta),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error(
        "delta from version {base} does not apply to version {held}; resubscribe for a snapshot"
    )]
    OutOfSequence { base: u64, held: u64 },
    #[error("snapshot version {0} comes from a controller that has not synced its source; refused, the node keeps its current plan")]
    NotSynced(u64),
    #[error("plan version {version} is from leadership term {term}, older than term {highest} already applied: a deposed controller sent it; refused, the node keeps its current plan")]
    StaleTerm {
        version: u64,
        term: u64,
        highest: u64,
    },
    /// A plan of a newer term whose term could not be saved: applied, a
    /// restart would forget the term and accept a deposed controller.
    #[error("plan version {version} is from leadership term {term}, which could not be saved ({reason}); refused, the node keeps its current plan until the term is on disk")]
    TermNotSaved {
        version: u64,
        term: u64,
        reason: String,
    },
}

/// The controller's plan as this node holds it.
#[derive(Default)]
pub(super) struct Plan {
    /// Each listed pod's entry; meaningful once `received`.
    pub entries: BTreeMap<PodKey, PodPolicy>,
    pub version: u64,
    /// The highest controller leadership term applied (0: none, or a
    /// controller without leader election); plans of lower terms are refused.
    pub term: u64,
    /// A snapshot was applied (or recovered): `entries` is a plan.
    pub received: bool,
    pub connected: bool,
    /// Why the plan stream failed; cleared when it connects.
    pub stream_error: String,
    /// Pod entries fetched on demand for pods the stream has not delivered;
    /// dropped as soon as the stream's plan lists the pod.
    pub fetched: BTreeMap<PodKey, PodPolicy>,
    /// The plan version whose tables are all in the datapath.
    pub realized_version: u64,
    /// The term the checkpoint's term file holds: a plan of a higher term
    /// is applied only once it does.
    pub saved_term: u64,
    /// Why the plan is not on disk (plan.pb then holds no plan at all);
    /// a failure in the state until a save succeeds (retried on ticks).
    pub save_error: Option<String>,
}

impl Plan {
    /// The pod's entry, from the stream or fetched on demand.
    pub fn listed_or_fetched(&self, key: &PodKey) -> Option<&PodPolicy> {
        self.entries.get(key).or_else(|| self.fetched.get(key))
    }
}

/// The key of a plan entry's pod.
pub(super) fn key(r: Option<&PodRef>) -> Option<PodKey> {
    r.map(palisade_proto::plan::pod_key)
}

fn isolated(plan: &BTreeMap<PodKey, PodPolicy>) -> usize {
    plan.values()
        .filter(|p| p.ingress.is_some() || p.egress.is_some())
        .count()
}

impl<D: Datapath> Reconciler<D> {
    pub fn apply_plan(&mut self, msg: PlanMessage) -> Result<u64, PlanError> {
        // The pods a delta touches; None: a snapshot touches them all.
        let mut changed: Option<BTreeSet<PodKey>> = None;
        match msg {
            PlanMessage::Snapshot(s) => {
                if s.term < self.plan.term {
                    let e = PlanError::StaleTerm {
                        version: s.version,
                        term: s.term,
                        highest: self.plan.term,
                    };
                    self.health.warn(e.to_string());
                    return Err(e);
                }
                if !s.source_synced {
                    let e = PlanError::NotSynced(s.version);
                    self.health.warn(e.to_string());
                    return Err(e);
                }
                self.save_term(s.version, s.term)?;
                let plan: BTreeMap<PodKey, PodPolicy> = s
                    .pods
                    .into_iter()
                    .filter_map(|p| Some((key(p.pod.as_ref())?, p)))
                    .collect();
                let (before, after) = (isolated(&self.plan.entries), isolated(&plan));
                if self.plan.received && before > 0 && after == 0 {
                    // Legitimate when every policy was deleted, a disaster
                    // otherwise: either way an operator must see it.
                    self.health.warn(format!(
                        "snapshot version {} drops every policy on this node ({before} isolated pods before, none now)",
                        s.version
                    ));
                }
                self.plan.entries = plan;
                self.plan.version = s.version;
                self.plan.term = s.term;
                self.plan.received = true;
            }
            PlanMessage::Delta(d) => {
                if d.term < self.plan.term {
                    let e = PlanError::StaleTerm {
                        version: d.version,
                        term: d.term,
                        highest: self.plan.term,
                    };
                    self.health.warn(e.to_string());
                    return Err(e);
                }
                // A delta continues a stream of one term: a newer term
                // starts with its own snapshot.
                if !self.plan.received
                    || d.term != self.plan.term
                    || d.base_version != self.plan.version
                {
                    return Err(PlanError::OutOfSequence {
                        base: d.base_version,
                        held: self.plan.version,
                    });
                }
                // The term file may predate this version (an upgrade).
                self.save_term(d.version, d.term)?;
                let version = d.version;
                changed = Some(palisade_proto::plan::apply_delta(&mut self.plan.entries, d));
                self.plan.version = version;
            }
        }
        let plan = &self.plan.entries;
        self.plan.fetched.retain(|k, _| !plan.contains_key(k));
        if self.adopt_unexplained_interfaces() {
            changed = None;
        }
        // Saved before the datapath changes: a crash in between restarts
        // from the newer plan and converges to it.
        self.save_plan();
        match &changed {
            None => self.converge(),
            Some(pods) => self.converge_pods(pods),
        }
        self.answer_waiting_ups();
        // A plan is realized once every table it needs is complete (big
        // ones finish in `background`).
        if self.target.desired.awaiting_tables.is_empty() {
            self.plan.realized_version = self.plan.version;
        }
        Ok(self.plan.version)
    }

    /// Makes `term` durable before a plan of it is applied (invariant 12:
    /// a restart refuses what a deposed controller sends). Written only
    /// when it grows, so once per leadership change.
    fn save_term(&mut self, version: u64, term: u64) -> Result<(), PlanError> {
        let Some(cp) = &self.ctx.checkpoint else {
            return Ok(());
        };
        if term <= self.plan.saved_term {
            return Ok(());
        }
        if let Err(e) = cp.save_term(term) {
            let e = PlanError::TermNotSaved {
                version,
                term,
                reason: e.to_string(),
            };
            self.health.warn(e.to_string());
            return Err(e);
        }
        self.plan.saved_term = term;
        Ok(())
    }

    /// Saves the plan; on failure removes the older plan.pb, so a restart
    /// holds what the datapath enforces instead of converging back to an
    /// older (maybe looser) plan, and says so until a save succeeds.
    pub(super) fn save_plan(&mut self) {
        let Some(cp) = &self.ctx.checkpoint else {
            return;
        };
        let (version, term) = (self.plan.version, self.plan.term);
        let e = match cp.save_plan(version, term, &self.plan.entries) {
            Ok(()) => {
                if let Some(old) = self.plan.save_error.take() {
                    tracing::info!(version, "the plan is saved again");
                    self.health.errors.retain(|e| *e != old);
                }
                return;
            }
            Err(e) => e,
        };
        let e = match cp.forget_plan() {
            Ok(()) => format!(
                "saving plan version {version}: {e}; the older plan.pb is removed, so a restart holds what the datapath enforces until the controller's plan comes; retried every tick"
            ),
            Err(r) => format!(
                "saving plan version {version}: {e}; removing the older plan.pb failed too ({r}), so a restart would go back to it; retried every tick"
            ),
        };
        if self.plan.save_error.is_none() {
            self.health.warn(e.clone());
        }
        // A failure of the node until a save succeeds: full convergences
        // clear the errors, so `apply` puts it back.
        if let Some(old) = self.plan.save_error.replace(e.clone()) {
            self.health.errors.retain(|x| *x != old);
        }
        self.health.errors.push(e);
    }

    pub(super) fn pod_plan_fetched(&mut self, pod: PodKey, policy: Option<PodPolicy>) {
        let Some(policy) = policy else {
            return;
        };
        // The stream already has it (and may be newer), or the pod is gone.
        if (self.plan.received && self.plan.entries.contains_key(&pod))
            || !self.pods.runtime.contains_key(&pod)
        {
            return;
        }
        self.plan.fetched.insert(pod.clone(), policy);
        self.converge_pods([&pod]);
        self.answer_waiting_ups();
    }

    /// Plan pods adopt the interfaces with our programs that no known pod
    /// claims (their checkpoint was lost), matched by the addresses the
    /// interface's endpoint entry holds: pod→interface knowledge comes back
    /// from the kernel instead of the interface being detached.
    /// True when any was adopted.
    pub(super) fn adopt_unexplained_interfaces(&mut self) -> bool {
        let claimed: BTreeSet<&PodKey> = self.pods.runtime.keys().collect();
        let mut by_addrs: BTreeMap<BTreeSet<[u8; 16]>, Vec<&PodKey>> = BTreeMap::new();
        for (k, p) in &self.plan.entries {
            if claimed.contains(k) || p.pod_ips.is_empty() {
                continue;
            }
            let addrs: Option<BTreeSet<[u8; 16]>> = p
                .pod_ips
                .iter()
                .map(|ip| Prefix::from_wire(ip).ok().map(|p| p.addr))
                .collect();
            if let Some(a) = addrs {
                by_addrs.entry(a).or_default().push(k);
            }
        }
        let mut found: Vec<(PodKey, String, u32, Vec<[u8; 16]>)> = Vec::new();
        for (ifname, e) in &self.realized.endpoints {
            if e.claim != Claim::Unexplained || e.entry.pod_addrs.is_empty() {
                continue;
            }
            let addrs: BTreeSet<[u8; 16]> = e.entry.pod_addrs.iter().copied().collect();
            if let Some([only]) = by_addrs.get(&addrs).map(Vec::as_slice) {
                found.push((
                    (*only).clone(),
                    ifname.clone(),
                    e.ifindex,
                    e.entry.pod_addrs.clone(),
                ));
            }
        }
        let adopted = !found.is_empty();
        for (pod, ifname, ifindex, addrs) in found {
            tracing::info!(pod = %format!("{}/{}", pod.0, pod.1), %ifname, "interface explained by the pod's addresses");
            self.pods.runtime.insert(
                pod,
                PodRuntime {
                    container_id: String::new(),
                    netns: String::new(),
                    host_interfaces: vec![ifname.clone()],
                    ips: addrs.iter().map(|a| Prefix::new(*a, 128)).collect(),
                    ifindexes: BTreeMap::from([(ifname, ifindex)]),
                    mode: None,
                },
            );
        }
        if adopted {
            self.save_pods();
        }
        adopted
    }
}

#[cfg(test)]
mod tests {
    use super::super::Event;
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::datapath::fake::FakeDatapath;

    fn pod(name: &str) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            ..Default::default()
        }
    }

    fn snapshot(term: u64, version: u64, pods: &[&str]) -> PlanMessage {
        PlanMessage::Snapshot(PlanSnapshot {
            version,
            pods: pods.iter().map(|p| pod(p)).collect(),
            source_synced: true,
            term,
            ..Default::default()
        })
    }

    fn delta(term: u64, base: u64, add: &str) -> PlanMessage {
        PlanMessage::Delta(PlanDelta {
            base_version: base,
            version: base + 1,
            upserted: vec![pod(add)],
            removed: vec![],
            term,
            ..Default::default()
        })
    }

    #[test]
    fn plans_from_an_older_term_are_refused_and_the_term_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Reconciler::new("n".into(), "e".into(), FakeDatapath::default())
            .with_checkpoint(Checkpoint::open(dir.path()).unwrap());
        assert_eq!(r.apply_plan(snapshot(3, 10, &["a"])), Ok(10));
        assert_eq!(r.apply_plan(delta(3, 10, "b")), Ok(11));
        // A deposed leader (term 2) cannot change anything, by snapshot or
        // by delta, even one that would fit the held version.
        let refused = r.apply_plan(snapshot(2, 500, &[])).unwrap_err();
        assert_eq!(
            refused,
            PlanError::StaleTerm {
                version: 500,
                term: 2,
                highest: 3
            }
        );
        assert!(refused.to_string().contains("deposed controller"));
        assert!(matches!(
            r.apply_plan(delta(2, 11, "c")),
            Err(PlanError::StaleTerm { .. })
        ));
        assert_eq!(
            r.plan.entries.len(),
            2,
            "nothing of the old term was applied"
        );
        // A newer term's delta without its snapshot does not apply either.
        assert!(matches!(
            r.apply_plan(delta(4, 11, "c")),
            Err(PlanError::OutOfSequence { .. })
        ));
        // The new leader's snapshot does, whatever its version numbers.
        assert_eq!(r.apply_plan(snapshot(4, 7, &["a"])), Ok(7));

        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(saved.plan.as_ref().unwrap().term, 4);
        let mut again = Reconciler::new("n".into(), "e2".into(), FakeDatapath::default());
        again.recover(saved).unwrap();
        assert!(matches!(
            again.apply_plan(snapshot(3, 99, &[])),
            Err(PlanError::StaleTerm { highest: 4, .. })
        ));
        assert_eq!(again.apply_plan(snapshot(4, 8, &[])), Ok(8));
    }

    /// What stands in for a full or read-only disk: the save's temp file
    /// cannot be made (a directory holds its name; root ignores modes).
    fn block_save(dir: &std::path::Path, file: &str) -> std::path::PathBuf {
        let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
        std::fs::create_dir(&tmp).unwrap();
        tmp
    }

    #[test]
    fn a_plan_that_cannot_be_saved_takes_the_older_one_off_disk_and_keeps_the_term() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut r = Reconciler::new("n".into(), "e".into(), FakeDatapath::default())
            .with_checkpoint(cp.clone());
        assert_eq!(r.apply_plan(snapshot(3, 10, &["a"])), Ok(10));
        let blocked = block_save(dir.path(), "plan.pb");
        // Applied (the controller's plan is the newest word), but not saved:
        // plan version 10 must not come back after a restart.
        assert_eq!(r.apply_plan(delta(3, 10, "b")), Ok(11));
        assert_eq!(r.plan.entries.len(), 2);
        assert!(!dir.path().join("plan.pb").exists(), "the older plan stays");
        let failed = |r: &Reconciler<FakeDatapath>| {
            r.node_state()
                .errors
                .iter()
                .filter(|e| e.contains("saving plan version 11"))
                .count()
        };
        assert_eq!(failed(&r), 1, "{:?}", r.node_state().errors);
        // A full convergence clears the datapath's errors, not this one.
        r.handle(Event::Tick);
        assert_eq!(failed(&r), 1, "{:?}", r.node_state().errors);

        // A restart meanwhile: no plan, so every pod is held; the term is
        // still refused below.
        let saved = cp.load().unwrap();
        assert_eq!((saved.plan.is_some(), saved.highest_term()), (false, 3));
        let mut again = Reconciler::new("n".into(), "e2".into(), FakeDatapath::default());
        again.recover(saved).unwrap();
        assert!(!again.plan.received);
        assert!(matches!(
            again.apply_plan(snapshot(2, 99, &[])),
            Err(PlanError::StaleTerm { highest: 3, .. })
        ));

        // The disk has room again: the next tick saves it.
        std::fs::remove_dir(&blocked).unwrap();
        r.handle(Event::Tick);
        assert_eq!(failed(&r), 0, "{:?}", r.node_state().errors);
        assert_eq!(cp.load().unwrap().plan.unwrap().version, 11);
    }

    #[test]
    fn a_new_term_that_cannot_be_saved_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut r = Reconciler::new("n".into(), "e".into(), FakeDatapath::default())
            .with_checkpoint(cp.clone());
        assert_eq!(r.apply_plan(snapshot(3, 10, &["a"])), Ok(10));
        let blocked = block_save(dir.path(), "term");
        // The same term needs no write.
        assert_eq!(r.apply_plan(delta(3, 10, "b")), Ok(11));
        let refused = r.apply_plan(snapshot(4, 1, &[])).unwrap_err();
        assert!(
            matches!(
                refused,
                PlanError::TermNotSaved {
                    version: 1,
                    term: 4,
                    ..
                }
            ),
            "{refused:?}"
        );
        let path = dir.path().join("term");
        assert!(
            refused
                .to_string()
                .contains(&format!("writing {}", path.display())),
            "{refused}"
        );
        assert_eq!((r.plan.term, r.plan.version), (3, 11), "nothing applied");
        std::fs::remove_dir(&blocked).unwrap();
        assert_eq!(r.apply_plan(snapshot(4, 1, &[])), Ok(1));
        assert_eq!(cp.load().unwrap().term, 4);
    }
}
