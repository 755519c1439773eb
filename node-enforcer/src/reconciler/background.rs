//! Big policies without stalling the node (issue 18). A direction policy of
//! many peers is compiled on a worker thread into an immutable
//! [`PolicySet`], and its table is written a bounded slice at a time
//! between events, so pod-ups, deletes and dumps never wait behind one
//! large convergence. The reconciler stays the one owner of node state
//! (DESIGN invariant 1): the worker only computes, every map write is the
//! reconciler's.
//!
//! Make before break and fail closed hold as for any table: until a table
//! is complete no endpoint points at it. The pods it is for keep what they
//! enforce now, or are denied, and their pod-ups wait for it
//! ([`NoTable::InFlight`]); the dump names them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use palisade_proto::v1::DirectionPolicy;
use tokio::sync::mpsc;

use super::dump::Counted;
use super::realized::RealizedPolicy;
use super::{Event, Reconciler};
use crate::compile::{compile_limited, PolicySet, Prefix};
use crate::datapath::{Datapath, PolicyId, PortSetId};
use crate::desired::NoTable;

/// Direction policies of at least this many peers and excepts are compiled
/// off the reconciler's thread (`--background-compile-peers`); smaller ones
/// compile in well under a millisecond and are realized in the event that
/// brought them, as before.
pub const BACKGROUND_PEERS: usize = 2048;

/// Table entries written per slice: a few milliseconds of map writes, so an
/// event waits at most that long behind a big table.
pub const SLICE_ENTRIES: usize = 2048;

/// Peers and excepts of a direction policy: what its compilation and its
/// table grow with.
pub fn peers(d: &DirectionPolicy) -> usize {
    let tiers = d
        .admin
        .iter()
        .chain(&d.baseline)
        .flat_map(|r| r.peers.iter());
    d.rules
        .iter()
        .flat_map(|r| r.peers.iter())
        .chain(tiers)
        .map(|p| 1 + p.except.len())
        .sum()
}

/// The slices `0..total` is written in, `slice` entries each.
pub fn slices(total: usize, slice: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let slice = slice.max(1);
    (0..total.div_ceil(slice)).map(move |i| i * slice..((i + 1) * slice).min(total))
}

struct CompileJob {
    key: Vec<u8>,
    generation: u64,
    policy: DirectionPolicy,
    node_addresses: Vec<Prefix>,
    max_entries: usize,
}

/// A compiled table being written: nothing points at `id` until every
/// entry is in.
struct Write {
    key: Vec<u8>,
    generation: u64,
    set: Arc<PolicySet>,
    id: PolicyId,
    entries: Vec<(Prefix, PortSetId)>,
    written: usize,
}

/// The worker, the tables in flight, and the knobs.
pub(super) struct Background {
    worker: Option<std::sync::mpsc::Sender<CompileJob>>,
    /// Peers at which a policy goes to the worker.
    pub(super) threshold: usize,
    /// Most entries one compiled table may have (the enforcer's own limit).
    pub(super) max_entries: usize,
    /// Bumped when compiled tables are forgotten (node addresses changed):
    /// results of an older generation are not cached.
    generation: u64,
    /// At the worker, by encoded policy, with its size for the dump.
    compiling: HashMap<Vec<u8>, usize>,
    writes: VecDeque<Write>,
}

impl Default for Background {
    fn default() -> Self {
        Background {
            worker: None,
            threshold: BACKGROUND_PEERS,
            max_entries: crate::compile::MAX_TABLE_ENTRIES,
            generation: 0,
            compiling: HashMap::new(),
            writes: VecDeque::new(),
        }
    }
}

impl Background {
    /// Starts the worker thread; its results come back as
    /// [`Event::Compiled`]. Without one every policy compiles in place.
    pub(super) fn start(&mut self, events: mpsc::Sender<Event>) -> std::io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel::<CompileJob>();
        // Weak: the worker must not keep the reconciler's queue open, or
        // the reconciler would never see its last sender go and never end.
        let events = events.downgrade();
        std::thread::Builder::new()
            .name("compile".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let result = compile_limited(&job.policy, &job.node_addresses, job.max_entries)
                        .map(|set| {
                            // Named here, once: naming reads every entry.
                            set.id();
                            Arc::new(set)
                        })
                        .map_err(|e| e.to_string());
                    let done = Event::Compiled {
                        key: job.key,
                        generation: job.generation,
                        result,
                    };
                    let Some(events) = events.upgrade() else {
                        return;
                    };
                    if events.blocking_send(done).is_err() {
                        return;
                    }
                }
            })?;
        self.worker = Some(tx);
        Ok(())
    }

    pub(super) fn forget(&mut self) {
        self.generation += 1;
    }

    /// Whether a table is being compiled or written for this policy.
    fn in_flight(&self, key: &[u8]) -> bool {
        self.compiling.contains_key(key) || self.writes.iter().any(|w| w.key == key)
    }

    /// For the compiler closure: Some(in_flight) when `d` is (now) being
    /// compiled or written off the event; None: compile it in place.
    pub(super) fn defer(
        &mut self,
        key: &[u8],
        d: &DirectionPolicy,
        node_addresses: &[Prefix],
    ) -> Option<NoTable> {
        let worker = self.worker.as_ref()?;
        let size = peers(d);
        if size < self.threshold {
            return None;
        }
        let why = format!("{size} peers");
        if self.in_flight(key) {
            return Some(NoTable::InFlight(why));
        }
        let job = CompileJob {
            key: key.to_vec(),
            generation: self.generation,
            policy: d.clone(),
            node_addresses: node_addresses.to_vec(),
            max_entries: self.max_entries,
        };
        if worker.send(job).is_err() {
            // The worker is gone: compile in place rather than never.
            return None;
        }
        self.compiling.insert(key.to_vec(), size);
        Some(NoTable::InFlight(why))
    }

    /// Policies at the worker.
    #[cfg(test)]
    pub(super) fn compiling_count(&self) -> usize {
        self.compiling.len()
    }

    /// Whether a slice of a table is waiting to be written.
    pub(super) fn has_writes(&self) -> bool {
        !self.writes.is_empty()
    }

    /// Policy ids of tables being written: not free for another table.
    pub(super) fn ids(&self) -> impl Iterator<Item = PolicyId> + '_ {
        self.writes.iter().map(|w| w.id)
    }

    /// Port sets the tables being written point at: not garbage.
    pub(super) fn portsets(&self) -> impl Iterator<Item = PortSetId> + '_ {
        self.writes
            .iter()
            .flat_map(|w| w.entries.iter().map(|(_, ps)| *ps))
    }

    /// In flight, for the dump: (what, peers or entries).
    pub(super) fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .compiling
            .values()
            .map(|peers| format!("compiling a policy of {peers} peers off the reconciler thread"))
            .collect();
        out.extend(self.writes.iter().map(|w| {
            format!(
                "writing table {} ({} of {} entries) before any pod points at it",
                w.set.id(),
                w.written,
                w.entries.len()
            )
        }));
        out.sort();
        out
    }
}

impl<D: Datapath> Reconciler<D> {
    /// A compiled table is back from the worker: start writing it (or, for
    /// a failure, remember why), then bring its pods to it.
    pub(super) fn compiled_off_thread(
        &mut self,
        key: Vec<u8>,
        generation: u64,
        result: Result<Arc<PolicySet>, String>,
    ) {
        if self.background.compiling.remove(&key).is_none() {
            return;
        }
        if generation != self.background.generation {
            // Compiled for addresses the node no longer has: the pods'
            // next convergence asks again.
            self.converge_awaiting_tables();
            return;
        }
        let set = match result {
            Ok(set) => set,
            Err(e) => {
                self.target.compiled.insert(key, Err(e));
                self.converge_awaiting_tables();
                return;
            }
        };
        // Another policy may have compiled to the same content already.
        if let Some((existing, _)) = self.realized.policies.get_key_value(&set) {
            let existing = existing.clone();
            self.target.compiled.insert(key, Ok(existing));
            self.converge_awaiting_tables();
            return;
        }
        match self.start_write(key.clone(), generation, set.clone()) {
            Ok(()) => {}
            Err(e) => {
                // Counted like any failed table write: the pods are denied
                // with the error, and ticks retry.
                self.health.warn(format!("policy set {}: {e}", set.id()));
                self.target.compiled.insert(key, Ok(set));
                self.converge_awaiting_tables();
            }
        }
    }

    fn start_write(
        &mut self,
        key: Vec<u8>,
        generation: u64,
        set: Arc<PolicySet>,
    ) -> Result<(), String> {
        let mut entries = Vec::with_capacity(set.entries.len());
        for (prefix, ports) in &set.entries {
            let ps = if ports.0.is_empty() {
                0
            } else if let Some(id) = self.realized.portsets.get(ports) {
                *id
            } else {
                let id = self.realized.alloc_portset()?;
                self.datapath
                    .add_portset(id, ports)
                    .counted(&mut self.health)
                    .map_err(|e| format!("port set: {e}"))?;
                self.realized.portsets.insert(ports.clone(), id);
                id
            };
            entries.push((*prefix, ps));
        }
        let id = self.alloc_policy()?;
        self.background.writes.push_back(Write {
            key,
            generation,
            set,
            id,
            entries,
            written: 0,
        });
        Ok(())
    }

    /// Writes one slice of the oldest table in flight; when it is complete,
    /// the pods waiting for it converge onto it.
    pub(super) fn write_slice(&mut self) {
        let Some(w) = self.background.writes.front_mut() else {
            return;
        };
        let Some(range) = slices(w.entries.len() - w.written, SLICE_ENTRIES).next() else {
            return self.finish_write();
        };
        let range = w.written + range.start..w.written + range.end;
        match self
            .datapath
            .add_policy(w.id, &w.entries[range.clone()])
            .counted(&mut self.health)
        {
            Ok(()) => {
                w.written = range.end;
                if w.written == w.entries.len() {
                    self.finish_write();
                }
            }
            Err(e) => {
                let w = self.background.writes.pop_front().expect("front");
                // Leave no half-written table behind.
                let _ = self.datapath.remove_policy(w.id, &w.entries[..range.end]);
                self.health.warn(format!("policy set {}: {e}", w.set.id()));
                // The pods' next convergence writes it in place, or denies
                // them with the error (retried on ticks).
                if w.generation == self.background.generation {
                    self.target.compiled.insert(w.key, Ok(w.set));
                }
                self.converge_awaiting_tables();
            }
        }
    }

    fn finish_write(&mut self) {
        let w = self.background.writes.pop_front().expect("front");
        if w.generation == self.background.generation {
            self.target.compiled.insert(w.key, Ok(w.set.clone()));
        }
        // Realized either way: a table nothing points at is collected by
        // the next convergence, like any other.
        self.realized.policies.insert(
            w.set,
            RealizedPolicy {
                id: w.id,
                entries: w.entries,
            },
        );
        self.converge_awaiting_tables();
    }

    /// The pods waiting for a table converge again, and those now complete
    /// get their pod-up answered.
    fn converge_awaiting_tables(&mut self) {
        let pods: Vec<_> = self
            .target
            .desired
            .awaiting_tables
            .iter()
            .cloned()
            .collect();
        self.converge_pods(&pods);
        self.answer_waiting_ups();
        if self.target.desired.awaiting_tables.is_empty()
            && self.plan.realized_version != self.plan.version
        {
            self.plan.realized_version = self.plan.version;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Slices and peer counts; and big policies compiled off the
    //! reconciler's thread and written in slices (issue 18): other pods
    //! start meanwhile, the big policy's pods stay held or denied until the
    //! table is complete, and the enforcer's own table limit denies a
    //! direction with an error naming the policy.

    use super::super::fixtures::{pod_up_as, snapshot};
    use super::super::*;
    use super::*;
    use crate::datapath::fake::FakeDatapath;
    use palisade_proto::v1::PodRef;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule};

    #[test]
    fn slices_cover_every_entry_once_in_order() {
        for total in [0, 1, 5, 2047, 2048, 2049, 10_000] {
            for slice in [1, 3, 2048] {
                let all: Vec<usize> = slices(total, slice).flatten().collect();
                assert_eq!(all, (0..total).collect::<Vec<_>>(), "{total}/{slice}");
                assert!(slices(total, slice).all(|r| r.len() <= slice && !r.is_empty()));
            }
        }
        // A zero slice still makes progress.
        assert_eq!(slices(3, 0).count(), 3);
    }

    #[test]
    fn peers_count_blocks_and_excepts() {
        let p = |a: u8| IpPrefix {
            addr: vec![10, 0, 0, a],
            prefix_len: 32,
        };
        let d = DirectionPolicy {
            rules: vec![
                Rule {
                    peers: vec![
                        PeerBlock {
                            cidr: Some(p(0)),
                            except: vec![p(1), p(2)],
                        },
                        PeerBlock {
                            cidr: Some(p(3)),
                            except: vec![],
                        },
                    ],
                    ..Default::default()
                },
                Rule::default(),
            ],
            ..Default::default()
        };
        assert_eq!(peers(&d), 4);
        assert_eq!(peers(&DirectionPolicy::default()), 0);
    }

    /// `n` rules, each one /32 peer in 172.16.0.0/16 on TCP 80, from x/big.
    fn big(n: usize) -> DirectionPolicy {
        DirectionPolicy {
            rules: (0..n)
                .map(|i| Rule {
                    peers: vec![PeerBlock {
                        cidr: Some(IpPrefix {
                            addr: vec![172, 16, (i >> 8) as u8, i as u8],
                            prefix_len: 32,
                        }),
                        except: vec![],
                    }],
                    ports: vec![PortRange {
                        protocol: Protocol::Tcp as i32,
                        port: 80,
                        end_port: 0,
                    }],
                    policy: "x/big".into(),
                    rule_index: i as u32,
                    domain_names: vec![],
                })
                .collect(),
            ..Default::default()
        }
    }

    fn pod(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            ingress,
            policies: vec!["x/big".into()],
            ..Default::default()
        }
    }

    fn up(name: &str, iface: &str) -> PodUp {
        pod_up_as(name, iface, &format!("c-{name}"))
    }

    /// The reconciler's queue, and the sender that keeps it open as the
    /// enforcer's servers do (the worker's own is weak).
    struct Events {
        rx: mpsc::Receiver<Event>,
        _tx: mpsc::Sender<Event>,
    }

    impl Events {
        fn blocking_recv(&mut self) -> Option<Event> {
            self.rx.blocking_recv()
        }
    }

    /// A reconciler whose policies of `threshold` peers or more go to the
    /// worker thread.
    fn reconciler(threshold: usize) -> (Reconciler<FakeDatapath>, Events) {
        let (tx, rx) = mpsc::channel(16);
        let r = Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a", "veth-b"]),
        )
        .with_background_compile(tx.clone(), threshold)
        .unwrap();
        (r, Events { rx, _tx: tx })
    }

    /// Hands the worker's result to the reconciler, then writes the table a
    /// slice at a time as `run` does between events, checking `each` after
    /// every slice; returns how many slices it took.
    fn finish(
        r: &mut Reconciler<FakeDatapath>,
        rx: &mut Events,
        mut each: impl FnMut(&Reconciler<FakeDatapath>),
    ) -> usize {
        while r.background.compiling_count() > 0 {
            let event = rx.blocking_recv().expect("the worker answers");
            assert!(matches!(event, Event::Compiled { .. }));
            r.handle(event);
        }
        let mut slices = 0;
        while r.background.has_writes() {
            each(r);
            r.write_slice();
            slices += 1;
        }
        slices
    }

    #[test]
    fn other_pods_start_while_a_big_policy_compiles_and_its_pod_waits_denied() {
        let (mut r, mut rx) = reconciler(1000);
        r.apply_plan(snapshot(1, vec![pod("a", Some(big(5000))), pod("b", None)]))
            .unwrap();

        let (tx_a, mut rx_a) = tokio::sync::oneshot::channel();
        r.pod_up(up("a", "veth-a"), tx_a);
        assert!(rx_a.try_recv().is_err(), "a's pod-up waits for its table");
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));

        // The unselected pod is answered at once, open.
        let (tx_b, mut rx_b) = tokio::sync::oneshot::channel();
        r.pod_up(up("b", "veth-b"), tx_b);
        let b = rx_b.try_recv().expect("answered at once").unwrap();
        assert!(b.realized && !b.ingress_isolated);
        assert_eq!(r.datapath.endpoint_of("veth-b"), Some((0, 0)));

        // The dump answers and says why a waits.
        let dump = r.dump();
        assert!(
            dump.state.errors.iter().any(|e| e.contains("x/a")
                && e.contains("5000 peers")
                && e.contains("not realized yet")),
            "{:?}",
            dump.state.errors
        );

        let slices = finish(&mut r, &mut rx, |r| {
            // Never half-open: denied until the table is complete.
            assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));
            r.datapath.assert_no_violations();
        });
        assert_eq!(slices, 5000usize.div_ceil(SLICE_ENTRIES));
        let a = rx_a.try_recv().expect("answered once complete").unwrap();
        assert!(a.realized && a.ingress_isolated);
        let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
        assert_ne!(id, DENY_ALL);
        assert!(r.datapath.policies[&id].len() >= 5000);
        assert_eq!(r.plan.realized_version, 1);
        assert!(
            r.node_state().errors.is_empty(),
            "{:?}",
            r.node_state().errors
        );
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_pod_keeps_its_old_table_until_the_big_one_is_complete() {
        let (mut r, mut rx) = reconciler(1000);
        r.apply_plan(snapshot(1, vec![pod("a", Some(big(10)))]))
            .unwrap();
        let (tx, mut answer) = tokio::sync::oneshot::channel();
        r.pod_up(up("a", "veth-a"), tx);
        assert!(answer.try_recv().unwrap().is_ok());
        let (old, _) = r.datapath.endpoint_of("veth-a").unwrap();

        r.apply_plan(snapshot(2, vec![pod("a", Some(big(3000)))]))
            .unwrap();
        assert_eq!(
            r.plan.realized_version, 1,
            "not realized while a table is missing"
        );
        finish(&mut r, &mut rx, |r| {
            assert_eq!(r.datapath.endpoint_of("veth-a"), Some((old, 0)), "held");
            assert!(r.datapath.policies.contains_key(&old));
        });
        let (new, _) = r.datapath.endpoint_of("veth-a").unwrap();
        assert_ne!(new, old);
        assert!(
            !r.datapath.policies.contains_key(&old),
            "old table goes last"
        );
        assert_eq!(r.plan.realized_version, 2);
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_pod_whose_table_is_not_complete_at_its_deadline_starts_denied_never_open() {
        let (mut r, mut rx) = reconciler(1000);
        r.apply_plan(snapshot(1, vec![pod("a", Some(big(2000)))]))
            .unwrap();
        let (tx, mut answer) = tokio::sync::oneshot::channel();
        r.pod_up(up("a", "veth-a"), tx);
        r.pod_up_deadline(&("x".into(), "a".into()), "c-a");
        let out = answer.try_recv().unwrap().unwrap();
        assert!(!out.realized);
        assert!(out.warning.contains("starts denied"), "{}", out.warning);
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));
        finish(&mut r, &mut rx, |_| {});
        let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
        assert_ne!(id, DENY_ALL, "realized once complete");
    }

    #[test]
    fn a_table_over_the_limit_denies_its_pods_and_names_the_policy() {
        for threshold in [50, usize::MAX] {
            let (r, mut rx) = reconciler(threshold);
            let mut r = r.with_max_table_entries(100);
            r.apply_plan(snapshot(
                1,
                vec![pod("a", Some(big(101))), pod("b", Some(big(100)))],
            ))
            .unwrap();
            let (tx, mut answer_a) = tokio::sync::oneshot::channel();
            r.pod_up(up("a", "veth-a"), tx);
            let (tx, mut answer_b) = tokio::sync::oneshot::channel();
            r.pod_up(up("b", "veth-b"), tx);
            finish(&mut r, &mut rx, |_| {});
            answer_a.try_recv().unwrap().unwrap();
            answer_b.try_recv().unwrap().unwrap();
            // a: only the node (the deny table of a direction that cannot be
            // compiled); b, at the limit, has its policy.
            let (ia, _) = r.datapath.endpoint_of("veth-a").unwrap();
            let (ib, _) = r.datapath.endpoint_of("veth-b").unwrap();
            assert!(r.datapath.policies.get(&ia).is_none_or(|t| t.len() < 100));
            assert_eq!(r.datapath.policies[&ib].len(), 100);
            let errors = r.node_state().errors;
            assert!(
                errors.iter().any(|e| e.contains("x/a")
                    && e.contains("101 entries")
                    && e.contains("NetworkPolicy x/big")
                    && e.contains("--max-table-entries")),
                "{errors:?}"
            );
            assert!(!errors.iter().any(|e| e.contains("of x/b ")), "{errors:?}");
            r.datapath.assert_no_violations();
        }
    }

    #[test]
    fn the_reconciler_ends_when_its_last_sender_goes_though_the_worker_runs() {
        let (tx, rx) = mpsc::channel(16);
        let r = Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a"]),
        )
        .with_background_compile(tx.clone(), 1)
        .unwrap();
        let (state_tx, _state) = tokio::sync::watch::channel(NodeState::default());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            r.run(rx, state_tx);
            let _ = done_tx.send(());
        });
        drop(tx);
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("run returns once every sender but the worker's is gone");
    }
}
