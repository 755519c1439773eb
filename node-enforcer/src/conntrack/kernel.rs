//! Reads the kernel's conntrack table of the current network namespace over
//! nfnetlink (what `conntrack -L` does), one entry at a time: the caller sees
//! each entry's original and reply tuples and keeps only what it needs, so a
//! million entries cost no more memory than the caller's own set.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::Tuple;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// Why the kernel's conntrack table could not be read or written over
/// netlink.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// A socket call failed: what was being done, and the errno.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The kernel answered the dump with an error.
    #[error("conntrack dump: {0}")]
    Refused(#[source] std::io::Error),
    #[error("malformed netlink message of {0} bytes")]
    Malformed(usize),
}

fn io(what: &'static str) -> NetlinkError {
    NetlinkError::Io {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Calls `each(original, reply)` for every entry of the kernel's table.
/// Returns how many entries were read.
pub fn dump(each: impl FnMut(&Tuple, &Tuple)) -> Result<usize, NetlinkError> {
    dump_where(0, None, each)
}

/// [`dump`] of the entries of one family (IPv6 when `v6`) and protocol (by
/// the original tuple's). The kernel filters before it builds a message
/// (CTA_FILTER, Linux 5.8; it takes a protocol only with a family), so its
/// walk of the table is the cost, not a message per entry. A kernel without
/// the filter sends every entry, which only costs time: the caller must not
/// rely on getting that protocol alone.
pub fn dump_protocol(
    v6: bool,
    proto: u8,
    each: impl FnMut(&Tuple, &Tuple),
) -> Result<usize, NetlinkError> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
    dump_where(family, Some(proto), each)
}

const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
/// CTA_FILTER_FLAG(CTA_PROTO_NUM).
const CTA_FILTER_F_PROTO_NUM: u32 = 1 << 3;

fn dump_request(family: u8, proto: Option<u8>) -> Vec<u8> {
    let mut req = Vec::with_capacity(64);
    req.extend_from_slice(&[0; 4]);
    let kind = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
    req.extend_from_slice(&kind.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family (0 dumps every family), version 0, res_id 0.
    req.extend_from_slice(&[family, 0, 0, 0]);
    if let Some(proto) = proto {
        put_nested(&mut req, CTA_TUPLE_ORIG, |b| {
            put_nested(b, CTA_TUPLE_PROTO, |b| put_attr(b, CTA_PROTO_NUM, &[proto]));
        });
        put_nested(&mut req, CTA_FILTER, |b| {
            put_attr(
                b,
                CTA_FILTER_ORIG_FLAGS,
                &CTA_FILTER_F_PROTO_NUM.to_ne_bytes(),
            );
            put_attr(b, CTA_FILTER_REPLY_FLAGS, &0u32.to_ne_bytes());
        });
    }
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req
}

fn dump_where(
    family: u8,
    proto: Option<u8>,
    mut each: impl FnMut(&Tuple, &Tuple),
) -> Result<usize, NetlinkError> {
    // SAFETY: a netlink socket owned at once; buffers below are owned and
    // their lengths passed exactly.
    let fd = unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        );
        if fd < 0 {
            return Err(io("opening a netfilter netlink socket"));
        }
        OwnedFd::from_raw_fd(fd)
    };
    let req = dump_request(family, proto);
    if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io("asking for the conntrack table"));
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut count = 0;
    loop {
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io("reading the conntrack table"));
        }
        let mut msgs = &buf[..n as usize];
        while msgs.len() >= 16 {
            let len = u32::from_ne_bytes(msgs[0..4].try_into().expect("4")) as usize;
            let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
            if len < 16 || len > msgs.len() {
                return Err(NetlinkError::Malformed(len));
            }
            match kind {
                NLMSG_DONE => return Ok(count),
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(msgs[16..20].try_into().expect("4"));
                    if errno != 0 {
                        return Err(NetlinkError::Refused(std::io::Error::from_raw_os_error(
                            -errno,
                        )));
                    }
                }
                _ => {
                    // nlmsghdr (16) + nfgenmsg (4), then attributes.
                    if let Some((orig, reply)) = entry(&msgs[20.min(len)..len]) {
                        each(&orig, &reply);
                        count += 1;
                    }
                }
            }
            msgs = &msgs[((len + 3) & !3).min(msgs.len())..];
        }
    }
}

/// Attributes of one level: (type, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((kind, payload))
    })
}

fn entry(b: &[u8]) -> Option<(Tuple, Tuple)> {
    let (mut orig, mut reply) = (None, None);
    for (kind, payload) in attrs(b) {
        match kind {
            CTA_TUPLE_ORIG => orig = tuple(payload),
            CTA_TUPLE_REPLY => reply = tuple(payload),
            _ => {}
        }
    }
    Some((orig?, reply?))
}

fn v4_mapped(a: &[u8]) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    out[10] = 0xff;
    out[11] = 0xff;
    out[12..].copy_from_slice(a.get(..4)?);
    Some(out)
}

fn tuple(b: &[u8]) -> Option<Tuple> {
    let mut t = Tuple {
        src: [0; 16],
        dst: [0; 16],
        sport: 0,
        dport: 0,
        proto: 0,
    };
    let mut have_ip = false;
    for (kind, payload) in attrs(b) {
        match kind {
            CTA_TUPLE_IP => {
                for (k, p) in attrs(payload) {
                    match k {
                        CTA_IP_V4_SRC => t.src = v4_mapped(p)?,
                        CTA_IP_V4_DST => t.dst = v4_mapped(p)?,
                        CTA_IP_V6_SRC => t.src = p.get(..16)?.try_into().ok()?,
                        CTA_IP_V6_DST => t.dst = p.get(..16)?.try_into().ok()?,
                        _ => continue,
                    }
                    have_ip = true;
                }
            }
            CTA_TUPLE_PROTO => {
                for (k, p) in attrs(payload) {
                    match k {
                        CTA_PROTO_NUM => t.proto = *p.first()?,
                        CTA_PROTO_SRC_PORT => {
                            t.sport = u16::from_be_bytes(p.get(..2)?.try_into().ok()?)
                        }
                        CTA_PROTO_DST_PORT => {
                            t.dport = u16::from_be_bytes(p.get(..2)?.try_into().ok()?)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    have_ip.then_some(t)
}

const IPCTNL_MSG_CT_NEW: u16 = 0;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const CTA_TIMEOUT: u16 = 7;

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize((buf.len() + 3) & !3, 0);
}

fn put_nested(buf: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    inner(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn put_tuple(buf: &mut Vec<u8>, kind: u16, t: &Tuple) {
    put_nested(buf, kind, |b| {
        put_nested(b, CTA_TUPLE_IP, |b| {
            put_attr(b, CTA_IP_V4_SRC, &t.src[12..]);
            put_attr(b, CTA_IP_V4_DST, &t.dst[12..]);
        });
        put_nested(b, CTA_TUPLE_PROTO, |b| {
            put_attr(b, CTA_PROTO_NUM, &[t.proto]);
            put_attr(b, CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
            put_attr(b, CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
        });
    });
}

/// Creates IPv4 entries in the kernel's table of the current namespace, as
/// `conntrack -I` does, many per send. For benchmarks and tests that need a
/// large table; errors for single entries (an existing one) are ignored.
pub fn insert_v4(entries: &[(Tuple, Tuple)], timeout_secs: u32) -> Result<(), NetlinkError> {
    // SAFETY: as in `dump`.
    let fd = unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        );
        if fd < 0 {
            return Err(io("opening a netfilter netlink socket"));
        }
        OwnedFd::from_raw_fd(fd)
    };
    let mut batch = Vec::with_capacity(256 * 1024);
    let mut drain = vec![0u8; 1 << 16];
    let mut seq = 0u32;
    for chunk in entries.chunks(1024) {
        batch.clear();
        for (orig, reply) in chunk {
            seq += 1;
            let start = batch.len();
            batch.extend_from_slice(&[0; 4]);
            batch.extend_from_slice(
                &((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW).to_ne_bytes(),
            );
            batch.extend_from_slice(&(NLM_F_REQUEST | NLM_F_CREATE).to_ne_bytes());
            batch.extend_from_slice(&seq.to_ne_bytes());
            batch.extend_from_slice(&0u32.to_ne_bytes());
            batch.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
            put_tuple(&mut batch, CTA_TUPLE_ORIG, orig);
            put_tuple(&mut batch, CTA_TUPLE_REPLY, reply);
            put_attr(&mut batch, CTA_TIMEOUT, &timeout_secs.to_be_bytes());
            let len = (batch.len() - start) as u32;
            batch[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        }
        if unsafe { libc::send(fd.as_raw_fd(), batch.as_ptr().cast(), batch.len(), 0) } < 0 {
            return Err(io("creating conntrack entries"));
        }
        // Errors come back unasked; keep the receive buffer from filling.
        while unsafe {
            libc::recv(
                fd.as_raw_fd(),
                drain.as_mut_ptr().cast(),
                drain.len(),
                libc::MSG_DONTWAIT,
            )
        } > 0
        {}
    }
    Ok(())
}
