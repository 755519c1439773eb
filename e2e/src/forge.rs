//! Crafted packets, as a pod with CAP_NET_RAW could send them: TCP segments
//! in the reply direction of a flow the policy denies, the same with the
//! peer's address as source, and IPv4 fragments. They go out of the pod's
//! eth0 through a packet socket addressed to the gateway's MAC, so they reach
//! the pod's host veth (and, when routed, the peer) exactly as sent: no
//! socket of the pod's stack is involved.
//!
//! Building the packets is pure ([`reply_forgeries`]); [`send`] is the I/O.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;

/// Every flag combination a reply segment can carry.
pub const REPLY_FLAGS: [(u8, &str); 5] = [
    (SYN | ACK, "SYN-ACK"),
    (ACK, "ACK"),
    (RST, "RST"),
    (FIN | ACK, "FIN-ACK"),
    (PSH | ACK, "PSH-ACK"),
];

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
/// IPv4 "more fragments" flag, in the flags/offset field.
const MF: u16 = 0x2000;

/// One crafted IPv4 packet and what it pretends to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forged {
    pub what: String,
    pub packet: Vec<u8>,
}

/// The Internet checksum (RFC 1071) of `data`, starting from `initial`.
pub fn checksum(data: &[u8], initial: u32) -> u16 {
    let mut sum = initial;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A TCP segment (20-byte header, no options) with its checksum computed
/// over the IPv4 pseudo-header.
#[allow(clippy::too_many_arguments)]
pub fn tcp_segment(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut seg = Vec::with_capacity(20 + payload.len());
    seg.extend_from_slice(&sport.to_be_bytes());
    seg.extend_from_slice(&dport.to_be_bytes());
    seg.extend_from_slice(&seq.to_be_bytes());
    seg.extend_from_slice(&ack.to_be_bytes());
    seg.push(5 << 4); // data offset: 5 words
    seg.push(flags);
    seg.extend_from_slice(&64240u16.to_be_bytes()); // window
    seg.extend_from_slice(&[0, 0]); // checksum, filled below
    seg.extend_from_slice(&[0, 0]); // urgent pointer
    seg.extend_from_slice(payload);
    let len = seg.len() as u32;
    let mut pseudo = 0u32;
    for addr in [src, dst] {
        let o = addr.octets();
        pseudo += u32::from(u16::from_be_bytes([o[0], o[1]]));
        pseudo += u32::from(u16::from_be_bytes([o[2], o[3]]));
    }
    pseudo += u32::from(IPPROTO_TCP) + len;
    let sum = checksum(&seg, pseudo);
    seg[16..18].copy_from_slice(&sum.to_be_bytes());
    seg
}

/// An IPv4 packet around the TCP segment `payload`; `frag` is the
/// flags/offset field (offset in 8-byte units, plus [`MF`]).
pub fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, id: u16, frag: u16, payload: &[u8]) -> Vec<u8> {
    ipv4_of(IPPROTO_TCP, src, dst, id, frag, payload)
}

/// A whole UDP datagram in an IPv4 packet, checksummed: e.g. a DNS answer
/// from anyone, to anyone.
pub fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = (8 + payload.len()) as u16;
    let mut d = Vec::with_capacity(len as usize);
    d.extend_from_slice(&sport.to_be_bytes());
    d.extend_from_slice(&dport.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    let mut pseudo = 0u32;
    for addr in [src, dst] {
        let o = addr.octets();
        pseudo += u32::from(u16::from_be_bytes([o[0], o[1]]));
        pseudo += u32::from(u16::from_be_bytes([o[2], o[3]]));
    }
    pseudo += u32::from(IPPROTO_UDP) + u32::from(len);
    let sum = match checksum(&d, pseudo) {
        0 => 0xffff, // 0 means "no checksum" in UDP
        s => s,
    };
    d[6..8].copy_from_slice(&sum.to_be_bytes());
    ipv4_of(IPPROTO_UDP, src, dst, 0x6100, 0, &d)
}

fn ipv4_of(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, id: u16, frag: u16, payload: &[u8]) -> Vec<u8> {
    let total = (20 + payload.len()) as u16;
    let mut p = Vec::with_capacity(total as usize);
    p.push(0x45); // version 4, header 5 words
    p.push(0);
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&frag.to_be_bytes());
    p.push(64); // ttl
    p.push(proto);
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let sum = checksum(&p[..20], 0);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// A TCP segment split into a first fragment (offset 0, MF, the first 16
/// bytes: ports, sequence numbers, flags) and a non-first fragment (the
/// rest, whose packet carries no ports at all).
pub fn fragmented(src: Ipv4Addr, dst: Ipv4Addr, id: u16, segment: &[u8]) -> [Vec<u8>; 2] {
    const FIRST: usize = 16;
    [
        ipv4_packet(src, dst, id, MF, &segment[..FIRST]),
        ipv4_packet(src, dst, id, (FIRST / 8) as u16, &segment[FIRST..]),
    ]
}

/// What a pod at `me` sends, before connecting from `my_port` to
/// `peer:peer_port`, to make a denied flow look established or to slip past
/// port matching.
pub fn reply_forgeries(me: Ipv4Addr, my_port: u16, peer: Ipv4Addr, peer_port: u16) -> Vec<Forged> {
    let mut out = Vec::new();
    let mut id = 0x5000u16;
    let mut next_id = || {
        id = id.wrapping_add(1);
        id
    };
    let seq = 0x1000_0000;
    for (flags, name) in REPLY_FLAGS {
        // From the peer's probed port to our probe port, with our own
        // address: the reply direction as our veth sees it leaving us.
        let seg = tcp_segment(me, peer, peer_port, my_port, seq, seq, flags, &[]);
        out.push(Forged {
            what: format!("{name} {me}:{peer_port} -> {peer}:{my_port}"),
            packet: ipv4_packet(me, peer, next_id(), 0, &seg),
        });
        // The real reply of the flow we are about to open, with the peer's
        // address as source: a spoofed packet from our veth.
        let seg = tcp_segment(peer, me, peer_port, my_port, seq, seq, flags, &[]);
        out.push(Forged {
            what: format!("{name} spoofed {peer}:{peer_port} -> {me}:{my_port}"),
            packet: ipv4_packet(peer, me, next_id(), 0, &seg),
        });
        // The same spoofed reply sent towards the peer, so that a check on
        // the peer's side sees it too.
        let seg = tcp_segment(peer, peer, peer_port, my_port, seq, seq, flags, &[]);
        out.push(Forged {
            what: format!("{name} spoofed {peer}:{peer_port} -> {peer}:{my_port}"),
            packet: ipv4_packet(peer, peer, next_id(), 0, &seg),
        });
    }
    let payload = [0u8; 12];
    let syn = tcp_segment(me, peer, my_port, peer_port, seq, 0, SYN, &payload);
    let [first, rest] = fragmented(me, peer, next_id(), &syn);
    out.push(Forged {
        what: format!("SYN first fragment {me}:{my_port} -> {peer}:{peer_port}"),
        packet: first,
    });
    out.push(Forged {
        what: format!("SYN non-first fragment {me} -> {peer}"),
        packet: rest,
    });
    let reply = tcp_segment(peer, me, peer_port, my_port, seq, seq, SYN | ACK, &payload);
    let [first, rest] = fragmented(peer, me, next_id(), &reply);
    out.push(Forged {
        what: format!("SYN-ACK spoofed first fragment {peer}:{peer_port} -> {me}:{my_port}"),
        packet: first,
    });
    out.push(Forged {
        what: format!("SYN-ACK spoofed non-first fragment {peer} -> {me}"),
        packet: rest,
    });
    out
}

/// Sends each packet out of `ifname` (in the calling thread's namespace)
/// to `gateway_mac`, through an AF_PACKET datagram socket: the kernel adds
/// the Ethernet header, nothing else touches the packet.
pub fn send(ifname: &str, gateway_mac: [u8; 6], packets: &[Forged]) -> Result<()> {
    let ifindex = if_index(ifname)?;
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket creation; the fd is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening a packet socket");
    }
    let result = (|| {
        for p in packets {
            // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = proto;
            addr.sll_ifindex = ifindex;
            addr.sll_halen = 6;
            addr.sll_addr[..6].copy_from_slice(&gateway_mac);
            // SAFETY: the buffer and address outlive the call.
            let n = unsafe {
                libc::sendto(
                    fd,
                    p.packet.as_ptr().cast(),
                    p.packet.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("sending {}", p.what));
            }
        }
        Ok(())
    })();
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    result
}

/// By ioctl, not sysfs: /sys shows the namespace it was mounted in, not the
/// calling thread's.
fn if_index(name: &str) -> Result<i32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: c is a valid NUL-terminated string for the call's duration.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("finding interface {name}"));
    }
    Ok(index as i32)
}

/// The default gateway of the calling thread's namespace, from
/// /proc/thread-self/net/route (/proc/self/net is the main thread's
/// namespace, not the one this thread entered).
pub fn default_gateway() -> Result<Ipv4Addr> {
    let text =
        std::fs::read_to_string("/proc/thread-self/net/route").context("reading the routes")?;
    parse_default_gateway(&text).ok_or_else(|| anyhow!("the pod has no IPv4 default route"))
}

fn parse_default_gateway(route_table: &str) -> Option<Ipv4Addr> {
    route_table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 3 || f[1] != "00000000" {
            return None;
        }
        // The kernel prints the address in host (little-endian) order.
        let raw = u32::from_str_radix(f[2], 16).ok()?;
        Some(Ipv4Addr::from(raw.swap_bytes()))
    })
}

/// The gateway's MAC, resolving it first (a datagram to the discard port
/// makes the kernel ARP for it) and waiting for the neighbour entry.
pub fn gateway_mac(gateway: Ipv4Addr, timeout: Duration) -> Result<[u8; 6]> {
    let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    let deadline = Instant::now() + timeout;
    loop {
        let _ = sock.send_to(b"arp", (gateway, 9));
        let arp = std::fs::read_to_string("/proc/thread-self/net/arp")
            .context("reading the ARP table")?;
        if let Some(mac) = parse_arp(&arp, gateway) {
            return Ok(mac);
        }
        if Instant::now() >= deadline {
            bail!("the gateway {gateway} did not resolve within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20)); // poll: inside a loop bounded by a deadline
    }
}

fn parse_arp(table: &str, ip: Ipv4Addr) -> Option<[u8; 6]> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Flags 0x2: a complete entry.
        if f.len() < 4 || f[0] != ip.to_string() || f[2] != "0x2" {
            return None;
        }
        let bytes: Vec<u8> = f[3]
            .split(':')
            .filter_map(|b| u8::from_str_radix(b, 16).ok())
            .collect();
        bytes.try_into().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify_to_zero() {
        let (a, b) = (Ipv4Addr::new(10, 244, 0, 2), Ipv4Addr::new(10, 244, 0, 3));
        let seg = tcp_segment(a, b, 80, 40000, 1, 2, SYN | ACK, b"xyz");
        let pkt = ipv4_packet(a, b, 7, 0, &seg);
        assert_eq!(checksum(&pkt[..20], 0), 0, "the IP header verifies");
        let mut pseudo = 0u32;
        for o in [a.octets(), b.octets()] {
            pseudo += u32::from(u16::from_be_bytes([o[0], o[1]]));
            pseudo += u32::from(u16::from_be_bytes([o[2], o[3]]));
        }
        pseudo += 6 + seg.len() as u32;
        assert_eq!(checksum(&seg, pseudo), 0, "the TCP segment verifies");
        assert_eq!(pkt.len(), 20 + 20 + 3);
        assert_eq!(&pkt[12..16], &a.octets());
        assert_eq!(u16::from_be_bytes([pkt[20], pkt[21]]), 80);
        assert_eq!(pkt[20 + 13], SYN | ACK);
    }

    #[test]
    fn a_known_header_checksum() {
        // The example header of RFC 1071 discussions (Wikipedia's IPv4 page).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h, 0), 0xb861);
    }

    #[test]
    fn fragments_split_at_eight_bytes() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let seg = tcp_segment(a, b, 1, 2, 0, 0, SYN, &[0; 12]);
        let [first, rest] = fragmented(a, b, 9, &seg);
        assert_eq!(u16::from_be_bytes([first[6], first[7]]), MF);
        assert_eq!(u16::from_be_bytes([rest[6], rest[7]]), 2);
        assert_eq!(first.len() - 20 + rest.len() - 20, seg.len());
        assert_eq!(checksum(&first[..20], 0), 0);
        assert_eq!(checksum(&rest[..20], 0), 0);
    }

    #[test]
    fn every_reply_flag_own_and_spoofed_plus_fragments() {
        let (me, peer) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let all = reply_forgeries(me, 23456, peer, 81);
        assert_eq!(all.len(), REPLY_FLAGS.len() * 3 + 4);
        for (flags, name) in REPLY_FLAGS {
            let spoofed = all
                .iter()
                .find(|f| {
                    f.what
                        .starts_with(&format!("{name} spoofed {peer}:81 -> {me}"))
                })
                .unwrap();
            let p = &spoofed.packet;
            assert_eq!(&p[12..16], &peer.octets());
            assert_eq!(u16::from_be_bytes([p[20], p[21]]), 81);
            assert_eq!(u16::from_be_bytes([p[22], p[23]]), 23456);
            assert_eq!(p[33], flags);
        }
        assert!(all.iter().any(|f| f.what.contains("non-first fragment")));
    }

    #[test]
    fn reads_routes_and_neighbours() {
        let routes = "Iface\tDestination\tGateway \tFlags\nn\neth0\t00000000\t0100F40A\t0003\neth0\t0000F40A\t00000000\t0001\n";
        assert_eq!(
            parse_default_gateway(routes),
            Some(Ipv4Addr::new(10, 244, 0, 1))
        );
        let arp = "IP address HW type Flags HW address Mask Device\n10.244.0.1 0x1 0x2 aa:bb:cc:00:11:22 * eth0\n10.244.0.9 0x1 0x0 00:00:00:00:00:00 * eth0\n";
        assert_eq!(
            parse_arp(arp, Ipv4Addr::new(10, 244, 0, 1)),
            Some([0xaa, 0xbb, 0xcc, 0, 0x11, 0x22])
        );
        assert_eq!(parse_arp(arp, Ipv4Addr::new(10, 244, 0, 9)), None);
    }
}
