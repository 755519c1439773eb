//! Interface indexes by name (and names by index), many on one socket.
//!
//! The reconciler looks up every interface it knows on each burst of link
//! events (a pod-up brings several). `if_nametoindex` opens and closes a
//! socket per name: with 200 pods that was most of each event's time in a
//! pod-up burst (0.7 ms at p50, 16 ms at worst with the CPUs busy), and
//! every pod-up queued behind it (issue 19.6). One socket per walk, and a
//! SIOCGIFINDEX per name (no RTNL: the kernel reads the name under RCU).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A socket to ask the kernel for interface indexes (in the namespace the
/// socket was made in: the caller's).
pub struct IndexLookup {
    fd: OwnedFd,
}

impl IndexLookup {
    pub fn open() -> std::io::Result<Self> {
        // SAFETY: a plain socket syscall; the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket and nothing else owns it.
        Ok(IndexLookup {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The index of interface `name`; None when there is none of that name
    /// (a name no interface can have included).
    pub fn index(&self, name: &str) -> std::io::Result<Option<u32>> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Ok(None);
        }
        // SAFETY: ifreq is plain data; all zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
            *dst = src as libc::c_char;
        }
        // SAFETY: SIOCGIFINDEX reads the name and writes the index into
        // the ifreq we own, which outlives the call.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENODEV) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: on success the kernel set the union's index member.
        let index = unsafe { req.ifr_ifru.ifru_ifindex };
        Ok(u32::try_from(index).ok())
    }

    /// The name interface `index` has now; None when there is none of that
    /// index. SIOCGIFNAME, no RTNL either.
    pub fn name(&self, index: u32) -> std::io::Result<Option<String>> {
        let Ok(index) = libc::c_int::try_from(index) else {
            return Ok(None);
        };
        // SAFETY: ifreq is plain data; all zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        req.ifr_ifru.ifru_ifindex = index;
        // SAFETY: SIOCGIFNAME reads the index and writes the name into the
        // ifreq we own, which outlives the call.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFNAME, &mut req) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENODEV) => Ok(None),
                _ => Err(e),
            };
        }
        // The kernel writes a NUL-terminated name of fewer than IFNAMSIZ bytes.
        let name: Vec<u8> = req
            .ifr_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(Some(String::from_utf8_lossy(&name).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_as_if_nametoindex_says_and_bad_names_are_none() {
        let lookup = IndexLookup::open().unwrap();
        assert_eq!(
            lookup.index("lo").unwrap(),
            Some(nix::net::if_::if_nametoindex("lo").unwrap())
        );
        for name in ["", "no-such-if-xyz", "a-name-longer-than-ifnamsiz", "lo\0x"] {
            assert_eq!(lookup.index(name).unwrap(), None, "{name:?}");
        }
    }

    #[test]
    fn indexes_name_as_if_indextoname_says_and_unused_ones_are_none() {
        let lookup = IndexLookup::open().unwrap();
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        assert_eq!(lookup.name(lo).unwrap().as_deref(), Some("lo"));
        for index in [0x7fff_fff0, u32::MAX] {
            assert_eq!(lookup.name(index).unwrap(), None, "{index}");
        }
    }
}
