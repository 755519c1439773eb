//! What the workspace's tests share: how a test that needs root says so,
//! and how a test scrapes a metrics endpoint ([`metrics`]).
//!
//! Tests come in two tiers:
//! - pure tests run everywhere, with a plain `cargo test`;
//! - tests that need root (real eBPF, network namespaces, conntrack, the
//!   lab) are marked `#[ignore = "needs root"]` and start with
//!   [`require_root`]. A plain `cargo test` lists them as ignored, by name;
//!   `cargo test -- --include-ignored` (what `scripts/test.sh` runs) runs
//!   them, and there a missing root fails the test. A root test never
//!   passes by returning early.

pub mod metrics;

use std::os::unix::fs::MetadataExt;

/// Fails the test unless the process runs as root.
#[track_caller]
pub fn require_root() {
    assert!(
        is_root(),
        "this test needs root (it loads eBPF programs, makes network namespaces or \
         talks to the kernel's conntrack): run it as root, or leave it ignored \
         (a plain `cargo test` does)"
    );
}

/// Whether the process's effective user is root: `/proc/self` belongs to it.
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}
