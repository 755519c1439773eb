//! Runs the real programs in the kernel with BPF_PROG_TEST_RUN on hand-built
//! frames (the harness is `palisade_ebpf::testkit`), in the spirit of tools/testing/selftests/bpf. Needs root and a
//! bpffs at /sys/fs/bpf; every test loads its own copy of the object into a
//! fresh pin directory, so tests never see each other's maps. Tests with
//! more than one pod run in a fresh network namespace holding a veth pair,
//! whose two ends stand for two pods' host veths.

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use aya::EbpfLoader;
use palisade_ebpf::testkit::frames::*;
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;
use palisade_test_support::require_root;

mod common;
use common::with_two_pods;

// ------------------------------------------------------------------ tests

#[test]
#[ignore = "needs root"]
fn unknown_interface_is_not_judged() {
    require_root();
    let h = Harness::new();
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.9.9.9", 80)), ALLOW);
    assert_eq!(h.pod_receives(&tcp("10.9.9.9", 40000, POD4, 80)), ALLOW);
    assert_eq!(
        h.stats(),
        [0; STAT_COUNT as usize],
        "nothing judged, nothing counted"
    );
}

#[test]
#[ignore = "needs root"]
fn not_isolated_passes_and_tracks_the_flow() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
    assert!(h.ct_has(&ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD)));
    assert_eq!(h.pod_receives(&udp("10.0.1.7", 5353, POD4, 53)), ALLOW);
    assert!(h.ct_has(&ct("10.0.1.7", 5353, POD4, 53, PROTO_UDP, HOOK_TO_POD)));
    assert_eq!(h.stat(STAT_ALLOWED_UNISOLATED), 2);
}

#[test]
#[ignore = "needs root"]
fn refresh_keeps_one_entry_and_moves_the_timestamp() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    let key = ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD);
    h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80));
    let first = h.ct_get(&key).unwrap().last_seen_ns;
    // The stamp comes from the coarse clock, which moves once a tick.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let second = loop {
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80));
        let seen = h.ct_get(&key).unwrap().last_seen_ns;
        if seen > first || std::time::Instant::now() > deadline {
            break seen;
        }
        std::thread::yield_now(); // poll
    };
    assert!(second > first, "{second} > {first}");
    assert_eq!(h.ct_len(), 1);
}

/// The enforcer's sweep keeps an entry whose stamp is at or after the
/// moment the sweep started: a stamp earlier than its packet could cost a
/// live flow its entry.
#[test]
#[ignore = "needs root"]
fn last_seen_is_never_earlier_than_the_packet() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    let key = ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD);
    for _ in 0..200 {
        let before = monotonic_ns();
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80));
        let after = monotonic_ns();
        let seen = h.ct_get(&key).unwrap().last_seen_ns;
        assert!(seen >= before, "stamp {seen} before the packet ({before})");
        assert!(
            seen <= after + LAST_SEEN_MAX_AHEAD_NS,
            "stamp {seen} too far past the packet ({after})"
        );
    }
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

#[test]
#[ignore = "needs root"]
fn isolated_without_rules_drops_both_ways() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), DROP);
    assert_eq!(h.stat(STAT_DENIED), 2);
    assert_eq!(h.ct_len(), 0, "dropped flows leave no conntrack entry");
}

#[test]
#[ignore = "needs root"]
fn one_direction_isolated_leaves_the_other_open() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 2);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), ALLOW);
}

#[test]
#[ignore = "needs root"]
fn cidr_and_port_allow() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 5);
    h.cidr(5, "10.0.1.0/24", 9);
    h.ports(9, PROTO_TCP, 80, 80);

    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
    assert!(h.ct_has(&ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD)));
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.255", 80)), ALLOW);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 81)),
        DROP,
        "other port"
    );
    assert_eq!(
        h.pod_sends(&udp(POD4, 40000, "10.0.1.5", 80)),
        DROP,
        "other protocol"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.2.5", 80)),
        DROP,
        "outside CIDR"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)),
        DROP,
        "source port ignored"
    );
    assert_eq!(h.stat(STAT_ALLOWED_POLICY), 2);
    assert_eq!(h.stat(STAT_DENIED), 4);
}

#[test]
#[ignore = "needs root"]
fn ingress_policy_judges_the_source() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(3, 0);
    h.cidr(3, "192.168.0.0/16", 1);
    h.ports(1, PROTO_TCP, 8080, 8080);
    assert_eq!(
        h.pod_receives(&tcp("192.168.3.4", 50000, POD4, 8080)),
        ALLOW
    );
    assert!(h.ct_has(&ct(
        "192.168.3.4",
        50000,
        POD4,
        8080,
        PROTO_TCP,
        HOOK_TO_POD
    )));
    assert_eq!(h.pod_receives(&tcp("192.169.3.4", 50000, POD4, 8080)), DROP);
    assert_eq!(h.pod_receives(&tcp("192.168.3.4", 50000, POD4, 8081)), DROP);
}

#[test]
#[ignore = "needs root"]
fn port_range_edges() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "0.0.0.0/0", 2);
    h.ports(2, PROTO_TCP, 8000, 8100);
    for (port, want) in [
        (7999, DROP),
        (8000, ALLOW),
        (8001, ALLOW),
        (8063, ALLOW),
        (8064, ALLOW),
        (8099, ALLOW),
        (8100, ALLOW),
        (8101, DROP),
        (0, DROP),
        (65535, DROP),
    ] {
        assert_eq!(
            h.pod_sends(&tcp(POD4, 40000, "1.2.3.4", port)),
            want,
            "port {port}"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn every_port_of_a_protocol_and_every_protocol() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.1.0.0/16", 2);
    h.port_keys(PortKey::lpm(2, PROTO_UDP, 0, 0));
    h.cidr(1, "10.2.0.0/16", 3);
    h.port_keys(PortKey::lpm_any_protocol(3));

    assert_eq!(h.pod_sends(&udp(POD4, 1, "10.1.0.1", 0)), ALLOW);
    assert_eq!(h.pod_sends(&udp(POD4, 1, "10.1.0.1", 65535)), ALLOW);
    assert_eq!(h.pod_sends(&tcp(POD4, 1, "10.1.0.1", 53)), DROP);
    assert_eq!(h.pod_sends(&icmp_echo(POD4, "10.1.0.1")), DROP);

    assert_eq!(h.pod_sends(&tcp(POD4, 1, "10.2.0.1", 22)), ALLOW);
    assert_eq!(h.pod_sends(&sctp(POD4, 1, "10.2.0.1", 9)), ALLOW);
    assert_eq!(
        h.pod_sends(&icmp_echo(POD4, "10.2.0.1")),
        ALLOW,
        "ICMP needs all protocols"
    );
}

#[test]
#[ignore = "needs root"]
fn longer_prefix_without_ports_carves_an_except() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    // Rule A: 10.0.0.0/8 except 10.1.0.0/16, any port.
    h.cidr(1, "10.0.0.0/8", 10);
    h.port_keys(PortKey::lpm_any_protocol(10));
    h.cidr(1, "10.1.0.0/16", 11); // portset 11 has no entries
                                  // Rule B: 10.1.2.0/24 on TCP 443; B must win inside A's except.
    h.cidr(1, "10.1.2.0/24", 12);
    h.ports(12, PROTO_TCP, 443, 443);

    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.2.3.4", 80)), ALLOW);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.1.3.4", 80)),
        DROP,
        "in the except"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.1.2.3", 443)),
        ALLOW,
        "rule B"
    );
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.1.2.3", 80)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "11.0.0.1", 80)), DROP);
}

#[test]
#[ignore = "needs root"]
fn policies_do_not_leak_between_ids() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(2, "0.0.0.0/0", 1);
    h.port_keys(PortKey::lpm_any_protocol(1));
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), DROP);
    h.endpoint(0, 2);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
}

#[test]
#[ignore = "needs root"]
fn verdicts_are_counted_by_the_direction_that_judged_them() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // egress policy 2 allows nothing
    h.cidr(1, "10.0.1.0/24", 1);
    h.cidr(1, "fd00:1::/64", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let (egress, ingress) = (HOOK_FROM_POD, HOOK_TO_POD);

    // An ingress flow, IPv4 (fast path) and IPv6 (full path): its forward
    // packets are the pod's ingress, its replies the pod's egress.
    for (peer, pod) in [("10.0.1.5", POD4), ("fd00:1::5", POD6)] {
        assert_eq!(h.pod_receives(&tcp(peer, 40000, pod, 80)), ALLOW);
        assert_eq!(h.pod_receives(&tcp(peer, 40000, pod, 80)), ALLOW);
        assert_eq!(h.pod_sends(&tcp(pod, 80, peer, 40000)), ALLOW);
    }
    assert_eq!(h.stat_dir(ingress, STAT_ALLOWED_POLICY), 2);
    assert_eq!(h.stat_dir(ingress, STAT_ALLOWED_ESTABLISHED), 2);
    assert_eq!(h.stat_dir(egress, STAT_ALLOWED_REPLY), 2);
    assert_eq!(h.stat_dir(egress, STAT_ALLOWED_POLICY), 0);
    assert_eq!(h.stat_dir(ingress, STAT_ALLOWED_REPLY), 0);

    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.0.2.5", 40000, POD4, 80)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.0.2.6", 40000, POD4, 80)), DROP);
    assert_eq!(h.pod_sends(&tcp("10.0.0.99", 40000, "10.0.1.5", 80)), DROP);
    assert_eq!(h.stat_dir(egress, STAT_DENIED), 1);
    assert_eq!(h.stat_dir(ingress, STAT_DENIED), 2);
    assert_eq!(h.stat_dir(egress, STAT_DENIED_SPOOF), 1);
    assert_eq!(h.stat_dir(ingress, STAT_DENIED_SPOOF), 0);
    assert_eq!(
        h.stats().iter().sum::<u64>(),
        10,
        "every packet counted once, in one direction"
    );
}

#[test]
#[ignore = "needs root"]
fn reply_to_an_ingress_flow_passes_egress() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // egress policy 2 allows nothing
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);

    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), ALLOW);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)),
        ALLOW,
        "reply"
    );
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);

    assert_eq!(
        h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40001)),
        DROP,
        "other client port"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)),
        DROP,
        "not a reply"
    );
    assert_eq!(
        h.pod_sends(&udp(POD4, 80, "10.0.1.5", 40000)),
        DROP,
        "other protocol"
    );
}

#[test]
#[ignore = "needs root"]
fn reply_to_an_egress_flow_passes_ingress() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // ingress policy 1 allows nothing
    h.cidr(2, "10.96.0.10/32", 3);
    h.ports(3, PROTO_UDP, 53, 53);

    assert_eq!(h.pod_sends(&udp(POD4, 33333, "10.96.0.10", 53)), ALLOW);
    assert_eq!(
        h.pod_receives(&udp("10.96.0.10", 53, POD4, 33333)),
        ALLOW,
        "reply"
    );
    assert_eq!(
        h.pod_receives(&udp("10.96.0.10", 53, POD4, 33334)),
        DROP,
        "unsolicited"
    );
    assert_eq!(
        h.pod_receives(&udp("10.96.0.11", 53, POD4, 33333)),
        DROP,
        "other peer"
    );
}

#[test]
#[ignore = "needs root"]
fn reply_needs_the_other_hooks_entry() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // neither policy allows anything
                      // An entry with the right tuple but written by an egress hook (say of
                      // the peer, were it a local pod) is no proof that this pod's ingress
                      // allowed the flow.
    let key = ct("10.0.1.5", 40000, POD4, 80, PROTO_TCP, HOOK_FROM_POD);
    forge_entry(&mut h, key);
    assert_eq!(h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)), DROP);

    // The right hook, but of another interface: proof about another pod.
    let elsewhere = CtKey {
        hook: HOOK_TO_POD,
        ifindex: LO + 1,
        ..key
    };
    forge_entry(&mut h, elsewhere);
    assert_eq!(h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)), DROP);

    let key = CtKey {
        hook: HOOK_TO_POD,
        ..key
    };
    forge_entry(&mut h, key);
    assert_eq!(h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)), ALLOW);
    assert!(h.ct_get(&key).unwrap().last_seen_ns > 1, "reply refreshes");
}

/// A connection's first segment (SYN without ACK) is judged by policy alone:
/// no entry vouches for it, whichever hook wrote it. A retransmitted SYN of
/// an allowed connection passes by policy again; a SYN that crosses the
/// pod's own (a simultaneous open) meets the receiving hook's policy, not
/// the entry the pod's SYN wrote; the answer to a SYN (SYN-ACK) is a reply.
/// Both families: IPv4 decides it on the fast path, IPv6 on the full path.
#[test]
#[ignore = "needs root"]
fn a_connections_first_segment_is_judged_by_policy_alone() {
    require_root();
    for (pod, peer, net) in [
        (POD4, "10.0.1.5", "10.0.1.0/24"),
        (POD6, "fd00:1::5", "fd00:1::/64"),
    ] {
        let mut h = Harness::new();
        // Egress allows the peer on port 80; ingress allows nothing.
        h.endpoint(2, 1);
        h.cidr(1, net, 1);
        h.ports(1, PROTO_TCP, 80, 80);

        let open = tcp_flags(pod, 40000, peer, 80, SYN);
        assert_eq!(h.pod_sends(&open), ALLOW, "{pod}");
        assert_eq!(h.stat(STAT_ALLOWED_POLICY), 1);
        assert_eq!(h.ct_len(), 1, "the allowed SYN makes the entry");

        let answer = tcp_flags(peer, 80, pod, 40000, SYN | ACK);
        assert_eq!(h.pod_receives(&answer), ALLOW, "SYN-ACK is a reply");
        assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);

        let crossing = tcp_flags(peer, 80, pod, 40000, SYN);
        assert_eq!(
            h.pod_receives(&crossing),
            DROP,
            "no entry vouches for a SYN"
        );
        assert_eq!(h.stat(STAT_DENIED), 1);

        assert_eq!(h.pod_sends(&open), ALLOW, "retransmitted SYN: policy again");
        assert_eq!(h.stat(STAT_ALLOWED_POLICY), 2);
        assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 0);
        assert_eq!(h.pod_sends(&tcp(pod, 40000, peer, 80)), ALLOW);
        assert_eq!(
            h.stat(STAT_ALLOWED_ESTABLISHED),
            1,
            "then ACKs are established"
        );

        // Narrowed: the SYN is denied by the new policy, never passed by
        // the entry of the old one.
        h.switch(2, 3, 1, 2);
        assert_eq!(h.pod_sends(&open), DROP, "{pod}");
        assert_eq!(h.stat(STAT_DENIED), 2);

        // A segment cut before its flags opens nothing: it is judged like
        // any segment (its entry, then policy), here a stale entry and a
        // policy that denies: dropped.
        let cut = ip_packet(pod, peer, PROTO_TCP, &tcp_hdr_flags(40000, 80, SYN)[..13]);
        assert_eq!(h.pod_sends(&cut), DROP);
    }
}

#[test]
#[ignore = "needs root"]
fn tightened_policy_stops_an_established_flow() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let syn = tcp(POD4, 40000, "10.0.1.5", 80);
    assert_eq!(h.pod_sends(&syn), ALLOW);
    assert_eq!(h.pod_sends(&syn), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_POLICY), 1);
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 1);
    // Tightened: a new (empty) policy id under a new egress epoch.
    h.switch(0, 2, 0, 1);
    assert_eq!(h.pod_sends(&syn), DROP, "re-judged under the new epoch");
    assert_eq!(h.ct_len(), 0, "the denied flow's entry is forgotten");
    h.switch(0, 1, 0, 2);
    assert_eq!(h.pod_sends(&syn), ALLOW, "loosened again");
}

#[test]
#[ignore = "needs root"]
fn established_flows_skip_policy_until_the_epoch_moves() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let syn = tcp(POD4, 40000, "10.0.1.5", 80);
    assert_eq!(h.pod_sends(&syn), ALLOW);
    // Editing a table in place under the same epoch (the enforcer never
    // does) shows that an established packet is not looked up in policy.
    h.remove_cidr(1, "10.0.1.0/24");
    assert_eq!(h.pod_sends(&syn), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 1);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40001, "10.0.1.5", 80)),
        DROP,
        "a new flow is"
    );
    // Same id, new epoch: re-judged, denied, forgotten.
    h.switch(0, 1, 0, 7);
    assert_eq!(h.pod_sends(&syn), DROP);
    assert_eq!(h.ct_len(), 0);
}

/// Forward and reply entries are tried in the order the ports suggest
/// (lower destination port: forward first); a flow whose ports are the other
/// way round gets the same verdicts, only one lookup later.
#[test]
#[ignore = "needs root"]
fn verdicts_do_not_depend_on_which_port_is_lower() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(2, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 0, 65535);
    let flows = [(40000, 80), (80, 40000), (5000, 5000)];
    for (sport, dport) in flows {
        let out = tcp(POD4, sport, "10.0.1.5", dport);
        let back = tcp_flags("10.0.1.5", dport, POD4, sport, ACK);
        assert_eq!(h.pod_sends(&out), ALLOW, "{sport}->{dport} allowed");
        assert_eq!(h.pod_sends(&out), ALLOW, "{sport}->{dport} established");
        assert_eq!(h.pod_receives(&back), ALLOW, "{sport}->{dport} reply");
    }
    let n = flows.len() as u64;
    assert_eq!(h.stat(STAT_ALLOWED_POLICY), n);
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), n);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), n);
    // Egress revoked: both directions of every flow stop at once.
    h.switch(2, 3, 0, 9);
    for (sport, dport) in flows {
        let back = tcp_flags("10.0.1.5", dport, POD4, sport, ACK);
        assert_eq!(h.pod_receives(&back), DROP, "{sport}->{dport} reply");
        let out = tcp(POD4, sport, "10.0.1.5", dport);
        assert_eq!(h.pod_sends(&out), DROP, "{sport}->{dport} forward");
    }
    assert_eq!(h.ct_len(), 0);
}

#[test]
#[ignore = "needs root"]
fn an_epoch_change_that_still_allows_refreshes_the_entry() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.cidr(3, "10.0.0.0/16", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let syn = tcp(POD4, 40000, "10.0.1.5", 80);
    let key = ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD);
    assert_eq!(h.pod_sends(&syn), ALLOW);
    assert_eq!(h.ct_get(&key).unwrap().epoch, 0);
    h.switch(0, 3, 0, 5);
    assert_eq!(h.pod_sends(&syn), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_POLICY), 2, "re-judged");
    assert_eq!(h.ct_get(&key).unwrap().epoch, 5);
    assert_eq!(h.pod_sends(&syn), ALLOW);
    assert_eq!(
        h.stat(STAT_ALLOWED_ESTABLISHED),
        1,
        "then established again"
    );
    assert_eq!(h.ct_len(), 1);
}

#[test]
#[ignore = "needs root"]
fn replies_are_rejudged_when_the_writing_direction_moves() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // a server: ingress TCP 80 from 10.0.1.0/24, no egress
    h.cidr(1, "10.0.1.0/24", 1);
    h.cidr(3, "10.0.0.0/8", 1); // wider, still allows the client
    h.ports(1, PROTO_TCP, 80, 80);
    let request = tcp("10.0.1.5", 40000, POD4, 80);
    let reply = tcp(POD4, 80, "10.0.1.5", 40000);
    let key = ct("10.0.1.5", 40000, POD4, 80, PROTO_TCP, HOOK_TO_POD);
    assert_eq!(h.pod_receives(&request), ALLOW);
    assert_eq!(h.pod_sends(&reply), ALLOW);

    // The egress epoch moving says nothing about an ingress flow.
    h.switch(1, 4, 0, 9);
    assert_eq!(h.pod_sends(&reply), ALLOW);
    assert_eq!(h.ct_get(&key).unwrap().epoch, 0);

    // Ingress moves to a policy that still allows the flow: refreshed.
    h.switch(3, 4, 10, 9);
    assert_eq!(h.pod_sends(&reply), ALLOW);
    assert_eq!(h.ct_get(&key).unwrap().epoch, 10);

    // Ingress moves to one that does not: the replies stop too.
    h.switch(5, 4, 11, 9);
    assert_eq!(h.pod_sends(&reply), DROP);
    assert_eq!(h.ct_len(), 0, "forgotten");
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 3);
}

#[test]
#[ignore = "needs root"]
fn unisolated_replies_do_not_open_the_other_direction() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let out = tcp(POD4, 40000, "10.0.1.5", 80);
    assert_eq!(h.pod_sends(&out), ALLOW);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 80, POD4, 40000)), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);
    assert_eq!(h.ct_len(), 1, "the reply made no entry of its own");
    h.switch(0, 2, 0, 1);
    assert_eq!(h.pod_sends(&out), DROP);
}

#[test]
#[ignore = "needs root"]
fn sctp_and_udp_ports() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(7, 0);
    h.cidr(7, "10.0.0.0/8", 4);
    h.ports(4, PROTO_SCTP, 9000, 9000);
    h.ports(4, PROTO_UDP, 53, 53);

    assert_eq!(h.pod_receives(&sctp("10.0.1.5", 5000, POD4, 9000)), ALLOW);
    assert_eq!(h.pod_receives(&sctp("10.0.1.5", 5000, POD4, 9001)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 5000, POD4, 9000)), DROP);
    assert_eq!(h.pod_receives(&udp("10.0.1.5", 5000, POD4, 53)), ALLOW);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 5000, POD4, 53)), DROP);
    assert!(h.ct_has(&ct("10.0.1.5", 5000, POD4, 9000, PROTO_SCTP, HOOK_TO_POD)));
}

#[test]
#[ignore = "needs root"]
fn ipv6_peers() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "fd00:1::/64", 2);
    h.ports(2, PROTO_TCP, 443, 443);
    // A v4 catch-all must not match v6 peers (they share one trie).
    h.cidr(1, "0.0.0.0/0", 3);
    h.port_keys(PortKey::lpm_any_protocol(3));

    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::5", 443)), ALLOW);
    assert!(h.ct_has(&ct(POD6, 40000, "fd00:1::5", 443, PROTO_TCP, HOOK_FROM_POD)));
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::5", 80)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:2::5", 443)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "8.8.8.8", 443)), ALLOW);
    assert_eq!(
        h.pod_receives(&tcp("fd00:1::5", 443, POD6, 40000)),
        ALLOW,
        "reply"
    );
}

#[test]
#[ignore = "needs root"]
fn ipv6_sctp_and_udp() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 0);
    h.cidr(1, "::/0", 2);
    h.ports(2, PROTO_UDP, 5000, 5999);
    h.ports(2, PROTO_SCTP, 36412, 36412);
    assert_eq!(h.pod_receives(&udp("fd00:9::1", 1, POD6, 5999)), ALLOW);
    assert_eq!(h.pod_receives(&udp("fd00:9::1", 1, POD6, 6000)), DROP);
    assert_eq!(h.pod_receives(&sctp("fd00:9::1", 1, POD6, 36412)), ALLOW);
    assert_eq!(
        h.pod_receives(&tcp("10.0.0.9", 1, POD4, 5000)),
        DROP,
        "::/0 is v6 only"
    );
}

#[test]
#[ignore = "needs root"]
fn arp_passes_an_isolated_pod() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 1);
    assert_eq!(h.pod_sends(&arp_request()), ALLOW);
    assert_eq!(h.pod_receives(&arp_request()), ALLOW);
    assert_eq!(h.stats(), [0; STAT_COUNT as usize]);
}

#[test]
#[ignore = "needs root"]
fn neighbour_discovery_passes_other_icmpv6_does_not() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 1);
    let ns = icmpv6("fe80::1", "ff02::1:ff00:2", 135, 255);
    assert_eq!(h.pod_receives(&ns), ALLOW);
    assert_eq!(h.pod_sends(&icmpv6("fe80::2", "fe80::1", 136, 255)), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_NDP), 2);
    assert_eq!(
        h.pod_receives(&icmpv6("fe80::1", "fe80::2", 135, 64)),
        DROP,
        "routed NDP"
    );
    assert_eq!(
        h.pod_receives(&icmpv6("fd00::9", POD6, 128, 64)),
        DROP,
        "echo request"
    );
}

#[test]
#[ignore = "needs root"]
fn truncated_headers_fail_closed() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_UDP, 53, 53);
    // (Fragments: tests/fragments.rs.)
    let truncated = ipv4_with_frag(POD4, "10.0.1.5", PROTO_UDP, 0, &[0, 1]);
    assert_eq!(h.pod_sends(&truncated), DROP);
    assert_eq!(
        h.pod_receives(&ipv4_with_frag("10.0.1.5", POD4, PROTO_UDP, 0, &[0, 1])),
        DROP,
        "malformed drops even where the direction is not isolated"
    );
    assert_eq!(h.stat(STAT_DENIED_MALFORMED), 2);
}

#[test]
#[ignore = "needs root"]
fn maps_are_pinned_by_name() {
    require_root();
    let h = Harness::new();
    for name in MAP_NAMES {
        assert!(h.pins().join(name).exists(), "{name} not pinned");
    }
}

/// The sizes Rust reads (generated from c/lib/sizes.h and the enums) are
/// the ones the object was compiled with: a map sized by a literal instead
/// of its PAL_ name would show here.
#[test]
#[ignore = "needs root"]
fn maps_have_the_sizes_rust_shares() {
    require_root();
    let h = Harness::new();
    for (name, entries) in [
        (MAP_EP_SLOTS, EP_SLOTS),
        (MAP_EP_INDEX, MAX_ENDPOINTS),
        (MAP_CT_SHARE, EP_SLOTS),
        (MAP_POLICY, MAX_POLICY_ENTRIES),
        (MAP_POLICY_EXACT, MAX_POLICY_ENTRIES),
        (MAP_POLICY_LENS, MAX_POLICY_LENS_ENTRIES),
        (MAP_PORTS, MAX_PORT_ENTRIES),
        (MAP_CONNTRACK, MAX_CONNTRACK_ENTRIES),
        (MAP_CT4, MAX_CONNTRACK_ENTRIES),
        (MAP_STATS, STAT_MAP_ENTRIES),
        (MAP_FLOW_EVENTS, FLOW_EVENTS_BYTES),
        (MAP_FLOW_STATS, FLOW_STAT_COUNT),
        (MAP_FRAGS4, MAX_FRAG_ENTRIES),
        (MAP_FRAGS6, MAX_FRAG_ENTRIES),
        (MAP_LEARNED, MAX_LEARNED_ENTRIES),
        (MAP_LEARNED_INDEX, MAX_LEARNED_ENTRIES),
        (MAP_DNS_SERVERS, MAX_DNS_SERVERS),
        (MAP_DNS_FRAMES, DNS_FRAMES_BYTES),
        (MAP_DNS_STATS, DNS_STAT_COUNT),
        (MAP_DNS_FRAGS, MAX_DNS_FRAGS),
    ] {
        let map = aya::maps::MapData::from_pin(h.pins().join(name)).unwrap();
        assert_eq!(map.info().unwrap().max_entries(), entries, "{name}");
    }
}

#[test]
#[ignore = "needs root"]
fn a_second_load_shares_the_pinned_maps() {
    require_root();
    let mut h = Harness::new();
    let mut second = EbpfLoader::new()
        .default_map_pin_directory(h.pins())
        .load(OBJECT)
        .unwrap_or_else(|e| panic!("reload object: {e:?}"));
    let prog: &mut SchedClassifier = second
        .program_mut(PROG_FROM_POD)
        .unwrap()
        .try_into()
        .unwrap();
    prog.load().unwrap();
    h.endpoint(0, 1);
    let prog: &SchedClassifier = second.program(PROG_FROM_POD).unwrap().try_into().unwrap();
    let ctx = skb_ctx(LO);
    let frame = tcp(POD4, 40000, "10.0.1.5", 80);
    let result = prog
        .test_run(TestRunOptions {
            data_in: Some(&frame),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })
        .unwrap();
    assert_eq!(result.return_value, DROP, "sees the first load's endpoint");
    assert_eq!(h.stat(STAT_DENIED), 1, "and counts into the same stats");
}

// ------------------------------- policy lookup: exact keys per prefix length

/// The verdicts of a policy with a host entry inside a CIDR whose ports
/// differ, and a peer only the CIDR covers.
fn host_inside_cidr_verdicts(h: &Harness) -> [u32; 4] {
    [
        h.pod_sends(&tcp(POD4, 40000, "10.5.0.7", 22)),
        h.pod_sends(&tcp(POD4, 40001, "10.5.0.7", 80)),
        h.pod_sends(&tcp(POD4, 40002, "10.5.0.8", 80)),
        h.pod_sends(&tcp(POD4, 40003, "10.5.0.8", 22)),
    ]
}

#[test]
#[ignore = "needs root"]
fn a_host_entry_overrides_its_covering_cidr() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.5.0.0/16", 2);
    h.ports(2, PROTO_TCP, 80, 80);
    h.cidr(1, "10.5.0.7/32", 3);
    h.ports(3, PROTO_TCP, 22, 22);
    let lens = h
        .policy_lens()
        .get(&1, 0)
        .expect("a policy of two lengths is listed");
    assert_eq!(lens.lens(), [160, 144]);
    // The host gets its own port set only; its neighbour the CIDR's.
    assert_eq!(host_inside_cidr_verdicts(&h), [ALLOW, DROP, ALLOW, DROP]);
}

#[test]
#[ignore = "needs root"]
fn removing_a_host_entry_falls_back_to_the_cidr_then_to_nothing() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.5.0.0/16", 2);
    h.ports(2, PROTO_TCP, 80, 80);
    h.cidr(1, "10.5.0.7/32", 3);
    h.ports(3, PROTO_TCP, 22, 22);
    assert_eq!(host_inside_cidr_verdicts(&h), [ALLOW, DROP, ALLOW, DROP]);
    // Edited in place, so the direction's epoch moves (as the enforcer
    // does) and the flows just allowed are judged again.
    h.remove_cidr(1, "10.5.0.7/32");
    h.switch(0, 1, 0, 1);
    assert_eq!(h.policy_lens().get(&1, 0).unwrap().lens(), [144]);
    assert_eq!(host_inside_cidr_verdicts(&h), [DROP, ALLOW, ALLOW, DROP]);
    h.remove_cidr(1, "10.5.0.0/16");
    h.switch(0, 1, 0, 2);
    assert!(h.policy_lens().get(&1, 0).is_err(), "no entries, no list");
    assert_eq!(host_inside_cidr_verdicts(&h), [DROP; 4]);
    assert_eq!(h.policy_exact().keys().count(), 0);
}

#[test]
#[ignore = "needs root"]
fn a_policy_with_more_lengths_than_listed_is_looked_up_in_the_trie() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    // /8 ../32 in nested CIDRs, alternating between two port sets: seven
    // lengths, one more than a list holds.
    let nested = [
        "10.0.0.0/8",
        "10.5.0.0/16",
        "10.5.0.0/20",
        "10.5.0.0/24",
        "10.5.0.0/28",
        "10.5.0.0/30",
        "10.5.0.1/32",
    ];
    assert_eq!(nested.len(), MAX_POLICY_LENS + 1);
    for (i, cidr) in nested.iter().enumerate() {
        h.cidr(1, cidr, 2 + (i as u32 % 2));
    }
    h.ports(2, PROTO_TCP, 80, 80);
    h.ports(3, PROTO_TCP, 22, 22);
    assert!(h.policy_lens().get(&1, 0).is_err(), "trie fallback");
    // Each address gets the port set of the longest CIDR holding it.
    let cases = [
        ("10.9.9.9", 80),  // /8
        ("10.5.99.1", 22), // /16
        ("10.5.9.1", 80),  // /20
        ("10.5.0.99", 22), // /24
        ("10.5.0.9", 80),  // /28
        ("10.5.0.2", 22),  // /30
        ("10.5.0.1", 80),  // /32
    ];
    let judge = |h: &Harness| -> Vec<(u32, u32)> {
        cases
            .iter()
            .map(|&(peer, port)| {
                let other = if port == 80 { 22 } else { 80 };
                (
                    h.pod_sends(&tcp(POD4, 40000, peer, port)),
                    h.pod_sends(&tcp(POD4, 40001, peer, other)),
                )
            })
            .collect()
    };
    assert_eq!(judge(&h), vec![(ALLOW, DROP); cases.len()]);
    // One length fewer: listed again, and the same answers (a new epoch:
    // the flows above are judged again).
    h.remove_cidr(1, "10.5.0.0/30");
    h.switch(0, 1, 0, 1);
    assert_eq!(
        h.policy_lens().get(&1, 0).unwrap().lens(),
        [160, 156, 152, 148, 144, 136]
    );
    let mut expected = vec![(ALLOW, DROP); cases.len()];
    expected[5] = (DROP, ALLOW); // 10.5.0.2 now in the /28 (port 80)
    assert_eq!(judge(&h), expected);
}

#[test]
#[ignore = "needs root"]
fn a_policy_only_in_the_trie_is_still_judged() {
    require_root();
    // What an older version left behind: trie entries, no exact entries,
    // no length list.
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.policies()
        .insert(
            &cidr_key(1, "10.5.0.0/16"),
            PolicyValue { portset_id: 2 },
            0,
        )
        .unwrap();
    h.policies()
        .insert(
            &cidr_key(1, "10.5.0.7/32"),
            PolicyValue { portset_id: 3 },
            0,
        )
        .unwrap();
    h.ports(2, PROTO_TCP, 80, 80);
    h.ports(3, PROTO_TCP, 22, 22);
    assert_eq!(host_inside_cidr_verdicts(&h), [ALLOW, DROP, ALLOW, DROP]);
}

#[test]
#[ignore = "needs root"]
fn ipv6_hosts_and_prefixes_are_found_by_exact_key() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "fd00:1::/64", 2);
    h.ports(2, PROTO_TCP, 80, 80);
    h.cidr(1, "fd00:1::7/128", 3);
    h.ports(3, PROTO_TCP, 22, 22);
    h.cidr(1, "10.5.0.0/16", 2);
    assert_eq!(h.policy_lens().get(&1, 0).unwrap().lens(), [160, 144, 96]);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::7", 22)), ALLOW);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::7", 80)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::8", 80)), ALLOW);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:2::7", 80)), DROP);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.5.3.3", 80)), ALLOW);
}

#[test]
#[ignore = "needs root"]
fn ipv4_flows_are_tracked_in_their_own_map() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::5", 80)), ALLOW);
    assert_eq!(h.conntrack4().keys().count(), 1);
    assert_eq!(h.conntrack().keys().count(), 1);
    let k = h.conntrack4().keys().next().unwrap().unwrap();
    assert_eq!(
        k.widen(),
        ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD)
    );
}

#[test]
#[ignore = "needs root"]
fn an_ipv4_mapped_entry_in_the_ipv6_map_vouches_for_nothing() {
    require_root();
    // What an older version wrote: the programs look IPv4 flows up in
    // pal_ct4 only, so the enforcer moves such entries (and until then
    // they grant nothing).
    let mut h = Harness::new();
    h.endpoint(1, 0);
    let planted = ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD);
    h.conntrack()
        .insert(
            planted,
            CtValue {
                last_seen_ns: 1,
                ..CtValue::default()
            },
            0,
        )
        .unwrap();
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 80, POD4, 40000)), DROP);
}

// ------------------------------------- forged conntrack, spoofing, identity

const POD_B: &str = "10.0.0.2";
const POD_C: &str = "10.0.0.3";

/// Every TCP flag combination a reply (or a forged one) can carry.
const REPLY_FLAGS: [(u8, &str); 7] = [
    (SYN | ACK, "SYN-ACK"),
    (ACK, "ACK"),
    (RST, "RST"),
    (RST | ACK, "RST-ACK"),
    (FIN | ACK, "FIN-ACK"),
    (PSH | ACK, "PSH-ACK"),
    (0, "no flags"),
];

/// Pod b (ingress allows TCP 80 from 10.0.0.0/24, nothing else) and pod c
/// (not isolated at all), on the two ends of a veth pair.
fn victim_and_attacker(h: &mut Harness, b: u32, c: u32, c_addrs: &[&str]) {
    h.endpoint_at(b, 1, 0, &[POD_B]);
    h.cidr(1, "10.0.0.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    h.endpoint_at(c, 0, 0, c_addrs);
}

/// The attack: pod c sends frames that look like b:81's replies to c:X, so
/// that c's hook (c's egress is open) records the flow b:81 -> c:X; then c
/// connects c:X -> b:81, which b's ingress denies, hoping b's hook takes it
/// for a reply to that entry.
fn forge_then_connect(h: &mut Harness, b: u32, c: u32, spoof_verdict: u32) {
    for (i, (flags, name)) in REPLY_FLAGS.into_iter().enumerate() {
        let x = 40000 + i as u16;
        let forged = tcp_flags(POD_B, 81, POD_C, x, flags);
        assert_eq!(h.sends_at(c, &forged), spoof_verdict, "forged {name}");
        // Also as plain "replies" from c's own address toward b's port.
        let own = tcp_flags(POD_C, x, POD_B, 81, flags);
        assert_eq!(h.sends_at(c, &own), ALLOW, "c's egress is open ({name})");
        assert_eq!(h.receives_at(b, &own), DROP, "b denies port 81 ({name})");

        let connect = tcp(POD_C, x, POD_B, 81);
        assert_eq!(h.sends_at(c, &connect), ALLOW, "c's egress is open");
        assert_eq!(
            h.receives_at(b, &connect),
            DROP,
            "after a forged {name}, c's connect to b:81 must still be denied"
        );
    }
    // A forged UDP "reply" is no better.
    assert_eq!(
        h.sends_at(c, &udp(POD_B, 81, POD_C, 50000)),
        spoof_verdict,
        "forged UDP"
    );
    assert_eq!(h.sends_at(c, &udp(POD_C, 50000, POD_B, 81)), ALLOW);
    assert_eq!(h.receives_at(b, &udp(POD_C, 50000, POD_B, 81)), DROP);
    // The allowed port still works.
    assert_eq!(h.receives_at(b, &tcp(POD_C, 39999, POD_B, 80)), ALLOW);
    // No entry of b's hooks ever vouches for port 81.
    for key in h.ct_keys() {
        assert!(
            !(key.ifindex == b && (key.sport() == 81 || key.dport() == 81)),
            "entry on b for port 81: {key:?}"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn forged_replies_cannot_open_a_denied_port() {
    require_root();
    with_two_pods(|b, c| {
        let mut h = Harness::new();
        victim_and_attacker(&mut h, b, c, &[POD_C]);
        forge_then_connect(&mut h, b, c, DROP);
        assert_eq!(
            h.stat(STAT_DENIED_SPOOF),
            REPLY_FLAGS.len() as u64 + 1,
            "every forged frame counted as spoofed"
        );
        assert!(
            h.ct_keys()
                .iter()
                .all(|k| k.src_ip() != ip(POD_B) || k.ifindex != c || k.hook != HOOK_FROM_POD),
            "a spoofed frame made an entry"
        );
    });
}

#[test]
#[ignore = "needs root"]
fn forged_replies_cannot_open_a_denied_port_even_past_the_spoof_check() {
    require_root();
    // Should c be allowed to send from b's address (a misconfigured address
    // list), the entries its frames create are c's and vouch for nothing
    // at b's hooks.
    with_two_pods(|b, c| {
        let mut h = Harness::new();
        victim_and_attacker(&mut h, b, c, &[POD_C, POD_B]);
        forge_then_connect(&mut h, b, c, ALLOW);
        assert!(
            h.ct_has(&ct_at(c, POD_B, 81, POD_C, 40000, PROTO_TCP, HOOK_FROM_POD)),
            "the forged frame did make an entry, on c's hook"
        );
    });
}

#[test]
#[ignore = "needs root"]
fn spoofed_sources_are_dropped_and_counted() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::5", 80)), ALLOW);
    let spoofs = [
        tcp("10.0.0.99", 40000, "10.0.1.5", 80),
        udp("10.0.1.5", 53, "10.0.1.6", 53),
        icmp_echo("0.0.0.0", "10.0.1.5"),
        tcp("fd00::99", 40000, "fd00:1::5", 80),
        // The pod's IPv4 address dressed as IPv6 must not pass for it.
        tcp("::ffff:10.0.0.2", 40000, "fd00:1::5", 80),
        // Non-first fragments have no ports but do have a source.
        ipv4_with_frag("10.0.0.99", "10.0.1.5", PROTO_UDP, 0x0002, &[0; 16]),
    ];
    for (i, frame) in spoofs.iter().enumerate() {
        assert_eq!(h.pod_sends(frame), DROP, "spoof {i}");
    }
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 5);
    assert_eq!(h.stat(STAT_DENIED_MALFORMED), 1, "the IPv4-mapped one");
    assert_eq!(h.ct_len(), 2, "only the genuine flows");
    // Spoofing is about what the pod sends; what it receives has any source.
    assert_eq!(h.pod_receives(&tcp("10.0.0.99", 1, POD4, 2)), ALLOW);
}

#[test]
#[ignore = "needs root"]
fn no_pod_addresses_drops_everything_the_pod_sends() {
    require_root();
    let mut h = Harness::new();
    h.endpoint_at(LO, 0, 0, &[]);
    for frame in [
        tcp(POD4, 40000, "10.0.1.5", 80),
        udp(POD6, 40000, "fd00:1::5", 53),
        icmp_echo(POD4, "10.0.1.5"),
        icmpv6(POD6, "fd00:1::5", 128, 64),
    ] {
        assert_eq!(h.pod_sends(&frame), DROP);
    }
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 4);
    assert_eq!(h.ct_len(), 0);
    // Neighbour discovery and ARP still work, so the pod can be reached.
    assert_eq!(h.pod_sends(&arp_request()), ALLOW);
    assert_eq!(
        h.pod_sends(&icmpv6("::", "ff02::1:ff00:2", 135, 255)),
        ALLOW
    );
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 80, POD4, 40000)), ALLOW);
}

#[test]
#[ignore = "needs root"]
fn neighbour_discovery_passes_before_the_spoof_check() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 1);
    // Duplicate address detection sends from the unspecified address, and
    // NDP in general from the link-local one, which is not a pod address.
    assert_eq!(
        h.pod_sends(&icmpv6("::", "ff02::1:ff00:2", 135, 255)),
        ALLOW
    );
    assert_eq!(h.pod_sends(&icmpv6("fe80::2", "ff02::2", 133, 255)), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_NDP), 2);
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 0);
    // Not NDP (hop limit): judged as anything else from that source.
    assert_eq!(h.pod_sends(&icmpv6("fe80::2", "ff02::2", 133, 64)), DROP);
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 1);
}

#[test]
#[ignore = "needs root"]
fn an_entry_of_one_pod_does_not_pass_another() {
    require_root();
    // Pod a is deleted and pod b reuses its address: a's entries must not
    // let anything through b's hooks.
    with_two_pods(|a, b| {
        let mut h = Harness::new();
        h.cidr(1, "10.0.1.5/32", 1);
        h.ports(1, PROTO_TCP, 80, 80);
        h.ports(1, PROTO_TCP, 8080, 8080);
        h.endpoint_at(a, 1, 1, &[POD4]);
        // a's egress flow and its reply.
        assert_eq!(h.sends_at(a, &tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
        assert_eq!(h.receives_at(a, &tcp("10.0.1.5", 80, POD4, 40000)), ALLOW);
        // a's ingress flow and its reply.
        assert_eq!(h.receives_at(a, &tcp("10.0.1.5", 5000, POD4, 8080)), ALLOW);
        assert_eq!(h.sends_at(a, &tcp(POD4, 8080, "10.0.1.5", 5000)), ALLOW);
        assert!(h.ct_has(&ct_at(
            a,
            POD4,
            40000,
            "10.0.1.5",
            80,
            PROTO_TCP,
            HOOK_FROM_POD
        )));
        assert!(h.ct_has(&ct_at(
            a,
            "10.0.1.5",
            5000,
            POD4,
            8080,
            PROTO_TCP,
            HOOK_TO_POD
        )));

        h.endpoint_at(b, 2, 2, &[POD4]); // policy 2: nothing allowed
        assert_eq!(
            h.receives_at(b, &tcp("10.0.1.5", 80, POD4, 40000)),
            DROP,
            "reply to a's egress flow, at b"
        );
        assert_eq!(
            h.sends_at(b, &tcp(POD4, 8080, "10.0.1.5", 5000)),
            DROP,
            "reply to a's ingress flow, from b"
        );
        assert_eq!(h.stat(STAT_DENIED), 2);
        assert!(
            h.ct_keys().iter().all(|k| k.ifindex == a),
            "b made no entries"
        );
    });
}

#[test]
#[ignore = "needs root"]
fn allowed_flows_get_their_replies_between_two_isolated_pods() {
    require_root();
    // Client c: egress allows the server's TCP 80, ingress allows nothing.
    // Server s: ingress allows the client on TCP 80, egress allows nothing.
    with_two_pods(|c, s| {
        let mut h = Harness::new();
        h.endpoint_at(c, 1, 2, &[POD_C]);
        h.endpoint_at(s, 3, 1, &[POD_B]);
        h.cidr(2, "10.0.0.2/32", 5);
        h.cidr(3, "10.0.0.3/32", 5);
        h.ports(5, PROTO_TCP, 80, 80);

        let syn = tcp(POD_C, 40000, POD_B, 80);
        assert_eq!(h.sends_at(c, &syn), ALLOW, "c's egress");
        assert_eq!(h.receives_at(s, &syn), ALLOW, "s's ingress");
        for (flags, name) in REPLY_FLAGS {
            let reply = tcp_flags(POD_B, 80, POD_C, 40000, flags);
            assert_eq!(h.sends_at(s, &reply), ALLOW, "s replies {name}");
            assert_eq!(h.receives_at(c, &reply), ALLOW, "c receives {name}");
            let more = tcp_flags(POD_C, 40000, POD_B, 80, flags);
            assert_eq!(h.sends_at(c, &more), ALLOW, "c continues {name}");
            assert_eq!(h.receives_at(s, &more), ALLOW, "s receives {name}");
        }
        assert_eq!(h.stat(STAT_ALLOWED_REPLY), 2 * REPLY_FLAGS.len() as u64);
        assert_eq!(
            h.ct_len(),
            2,
            "one entry per allowing hook, none for replies"
        );

        // Neither may start anything the other way.
        assert_eq!(h.sends_at(s, &tcp(POD_B, 80, POD_C, 40001)), DROP);
        assert_eq!(h.receives_at(c, &tcp(POD_B, 80, POD_C, 40001)), DROP);
        assert_eq!(h.sends_at(s, &tcp(POD_B, 40000, POD_C, 80)), DROP);
    });
}

#[test]
#[ignore = "needs root"]
fn server_with_default_deny_egress_answers_its_clients() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(1, 2); // egress policy 2 has no entries
    h.cidr(1, "0.0.0.0/0", 1);
    h.cidr(1, "::/0", 1);
    h.ports(1, PROTO_TCP, 443, 443);
    for (client, server) in [("10.7.0.1", POD4), ("fd00:7::1", POD6)] {
        assert_eq!(h.pod_receives(&tcp(client, 50000, server, 443)), ALLOW);
        for (flags, name) in REPLY_FLAGS {
            let reply = tcp_flags(server, 443, client, 50000, flags);
            assert_eq!(h.pod_sends(&reply), ALLOW, "{client}: {name}");
        }
        assert_eq!(h.pod_sends(&tcp(server, 443, client, 50001)), DROP);
    }
}

#[test]
#[ignore = "needs root"]
fn malformed_ip_drops_on_both_hooks_whatever_the_policy() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    let good = ipv4_with_frag(POD4, "10.0.1.5", PROTO_UDP, 0, &udp_hdr(1, 2));
    let mut short_ihl = good.clone();
    short_ihl[14] = 0x44;
    let mut wrong_version = good.clone();
    wrong_version[14] = 0x65;
    let truncated_l4 = ipv4_with_frag(POD4, "10.0.1.5", PROTO_TCP, 0, &[0, 1, 0]);
    let mut v6 = tcp(POD6, 1, "fd00:1::5", 2);
    v6[14] = 0x40; // version 4 in an IPv6 frame
    let truncated_l4_v6 = ipv6_with_hops(POD6, "fd00:1::5", PROTO_UDP, 64, &[0, 1]);
    // A truncated IP header itself cannot be tested here: BPF_PROG_TEST_RUN
    // refuses such a frame before the program runs (EINVAL).
    let frames = [short_ihl, wrong_version, truncated_l4, v6, truncated_l4_v6];
    for (i, frame) in frames.iter().enumerate() {
        assert_eq!(h.pod_sends(frame), DROP, "frame {i} sent");
        assert_eq!(h.pod_receives(frame), DROP, "frame {i} received");
    }
    assert_eq!(h.stat(STAT_DENIED_MALFORMED), 2 * frames.len() as u64);
    assert_eq!(h.pod_sends(&good), ALLOW, "the frame they were made from");
}

#[test]
#[ignore = "needs root"]
fn verdicts_are_tcx_return_codes() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 1);
    // TCX_NEXT (-1): later programs on the hook run; TCX_PASS (0) would
    // skip them. TC_ACT_SHOT (2) is TCX_DROP.
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 1, POD4, 2)) as i32, -1);
    assert_eq!(h.pod_sends(&tcp(POD4, 1, "10.0.1.5", 2)) as i32, 2);
    assert_eq!(h.pod_sends(&arp_request()) as i32, -1);
    let other = Harness::new();
    assert_eq!(
        other.pod_sends(&tcp(POD4, 1, "10.0.1.5", 2)) as i32,
        -1,
        "not ours"
    );
}

#[test]
#[ignore = "needs root"]
fn deny_all_policy_id_drops_both_ways() {
    require_root();
    let mut h = Harness::new();
    // Tables full of rules for other ids, including ones allowing anything.
    h.cidr(1, "0.0.0.0/0", 1);
    h.cidr(1, "::/0", 1);
    h.port_keys(PortKey::lpm_any_protocol(1));
    h.cidr(u32::MAX - 1, "0.0.0.0/0", 1);
    h.endpoint(u32::MAX, u32::MAX);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), DROP);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), DROP);
    assert_eq!(h.pod_sends(&udp(POD6, 40000, "fd00:1::5", 53)), DROP);
    assert_eq!(h.pod_receives(&udp("fd00:1::5", 53, POD6, 40000)), DROP);
    assert_eq!(h.pod_sends(&icmp_echo(POD4, "10.0.1.5")), DROP);
    assert_eq!(h.stat(STAT_DENIED), 5);
    assert_eq!(h.ct_len(), 0);
    h.endpoint(1, 1);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)),
        ALLOW,
        "sanity"
    );
}

// ------------------------------------------- headers in paged data (copy)

/// An IPv4 frame given `extra` bytes of IP options (ihl grows to match).
fn with_ip_options(mut frame: Vec<u8>, extra: usize) -> Vec<u8> {
    assert_eq!(extra % 4, 0);
    let at = 14 + 20;
    frame.splice(at..at, std::iter::repeat_n(0u8, extra));
    frame[14] = 0x40 | (5 + extra / 4) as u8;
    frame
}

/// Headers in paged data take header_at's copy path, which
/// BPF_PROG_TEST_RUN's linear skbs never reach. A build that copies every
/// header must judge every kind of frame as the in-place build does:
/// same verdicts, same counters, same conntrack entries.
#[test]
#[ignore = "needs root"]
fn headers_read_by_copy_judge_like_headers_read_in_place() {
    require_root();
    assert_ne!(OBJECT, HEADERS_BY_COPY_OBJECT, "two different builds");
    let peer4 = "10.0.1.5";
    let peer6 = "fd00:1::5";
    let out = |f: Vec<u8>| (PROG_FROM_POD, f);
    let into = |f: Vec<u8>| (PROG_TO_POD, f);
    let frames = vec![
        out(tcp(POD4, 40000, peer4, 80)),
        out(tcp(POD4, 40000, peer4, 80)),
        into(tcp_flags(peer4, 80, POD4, 40000, ACK)),
        out(tcp_flags(POD4, 40000, peer4, 80, SYN)),
        into(tcp_flags(peer4, 80, POD4, 40000, SYN)),
        into(tcp_flags(peer4, 80, POD4, 40000, SYN | ACK)),
        out(tcp_flags(POD4, 40010, peer4, 80, SYN)),
        out(ip_packet(POD4, peer4, PROTO_TCP, &tcp_hdr(40011, 80)[..13])),
        out(tcp(POD4, 40001, peer4, 81)),
        out(udp(POD4, 5000, peer4, 53)),
        into(udp(peer4, 53, POD4, 5000)),
        out(sctp(POD4, 7000, peer4, 9)),
        out(icmp_echo(POD4, peer4)),
        into(icmp_echo(peer4, POD4)),
        out(with_ip_options(tcp(POD4, 40002, peer4, 80), 8)),
        into(with_ip_options(tcp(peer4, 40003, POD4, 80), 4)),
        out(ipv4_with_frag(
            POD4,
            peer4,
            PROTO_UDP,
            0x2000,
            &udp_hdr(1000, 53),
        )),
        out(ipv4_with_frag(POD4, peer4, PROTO_UDP, 0x0002, &[0; 16])),
        out(ipv4_with_frag(POD4, peer4, PROTO_UDP, 0, &[0, 1])),
        out(arp_request()),
        out(tcp("10.0.0.99", 40000, peer4, 80)),
        out(tcp(POD6, 40000, peer6, 443)),
        into(tcp_flags(peer6, 443, POD6, 40000, ACK)),
        out(tcp_flags(POD6, 40000, peer6, 443, SYN)),
        into(tcp_flags(peer6, 443, POD6, 40000, SYN)),
        into(tcp(peer6, 40000, POD6, 443)),
        out(icmpv6(POD6, peer6, 135, 255)),
        out(icmpv6(POD6, peer6, 128, 255)),
        out(ipv6_with_hops(POD6, peer6, 0, 64, &tcp_hdr(40000, 443))),
        // (BPF_PROG_TEST_RUN refuses frames shorter than their IP header.)
        out(ipv6_with_hops(POD6, peer6, PROTO_TCP, 64, &[0, 1])),
    ];
    let judge = |object: &[u8]| {
        let mut h = Harness::with_object(object);
        h.endpoint(2, 1);
        h.cidr(1, "10.0.1.0/24", 1);
        h.cidr(1, "fd00:1::/64", 1);
        h.ports(1, PROTO_TCP, 80, 80);
        h.ports(1, PROTO_TCP, 443, 443);
        h.ports(1, PROTO_UDP, 53, 53);
        h.ports(1, PROTO_SCTP, 9, 9);
        h.cidr(2, "10.0.1.0/24", 2);
        h.port_keys(PortKey::lpm(2, PROTO_TCP, 0, 0));
        let verdicts: Vec<u32> = frames.iter().map(|(prog, f)| h.run(prog, f)).collect();
        let mut entries = h.ct_keys();
        entries.sort_by_key(|k| (k.src, k.dst, k.sport, k.dport, k.proto, k.hook));
        (verdicts, h.stats(), entries)
    };
    let in_place = judge(OBJECT);
    let by_copy = judge(HEADERS_BY_COPY_OBJECT);
    assert!(in_place.0.contains(&ALLOW) && in_place.0.contains(&DROP));
    assert!(!in_place.2.is_empty());
    for (i, (a, b)) in in_place.0.iter().zip(&by_copy.0).enumerate() {
        assert_eq!(a, b, "frame {i} judged differently");
    }
    assert_eq!(in_place.1, by_copy.1, "counters");
    assert_eq!(in_place.2, by_copy.2, "conntrack entries");
}

/// Writes a conntrack entry as if a hook had allowed that flow, without any
/// packet: what a forger would need to exist.
fn forge_entry(h: &mut Harness, key: CtKey) {
    h.ct_insert(
        key,
        CtValue {
            last_seen_ns: 1,
            ..CtValue::default()
        },
    );
}

/// The IPv4 fast path (established and reply packets of a plain IPv4
/// header) answers only when the full path would pass the packet under the
/// same counter; everything else falls through to the full path, which must
/// still judge it: a pod that lost an address cannot keep using the flows
/// it made from it, a header with options or a stale entry is judged in full.
#[test]
#[ignore = "needs root"]
fn the_ipv4_fast_path_passes_only_what_the_full_path_would() {
    require_root();
    fast_path_cases(Harness::new());
}

#[test]
#[ignore = "needs root"]
fn the_ipv4_fast_path_judges_alike_for_an_endpoint_found_through_the_index() {
    require_root();
    fast_path_cases(Harness::new().off_home());
}

fn fast_path_cases(mut h: Harness) {
    h.endpoint(0, 0);
    let fwd = tcp(POD4, 40000, "10.0.1.5", 80);
    let reply = tcp("10.0.1.5", 80, POD4, 40000);
    assert_eq!(h.pod_sends(&fwd), ALLOW);
    assert_eq!(h.pod_sends(&fwd), ALLOW);
    assert_eq!(h.pod_receives(&reply), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 1);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);

    // Same flow through a header with options: the full path, same answer.
    assert_eq!(h.pod_sends(&with_ip_options(fwd.clone(), 4)), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), 2);

    // The pod no longer owns 10.0.0.2: its entry vouches for nothing.
    h.endpoint_at(LO, 0, 0, &[POD6]);
    assert_eq!(h.pod_sends(&fwd), DROP);
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 1);

    // A stale epoch with a policy that now denies: dropped and forgotten,
    // the reply too.
    h.endpoint(0, 0);
    assert_eq!(h.pod_sends(&fwd), ALLOW);
    h.switch(7, 7, 9, 9);
    assert_eq!(h.pod_sends(&fwd), DROP);
    assert!(!h.ct_has(&ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD)));
    assert_eq!(h.pod_receives(&reply), DROP);

    // A truncated L4 header misses the fast path and drops as malformed.
    let mut short = fwd.clone();
    short.truncate(14 + 20 + 3);
    assert_eq!(h.pod_sends(&short), DROP);
    assert_eq!(h.stat(STAT_DENIED_MALFORMED), 1);

    // An empty UDP datagram ends before the fast path's bound (TCP's
    // flags): the full path passes its flow alike, on the same counters.
    h.switch(0, 0, 11, 11);
    let empty = ip_packet(POD4, "10.0.1.5", PROTO_UDP, &udp_hdr(5000, 53)[..8]);
    let answer = ip_packet("10.0.1.5", POD4, PROTO_UDP, &udp_hdr(53, 5000)[..8]);
    let established = h.stat(STAT_ALLOWED_ESTABLISHED);
    let replies = h.stat(STAT_ALLOWED_REPLY);
    assert_eq!(h.pod_sends(&empty), ALLOW);
    assert_eq!(h.pod_sends(&empty), ALLOW);
    assert_eq!(h.pod_receives(&answer), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_ESTABLISHED), established + 1);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), replies + 1);
}

/// Where a packet finds its endpoint (struct ep_slot): its home slot counts
/// only while that slot says it is the interface's there, and a slot the
/// index names only while it names the interface; one that names another
/// drops the packet under its own counter, whatever that slot allows.
#[test]
#[ignore = "needs root"]
fn an_endpoint_slot_counts_only_where_it_names_the_interface() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    let fwd = tcp(POD4, 40000, "10.0.1.5", 80);
    let to_pod = tcp("10.0.1.5", 80, POD4, 40001);
    assert_eq!(h.pod_sends(&fwd), ALLOW);
    let home = ep_home(LO);
    let ours = h.ep_slots().get(&home, 0).unwrap();
    assert_eq!((ours.ifindex, ours.home), (LO, LO));

    // Not (yet) trusted at home: found through the index, same answer.
    h.ep_slots()
        .set(home, EpSlot { home: 0, ..ours }, 0)
        .unwrap();
    assert_eq!(h.pod_sends(&fwd), ALLOW);
    assert_eq!(h.stat(STAT_DENIED_ENDPOINT_UNSURE), 0);

    // The index names a slot that holds another interface (its element was
    // reused under the lookup): dropped on both hooks, by neither policy.
    let elsewhere = ep_home(LO + 1);
    let other = EpSlot {
        ifindex: LO + 1,
        home: 0,
        ..ours
    };
    h.ep_slots().set(elsewhere, other, 0).unwrap();
    h.ep_index().insert(LO, elsewhere, 0).unwrap();
    assert_eq!(h.pod_sends(&fwd), DROP);
    assert_eq!(h.pod_receives(&to_pod), DROP);
    // Or a slot past the array, or an empty one.
    h.ep_index().insert(LO, EP_SLOTS + 3, 0).unwrap();
    assert_eq!(h.pod_sends(&fwd), DROP);
    h.ep_index().insert(LO, ep_home(LO + 2), 0).unwrap();
    assert_eq!(h.pod_sends(&fwd), DROP);
    assert_eq!(h.stat(STAT_DENIED_ENDPOINT_UNSURE), 4);
    assert_eq!(h.stat(STAT_DENIED), 0);

    // The home slot shared with another interface, which holds it: not
    // ours, and without an index entry LO has no endpoint at all.
    let sharer = EpSlot {
        ifindex: LO + EP_SLOTS,
        home: LO + EP_SLOTS,
        ..ours
    };
    h.ep_slots().set(home, sharer, 0).unwrap();
    h.ep_index().remove(&LO).unwrap();
    let counted: u64 = h.stats().iter().sum();
    assert_eq!(h.pod_sends(&fwd), ALLOW, "not ours to judge");
    assert_eq!(h.stats().iter().sum::<u64>(), counted, "nothing judged");

    // The test can fail: a home slot that names the interface is trusted
    // as it is, which is why the enforcer sets home only a grace period
    // after the rest of the slot.
    let denying = EpSlot {
        ifindex: LO,
        home: LO,
        egress: Direction {
            policy: 9,
            epoch: 3,
        }
        .word(),
        ..ours
    };
    h.ep_slots().set(home, denying, 0).unwrap();
    assert_eq!(h.pod_sends(&fwd), DROP);
    assert_eq!(h.stat(STAT_DENIED), 1);
}

/// Each hook of an endpoint holds at most its share of the conntrack
/// table: past it, a new flow policy allows is dropped and counted, while
/// the flows it holds keep passing, the other hook keeps its own share,
/// and every entry removed (by the programs or anyone) frees its place.
#[test]
#[ignore = "needs root"]
fn a_hook_holding_its_conntrack_share_drops_new_flows_and_keeps_the_flows_it_has() {
    require_root();
    let mut h = Harness::new();
    h.set_ct_share(2);
    h.endpoint(0, 0);
    let slot = h.slot_of(LO);
    let syn = |sport| tcp_flags(POD4, sport, "10.0.1.5", 80, SYN);
    assert_eq!(h.pod_sends(&syn(40000)), ALLOW);
    assert_eq!(h.pod_sends(&udp(POD4, 5000, "10.0.1.5", 53)), ALLOW);
    assert_eq!(h.ct_share(slot).created, [2, 0]);
    assert_eq!(h.pod_sends(&syn(40001)), DROP, "a third flow");
    assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_DENIED_CT_SHARE), 1);
    assert!(!h.ct_has(&ct(POD4, 40001, "10.0.1.5", 80, PROTO_TCP, HOOK_FROM_POD)));
    // A flow it holds: established, its replies too, and a SYN of it again
    // (a retransmission) makes nothing new.
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), ALLOW);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 80, POD4, 40000)), ALLOW);
    assert_eq!(h.pod_receives(&udp("10.0.1.5", 53, POD4, 5000)), ALLOW);
    // The other hook's share is its own.
    assert_eq!(
        h.pod_receives(&tcp_flags("10.0.1.7", 41000, POD4, 80, SYN)),
        ALLOW
    );
    assert_eq!(h.ct_share(slot).created, [2, 1]);

    // Entries the programs remove (policy now denies) are counted...
    h.switch(7, 7, 1, 1);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), DROP);
    assert_eq!(h.ct_share(slot).removed, [1, 0]);
    // ... and free their place for a new flow.
    h.switch(0, 0, 2, 2);
    assert_eq!(h.pod_sends(&syn(40001)), ALLOW);
    assert_eq!(h.pod_sends(&syn(40002)), DROP);
    assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_DENIED_CT_SHARE), 2);
    // Denied by policy is denied by policy, whatever the share.
    h.switch(7, 7, 3, 3);
    assert_eq!(h.pod_sends(&syn(40003)), DROP);
    assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_DENIED_CT_SHARE), 2);
    assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_DENIED), 2);
}
