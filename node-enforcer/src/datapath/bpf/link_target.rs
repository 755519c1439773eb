//! Which interface a pinned TCX link is on, as the kernel says
//! (`bpf_link_info`), not as its pin's name says. Links are pinned by the
//! name of the interface they were made for, and an interface can be
//! renamed; the index is what the link holds on to. A link whose interface
//! was deleted reads index 0 (the kernel lets go of the device).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `enum bpf_cmd`.
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
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
    let fd = open_pin(path).map_err(|source| LinkTargetError::Open {
        path: shown(),
        source,
    })?;
    // struct bpf_link_info up to its union's tcx member: type, id, prog_id,
    // 4 bytes of padding (the union is 8-aligned), then tcx.ifindex and
    // tcx.attach_type. The kernel fills what fits in the length given.
    let mut info = [0u32; 6];
    let info_ptr = info.as_mut_ptr() as u64;
    // struct { bpf_fd, info_len, info (u64) } of union bpf_attr.
    let mut attr = [
        fd.as_raw_fd() as u32,
        std::mem::size_of_val(&info) as u32,
        info_ptr as u32,
        (info_ptr >> 32) as u32,
    ];
    if sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) < 0 {
        return Err(LinkTargetError::Info {
            path: shown(),
            source: std::io::Error::last_os_error(),
        });
    }
    if info[0] != BPF_LINK_TYPE_TCX {
        return Err(LinkTargetError::NotTcx {
            path: shown(),
            found: info[0],
        });
    }
    Ok(info[4])
}

/// A new descriptor of the object pinned at `path`.
fn open_pin(path: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let ptr = c.as_ptr() as u64;
    // struct { pathname (u64), bpf_fd, file_flags } of union bpf_attr.
    let mut attr = [ptr as u32, (ptr >> 32) as u32, 0, 0];
    let fd = sys_bpf(BPF_OBJ_GET, &mut attr);
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn sys_bpf(cmd: libc::c_long, attr: &mut [u32]) -> libc::c_long {
    // SAFETY: `attr` is a live, initialised buffer of the length given;
    // every pointer in it names a buffer alive for the call.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() * 4) }
}
