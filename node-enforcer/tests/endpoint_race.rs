//! A packet never judges itself by another endpoint's policy while the
//! enforcer rewrites endpoints (DESIGN invariant 14; issue 18 item 4).
//!
//! One thread, pinned to one CPU, runs the real writer (`BpfDatapath`) in a
//! tight loop: it moves endpoint A between two address lists (its policy
//! stays), and changes, removes and re-adds endpoint B. Another thread,
//! pinned to
//! another CPU, runs the real program (BPF_PROG_TEST_RUN) on packets to A,
//! whose ingress is isolated by a table with no entries (everything is
//! denied), while B's ingress is open. A packet judged with B's bytes
//! passes, and is counted as "allowed, not isolated": that counter must
//! stay at zero while the denials pile up.
//!
//! IPv6 segments, so every packet takes the full verdict path (the IPv4
//! fast path only passes established flows, and a SYN is never one).
//! Needs root, bpffs and two CPUs.

use palisade_test_support::require_root;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aya::maps::{Map, MapData, PerCpuArray};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use aya::EbpfLoader;
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use palisade_ebpf::testkit::frames::tcp_flags;
use palisade_ebpf::{
    mapped_addr, stat_slot, HOOK_TO_POD, MAP_STATS, PROG_TO_POD, STAT_ALLOWED_UNISOLATED,
    STAT_DENIED,
};

/// Loopback: every namespace has it, so test runs can name it.
const A: u32 = 1;
/// Never run, only written: any index will do.
const B: u32 = 4242;
/// A table id with no entries: it denies every peer.
const DENY_EVERYTHING: u32 = 77;
const SYN: u8 = 0x02;
/// How long the two CPUs race; the writer completes tens of thousands of
/// rounds meanwhile.
const RACE: Duration = Duration::from_secs(20);
/// Test runs per BPF_PROG_TEST_RUN call.
const REPEAT: u32 = 2000;

struct PinRoot(PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu index");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .unwrap_or_else(|e| panic!("pinning to CPU {cpu}: {e}"));
}

fn entry(ingress: u32, addr: &str) -> EndpointEntry {
    EndpointEntry {
        ingress,
        egress: 0,
        pod_addrs: vec![mapped_addr(addr.parse().unwrap())],
    }
}

/// Packets of kind `stat` judged by the hook to the pod, on every CPU.
fn count(stats: &PerCpuArray<MapData, u64>, stat: u32) -> u64 {
    stats
        .get(&stat_slot(HOOK_TO_POD, stat), 0)
        .unwrap()
        .iter()
        .sum()
}

fn reader(root: &Path, stop: &AtomicBool) -> (u64, u64) {
    pin_to_cpu(1);
    // The programs again, sharing the writer's pinned maps: a reader that
    // writes nothing.
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(root)
        .load(palisade_ebpf::OBJECT)
        .expect("load the object");
    let prog: &mut SchedClassifier = ebpf.program_mut(PROG_TO_POD).unwrap().try_into().unwrap();
    prog.load().expect("verifier");
    let prog: &SchedClassifier = ebpf.program(PROG_TO_POD).unwrap().try_into().unwrap();
    let stats = PerCpuArray::try_from(Map::PerCpuArray(
        MapData::from_pin(root.join(MAP_STATS)).unwrap(),
    ))
    .unwrap();
    let frame = tcp_flags("fd00::9", 40000, "fd00::1", 80, SYN);
    let mut ctx = [0u8; 44];
    ctx[40..44].copy_from_slice(&A.to_ne_bytes());
    let mut out = vec![0u8; frame.len() + 256];
    let before = (
        count(&stats, STAT_ALLOWED_UNISOLATED),
        count(&stats, STAT_DENIED),
    );
    while !stop.load(Ordering::Relaxed) {
        prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            repeat: REPEAT,
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    }
    (
        count(&stats, STAT_ALLOWED_UNISOLATED) - before.0,
        count(&stats, STAT_DENIED) - before.1,
    )
}

#[test]
#[ignore = "needs root"]
fn no_packet_is_judged_by_another_endpoints_policy_while_endpoints_change() {
    require_root();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "the race needs two CPUs, this machine has {cpus}"
    );
    let root = PinRoot(PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-ep-race-{}",
        std::process::id()
    )));
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let a = entry(DENY_EVERYTHING, "fd00::1");
    let a_moved = entry(DENY_EVERYTHING, "fd00::4");
    dp.set_endpoint(A, &a).unwrap();
    dp.set_endpoint(B, &entry(0, "fd00::2")).unwrap();

    let stop = AtomicBool::new(false);
    let (rounds, (wrong, denied)) = std::thread::scope(|s| {
        let reading = s.spawn(|| reader(&root.0, &stop));
        pin_to_cpu(0);
        let started = Instant::now();
        let mut rounds = 0u64;
        while started.elapsed() < RACE {
            // A given new addresses and back (its policy the same), B
            // changed, B gone and back: every kind of write the enforcer
            // makes to the endpoint maps.
            dp.set_endpoint(A, &a_moved).unwrap();
            dp.set_endpoint(B, &entry(0, "fd00::2")).unwrap();
            dp.set_endpoint(B, &entry(0, "fd00::3")).unwrap();
            dp.remove_endpoint(B).unwrap();
            dp.set_endpoint(B, &entry(0, "fd00::2")).unwrap();
            dp.set_endpoint(A, &a).unwrap();
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        (rounds, reading.join().expect("reader"))
    });
    println!(
        "writer_rounds={rounds} packets_denied={denied} packets_judged_by_another_endpoint={wrong}"
    );
    assert!(denied > 0, "the reader ran no packet");
    assert_eq!(
        wrong,
        0,
        "{wrong} of {} packets to A were judged by B's open policy",
        wrong + denied
    );
}
