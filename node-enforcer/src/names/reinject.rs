//! Sends a held answer on to its pod, past the hook that held it.
//!
//! The datapath holds an answer on the host veth's egress hook until the
//! learner has written what it teaches. The answer is then sent again as
//! the very frame it was, on the same interface, through a packet socket
//! with `PACKET_QDISC_BYPASS`: such a frame skips the interface's qdisc
//! layer, where the egress hook runs, so it is not held a second time
//! (nor judged again: it was judged, and allowed, before it was held).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `PACKET_QDISC_BYPASS` from linux/if_packet.h (not in every libc).
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const ETH_HLEN: usize = 14;

/// One send-only packet socket for every interface.
pub struct Reinjector {
    fd: OwnedFd,
}

impl Reinjector {
    /// Opens the socket (needs CAP_NET_RAW in the node's network namespace).
    pub fn new() -> io::Result<Self> {
        // Protocol 0: the socket receives nothing, it only sends.
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new, valid descriptor owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let on: libc::c_int = 1;
        // SAFETY: the option value is a c_int that outlives the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_QDISC_BYPASS,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Reinjector { fd })
    }

    /// Sends `frame` (Ethernet header included) out of interface `ifindex`.
    pub fn send(&self, ifindex: u32, frame: &[u8]) -> io::Result<()> {
        if frame.len() < ETH_HLEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a frame of {} bytes has no Ethernet header", frame.len()),
            ));
        }
        // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        // The frame's own ethertype, already in network order.
        to.sll_protocol = u16::from_ne_bytes([frame[12], frame[13]]);
        to.sll_ifindex = ifindex as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: buffer and address are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if sent as usize != frame.len() {
            return Err(io::Error::other(format!(
                "sent {sent} of {} bytes on interface {ifindex}",
                frame.len()
            )));
        }
        Ok(())
    }
}
