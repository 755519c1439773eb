//! The enforcer's eBPF conntrack as the kernel holds it: the pinned map read
//! with plain bpf(2) calls, so tests see the entries themselves and not the
//! enforcer's account of them.
//!
//! The layout is the datapath's `struct ct_key` / `struct ct_value`
//! (ebpf/c/palisade.h): addresses as 16 bytes (IPv4-mapped), ports in
//! network order, the interface and hook that wrote the entry; the value's
//! last-seen time and epoch. The map's key and value sizes are checked
//! against it before anything is decoded.

use std::ffi::CString;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The map's pin name under the enforcer's pin root.
/// IPv6 flows (and, from older datapaths, IPv4 ones), 16-byte addresses.
pub const MAP_NAME: &str = "pal_conntrack";
/// IPv4 flows, 4-byte addresses.
pub const MAP4_NAME: &str = "pal_ct4";
const KEY_SIZE: usize = 44;
const KEY4_SIZE: usize = 20;
const VALUE_SIZE: usize = 16;

/// Which hook of the interface wrote the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Traffic leaving the pod (its egress).
    FromPod,
    /// Traffic entering the pod (its ingress).
    ToPod,
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: u8,
    pub ifindex: u32,
    pub hook: Hook,
    pub last_seen_ns: u64,
    pub epoch: u32,
}

impl Entry {
    /// The flow and the hook, without what changes as packets pass.
    pub fn identity(&self) -> (IpAddr, u16, IpAddr, u16, u8, u32, Hook) {
        (
            self.src,
            self.sport,
            self.dst,
            self.dport,
            self.proto,
            self.ifindex,
            self.hook,
        )
    }

    /// Whether the entry is of a flow with this endpoint on either side.
    pub fn involves(&self, ip: IpAddr, port: u16) -> bool {
        (self.src == ip && self.sport == port) || (self.dst == ip && self.dport == port)
    }

    fn decode4(k: &[u8], v: &[u8]) -> Self {
        let addr = |b: &[u8]| IpAddr::from(<[u8; 4]>::try_from(b).expect("4 bytes"));
        let u16be = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
        Entry {
            src: addr(&k[0..4]),
            dst: addr(&k[4..8]),
            sport: u16be(&k[8..10]),
            dport: u16be(&k[10..12]),
            ifindex: u32::from_ne_bytes(k[12..16].try_into().expect("4 bytes")),
            proto: k[16],
            hook: match k[17] {
                0 => Hook::FromPod,
                1 => Hook::ToPod,
                o => Hook::Other(o),
            },
            last_seen_ns: u64::from_ne_bytes(v[0..8].try_into().expect("8 bytes")),
            epoch: u32::from_ne_bytes(v[8..12].try_into().expect("4 bytes")),
        }
    }

    fn decode(k: &[u8], v: &[u8]) -> Self {
        let addr = |b: &[u8]| {
            let a = Ipv6Addr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
            a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(a))
        };
        let u16be = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
        Entry {
            src: addr(&k[0..16]),
            dst: addr(&k[16..32]),
            sport: u16be(&k[32..34]),
            dport: u16be(&k[34..36]),
            ifindex: u32::from_ne_bytes(k[36..40].try_into().expect("4 bytes")),
            proto: k[40],
            hook: match k[41] {
                0 => Hook::FromPod,
                1 => Hook::ToPod,
                o => Hook::Other(o),
            },
            last_seen_ns: u64::from_ne_bytes(v[0..8].try_into().expect("8 bytes")),
            epoch: u32::from_ne_bytes(v[8..12].try_into().expect("4 bytes")),
        }
    }
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_F_RDONLY: u32 = 1 << 3;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a live, correctly laid out bpf_attr member of its
    // true size; the kernel reads and writes only within it and the
    // buffers it points to, which the callers keep alive.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[repr(C)]
struct ObjGet {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value_or_next: u64,
    flags: u64,
}

/// Every entry of the conntrack maps (IPv4 and IPv6) pinned under `pin_root`.
pub fn read(pin_root: &Path) -> Result<Vec<Entry>> {
    let mut entries = read_map(&pin_root.join(MAP4_NAME), KEY4_SIZE, Entry::decode4)?;
    entries.extend(read_map(&pin_root.join(MAP_NAME), KEY_SIZE, Entry::decode)?);
    Ok(entries)
}

fn read_map(path: &Path, key_len: usize, decode: fn(&[u8], &[u8]) -> Entry) -> Result<Vec<Entry>> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    let mut get = ObjGet {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: BPF_F_RDONLY,
    };
    let fd = bpf(BPF_OBJ_GET, &mut get).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: BPF_OBJ_GET returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = [0u32; 20];
    let mut by_fd = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut by_fd).context("reading the conntrack map's info")?;
    // struct bpf_map_info: type, id, key_size, value_size, ...
    let (key_size, value_size) = (info[2] as usize, info[3] as usize);
    if (key_size, value_size) != (key_len, VALUE_SIZE) {
        bail!(
            "{}: key/value sizes {key_size}/{value_size}, the lab decodes {key_len}/{VALUE_SIZE}: the datapath's layout changed",
            path.display()
        );
    }
    let mut entries = Vec::new();
    let mut key = vec![0u8; key_len];
    let mut next = vec![0u8; key_len];
    let mut first = true;
    loop {
        let mut attr = ElemAttr {
            map_fd: fd.as_raw_fd() as u32,
            pad: 0,
            // A null key asks for the first one.
            key: if first { 0 } else { key.as_ptr() as u64 },
            value_or_next: next.as_mut_ptr() as u64,
            flags: 0,
        };
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e).context("iterating the conntrack map"),
        }
        first = false;
        key.copy_from_slice(&next);
        let mut value = [0u8; VALUE_SIZE];
        let mut attr = ElemAttr {
            map_fd: fd.as_raw_fd() as u32,
            pad: 0,
            key: key.as_ptr() as u64,
            value_or_next: value.as_mut_ptr() as u64,
            flags: 0,
        };
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(_) => entries.push(decode(&key, &value)),
            // Removed between the two calls (a cleanup, LRU eviction).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e).context("reading a conntrack entry"),
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_datapath_layout() {
        let mut k = [0u8; KEY_SIZE];
        k[10] = 0xff;
        k[11] = 0xff;
        k[12..16].copy_from_slice(&[10, 244, 0, 2]);
        k[26] = 0xff;
        k[27] = 0xff;
        k[28..32].copy_from_slice(&[10, 96, 0, 10]);
        k[32..34].copy_from_slice(&40000u16.to_be_bytes());
        k[34..36].copy_from_slice(&80u16.to_be_bytes());
        k[36..40].copy_from_slice(&7u32.to_ne_bytes());
        k[40] = 6;
        k[41] = 1;
        let mut v = [0u8; VALUE_SIZE];
        v[0..8].copy_from_slice(&123u64.to_ne_bytes());
        v[8..12].copy_from_slice(&5u32.to_ne_bytes());
        let e = Entry::decode(&k, &v);
        assert_eq!(e.src, IpAddr::from([10, 244, 0, 2]));
        assert_eq!(e.dst, IpAddr::from([10, 96, 0, 10]));
        assert_eq!((e.sport, e.dport, e.proto, e.ifindex), (40000, 80, 6, 7));
        assert_eq!((e.hook, e.last_seen_ns, e.epoch), (Hook::ToPod, 123, 5));
        assert!(e.involves(IpAddr::from([10, 244, 0, 2]), 40000));
    }

    #[test]
    fn decodes_the_ipv4_layout() {
        let mut k = [0u8; KEY4_SIZE];
        k[0..4].copy_from_slice(&[10, 244, 0, 2]);
        k[4..8].copy_from_slice(&[10, 96, 0, 10]);
        k[8..10].copy_from_slice(&40000u16.to_be_bytes());
        k[10..12].copy_from_slice(&80u16.to_be_bytes());
        k[12..16].copy_from_slice(&7u32.to_ne_bytes());
        k[16] = 6;
        k[17] = 1;
        let mut v = [0u8; VALUE_SIZE];
        v[8..12].copy_from_slice(&3u32.to_ne_bytes());
        let e = Entry::decode4(&k, &v);
        assert_eq!(e.src, IpAddr::from([10, 244, 0, 2]));
        assert_eq!(e.dst, IpAddr::from([10, 96, 0, 10]));
        assert_eq!(
            (e.sport, e.dport, e.ifindex, e.proto, e.epoch),
            (40000, 80, 7, 6, 3)
        );
        assert_eq!(e.hook, Hook::ToPod);
    }
}
