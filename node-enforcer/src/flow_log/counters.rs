//! What the flow log's user-space half counts, for metrics: process-wide,
//! like the pod-up histogram, so the scraper needs no handle to it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Lines written to the output.
pub static LINES_WRITTEN: AtomicU64 = AtomicU64::new(0);
/// Lines dropped because the writer's queue was full (a slow output).
pub static WRITE_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Ring buffer records that were not a flow event (wrong size): a datapath
/// of another version. Skipped.
pub static MALFORMED: AtomicU64 = AtomicU64::new(0);

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
