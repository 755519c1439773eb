//! Interface events from the kernel (rtnetlink, RTMGRP_LINK): a pod veth
//! that vanishes without a CNI DEL, or a name reused by a new interface,
//! reaches the reconciler at once instead of at the next tick. Each event
//! only says "look again"; the reconciler re-reads which interfaces live
//! (level-triggered), so a lost or coalesced event costs nothing but time,
//! and the periodic tick is the backstop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::reconciler::Event;

const RTMGRP_LINK: u32 = 1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// Set while a [`Event::Links`] waits in the reconciler's queue: a burst of
/// kernel events (a pod's veth is created, renamed, moved, brought up and
/// addressed) becomes one look, not dozens queued ahead of pod-ups.
#[derive(Clone, Default)]
pub struct Pending(Arc<AtomicBool>);

impl Pending {
    /// The reconciler calls this as it handles the event.
    pub fn taken(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
    fn claim(&self) -> bool {
        !self.0.swap(true, Ordering::SeqCst)
    }
}

fn open() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket/bind syscalls; the fd is owned right away.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        // Address events too: the node's addresses are part of policy.
        addr.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
        if libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// Why interface events could not be watched.
#[derive(Debug, thiserror::Error)]
pub enum LinksError {
    /// The netlink socket could not be opened or bound.
    #[error("subscribing to interface events: {0}")]
    Subscribe(#[source] std::io::Error),
    #[error("starting the interface event thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Watches link events on a thread of its own until the reconciler is gone.
pub fn watch(events: mpsc::Sender<Event>, pending: Pending) -> Result<(), LinksError> {
    let fd = open().map_err(LinksError::Subscribe)?;
    std::thread::Builder::new()
        .name("link-events".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                // SAFETY: reading into an owned buffer of the given length.
                let n =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    // ENOBUFS: events were lost; looking again covers them.
                    if e.raw_os_error() != Some(libc::ENOBUFS)
                        && e.kind() != std::io::ErrorKind::Interrupted
                    {
                        tracing::warn!("interface events: {e}; relying on the periodic tick");
                        return;
                    }
                }
                if pending.claim() && events.blocking_send(Event::Links).is_err() {
                    return;
                }
            }
        })
        .map_err(LinksError::Thread)?;
    Ok(())
}
