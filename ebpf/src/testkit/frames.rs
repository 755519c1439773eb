//! Hand-built Ethernet frames: IPv4 and IPv6 with TCP, UDP, SCTP, ICMP and
//! ICMPv6, plus ARP, with valid IPv4 header checksums.

use std::net::IpAddr;

use super::ip;
use crate::{PROTO_ICMP, PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;

pub fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub fn ipv4_with_frag(src: &str, dst: &str, proto: u8, frag_off: u16, l4: &[u8]) -> Vec<u8> {
    ipv4_with_id(src, dst, proto, 1, frag_off, l4)
}

/// IPv4 "more fragments" flag, in the flags/offset field.
pub const IPV4_MF: u16 = 0x2000;

/// A fragment of the IPv4 datagram `id`: `payload` is its part of the
/// datagram starting `offset` bytes in (a multiple of 8), `more` unless it
/// is the last part.
pub fn ipv4_fragment(
    src: &str,
    dst: &str,
    proto: u8,
    id: u16,
    offset: u16,
    more: bool,
    payload: &[u8],
) -> Vec<u8> {
    assert_eq!(offset % 8, 0, "fragment offsets count 8-byte units");
    let flags = if more { IPV4_MF } else { 0 };
    ipv4_with_id(src, dst, proto, id, flags | (offset / 8), payload)
}

/// `frag_off`: the flags/offset field as it is on the wire.
pub fn ipv4_with_id(src: &str, dst: &str, proto: u8, id: u16, frag_off: u16, l4: &[u8]) -> Vec<u8> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (ip(src), ip(dst)) else {
        panic!("IPv4 addresses expected");
    };
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&frag_off.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let sum = checksum(&h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h.extend_from_slice(l4);
    eth(ETH_P_IP, &h)
}

pub fn ipv6_with_hops(src: &str, dst: &str, next: u8, hop_limit: u8, l4: &[u8]) -> Vec<u8> {
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (ip(src), ip(dst)) else {
        panic!("IPv6 addresses expected");
    };
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    h.extend_from_slice(&[next, hop_limit]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(l4);
    eth(ETH_P_IPV6, &h)
}

/// An IPv6 extension header, as [`ipv6_with_exts`] chains them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    /// Hop-by-hop options of this many bytes (a multiple of 8), padding only.
    HopByHop(usize),
    /// Destination options, likewise.
    DestOpts(usize),
    /// A routing header of this many bytes (a multiple of 8).
    Routing(usize),
    /// An authentication header of this many bytes (a multiple of 8, at
    /// least 16).
    Ah(usize),
    /// A fragment header: `offset` in bytes (a multiple of 8) of what
    /// follows it, `more` unless it is the datagram's last part.
    Fragment { id: u32, offset: u16, more: bool },
}

impl Ext {
    pub fn number(self) -> u8 {
        match self {
            Ext::HopByHop(_) => 0,
            Ext::DestOpts(_) => 60,
            Ext::Routing(_) => 43,
            Ext::Ah(_) => 51,
            Ext::Fragment { .. } => 44,
        }
    }

    /// The header's bytes, naming `next` as what follows it.
    pub fn bytes(self, next: u8) -> Vec<u8> {
        match self {
            Ext::HopByHop(len) | Ext::DestOpts(len) => {
                assert!(len >= 8 && len % 8 == 0 && len <= 2048);
                let mut h = vec![next, (len / 8 - 1) as u8];
                // One PadN option over the rest.
                h.extend_from_slice(&[1, (len - 4) as u8]);
                h.resize(len, 0);
                h
            }
            Ext::Routing(len) => {
                assert!(len >= 8 && len % 8 == 0 && len <= 2048);
                // Routing type 254 (experimental), no segments left.
                let mut h = vec![next, (len / 8 - 1) as u8, 254, 0];
                h.resize(len, 0);
                h
            }
            Ext::Ah(len) => {
                assert!(len >= 16 && len % 8 == 0 && len <= 1028);
                // Payload length: 4-byte words less 2; then SPI and sequence.
                let mut h = vec![next, (len / 4 - 2) as u8, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1];
                h.resize(len, 0);
                h
            }
            Ext::Fragment { id, offset, more } => {
                assert_eq!(offset % 8, 0, "fragment offsets count 8-byte units");
                let mut h = vec![next, 0];
                h.extend_from_slice(&(offset | u16::from(more)).to_be_bytes());
                h.extend_from_slice(&id.to_be_bytes());
                h
            }
        }
    }
}

/// An IPv6 packet whose extension headers `exts` (in order) lead to
/// `proto` and its `payload`.
pub fn ipv6_with_exts(src: &str, dst: &str, exts: &[Ext], proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, e) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(proto, |n| n.number());
        body.extend_from_slice(&e.bytes(next));
    }
    body.extend_from_slice(payload);
    let first = exts.first().map_or(proto, |e| e.number());
    ipv6_with_hops(src, dst, first, 64, &body)
}

/// A fragment of the IPv6 datagram `id` whose fragmentable part is `proto`
/// and its payload: `payload` is its part of that starting `offset` bytes
/// in (a multiple of 8), `more` unless it is the last part.
pub fn ipv6_fragment(
    src: &str,
    dst: &str,
    proto: u8,
    id: u32,
    offset: u16,
    more: bool,
    payload: &[u8],
) -> Vec<u8> {
    ipv6_with_exts(
        src,
        dst,
        &[Ext::Fragment { id, offset, more }],
        proto,
        payload,
    )
}

/// A fragment of datagram `id` of the family of `src` (see
/// [`ipv4_fragment`] and [`ipv6_fragment`]; the IPv4 id is `id`'s low 16
/// bits).
pub fn fragment(
    src: &str,
    dst: &str,
    proto: u8,
    id: u32,
    offset: u16,
    more: bool,
    payload: &[u8],
) -> Vec<u8> {
    if ip(src).is_ipv4() {
        ipv4_fragment(src, dst, proto, id as u16, offset, more, payload)
    } else {
        ipv6_fragment(src, dst, proto, id, offset, more, payload)
    }
}

/// An IP packet of the family of `src`.
pub fn ip_packet(src: &str, dst: &str, proto: u8, l4: &[u8]) -> Vec<u8> {
    if ip(src).is_ipv4() {
        ipv4_with_frag(src, dst, proto, 0, l4)
    } else {
        ipv6_with_hops(src, dst, proto, 64, l4)
    }
}

/// The Internet checksum (RFC 1071) of `bytes`.
pub fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;
pub const PSH: u8 = 0x08;

/// A segment of a connection under way (ACK): any packet of a flow, either
/// direction. A connection's first segment is `tcp_flags(.., SYN)`, which
/// the programs judge by policy alone (`opens_connection`).
pub fn tcp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    tcp_hdr_flags(sport, dport, ACK)
}

pub fn tcp_hdr_flags(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = Vec::with_capacity(20);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]); // seq, ack
    h.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

pub fn udp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&[0, 0, b'p', b'i', b'n', b'g']);
    h
}

pub fn sctp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&[0; 8]); // verification tag, checksum
    h
}

pub fn tcp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    ip_packet(src, dst, PROTO_TCP, &tcp_hdr(sport, dport))
}

pub fn tcp_flags(src: &str, sport: u16, dst: &str, dport: u16, flags: u8) -> Vec<u8> {
    ip_packet(src, dst, PROTO_TCP, &tcp_hdr_flags(sport, dport, flags))
}

pub fn udp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    ip_packet(src, dst, PROTO_UDP, &udp_hdr(sport, dport))
}

pub fn sctp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    ip_packet(src, dst, PROTO_SCTP, &sctp_hdr(sport, dport))
}

pub fn icmp_echo(src: &str, dst: &str) -> Vec<u8> {
    ipv4_with_frag(src, dst, PROTO_ICMP, 0, &[8, 0, 0, 0, 0, 1, 0, 1])
}

pub fn icmpv6(src: &str, dst: &str, icmp_type: u8, hop_limit: u8) -> Vec<u8> {
    let mut l4 = vec![icmp_type, 0, 0, 0, 0, 0, 0, 0];
    l4.extend_from_slice(
        &ip(dst)
            .to_string()
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    ipv6_with_hops(src, dst, PROTO_ICMPV6, hop_limit, &l4)
}

pub fn arp_request() -> Vec<u8> {
    let mut a = vec![0, 1, 0x08, 0, 6, 4, 0, 1];
    a.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 10, 0, 0, 2]);
    a.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
    f.extend_from_slice(&a);
    f
}
