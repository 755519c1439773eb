//! Which host interface is the pod's: the peer of the container interface
//! (CNI_IFNAME inside CNI_NETNS), read from the kernel. prevResult cannot
//! say: after the `bridge` plugin it lists the bridge and the veth, both
//! without `sandbox`, and attaching to the bridge would judge every pod's
//! traffic by the last pod's policy.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Finds the host-side interface of a pod.
pub trait HostVeth {
    fn host_interface(&self, netns: &str, ifname: &str) -> Result<String, String>;
}

/// The kernel's answer: IFLA_LINK of the container interface, named in the
/// plugin's own (host) namespace.
pub struct Kernel;

impl HostVeth for Kernel {
    fn host_interface(&self, netns: &str, ifname: &str) -> Result<String, String> {
        let (netns_path, name) = (netns.to_string(), ifname.to_string());
        // setns affects only the calling thread, so the lookup runs on one
        // of its own and the plugin's namespace never changes.
        let peer = std::thread::spawn(move || peer_index_in(&netns_path, &name))
            .join()
            .map_err(|_| "the interface lookup thread panicked".to_string())??;
        nix::net::if_::if_indextoname(peer)
            .map(|n| n.to_string_lossy().into_owned())
            .map_err(|e| {
                format!("the peer of {ifname} (index {peer}) is not in the host namespace: {e}")
            })
    }
}

fn peer_index_in(netns: &str, ifname: &str) -> Result<u32, String> {
    let ns = std::fs::File::open(netns).map_err(|e| format!("opening netns {netns}: {e}"))?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("entering netns {netns}: {e}"))?;
    let index = nix::net::if_::if_nametoindex(ifname)
        .map_err(|e| format!("interface {ifname} in {netns}: {e}"))?;
    link_of(index).map_err(|e| format!("reading the peer of {ifname} in {netns}: {e}"))
}

const IFLA_LINK: u16 = 5;

/// RTM_GETLINK for one index in the current namespace; its IFLA_LINK.
fn link_of(index: u32) -> Result<u32, String> {
    // SAFETY: a netlink socket owned right away; request and reply are
    // plain byte buffers parsed with bounds checks below.
    let fd = unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        OwnedFd::from_raw_fd(fd)
    };
    let mut req = [0u8; 32];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // struct ifinfomsg at 16: family, pad, type, index (i32), flags, change.
    req[20..24].copy_from_slice(&(index as i32).to_ne_bytes());
    // SAFETY: sending and receiving owned buffers of the given lengths.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let mut buf = vec![0u8; 16 * 1024];
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    parse_link(&buf[..n as usize])
}

fn parse_link(msg: &[u8]) -> Result<u32, String> {
    let u16_at = |o: usize| u16::from_ne_bytes([msg[o], msg[o + 1]]);
    if msg.len() < 16 + 16 {
        return Err("short netlink reply".into());
    }
    let kind = u16_at(4);
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = i32::from_ne_bytes(msg[16..20].try_into().expect("4 bytes"));
        return Err(std::io::Error::from_raw_os_error(-errno).to_string());
    }
    let total =
        (u32::from_ne_bytes(msg[0..4].try_into().expect("4 bytes")) as usize).min(msg.len());
    let mut o = 32; // nlmsghdr (16) + ifinfomsg (16)
    while o + 4 <= total {
        let alen = u16_at(o) as usize;
        if alen < 4 || o + alen > total {
            break;
        }
        if u16_at(o + 2) & 0x3fff == IFLA_LINK && alen >= 8 {
            return Ok(u32::from_ne_bytes(
                msg[o + 4..o + 8].try_into().expect("4 bytes"),
            ));
        }
        o += (alen + 3) & !3;
    }
    Err("the container interface has no peer (not a veth?)".into())
}

/// For tests without namespaces: the answer is given.
pub struct Fixed(pub String);

impl HostVeth for Fixed {
    fn host_interface(&self, _: &str, _: &str) -> Result<String, String> {
        Ok(self.0.clone())
    }
}
