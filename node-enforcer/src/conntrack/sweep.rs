//! One cleanup pass over the eBPF conntrack maps (IPv4 and IPv6): remove the
//! eBPF entries no kernel entry explains and nobody used since the pass
//! began. Runs on its own thread: it touches only the conntrack maps, never
//! the policy tables the reconciler owns.
//!
//! The kernel is asked in one of two ways ([`Asking`]): by lookups of the
//! idle entries' own flows ([`super::lookup`], the default), or by a netlink
//! dump of its whole table ([`super::kernel`]). Lookups cost a hash probe
//! per idle eBPF entry; the dump costs ~1.8 µs per kernel entry, however
//! few eBPF entries there are. Flows the lookup cannot take (neither TCP
//! nor UDP) are judged at the end of the pass against a dump of their
//! family and protocol, once idle longer than the kernel's ICMP timeout.
//!
//! Each pass also recounts the entries every endpoint hook holds and
//! corrects the programs' counts of them ([`super::share`]).

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{HashMap, IterableMap, Map, MapData};
use palisade_ebpf::{Ct4Key, CtKey, CtValue, MAP_CONNTRACK, MAP_CT4};

use super::listing::{EntryView, Listing};
use super::lookup::{Answer, KernelLookup};
use super::share::Shares;
use super::{batch, idle_and_unexplained, kernel, monotonic_ns, ConntrackError, Explained, Tuple};

/// What one pass did, for the state dump and metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// eBPF entries found (both families).
    pub entries: usize,
    pub kernel_entries: usize,
    pub kept: usize,
    pub removed: usize,
    pub took: Duration,
    /// When it finished, Unix time in milliseconds.
    pub finished_unix_ms: u64,
    /// The first [`super::listing::LISTED`] entries in a stable order
    /// (interface, hook, tuple), each as this pass found it.
    pub listed: Vec<EntryView>,
    /// Why nothing was removed although entries were unexplained, when the
    /// pass decided it could not judge, or why some entries were kept
    /// unjudged (empty otherwise).
    pub skipped: String,
    /// How the kernel was asked, e.g. `kernel lookup` or `netlink dump
    /// (the kernel's vmlinux BTF has no kfunc …)`.
    pub asked_by: String,
    /// Whether the pass read the kernel's whole table (a netlink dump),
    /// whatever the reason.
    pub dumped: bool,
    /// Endpoint hooks whose count of conntrack entries the pass corrected
    /// (evictions and removals no program counted).
    pub shares_corrected: usize,
}

/// Why a pass must not remove anything. The kernel tracks connections in a
/// namespace only once a rule there uses conntrack (NAT, a `ct` match), and
/// nothing tells from outside whether one does: an empty table means either
/// "every flow ended" or "nothing is tracked here". Until this process has
/// seen the kernel's table hold an entry, it takes the second reading:
/// "the kernel does not explain it" then says nothing about a flow, and
/// removing would cut every idle connection's replies. The LRU bounds the
/// map meanwhile. (The kernel's `insert` statistic, which would tell, stays
/// 0 on this kernel.)
pub const SKIPPED_KERNEL_TRACKS_NOTHING: &str =
    "the kernel tracks no connection in this network namespace (no rule uses conntrack): \
     entries are kept, and the map's LRU bounds them";

pub fn tuple_of(k: &CtKey) -> Tuple {
    Tuple {
        src: k.src,
        dst: k.dst,
        sport: u16::from_be(k.sport),
        dport: u16::from_be(k.dport),
        proto: k.proto,
    }
}

/// How a pass asks the kernel whether it holds a flow.
pub enum Asking {
    /// Lookups of each idle entry's flow (TCP and UDP), a dump for the rest.
    Lookup(KernelLookup),
    /// A netlink dump of the whole table, and why not lookups.
    Dump { why: String },
}

/// The operator's choice (`--conntrack-ask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskWith {
    /// Lookups, or the dump when the kernel cannot do them.
    Lookup,
    /// Always the dump: for nodes whose conntrack uses zones other than the
    /// default (the lookup asks the default zone only).
    Dump,
}

impl std::str::FromStr for AskWith {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lookup" => Ok(AskWith::Lookup),
            "dump" => Ok(AskWith::Dump),
            other => Err(format!(
                "unknown conntrack question method {other:?}: expected lookup or dump"
            )),
        }
    }
}

impl Asking {
    pub fn with(choice: AskWith) -> Asking {
        match choice {
            AskWith::Lookup => Asking::best(),
            AskWith::Dump => Asking::Dump {
                why: "--conntrack-ask=dump".to_string(),
            },
        }
    }

    /// Lookups when the kernel allows them, else the dump (and why).
    pub fn best() -> Asking {
        match KernelLookup::load() {
            Ok(l) => Asking::Lookup(l),
            Err(why) => Asking::Dump {
                why: why.to_string(),
            },
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Asking::Lookup(_) => "kernel lookup".to_string(),
            Asking::Dump { why } => format!("netlink dump ({why})"),
        }
    }
}

/// Both conntrack maps, as pinned by the datapath.
pub struct Conntrack {
    pub v4: HashMap<MapData, Ct4Key, CtValue>,
    pub v6: HashMap<MapData, CtKey, CtValue>,
    /// Whether a pass of this process has found an entry in the kernel's
    /// table: only then does an unexplained eBPF entry mean a dead flow
    /// (see [`SKIPPED_KERNEL_TRACKS_NOTHING`]).
    pub kernel_seen_tracking: bool,
    pub asking: Asking,
    /// Each endpoint hook's count of the entries it holds.
    pub shares: Shares,
}

impl Conntrack {
    /// Writes an entry into the map of its family (tests, benchmarks).
    pub fn insert(&mut self, key: CtKey, value: CtValue) -> Result<(), ConntrackError> {
        match Ct4Key::of(&key) {
            Some(k4) => self.v4.insert(k4, value, 0),
            None => self.v6.insert(key, value, 0),
        }
        .map_err(ConntrackError::Write)
    }

    /// Every entry's key, IPv4 ones widened to [`CtKey`].
    pub fn keys(&self) -> Result<Vec<CtKey>, ConntrackError> {
        let mut out = Vec::new();
        let (fd4, fd6) = self.fds();
        batch::read_all::<Ct4Key, CtValue>(fd4, |keys, _| {
            out.extend(keys.iter().map(Ct4Key::widen))
        })?;
        batch::read_all::<CtKey, CtValue>(fd6, |keys, _| out.extend_from_slice(keys))?;
        Ok(out)
    }

    fn fds(&self) -> (RawFd, RawFd) {
        (
            self.v4.map().fd().as_fd().as_raw_fd(),
            self.v6.map().fd().as_fd().as_raw_fd(),
        )
    }
}

fn open_map<K: aya::Pod>(
    pin_root: &Path,
    name: &str,
) -> Result<HashMap<MapData, K, CtValue>, ConntrackError> {
    let path = pin_root.join(name);
    let failed = ConntrackError::pin(&path);
    let data = MapData::from_pin(&path).map_err(&failed)?;
    let map = Map::from_map_data(data).map_err(&failed)?;
    HashMap::try_from(map).map_err(&failed)
}

/// Opens the pinned maps; passes will ask the kernel by `asking`.
pub fn open(pin_root: &Path, asking: Asking) -> Result<Conntrack, ConntrackError> {
    Ok(Conntrack {
        v4: open_map(pin_root, MAP_CT4)?,
        v6: open_map(pin_root, MAP_CONNTRACK)?,
        kernel_seen_tracking: false,
        asking,
        shares: Shares::open(pin_root)?,
    })
}

/// How many entries the kernel's table holds now (a capacity hint; 0 when
/// unknown).
fn kernel_count_hint() -> usize {
    std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Where a chunk's answers come from.
enum Kernel<'a> {
    /// A dump read before the maps.
    Snapshot(&'a Explained),
    /// A lookup per idle entry, as the chunk is judged.
    Lookup(&'a mut KernelLookup),
}

/// An entry the lookup could not ask about, judged after the maps are read.
struct Deferred {
    key: CtKey,
    value: CtValue,
}

/// The judgement of one map's entries, chunk by chunk.
struct Judge<'a> {
    started: u64,
    kernel: Kernel<'a>,
    listing: Listing,
    entries: usize,
    removed: usize,
    /// Idle entries the kernel refused to answer for (kept), and the last
    /// errno it gave.
    refused: usize,
    refused_errno: u8,
    /// Did a lookup find a kernel entry?
    found_any: bool,
    /// Entries the lookup cannot take are judged (by a dump) only once idle
    /// this long: before, a kernel entry of theirs almost surely still
    /// lives, and a dump costs a walk of the kernel's whole table.
    unasked_min_idle_ns: u64,
    /// Entries kept unjudged for that reason.
    held: usize,
    deferred: Vec<Deferred>,
    error: Option<ConntrackError>,
    /// False: judge and list, remove nothing (see [`SKIPPED_KERNEL_TRACKS_NOTHING`]).
    remove: bool,
    /// Entries the pass leaves, by (ifindex, hook).
    kept: std::collections::HashMap<(u32, u8), u64>,
}

impl Judge<'_> {
    /// Judges one chunk as it is read and removes its stale entries at once
    /// (a few milliseconds after reading them: a packet in between refreshes
    /// an entry that is then removed, and its flow's next packet is judged by
    /// policy again, as after any removal).
    fn chunk<K: aya::Pod>(
        &mut self,
        fd: RawFd,
        keys: &[K],
        values: &[CtValue],
        widen: impl Fn(&K) -> CtKey,
        scratch: &mut Scratch<K>,
    ) {
        let Scratch {
            wide,
            tuples,
            explained,
            stale_keys,
            asked,
            questions,
            answers,
        } = scratch;
        wide.clear();
        wide.extend(keys.iter().map(widen));
        tuples.clear();
        tuples.extend(wide.iter().map(tuple_of));
        // false: judged after the maps are read, against a dump.
        let mut judged = vec![true; keys.len()];
        match &mut self.kernel {
            Kernel::Snapshot(set) => set.explains_each(tuples, explained),
            Kernel::Lookup(lookup) => {
                // Only idle entries need an answer: a used one stays anyway.
                explained.clear();
                explained.resize(keys.len(), true);
                asked.clear();
                questions.clear();
                for (i, v) in values.iter().enumerate() {
                    if v.last_seen_ns < self.started {
                        asked.push(i);
                        questions.push(tuples[i]);
                    }
                }
                if let Err(e) = lookup.ask(questions, answers) {
                    // Unanswered: keep the chunk, report the pass failed.
                    self.error.get_or_insert(e.into());
                    answers.clear();
                    answers.resize(questions.len(), Answer::Refused(0));
                }
                for (&i, answer) in asked.iter().zip(answers.iter()) {
                    match answer {
                        Answer::Found => self.found_any = true,
                        Answer::Absent => explained[i] = false,
                        Answer::Refused(errno) => {
                            self.refused += 1;
                            self.refused_errno = *errno;
                        }
                        Answer::NotAsked
                            if self.started - values[i].last_seen_ns < self.unasked_min_idle_ns =>
                        {
                            self.held += 1;
                        }
                        Answer::NotAsked => {
                            judged[i] = false;
                            self.deferred.push(Deferred {
                                key: wide[i],
                                value: values[i],
                            });
                        }
                    }
                }
            }
        }
        stale_keys.clear();
        for (i, v) in values.iter().enumerate() {
            if !judged[i] {
                continue;
            }
            let is_stale = idle_and_unexplained(v.last_seen_ns, self.started, explained[i]);
            self.entries += 1;
            self.listing
                .offer(&wide[i], tuples[i], v, self.started, is_stale);
            if is_stale && self.remove {
                stale_keys.push(keys[i]);
            } else {
                *self
                    .kept
                    .entry((wide[i].ifindex, wide[i].hook))
                    .or_default() += 1;
            }
        }
        self.delete(fd, stale_keys);
    }

    fn delete<K: aya::Pod>(&mut self, fd: RawFd, stale_keys: &[K]) {
        if stale_keys.is_empty() || self.error.is_some() {
            return;
        }
        match batch::delete_all(fd, stale_keys) {
            Ok(n) => self.removed += n,
            Err(e) => self.error = Some(e.into()),
        }
    }

    /// Judges the entries the lookup could not ask about against `set`,
    /// a dump taken after they were read.
    fn deferred(&mut self, set: &Explained, fd4: RawFd, fd6: RawFd) {
        let deferred = std::mem::take(&mut self.deferred);
        let mut stale4 = Vec::new();
        let mut stale6 = Vec::new();
        for d in &deferred {
            let t = tuple_of(&d.key);
            let is_stale = super::stale(&t, d.value.last_seen_ns, self.started, set);
            self.entries += 1;
            self.listing
                .offer(&d.key, t, &d.value, self.started, is_stale);
            if is_stale && self.remove {
                match Ct4Key::of(&d.key) {
                    Some(k4) => stale4.push(k4),
                    None => stale6.push(d.key),
                }
            } else {
                *self.kept.entry((d.key.ifindex, d.key.hook)).or_default() += 1;
            }
        }
        self.delete(fd4, &stale4);
        self.delete(fd6, &stale6);
    }
}

/// Buffers one chunk's judgement reuses, so a pass allocates them once.
struct Scratch<K> {
    wide: Vec<CtKey>,
    tuples: Vec<Tuple>,
    explained: Vec<bool>,
    stale_keys: Vec<K>,
    /// Indices of the chunk's entries asked about, their flows, and the
    /// kernel's answers.
    asked: Vec<usize>,
    questions: Vec<Tuple>,
    answers: Vec<Answer>,
}

impl<K> Scratch<K> {
    fn new() -> Self {
        Scratch {
            wide: Vec::with_capacity(batch::CHUNK),
            tuples: Vec::with_capacity(batch::CHUNK),
            explained: Vec::with_capacity(batch::CHUNK),
            stale_keys: Vec::with_capacity(batch::CHUNK),
            asked: Vec::with_capacity(batch::CHUNK),
            questions: Vec::with_capacity(batch::CHUNK),
            answers: Vec::with_capacity(batch::CHUNK),
        }
    }
}

/// How long an entry the lookup cannot take must have been idle before a
/// pass dumps the kernel's table to judge it: the kernel's ICMP timeout
/// (ICMP is most of them), which a kernel entry outlives only if packets
/// refresh it, and each of those refreshes the eBPF entry too. Read from
/// the current namespace; 30 s (the kernel's default) when unreadable.
fn unasked_min_idle_ns() -> u64 {
    std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_icmp_timeout")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(30)
        .saturating_mul(1_000_000_000)
}

/// Most protocols the lookup cannot take that a pass dumps one by one;
/// beyond, one dump of everything costs less than a walk per protocol.
const MAX_FILTERED_DUMPS: usize = 2;

/// Reads the kernel's whole table into a set of explained flows.
fn dump_explained() -> Result<(Explained, usize), ConntrackError> {
    let hint = kernel_count_hint();
    let mut collecting = Explained::collect(hint + hint / 8);
    let n = kernel::dump(|orig, reply| collecting.add(orig, reply))?;
    Ok((collecting.done(), n))
}

/// Runs one pass. The kernel is asked in the caller's network namespace
/// (the node's).
pub fn sweep(maps: &mut Conntrack) -> Result<Report, ConntrackError> {
    let begun = Instant::now();
    // Taken before anything is read: an entry refreshed after this instant
    // belongs to a live (or reused) flow and survives.
    let started = monotonic_ns();
    let asked_by = maps.asking.describe();
    let mut dumped = matches!(maps.asking, Asking::Dump { .. });
    let (fd4, fd6) = maps.fds();
    let shares_before = maps.shares.before();
    let snapshot;
    let (kernel, mut kernel_entries) = match &mut maps.asking {
        Asking::Dump { .. } => {
            let (set, n) = dump_explained()?;
            snapshot = set;
            (Kernel::Snapshot(&snapshot), n)
        }
        // The count is the namespace's own (a per-namespace sysctl).
        Asking::Lookup(lookup) => (Kernel::Lookup(lookup), kernel_count_hint()),
    };
    maps.kernel_seen_tracking |= kernel_entries > 0;
    let mut judge = Judge {
        started,
        kernel,
        listing: Listing::default(),
        entries: 0,
        removed: 0,
        refused: 0,
        refused_errno: 0,
        found_any: false,
        unasked_min_idle_ns: unasked_min_idle_ns(),
        held: 0,
        deferred: Vec::new(),
        error: None,
        remove: maps.kernel_seen_tracking,
        kept: std::collections::HashMap::new(),
    };
    let mut scratch4 = Scratch::<Ct4Key>::new();
    batch::read_all::<Ct4Key, CtValue>(fd4, |keys, values| {
        judge.chunk(fd4, keys, values, Ct4Key::widen, &mut scratch4)
    })?;
    let mut scratch6 = Scratch::<CtKey>::new();
    batch::read_all::<CtKey, CtValue>(fd6, |keys, values| {
        judge.chunk(fd6, keys, values, |k| *k, &mut scratch6)
    })?;
    let mut asked_by = asked_by;
    if !judge.deferred.is_empty() {
        dumped = true;
        // (IPv6, protocol) of each kind of deferred entry.
        let mut protos: Vec<(bool, u8)> = judge
            .deferred
            .iter()
            .map(|d| (Ct4Key::of(&d.key).is_none(), d.key.proto))
            .collect();
        protos.sort_unstable();
        protos.dedup();
        let set = if protos.len() <= MAX_FILTERED_DUMPS {
            // The kernel skips other protocols' entries before building a
            // message for them: a walk of its table per protocol instead
            // of a message per entry.
            let mut collecting = Explained::collect(judge.deferred.len());
            for &(v6, p) in &protos {
                kernel::dump_protocol(v6, p, |orig, reply| {
                    if orig.proto == p {
                        collecting.add(orig, reply)
                    }
                })?;
            }
            asked_by = format!(
                "{asked_by}, and a netlink dump of {} for {} entries the lookup does not take",
                protos
                    .iter()
                    .map(|(v6, p)| format!("IPv{} protocol {p}", if *v6 { 6 } else { 4 }))
                    .collect::<Vec<_>>()
                    .join(" and "),
                judge.deferred.len()
            );
            collecting.done()
        } else {
            let (set, n) = dump_explained()?;
            kernel_entries = n;
            asked_by = format!(
                "{asked_by}, and a netlink dump for {} entries of protocols the lookup does not take",
                judge.deferred.len()
            );
            set
        };
        judge.deferred(&set, fd4, fd6);
    }
    if judge.held > 0 {
        asked_by = format!(
            "{asked_by}; {} entries the lookup does not take kept unjudged (idle less than {} s)",
            judge.held,
            judge.unasked_min_idle_ns / 1_000_000_000
        );
    }
    maps.kernel_seen_tracking |= judge.found_any || kernel_entries > 0;
    if let Some(e) = judge.error {
        return Err(e);
    }
    let shares_corrected = maps.shares.correct(&shares_before, &judge.kept);
    let kernel_tracks = judge.remove;
    let mut skipped = Vec::new();
    if !kernel_tracks && judge.entries > 0 {
        skipped.push(SKIPPED_KERNEL_TRACKS_NOTHING.to_string());
    }
    if judge.refused > 0 {
        skipped.push(format!(
            "the kernel refused to look up {} idle entries ({}): they are kept",
            judge.refused,
            std::io::Error::from_raw_os_error(i32::from(judge.refused_errno))
        ));
    }
    Ok(Report {
        entries: judge.entries,
        kernel_entries,
        kept: judge.entries - judge.removed,
        removed: judge.removed,
        took: begun.elapsed(),
        finished_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        skipped: skipped.join("; "),
        asked_by,
        dumped,
        listed: judge.listing.into_sorted(),
        shares_corrected,
    })
}
