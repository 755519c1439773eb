//! SCTP probes without an SCTP stack: this kernel has no SCTP sockets, so
//! the prober sends an INIT through a raw IP socket (protocol 132) and the
//! target pod's responder, a raw socket too, answers an INIT to one of its
//! declared SCTP ports with an INIT-ACK. A probe is allowed when the
//! INIT-ACK comes back: the packets cross both pods' programs exactly as an
//! association's first two packets would (ports in the common header, the
//! answer a reply to the INIT's flow).
//!
//! While a raw socket for protocol 132 is open, the kernel hands it the
//! packets and sends no "protocol unreachable".

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::probe::Outcome;

pub const IPPROTO_SCTP: i32 = 132;
const CHUNK_INIT: u8 = 1;
const CHUNK_INIT_ACK: u8 = 2;
const COMMON_HEADER: usize = 12;

/// CRC32c (Castagnoli), as SCTP's checksum (RFC 9260, appendix A).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A packet: common header (ports, verification tag) and one chunk, with
/// its checksum filled in.
fn packet(sport: u16, dport: u16, vtag: u32, chunk: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(COMMON_HEADER + chunk.len());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&vtag.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    p.extend_from_slice(chunk);
    // The checksum is stored little-endian (RFC 9260, appendix A).
    let sum = crc32c(&p);
    p[8..12].copy_from_slice(&sum.to_le_bytes());
    p
}

/// An INIT from `sport` to `dport` offering `tag` as the initiate tag.
pub fn init(sport: u16, dport: u16, tag: u32) -> Vec<u8> {
    let mut chunk = vec![CHUNK_INIT, 0];
    chunk.extend_from_slice(&20u16.to_be_bytes());
    chunk.extend_from_slice(&tag.to_be_bytes()); // initiate tag
    chunk.extend_from_slice(&65_536u32.to_be_bytes()); // a_rwnd
    chunk.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
    chunk.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
    chunk.extend_from_slice(&tag.to_be_bytes()); // initial TSN
    packet(sport, dport, 0, &chunk)
}

/// The SCTP part of a datagram as a raw IPv4 socket delivers it (with the
/// IP header), or None.
fn sctp_of(datagram: &[u8]) -> Option<&[u8]> {
    let ihl = usize::from(*datagram.first()? & 0x0f) * 4;
    let sctp = datagram.get(ihl..)?;
    (sctp.len() >= COMMON_HEADER + 4).then_some(sctp)
}

/// (source port, destination port, verification tag, first chunk type,
/// first chunk's body) of an SCTP packet.
fn parse(sctp: &[u8]) -> Option<(u16, u16, u32, u8, &[u8])> {
    let sport = u16::from_be_bytes([sctp[0], sctp[1]]);
    let dport = u16::from_be_bytes([sctp[2], sctp[3]]);
    let vtag = u32::from_be_bytes(sctp[4..8].try_into().ok()?);
    let kind = sctp[COMMON_HEADER];
    Some((sport, dport, vtag, kind, &sctp[COMMON_HEADER + 4..]))
}

/// The INIT-ACK answering `init` (an SCTP packet), if it is an INIT to one
/// of `ports`: ports swapped, tagged with the INIT's initiate tag, with a
/// state cookie as the one mandatory parameter.
pub fn answer(init: &[u8], ports: &BTreeSet<u16>) -> Option<Vec<u8>> {
    let (sport, dport, _, kind, body) = parse(init)?;
    if kind != CHUNK_INIT || !ports.contains(&dport) || body.len() < 16 {
        return None;
    }
    let peer_tag = u32::from_be_bytes(body[0..4].try_into().ok()?);
    let my_tag = peer_tag.rotate_left(16) | 1;
    let mut chunk = vec![CHUNK_INIT_ACK, 0];
    chunk.extend_from_slice(&28u16.to_be_bytes());
    chunk.extend_from_slice(&my_tag.to_be_bytes());
    chunk.extend_from_slice(&65_536u32.to_be_bytes());
    chunk.extend_from_slice(&1u16.to_be_bytes());
    chunk.extend_from_slice(&1u16.to_be_bytes());
    chunk.extend_from_slice(&my_tag.to_be_bytes());
    // State cookie parameter (type 7), 8 bytes: type, length, 4 of cookie.
    chunk.extend_from_slice(&7u16.to_be_bytes());
    chunk.extend_from_slice(&8u16.to_be_bytes());
    chunk.extend_from_slice(&peer_tag.to_be_bytes());
    Some(packet(dport, sport, peer_tag, &chunk))
}

/// Whether `sctp` is the INIT-ACK for our INIT from `sport` to `dport`
/// tagged `tag`.
fn is_answer(sctp: &[u8], sport: u16, dport: u16, tag: u32) -> bool {
    matches!(parse(sctp), Some((s, d, v, CHUNK_INIT_ACK, _)) if s == dport && d == sport && v == tag)
}

/// A raw IPv4 socket for protocol 132 in the calling thread's namespace.
pub fn raw_socket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, IPPROTO_SCTP) };
    if fd < 0 {
        bail!("raw SCTP socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds a raw socket to a local address: it then sees only packets to
/// that address, and what it sends leaves from it.
pub fn bind(fd: &OwnedFd, ip: Ipv4Addr) -> Result<()> {
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: the address is live for the call, its length exact.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        bail!(
            "binding the raw SCTP socket to {ip}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub fn send_to(fd: &OwnedFd, packet: &[u8], to: Ipv4Addr) -> std::io::Result<()> {
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: buffer and address are live for the call, lengths exact.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram and its sender, waiting at most `timeout` (None: nothing).
pub fn recv_from(
    fd: &OwnedFd,
    buf: &mut [u8],
    timeout: Duration,
) -> std::io::Result<Option<(usize, Ipv4Addr)>> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one pollfd, live for the call.
    let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
    if ready < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if ready == 0 {
        return Ok(None);
    }
    // SAFETY: zeroed sockaddr_in is a valid value to be overwritten.
    let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: buffer and address live for the call, lengths exact.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&mut from as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr));
    Ok(Some((n as usize, ip)))
}

/// The probe, run in the source pod's namespace: an INIT to `to`, then
/// waiting for its INIT-ACK until `timeout`.
pub fn probe(to: SocketAddrV4, timeout: Duration) -> Outcome {
    let fd = match raw_socket() {
        Ok(fd) => fd,
        Err(e) => return Outcome::Error(format!("{e:#}")),
    };
    // A source port and tag of this probe's own, so concurrent probes and
    // stray packets are told apart.
    let seed = std::process::id()
        ^ (Instant::now().elapsed().subsec_nanos())
        ^ u32::from(to.port()).rotate_left(7)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let sport = 32_768 + (seed % 28_000) as u16;
    let tag = seed | 1;
    if let Err(e) = send_to(&fd, &init(sport, to.port(), tag), *to.ip()) {
        return Outcome::Error(format!("sending an SCTP INIT to {to}: {e}"));
    }
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome::Timeout;
        }
        match recv_from(&fd, &mut buf, left) {
            Ok(None) => return Outcome::Timeout,
            Ok(Some((n, from))) if IpAddr::V4(from) == IpAddr::V4(*to.ip()) => {
                if let Some(sctp) = sctp_of(&buf[..n]) {
                    if is_answer(sctp, sport, to.port(), tag) {
                        return Outcome::Echo;
                    }
                }
            }
            Ok(Some(_)) => {}
            Err(e) => return Outcome::Error(format!("receiving SCTP: {e}")),
        }
    }
}

/// The responder of one pod: answers INITs to `ports` until `stop` is set.
/// Polls with a short timeout so that it notices `stop`.
pub fn respond(
    fd: OwnedFd,
    ports: BTreeSet<u16>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = [0u8; 2048];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Ok(Some((n, from))) = recv_from(&fd, &mut buf, Duration::from_millis(100)) else {
            continue;
        };
        if let Some(reply) = sctp_of(&buf[..n]).and_then(|s| answer(s, &ports)) {
            let _ = send_to(&fd, &reply, from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_rfc_test_vector() {
        // RFC 3720, B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn an_init_to_a_served_port_gets_the_matching_init_ack() {
        let ports: BTreeSet<u16> = [80].into();
        let i = init(40_000, 80, 0xdead_beef);
        let ack = answer(&i, &ports).expect("answered");
        assert!(is_answer(&ack, 40_000, 80, 0xdead_beef));
        assert!(!is_answer(&ack, 40_001, 80, 0xdead_beef));
        assert!(
            answer(&init(40_000, 81, 1), &ports).is_none(),
            "unserved port"
        );
        assert!(
            answer(&ack, &[40_000].into()).is_none(),
            "an INIT-ACK is no INIT"
        );
        // The checksum covers the packet with the checksum field zeroed.
        let mut check = ack.clone();
        let stored = u32::from_le_bytes(check[8..12].try_into().unwrap());
        check[8..12].copy_from_slice(&[0; 4]);
        assert_eq!(crc32c(&check), stored);
    }
}
