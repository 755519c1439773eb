//! The one owner of the node's datapath (DESIGN invariant 1). Every input —
//! plan snapshots and deltas, CNI pod up/down, interface events, pod-up
//! deadlines, debug dumps — arrives here as an [`Event`] on one channel and
//! is handled in order on one thread. Each step updates the inputs, then
//! recomputes the desired datapath and applies the difference (`converge`,
//! invariant 2), adding new tables before pointing interfaces at them and
//! removing tables only once nothing references them (invariants 4 and 5).
//!
//! - `plan`: snapshots and deltas from the controller, and on-demand pod plans.
//! - `pods`: pod up/down/check, the pod-up wait and its deadline.
//! - `converge`: desired → datapath, table sharing and refcounts.
//! - `recover`: taking over what a previous process left, rebuilding from the
//!   kernel what a damaged checkpoint lost.
//! - `dump`: the state operators see.

mod audit;
mod background;
mod converge;
mod dump;
mod in_place;
mod plan;
mod pods;
mod promote;
mod recover;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use palisade_proto::v1::{NodeState, PlanDelta, PlanSnapshot, PodPolicy, PodRef, PodState};
use tokio::sync::{mpsc, oneshot, watch};

use crate::checkpoint::Checkpoint;
use crate::compile::{PolicySet, PortSet, Prefix};
use crate::datapath::{Datapath, EndpointEntry, PolicyId, PortSetId};
use crate::desired::{Mode, Owner, PodKey, PodRuntime, Verdict};

pub use background::{peers, slices, BACKGROUND_PEERS, SLICE_ENTRIES};
pub use dump::{ConntrackDump, Dump, InterfaceDump, PolicySetDump};
pub use promote::{MAX_WAIT as PROMOTE_MAX_WAIT, QUIET as PROMOTE_QUIET};

/// The policy id an endpoint gets when its policy could not be written: no
/// table entry ever has it, so every lookup misses and the pod is denied
/// rather than left open. Never allocated to a table.
pub const DENY_ALL: PolicyId = u32::MAX;

/// How many warnings the dump keeps (oldest dropped first).
const MAX_WARNINGS: usize = 32;

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
}

#[derive(Clone, Debug)]
pub struct PodUp {
    pub pod: PodKey,
    pub runtime: PodRuntime,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodUpOutcome {
    pub plan_version: u64,
    pub ingress_isolated: bool,
    pub egress_isolated: bool,
    /// False: the deadline passed before the policy was known (standard mode).
    pub realized: bool,
    pub warning: String,
}

pub type PodUpReply = oneshot::Sender<Result<PodUpOutcome, String>>;

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
        /// Boxed: a pod's policy is most of an event's size otherwise.
        policy: Option<Box<PodPolicy>>,
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

struct RealizedPolicy {
    id: PolicyId,
    entries: Vec<(Prefix, PortSetId)>,
}

#[derive(Clone)]
struct RealizedEndpoint {
    ifindex: u32,
    owner: Owner,
    ingress: Verdict,
    egress: Verdict,
    entry: EndpointEntry,
}

impl RealizedEndpoint {
    fn enforced(&self) -> crate::desired::Enforced {
        (
            self.ingress.clone(),
            self.egress.clone(),
            self.entry.pod_addrs.clone(),
        )
    }
}

/// What is in the datapath now, as this process wrote or adopted it.
#[derive(Default)]
struct Realized {
    portsets: BTreeMap<PortSet, PortSetId>,
    policies: BTreeMap<Arc<PolicySet>, RealizedPolicy>,
    endpoints: BTreeMap<String, RealizedEndpoint>,
    next_portset: PortSetId,
    next_policy: PolicyId,
    /// Adopted tables whose content duplicates another's; removed once no
    /// endpoint points at them.
    garbage_policies: Vec<(PolicyId, Vec<(Prefix, PortSetId)>)>,
    garbage_portsets: Vec<(PortSetId, PortSet)>,
    /// Endpoints whose table was narrowed in place and whose epoch renewal
    /// failed, by interface: retried until done.
    owed_renewals: BTreeMap<String, in_place::OwedRenewal>,
    /// Staged (audit) entries written, by interface; their tables are
    /// referenced like enforced ones.
    audit: BTreeMap<String, audit::RealizedAudit>,
}

impl Realized {
    /// A policy id no live table has, never 0 (not isolated) nor
    /// [`DENY_ALL`], even after the counter wraps.
    fn alloc_policy(&mut self) -> Result<PolicyId, String> {
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
    fn alloc_policy_besides(&mut self, busy: &[PolicyId]) -> Result<PolicyId, String> {
        for _ in 0..=busy.len() {
            let id = self.alloc_policy()?;
            if !busy.contains(&id) {
                return Ok(id);
            }
        }
        Err("no free policy id".into())
    }

    fn alloc_portset(&mut self) -> Result<PortSetId, String> {
        let used: BTreeSet<PortSetId> = self
            .portsets
            .values()
            .copied()
            .chain(self.garbage_portsets.iter().map(|(id, _)| *id))
            .collect();
        for _ in 0..=used.len() + 1 {
            self.next_portset = self.next_portset.wrapping_add(1);
            let id = self.next_portset;
            if id != 0 && !used.contains(&id) {
                return Ok(id);
            }
        }
        Err("no free port set id".into())
    }
}

struct PendingUp {
    container_id: String,
    reply: PodUpReply,
}

pub struct Reconciler<D: Datapath> {
    node: String,
    enforcer_id: String,
    mode: Mode,
    /// The controller's plan for this node; meaningful once `has_plan`.
    plan: BTreeMap<PodKey, PodPolicy>,
    plan_version: u64,
    /// The highest controller leadership term applied (0: none, or a
    /// controller without leader election); plans of lower terms are refused.
    term: u64,
    has_plan: bool,
    plan_connected: bool,
    plan_stream_error: String,
    /// Pod entries fetched on demand for pods the stream has not delivered;
    /// dropped as soon as the stream's plan lists the pod.
    fetched: BTreeMap<PodKey, PodPolicy>,
    pods: BTreeMap<PodKey, PodRuntime>,
    pending: BTreeMap<PodKey, PendingUp>,
    /// Standard-mode pods whose deadline passed with their policy unknown.
    unprotected: BTreeSet<PodKey>,
    /// Pods an NPBackend DeletePodNp named while their interface still
    /// lives: forgotten when it goes (the request cannot tell an old pod
    /// from a new one of the same name).
    deleting: BTreeSet<PodKey>,
    realized: Realized,
    /// The desired datapath as last computed; pods are recomputed when
    /// their inputs change, everything when shared inputs do.
    want: crate::desired::Desired,
    /// Pods whose datapath writes failed in the last convergence (a refused
    /// pod-up), as opposed to pods merely denied or held.
    failures: BTreeMap<PodKey, String>,
    /// The staged (audit) tables each interface wants, recomputed on every
    /// convergence (few pods have any).
    want_audit: BTreeMap<String, audit::AuditWant>,
    /// Why a pod (or an interface) is not audited as its plan says, by
    /// "namespace/name" (or interface name); never affects enforcement.
    audit_errors: BTreeMap<String, String>,
    /// A staged (audit) entry could not be written or removed: retried on
    /// ticks like failed enforcement writes (compile errors are not).
    audit_retry: bool,
    /// Interface indexes as last read (link events and ticks refresh them).
    ifindexes: BTreeMap<String, u32>,
    /// Compiled policies by the encoded direction policy; cleared when the
    /// node's addresses change (they are part of every compiled table).
    compiled: std::collections::HashMap<Vec<u8>, Result<Arc<PolicySet>, String>>,
    /// The pods checkpoint is behind; written when the event queue is idle
    /// (a lost write is rebuilt from the kernel's endpoint entries).
    pods_dirty: bool,
    /// Operations that failed in the last convergence.
    errors: Vec<String>,
    /// Things an operator must see that outlive one convergence.
    warnings: VecDeque<String>,
    realized_version: u64,
    node_addresses: Vec<Prefix>,
    checkpoint: Option<Checkpoint>,
    fetch: Option<mpsc::UnboundedSender<PodKey>>,
    conntrack: dump::ConntrackDump,
    links_pending: crate::links::Pending,
    /// Edit a table in place when that is safe (see `in_place`); off: every
    /// content change gets a new table, as before.
    in_place_edits: bool,
    /// Big policies compiled off this thread and written in slices.
    background: background::Background,
    /// Fast-attached interfaces' way to links (see `promote`).
    promotion: promote::Promotion,
    /// When the event being handled began (ms since the Unix epoch; 0:
    /// idle), for the stall watchdog (`crate::stall`).
    busy_since: Arc<std::sync::atomic::AtomicU64>,
    pub datapath: D,
}

impl<D: Datapath> Reconciler<D> {
    pub fn new(node: String, enforcer_id: String, datapath: D) -> Self {
        Reconciler {
            node,
            enforcer_id,
            mode: Mode::Standard,
            plan: BTreeMap::new(),
            plan_version: 0,
            term: 0,
            has_plan: false,
            plan_connected: false,
            plan_stream_error: String::new(),
            fetched: BTreeMap::new(),
            pods: BTreeMap::new(),
            pending: BTreeMap::new(),
            unprotected: BTreeSet::new(),
            deleting: BTreeSet::new(),
            realized: Realized::default(),
            want: Default::default(),
            failures: BTreeMap::new(),
            want_audit: BTreeMap::new(),
            audit_errors: BTreeMap::new(),
            audit_retry: false,
            ifindexes: BTreeMap::new(),
            compiled: Default::default(),
            pods_dirty: false,
            errors: Vec::new(),
            warnings: VecDeque::new(),
            realized_version: 0,
            node_addresses: Vec::new(),
            checkpoint: None,
            fetch: None,
            conntrack: Default::default(),
            links_pending: Default::default(),
            in_place_edits: true,
            background: Default::default(),
            promotion: Default::default(),
            busy_since: Default::default(),
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
    pub fn busy_since(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.busy_since.clone()
    }

    /// A policy id for a new table: none a table has or is being written to.
    fn alloc_policy(&mut self) -> Result<PolicyId, String> {
        let busy: Vec<PolicyId> = self.background.ids().collect();
        self.realized.alloc_policy_besides(&busy)
    }

    /// Forgets every compiled table (the node's addresses are in each).
    fn forget_compiled(&mut self) {
        self.compiled.clear();
        self.background.forget();
    }

    /// Saves the inputs after every change, so a restart can recover them.
    pub fn with_checkpoint(mut self, checkpoint: Checkpoint) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether changed content may be written into the table it replaces
    /// (on by default; off measures or avoids the new-id path).
    pub fn with_in_place_edits(mut self, on: bool) -> Self {
        self.in_place_edits = on;
        self
    }

    /// Shares the "a link event is queued" flag with the link watcher.
    pub fn with_link_events(mut self, pending: crate::links::Pending) -> Self {
        self.links_pending = pending;
        self
    }

    /// Where to ask for one pod's plan when a pod comes up before the stream
    /// has delivered it.
    pub fn with_fetcher(mut self, fetch: mpsc::UnboundedSender<PodKey>) -> Self {
        self.fetch = Some(fetch);
        self
    }

    fn warn(&mut self, w: String) {
        tracing::warn!("{w}");
        if self.warnings.len() == MAX_WARNINGS {
            self.warnings.pop_front();
        }
        self.warnings.push_back(w);
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
        self.busy_since
            .store(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Writes what was deferred.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.pods_dirty) {
            if let Some(cp) = &self.checkpoint {
                if let Err(e) = cp.save_pods(&self.pods) {
                    self.warn(format!("checkpoint: {e}"));
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
                self.plan_connected = c;
                if c {
                    self.plan_stream_error.clear();
                }
            }
            Event::PlanStreamError(e) => self.plan_stream_error = e,
            Event::PodUp(up, reply) => {
                self.pod_event();
                self.pod_up(up, reply);
            }
            Event::PodUpDeadline { pod, container_id } => self.pod_up_deadline(&pod, &container_id),
            Event::PodPlanFetched { pod, policy } => self.pod_plan_fetched(pod, policy.map(|p| *p)),
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
            Event::ConntrackCleaned(r) => self.conntrack.record(r),
            Event::Compiled {
                key,
                generation,
                result,
            } => self.compiled_off_thread(key, generation, result),
            Event::Links => {
                self.links_pending.taken();
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
                let retry =
                    !self.errors.is_empty() || !self.failures.is_empty() || self.audit_retry;
                if !self.links_changed() && (addresses || retry) {
                    self.converge();
                }
            }
        }
    }

    fn save_plan(&mut self) {
        if let Some(cp) = &self.checkpoint {
            if let Err(e) = cp.save_plan(self.plan_version, self.term, &self.plan) {
                self.warn(format!("checkpoint: {e}"));
            }
        }
    }

    fn save_pods(&mut self) {
        self.pods_dirty = true;
    }

    /// Reads the node's addresses; true when they changed.
    fn refresh_node_addresses(&mut self) -> bool {
        match self.datapath.node_addresses() {
            Ok(addrs) => {
                let mut prefixes: Vec<Prefix> = addrs
                    .into_iter()
                    .map(|ip| Prefix::from_ip(ip, if ip.is_ipv4() { 32 } else { 128 }))
                    .collect();
                prefixes.sort();
                prefixes.dedup();
                let changed = prefixes != self.node_addresses;
                self.node_addresses = prefixes;
                changed
            }
            Err(e) => {
                // Keep the last known addresses: forgetting them would cut
                // the node off from its pods.
                tracing::warn!("{e}");
                false
            }
        }
    }
}

fn key(r: Option<&PodRef>) -> Option<PodKey> {
    r.map(palisade_proto::plan::pod_key)
}

/// Checks a pod-up request before it can touch anything.
fn validate_pod(up: &PodUp) -> Result<(), String> {
    let (ns, name) = &up.pod;
    if ns.is_empty() || name.is_empty() {
        return Err("pod namespace and name are required".into());
    }
    if up.runtime.host_interfaces.is_empty() {
        return Err(format!("pod {ns}/{name}: no host interface given"));
    }
    if up.runtime.ips.len() > crate::datapath::MAX_POD_ADDRS {
        return Err(format!(
            "pod {ns}/{name}: {} addresses, more than the {} a pod may have",
            up.runtime.ips.len(),
            crate::datapath::MAX_POD_ADDRS
        ));
    }
    for i in &up.runtime.host_interfaces {
        if i.is_empty() || i.len() > 15 || i.contains(['/', ' ', '\0']) || i == "." || i == ".." {
            return Err(format!(
                "pod {ns}/{name}: {i:?} is not a valid interface name"
            ));
        }
    }
    Ok(())
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
