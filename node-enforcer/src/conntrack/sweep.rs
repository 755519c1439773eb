//! One cleanup pass over the eBPF conntrack maps (IPv4 and IPv6): read the
//! kernel's table, then remove the eBPF entries nothing explains and nobody
//! used since the pass began. Runs on its own thread: it touches only the
//! conntrack maps, never the policy tables the reconciler owns.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{HashMap, IterableMap, Map, MapData};
use palisade_ebpf::{Ct4Key, CtKey, CtValue, MAP_CONNTRACK, MAP_CT4};

use super::listing::{EntryView, Listing};
use super::{batch, idle_and_unexplained, kernel, monotonic_ns, Explained, Tuple};

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
    /// pass decided it could not judge (empty otherwise).
    pub skipped: String,
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

/// Both conntrack maps, as pinned by the datapath.
pub struct Conntrack {
    pub v4: HashMap<MapData, Ct4Key, CtValue>,
    pub v6: HashMap<MapData, CtKey, CtValue>,
    /// Whether a pass of this process has found an entry in the kernel's
    /// table: only then does an unexplained eBPF entry mean a dead flow
    /// (see [`SKIPPED_KERNEL_TRACKS_NOTHING`]).
    pub kernel_seen_tracking: bool,
}

impl Conntrack {
    /// Writes an entry into the map of its family (tests, benchmarks).
    pub fn insert(&mut self, key: CtKey, value: CtValue) -> Result<(), String> {
        match Ct4Key::of(&key) {
            Some(k4) => self.v4.insert(k4, value, 0),
            None => self.v6.insert(key, value, 0),
        }
        .map_err(|e| format!("writing a conntrack entry: {e}"))
    }

    /// Every entry's key, IPv4 ones widened to [`CtKey`].
    pub fn keys(&self) -> Result<Vec<CtKey>, String> {
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
) -> Result<HashMap<MapData, K, CtValue>, String> {
    let path = pin_root.join(name);
    let data = MapData::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let map = Map::from_map_data(data).map_err(|e| format!("{}: {e}", path.display()))?;
    HashMap::try_from(map).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn open(pin_root: &Path) -> Result<Conntrack, String> {
    Ok(Conntrack {
        v4: open_map(pin_root, MAP_CT4)?,
        v6: open_map(pin_root, MAP_CONNTRACK)?,
        kernel_seen_tracking: false,
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

/// The judgement of one map's entries, chunk by chunk.
struct Judge<'a> {
    started: u64,
    explained: &'a Explained,
    listing: Listing,
    entries: usize,
    removed: usize,
    error: Option<String>,
    /// False: judge and list, remove nothing (see [`SKIPPED_KERNEL_TRACKS_NOTHING`]).
    remove: bool,
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
        } = scratch;
        wide.clear();
        wide.extend(keys.iter().map(widen));
        tuples.clear();
        tuples.extend(wide.iter().map(tuple_of));
        self.explained.explains_each(tuples, explained);
        stale_keys.clear();
        for (i, v) in values.iter().enumerate() {
            let is_stale = idle_and_unexplained(v.last_seen_ns, self.started, explained[i]);
            self.entries += 1;
            self.listing
                .offer(&wide[i], tuples[i], v, self.started, is_stale);
            if is_stale && self.remove {
                stale_keys.push(keys[i]);
            }
        }
        if stale_keys.is_empty() || self.error.is_some() {
            return;
        }
        match batch::delete_all(fd, stale_keys) {
            Ok(n) => self.removed += n,
            Err(e) => self.error = Some(e),
        }
    }
}

/// Buffers one chunk's judgement reuses, so a pass allocates them once.
struct Scratch<K> {
    wide: Vec<CtKey>,
    tuples: Vec<Tuple>,
    explained: Vec<bool>,
    stale_keys: Vec<K>,
}

impl<K> Scratch<K> {
    fn new() -> Self {
        Scratch {
            wide: Vec::with_capacity(batch::CHUNK),
            tuples: Vec::with_capacity(batch::CHUNK),
            explained: Vec::with_capacity(batch::CHUNK),
            stale_keys: Vec::with_capacity(batch::CHUNK),
        }
    }
}

/// Runs one pass. The kernel's table is read in the caller's network
/// namespace (the node's).
pub fn sweep(maps: &mut Conntrack) -> Result<Report, String> {
    let begun = Instant::now();
    // Taken before anything is read: an entry refreshed after this instant
    // belongs to a live (or reused) flow and survives.
    let started = monotonic_ns();
    let hint = kernel_count_hint();
    let mut collecting = Explained::collect(hint + hint / 8);
    let kernel_entries = kernel::dump(|orig, reply| collecting.add(orig, reply))?;
    let explained = collecting.done();
    maps.kernel_seen_tracking |= kernel_entries > 0;
    let kernel_tracks = maps.kernel_seen_tracking;
    let (fd4, fd6) = maps.fds();
    let mut judge = Judge {
        started,
        explained: &explained,
        listing: Listing::default(),
        entries: 0,
        removed: 0,
        error: None,
        remove: kernel_tracks,
    };
    let mut scratch4 = Scratch::<Ct4Key>::new();
    batch::read_all::<Ct4Key, CtValue>(fd4, |keys, values| {
        judge.chunk(fd4, keys, values, Ct4Key::widen, &mut scratch4)
    })?;
    let mut scratch6 = Scratch::<CtKey>::new();
    batch::read_all::<CtKey, CtValue>(fd6, |keys, values| {
        judge.chunk(fd6, keys, values, |k| *k, &mut scratch6)
    })?;
    if let Some(e) = judge.error {
        return Err(e);
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
        skipped: if !kernel_tracks && judge.entries > 0 {
            SKIPPED_KERNEL_TRACKS_NOTHING.to_string()
        } else {
            String::new()
        },
        listed: judge.listing.into_sorted(),
    })
}
