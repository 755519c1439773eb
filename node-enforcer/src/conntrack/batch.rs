//! Whole-map reads and bulk deletes of the eBPF conntrack maps a few
//! thousand entries per syscall (BPF_MAP_LOOKUP_BATCH, BPF_MAP_DELETE_BATCH):
//! per-key iteration costs two syscalls per entry, seconds of CPU at a
//! million entries. Both fall back to per-key calls on kernels without them.

use std::os::fd::RawFd;

use crate::sys_bpf::{self, cmd};

/// Entries per batch syscall.
pub const CHUNK: usize = 4096;

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

/// The element member of `union bpf_attr` (lookup, delete, next key).
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value_or_next: u64,
    flags: u64,
}

/// bpf(2) on a map with one of the members above; the errno if it failed.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> Result<(), i32> {
    // SAFETY: `attr` is a bpf_attr member laid out above whose pointers
    // reference buffers of the sizes the map's key and value need (checked
    // by the callers' types).
    unsafe { sys_bpf::call(cmd, attr) }
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

fn unsupported(errno: i32) -> bool {
    errno == libc::EINVAL || errno == libc::ENOTSUP || errno == 524 /* ENOTSUPP */
}

/// A bpf() call on a conntrack map failed: what was being done, and the
/// errno.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct BatchError {
    pub what: &'static str,
    #[source]
    pub source: std::io::Error,
}

fn io(what: &'static str, errno: i32) -> BatchError {
    BatchError {
        what,
        source: std::io::Error::from_raw_os_error(errno),
    }
}

/// Calls `each` with every (key, value) of the map, a chunk at a time.
/// `K` and `V` must be the map's key and value types (plain old data).
pub fn read_all<K: aya::Pod + Default, V: aya::Pod + Default>(
    fd: RawFd,
    mut each: impl FnMut(&[K], &[V]),
) -> Result<(), BatchError> {
    let mut keys = vec![K::default(); CHUNK];
    let mut values = vec![V::default(); CHUNK];
    // The resume token is opaque (a bucket index for hash maps); a key's
    // size is always enough.
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
        let r = bpf(cmd::MAP_LOOKUP_BATCH, &mut attr);
        match r {
            Err(e) if first && unsupported(e) => return read_one_by_one(fd, each),
            Err(e) if e != libc::ENOENT => return Err(io("reading a conntrack map", e)),
            _ => {}
        }
        let n = (attr.count as usize).min(CHUNK);
        each(&keys[..n], &values[..n]);
        if r.is_err() {
            // ENOENT: that was the last chunk.
            return Ok(());
        }
        token[0] = token[1];
        first = false;
    }
}

fn read_one_by_one<K: aya::Pod + Default, V: aya::Pod + Default>(
    fd: RawFd,
    mut each: impl FnMut(&[K], &[V]),
) -> Result<(), BatchError> {
    let mut key = K::default();
    let mut next = K::default();
    let mut value = V::default();
    let mut first = true;
    loop {
        let mut attr = ElemAttr {
            map_fd: fd as u32,
            pad: 0,
            key: if first { 0 } else { &key as *const K as u64 },
            value_or_next: &mut next as *mut K as u64,
            flags: 0,
        };
        match bpf(cmd::MAP_GET_NEXT_KEY, &mut attr) {
            Err(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(io("iterating a conntrack map", e)),
            Ok(()) => {}
        }
        first = false;
        key = next;
        let mut attr = ElemAttr {
            map_fd: fd as u32,
            pad: 0,
            key: &key as *const K as u64,
            value_or_next: &mut value as *mut V as u64,
            flags: 0,
        };
        match bpf(cmd::MAP_LOOKUP_ELEM, &mut attr) {
            // Removed under us (LRU eviction, a program's delete): nothing
            // to report.
            Err(libc::ENOENT) => {}
            Err(e) => return Err(io("reading a conntrack map", e)),
            Ok(()) => each(std::slice::from_ref(&key), std::slice::from_ref(&value)),
        }
    }
}

/// Deletes `keys` from the map; keys already gone are not errors. Returns
/// how many were deleted.
pub fn delete_all<K: aya::Pod>(fd: RawFd, keys: &[K]) -> Result<usize, BatchError> {
    let mut deleted = 0;
    let mut rest = keys;
    while !rest.is_empty() {
        let n = rest.len().min(CHUNK);
        let mut attr = BatchAttr {
            in_batch: 0,
            out_batch: 0,
            keys: rest.as_ptr() as u64,
            values: 0,
            count: n as u32,
            map_fd: fd as u32,
            elem_flags: 0,
            flags: 0,
        };
        match bpf(cmd::MAP_DELETE_BATCH, &mut attr) {
            Ok(()) => {
                deleted += n;
                rest = &rest[n..];
            }
            // A batch stops at the first key that is gone (attr.count says
            // how many went before it): skip that one and carry on.
            Err(libc::ENOENT) => {
                let done = (attr.count as usize).min(n);
                deleted += done;
                rest = &rest[(done + 1).min(rest.len())..];
            }
            Err(e) if unsupported(e) => return delete_one_by_one(fd, rest).map(|d| deleted + d),
            Err(e) => return Err(io("deleting conntrack entries", e)),
        }
    }
    Ok(deleted)
}

fn delete_one_by_one<K: aya::Pod>(fd: RawFd, keys: &[K]) -> Result<usize, BatchError> {
    let mut deleted = 0;
    for key in keys {
        let mut attr = ElemAttr {
            map_fd: fd as u32,
            pad: 0,
            key: key as *const K as u64,
            value_or_next: 0,
            flags: 0,
        };
        match bpf(cmd::MAP_DELETE_ELEM, &mut attr) {
            Ok(()) => deleted += 1,
            Err(libc::ENOENT) => {}
            Err(e) => return Err(io("deleting a conntrack entry", e)),
        }
    }
    Ok(deleted)
}
