//! The UDP datagram in a frame the datapath copied (Ethernet, IPv4 or
//! IPv6, UDP), with IP fragments put back together.
//!
//! An answer larger than the path's MTU (100 addresses is about 1,600
//! bytes) reaches the pod as fragments, and the datapath holds and copies
//! each of them: only the whole datagram can be read. Reassembly is
//! bounded (datagrams in progress per interface, bytes per datagram, a
//! deadline), and refuses what a receiver could read two ways: fragments
//! that overlap, or that disagree on the end.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const IPPROTO_UDP: u8 = 17;
const IPV6_FRAGMENT: u8 = 44;
/// IPv6 extension headers walked to the UDP header (hop-by-hop, routing,
/// destination options); anything else is not a datagram this reads.
const IPV6_WALKED: [u8; 3] = [0, 43, 60];
/// Extension headers walked at most, as the datapath bounds its walk.
const IPV6_EXT_MAX: usize = 8;
const UDP_HLEN: usize = 8;

/// A UDP datagram, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub payload: Vec<u8>,
}

/// Why a frame gives no datagram (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the frame ends inside its {0} header")]
    Truncated(&'static str),
    #[error("ethertype {0:#06x} is neither IPv4 nor IPv6")]
    NotIp(u16),
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    #[error("the IP header is malformed: {0}")]
    Malformed(&'static str),
    #[error("a fragment overlaps another, or disagrees on the datagram's end")]
    Overlap,
    #[error("the datagram would exceed {0} bytes")]
    TooLarge(usize),
    /// Not an error: the datagram waits for its other fragments.
    #[error("a fragment of a datagram not yet whole")]
    Incomplete,
}

/// Caps of reassembly.
#[derive(Debug, Clone, Copy)]
pub struct ReassemblyLimits {
    /// Datagrams in progress per interface; a new one beyond it replaces
    /// the oldest (which then teaches nothing: its answer passes unread).
    pub per_interface: usize,
    /// The longest datagram put together (UDP's own limit is 65,535).
    pub max_bytes: usize,
    /// A datagram whose fragments have not all come by then is dropped.
    pub timeout_ns: u64,
}

impl Default for ReassemblyLimits {
    fn default() -> Self {
        ReassemblyLimits {
            per_interface: 16,
            max_bytes: 65_535,
            timeout_ns: 2_000_000_000,
        }
    }
}

/// What identifies one IP datagram's fragments on one interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct DatagramId {
    ifindex: u32,
    src: IpAddr,
    dst: IpAddr,
    id: u32,
}

struct InProgress {
    /// (offset, bytes) of the fragmentable part, by offset.
    pieces: Vec<(usize, Vec<u8>)>,
    /// The fragmentable part's length, once the last fragment came.
    total: Option<usize>,
    deadline: u64,
    started: u64,
}

/// IP datagrams being put together, per interface.
pub struct Reassembly {
    limits: ReassemblyLimits,
    open: HashMap<DatagramId, InProgress>,
    /// Datagrams dropped unfinished: replaced by a newer one, timed out,
    /// overlapping or too large.
    pub dropped: u64,
}

/// One IP packet's fields that matter here.
struct Packet<'a> {
    src: IpAddr,
    dst: IpAddr,
    /// Fragment id, offset in bytes, more fragments; None: not a fragment.
    fragment: Option<(u32, usize, bool)>,
    /// The next protocol (of the datagram, for a fragment).
    proto: u8,
    /// What follows the IP headers (the fragmentable part for a fragment).
    body: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn ipv4(b: &[u8]) -> Result<Packet<'_>, FrameError> {
    if b.len() < 20 {
        return Err(FrameError::Truncated("IPv4"));
    }
    let ihl = usize::from(b[0] & 0x0f) * 4;
    if b[0] >> 4 != 4 || ihl < 20 {
        return Err(FrameError::Malformed("IPv4 version or header length"));
    }
    let total = usize::from(be16(b, 2));
    if total < ihl || total > b.len() {
        return Err(FrameError::Malformed("IPv4 total length"));
    }
    let flags_offset = be16(b, 6);
    let more = flags_offset & 0x2000 != 0;
    let offset = usize::from(flags_offset & 0x1fff) * 8;
    let src = IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]));
    let dst = IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19]));
    Ok(Packet {
        src,
        dst,
        fragment: (more || offset > 0).then_some((u32::from(be16(b, 4)), offset, more)),
        proto: b[9],
        body: &b[ihl..total],
    })
}

fn ipv6(b: &[u8]) -> Result<Packet<'_>, FrameError> {
    if b.len() < 40 {
        return Err(FrameError::Truncated("IPv6"));
    }
    if b[0] >> 4 != 6 {
        return Err(FrameError::Malformed("IPv6 version"));
    }
    let end = 40 + usize::from(be16(b, 4));
    if end > b.len() {
        return Err(FrameError::Malformed("IPv6 payload length"));
    }
    let addr = |at: usize| {
        IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(&b[at..at + 16]).unwrap(),
        ))
    };
    let (src, dst) = (addr(8), addr(24));
    let mut next = b[6];
    let mut at = 40;
    let mut fragment = None;
    for _ in 0..IPV6_EXT_MAX {
        if next == IPV6_FRAGMENT {
            if end < at + 8 {
                return Err(FrameError::Truncated("IPv6 fragment"));
            }
            let field = be16(b, at + 2);
            let id = u32::from_be_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
            fragment = Some((id, usize::from(field & 0xfff8), field & 1 != 0));
            next = b[at];
            at += 8;
            // What follows the fragment header is the fragmentable part.
            break;
        }
        if !IPV6_WALKED.contains(&next) {
            break;
        }
        if end < at + 2 {
            return Err(FrameError::Truncated("IPv6 extension"));
        }
        let len = (usize::from(b[at + 1]) + 1) * 8;
        next = b[at];
        at += len;
        if at > end {
            return Err(FrameError::Truncated("IPv6 extension"));
        }
    }
    if IPV6_WALKED.contains(&next) || next == IPV6_FRAGMENT {
        return Err(FrameError::Malformed("too many IPv6 extension headers"));
    }
    // A fragment with offset 0 and no more fragments is a whole datagram.
    let fragment = fragment.filter(|&(_, offset, more)| offset > 0 || more);
    Ok(Packet {
        src,
        dst,
        fragment,
        proto: next,
        body: &b[at..end],
    })
}

fn udp(src: IpAddr, dst: IpAddr, b: &[u8]) -> Result<Datagram, FrameError> {
    if b.len() < UDP_HLEN {
        return Err(FrameError::Truncated("UDP"));
    }
    let len = usize::from(be16(b, 4));
    if len < UDP_HLEN || len > b.len() {
        return Err(FrameError::Malformed("UDP length"));
    }
    Ok(Datagram {
        src: SocketAddr::new(src, be16(b, 0)),
        dst: SocketAddr::new(dst, be16(b, 2)),
        payload: b[UDP_HLEN..len].to_vec(),
    })
}

/// The frame with its UDP checksum computed, when it carries a whole UDP
/// datagram (IPv4 or IPv6 without extension headers); any other frame as
/// it is. A frame copied at the host veth may carry a partial checksum
/// (the sender's offload, finished by the device): sent again through a
/// packet socket it would reach the pod unfinished, and be dropped there.
pub fn with_udp_checksum(frame: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    if frame.len() < ETH_HLEN {
        return Cow::Borrowed(frame);
    }
    let (l4_at, pseudo): (usize, Vec<u8>) = match be16(frame, 12) {
        ETH_P_IP => {
            let ip = &frame[ETH_HLEN..];
            let Ok(p) = ipv4(ip) else {
                return Cow::Borrowed(frame);
            };
            if p.fragment.is_some() || p.proto != IPPROTO_UDP {
                return Cow::Borrowed(frame);
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let mut ph = Vec::with_capacity(12);
            ph.extend_from_slice(&ip[12..20]);
            ph.extend_from_slice(&[0, IPPROTO_UDP]);
            ph.extend_from_slice(&(p.body.len() as u16).to_be_bytes());
            (ETH_HLEN + ihl, ph)
        }
        ETH_P_IPV6 => {
            let ip = &frame[ETH_HLEN..];
            if ip.len() < 40 || ip[6] != IPPROTO_UDP {
                return Cow::Borrowed(frame);
            }
            let Ok(p) = ipv6(ip) else {
                return Cow::Borrowed(frame);
            };
            let mut ph = Vec::with_capacity(40);
            ph.extend_from_slice(&ip[8..40]);
            ph.extend_from_slice(&(p.body.len() as u32).to_be_bytes());
            ph.extend_from_slice(&[0, 0, 0, IPPROTO_UDP]);
            (ETH_HLEN + 40, ph)
        }
        _ => return Cow::Borrowed(frame),
    };
    if frame.len() < l4_at + UDP_HLEN {
        return Cow::Borrowed(frame);
    }
    let udp_len = usize::from(be16(frame, l4_at + 4));
    if udp_len < UDP_HLEN || l4_at + udp_len > frame.len() {
        return Cow::Borrowed(frame);
    }
    let mut out = frame.to_vec();
    out[l4_at + 6] = 0;
    out[l4_at + 7] = 0;
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for w in bytes.chunks(2) {
            let hi = u32::from(w[0]) << 8;
            sum += hi | w.get(1).map_or(0, |&b| u32::from(b));
        }
    };
    add(&pseudo);
    add(&out[l4_at..l4_at + udp_len]);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut check = !(sum as u16);
    if check == 0 {
        check = 0xffff; // 0 means "no checksum" (RFC 768)
    }
    out[l4_at + 6..l4_at + 8].copy_from_slice(&check.to_be_bytes());
    Cow::Owned(out)
}

/// The IP datagram a frame is a fragment of: (source, destination, id);
/// None for a frame that is no fragment (or cannot be read).
pub fn fragment_of(frame: &[u8]) -> Option<(IpAddr, IpAddr, u32)> {
    if frame.len() < ETH_HLEN {
        return None;
    }
    let ip = &frame[ETH_HLEN..];
    let packet = match be16(frame, 12) {
        ETH_P_IP => ipv4(ip).ok()?,
        ETH_P_IPV6 => ipv6(ip).ok()?,
        _ => return None,
    };
    packet
        .fragment
        .map(|(id, _, _)| (packet.src, packet.dst, id))
}

impl Reassembly {
    pub fn new(limits: ReassemblyLimits) -> Self {
        Reassembly {
            limits,
            open: HashMap::new(),
            dropped: 0,
        }
    }

    /// The datagram in a frame copied from interface `ifindex` at `now`:
    /// `Err(Incomplete)` while a fragmented one waits for the rest.
    pub fn datagram(
        &mut self,
        now: u64,
        ifindex: u32,
        frame: &[u8],
    ) -> Result<Datagram, FrameError> {
        if frame.len() < ETH_HLEN {
            return Err(FrameError::Truncated("Ethernet"));
        }
        let ip = &frame[ETH_HLEN..];
        let packet = match be16(frame, 12) {
            ETH_P_IP => ipv4(ip)?,
            ETH_P_IPV6 => ipv6(ip)?,
            other => return Err(FrameError::NotIp(other)),
        };
        if packet.proto != IPPROTO_UDP {
            return Err(FrameError::NotUdp(packet.proto));
        }
        let Some((id, offset, more)) = packet.fragment else {
            return udp(packet.src, packet.dst, packet.body);
        };
        let key = DatagramId {
            ifindex,
            src: packet.src,
            dst: packet.dst,
            id,
        };
        match self.add(now, key, offset, more, packet.body) {
            Ok(Some(whole)) => udp(packet.src, packet.dst, &whole),
            Ok(None) => Err(FrameError::Incomplete),
            Err(e) => {
                self.open.remove(&key);
                self.dropped += 1;
                Err(e)
            }
        }
    }

    /// Adds one fragment; the fragmentable part once it is whole.
    fn add(
        &mut self,
        now: u64,
        key: DatagramId,
        offset: usize,
        more: bool,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, FrameError> {
        let end = offset + body.len();
        if end > self.limits.max_bytes {
            return Err(FrameError::TooLarge(self.limits.max_bytes));
        }
        if !self.open.contains_key(&key) {
            let on_interface: Vec<(DatagramId, u64)> = self
                .open
                .iter()
                .filter(|(k, _)| k.ifindex == key.ifindex)
                .map(|(k, d)| (*k, d.started))
                .collect();
            if on_interface.len() >= self.limits.per_interface.max(1) {
                let oldest = on_interface.iter().min_by_key(|(_, s)| *s).expect("full").0;
                self.open.remove(&oldest);
                self.dropped += 1;
            }
            self.open.insert(
                key,
                InProgress {
                    pieces: Vec::new(),
                    total: None,
                    deadline: now.saturating_add(self.limits.timeout_ns),
                    started: now,
                },
            );
        }
        let d = self.open.get_mut(&key).expect("inserted above");
        // Every fragment but the last carries a multiple of 8 bytes.
        if more && !body.len().is_multiple_of(8) {
            return Err(FrameError::Malformed(
                "a fragment's length is not a multiple of 8",
            ));
        }
        if !more {
            if d.total.is_some_and(|t| t != end) {
                return Err(FrameError::Overlap);
            }
            d.total = Some(end);
        }
        if d.total.is_some_and(|t| end > t) {
            return Err(FrameError::Overlap);
        }
        if d.pieces
            .iter()
            .any(|(o, b)| offset < o + b.len() && *o < end)
        {
            return Err(FrameError::Overlap);
        }
        let at = d.pieces.partition_point(|(o, _)| *o < offset);
        d.pieces.insert(at, (offset, body.to_vec()));
        let Some(total) = d.total else {
            return Ok(None);
        };
        let mut have = 0;
        for (o, b) in &d.pieces {
            if *o != have {
                return Ok(None);
            }
            have += b.len();
        }
        if have != total {
            return Ok(None);
        }
        let d = self.open.remove(&key).expect("present");
        Ok(Some(d.pieces.into_iter().flat_map(|(_, b)| b).collect()))
    }

    /// Drops datagrams whose fragments did not all come in time.
    pub fn expire(&mut self, now: u64) {
        let before = self.open.len();
        self.open.retain(|_, d| d.deadline >= now);
        self.dropped += (before - self.open.len()) as u64;
    }

    /// The interface is gone: its datagrams go with it.
    pub fn forget(&mut self, ifindex: u32) {
        self.open.retain(|k, _| k.ifindex != ifindex);
    }

    /// Datagrams in progress.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// Frames as the datapath copies them, for tests.
#[cfg(test)]
pub(crate) mod build {
    use std::net::{IpAddr, SocketAddr};

    fn udp(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
        let mut u = Vec::with_capacity(8 + payload.len());
        u.extend_from_slice(&src.port().to_be_bytes());
        u.extend_from_slice(&dst.port().to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]); // checksum: not read
        u.extend_from_slice(payload);
        u
    }

    fn ether(v6: bool, ip: Vec<u8>) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
        f.extend(ip);
        f
    }

    /// One IP packet carrying `body` (part of a UDP datagram at byte
    /// `offset`; `more`: more fragments follow). `fragmented`: carries a
    /// fragment header or non-zero fragment fields even when whole.
    fn ip(
        src: IpAddr,
        dst: IpAddr,
        id: u32,
        offset: usize,
        more: bool,
        fragmented: bool,
        body: &[u8],
    ) -> Vec<u8> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = vec![0x45, 0];
                h.extend_from_slice(&((20 + body.len()) as u16).to_be_bytes());
                h.extend_from_slice(&(id as u16).to_be_bytes());
                let field = (offset / 8) as u16 | if more { 0x2000 } else { 0 };
                h.extend_from_slice(&field.to_be_bytes());
                h.extend_from_slice(&[64, 17, 0, 0]);
                h.extend_from_slice(&s.octets());
                h.extend_from_slice(&d.octets());
                h.extend_from_slice(body);
                ether(false, h)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let ext = if fragmented { 8 } else { 0 };
                let mut h = vec![0x60, 0, 0, 0];
                h.extend_from_slice(&((ext + body.len()) as u16).to_be_bytes());
                h.push(if fragmented { 44 } else { 17 });
                h.push(64);
                h.extend_from_slice(&s.octets());
                h.extend_from_slice(&d.octets());
                if fragmented {
                    h.extend_from_slice(&[17, 0]);
                    h.extend_from_slice(&((offset as u16) | u16::from(more)).to_be_bytes());
                    h.extend_from_slice(&id.to_be_bytes());
                }
                h.extend_from_slice(body);
                ether(true, h)
            }
            _ => panic!("mixed families"),
        }
    }

    /// A whole UDP datagram in one frame.
    pub fn datagram(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
        ip(
            src.ip(),
            dst.ip(),
            1,
            0,
            false,
            false,
            &udp(src, dst, payload),
        )
    }

    /// The same datagram as fragments of at most `mtu_body` bytes each
    /// (rounded down to a multiple of 8), in order.
    pub fn fragments(
        src: SocketAddr,
        dst: SocketAddr,
        id: u32,
        payload: &[u8],
        mtu_body: usize,
    ) -> Vec<Vec<u8>> {
        let whole = udp(src, dst, payload);
        let step = (mtu_body / 8).max(1) * 8;
        let mut out = Vec::new();
        let mut at = 0;
        while at < whole.len() {
            let end = (at + step).min(whole.len());
            out.push(ip(
                src.ip(),
                dst.ip(),
                id,
                at,
                end < whole.len(),
                true,
                &whole[at..end],
            ));
            at = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::build;
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn whole_datagrams_of_both_families() {
        let mut r = Reassembly::new(ReassemblyLimits::default());
        for (src, dst) in [
            (sa("10.96.0.10:53"), sa("10.0.1.5:40000")),
            (sa("[fd00::a]:53"), sa("[fd00:1::5]:40000")),
        ] {
            let d = r
                .datagram(0, 7, &build::datagram(src, dst, &payload(300)))
                .unwrap();
            assert_eq!(
                d,
                Datagram {
                    src,
                    dst,
                    payload: payload(300)
                }
            );
        }
        assert!(r.is_empty());
    }

    #[test]
    fn fragments_in_any_order_make_the_datagram_once() {
        let mut rng = Rng(0xf7a9);
        for (src, dst) in [
            (sa("10.96.0.10:53"), sa("10.0.1.5:40000")),
            (sa("[fd00::a]:53"), sa("[fd00:1::5]:40000")),
        ] {
            for case in 0..50u32 {
                let body = payload(600 + rng.below(3000));
                let mut frags =
                    build::fragments(src, dst, case, &body, 200 + rng.below(body.len() / 2));
                assert!(frags.len() > 1);
                for i in (1..frags.len()).rev() {
                    frags.swap(i, rng.below(i + 1));
                }
                let mut r = Reassembly::new(ReassemblyLimits::default());
                let last = frags.pop().unwrap();
                for f in &frags {
                    assert_eq!(r.datagram(0, 3, f), Err(FrameError::Incomplete));
                }
                let d = r.datagram(0, 3, &last).unwrap();
                assert_eq!(d.payload, body, "case {case}");
                assert!(r.is_empty(), "nothing left over");
                // A replayed fragment starts a new datagram, never a second copy.
                assert_eq!(r.datagram(0, 3, &frags[0]), Err(FrameError::Incomplete));
            }
        }
    }

    #[test]
    fn overlapping_or_inconsistent_fragments_drop_the_datagram() {
        let (src, dst) = (sa("10.96.0.10:53"), sa("10.0.1.5:40000"));
        let frags = build::fragments(src, dst, 9, &payload(1000), 400);
        let mut r = Reassembly::new(ReassemblyLimits::default());
        r.datagram(0, 1, &frags[0]).unwrap_err();
        // The same fragment again overlaps itself.
        assert_eq!(r.datagram(0, 1, &frags[0]), Err(FrameError::Overlap));
        assert_eq!(r.dropped, 1);
        assert!(r.is_empty());
        // A fragment that overlaps part of another, at its own offset.
        let other = build::fragments(src, dst, 9, &payload(1000), 200);
        r.datagram(0, 1, &frags[0]).unwrap_err();
        assert_eq!(r.datagram(0, 1, &other[1]), Err(FrameError::Overlap));
        // Two last fragments that disagree on the end.
        let short = build::fragments(src, dst, 10, &payload(600), 400);
        let long = build::fragments(src, dst, 10, &payload(900), 400);
        r.datagram(0, 1, short.last().unwrap()).unwrap_err();
        assert_eq!(
            r.datagram(0, 1, long.last().unwrap()),
            Err(FrameError::Overlap)
        );
    }

    #[test]
    fn reassembly_is_bounded_per_interface_and_in_time() {
        let (src, dst) = (sa("10.96.0.10:53"), sa("10.0.1.5:40000"));
        let limits = ReassemblyLimits {
            per_interface: 4,
            max_bytes: 2000,
            timeout_ns: 100,
        };
        let mut r = Reassembly::new(limits);
        for id in 0..10 {
            let f = build::fragments(src, dst, id, &payload(1000), 400);
            r.datagram(u64::from(id), 1, &f[0]).unwrap_err();
        }
        assert_eq!(r.len(), 4, "the oldest made way");
        assert_eq!(r.dropped, 6);
        // Another interface's datagrams are not pushed out by these.
        let f = build::fragments(src, dst, 0, &payload(1000), 400);
        r.datagram(0, 2, &f[0]).unwrap_err();
        for id in 10..20 {
            let g = build::fragments(src, dst, id, &payload(1000), 400);
            r.datagram(5, 1, &g[0]).unwrap_err();
        }
        assert_eq!(
            r.datagram(6, 2, &f[1]),
            Err(FrameError::Incomplete),
            "still there"
        );
        r.expire(1_000);
        assert!(r.is_empty());
        let big = build::fragments(src, dst, 30, &payload(3000), 400);
        let last = big.last().unwrap();
        assert_eq!(r.datagram(0, 1, last), Err(FrameError::TooLarge(2000)));
    }

    /// The one's complement sum over pseudo-header and UDP datagram is
    /// 0xffff when the checksum is right.
    fn checksum_ok(frame: &[u8]) -> bool {
        let v6 = frame[12] == 0x86;
        let (l4, mut words): (usize, Vec<u8>) = if v6 {
            let ip = &frame[14..];
            let mut ph = ip[8..40].to_vec();
            let len = u16::from_be_bytes([ip[4], ip[5]]) as u32;
            ph.extend_from_slice(&len.to_be_bytes());
            ph.extend_from_slice(&[0, 0, 0, 17]);
            (54, ph)
        } else {
            let ip = &frame[14..];
            let mut ph = ip[12..20].to_vec();
            ph.extend_from_slice(&[0, 17]);
            let len = u16::from_be_bytes([ip[2], ip[3]]) - 20;
            ph.extend_from_slice(&len.to_be_bytes());
            (34, ph)
        };
        words.extend_from_slice(&frame[l4..]);
        let mut sum: u32 = words
            .chunks(2)
            .map(|w| (u32::from(w[0]) << 8) | w.get(1).map_or(0, |&b| u32::from(b)))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    #[test]
    fn a_whole_datagram_gets_its_udp_checksum_and_a_fragment_is_left_alone() {
        for (src, dst) in [
            (sa("10.96.0.10:53"), sa("10.0.1.5:40000")),
            (sa("[fd00::a]:53"), sa("[fd00:1::5]:40000")),
        ] {
            for n in [0, 1, 77, 300] {
                let f = build::datagram(src, dst, &payload(n));
                assert!(!checksum_ok(&f) || n == 0, "the builder leaves it 0");
                let fixed = with_udp_checksum(&f);
                assert!(checksum_ok(&fixed), "{src} {n}");
                assert_eq!(fixed.len(), f.len());
                // Idempotent: a right checksum stays right.
                assert_eq!(with_udp_checksum(&fixed), fixed);
            }
            let frags = build::fragments(src, dst, 3, &payload(900), 300);
            assert_eq!(with_udp_checksum(&frags[0]), frags[0]);
        }
        assert_eq!(with_udp_checksum(&[1, 2, 3]), &[1u8, 2, 3][..]);
    }

    #[test]
    fn any_truncation_or_noise_is_an_error_never_a_panic() {
        let mut rng = Rng(0xbad);
        let mut r = Reassembly::new(ReassemblyLimits::default());
        let frames = [
            build::datagram(sa("10.96.0.10:53"), sa("10.0.1.5:40000"), &payload(100)),
            build::datagram(sa("[fd00::a]:53"), sa("[fd00:1::5]:40000"), &payload(100)),
            build::fragments(
                sa("[fd00::a]:53"),
                sa("[fd00:1::5]:1"),
                5,
                &payload(900),
                300,
            )[1]
            .clone(),
        ];
        for f in &frames {
            for cut in 0..f.len() {
                let _ = r.datagram(0, 1, &f[..cut]);
                let _ = with_udp_checksum(&f[..cut]);
            }
        }
        for _ in 0..20_000 {
            let mut f = frames[rng.below(frames.len())].clone();
            for _ in 0..1 + rng.below(6) {
                let i = rng.below(f.len());
                f[i] = rng.below(256) as u8;
            }
            let _ = r.datagram(0, rng.below(4) as u32, &f);
            let _ = with_udp_checksum(&f);
        }
    }
}
