//! The node's own addresses, from rtnetlink RTM_GETADDR dumps, one per
//! family.
//!
//! The reconciler reads them on every burst of link or address events (a
//! pod-up brings several). glibc's `getifaddrs` dumps every link first,
//! with its statistics, before the addresses: on a node with hundreds of
//! pod veths that link dump was most of the reconciler's time in a pod-up
//! burst. An address dump carries only addresses.
//!
//! One dump per family, not one of every family (AF_UNSPEC): recent
//! kernels serve the per-family dumps of IPv4 and IPv6 under RCU, the
//! all-families one holding RTNL (seen on 6.18 with perf: no wait in
//! `rtnl_dumpit` left), so the dump no longer queues behind the veths other
//! plugins create in a burst, nor delays them. Older kernels take RTNL for
//! both, as for the one dump before. A kernel without IPv6 answers the
//! IPv6 dump with every family's addresses: duplicates, removed below.
//!
//! An address of a Service interface ([`SERVICE_INTERFACES`]) is not the
//! node's: kube-proxy in IPVS mode binds every Service's ClusterIP (and
//! LoadBalancer and external IPs) to `kube-ipvs0`, NodeLocal DNSCache the
//! kube-dns ClusterIP to `nodelocaldns`. Counted as the node, which every
//! policy allows, they would open every Service to every pod whatever its
//! egress policy says (a pod's hook sees the ClusterIP before the host
//! translates it), and grow every table by one entry per Service.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const IFADDRMSG_LEN: usize = 8;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;

/// Why the addresses could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("rtnetlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("rtnetlink address dump: {0}")]
    Malformed(String),
}

/// The interfaces whose addresses are Services' rather than the node's,
/// by the names their owners give them (kube-proxy's is fixed; NodeLocal
/// DNSCache's is its default). Matched by name, not by kind: a node's own
/// address may live on a dummy interface (a router id in BGP fabrics), and
/// the kubelet's probes come from it.
pub const SERVICE_INTERFACES: [&str; 2] = ["kube-ipvs0", "nodelocaldns"];

/// Every address of the node (all interfaces but the Service interfaces,
/// IPv4 and IPv6, without IPv6 link-local ones), sorted, without
/// duplicates.
pub fn node_addresses() -> Result<Vec<IpAddr>, AddressError> {
    let fd = socket()?;
    let services = service_interface_indexes()?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    for (seq, family) in [(1u32, libc::AF_INET), (2, libc::AF_INET6)] {
        send_request(&fd, seq, family as u8)?;
        loop {
            // SAFETY: reading into an owned buffer of the given length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if parse(&buf[..n as usize], seq, &mut out)? {
                break;
            }
        }
    }
    // Link-local addresses exist per interface (one more with every pod
    // veth) and never source a connection to a pod; counting them would
    // rewrite every table on each pod add.
    out.retain(|(a, ifindex)| {
        !matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()) && !services.contains(ifindex)
    });
    let mut out: Vec<IpAddr> = out.into_iter().map(|(a, _)| a).collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// The indexes of the Service interfaces present (two SIOCGIFINDEX, no
/// RTNL).
fn service_interface_indexes() -> Result<Vec<u32>, AddressError> {
    let lookup = super::ifindex::IndexLookup::open()?;
    let mut out = Vec::new();
    for name in SERVICE_INTERFACES {
        out.extend(lookup.index(name)?);
    }
    Ok(out)
}

fn socket() -> std::io::Result<OwnedFd> {
    // SAFETY: a plain socket syscall; the fd is owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn send_request(fd: &OwnedFd, seq: u32, family: u8) -> std::io::Result<()> {
    let len = NLMSG_HDRLEN + IFADDRMSG_LEN;
    let mut req = Vec::with_capacity(len);
    req.extend_from_slice(&(len as u32).to_ne_bytes());
    req.extend_from_slice(&RTM_GETADDR.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&seq.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    // ifaddrmsg: the family, the rest zero (every interface).
    let mut ifaddrmsg = [0u8; IFADDRMSG_LEN];
    ifaddrmsg[0] = family;
    req.extend_from_slice(&ifaddrmsg);
    let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    to.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: sending an owned buffer to a zeroed kernel address.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            &to as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Adds the addresses of one datagram of the dump to `out`; true once the
/// dump is done. Messages of another sequence are not ours and are skipped.
fn parse(mut b: &[u8], seq: u32, out: &mut Vec<(IpAddr, u32)>) -> Result<bool, AddressError> {
    while !b.is_empty() {
        if b.len() < NLMSG_HDRLEN {
            return Err(AddressError::Malformed(format!(
                "{} bytes left, less than a message header",
                b.len()
            )));
        }
        let len = u32_at(b, 0) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(AddressError::Malformed(format!(
                "message length {len} with {} bytes left",
                b.len()
            )));
        }
        let kind = u16_at(b, 4);
        let msg = &b[..len];
        b = &b[align4(len).min(b.len())..];
        if u32_at(msg, 8) != seq {
            continue;
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = if msg.len() >= NLMSG_HDRLEN + 4 {
                    -(u32_at(msg, NLMSG_HDRLEN) as i32)
                } else {
                    0
                };
                if errno == 0 {
                    continue;
                }
                return Err(std::io::Error::from_raw_os_error(errno).into());
            }
            RTM_NEWADDR => {
                if let Some(a) = address(&msg[NLMSG_HDRLEN..])? {
                    out.push(a);
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

/// One RTM_NEWADDR body: ifaddrmsg, then attributes; the address and its
/// interface's index. An IPv4 address is IFA_LOCAL where present: on a
/// point-to-point link IFA_ADDRESS is the peer's (as getifaddrs reads it).
fn address(body: &[u8]) -> Result<Option<(IpAddr, u32)>, AddressError> {
    if body.len() < IFADDRMSG_LEN {
        return Err(AddressError::Malformed(format!(
            "an address message of {} bytes",
            body.len()
        )));
    }
    let family = body[0] as i32;
    // struct ifaddrmsg: family, prefixlen, flags, scope, then the index.
    let ifindex = u32_at(body, 4);
    let mut attrs = &body[IFADDRMSG_LEN..];
    let (mut local, mut address) = (None, None);
    while attrs.len() >= 4 {
        let len = u16_at(attrs, 0) as usize;
        if len < 4 || len > attrs.len() {
            return Err(AddressError::Malformed(format!(
                "attribute length {len} with {} bytes left",
                attrs.len()
            )));
        }
        let kind = u16_at(attrs, 2);
        let value = &attrs[4..len];
        let ip = match (family, value.len()) {
            (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::new(
                value[0], value[1], value[2], value[3],
            ))),
            (libc::AF_INET6, 16) => {
                let mut o = [0u8; 16];
                o.copy_from_slice(value);
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            _ => None,
        };
        match kind {
            IFA_LOCAL => local = local.or(ip),
            IFA_ADDRESS => address = address.or(ip),
            _ => {}
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    Ok(local.or(address).map(|a| (a, ifindex)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize(align4(a.len()), 0);
        a
    }

    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDRLEN + body.len();
        let mut m = (len as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m.resize(align4(m.len()), 0);
        m
    }

    fn addr_body(family: i32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut b = vec![family as u8, 24, 0, 0];
        b.extend_from_slice(&7u32.to_ne_bytes());
        for a in attrs {
            b.extend_from_slice(a);
        }
        b
    }

    #[test]
    fn a_dump_gives_local_before_peer_and_ends_at_done() {
        let mut dgram = message(
            RTM_NEWADDR,
            1,
            &addr_body(
                libc::AF_INET,
                &[
                    attr(IFA_ADDRESS, &[10, 0, 0, 2]),
                    attr(IFA_LOCAL, &[10, 0, 0, 1]),
                ],
            ),
        );
        let v6: [u8; 16] = "fd00::5".parse::<Ipv6Addr>().unwrap().octets();
        dgram.extend(message(
            RTM_NEWADDR,
            1,
            &addr_body(libc::AF_INET6, &[attr(IFA_ADDRESS, &v6)]),
        ));
        // Another request's message is not ours.
        dgram.extend(message(
            RTM_NEWADDR,
            9,
            &addr_body(libc::AF_INET, &[attr(IFA_LOCAL, &[192, 0, 2, 1])]),
        ));
        let mut out = Vec::new();
        assert!(!parse(&dgram, 1, &mut out).unwrap());
        assert_eq!(
            out,
            vec![
                ("10.0.0.1".parse::<IpAddr>().unwrap(), 7),
                ("fd00::5".parse().unwrap(), 7)
            ]
        );
        assert!(parse(&message(NLMSG_DONE, 1, &[0; 4]), 1, &mut out).unwrap());
    }

    #[test]
    fn damaged_messages_and_kernel_errors_are_errors() {
        let mut out = Vec::new();
        let mut m = message(NLMSG_DONE, 1, &[0; 4]);
        m[0] = 200; // longer than the datagram
        assert!(matches!(
            parse(&m, 1, &mut out),
            Err(AddressError::Malformed(_))
        ));
        assert!(parse(&m[..10], 1, &mut out).is_err(), "a torn header");
        let mut bad_attr = addr_body(libc::AF_INET, &[attr(IFA_LOCAL, &[1, 2, 3, 4])]);
        bad_attr[IFADDRMSG_LEN] = 99;
        assert!(parse(&message(RTM_NEWADDR, 1, &bad_attr), 1, &mut out).is_err());
        let e = parse(
            &message(NLMSG_ERROR, 1, &(-libc::EPERM).to_ne_bytes()),
            1,
            &mut out,
        )
        .unwrap_err();
        assert!(e.to_string().contains("not permitted"), "{e}");
        assert!(out.is_empty());
    }
}
