//! Running the programs in the kernel with BPF_PROG_TEST_RUN on hand-built
//! frames: what the verdict tests (`tests/verdict.rs`) and the verdict
//! benchmark (`node-enforcer/benches/verdict`) share, so both judge the same
//! programs set up the same way. Needs root and a bpffs at /sys/fs/bpf.
//!
//! Everything here panics on failure: it drives tests and benchmarks, where
//! a failed load or map write means the run is meaningless.

use crate::Aligned;

pub mod frames;
mod harness;

pub use harness::{
    cidr_key, ct, ct_at, ip, skb_ctx, test_run, Harness, PinDir, ALLOW, DROP, HOLD, LO, POD4, POD6,
};

static ALIGNED_HEADERS_BY_COPY_OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/palisade-headers-by-copy.bpf.o"
)));

/// [`crate::OBJECT`] built to read every header with bpf_skb_load_bytes,
/// the fallback for headers in paged data, which BPF_PROG_TEST_RUN (whose
/// skbs are linear) never takes otherwise. Tests only.
pub static HEADERS_BY_COPY_OBJECT: &[u8] = &ALIGNED_HEADERS_BY_COPY_OBJECT.0;

static ALIGNED_BENCH_OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/bench.bpf.o")));

/// The benchmark's own programs (`c/bench.bpf.c`), never attached anywhere.
pub static BENCH_OBJECT: &[u8] = &ALIGNED_BENCH_OBJECT.0;

/// Parses Ethernet, IP and ports with direct packet access and returns
/// `TC_ACT_OK`: the floor every verdict is compared with.
pub const PROG_BENCH_BARE: &str = "bench_bare";
/// Gives each run a source port of its own, then tail-calls slot 0 of
/// [`MAP_BENCH_TARGETS`].
pub const PROG_BENCH_NEW_FLOW: &str = "bench_new_flow";
/// Returns at once; in slot 0 it measures [`PROG_BENCH_NEW_FLOW`]'s own cost.
pub const PROG_BENCH_RETURN: &str = "bench_return";
/// `ProgramArray` of one slot: the program [`PROG_BENCH_NEW_FLOW`] runs.
pub const MAP_BENCH_TARGETS: &str = "bench_targets";
/// Source ports [`PROG_BENCH_NEW_FLOW`] cycles through: a run of at most
/// this many repeats never repeats a flow.
pub use crate::sizes::BENCH_NEW_FLOW_PORTS;
