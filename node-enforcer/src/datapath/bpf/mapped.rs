//! A memory-mapped BPF array (`BPF_F_MMAPABLE`): its values, in place, as
//! the programs see them. Writes that packets may see go through atomics
//! ([`Mapped::store_u32`], [`Mapped::store_u64`], [`Mapped::add_u64`]); a
//! whole value is written with [`Mapped::write`] only where no packet
//! trusts it (the caller's protocol says when).

use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub(crate) struct Mapped<T> {
    base: *mut u8,
    len: usize,
    /// Values mapped; every index is checked against it.
    entries: u32,
    _values: PhantomData<T>,
}

// SAFETY: the mapping is shared memory the kernel owns; every access goes
// through raw pointers with volatile or atomic operations, never Rust
// references to the values, so sharing it between threads is sound.
unsafe impl<T> Send for Mapped<T> {}
unsafe impl<T> Sync for Mapped<T> {}

impl<T: Copy> Mapped<T> {
    /// Maps all `entries` values of the array behind `fd`. `T` must be the
    /// map's value type, a multiple of 8 bytes (the kernel's stride).
    pub(crate) fn new(fd: BorrowedFd<'_>, entries: u32, writable: bool) -> std::io::Result<Self> {
        assert_eq!(
            std::mem::size_of::<T>() % 8,
            0,
            "values are laid out 8-byte aligned"
        );
        let page = 4096usize;
        let len = (entries as usize * std::mem::size_of::<T>()).div_ceil(page) * page;
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh shared mapping of the map's fd; the kernel checks
        // the length against the map and the flags against its own.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped {
            base: base.cast(),
            len,
            entries,
            _values: PhantomData,
        })
    }

    fn at(&self, i: u32, offset: usize) -> *mut u8 {
        assert!(i < self.entries, "index {i} past the array");
        assert!(offset < std::mem::size_of::<T>());
        // SAFETY: in bounds of the mapping (checked above).
        unsafe {
            self.base
                .add(i as usize * std::mem::size_of::<T>() + offset)
        }
    }

    /// A copy of value `i`, read field by field as it is now (a packet may
    /// be changing nothing the caller relies on being whole, or the caller
    /// is the only writer).
    pub(crate) fn read(&self, i: u32) -> T {
        // SAFETY: in bounds; T is a plain-data map value.
        unsafe { std::ptr::read_volatile(self.at(i, 0).cast::<T>()) }
    }

    /// Overwrites value `i` whole: only where no packet trusts it.
    pub(crate) fn write(&self, i: u32, value: T) {
        // SAFETY: in bounds; T is a plain-data map value.
        unsafe { std::ptr::write_volatile(self.at(i, 0).cast::<T>(), value) }
    }

    fn u32_at(&self, i: u32, offset: usize) -> &AtomicU32 {
        assert_eq!(offset % 4, 0);
        // SAFETY: in bounds and 4-byte aligned (the mapping is page
        // aligned and values are 8-byte multiples); shared memory is valid
        // for atomics.
        unsafe { &*self.at(i, offset).cast::<AtomicU32>() }
    }

    fn u64_at(&self, i: u32, offset: usize) -> &AtomicU64 {
        assert_eq!(offset % 8, 0);
        // SAFETY: as above, 8-byte aligned.
        unsafe { &*self.at(i, offset).cast::<AtomicU64>() }
    }

    /// One release store of the u32 at `offset` of value `i`: everything
    /// written before it is seen by whoever sees it.
    pub(crate) fn store_u32(&self, i: u32, offset: usize, v: u32) {
        self.u32_at(i, offset).store(v, Ordering::Release)
    }

    pub(crate) fn load_u64(&self, i: u32, offset: usize) -> u64 {
        self.u64_at(i, offset).load(Ordering::Acquire)
    }

    /// One release store of the u64 at `offset` of value `i`.
    pub(crate) fn store_u64(&self, i: u32, offset: usize, v: u64) {
        self.u64_at(i, offset).store(v, Ordering::Release)
    }

    /// Adds `v` (wrapping) to the u64 at `offset`, as the programs'
    /// atomic adds do.
    pub(crate) fn add_u64(&self, i: u32, offset: usize, v: u64) {
        self.u64_at(i, offset).fetch_add(v, Ordering::AcqRel);
    }
}

impl<T> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}
