//! Which interface a pinned TCX link is on, as the kernel says
//! (`bpf_link_info`), not as its pin's name says. Links are pinned by the
//! name of the interface they were made for, and an interface can be
//! renamed; the index is what the link holds on to. A link whose interface
//! was deleted reads index 0 (the kernel lets go of the device).

use std::os::fd::AsFd;
use std::path::Path;

use crate::sys_bpf;

/// `enum bpf_link_type`: BPF_LINK_TYPE_TCX.
const BPF_LINK_TYPE_TCX: u32 = 11;

/// Why a pin's interface could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LinkTargetError {
    #[error("opening the pinned link {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the link pinned at {path}: {source}")]
    Info {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds a link of type {found}, not a TCX link")]
    NotTcx { path: String, found: u32 },
}

/// The index of the interface the TCX link pinned at `path` is attached
/// to; 0 when that interface is gone.
pub fn pinned_tcx_ifindex(path: &Path) -> Result<u32, LinkTargetError> {
    let shown = || path.display().to_string();
    let fd = sys_bpf::obj_get(path).map_err(|source| LinkTargetError::Open {
        path: shown(),
        source,
    })?;
    // struct bpf_link_info up to its union's tcx member: type, id, prog_id,
    // 4 bytes of padding (the union is 8-aligned), then tcx.ifindex and
    // tcx.attach_type.
    let mut info = [0u32; 6];
    // SAFETY: a prefix of bpf_link_info, without pointers.
    unsafe { sys_bpf::obj_info(fd.as_fd(), &mut info) }.map_err(|source| {
        LinkTargetError::Info {
            path: shown(),
            source,
        }
    })?;
    if info[0] != BPF_LINK_TYPE_TCX {
        return Err(LinkTargetError::NotTcx {
            path: shown(),
            found: info[0],
        });
    }
    Ok(info[4])
}
