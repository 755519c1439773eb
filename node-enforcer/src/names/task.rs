//! The learner task: reads the frames the datapath copied
//! (`pal_dns_frames`), learns from them ([`Learner`]), writes the overlay
//! ([`LearnedMaps`]) and re-injects every held answer ([`Reinjector`]);
//! meanwhile it keeps the datapath's learner deadline in the future, so
//! that answers are held only while someone will release them.
//!
//! A held answer is always re-injected: after its writes when it teaches,
//! at once when it does not, and, for a fragment of a datagram that never
//! became whole, when its reassembly times out. A write that fails leaves
//! the address unlearned (the connection fails closed); the answer is
//! re-injected all the same: DNS never breaks for learning.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, RingBuf};
use palisade_dns::Limits;
use palisade_ebpf::{
    mapped_addr, DnsConfig, DnsFrameHdr, DNS_FRAME_ANSWER, DNS_FRAME_QUERY, MAP_DNS_CONFIG,
    MAP_DNS_FRAMES, MAP_DNS_SERVERS,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::frame::{fragment_of, with_udp_checksum, FrameError, ReassemblyLimits};
use super::learner::{Ignored, Learner, Write};
use super::reinject::Reinjector;
use super::report::{Evictions, Holds, LearnedAddr, Learning, PodReport, Report, Request};
use crate::datapath::bpf::learned::LearnedMaps;
use crate::reconciler::names::PodUpdate;

/// How far ahead the learner deadline is pushed, and how often: a learner
/// stalled for longer than the lease makes the datapath pass answers
/// unheld (names then fail closed, DNS keeps working). Short, because the
/// answers held when a learner dies without clearing it (SIGKILL) are
/// lost, and their clients must ask again.
pub const LEASE: Duration = Duration::from_millis(250);
const REFRESH: Duration = Duration::from_millis(50);
/// Most records taken per wake-up before other work gets a turn.
const BATCH: usize = 1024;

/// How the learner runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub pin_root: PathBuf,
    /// The DNS servers whose answers teach.
    pub servers: Vec<IpAddr>,
    pub limits: Limits,
    pub reassembly: ReassemblyLimits,
}

#[derive(Debug, thiserror::Error)]
pub enum NamesError {
    #[error("opening {what} under {pin_root}: {cause}")]
    Map {
        what: &'static str,
        pin_root: String,
        cause: String,
    },
    #[error("opening the packet socket that re-injects answers: {0}")]
    Socket(std::io::Error),
}

/// One IP datagram on one interface: (ifindex, source, destination, id).
type DatagramKey = (u32, IpAddr, IpAddr, u32);

/// Held fragments of a datagram not yet whole.
struct Waiting {
    /// When reassembly gives up on it (boot clock): its fragments are
    /// re-injected as they are.
    deadline: u64,
    /// Each with when the datapath copied it.
    frames: Vec<(u64, Vec<u8>)>,
}

/// CLOCK_BOOTTIME in ns: the datapath's clock for expiries and deadlines.
pub fn boot_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Task {
    learner: Learner,
    maps: LearnedMaps,
    config: Array<MapData, DnsConfig>,
    reinjector: Reinjector,
    /// Held fragments of datagrams not yet whole, by (ifindex, datagram),
    /// with when they time out.
    waiting: HashMap<DatagramKey, Waiting>,
    /// Entries a previous process wrote, kept until they expire or their
    /// pod stops learning (their names are not known to this one).
    adopted: HashMap<(u32, IpAddr), u64>,
    /// Interfaces told of since start (an adopted entry survives the first).
    told: std::collections::HashSet<u32>,
    timeout_ns: u64,
    /// Held frames re-injected, and how many of those sends failed.
    released: u64,
    reinject_errors: u64,
    write_errors: u64,
    holds: Holds,
}

fn map_error<'a>(
    what: &'static str,
    pin_root: &'a std::path::Path,
) -> impl Fn(String) -> NamesError + 'a {
    move |cause| NamesError::Map {
        what,
        pin_root: pin_root.display().to_string(),
        cause,
    }
}

fn open_map(pin_root: &std::path::Path, name: &'static str) -> Result<Map, NamesError> {
    let data = MapData::from_pin(pin_root.join(name))
        .map_err(|e| map_error(name, pin_root)(e.to_string()))?;
    Map::from_map_data(data).map_err(|e| map_error(name, pin_root)(e.to_string()))
}

/// Starts the learner on the maps pinned under `opts.pin_root`, hearing of
/// pods from `updates` (the reconciler's `with_learner`); the dump and the
/// metrics ask it through the [`Learning`] returned.
pub fn start(
    opts: Options,
    updates: mpsc::UnboundedReceiver<PodUpdate>,
) -> Result<(tokio::task::JoinHandle<()>, Learning), NamesError> {
    let root = opts.pin_root.as_path();
    let ring = RingBuf::try_from(open_map(root, MAP_DNS_FRAMES)?)
        .map_err(|e| map_error(MAP_DNS_FRAMES, root)(e.to_string()))?;
    let config: Array<MapData, DnsConfig> = Array::try_from(open_map(root, MAP_DNS_CONFIG)?)
        .map_err(|e| map_error(MAP_DNS_CONFIG, root)(e.to_string()))?;
    let mut servers: BpfHashMap<MapData, [u8; 16], u32> =
        BpfHashMap::try_from(open_map(root, MAP_DNS_SERVERS)?)
            .map_err(|e| map_error(MAP_DNS_SERVERS, root)(e.to_string()))?;
    // The trusted servers are this process's: any other left is removed.
    let old: Vec<[u8; 16]> = servers.keys().filter_map(|k| k.ok()).collect();
    for k in old {
        let _ = servers.remove(&k);
    }
    for s in &opts.servers {
        servers
            .insert(mapped_addr(*s), 1, 0)
            .map_err(|e| map_error(MAP_DNS_SERVERS, root)(e.to_string()))?;
    }
    let (maps, adopted) = LearnedMaps::open(root)
        .map_err(|e| map_error("the learned overlay", root)(e.to_string()))?;
    let reinjector = Reinjector::new().map_err(NamesError::Socket)?;
    // SAFETY: the RingBuf owns its map fd and keeps it open, unreplaced,
    // for as long as the AsyncFd holds it.
    let ring = unsafe { AsyncFd::register(ring) }
        .map_err(|e| map_error(MAP_DNS_FRAMES, root)(e.to_string()))?;
    // One request at a time is plenty: a scrape and a dump at once wait.
    let (requests_tx, requests) = mpsc::channel(4);
    let learning = Learning::new(opts.servers.clone(), requests_tx);
    let task = Task {
        learner: Learner::new(opts.limits, opts.reassembly, opts.servers.iter().copied()),
        maps,
        config,
        reinjector,
        waiting: HashMap::new(),
        adopted: adopted
            .into_iter()
            .map(|e| ((e.ifindex, e.addr), e.expiry))
            .collect(),
        told: Default::default(),
        timeout_ns: opts.reassembly.timeout_ns,
        released: 0,
        reinject_errors: 0,
        write_errors: 0,
        holds: Holds::default(),
    };
    Ok((tokio::spawn(task.run(ring, updates, requests)), learning))
}

impl Drop for Task {
    /// No learner from now on (the process exits, or learning stopped):
    /// the datapath stops holding answers at once, not a lease later.
    fn drop(&mut self) {
        let _ = self.config.set(0, DnsConfig::default(), 0);
    }
}

impl Task {
    async fn run(
        mut self,
        mut ring: AsyncFd<RingBuf<MapData>>,
        mut updates: mpsc::UnboundedReceiver<PodUpdate>,
        mut requests: mpsc::Receiver<Request>,
    ) {
        let mut refresh = tokio::time::interval(REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let due = self.next_due();
            let sleep = due.map(|d| Duration::from_nanos(d.saturating_sub(boot_ns())));
            tokio::select! {
                ready = ring.readable_mut() => {
                    let mut guard = match ready {
                        Ok(g) => g,
                        Err(e) => {
                            tracing::error!("learner: waiting for copied frames: {e}; learning stops");
                            break;
                        }
                    };
                    let mut records = Vec::new();
                    let mut empty = false;
                    while records.len() < BATCH {
                        match guard.get_inner_mut().next() {
                            Some(r) => records.push(r.to_vec()),
                            None => {
                                empty = true;
                                break;
                            }
                        }
                    }
                    if empty {
                        guard.clear_ready();
                    }
                    drop(guard);
                    for r in records {
                        self.record(&r);
                    }
                }
                update = updates.recv() => {
                    let Some(u) = update else { break };
                    self.pod(u);
                }
                Some(reply) = requests.recv() => {
                    let _ = reply.send(self.report());
                }
                _ = refresh.tick() => self.keep_alive(),
                _ = tokio::time::sleep(sleep.unwrap_or(REFRESH)), if sleep.is_some() => {}
            }
            self.expire();
        }
    }

    fn keep_alive(&mut self) {
        let config = DnsConfig {
            learner_deadline_ns: boot_ns() + LEASE.as_nanos() as u64,
            ..Default::default()
        };
        if let Err(e) = self.config.set(0, config, 0) {
            tracing::warn!("learner: refreshing its deadline: {e}");
        }
    }

    /// The earliest moment something times out (boot clock).
    fn next_due(&self) -> Option<u64> {
        let waiting = self.waiting.values().map(|w| w.deadline).min();
        let adopted = self.adopted.values().copied().min();
        [self.learner.next_expiry(), waiting, adopted]
            .into_iter()
            .flatten()
            .min()
    }

    fn record(&mut self, r: &[u8]) {
        let hdr_len = std::mem::size_of::<DnsFrameHdr>();
        if r.len() < hdr_len {
            return;
        }
        // SAFETY: DnsFrameHdr is repr(C) of integers (every bit pattern
        // valid); read_unaligned needs no alignment.
        let hdr: DnsFrameHdr = unsafe { std::ptr::read_unaligned(r.as_ptr().cast()) };
        let end = (hdr_len + usize::from(hdr.len)).min(r.len());
        let frame = &r[hdr_len..end];
        match hdr.kind {
            DNS_FRAME_QUERY => {
                let _ = self.learner.query(hdr.ts_ns, hdr.ifindex, frame);
            }
            DNS_FRAME_ANSWER => self.answer(hdr.ts_ns, hdr.ifindex, frame),
            _ => {}
        }
    }

    fn answer(&mut self, ts: u64, ifindex: u32, frame: &[u8]) {
        let datagram = fragment_of(frame).map(|(s, d, id)| (ifindex, s, d, id));
        match self.learner.answer(ts, ifindex, frame) {
            Ok(writes) => self.write(writes),
            Err(Ignored::Frame(FrameError::Incomplete)) => {
                if let Some(key) = datagram {
                    let deadline = ts + self.timeout_ns;
                    self.waiting
                        .entry(key)
                        .or_insert_with(|| Waiting {
                            deadline,
                            frames: Vec::new(),
                        })
                        .frames
                        .push((ts, frame.to_vec()));
                    return;
                }
            }
            Err(_) => {}
        }
        if let Some(key) = datagram {
            if let Some(w) = self.waiting.remove(&key) {
                for (held_at, f) in w.frames {
                    self.release(ifindex, held_at, &f);
                }
            }
        }
        self.release(ifindex, ts, frame);
    }

    /// Re-injects a frame the datapath held since `held_at` (boot clock).
    fn release(&mut self, ifindex: u32, held_at: u64, frame: &[u8]) {
        self.released += 1;
        if let Err(e) = self.reinjector.send(ifindex, &with_udp_checksum(frame)) {
            self.reinject_errors += 1;
            tracing::debug!(ifindex, "learner: re-injecting a held answer: {e}");
        }
        let held = Duration::from_nanos(boot_ns().saturating_sub(held_at));
        crate::metrics_names::observe_answer_hold(held);
        self.holds.record(held);
    }

    fn write(&mut self, writes: Vec<Write>) {
        for w in writes {
            let (ifindex, addr, result) = match w {
                Write::Set {
                    ifindex,
                    addr,
                    ports,
                    staged,
                    expiry,
                } => {
                    self.adopted.remove(&(ifindex, addr));
                    let set = self
                        .maps
                        .set(ifindex, addr, &ports, staged.as_ref(), expiry);
                    (ifindex, addr, set)
                }
                Write::Clear { ifindex, addr } => (ifindex, addr, self.maps.clear(ifindex, addr)),
            };
            if let Err(e) = result {
                self.write_errors += 1;
                tracing::warn!(ifindex, %addr, "learner: writing the overlay: {e}");
            }
        }
    }

    fn pod(&mut self, u: PodUpdate) {
        let first = self.told.insert(u.ifindex);
        if u.egress.is_none() || !first {
            // The adopted entries' names are unknown: they cannot be
            // carried over a change of the pod's rules.
            let stale: Vec<(u32, IpAddr)> = self
                .adopted
                .keys()
                .filter(|(i, _)| *i == u.ifindex)
                .copied()
                .collect();
            for (i, a) in stale {
                self.adopted.remove(&(i, a));
                self.write(vec![Write::Clear {
                    ifindex: i,
                    addr: a,
                }]);
            }
        }
        if u.egress.is_none() {
            self.told.remove(&u.ifindex);
        }
        let egress = u.egress.as_ref().map(|e| &*e.enforced);
        let staged = u.egress.as_ref().and_then(|e| e.staged.as_deref());
        match self
            .learner
            .set_pod(boot_ns(), u.ifindex, egress, staged, &u.node)
        {
            Ok((writes, errors)) => {
                for e in errors {
                    tracing::warn!(ifindex = u.ifindex, "learner: {e}");
                }
                self.write(writes);
            }
            Err(e) => {
                tracing::warn!(
                    ifindex = u.ifindex,
                    "learner: the pod's egress does not compile, so it learns nothing: {e}"
                );
                let writes = self.learner.forget(u.ifindex);
                self.write(writes);
            }
        }
    }

    fn expire(&mut self) {
        let now = boot_ns();
        let writes = self.learner.expire(now);
        self.write(writes);
        let due: Vec<(u32, IpAddr)> = self
            .adopted
            .iter()
            .filter(|(_, e)| **e <= now)
            .map(|(k, _)| *k)
            .collect();
        for (i, a) in due {
            self.adopted.remove(&(i, a));
            self.write(vec![Write::Clear {
                ifindex: i,
                addr: a,
            }]);
        }
        let timed_out: Vec<DatagramKey> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in timed_out {
            if let Some(w) = self.waiting.remove(&key) {
                for (held_at, f) in w.frames {
                    self.release(key.0, held_at, &f);
                }
            }
        }
    }

    fn report(&self) -> Report {
        let (learned, queries, fragments) = self.learner.evictions();
        let mut pods: std::collections::BTreeMap<u32, PodReport> = Default::default();
        for &ifindex in &self.told {
            let names = self.learner.names(ifindex);
            if names.is_empty() {
                continue;
            }
            let names = names
                .into_iter()
                .map(|(n, addrs)| {
                    let addrs = addrs
                        .into_iter()
                        .map(|(addr, expiry)| LearnedAddr { addr, expiry })
                        .collect();
                    (n, addrs)
                })
                .collect();
            pods.insert(
                ifindex,
                PodReport {
                    ifindex,
                    names,
                    adopted: Vec::new(),
                },
            );
        }
        for (&(ifindex, addr), &expiry) in &self.adopted {
            pods.entry(ifindex)
                .or_insert_with(|| PodReport {
                    ifindex,
                    ..Default::default()
                })
                .adopted
                .push(LearnedAddr { addr, expiry });
        }
        for p in pods.values_mut() {
            p.adopted.sort_by_key(|a| a.addr);
        }
        Report {
            now: boot_ns(),
            counters: self.learner.counters.clone(),
            evicted: Evictions {
                names: learned.names_evicted,
                addrs: learned.addrs_evicted,
                entries: learned.entries_evicted,
                queries,
                fragments,
            },
            released: self.released,
            reinject_errors: self.reinject_errors,
            write_errors: self.write_errors,
            pending_queries: self.learner.pending(),
            overlay_entries: self.maps.len(),
            pods: pods.into_values().collect(),
            holds: self.holds.clone(),
        }
    }
}
