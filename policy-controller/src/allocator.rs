//! The heap allocator of the controller's binary (and of its benchmarks,
//! which must measure what ships).
//!
//! A cluster-wide change rebuilds and decodes a plan entry for every pod it
//! reaches, each a tree of small allocations. With glibc's allocator,
//! freeing them was half the time of an edit that reaches all 100,000 pods
//! of the full-scale benchmark (1,050 of 2,000 ms for the deltas alone);
//! with mimalloc, about 230 ms. mimalloc keeps freed memory 1 s before it
//! returns it to the system (its default purge delay), so one change's
//! memory is reused by the next while changes come.
//!
//! Transparent huge pages are not asked for (the `no_thp` feature): on a
//! node whose THP defrag setting is `madvise` (Debian's default), every
//! fault in an madvised region may compact memory first, and the full
//! computation of the mixed benchmark shape took anywhere from 1.0 to 3.3 s
//! from run to run.

pub use mimalloc::MiMalloc as Allocator;
