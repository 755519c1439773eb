//! Egress by domain name, the capture: a learning pod's (`EP_FLAG_LEARNS`)
//! DNS with the trusted servers (`pal_dns_servers`), once the verdict
//! allowed it, goes to `pal_dns_frames` (`c/lib/dns_capture.h`): its
//! queries copied, its answers copied and held (taken from the stack: HOLD) while the learner
//! is alive (`pal_dns_config`), first fragments and later fragments alike.
//! Real programs run with BPF_PROG_TEST_RUN on hand-built frames, IPv4 and
//! IPv6; deadlines are set from the real `CLOCK_BOOTTIME` (the programs'
//! clock for them), a dead learner by a deadline in the past, so no test
//! sleeps. The maps are opened from the harness's pin directory, as the
//! enforcer opens them. Needs root and a bpffs at /sys/fs/bpf.
//!
//! Not tested here: a frame above `PAL_DNS_FRAME_MAX` (4096 bytes), which
//! BPF_PROG_TEST_RUN cannot build (it takes at most a page less the skb's
//! head and tail room).

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, RingBuf};
use palisade_ebpf::testkit::frames::*;
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;
use palisade_test_support::require_root;

// ---------------------------------------------------------------- helpers

/// The pod's egress table: UDP 53 and 5353 to the servers' /24 (or /64).
const EGRESS: u32 = 5;
const DNS_PORTS: u32 = 9;
/// The pod's ingress table: isolated, no rules (an answer passes only as
/// the reply to a query).
const INGRESS: u32 = 3;

struct Family {
    pod: &'static str,
    /// A trusted server.
    server: &'static str,
    /// A server the table allows but `pal_dns_servers` does not name.
    untrusted: &'static str,
    servers_cidr: &'static str,
}

const V4: Family = Family {
    pod: POD4,
    server: "10.96.0.10",
    untrusted: "10.96.0.11",
    servers_cidr: "10.96.0.0/24",
};
const V6: Family = Family {
    pod: POD6,
    server: "fd00:96::a",
    untrusted: "fd00:96::b",
    servers_cidr: "fd00:96::/64",
};
const FAMILIES: [&Family; 2] = [&V4, &V6];

const POD_PORT: u16 = 40000;
const HOUR_NS: u64 = 3_600_000_000_000;

/// `CLOCK_BOOTTIME` now, the clock `bpf_ktime_get_boot_ns` reads.
fn boot_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pinned(h: &Harness, name: &str) -> Map {
    let data = MapData::from_pin(h.pins().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    Map::from_map_data(data).unwrap()
}

/// Writes the learner's deadline (`CLOCK_BOOTTIME`).
fn set_deadline(h: &Harness, learner_deadline_ns: u64) {
    let mut config: Array<MapData, DnsConfig> = Array::try_from(pinned(h, MAP_DNS_CONFIG)).unwrap();
    config
        .set(
            0,
            DnsConfig {
                learner_deadline_ns,
                pad: 0,
            },
            0,
        )
        .unwrap();
}

fn learner_alive(h: &Harness) {
    set_deadline(h, boot_ns() + HOUR_NS);
}

fn learner_dead(h: &Harness) {
    set_deadline(h, boot_ns() - 1);
}

fn trust(h: &Harness, server: &str) {
    let mut servers: HashMap<MapData, [u8; 16], u32> =
        HashMap::try_from(pinned(h, MAP_DNS_SERVERS)).unwrap();
    servers.insert(mapped_addr(ip(server)), 1, 0).unwrap();
}

/// Every record waiting in the ring buffer, oldest first, as its header
/// and the frame after it; leaves it empty.
fn drain(h: &Harness) -> Vec<(DnsFrameHdr, Vec<u8>)> {
    let mut ring = RingBuf::try_from(pinned(h, MAP_DNS_FRAMES)).unwrap();
    let hdr_len = std::mem::size_of::<DnsFrameHdr>();
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        assert!(item.len() >= hdr_len, "record of {} bytes", item.len());
        // SAFETY: DnsFrameHdr is plain integers (aya::Pod) and the record
        // holds at least its size; read_unaligned makes no alignment
        // assumption.
        let hdr = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<DnsFrameHdr>()) };
        assert_eq!(
            item.len(),
            hdr_len + usize::from(hdr.len),
            "record size: header and frame"
        );
        out.push((hdr, item[hdr_len..].to_vec()));
    }
    out
}

fn dns_stat(h: &Harness, index: u32) -> u64 {
    let stats: PerCpuArray<MapData, u64> = PerCpuArray::try_from(pinned(h, MAP_DNS_STATS)).unwrap();
    stats.get(&index, 0).unwrap().iter().sum()
}

fn dns_stats(h: &Harness) -> Vec<u64> {
    (0..DNS_STAT_COUNT).map(|i| dns_stat(h, i)).collect()
}

/// `DNS_STAT_COUNT` counters, all 0 but `index`, which is `n`.
fn only(index: u32, n: u64) -> Vec<u64> {
    let mut v = vec![0; DNS_STAT_COUNT as usize];
    v[index as usize] = n;
    v
}

/// Verdicts of the pod's ingress (`HOOK_TO_POD`), per `STAT_*` kind.
fn ingress_verdicts(h: &Harness) -> Vec<u64> {
    (0..STAT_COUNT)
        .map(|k| h.stat_dir(HOOK_TO_POD, k))
        .collect()
}

/// `STAT_COUNT` counters, all 0 but `kind`, which is `n`.
fn verdicts_only(kind: u32, n: u64) -> Vec<u64> {
    let mut v = vec![0; STAT_COUNT as usize];
    v[kind as usize] = n;
    v
}

/// The pod on [`LO`] isolated both ways, its egress allowing DNS to the
/// servers of both families, with domain-name rules (`EP_FLAG_LEARNS`)
/// when `learns`; each family's `server` trusted, the learner alive.
fn pod(learns: bool) -> Harness {
    let mut h = Harness::new();
    for f in FAMILIES {
        h.cidr(EGRESS, f.servers_cidr, DNS_PORTS);
    }
    h.ports(DNS_PORTS, PROTO_UDP, 53, 53);
    h.ports(DNS_PORTS, PROTO_UDP, 5353, 5353);
    h.endpoint(INGRESS, EGRESS);
    h.set_learns(LO, learns);
    for f in FAMILIES {
        trust(&h, f.server);
    }
    learner_alive(&h);
    h
}

fn query(f: &Family, server: &str, port: u16) -> Vec<u8> {
    udp(f.pod, POD_PORT, server, port)
}

fn answer(f: &Family, server: &str, port: u16) -> Vec<u8> {
    udp(server, port, f.pod, POD_PORT)
}

/// A UDP datagram of `len` bytes, its 8-byte header included.
fn udp_datagram(sport: u16, dport: u16, len: usize) -> Vec<u8> {
    let mut d = Vec::with_capacity(len);
    d.extend_from_slice(&sport.to_be_bytes());
    d.extend_from_slice(&dport.to_be_bytes());
    d.extend_from_slice(&(len as u16).to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.resize(len, 0xab);
    d
}

/// An answer of `len` UDP bytes from `f.server`:53 in two fragments of
/// datagram `id`, cut at byte 32.
fn answer_fragments(f: &Family, id: u32, len: usize) -> [Vec<u8>; 2] {
    let d = udp_datagram(53, POD_PORT, len);
    [
        fragment(f.server, f.pod, PROTO_UDP, id, 0, true, &d[..32]),
        fragment(f.server, f.pod, PROTO_UDP, id, 32, false, &d[32..]),
    ]
}

// ------------------------------------------------------------------ tests

#[test]
#[ignore = "needs root"]
fn a_query_to_a_trusted_server_is_copied_whole_and_passes() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        let q = query(f, f.server, 53);
        let before = boot_ns();
        assert_eq!(h.pod_sends(&q), ALLOW, "{}", f.server);
        let after = boot_ns();
        let frames = drain(&h);
        assert_eq!(frames.len(), 1, "{}", f.server);
        let (hdr, bytes) = &frames[0];
        assert_eq!(hdr.kind, DNS_FRAME_QUERY);
        assert_eq!(hdr.ifindex, LO);
        assert_eq!(usize::from(hdr.len), q.len());
        assert_eq!(hdr.pad, 0);
        assert!(
            (before..=after).contains(&hdr.ts_ns),
            "{before} <= {} <= {after}",
            hdr.ts_ns
        );
        assert_eq!(bytes, &q, "the frame from its Ethernet header on");
        assert_eq!(dns_stats(&h), only(DNS_STAT_QUERY_COPIED, 1));
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 1);
    }
}

#[test]
#[ignore = "needs root"]
fn a_query_to_an_untrusted_server_or_another_port_is_not_copied() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        assert_eq!(h.pod_sends(&query(f, f.untrusted, 53)), ALLOW);
        assert_eq!(h.pod_sends(&query(f, f.server, 5353)), ALLOW);
        assert!(drain(&h).is_empty(), "{}", f.server);
        assert_eq!(dns_stats(&h), only(0, 0));
    }
}

#[test]
#[ignore = "needs root"]
fn a_pod_without_domain_rules_has_nothing_copied_or_held() {
    require_root();
    for f in FAMILIES {
        let h = pod(false);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        assert_eq!(h.pod_receives(&answer(f, f.server, 53)), ALLOW);
        assert!(drain(&h).is_empty(), "{}", f.server);
        assert_eq!(dns_stats(&h), only(0, 0));
    }
}

#[test]
#[ignore = "needs root"]
fn an_answer_from_a_trusted_server_is_copied_and_held_as_an_allowed_reply() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        drain(&h);
        let a = answer(f, f.server, 53);
        let before = boot_ns();
        assert_eq!(h.pod_receives(&a), HOLD, "held: {}", f.server);
        let after = boot_ns();
        let frames = drain(&h);
        assert_eq!(frames.len(), 1);
        let (hdr, bytes) = &frames[0];
        assert_eq!(hdr.kind, DNS_FRAME_ANSWER);
        assert_eq!(hdr.ifindex, LO);
        assert_eq!(usize::from(hdr.len), a.len());
        assert!((before..=after).contains(&hdr.ts_ns));
        assert_eq!(bytes, &a);
        let mut expected = only(DNS_STAT_QUERY_COPIED, 1);
        expected[DNS_STAT_ANSWER_HELD as usize] = 1;
        assert_eq!(dns_stats(&h), expected);
        // Counted once, as the reply the verdict allowed: no denial.
        assert_eq!(ingress_verdicts(&h), verdicts_only(STAT_ALLOWED_REPLY, 1));
    }
}

#[test]
#[ignore = "needs root"]
fn without_a_live_learner_answers_pass_and_are_counted() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        learner_dead(&h);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        assert_eq!(h.pod_receives(&answer(f, f.server, 53)), ALLOW);
        // Nobody reads the ring: not even the query was copied.
        assert!(drain(&h).is_empty());
        assert_eq!(dns_stats(&h), only(DNS_STAT_PASSED_NO_LEARNER, 1));
        // A deadline never written (0) is no learner either.
        set_deadline(&h, 0);
        assert_eq!(h.pod_receives(&answer(f, f.server, 53)), ALLOW);
        assert_eq!(dns_stat(&h, DNS_STAT_PASSED_NO_LEARNER), 2);
        // Alive again: held again.
        learner_alive(&h);
        assert_eq!(h.pod_receives(&answer(f, f.server, 53)), HOLD);
        assert_eq!(drain(&h).len(), 1);
    }
}

#[test]
#[ignore = "needs root"]
fn a_full_ring_buffer_lets_answers_pass_and_counts_them() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        drain(&h);
        // ~3 KiB records: the 4 MiB buffer holds about 1400.
        let big = ip_packet(
            f.server,
            f.pod,
            PROTO_UDP,
            &udp_datagram(53, POD_PORT, 3000),
        );
        let record = (8 + std::mem::size_of::<DnsFrameHdr>() + big.len()).next_multiple_of(8);
        let fits = DNS_FRAMES_BYTES as usize / record;
        let runs = (fits + fits / 2) as u32;
        let last = test_run(h.program(PROG_TO_POD), LO, &big, runs).return_value;
        assert_eq!(last, ALLOW, "the last run met a full buffer");
        let held = dns_stat(&h, DNS_STAT_ANSWER_HELD);
        let full = dns_stat(&h, DNS_STAT_PASSED_RING_FULL);
        assert_eq!(held + full, u64::from(runs));
        assert!(
            held as usize <= fits && held as usize >= fits - 1,
            "{held} held, {fits} fit"
        );
        assert_eq!(h.stat_dir(HOOK_TO_POD, STAT_DENIED), 0);
        // Drained, the buffer holds answers again.
        let frames = drain(&h);
        assert_eq!(frames.len() as u64, held);
        assert!(frames
            .iter()
            .all(|(hdr, bytes)| hdr.kind == DNS_FRAME_ANSWER && *bytes == big));
        assert_eq!(h.pod_receives(&big), HOLD);
        assert_eq!(drain(&h).len(), 1);
        assert_eq!(dns_stat(&h, DNS_STAT_PASSED_RING_FULL), full);
    }
}

#[test]
#[ignore = "needs root"]
fn answers_from_untrusted_servers_or_other_ports_pass_uncopied() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        learner_alive(&h);
        assert_eq!(h.pod_sends(&query(f, f.untrusted, 53)), ALLOW);
        assert_eq!(h.pod_sends(&query(f, f.server, 5353)), ALLOW);
        assert_eq!(h.pod_receives(&answer(f, f.untrusted, 53)), ALLOW);
        assert_eq!(h.pod_receives(&answer(f, f.server, 5353)), ALLOW);
        assert!(drain(&h).is_empty(), "{}", f.server);
        assert_eq!(dns_stats(&h), only(0, 0));
        assert_eq!(ingress_verdicts(&h), verdicts_only(STAT_ALLOWED_REPLY, 2));
    }
}

#[test]
#[ignore = "needs root"]
fn a_policy_denied_answer_is_dropped_as_a_denial_and_never_copied() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        // No query went out: no flow to reply to, and the ingress table
        // allows nothing.
        assert_eq!(h.pod_receives(&answer(f, f.server, 53)), DROP);
        assert!(drain(&h).is_empty());
        assert_eq!(dns_stats(&h), only(0, 0));
        assert_eq!(ingress_verdicts(&h), verdicts_only(STAT_DENIED, 1));
    }
}

#[test]
#[ignore = "needs root"]
fn the_fragments_of_a_held_answer_are_held_too() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        drain(&h);
        let [first, later] = answer_fragments(f, 77, 64);
        assert_eq!(h.pod_receives(&first), HOLD, "first: {}", f.server);
        assert_eq!(h.pod_receives(&later), HOLD, "later: {}", f.server);
        let frames = drain(&h);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].0.kind, DNS_FRAME_ANSWER);
        assert_eq!(frames[0].1, first);
        assert_eq!(frames[1].0.kind, DNS_FRAME_ANSWER);
        assert_eq!(frames[1].1, later);
        let mut expected = only(DNS_STAT_QUERY_COPIED, 1);
        expected[DNS_STAT_ANSWER_HELD as usize] = 1;
        expected[DNS_STAT_FRAGMENT_HELD as usize] = 1;
        assert_eq!(dns_stats(&h), expected);
        // Both allowed by the verdict, neither counted as denied.
        assert_eq!(h.stat_dir(HOOK_TO_POD, STAT_ALLOWED_FRAGMENT), 1);
        assert_eq!(h.stat_dir(HOOK_TO_POD, STAT_DENIED), 0);
        assert_eq!(h.stat_dir(HOOK_TO_POD, STAT_DENIED_FRAGMENT), 0);
        // Held even when the learner died in between: the enforcer holds
        // the first fragment, and re-injects the datagram whole.
        let [first, later] = answer_fragments(f, 78, 64);
        assert_eq!(h.pod_receives(&first), HOLD);
        learner_dead(&h);
        assert_eq!(h.pod_receives(&later), HOLD);
        assert_eq!(drain(&h).len(), 2);
    }
}

#[test]
#[ignore = "needs root"]
fn the_fragments_of_an_answer_not_held_pass() {
    require_root();
    for f in FAMILIES {
        let h = pod(true);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        drain(&h);
        learner_dead(&h);
        let [first, later] = answer_fragments(f, 79, 64);
        assert_eq!(h.pod_receives(&first), ALLOW);
        learner_alive(&h);
        assert_eq!(h.pod_receives(&later), ALLOW, "its first passed");
        assert!(drain(&h).is_empty());
        let mut expected = only(DNS_STAT_QUERY_COPIED, 1);
        expected[DNS_STAT_PASSED_NO_LEARNER as usize] = 1;
        expected[DNS_STAT_FRAGMENT_PASSED as usize] = 1;
        assert_eq!(dns_stats(&h), expected);
        // A later fragment of a datagram that is no DNS answer passes
        // without being counted here.
        let d = udp_datagram(5353, POD_PORT, 64);
        assert_eq!(h.pod_sends(&query(f, f.server, 5353)), ALLOW);
        let first = fragment(f.server, f.pod, PROTO_UDP, 80, 0, true, &d[..32]);
        let later = fragment(f.server, f.pod, PROTO_UDP, 80, 32, false, &d[32..]);
        assert_eq!(h.pod_receives(&first), ALLOW);
        assert_eq!(h.pod_receives(&later), ALLOW);
        assert!(drain(&h).is_empty());
        assert_eq!(dns_stats(&h), expected);
    }
}

#[test]
#[ignore = "needs root"]
fn headers_read_by_copy_capture_alike() {
    require_root();
    for f in FAMILIES {
        let mut h = Harness::with_object(testkit::HEADERS_BY_COPY_OBJECT);
        h.cidr(EGRESS, f.servers_cidr, DNS_PORTS);
        h.ports(DNS_PORTS, PROTO_UDP, 53, 53);
        h.endpoint(INGRESS, EGRESS);
        h.set_learns(LO, true);
        trust(&h, f.server);
        learner_alive(&h);
        assert_eq!(h.pod_sends(&query(f, f.server, 53)), ALLOW);
        assert_eq!(h.pod_receives(&answer(f, f.server, 53)), HOLD);
        let kinds: Vec<u8> = drain(&h).iter().map(|(hdr, _)| hdr.kind).collect();
        assert_eq!(kinds, [DNS_FRAME_QUERY, DNS_FRAME_ANSWER]);
    }
}
