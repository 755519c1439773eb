//! The one owner of the node's datapath (DESIGN invariant 1). Every input —
//! plan snapshots and deltas, CNI pod up/down, interface events, pod-up
//! deadlines, debug dumps — arrives here as an [`Event`] on one channel and
//! is handled in order on one thread. Each step updates the inputs, then
//! recomputes the desired datapath and applies the difference (`converge`,
//! invariant 2), adding new tables before pointing interfaces at them and
//! removing tables only once nothing references them (invariants 4 and 5).
//!
//! The [`Reconciler`] is a list of named parts, each kept in the file whose
//! code owns it; a behaviour is found by its file:
//!
//! - `plan`: snapshots and deltas from the controller, and on-demand pod
//!   plans (`plan::Plan`).
//! - `pods`: pod up/down/check, the pod-up wait and its deadline
//!   (`pods::Pods`).
//! - `converge`: desired → datapath, table sharing and refcounts
//!   (`converge::Target`: the desired datapath and what it is computed
//!   from besides the plan and the pods).
//! - `realized`: what is in the datapath now (`realized::Realized`).
//! - `in_place`: editing a table in place instead of writing a new one.
//! - `audit`: staged (audit) policies (`audit::Audit`).
//! - `background`: big tables compiled off this thread, written in slices.
//! - `promote`: fast-attached interfaces moved to links once the node is
//!   quiet.
//! - `recover`: taking over what a previous process left, rebuilding from the
//!   kernel what a damaged checkpoint lost.
//! - `dump`: the state operators see (`dump::Health`: errors, failures,
//!   warnings, conntrack cleanups).

mod audit;
mod background;
mod converge;
mod dump;
mod in_place;
mod plan;
mod pods;
mod promote;
mod realized;
mod recover;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use palisade_proto::v1::{NodeState, PodPolicy, PodState};
use tokio::sync::{mpsc, oneshot, watch};

use crate::checkpoint::Checkpoint;
use crate::compile::{PolicySet, Prefix};
use crate::datapath::{Datapath, PolicyId};
use crate::desired::{Mode, PodKey};

pub use background::{peers, slices, BACKGROUND_PEERS, SLICE_ENTRIES};
pub use dump::{ConntrackDump, Dump, InterfaceDump, PolicySetDump};
pub use plan::{PlanError, PlanMessage};
pub use pods::{PodUp, PodUpOutcome, PodUpReply};
pub use promote::{MAX_WAIT as PROMOTE_MAX_WAIT, QUIET as PROMOTE_QUIET};

/// The policy id an endpoint gets when its policy could not be written: no
/// table entry ever has it, so every lookup misses and the pod is denied
/// rather than left open. Never allocated to a table.
pub const DENY_ALL: PolicyId = u32::MAX;

pub enum Event {
    Plan(PlanMessage, oneshot::Sender<Result<u64, PlanError>>),
    PlanConnected(bool),
    /// The plan stream failed, and why; cleared when it connects.
    PlanStreamError(String),
    /// Answered when the pod's policy is realized, or at its deadline.
    PodUp(PodUp, PodUpReply),
    /// The pod-up deadline of this pod's sandbox passed.
    PodUpDeadline {
        pod: PodKey,
        container_id: String,
    },
    /// The controller's answer to an on-demand request for one pod's plan.
    PodPlanFetched {
        pod: PodKey,
        policy: Option<PodPolicy>,
    },
    PodDown {
        /// None when the runtime could not tell (a DEL may carry only the
        /// container id); the pod is then found by its container.
        pod: Option<PodKey>,
        container_id: String,
        reply: oneshot::Sender<Result<(), String>>,
    },
    PodCheck {
        pod: PodKey,
        container_id: String,
        reply: oneshot::Sender<Result<PodState, String>>,
    },
    Dump(oneshot::Sender<Dump>),
    /// Interfaces appeared or vanished (netlink): re-read which are live.
    Links,
    /// A conntrack cleanup pass finished (or failed).
    ConntrackCleaned(Result<crate::conntrack::sweep::Report, String>),
    /// Periodic: re-reads inputs that change without telling us (the node's
    /// addresses, interfaces if a link event was lost) and converges.
    Tick,
    /// Promote every fast-attached interface now (shutdown): answered with
    /// how many are left on filters.
    PromoteAll(oneshot::Sender<usize>),
    /// A big policy compiled off the reconciler's thread (see `background`),
    /// by its encoding.
    Compiled {
        key: Vec<u8>,
        generation: u64,
        result: Result<Arc<PolicySet>, String>,
    },
}

/// Who this enforcer is, how it behaves, and its handles to the rest of the
/// process: set when it is built, never changed by an event.
struct Context {
    node: String,
    enforcer_id: String,
    mode: Mode,
    /// Edit a table in place when that is safe (see `in_place`); off: every
    /// content change gets a new table, as before.
    in_place_edits: bool,
    /// Where the inputs are saved after every change, so a restart can
    /// recover them.
    checkpoint: Option<Checkpoint>,
    /// Where to ask for one pod's plan (see `plan`).
    fetch: Option<mpsc::UnboundedSender<PodKey>>,
    /// Shared with the link watcher: set while an [`Event::Links`] is queued.
    link_event_queued: crate::links::Pending,
    /// When the event being handled began (ms since the Unix epoch; 0:
    /// idle), for the stall watchdog (`crate::stall`).
    busy_since: Arc<AtomicU64>,
}

pub struct Reconciler<D: Datapath> {
    ctx: Context,
    plan: plan::Plan,
    pods: pods::Pods,
    target: converge::Target,
    realized: realized::Realized,
    audit: audit::Audit,
    /// Big policies compiled off this thread and written in slices.
    background: background::Background,
    /// Fast-attached interfaces' way to links (see `promote`).
    promotion: promote::Promotion,
    health: dump::Health,
    pub datapath: D,
}

impl<D: Datapath> Reconciler<D> {
    pub fn new(node: String, enforcer_id: String, datapath: D) -> Self {
        Reconciler {
            ctx: Context {
                node,
                enforcer_id,
                mode: Mode::Standard,
                in_place_edits: true,
                checkpoint: None,
                fetch: None,
                link_event_queued: Default::default(),
                busy_since: Default::default(),
            },
            plan: Default::default(),
            pods: Default::default(),
            target: Default::default(),
            realized: Default::default(),
            audit: Default::default(),
            background: Default::default(),
            promotion: Default::default(),
            health: Default::default(),
            datapath,
        }
    }

    /// Compiles direction policies of at least `peers` peers on a worker
    /// thread whose results come back on `events`, and writes their tables
    /// in slices between events. Without it everything is done in the
    /// event that needs it (tests, benches that call `apply_plan`).
    pub fn with_background_compile(
        mut self,
        events: mpsc::Sender<Event>,
        peers: usize,
    ) -> std::io::Result<Self> {
        self.background.threshold = peers;
        self.background.start(events)?;
        Ok(self)
    }

    /// The most entries one compiled table may have; a bigger one is
    /// refused and its pods are denied in that direction.
    pub fn with_max_table_entries(mut self, n: usize) -> Self {
        self.background.max_entries = n;
        self
    }

    /// Where the reconciler says since when it is busy with one event.
    pub fn busy_since(&self) -> Arc<AtomicU64> {
        self.ctx.busy_since.clone()
    }

    /// Saves the inputs after every change, so a restart can recover them.
    pub fn with_checkpoint(mut self, checkpoint: Checkpoint) -> Self {
        self.ctx.checkpoint = Some(checkpoint);
        self
    }

    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.ctx.mode = mode;
        self
    }

    /// Whether changed content may be written into the table it replaces
    /// (on by default; off measures or avoids the new-id path).
    pub fn with_in_place_edits(mut self, on: bool) -> Self {
        self.ctx.in_place_edits = on;
        self
    }

    /// Shares the "a link event is queued" flag with the link watcher.
    pub fn with_link_events(mut self, queued: crate::links::Pending) -> Self {
        self.ctx.link_event_queued = queued;
        self
    }

    /// Where to ask for one pod's plan when a pod comes up before the stream
    /// has delivered it.
    pub fn with_fetcher(mut self, fetch: mpsc::UnboundedSender<PodKey>) -> Self {
        self.ctx.fetch = Some(fetch);
        self
    }

    /// Handles events until every sender is gone, publishing the node's
    /// state after each one. Runs on its own thread: datapath operations are
    /// short syscalls and must not interleave.
    ///
    /// Work that only matters once a burst is over (the pods checkpoint, the
    /// state report) is done when the queue is empty, so a burst of pod-ups
    /// pays for it once.
    ///
    /// A big table is written a slice per turn, between events (see
    /// `background`): an event waits at most one slice behind it. So is
    /// an interface promoted from filters to links, once the node is quiet
    /// (see `promote`).
    pub fn run(mut self, mut events: mpsc::Receiver<Event>, state: watch::Sender<NodeState>) {
        // Only to wait for an event with a deadline (the next promotion).
        let timer = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::warn!(
                    "no timer for promotions ({e}); interfaces are promoted on later events"
                );
                None
            }
        };
        loop {
            if self.background.has_writes() {
                let event = match events.try_recv() {
                    Ok(e) => Some(e),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => None,
                };
                self.busy(true);
                if let Some(e) = event {
                    self.handle(e);
                }
                self.write_slice();
                self.busy(false);
                continue;
            }
            let event = match events.try_recv() {
                Ok(e) => e,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    self.flush();
                    let now = self.node_state();
                    state.send_if_modified(|old| {
                        if *old != now {
                            *old = now;
                            true
                        } else {
                            false
                        }
                    });
                    let due = self.promotion_due_in(std::time::Instant::now());
                    match (due, &timer) {
                        (Some(d), _) if d.is_zero() => {
                            self.busy(true);
                            self.promote_next();
                            self.busy(false);
                            continue;
                        }
                        (Some(d), Some(rt)) => {
                            match rt
                                .block_on(async { tokio::time::timeout(d, events.recv()).await })
                            {
                                Ok(Some(e)) => e,
                                Ok(None) => break,
                                // The promotion is due.
                                Err(_) => continue,
                            }
                        }
                        _ => match events.blocking_recv() {
                            Some(e) => e,
                            None => break,
                        },
                    }
                }
            };
            self.busy(true);
            self.handle(event);
            self.busy(false);
        }
        self.flush();
    }

    fn busy(&self, on: bool) {
        let now = if on {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_millis() as u64)
                .max(1)
        } else {
            0
        };
        self.ctx.busy_since.store(now, Ordering::Relaxed);
    }

    /// Writes what was deferred.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.pods.unsaved) {
            if let Some(cp) = &self.ctx.checkpoint {
                if let Err(e) = cp.save_pods(&self.pods.runtime) {
                    self.health.warn(format!("checkpoint: {e}"));
                }
            }
        }
    }

    pub fn handle(&mut self, event: Event) {
        match event {
            Event::Plan(msg, reply) => {
                let r = self.apply_plan(msg);
                let _ = reply.send(r);
            }
            Event::PlanConnected(c) => {
                self.plan.connected = c;
                if c {
                    self.plan.stream_error.clear();
                }
            }
            Event::PlanStreamError(e) => self.plan.stream_error = e,
            Event::PodUp(up, reply) => {
                self.pod_event();
                self.pod_up(up, reply);
            }
            Event::PodUpDeadline { pod, container_id } => self.pod_up_deadline(&pod, &container_id),
            Event::PodPlanFetched { pod, policy } => self.pod_plan_fetched(pod, policy),
            Event::PodDown {
                pod,
                container_id,
                reply,
            } => {
                self.pod_event();
                let _ = reply.send(self.pod_down(pod, &container_id));
            }
            Event::PodCheck {
                pod,
                container_id,
                reply,
            } => {
                let _ = reply.send(self.pod_check(&pod, &container_id));
            }
            Event::Dump(reply) => {
                let _ = reply.send(self.dump());
            }
            Event::PromoteAll(reply) => {
                let _ = reply.send(self.promote_all());
            }
            Event::ConntrackCleaned(r) => self.health.conntrack.record(r),
            Event::Compiled {
                key,
                generation,
                result,
            } => self.compiled_off_thread(key, generation, result),
            Event::Links => {
                self.ctx.link_event_queued.taken();
                // Address events come this way too.
                if self.refresh_node_addresses() {
                    self.forget_compiled();
                    if !self.links_changed() {
                        self.converge();
                    }
                } else {
                    self.links_changed();
                }
            }
            Event::Tick => {
                let addresses = self.refresh_node_addresses();
                if addresses {
                    self.forget_compiled();
                }
                // Failed operations are retried until they succeed.
                let retry = self.health.has_failures() || self.audit.retry;
                if !self.links_changed() && (addresses || retry) {
                    self.converge();
                }
            }
        }
    }
}

/// Converts request prefixes, naming the bad one.
pub fn prefixes(list: &[palisade_proto::v1::IpPrefix]) -> Result<Vec<Prefix>, String> {
    list.iter()
        .map(|p| Prefix::from_wire(p).map_err(|e| format!("pod IP: {e}")))
        .collect()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fail_closed_tests;

#[cfg(test)]
mod audit_tests;

#[cfg(test)]
mod background_tests;
