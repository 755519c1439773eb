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
#[cfg(test)]
mod fixtures;
mod in_place;
pub mod names;
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
pub use recover::RecoverError;

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
    /// Shutdown: promote every fast-attached interface now and write the
    /// pods checkpoint; answered, once it is on disk (or failed), with how
    /// many interfaces are left on filters.
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
    /// The pods file's writer (see `crate::pods_saver`).
    pods_saver: Option<crate::pods_saver::PodsSaver>,
    /// Where to ask for one pod's plan (see `plan`).
    fetch: Option<mpsc::UnboundedSender<PodKey>>,
    /// Shared with the link watcher: set while an [`Event::Links`] is queued.
    link_event_queued: crate::links::Pending,
    /// When the event being handled began (`crate::stall::now_ms`; 0:
    /// idle), for the stall watchdog (`crate::stall`).
    busy_since: Arc<AtomicU64>,
}

/// The node's one reconciler: each part is kept by the file of its name.
pub struct Reconciler<D: Datapath> {
    ctx: Context,
    /// The controller's plan for this node.
    plan: plan::Plan,
    /// The pods the CNI plugin reported, and their pod-ups waiting.
    pods: pods::Pods,
    /// The desired datapath and the node-wide inputs it is computed from.
    target: converge::Target,
    /// What is in the datapath now.
    realized: realized::Realized,
    /// Staged (audit) policies wanted, and why some are not audited.
    audit: audit::Audit,
    /// Pods that learn by domain name, as the learner was told.
    names: names::Names,
    /// Big policies compiled off this thread and written in slices.
    background: background::Background,
    /// Fast-attached interfaces' way to links (see `promote`).
    promotion: promote::Promotion,
    /// What went wrong, as operators see it.
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
                pods_saver: None,
                fetch: None,
                link_event_queued: Default::default(),
                busy_since: Default::default(),
            },
            plan: Default::default(),
            pods: Default::default(),
            target: Default::default(),
            realized: Default::default(),
            audit: Default::default(),
            names: Default::default(),
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
        self.ctx.pods_saver = Some(crate::pods_saver::PodsSaver::start(checkpoint.clone()));
        self.ctx.checkpoint = Some(checkpoint);
        self
    }

    /// Tells `learner` which interfaces learn by domain name, with their
    /// egress policy, and flags their endpoints (see `names`).
    pub fn with_learner(mut self, learner: mpsc::UnboundedSender<names::PodUpdate>) -> Self {
        self.names.tx = Some(learner);
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
    /// pays for it once; the checkpoint is written by its own thread.
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
                    self.flush_behind();
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
        // The watchdog's monotonic clock; 0 means idle, so never store it.
        let now = if on { crate::stall::now_ms().max(1) } else { 0 };
        self.ctx.busy_since.store(now, Ordering::Relaxed);
    }

    /// Writes what was deferred, and waits until it is on disk.
    pub fn flush(&mut self) {
        self.flush_behind();
        if let Some(saver) = &self.ctx.pods_saver {
            saver.wait();
        }
        self.report_checkpoint_error();
    }

    /// Hands what was deferred to the checkpoint's writer, without waiting
    /// for the disk (a burst's pod-ups do not queue behind an fsync).
    fn flush_behind(&mut self) {
        self.report_checkpoint_error();
        if !std::mem::take(&mut self.pods.unsaved) {
            return;
        }
        match (&self.ctx.pods_saver, &self.ctx.checkpoint) {
            (Some(saver), _) if saver.running() => saver.submit(self.pods.runtime.clone()),
            (_, Some(cp)) => {
                if let Err(e) = cp.save_pods(&self.pods.runtime) {
                    self.health.warn(format!("checkpoint: {e}"));
                }
            }
            _ => {}
        }
    }

    fn report_checkpoint_error(&mut self) {
        if let Some(e) = self.ctx.pods_saver.as_ref().and_then(|s| s.take_error()) {
            self.health.warn(format!("checkpoint: {e}"));
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
                let left = self.promote_all();
                // The process exits on the answer, without waiting for this
                // thread: a pod-up answered just before must be on disk.
                self.flush();
                let _ = reply.send(left);
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
                if self.plan.save_error.is_some() {
                    self.save_plan();
                }
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
mod tests {
    use super::fixtures::{pod_up as up, snapshot, warnings_with};
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::datapath::fake::FakeDatapath;
    use crate::datapath::EndpointEntry;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule};
    use palisade_proto::v1::{PlanDelta, PodRef};
    use std::collections::BTreeSet;

    fn ip4(a: [u8; 4], len: u32) -> IpPrefix {
        IpPrefix {
            addr: a.to_vec(),
            prefix_len: len,
        }
    }

    fn allow_from(peer: [u8; 4], port: u32) -> DirectionPolicy {
        DirectionPolicy {
            rules: vec![Rule {
                peers: vec![PeerBlock {
                    cidr: Some(ip4(peer, 32)),
                    except: vec![],
                }],
                ports: vec![PortRange {
                    protocol: Protocol::Tcp as i32,
                    port,
                    end_port: 0,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn pod_policy(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            pod_ips: vec![],
            ingress,
            egress: None,
            policies: vec!["x/p".into()],
            ..Default::default()
        }
    }

    /// Pod up that must be answered at once (its policy is known).
    fn up_now(r: &mut Reconciler<FakeDatapath>, u: PodUp) -> Result<PodUpOutcome, String> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        r.pod_up(u, tx);
        rx.try_recv().expect("pod up answered at once")
    }

    /// A plan entry for a pod no policy selects.
    fn unselected(name: &str) -> PodPolicy {
        PodPolicy {
            policies: vec![],
            ..pod_policy(name, None)
        }
    }

    fn reconciler() -> Reconciler<FakeDatapath> {
        Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a", "veth-b", "veth-c", "veth-d"]),
        )
    }

    /// The watchdog compares `busy_since` with its own clock: both must be
    /// the monotonic one, or a wall-clock step reads as a stall or hides one.
    #[test]
    fn busy_since_is_on_the_watchdogs_clock() {
        let r = reconciler();
        r.busy(true);
        let since = r.busy_since().load(Ordering::Relaxed);
        let now = crate::stall::now_ms();
        assert!(since >= 1 && since <= now.max(1), "{since} vs {now}");
        r.busy(false);
        assert_eq!(r.busy_since().load(Ordering::Relaxed), 0);
    }

    #[test]
    fn unselected_pod_is_attached_and_open() {
        let mut r = reconciler();
        r.apply_plan(snapshot(1, vec![unselected("a")])).unwrap();
        let out = up_now(&mut r, up("a", "veth-a")).unwrap();
        assert!(!out.ingress_isolated);
        assert!(r.datapath.attached.contains("veth-a"));
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
        r.datapath.assert_no_violations();
    }

    #[test]
    fn replicas_with_equal_policy_share_one_table_until_the_last_goes() {
        let mut r = reconciler();
        r.apply_plan(snapshot(
            1,
            vec![
                pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
                pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
            ],
        ))
        .unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        up_now(&mut r, up("b", "veth-b")).unwrap();
        let (ia, _) = r.datapath.endpoint_of("veth-a").unwrap();
        let (ib, _) = r.datapath.endpoint_of("veth-b").unwrap();
        assert_eq!(ia, ib, "same content, same table");
        assert_eq!(r.datapath.policies.len(), 1);
        // Seed 000/001: deleting one replica must not take the table from the other.
        r.pod_down(Some(("x".into(), "a".into())), "c-a").unwrap();
        assert_eq!(r.datapath.policies.len(), 1);
        assert_eq!(r.datapath.endpoint_of("veth-b"), Some((ib, 0)));
        r.pod_down(None, "c-b").unwrap();
        r.datapath.assert_empty();
        r.datapath.assert_no_violations();
    }

    /// The new-id path (in-place edits, which would take these host-only
    /// changes, are tested in `in_place`).
    #[test]
    fn policy_change_is_make_before_break() {
        let mut r = reconciler().with_in_place_edits(false);
        r.apply_plan(snapshot(0, vec![unselected("a")])).unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        for (v, port) in [(1, 80), (2, 81), (3, 82)] {
            r.apply_plan(snapshot(
                v,
                vec![pod_policy("a", Some(allow_from([10, 0, 0, 9], port)))],
            ))
            .unwrap();
        }
        assert_eq!(r.datapath.policies.len(), 1, "old tables removed");
        // Every step in the log was checked by the fake: no endpoint ever pointed
        // at a missing table, no program ran without its entry.
        r.datapath.assert_no_violations();
        let log = r.datapath.log.join("\n");
        let add = log.find("add_policy 3").unwrap();
        let switch = log.find("set_endpoint 10 3 0").unwrap();
        let remove = log.find("remove_policy 2").unwrap();
        assert!(add < switch && switch < remove, "{log}");
    }

    #[test]
    fn delete_of_an_old_sandbox_keeps_the_new_one() {
        let mut r = reconciler();
        r.apply_plan(snapshot(1, vec![unselected("a")])).unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        let mut again = up("a", "veth-b");
        again.runtime.container_id = "c-a2".into();
        up_now(&mut r, again).unwrap();
        r.pod_down(Some(("x".into(), "a".into())), "c-a").unwrap();
        assert!(r.datapath.attached.contains("veth-b"));
        assert!(!r.datapath.attached.contains("veth-a"));
    }

    #[test]
    fn an_interface_reused_by_a_new_pod_belongs_to_it() {
        let mut r = reconciler();
        r.apply_plan(snapshot(
            1,
            vec![pod_policy("a", Some(allow_from([10, 0, 0, 9], 80)))],
        ))
        .unwrap();
        r.apply_plan(snapshot(
            2,
            vec![
                pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
                unselected("b"),
            ],
        ))
        .unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        // x/a's DEL never came; its veth was deleted and a new one with the same
        // name (a new index) belongs to x/b, unselected.
        r.datapath.interfaces.insert("veth-a".into(), 20);
        up_now(&mut r, up("b", "veth-a")).unwrap();
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
        let pods: Vec<String> = r
            .node_state()
            .pods
            .iter()
            .map(|p| p.pod.as_ref().unwrap().name.clone())
            .collect();
        assert_eq!(pods, vec!["b"]);
        assert!(r.datapath.policies.is_empty());
        r.datapath.assert_no_violations();
    }

    #[test]
    fn failed_attach_leaves_nothing_behind_and_names_the_interface() {
        let mut r = reconciler();
        r.datapath.fail_attach.insert("veth-a".into());
        let err = up_now(&mut r, up("a", "veth-a")).unwrap_err();
        assert!(err.contains("veth-a"), "{err}");
        assert!(r.datapath.endpoints.is_empty());
        assert!(r.node_state().pods.is_empty());
        let err = up_now(&mut r, up("b", "nope")).unwrap_err();
        assert!(err.contains("\"nope\" does not exist"), "{err}");
    }

    #[test]
    fn invalid_requests_are_refused_before_touching_anything() {
        let mut r = reconciler();
        let mut bad = up("a", "veth-a");
        bad.runtime.host_interfaces = vec!["../../etc".into()];
        assert!(up_now(&mut r, bad)
            .unwrap_err()
            .contains("not a valid interface name"));
        let mut bad = up("a", "veth-a");
        bad.runtime.host_interfaces.clear();
        assert!(up_now(&mut r, bad)
            .unwrap_err()
            .contains("no host interface"));
        assert!(r.datapath.log.is_empty());
    }

    #[test]
    fn uncompilable_policy_denies_instead_of_opening() {
        let mut r = reconciler();
        let broken = DirectionPolicy {
            rules: vec![Rule {
                peers: vec![PeerBlock {
                    cidr: Some(IpPrefix {
                        addr: vec![1, 2, 3],
                        prefix_len: 8,
                    }),
                    except: vec![],
                }],
                ports: vec![],
                ..Default::default()
            }],
            ..Default::default()
        };
        r.apply_plan(snapshot(1, vec![pod_policy("a", Some(broken))]))
            .unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        // Denied (only the node may reach it), never opened, and visibly so.
        let (ingress, egress) = r.datapath.endpoint_of("veth-a").unwrap();
        assert_ne!(ingress, 0);
        assert_eq!(egress, 0);
        assert!(r.datapath.policies[&ingress].is_empty(), "deny-all table");
        let err = &r.node_state().pods[0].error;
        assert!(err.contains("ingress policy of x/a"), "{err}");
    }

    #[test]
    fn deltas_must_follow_the_version_held() {
        let mut r = reconciler();
        let d = PlanDelta {
            term: 0,
            base_version: 5,
            version: 6,
            upserted: vec![],
            removed: vec![],
            ..Default::default()
        };
        assert!(matches!(
            r.apply_plan(PlanMessage::Delta(d.clone())),
            Err(PlanError::OutOfSequence { .. })
        ));
        r.apply_plan(snapshot(5, vec![])).unwrap();
        assert_eq!(r.apply_plan(PlanMessage::Delta(d)).unwrap(), 6);
        assert_eq!(r.node_state().realized_version, 6);
    }

    /// Invariant 2: any order of the same inputs gives the same datapath.
    #[test]
    fn end_state_does_not_depend_on_event_order() {
        let plan = || {
            snapshot(
                1,
                vec![
                    pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
                    pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
                    pod_policy("c", Some(allow_from([10, 0, 0, 8], 443))),
                ],
            )
        };
        #[derive(Clone, Copy, Debug)]
        enum E {
            Plan,
            Up(&'static str, &'static str),
            Down(&'static str),
        }
        let events = [
            E::Plan,
            E::Up("a", "veth-a"),
            E::Up("b", "veth-b"),
            E::Up("c", "veth-c"),
            E::Down("a"),
        ];
        let mut results = BTreeSet::new();
        // Every permutation where a pod's Down follows its Up.
        let mut idx: Vec<usize> = (0..events.len()).collect();
        permute(&mut idx, 0, &mut |order| {
            let pos = |i| order.iter().position(|x| *x == i).unwrap();
            if pos(4) < pos(1) {
                return;
            }
            let mut r = reconciler();
            for &i in order {
                match events[i] {
                    E::Plan => {
                        r.apply_plan(plan()).unwrap();
                    }
                    E::Up(n, i) => {
                        // Before the plan, the answer waits; the end state may not.
                        let (tx, _rx) = tokio::sync::oneshot::channel();
                        r.pod_up(up(n, i), tx);
                    }
                    E::Down(n) => r
                        .pod_down(Some(("x".into(), n.into())), &format!("c-{n}"))
                        .unwrap(),
                }
            }
            assert!(
                r.datapath.violations.is_empty(),
                "{order:?}: {:?}",
                r.datapath.violations
            );
            let shape = (
                r.datapath.attached.clone(),
                r.datapath.policies.len(),
                r.datapath.portsets.len(),
                r.datapath.endpoint_of("veth-b").unwrap()
                    == r.datapath.endpoint_of("veth-b").unwrap(),
                r.datapath.endpoint_of("veth-b").unwrap().0
                    != r.datapath.endpoint_of("veth-c").unwrap().0,
            );
            results.insert(format!("{shape:?}"));
        });
        assert_eq!(results.len(), 1, "{results:?}");
    }

    fn permute(v: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
        if k == v.len() {
            f(v);
            return;
        }
        for i in k..v.len() {
            v.swap(k, i);
            permute(v, k + 1, f);
            v.swap(k, i);
        }
    }

    /// A reconciler saving to `dir`, its plan isolating pod a (allowed from
    /// 10.0.0.9 on TCP 80) and selecting no policy for pod b.
    fn checkpointed(dir: &std::path::Path) -> Reconciler<FakeDatapath> {
        let mut r = reconciler().with_checkpoint(Checkpoint::open(dir).unwrap());
        r.apply_plan(snapshot(
            1,
            vec![
                pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
                unselected("b"),
            ],
        ))
        .unwrap();
        r
    }

    /// A restart: a new reconciler takes over the same datapath (the fake keeps
    /// the "kernel" state) from the checkpointed inputs.
    fn restart(
        old: &mut Reconciler<FakeDatapath>,
        dir: &std::path::Path,
    ) -> Reconciler<FakeDatapath> {
        old.flush();
        let datapath = std::mem::take(&mut old.datapath);
        let cp = Checkpoint::open(dir).unwrap();
        let saved = cp.load().unwrap();
        let mut r = Reconciler::new("n1".into(), "e2".into(), datapath).with_checkpoint(cp);
        r.datapath.log.clear();
        r.recover(saved).unwrap();
        r
    }

    /// SIGTERM: the process exits once PromoteAll is answered, so the
    /// answer must wait for the pods checkpoint of every pod-up before it.
    #[test]
    fn shutdown_is_answered_once_the_pods_are_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
        r.apply_plan(snapshot(1, vec![unselected("a")])).unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        r.handle(Event::PromoteAll(tx));
        assert_eq!(rx.try_recv(), Ok(0));
        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(
            saved.pods.keys().collect::<Vec<_>>(),
            vec![&("x".to_string(), "a".to_string())]
        );
    }

    /// The fail-open the reading guards against: a new process that cannot
    /// tell which interfaces exist (no socket: EMFILE, ENOMEM) took every
    /// interface for gone, forgot every pod, detached every endpoint and
    /// saved an empty pods file. It must stop before changing anything.
    #[test]
    fn a_failed_interface_reading_at_startup_detaches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = checkpointed(dir.path());
        up_now(&mut r, up("a", "veth-a")).unwrap();
        up_now(&mut r, up("b", "veth-b")).unwrap();
        r.flush();
        let kernel = |d: &FakeDatapath| {
            (
                d.endpoints.clone(),
                d.policies.clone(),
                d.portsets.clone(),
                d.attached.clone(),
            )
        };
        let before = kernel(&r.datapath);
        let pods_file = std::fs::read(dir.path().join("pods.json")).unwrap();

        let mut datapath = std::mem::take(&mut r.datapath);
        datapath.fail.insert("interfaces".into());
        datapath.log.clear();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut r2 =
            Reconciler::new("n1".into(), "e2".into(), datapath).with_checkpoint(cp.clone());
        let e = r2.recover(cp.load().unwrap()).unwrap_err();
        assert!(
            matches!(e, RecoverError::Interfaces { count: 2, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("injected failure")
                && e.to_string().contains("nothing was detached"),
            "{e}"
        );
        r2.flush();
        assert!(r2.datapath.log.is_empty(), "{:?}", r2.datapath.log);
        assert_eq!(kernel(&r2.datapath), before);
        assert_eq!(
            std::fs::read(dir.path().join("pods.json")).unwrap(),
            pods_file,
            "the pods checkpoint is left as it was"
        );

        // The next process, whose reading works, takes over unchanged.
        r2.datapath.fail.clear();
        let r3 = restart(&mut r2, dir.path());
        assert_eq!(kernel(&r3.datapath), before);
        assert_eq!(r3.node_state().pods.len(), 2);
        r3.datapath.assert_no_violations();
    }

    /// Issue: a restart found the pinned links by the name they were
    /// pinned by, so an interface renamed (`ip link set veth-a name
    /// veth-z`) before the enforcer restarted was taken for gone: its links
    /// were unpinned, which detached its programs, and its pod forgotten,
    /// while the interface lived on, unenforced.
    #[test]
    fn an_interface_renamed_while_no_enforcer_ran_stays_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = checkpointed(dir.path());
        up_now(&mut r, up("a", "veth-a")).unwrap();
        let enforced = r.datapath.endpoints[&10].clone();
        // Renamed, and a newer interface takes the old name meanwhile.
        r.datapath.interfaces.remove("veth-a");
        r.datapath.interfaces.insert("veth-z".into(), 10);
        r.datapath.interfaces.insert("veth-a".into(), 14);

        let mut r2 = restart(&mut r, dir.path());
        assert!(
            !r2.datapath.log.iter().any(|l| l.starts_with("detach")),
            "{:?}",
            r2.datapath.log
        );
        assert_eq!(r2.datapath.attached_at.get("veth-a"), Some(&10));
        assert_eq!(r2.datapath.endpoints.get(&10), Some(&enforced));
        assert!(!r2.datapath.endpoints.contains_key(&14));
        assert_eq!(r2.node_state().pods.len(), 1);
        r2.handle(Event::Links);
        r2.handle(Event::Tick);
        let warned = warnings_with(&r2, "veth-a (index 10) was renamed veth-z");
        assert_eq!(warned.len(), 1, "{warned:?}");
        // The newer interface of the name is not the renamed one's: its
        // pod-up waits for the old one to go rather than take its verdicts.
        let err = up_now(&mut r2, up("b", "veth-a")).unwrap_err();
        assert!(err.contains("veth-a"), "{err}");
        assert!(!r2.datapath.endpoints.contains_key(&14));

        // Still enforced after its DEL while it lives; gone with it.
        r2.pod_down(Some(("x".into(), "a".into())), "").unwrap();
        assert_eq!(r2.datapath.endpoints.get(&10), Some(&enforced));
        r2.datapath.interfaces.remove("veth-z");
        r2.handle(Event::Links);
        assert!(!r2.datapath.attached.contains("veth-a"));
        assert!(!r2.datapath.endpoints.contains_key(&10));
        r2.datapath.assert_no_violations();
    }

    /// The kernel would not say where veth-a's links are, and the name no
    /// longer resolves (renamed while down): its entry may be what those
    /// programs read, so it denies rather than goes (which would pass
    /// everything there) or keeps naming a table that may be reused.
    #[test]
    fn entries_no_readable_link_explains_deny_while_a_link_cannot_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = checkpointed(dir.path());
        up_now(&mut r, up("a", "veth-a")).unwrap();
        up_now(&mut r, up("b", "veth-b")).unwrap();
        let b = r.datapath.endpoints[&11].clone();
        let enforced = r.datapath.endpoints[&10].clone();
        r.datapath.interfaces.remove("veth-a");
        r.datapath.interfaces.insert("veth-z".into(), 10);
        r.datapath.unreadable.insert("veth-a".into());

        let mut r2 = restart(&mut r, dir.path());
        let deny = EndpointEntry {
            ingress: DENY_ALL,
            egress: DENY_ALL,
            pod_addrs: vec![],
        };
        assert_eq!(r2.datapath.endpoints.get(&10), Some(&deny));
        assert_eq!(r2.datapath.endpoints.get(&11), Some(&b));
        assert!(
            !r2.datapath
                .log
                .iter()
                .any(|l| l.starts_with("detach") || l.starts_with("remove_endpoint")),
            "{:?}",
            r2.datapath.log
        );
        let warned = warnings_with(
            &r2,
            "ifindexes [10] are on no link this enforcer could read",
        );
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("veth-a"), "{warned:?}");
        r2.handle(Event::Links);
        r2.handle(Event::Tick);
        assert_eq!(r2.datapath.endpoints.get(&10), Some(&deny));

        // Its pod is kept meanwhile, and once a restart reads the links the
        // renamed interface is followed as any other: its pod's policy
        // again, not the deny.
        assert_eq!(r2.node_state().pods.len(), 2);
        r2.datapath.unreadable.clear();
        let r3 = restart(&mut r2, dir.path());
        assert_eq!(r3.datapath.attached_at.get("veth-a"), Some(&10));
        assert_eq!(r3.datapath.endpoints.get(&10), Some(&enforced));
        r3.datapath.assert_no_violations();
    }

    #[test]
    fn restart_takes_over_without_touching_a_correct_datapath() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
        r.apply_plan(snapshot(
            4,
            vec![
                pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
                pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
                unselected("c"),
            ],
        ))
        .unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        up_now(&mut r, up("b", "veth-b")).unwrap();
        up_now(&mut r, up("c", "veth-c")).unwrap();
        let before = (
            r.datapath.endpoints.clone(),
            r.datapath.policies.clone(),
            r.datapath.portsets.clone(),
            r.datapath.attached.clone(),
        );
        let state_before = r.node_state();

        let mut r2 = restart(&mut r, dir.path());
        // Only the isolated directions' epochs move (the predecessor may have
        // died before renewing them after an in-place edit): one write each.
        let (a, b) = (
            r2.datapath.interfaces["veth-a"],
            r2.datapath.interfaces["veth-b"],
        );
        assert_eq!(
            r2.datapath.log,
            vec![
                format!("renew_epochs {a} true false"),
                format!("renew_epochs {b} true false")
            ],
            "no other operation needed"
        );
        let after = (
            r2.datapath.endpoints.clone(),
            r2.datapath.policies.clone(),
            r2.datapath.portsets.clone(),
            r2.datapath.attached.clone(),
        );
        assert_eq!(before, after);
        let state_after = r2.node_state();
        assert_eq!(state_after.realized_version, 4);
        assert_eq!(state_after.pods, state_before.pods);

        // The recovered reconciler keeps working: a new plan, shared tables,
        // make-before-break, no reuse of a live id.
        r2.apply_plan(snapshot(
            5,
            vec![
                pod_policy("a", Some(allow_from([10, 0, 0, 9], 443))),
                pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
                unselected("c"),
            ],
        ))
        .unwrap();
        let (ia, _) = r2.datapath.endpoint_of("veth-a").unwrap();
        let (ib, _) = r2.datapath.endpoint_of("veth-b").unwrap();
        assert_ne!(ia, ib);
        assert_eq!(r2.datapath.policies.len(), 2);
        r2.datapath.assert_no_violations();
    }

    #[test]
    fn restart_removes_vanished_pods_and_keeps_what_it_cannot_explain() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = checkpointed(dir.path());
        up_now(&mut r, up("a", "veth-a")).unwrap();
        up_now(&mut r, up("b", "veth-b")).unwrap();
        // While the enforcer is down: x/a's veth disappears; something left an
        // attachment no saved pod knows on a live interface (veth-d, index 13,
        // denied) and a stray table.
        r.datapath.interfaces.remove("veth-a");
        r.datapath.attached.insert("veth-d".into());
        r.datapath.endpoints.insert(
            13,
            EndpointEntry {
                ingress: DENY_ALL,
                egress: DENY_ALL,
                pod_addrs: vec![],
            },
        );
        r.datapath.policies.insert(77, vec![]);

        let mut r2 = restart(&mut r, dir.path());
        let names: Vec<String> = r2
            .node_state()
            .pods
            .iter()
            .map(|p| p.pod.as_ref().unwrap().name.clone())
            .collect();
        assert_eq!(names, vec!["b"]);
        // Detaching a live interface it cannot explain would open it: it keeps
        // its policy, and the state says why.
        assert_eq!(
            r2.datapath.attached,
            BTreeSet::from(["veth-b".to_string(), "veth-d".to_string()])
        );
        assert_eq!(
            r2.datapath.endpoint_of("veth-d"),
            Some((DENY_ALL, DENY_ALL))
        );
        assert!(r2
            .node_state()
            .errors
            .iter()
            .any(|e| e.contains("veth-d") && e.contains("no pod explains")));
        assert!(
            r2.datapath.policies.is_empty(),
            "{:?}",
            r2.datapath.policies
        );
        // Once it goes, it is cleaned up.
        r2.datapath.interfaces.remove("veth-d");
        r2.handle(Event::Links);
        assert_eq!(r2.datapath.attached, BTreeSet::from(["veth-b".to_string()]));
        assert_eq!(r2.datapath.endpoints.len(), 1);
        r2.datapath.assert_no_violations();
    }

    /// Seed of issue 5.7: a lost or damaged checkpoint never turns live links
    /// into orphans; the kernel's endpoint entries and the plan's pod addresses
    /// rebuild which pod owns which interface.
    #[test]
    fn a_lost_checkpoint_is_rebuilt_from_the_kernel_not_detached() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
        let mut a = pod_policy("a", Some(allow_from([10, 0, 0, 9], 80)));
        a.pod_ips = vec![ip4([10, 0, 1, 1], 32)];
        r.apply_plan(snapshot(1, vec![a.clone()])).unwrap();
        let mut u = up("a", "veth-a");
        u.runtime.ips = vec![Prefix::from_ip("10.0.1.1".parse().unwrap(), 32)];
        up_now(&mut r, u).unwrap();
        for damage in ["remove", "truncate"] {
            let before = r.datapath.endpoint_of("veth-a").unwrap();
            assert_ne!(before.0, 0);
            r.flush();
            for f in ["plan.pb", "pods.json"] {
                let p = dir.path().join(f);
                if damage == "remove" {
                    std::fs::remove_file(&p).unwrap();
                } else {
                    let b = std::fs::read(&p).unwrap();
                    std::fs::write(&p, &b[..b.len() / 2]).unwrap();
                }
            }
            let mut r2 = restart(&mut r, dir.path());
            // Nothing was detached or rewritten: the pod keeps its policy.
            assert_eq!(r2.datapath.endpoint_of("veth-a"), Some(before), "{damage}");
            assert!(r2.datapath.attached.contains("veth-a"));
            assert!(r2.dump().warnings.iter().any(|w| w.contains("damaged")) || damage == "remove");
            // The plan comes back; the pod is recognised by its address.
            r2.apply_plan(snapshot(2, vec![a.clone()])).unwrap();
            let state = r2.node_state();
            assert_eq!(state.pods.len(), 1, "{state:?}");
            assert_eq!(state.pods[0].error, "");
            assert_eq!(r2.datapath.endpoint_of("veth-a"), Some(before));
            r2.datapath.assert_no_violations();
            // A DEL cannot prove it is for this sandbox (the container id was
            // lost; it may be a late one for an older pod): enforced until the
            // veth goes, then forgotten.
            r2.pod_down(Some(("x".into(), "a".into())), "c-whatever")
                .unwrap();
            assert!(r2.datapath.attached.contains("veth-a"));
            assert_eq!(r2.datapath.endpoint_of("veth-a"), Some(before));
            r2.datapath.interfaces.remove("veth-a");
            r2.handle(Event::Links);
            assert!(!r2.datapath.attached.contains("veth-a"));
            assert!(r2.node_state().pods.is_empty());
            r2.datapath.interfaces.insert("veth-a".into(), 10);
            r = r2;
            up_now(&mut r, {
                let mut u = up("a", "veth-a");
                u.runtime.ips = vec![Prefix::from_ip("10.0.1.1".parse().unwrap(), 32)];
                u
            })
            .unwrap();
        }
    }

    #[test]
    fn node_addresses_are_always_allowed_and_followed_on_tick() {
        let mut r = reconciler();
        r.datapath.node_addresses = vec!["10.1.0.1".parse().unwrap()];
        r.apply_plan(snapshot(
            1,
            vec![pod_policy(
                "a",
                Some(DirectionPolicy {
                    rules: vec![],
                    ..Default::default()
                }),
            )],
        ))
        .unwrap();
        up_now(&mut r, up("a", "veth-a")).unwrap();
        let node = |s: &str| Prefix::from_ip(s.parse().unwrap(), 32);
        let entries = |r: &Reconciler<FakeDatapath>| {
            let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
            r.datapath.policies[&id]
                .iter()
                .map(|(p, _)| *p)
                .collect::<Vec<_>>()
        };
        assert_eq!(entries(&r), vec![node("10.1.0.1")]);

        // Nothing changed: a tick touches nothing.
        let ops = r.datapath.log.len();
        r.handle(Event::Tick);
        assert_eq!(r.datapath.log.len(), ops);

        // The node gains an address (a new gateway, say): the next tick
        // follows, make-before-break.
        r.datapath.node_addresses.push("10.1.0.2".parse().unwrap());
        r.handle(Event::Tick);
        assert_eq!(entries(&r), vec![node("10.1.0.1"), node("10.1.0.2")]);
        assert_eq!(r.datapath.policies.len(), 1);
        r.datapath.assert_no_violations();
    }

    mod fail_closed {
        //! One test per fail-open path the enforcer once had: each drives the
        //! reconciler the way the bug was reproduced and checks the verdict the
        //! datapath would give (the endpoint entry), not just an error string.

        use super::super::fixtures::snapshot_of as snapshot;
        use super::super::realized::Realized;
        use super::super::*;
        use crate::datapath::fake::FakeDatapath;
        use palisade_proto::v1::PodRef;
        use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, Rule};
        use tokio::sync::oneshot;

        fn pod_policy(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
            PodPolicy {
                pod: Some(PodRef {
                    namespace: "x".into(),
                    name: name.into(),
                }),
                ingress,
                ..Default::default()
            }
        }

        fn deny_all() -> Option<DirectionPolicy> {
            Some(DirectionPolicy {
                rules: vec![],
                ..Default::default()
            })
        }

        fn up(name: &str, iface: &str) -> PodUp {
            crate::reconciler::fixtures::pod_up_as(name, iface, &format!("c-{name}"))
        }

        fn reconciler(mode: Mode) -> Reconciler<FakeDatapath> {
            Reconciler::new(
                "n1".into(),
                "e1".into(),
                FakeDatapath::with_interfaces(&["veth-a", "veth-b", "br0"]),
            )
            .with_mode(mode)
        }

        type Answer = oneshot::Receiver<Result<PodUpOutcome, String>>;

        fn start_up(r: &mut Reconciler<FakeDatapath>, u: PodUp) -> Answer {
            let (tx, rx) = oneshot::channel();
            r.pod_up(u, tx);
            rx
        }

        fn now(rx: &mut Answer) -> Result<PodUpOutcome, String> {
            rx.try_recv().expect("answered")
        }

        /// 5.1: an ADD naming another pod's live interface (the bridge itself, say)
        /// is refused and changes nothing; the other pod stays enforced.
        #[test]
        fn an_add_claiming_another_pods_interface_changes_nothing() {
            let mut r = reconciler(Mode::Standard);
            r.apply_plan(snapshot(
                1,
                true,
                vec![pod_policy("a", deny_all()), pod_policy("b", None)],
            ))
            .unwrap();
            now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
            let before = (r.datapath.endpoints.clone(), r.datapath.attached.clone());
            let mut bad = up("b", "veth-b");
            bad.runtime.host_interfaces.push("veth-a".into());
            let err = now(&mut start_up(&mut r, bad)).unwrap_err();
            assert!(err.contains("veth-a") && err.contains("x/a"), "{err}");
            assert_eq!(
                before,
                (r.datapath.endpoints.clone(), r.datapath.attached.clone())
            );
            assert_eq!(r.node_state().pods.len(), 1);
            // A refused ADD for a pod that failed to attach also restores the rest.
            r.datapath.fail.insert("attach veth-b".into());
            assert!(now(&mut start_up(&mut r, up("b", "veth-b"))).is_err());
            assert_eq!(
                before,
                (r.datapath.endpoints.clone(), r.datapath.attached.clone())
            );
            r.datapath.assert_no_violations();
        }

        /// 5.3: a snapshot from a controller that has not synced is refused; the
        /// node keeps its policy; a snapshot dropping every policy is loud.
        #[test]
        fn an_unsynced_snapshot_is_refused_and_a_wipe_is_loud() {
            let mut r = reconciler(Mode::Standard);
            r.apply_plan(snapshot(1, true, vec![pod_policy("a", deny_all())]))
                .unwrap();
            now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
            let enforced = r.datapath.endpoint_of("veth-a").unwrap();
            assert_ne!(enforced.0, 0);
            assert_eq!(
                r.apply_plan(snapshot(9, false, vec![pod_policy("a", None)])),
                Err(PlanError::NotSynced(9))
            );
            assert_eq!(r.datapath.endpoint_of("veth-a"), Some(enforced));
            assert!(r.dump().warnings.iter().any(|w| w.contains("not synced")));
            r.apply_plan(snapshot(10, true, vec![pod_policy("a", None)]))
                .unwrap();
            assert!(r
                .dump()
                .warnings
                .iter()
                .any(|w| w.contains("drops every policy")));
        }

        /// 5.4: a pod the plan does not know yet is attached denied and its ADD
        /// waits; the plan's arrival answers it. At the deadline strict refuses
        /// (and leaves nothing), standard starts it open but visibly unprotected.
        #[test]
        fn a_new_pod_waits_denied_and_the_deadline_depends_on_the_mode() {
            for mode in [Mode::Standard, Mode::Strict] {
                let mut r = reconciler(mode);
                let (fetch_tx, mut fetch_rx) = tokio::sync::mpsc::unbounded_channel();
                r = r.with_fetcher(fetch_tx);
                r.handle(Event::PlanConnected(true));
                r.apply_plan(snapshot(1, true, vec![])).unwrap();
                let mut answer = start_up(&mut r, up("a", "veth-a"));
                assert!(answer.try_recv().is_err(), "{mode}: must wait");
                assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, DENY_ALL)));
                assert_eq!(
                    fetch_rx.try_recv().unwrap(),
                    ("x".to_string(), "a".to_string())
                );
                // The plan delivers it: answered, enforced.
                r.apply_plan(snapshot(2, true, vec![pod_policy("a", None)]))
                    .unwrap();
                let out = now(&mut answer).unwrap();
                assert!(out.realized);
                let expect_open = mode == Mode::Standard;
                assert_eq!(
                    r.datapath.endpoint_of("veth-a").unwrap().0 == 0,
                    expect_open,
                    "{mode}"
                );

                // Another pod whose policy never comes.
                let mut answer = start_up(&mut r, up("b", "veth-b"));
                r.handle(Event::PodUpDeadline {
                    pod: ("x".into(), "b".into()),
                    container_id: "c-b".into(),
                });
                match mode {
                    Mode::Strict => {
                        let e = now(&mut answer).unwrap_err();
                        assert!(
                            e.contains("strict") && e.contains("does not list x/b"),
                            "{e}"
                        );
                        assert!(!r.datapath.attached.contains("veth-b"));
                        assert_eq!(r.node_state().pods.len(), 1);
                    }
                    Mode::Standard => {
                        let out = now(&mut answer).unwrap();
                        assert!(!out.realized && out.warning.contains("UNPROTECTED"));
                        assert_eq!(r.datapath.endpoint_of("veth-b"), Some((0, 0)));
                        let state = r.node_state();
                        let b = state
                            .pods
                            .iter()
                            .find(|p| p.pod.as_ref().unwrap().name == "b")
                            .unwrap();
                        assert!(b.error.contains("UNPROTECTED"), "{}", b.error);
                    }
                }
                r.datapath.assert_no_violations();
            }
        }

        /// 5.4: the on-demand fetch answers a waiting pod before the stream does.
        #[test]
        fn a_fetched_pod_plan_answers_the_wait() {
            let mut r = reconciler(Mode::Strict);
            r.apply_plan(snapshot(1, true, vec![])).unwrap();
            let mut answer = start_up(&mut r, up("a", "veth-a"));
            r.handle(Event::PodPlanFetched {
                pod: ("x".into(), "a".into()),
                policy: Some(Box::new(pod_policy("a", deny_all()))),
            });
            assert!(now(&mut answer).unwrap().ingress_isolated);
            // The stream catching up replaces it, without a window.
            r.apply_plan(snapshot(2, true, vec![pod_policy("a", deny_all())]))
                .unwrap();
            assert!(r.plan.fetched.is_empty());
            r.datapath.assert_no_violations();
        }

        /// 5.5: a pod recreated with the same interface name (a new index) is
        /// attached to the new interface; a late name-only delete of the old pod
        /// does not tear the new one down.
        #[test]
        fn a_recreated_interface_is_attached_and_a_late_delete_spares_it() {
            let mut r = reconciler(Mode::Standard);
            r.apply_plan(snapshot(1, true, vec![pod_policy("a", deny_all())]))
                .unwrap();
            let mut first = up("a", "veth-a");
            first.runtime.container_id = String::new();
            now(&mut start_up(&mut r, first.clone())).unwrap();
            let attaches = r
                .datapath
                .log
                .iter()
                .filter(|l| l.starts_with("attach veth-a"))
                .count();
            // The StatefulSet pod is recreated: same name, new veth (new index).
            r.datapath.interfaces.insert("veth-a".into(), 30);
            now(&mut start_up(&mut r, first)).unwrap();
            let attaches_after = r
                .datapath
                .log
                .iter()
                .filter(|l| l.starts_with("attach veth-a"))
                .count();
            assert_eq!(
                attaches_after,
                attaches + 1,
                "the new interface got programs"
            );
            assert!(r.datapath.endpoints.contains_key(&30));
            assert!(!r.datapath.endpoints.contains_key(&10));
            // The old pod's DeletePodNp arrives late.
            r.pod_down(Some(("x".into(), "a".into())), "").unwrap();
            assert!(r.datapath.attached.contains("veth-a"));
            assert_ne!(r.datapath.endpoints[&30].ingress, 0);
            // Once the interface really goes, the pod goes.
            r.datapath.interfaces.remove("veth-a");
            r.handle(Event::Links);
            assert!(r.node_state().pods.is_empty());
            r.datapath.assert_no_violations();
        }

        /// 5.8: a failed detach keeps the endpoint entry (a program without one
        /// passes everything) and says so.
        #[test]
        fn a_failed_detach_keeps_the_entry() {
            let mut r = reconciler(Mode::Standard);
            r.apply_plan(snapshot(1, true, vec![pod_policy("a", deny_all())]))
                .unwrap();
            now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
            r.datapath.fail.insert("detach veth-a".into());
            r.pod_down(Some(("x".into(), "a".into())), "c-a").unwrap();
            assert!(r.datapath.attached.contains("veth-a"));
            assert!(r.datapath.endpoint_of("veth-a").is_some());
            assert!(r
                .node_state()
                .errors
                .iter()
                .any(|e| e.contains("detaching veth-a")));
            r.datapath.assert_no_violations();
            r.datapath.fail.clear();
            r.handle(Event::Tick);
            r.datapath.assert_empty();
        }

        /// 5.8: table ids never wrap into 0 (not isolated) or DENY_ALL.
        #[test]
        fn policy_ids_skip_zero_and_deny_all_when_they_wrap() {
            let mut realized = Realized {
                next_policy: DENY_ALL - 2,
                ..Realized::default()
            };
            let ids: Vec<PolicyId> = (0..3).map(|_| realized.alloc_policy().unwrap()).collect();
            assert_eq!(ids, vec![DENY_ALL - 1, 1, 2]);
        }

        /// 5.9: a policy that cannot be compiled, and a table that cannot be
        /// written, each leave the pod denied (checked on the entry; the eBPF tests
        /// check what such an entry does to a real packet).
        #[test]
        fn an_uncompilable_or_unwritable_policy_denies() {
            let broken = DirectionPolicy {
                rules: vec![Rule {
                    peers: vec![PeerBlock {
                        cidr: Some(IpPrefix {
                            addr: vec![1, 2, 3],
                            prefix_len: 8,
                        }),
                        except: vec![],
                    }],
                    ports: vec![],
                    ..Default::default()
                }],
                ..Default::default()
            };
            let mut r = reconciler(Mode::Standard);
            r.apply_plan(snapshot(1, true, vec![pod_policy("a", None)]))
                .unwrap();
            now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
            assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
            r.apply_plan(snapshot(2, true, vec![pod_policy("a", Some(broken))]))
                .unwrap();
            let (ingress, _) = r.datapath.endpoint_of("veth-a").unwrap();
            assert_ne!(ingress, 0, "a broken policy must not leave the pod open");
            assert!(r.datapath.policies[&ingress].is_empty(), "deny-all table");

            let mut r = reconciler(Mode::Standard);
            r.apply_plan(snapshot(1, true, vec![pod_policy("a", None)]))
                .unwrap();
            now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
            r.datapath.fail.insert("add_policy".into());
            r.apply_plan(snapshot(2, true, vec![pod_policy("a", deny_all())]))
                .unwrap();
            assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));
            assert!(r.node_state().pods[0].error.contains("not written"));
            r.datapath.assert_no_violations();
        }

        /// 5.8: the plan is saved before the datapath changes.
        #[test]
        fn the_plan_is_saved_before_the_datapath_changes() {
            let dir = tempfile::tempdir().unwrap();
            let mut r = reconciler(Mode::Standard)
                .with_checkpoint(crate::checkpoint::Checkpoint::open(dir.path()).unwrap());
            r.apply_plan(snapshot(1, true, vec![pod_policy("a", None)]))
                .unwrap();
            now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
            // Every datapath write fails: the plan must still be on disk.
            r.datapath.fail.insert("".into());
            r.apply_plan(snapshot(2, true, vec![pod_policy("a", deny_all())]))
                .unwrap();
            let saved = crate::checkpoint::Checkpoint::open(dir.path())
                .unwrap()
                .load()
                .unwrap();
            assert_eq!(saved.plan.unwrap().version, 2);
        }
    }
}
