//! A TCX link made on an interface by its index, at the head of the hook's
//! chain. The index is what a pod's interface is known by: a name can be
//! renamed, or taken by a newer interface, between reading it and
//! attaching by it, and aya 0.14 attaches only by name. Made by index,
//! the link needs no check of where it went (whose reading,
//! `tcx_link_fill_info`, takes RTNL).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use aya::programs::TcAttachType;

use crate::sys_bpf;

/// `enum bpf_attach_type`: the TCX hooks.
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
/// With no relative link or program named: before all of them.
const BPF_F_BEFORE: u32 = 1 << 3;

/// The `link_create` member of `union bpf_attr`, up to its `tcx` member.
#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_fd: u32,
    _pad: u32,
    expected_revision: u64,
}

/// Attaches `prog` first on `hook` of interface `ifindex`; the new link's
/// descriptor (the link lives while it or a pin of it does). ENODEV: no
/// interface has that index.
pub fn attach_first(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    hook: TcAttachType,
) -> std::io::Result<OwnedFd> {
    let attach_type = match hook {
        TcAttachType::Ingress => BPF_TCX_INGRESS,
        TcAttachType::Egress => BPF_TCX_EGRESS,
        TcAttachType::Custom(parent) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("TCX has no custom parent ({parent:#x})"),
            ))
        }
    };
    let mut attr = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type,
        flags: BPF_F_BEFORE,
        relative_fd: 0,
        _pad: 0,
        expected_revision: 0,
    };
    // SAFETY: `attr` is laid out as `link_create` up to `tcx`, without
    // pointers.
    unsafe { sys_bpf::call(sys_bpf::cmd::LINK_CREATE, &mut attr) }.map(sys_bpf::owned_fd)
}
