//! One cleanup pass over the eBPF conntrack map: read the kernel's table,
//! then remove the eBPF entries nothing explains and nobody used since the
//! pass began. Runs on its own thread: it touches only the conntrack map,
//! never the policy tables the reconciler owns.

use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{HashMap, Map, MapData};
use palisade_ebpf::{CtKey, CtValue, MAP_CONNTRACK};

use super::{kernel, monotonic_ns, stale, Explained, Tuple};

/// What one pass did, for the state dump and metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// eBPF entries found.
    pub entries: usize,
    pub kernel_entries: usize,
    pub kept: usize,
    pub removed: usize,
    pub took: Duration,
    /// When it finished, Unix time in milliseconds.
    pub finished_unix_ms: u64,
}

pub fn tuple_of(k: &CtKey) -> Tuple {
    Tuple {
        src: k.src,
        dst: k.dst,
        sport: u16::from_be(k.sport),
        dport: u16::from_be(k.dport),
        proto: k.proto,
    }
}

pub fn open(pin_root: &Path) -> Result<HashMap<MapData, CtKey, CtValue>, String> {
    let path = pin_root.join(MAP_CONNTRACK);
    let data = MapData::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let map = Map::from_map_data(data).map_err(|e| format!("{}: {e}", path.display()))?;
    HashMap::try_from(map).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs one pass. The kernel's table is read in the caller's network
/// namespace (the node's).
pub fn sweep(map: &mut HashMap<MapData, CtKey, CtValue>) -> Result<Report, String> {
    let begun = Instant::now();
    // Taken before anything is read: an entry refreshed after this instant
    // belongs to a live (or reused) flow and survives.
    let started = monotonic_ns();
    let mut explained = Explained::with_capacity(map.keys().count());
    let kernel_entries = kernel::dump(|orig, reply| explained.add(orig, reply))?;
    let mut entries = 0;
    let mut candidates: Vec<CtKey> = Vec::new();
    for item in map.iter() {
        let Ok((k, v)) = item else {
            // Removed under us (LRU eviction, a program's delete): nothing
            // to judge.
            continue;
        };
        entries += 1;
        if stale(&tuple_of(&k), v.last_seen_ns, started, &explained) {
            candidates.push(k);
        }
    }
    let mut removed = 0;
    for k in candidates {
        // Look again right before removing: a packet may have used it since.
        if matches!(map.get(&k, 0), Ok(v) if v.last_seen_ns < started) && map.remove(&k).is_ok() {
            removed += 1;
        }
    }
    Ok(Report {
        entries,
        kernel_entries,
        kept: entries - removed,
        removed,
        took: begun.elapsed(),
        finished_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    })
}
