//! The bpf(2) system call, for what aya 0.14 does not offer: batch map
//! operations, a program whose kfunc calls we relocate, BTF objects by id,
//! which interface a pinned link is on, and TCX links made by index. One home for the call and its
//! command numbers; each caller lays out its own member of `union bpf_attr`.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `enum bpf_cmd`: the commands used here.
pub mod cmd {
    pub const MAP_LOOKUP_ELEM: libc::c_long = 1;
    pub const MAP_DELETE_ELEM: libc::c_long = 3;
    pub const MAP_GET_NEXT_KEY: libc::c_long = 4;
    pub const PROG_LOAD: libc::c_long = 5;
    pub const OBJ_PIN: libc::c_long = 6;
    pub const OBJ_GET: libc::c_long = 7;
    pub const PROG_TEST_RUN: libc::c_long = 10;
    pub const OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    pub const BTF_GET_FD_BY_ID: libc::c_long = 19;
    pub const BTF_GET_NEXT_ID: libc::c_long = 23;
    pub const MAP_LOOKUP_BATCH: libc::c_long = 24;
    pub const MAP_DELETE_BATCH: libc::c_long = 27;
    pub const LINK_CREATE: libc::c_long = 28;
}

/// bpf(2) with `attr` as the command's member of `union bpf_attr`; the
/// call's result (a new descriptor, for commands that make one).
///
/// # Safety
/// `attr` must be laid out as that member (`#[repr(C)]`, or `u32` words),
/// and every pointer in it must name a buffer of the size the command
/// expects, alive for the call.
pub unsafe fn call<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: as the caller promises; the size is `attr`'s own.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The descriptor a successful command returned, owned.
pub fn owned_fd(r: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us alone.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// The kernel's `bpf_*_info` of object `fd` into `info`, as much of it as
/// `info` holds (the kernel fills what fits).
///
/// # Safety
/// `info` must be laid out as a prefix of the object's info struct, and
/// every pointer in it must name a buffer of the length given beside it.
pub unsafe fn obj_info<T>(fd: BorrowedFd<'_>, info: &mut T) -> std::io::Result<()> {
    let info_ptr = info as *mut T as u64;
    // struct { bpf_fd, info_len, info (u64) }.
    let mut attr = [
        fd.as_raw_fd() as u32,
        std::mem::size_of::<T>() as u32,
        info_ptr as u32,
        (info_ptr >> 32) as u32,
    ];
    // SAFETY: `attr` is the member OBJ_GET_INFO_BY_FD reads; `info` is as
    // the caller promises, of the length given.
    unsafe { call(cmd::OBJ_GET_INFO_BY_FD, &mut attr) }.map(drop)
}

/// A new descriptor of the object pinned at `path`.
pub fn obj_get(path: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let ptr = c.as_ptr() as u64;
    // struct { pathname (u64), bpf_fd, file_flags }.
    let mut attr = [ptr as u32, (ptr >> 32) as u32, 0, 0];
    // SAFETY: `pathname` names `c`, NUL-terminated and alive for the call.
    unsafe { call(cmd::OBJ_GET, &mut attr) }.map(owned_fd)
}

/// Pins object `fd` at `path` (on a bpffs).
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let ptr = c.as_ptr() as u64;
    // struct { pathname (u64), bpf_fd, file_flags }.
    let mut attr = [ptr as u32, (ptr >> 32) as u32, fd.as_raw_fd() as u32, 0];
    // SAFETY: `pathname` names `c`, NUL-terminated and alive for the call.
    unsafe { call(cmd::OBJ_PIN, &mut attr) }.map(drop)
}
