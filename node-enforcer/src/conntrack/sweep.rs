//! One cleanup pass over the eBPF conntrack map: read the kernel's table,
//! then remove the eBPF entries nothing explains and nobody used since the
//! pass began. Runs on its own thread: it touches only the conntrack map,
//! never the policy tables the reconciler owns.

use std::path::Path;
use std::time::{Duration, Instant};

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::{HashMap, IterableMap, Map, MapData};
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
    let mut judge = |k: &CtKey, v: &CtValue| {
        entries += 1;
        if stale(&tuple_of(k), v.last_seen_ns, started, &explained) {
            candidates.push(*k);
        }
    };
    let fd = map.map().fd().as_fd().as_raw_fd();
    if !lookup_batch(fd, &mut judge)? {
        // A kernel without batch lookups: one entry at a time.
        // An entry removed under us (LRU eviction, a program's delete) has
        // nothing to judge.
        for (k, v) in map.iter().flatten() {
            judge(&k, &v);
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

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Reads the whole map a few thousand entries per syscall (two syscalls per
/// entry otherwise: 4 s of CPU at a million entries). False when the kernel
/// has no batch lookups for this map, before anything was read.
fn lookup_batch(fd: i32, f: &mut dyn FnMut(&CtKey, &CtValue)) -> Result<bool, String> {
    const CHUNK: usize = 4096;
    let mut keys = vec![CtKey::default(); CHUNK];
    let mut values = vec![CtValue::default(); CHUNK];
    // The resume token is opaque; a key's size is always enough.
    let mut token = [[0u8; 64]; 2];
    let mut first = true;
    loop {
        let (tin, tout) = token.split_at_mut(1);
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { tin[0].as_ptr() as u64 },
            out_batch: tout[0].as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: the kernel writes at most `count` keys and values into
        // buffers of that many elements, and a token into `out_batch`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let errno = (r < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        if let Some(e) = errno {
            if first && (e == libc::EINVAL || e == libc::ENOTSUP || e == 524) {
                return Ok(false);
            }
            if e != libc::ENOENT {
                return Err(format!(
                    "reading the conntrack map: {}",
                    std::io::Error::from_raw_os_error(e)
                ));
            }
        }
        let n = (attr.count as usize).min(CHUNK);
        for i in 0..n {
            f(&keys[i], &values[i]);
        }
        if errno.is_some() {
            return Ok(true);
        }
        token[0] = token[1];
        first = false;
    }
}
