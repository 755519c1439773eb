//! Flow events: what the programs put in `pal_flow_events` for each kind
//! of verdict under each flow log mode, the node-wide rate limit, and the
//! counters for what the rate limit and a full ring buffer dropped. Runs
//! the real programs with BPF_PROG_TEST_RUN (see `tests/verdict.rs`); the
//! maps are opened from the harness's pin directory, as the enforcer opens
//! them.

use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};
use palisade_ebpf::testkit::frames::*;
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;
use palisade_test_support::require_root;

// ---------------------------------------------------------------- helpers

fn pinned(h: &Harness, name: &str) -> Map {
    let data = MapData::from_pin(h.pins().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    Map::from_map_data(data).unwrap()
}

fn configure(h: &Harness, mode: u32, rate_per_sec: u32, burst: u32) {
    let mut config: Array<MapData, FlowConfig> =
        Array::try_from(pinned(h, MAP_FLOW_CONFIG)).unwrap();
    config
        .set(
            0,
            FlowConfig {
                mode,
                rate_per_sec,
                burst,
                pad: 0,
            },
            0,
        )
        .unwrap();
}

/// Every event waiting in the ring buffer, oldest first; leaves it empty.
fn drain(h: &Harness) -> Vec<FlowEvent> {
    let mut ring = RingBuf::try_from(pinned(h, MAP_FLOW_EVENTS)).unwrap();
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        assert_eq!(item.len(), std::mem::size_of::<FlowEvent>(), "record size");
        // SAFETY: FlowEvent is plain integers (aya::Pod) and the record is
        // exactly its size; read_unaligned makes no alignment assumption.
        out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<FlowEvent>()) });
    }
    out
}

fn flow_stat(h: &Harness, index: u32) -> u64 {
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(pinned(h, MAP_FLOW_STATS)).unwrap();
    stats.get(&index, 0).unwrap().iter().sum()
}

fn addr(s: &str) -> [u8; 16] {
    mapped_addr(ip(s))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Egress policy 5 allows TCP port 80 to 10.0.1.0/24 and nothing else;
/// ingress is not isolated.
fn egress_policy() -> Harness {
    let mut h = Harness::new();
    h.endpoint(0, 5);
    h.cidr(5, "10.0.1.0/24", 9);
    h.ports(9, PROTO_TCP, 80, 80);
    h
}

const HIGH_RATE: u32 = 1_000_000;

// ------------------------------------------------------------------ tests

#[test]
#[ignore = "needs root"]
fn deny_mode_logs_each_denied_packet_with_its_fields_and_no_allowed_flow() {
    require_root();
    let h = egress_policy();
    configure(&h, FLOW_LOG_DENY, HIGH_RATE, HIGH_RATE);
    let before = monotonic_ns();
    assert_eq!(h.pod_sends(&udp(POD4, 40000, "10.0.1.5", 53)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD4, 40001, "10.0.1.5", 80)), ALLOW);
    let after = monotonic_ns();
    let events = drain(&h);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(e.kind, FLOW_DENIED);
    assert_eq!(e.stat, STAT_DENIED as u8);
    assert_eq!(e.hook, HOOK_FROM_POD);
    assert_eq!(e.ifindex, LO);
    assert_eq!(e.policy_id, 5);
    assert_eq!(e.src, addr(POD4));
    assert_eq!(e.dst, addr("10.0.1.5"));
    assert_eq!(u16::from_be(e.sport), 40000);
    assert_eq!(u16::from_be(e.dport), 53);
    assert_eq!(e.proto, PROTO_UDP);
    assert!(
        (before..=after).contains(&e.ts_ns),
        "{before} <= {} <= {after}",
        e.ts_ns
    );
    assert_eq!(flow_stat(&h, FLOW_STAT_EMITTED), 1);
}

#[test]
#[ignore = "needs root"]
fn all_mode_logs_a_new_flow_once_and_never_its_established_or_reply_packets() {
    require_root();
    let h = egress_policy();
    configure(&h, FLOW_LOG_ALL, HIGH_RATE, HIGH_RATE);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
    for _ in 0..5 {
        assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
        assert_eq!(h.pod_receives(&tcp("10.0.1.5", 80, POD4, 40000)), ALLOW);
    }
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 5);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 5);
    let events = drain(&h);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(e.kind, FLOW_ALLOWED);
    assert_eq!(e.stat, STAT_ALLOWED_POLICY as u8);
    assert_eq!(e.policy_id, 5);
    assert_eq!(e.hook, HOOK_FROM_POD);
    assert_eq!(u16::from_be(e.dport), 80);
    assert_eq!(e.proto, PROTO_TCP);
}

#[test]
#[ignore = "needs root"]
fn all_mode_logs_unisolated_ingress_and_denials_in_both_directions() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 7); // egress isolated with no rule: deny all
    configure(&h, FLOW_LOG_ALL, HIGH_RATE, HIGH_RATE);
    assert_eq!(h.pod_receives(&udp("10.0.3.3", 5000, POD4, 53)), ALLOW);
    assert_eq!(h.pod_sends(&udp("fd00::2", 5000, "fd00::9", 53)), DROP);
    let events = drain(&h);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].kind, FLOW_ALLOWED);
    assert_eq!(events[0].stat, STAT_ALLOWED_UNISOLATED as u8);
    assert_eq!(events[0].policy_id, 0);
    assert_eq!(events[0].hook, HOOK_TO_POD);
    assert_eq!(events[0].src, addr("10.0.3.3"));
    assert_eq!(events[1].kind, FLOW_DENIED);
    assert_eq!(events[1].hook, HOOK_FROM_POD);
    assert_eq!(events[1].policy_id, 7);
    assert_eq!(events[1].dst, addr("fd00::9"), "IPv6 as it is");
}

#[test]
#[ignore = "needs root"]
fn off_mode_logs_no_allowed_or_denied_flow() {
    require_root();
    let h = egress_policy();
    configure(&h, FLOW_LOG_OFF, HIGH_RATE, HIGH_RATE);
    assert_eq!(h.pod_sends(&udp(POD4, 40000, "10.0.1.5", 53)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD4, 40001, "10.0.1.5", 80)), ALLOW);
    assert_eq!(h.pod_sends(&tcp("10.6.6.6", 40002, "10.0.1.5", 80)), DROP);
    assert!(drain(&h).is_empty());
    for stat in [
        FLOW_STAT_EMITTED,
        FLOW_STAT_RATE_LIMITED,
        FLOW_STAT_OVERFLOW,
    ] {
        assert_eq!(flow_stat(&h, stat), 0, "flow stat {stat}");
    }
}

#[test]
#[ignore = "needs root"]
fn an_unwritten_config_or_a_zero_rate_logs_nothing() {
    require_root();
    let h = egress_policy();
    // The map's zeroed entry: mode off, rate 0.
    assert_eq!(h.pod_sends(&udp(POD4, 40000, "10.0.1.5", 53)), DROP);
    configure(&h, FLOW_LOG_ALL, 0, 10);
    assert_eq!(h.pod_sends(&udp(POD4, 40000, "10.0.1.5", 53)), DROP);
    assert!(drain(&h).is_empty());
    assert_eq!(flow_stat(&h, FLOW_STAT_RATE_LIMITED), 0);
}

#[test]
#[ignore = "needs root"]
fn spoofed_sources_are_logged_as_denied_and_malformed_packets_are_not() {
    require_root();
    let h = egress_policy();
    configure(&h, FLOW_LOG_DENY, HIGH_RATE, HIGH_RATE);
    assert_eq!(h.pod_sends(&tcp("10.6.6.6", 40000, "10.0.1.5", 80)), DROP);
    let truncated = ipv4_with_frag(POD4, "10.0.1.5", PROTO_UDP, 0, &[0, 1]);
    assert_eq!(h.pod_sends(&truncated), DROP);
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 1);
    assert_eq!(h.stat(STAT_DENIED_MALFORMED), 1);
    let events = drain(&h);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(e.kind, FLOW_DENIED);
    assert_eq!(e.stat, STAT_DENIED_SPOOF as u8);
    assert_eq!(e.policy_id, 0, "no policy judged it");
    assert_eq!(e.src, addr("10.6.6.6"));
    assert_eq!(u16::from_be(e.dport), 80);
}

#[test]
#[ignore = "needs root"]
fn the_rate_limit_admits_at_most_burst_plus_rate_times_elapsed() {
    require_root();
    let h = egress_policy();
    let (rate, burst) = (1000u32, 50u32);
    configure(&h, FLOW_LOG_DENY, rate, burst);
    let denied = udp(POD4, 40000, "10.0.1.5", 53);
    let runs = 20_000u32;
    let start = monotonic_ns();
    // One BPF_PROG_TEST_RUN running the program `runs` times: a flood as
    // fast as the kernel can judge it.
    let result = test_run(h.program(PROG_FROM_POD), LO, &denied, runs);
    let elapsed_ns = monotonic_ns() - start;
    assert_eq!(result.return_value, DROP);
    let events = drain(&h).len() as u64;
    let limited = flow_stat(&h, FLOW_STAT_RATE_LIMITED);
    let bound = u64::from(burst) + u64::from(rate) * elapsed_ns / 1_000_000_000 + 1;
    eprintln!(
        "{runs} packets in {:.3} ms: {events} events, {limited} rate limited, bound {bound}",
        elapsed_ns as f64 / 1e6
    );
    assert!(events >= u64::from(burst), "the burst passes: {events}");
    assert!(events <= bound, "{events} events > bound {bound}");
    assert_eq!(events + limited, u64::from(runs), "every packet accounted");
    assert_eq!(flow_stat(&h, FLOW_STAT_EMITTED), events);
    assert_eq!(flow_stat(&h, FLOW_STAT_OVERFLOW), 0);
}

#[test]
#[ignore = "needs root"]
fn the_rate_refills_over_time() {
    require_root();
    let h = egress_policy();
    let (rate, burst) = (200u32, 5u32);
    configure(&h, FLOW_LOG_DENY, rate, burst);
    let denied = udp(POD4, 40000, "10.0.1.5", 53);
    test_run(h.program(PROG_FROM_POD), LO, &denied, 1000);
    let first = drain(&h).len() as u64;
    assert!((5..=6).contains(&first), "the burst, then nothing: {first}");
    // Wait (on the clock, not a sleep) until the bucket must hold tokens
    // again: 5 intervals of 5 ms.
    let refilled = monotonic_ns() + 25_000_000;
    while monotonic_ns() < refilled {
        std::thread::yield_now(); // poll
    }
    test_run(h.program(PROG_FROM_POD), LO, &denied, 1000);
    let second = drain(&h).len() as u64;
    assert!(second >= 5, "a refilled bucket admits again: {second}");
}

#[test]
#[ignore = "needs root"]
fn a_full_ring_buffer_drops_events_and_counts_them() {
    require_root();
    let h = egress_policy();
    // No rate limit to speak of: only the buffer's size bounds the events.
    configure(&h, FLOW_LOG_DENY, 1_000_000_000, u32::MAX);
    let denied = udp(POD4, 40000, "10.0.1.5", 53);
    // 1 MiB of 64-byte records (56 bytes and an 8-byte header): 16384 slots.
    let slots = FLOW_EVENTS_BYTES / 64;
    let runs = slots + slots / 4;
    test_run(h.program(PROG_FROM_POD), LO, &denied, runs);
    let overflow = flow_stat(&h, FLOW_STAT_OVERFLOW);
    let emitted = flow_stat(&h, FLOW_STAT_EMITTED);
    assert_eq!(emitted + overflow, u64::from(runs));
    // The kernel keeps the producer one byte short of the consumer, so a
    // buffer of 16384 slots holds one record less.
    assert_eq!(
        emitted,
        u64::from(slots - 1),
        "a full buffer of 64-byte records"
    );
    assert_eq!(flow_stat(&h, FLOW_STAT_RATE_LIMITED), 0);
    // Drained, the buffer takes events again.
    assert_eq!(drain(&h).len() as u64, emitted);
    assert_eq!(h.pod_sends(&denied), DROP);
    assert_eq!(drain(&h).len(), 1);
    assert_eq!(flow_stat(&h, FLOW_STAT_OVERFLOW), overflow);
}

#[test]
#[ignore = "needs root"]
fn the_rate_limit_is_shared_by_both_hooks_and_every_pod() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // deny all both ways
    configure(&h, FLOW_LOG_DENY, 1, 3);
    for i in 0..10u16 {
        assert_eq!(h.pod_sends(&udp(POD4, 40000 + i, "10.0.1.5", 53)), DROP);
        assert_eq!(h.pod_receives(&udp("10.0.1.5", 53, POD4, 40000 + i)), DROP);
    }
    let events = drain(&h).len() as u64;
    assert!(
        (3..=4).contains(&events),
        "burst of 3 (+1 if a second passed): {events}"
    );
    assert_eq!(flow_stat(&h, FLOW_STAT_RATE_LIMITED), 20 - events);
}
