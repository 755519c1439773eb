//! Running the programs in the kernel with BPF_PROG_TEST_RUN on hand-built
//! frames: what the verdict tests (`tests/verdict.rs`) and the verdict
//! benchmark (`src/bin/bench-verdict`) share, so both judge the same
//! programs set up the same way. Needs root and a bpffs at /sys/fs/bpf.
//!
//! Everything here panics on failure: it drives tests and benchmarks, where
//! a failed load or map write means the run is meaningless.

pub mod frames;
mod harness;

pub use harness::{
    cidr_key, ct, ct_at, ip, skb_ctx, test_run, Harness, PinDir, ALLOW, DROP, LO, POD4, POD6,
};
