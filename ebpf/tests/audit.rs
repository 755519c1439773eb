//! Staged (audit) policies in the kernel, with BPF_PROG_TEST_RUN: a new
//! flow is judged by the pod's audit table (its endpoint slot's staged word) beside the enforced
//! one; where they disagree a `FLOW_WOULD_*` event names the audit table and
//! a counter moves, and the verdict is always the enforced one.

use aya::maps::{Map, MapData, PerCpuArray, RingBuf};
use palisade_ebpf::testkit::frames::*;
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;
use palisade_test_support::require_root;

/// The audit-related maps of a harness, opened by their pins (the harness
/// lends its own maps only for the tables it knows about).
struct AuditMaps {
    stats: PerCpuArray<MapData, u64>,
    events: RingBuf<MapData>,
}

impl AuditMaps {
    fn open(h: &Harness) -> AuditMaps {
        let pin = |name: &str| {
            MapData::from_pin(h.pins().join(name))
                .unwrap_or_else(|e| panic!("open pinned {name}: {e:?}"))
        };
        let mut config: aya::maps::Array<MapData, FlowConfig> =
            aya::maps::Array::try_from(Map::Array(pin(MAP_FLOW_CONFIG))).unwrap();
        // Flow log off: only the FLOW_WOULD_* events are sent.
        config
            .set(
                0,
                FlowConfig {
                    mode: FLOW_LOG_OFF,
                    rate_per_sec: 1_000_000,
                    burst: 1_000_000,
                    pad: 0,
                },
                0,
            )
            .unwrap();
        AuditMaps {
            stats: PerCpuArray::try_from(Map::PerCpuArray(pin(MAP_FLOW_STATS))).unwrap(),
            events: RingBuf::try_from(Map::RingBuf(pin(MAP_FLOW_EVENTS))).unwrap(),
        }
    }

    fn stat(&self, index: u32) -> u64 {
        self.stats.get(&index, 0).unwrap().iter().sum()
    }

    /// The would-deny and would-allow counters: egress, ingress each.
    fn would(&self) -> [u64; 4] {
        [
            FLOW_STAT_WOULD_DENY_EGRESS,
            FLOW_STAT_WOULD_DENY_INGRESS,
            FLOW_STAT_WOULD_ALLOW_EGRESS,
            FLOW_STAT_WOULD_ALLOW_INGRESS,
        ]
        .map(|i| self.stat(i))
    }

    /// Every event written so far (the programs ran synchronously, so
    /// whatever they wrote is there).
    fn drain(&mut self) -> Vec<FlowEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.events.next() {
            assert_eq!(item.len(), std::mem::size_of::<FlowEvent>());
            // SAFETY: the record is a `struct flow_event`, which FlowEvent
            // mirrors (size asserted above and in the crate), read unaligned.
            out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<FlowEvent>()) });
        }
        out
    }
}

fn v4_mapped(s: &str) -> [u8; 16] {
    let std::net::IpAddr::V4(v4) = ip(s) else {
        panic!("{s} is not IPv4")
    };
    v4.to_ipv6_mapped().octets()
}

/// Ingress enforced by table 1 (10.0.1.0/24 on TCP 80); staged: table 2,
/// a default deny (no entries), and table 3, 10.0.0.0/16 on TCP 80.
fn harness() -> Harness {
    let mut h = Harness::new();
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    h.cidr(3, "10.0.0.0/16", 1);
    h
}

#[test]
#[ignore = "needs root"]
fn a_staged_deny_counts_and_reports_would_deny_while_the_flow_passes() {
    require_root();
    let mut h = harness();
    h.endpoint(1, 0);
    let mut m = AuditMaps::open(&h);
    h.set_audit(LO, 2, 0);

    let syn = tcp_flags("10.0.1.5", 40000, POD4, 80, 0x02);
    assert_eq!(h.pod_receives(&syn), ALLOW, "enforcement is unchanged");
    assert_eq!(m.would(), [0, 1, 0, 0]);
    let events = m.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(e.kind, FLOW_WOULD_DENY);
    assert_eq!(e.policy_id, 2, "named by the audit table");
    assert_eq!(e.ifindex, LO);
    assert_eq!(e.hook, HOOK_TO_POD);
    assert_eq!(e.stat as u32, STAT_ALLOWED_POLICY);
    assert_eq!(e.src, v4_mapped("10.0.1.5"));
    assert_eq!(e.dst, v4_mapped(POD4));
    assert_eq!(
        (u16::from_be(e.sport), u16::from_be(e.dport), e.proto),
        (40000, 80, PROTO_TCP)
    );

    // The same flow's next packets are established: judged by nothing.
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), ALLOW);
    // Its reply passes the other hook as a reply.
    assert_eq!(h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)), ALLOW);
    assert_eq!(m.would(), [0, 1, 0, 0], "established and replies: no audit");
    assert!(m.drain().is_empty());
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 1);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);
}

#[test]
#[ignore = "needs root"]
fn a_staged_allow_counts_and_reports_would_allow_while_the_flow_is_dropped() {
    require_root();
    let mut h = harness();
    h.endpoint(1, 0);
    let mut m = AuditMaps::open(&h);
    h.set_audit(LO, 3, 0);

    // 10.0.2.5 is outside the enforced /24, inside the staged /16.
    assert_eq!(h.pod_receives(&tcp("10.0.2.5", 40000, POD4, 80)), DROP);
    assert_eq!(m.would(), [0, 0, 0, 1]);
    let events = m.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, FLOW_WOULD_ALLOW);
    assert_eq!(events[0].policy_id, 3);
    assert_eq!(events[0].stat as u32, STAT_DENIED);
    // A denied flow has no entry, so each retry is new and judged again.
    assert_eq!(h.pod_receives(&tcp("10.0.2.5", 40000, POD4, 80)), DROP);
    assert_eq!(m.would(), [0, 0, 0, 2]);
}

#[test]
#[ignore = "needs root"]
fn nothing_is_reported_where_the_audit_table_agrees() {
    require_root();
    let mut h = harness();
    h.endpoint(1, 0);
    let mut m = AuditMaps::open(&h);
    h.set_audit(LO, 3, 0);
    // Both allow; both deny (port 81; a peer outside both).
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), ALLOW);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40001, POD4, 81)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.9.0.1", 40002, POD4, 80)), DROP);
    assert_eq!(m.would(), [0; 4]);
    assert!(m.drain().is_empty());
}

#[test]
#[ignore = "needs root"]
fn the_audit_table_judges_egress_by_the_destination() {
    require_root();
    let mut h = harness();
    // Egress not isolated; a staged egress policy allowing 10.0.1.0/24:80.
    h.endpoint(0, 0);
    let mut m = AuditMaps::open(&h);
    h.set_audit(LO, 0, 1);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.9", 80)), ALLOW);
    assert_eq!(h.pod_sends(&tcp(POD4, 40001, "10.0.2.9", 80)), ALLOW);
    assert_eq!(m.would(), [1, 0, 0, 0], "only the flow outside the table");
    let events = m.drain();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].hook, HOOK_FROM_POD);
    assert_eq!(events[0].dst, v4_mapped("10.0.2.9"));
    assert_eq!(events[0].stat as u32, STAT_ALLOWED_UNISOLATED);
    // An audit direction of 0 is no audit: ingress is not judged.
    assert_eq!(h.pod_receives(&tcp("10.0.2.9", 1, POD4, 2)), ALLOW);
    assert_eq!(m.would(), [1, 0, 0, 0]);
}

/// The same packets, with and without staged tables: the same verdicts and
/// the same packet counters.
#[test]
#[ignore = "needs root"]
fn verdicts_do_not_depend_on_audit() {
    require_root();
    let packets: Vec<(bool, Vec<u8>)> = vec![
        (false, tcp_flags("10.0.1.5", 40000, POD4, 80, 0x02)),
        (false, tcp("10.0.1.5", 40000, POD4, 80)),
        (true, tcp(POD4, 80, "10.0.1.5", 40000)),
        (false, tcp("10.0.2.5", 40001, POD4, 80)),
        (false, tcp("10.0.1.5", 40002, POD4, 81)),
        (true, tcp(POD4, 40003, "10.0.1.9", 80)),
        (true, tcp(POD4, 40004, "10.0.2.9", 80)),
        (true, udp(POD4, 40005, "10.0.1.9", 53)),
        (false, udp("fd00::9", 5353, POD6, 53)),
    ];
    let run = |audit: Option<(u32, u32)>| {
        let mut h = harness();
        h.endpoint(1, 3);
        let m = AuditMaps::open(&h);
        if let Some((ingress, egress)) = audit {
            h.set_audit(LO, ingress, egress);
        }
        let verdicts: Vec<u32> = packets
            .iter()
            .map(|(sends, p)| {
                if *sends {
                    h.pod_sends(p)
                } else {
                    h.pod_receives(p)
                }
            })
            .collect();
        (verdicts, h.stats(), m.would())
    };
    let (plain, plain_stats, none) = run(None);
    assert_eq!(none, [0; 4]);
    for audit in [(2, 2), (3, 1), (2, 0), (0, 2)] {
        let (verdicts, stats, would) = run(Some(audit));
        assert_eq!(verdicts, plain, "audit {audit:?}");
        assert_eq!(stats, plain_stats, "audit {audit:?}");
        assert_ne!(would, [0; 4], "audit {audit:?} disagrees somewhere");
    }
}

#[test]
#[ignore = "needs root"]
fn removing_the_audit_entry_stops_reporting() {
    require_root();
    let mut h = harness();
    h.endpoint(1, 0);
    let mut m = AuditMaps::open(&h);
    h.set_audit(LO, 2, 0);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), ALLOW);
    h.set_audit(LO, 0, 0);
    assert_eq!(h.pod_receives(&tcp("10.0.1.6", 40000, POD4, 80)), ALLOW);
    assert_eq!(m.would(), [0, 1, 0, 0]);
    assert_eq!(m.drain().len(), 1);
}

/// A learning pod's staged egress consults its learned entries as the
/// enforced one does: an entry's staged port set (the staged rules by name
/// it was learned for) decides for its host; an entry without one (0) and
/// a host without an entry leave it to the staged table.
#[test]
#[ignore = "needs root"]
fn a_learned_entry_s_staged_port_set_judges_the_staged_egress() {
    require_root();
    let mut h = harness();
    // Egress not isolated (the staged policy is the pod's first); staged
    // table 2 denies everything; port sets: 1 is TCP 80, 4 TCP 443.
    h.ports(4, PROTO_TCP, 443, 443);
    h.endpoint(0, 0);
    h.set_learns(LO, true);
    let mut m = AuditMaps::open(&h);
    h.set_audit(LO, 0, 2);
    let far = u64::MAX;
    // 10.9.9.9 resolved by a staged name on 443; 10.9.9.10 learned for an
    // enforced name only (no staged port set).
    h.learn_staged_at(LO, "10.9.9.9", far, 1, 4);
    h.learn_staged_at(LO, "10.9.9.10", far, 1, 0);

    assert_eq!(
        h.pod_sends(&tcp_flags(POD4, 40000, "10.9.9.9", 443, 0x02)),
        ALLOW
    );
    assert_eq!(
        m.would(),
        [0; 4],
        "the staged name allows it: no would-deny"
    );
    assert_eq!(
        h.pod_sends(&tcp_flags(POD4, 40001, "10.9.9.9", 80, 0x02)),
        ALLOW
    );
    assert_eq!(m.would(), [1, 0, 0, 0], "not on the name's port");
    assert_eq!(
        h.pod_sends(&tcp_flags(POD4, 40002, "10.9.9.10", 443, 0x02)),
        ALLOW
    );
    assert_eq!(
        m.would(),
        [2, 0, 0, 0],
        "no staged port set: the table denies"
    );
    assert_eq!(
        h.pod_sends(&tcp_flags(POD4, 40003, "10.8.8.8", 443, 0x02)),
        ALLOW
    );
    assert_eq!(m.would(), [3, 0, 0, 0], "no entry: the table denies");
    // Without the flag the overlay is not read, staged or enforced.
    h.set_learns(LO, false);
    assert_eq!(
        h.pod_sends(&tcp_flags(POD4, 40004, "10.9.9.9", 443, 0x02)),
        ALLOW
    );
    assert_eq!(m.would(), [4, 0, 0, 0]);
    // An expired entry is no entry for a new flow.
    h.set_learns(LO, true);
    h.learn_staged_at(LO, "10.9.9.9", 1, 1, 4);
    assert_eq!(
        h.pod_sends(&tcp_flags(POD4, 40005, "10.9.9.9", 443, 0x02)),
        ALLOW
    );
    assert_eq!(m.would(), [5, 0, 0, 0]);
    assert_eq!(m.drain().len(), 5);
}
