//! Egress by domain name, the datapath's part: a pod's learned overlay
//! (slots of `pal_learned`, found through `pal_learned_index`) decides its
//! egress to the addresses it holds, before the egress table
//! (`c/lib/policy.h`, `peer_allowed`), and only through a slot that names
//! the pod and the peer (`learned_entry`). Real programs run
//! with BPF_PROG_TEST_RUN on hand-built frames, IPv4 and IPv6, as in
//! `tests/verdict.rs`; expiries are set from the real `CLOCK_BOOTTIME`
//! (the programs' clock for them), an expired entry by writing an expiry in
//! the past, so no test sleeps. Needs root and a bpffs at /sys/fs/bpf.

use palisade_ebpf::testkit::frames::*;
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;
use palisade_test_support::require_root;

mod common;
use common::with_two_pods;

/// The pod's egress table: it allows [`ALLOWED`]'s /24 (or /64) on TCP
/// 443 and nothing else, so [`X`] (a host learned by name) is denied by it.
const EGRESS: u32 = 5;
/// The table's port set: TCP 443.
const TABLE_PORTS: u32 = 9;
/// The pod's ingress table: isolated, no rules (every new inbound flow
/// drops, so a reply passes only as a reply).
const INGRESS: u32 = 3;
/// A learned entry's port set: TCP 443.
const LEARNED_443: u32 = 20;
/// A port set with no entries: allows nothing.
const NOTHING: u32 = 21;
/// A port set whose one entry matches every protocol and port, and denies
/// (a tier's Deny above the name's Accept, compiled into the set).
const DENY_ALL_PORTS: u32 = 22;
/// A learned entry's port set: TCP 80.
const LEARNED_80: u32 = 23;
/// The host veth of a pod whose slots the tests point the learning pod's
/// index at; no packet of it runs, so it needs no interface.
const OTHER_POD: u32 = 7;

/// One family's addresses: the pod's own, a host the table denies (learned
/// by name), one the table allows, the CIDR that allows it, and a host
/// neither the table nor any entry names.
struct Family {
    pod: &'static str,
    x: &'static str,
    allowed: &'static str,
    allowed_cidr: &'static str,
    other: &'static str,
}

const V4: Family = Family {
    pod: POD4,
    x: "10.9.9.9",
    allowed: "10.0.1.5",
    allowed_cidr: "10.0.1.0/24",
    other: "10.8.8.8",
};
const V6: Family = Family {
    pod: POD6,
    x: "fd00:9::9",
    allowed: "fd00:1::5",
    allowed_cidr: "fd00:1::/64",
    other: "fd00:8::8",
};
const FAMILIES: [&Family; 2] = [&V4, &V6];

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

fn future() -> u64 {
    boot_ns() + HOUR_NS
}

/// Already past: written that way, never waited for.
fn past() -> u64 {
    boot_ns() - 1
}

/// The tables and port sets every test here shares, for an endpoint
/// written afterwards.
fn tables(h: &mut Harness) {
    for f in FAMILIES {
        h.cidr(EGRESS, f.allowed_cidr, TABLE_PORTS);
    }
    h.ports(TABLE_PORTS, PROTO_TCP, 443, 443);
    h.ports(LEARNED_443, PROTO_TCP, 443, 443);
    h.ports(LEARNED_80, PROTO_TCP, 80, 80);
    h.deny_port_keys(PortKey::lpm_any_protocol(DENY_ALL_PORTS));
}

/// The pod on [`LO`]: egress isolated by [`EGRESS`], ingress by
/// [`INGRESS`], with domain-name rules (`EP_FLAG_LEARNS`).
fn learning_pod() -> Harness {
    let mut h = Harness::new();
    tables(&mut h);
    h.endpoint(INGRESS, EGRESS);
    h.set_learns(LO, true);
    h
}

fn syn(src: &str, dst: &str, dport: u16) -> Vec<u8> {
    tcp_flags(src, 40000, dst, dport, SYN)
}

#[test]
#[ignore = "needs root"]
fn a_live_entry_allows_what_its_port_set_allows() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        assert_eq!(
            h.pod_sends(&syn(f.pod, f.x, 443)),
            DROP,
            "the table denies X"
        );
        h.learn_at(LO, f.x, future(), LEARNED_443);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), ALLOW, "{}:443", f.x);
        assert!(h.ct_has(&ct(f.pod, 40000, f.x, 443, PROTO_TCP, HOOK_FROM_POD)));
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 80)), DROP, "{}:80", f.x);
        assert_eq!(
            h.pod_sends(&udp(f.pod, 40000, f.x, 443)),
            DROP,
            "UDP {}:443",
            f.x
        );
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_LEARNED), 1);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 0);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_DENIED), 3);
    }
}

#[test]
#[ignore = "needs root"]
fn an_expired_entry_is_ignored_by_new_flows() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.learn_at(LO, f.x, past(), LEARNED_443);
        assert_eq!(
            h.pod_sends(&syn(f.pod, f.x, 443)),
            DROP,
            "{}: the table decides",
            f.x
        );
        // Expired, an entry that allows nothing no longer narrows the
        // table either.
        h.learn_at(LO, f.allowed, past(), NOTHING);
        assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 443)), ALLOW);
        assert_eq!(h.stat(STAT_ALLOWED_LEARNED), 0);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 1);
    }
}

#[test]
#[ignore = "needs root"]
fn without_the_flag_entries_are_ignored() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.set_learns(LO, false);
        h.learn_at(LO, f.x, future(), LEARNED_443);
        h.learn_at(LO, f.allowed, future(), NOTHING);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), DROP, "{}", f.x);
        assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 443)), ALLOW);
        h.set_learns(LO, true);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), ALLOW, "flag set again");
        assert_eq!(
            h.pod_sends(&tcp_flags(f.pod, 40001, f.allowed, 443, SYN)),
            DROP
        );
    }
}

/// What one pod learned is not another's to reach: the entry is under the
/// first pod's host veth, and the second (same table, flag set) finds none.
#[test]
#[ignore = "needs root"]
fn an_entry_of_another_pod_is_ignored() {
    require_root();
    with_two_pods(|a, b| {
        for (pa, pb, x) in [("10.0.0.2", "10.0.0.3", V4.x), ("fd00::2", "fd00::3", V6.x)] {
            let mut h = Harness::new();
            tables(&mut h);
            h.endpoint_at(a, INGRESS, EGRESS, &[pa]);
            h.endpoint_at(b, INGRESS, EGRESS, &[pb]);
            h.set_learns(a, true);
            h.set_learns(b, true);
            h.learn_at(a, x, future(), LEARNED_443);
            assert_eq!(h.sends_at(a, &syn(pa, x, 443)), ALLOW, "the learner, {x}");
            assert_eq!(h.sends_at(b, &syn(pb, x, 443)), DROP, "another pod, {x}");
        }
    });
}

/// The entry is the pod's whole egress verdict for its host: a port set
/// that allows nothing, or denies everything (a tier's Deny above the
/// name), denies a host the table allows.
#[test]
#[ignore = "needs root"]
fn a_live_entry_overrides_the_table_both_ways() {
    require_root();
    for f in FAMILIES {
        for set in [NOTHING, DENY_ALL_PORTS] {
            let mut h = learning_pod();
            assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 443)), ALLOW);
            h.learn_at(LO, f.allowed, future(), set);
            assert_eq!(
                h.pod_sends(&tcp_flags(f.pod, 40001, f.allowed, 443, SYN)),
                DROP,
                "{} under port set {set}",
                f.allowed
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn without_an_entry_the_table_decides_as_before() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.learn_at(LO, f.x, future(), LEARNED_443);
        assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 443)), ALLOW);
        assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 80)), DROP);
        assert_eq!(h.pod_sends(&syn(f.pod, f.other, 443)), DROP);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 1);
        assert_eq!(h.stat(STAT_ALLOWED_LEARNED), 0);
    }
}

/// A flow the overlay allowed keeps working once its entry has expired,
/// each time its epoch moves (its forward packets and its replies are
/// re-judged, and the entry decides whatever its expiry); once the entry
/// is deleted, it stops.
#[test]
#[ignore = "needs root"]
fn an_established_flow_outlives_its_entry_s_expiry_not_its_deletion() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.learn_at(LO, f.x, future(), LEARNED_443);
        let own = ct(f.pod, 40000, f.x, 443, PROTO_TCP, HOOK_FROM_POD);
        let forward = tcp(f.pod, 40000, f.x, 443);
        let reply = tcp(f.x, 443, f.pod, 40000);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), ALLOW);
        assert_eq!(h.pod_receives(&reply), ALLOW);
        assert_eq!(h.ct_get(&own).unwrap().epoch, 0);

        h.learn_at(LO, f.x, past(), LEARNED_443);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), DROP, "no new flow");

        // The epoch moves; the forward packet is re-judged first.
        h.switch(INGRESS, EGRESS, 0, 1);
        assert_eq!(h.pod_sends(&forward), ALLOW, "{}: forward re-judged", f.x);
        assert_eq!(h.ct_get(&own).unwrap().epoch, 1);
        // Again; now the reply is.
        h.switch(INGRESS, EGRESS, 0, 2);
        assert_eq!(h.pod_receives(&reply), ALLOW, "{}: reply re-judged", f.x);
        assert_eq!(h.ct_get(&own).unwrap().epoch, 2);

        // Deleted: the table decides, and denies.
        h.forget_at(LO, f.x);
        h.switch(INGRESS, EGRESS, 0, 3);
        assert_eq!(h.pod_receives(&reply), DROP, "{}: reply", f.x);
        assert!(!h.ct_has(&own), "the flow is forgotten");
        assert_eq!(h.pod_sends(&forward), DROP, "{}: forward", f.x);

        // The forward path alone, from the top: deleted before the
        // forward packet is re-judged.
        h.learn_at(LO, f.x, future(), LEARNED_443);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), ALLOW);
        h.forget_at(LO, f.x);
        h.switch(INGRESS, EGRESS, 0, 4);
        assert_eq!(h.pod_sends(&forward), DROP, "{}: forward, deleted", f.x);
        assert!(!h.ct_has(&own));
    }
}

/// Names are egress-only: the pod's ingress never consults its entries,
/// even for a peer it learned.
#[test]
#[ignore = "needs root"]
fn the_ingress_hook_ignores_the_overlay() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.learn_at(LO, f.x, future(), LEARNED_443);
        assert_eq!(h.pod_receives(&syn(f.x, f.pod, 443)), DROP, "{}", f.x);
        assert_eq!(h.stat_dir(HOOK_TO_POD, STAT_DENIED), 1);
        assert_eq!(h.stat(STAT_ALLOWED_LEARNED), 0);
    }
}

/// An egress that is not isolated never looks: everything passes, counted
/// as such, even to a peer whose entry allows nothing.
#[test]
#[ignore = "needs root"]
fn an_open_egress_ignores_the_overlay() {
    require_root();
    for f in FAMILIES {
        let mut h = Harness::new();
        tables(&mut h);
        h.endpoint(INGRESS, 0);
        h.set_learns(LO, true);
        h.learn_at(LO, f.x, future(), NOTHING);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), ALLOW);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_UNISOLATED), 1);
    }
}

/// The index is a hint (a reused element may yield any slot): a slot that
/// holds another pod's entry for the same peer, or a retired one (ifindex
/// cleared, its index entry still read), is no entry, and the table
/// decides, whichever way it decides.
#[test]
#[ignore = "needs root"]
fn a_slot_of_another_pod_or_retired_is_no_entry() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        // Another pod's entries for X (allowing it) and for the allowed
        // host (allowing nothing), named by the learning pod's index.
        h.learn_at(OTHER_POD, f.x, future(), LEARNED_443);
        h.learn_at(OTHER_POD, f.allowed, future(), NOTHING);
        let x_slot = h.learned_slot_of(OTHER_POD, f.x).unwrap();
        let allowed_slot = h.learned_slot_of(OTHER_POD, f.allowed).unwrap();
        h.set_learned_hint(LO, f.x, x_slot);
        h.set_learned_hint(LO, f.allowed, allowed_slot);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), DROP, "{}", f.x);
        assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 443)), ALLOW);

        // The learning pod's own entry, retired under a packet that still
        // reads its index entry.
        h.learn_at(LO, f.other, future(), LEARNED_443);
        assert_eq!(h.pod_sends(&syn(f.pod, f.other, 443)), ALLOW, "live");
        let at = h.learned_slot_of(LO, f.other).unwrap();
        let mut slot = h.learned().get(&at, 0).unwrap();
        slot.ifindex = 0;
        h.learned().set(at, slot, 0).unwrap();
        assert_eq!(
            h.pod_sends(&tcp_flags(f.pod, 40001, f.other, 443, SYN)),
            DROP,
            "{}: retired",
            f.other
        );
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_LEARNED), 1);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 1);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_DENIED), 2);
    }
}

/// A slot of the pod's own, for another peer, is no entry either.
#[test]
#[ignore = "needs root"]
fn a_slot_of_another_peer_is_no_entry() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.learn_at(LO, f.other, future(), LEARNED_443);
        h.learn_at(LO, f.x, future(), NOTHING);
        let other = h.learned_slot_of(LO, f.other).unwrap();
        let x = h.learned_slot_of(LO, f.x).unwrap();
        // X's index names the entry that would allow it, the allowed
        // host's the one that would deny it.
        h.set_learned_hint(LO, f.x, other);
        h.set_learned_hint(LO, f.allowed, x);
        assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), DROP, "{}", f.x);
        assert_eq!(h.pod_sends(&syn(f.pod, f.allowed, 443)), ALLOW);
        assert_eq!(h.pod_sends(&syn(f.pod, f.other, 443)), ALLOW, "its own");
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_LEARNED), 1);
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 1);
    }
}

/// A slot number past the array's end is no entry: the program finds no
/// slot, and the table decides.
#[test]
#[ignore = "needs root"]
fn a_slot_number_out_of_range_is_no_entry() {
    require_root();
    for f in FAMILIES {
        for at in [MAX_LEARNED_ENTRIES, MAX_LEARNED_ENTRIES + 1, u32::MAX] {
            let mut h = learning_pod();
            h.set_learned_hint(LO, f.x, at);
            h.set_learned_hint(LO, f.allowed, at);
            assert_eq!(h.pod_sends(&syn(f.pod, f.x, 443)), DROP, "{} at {at}", f.x);
            assert_eq!(
                h.pod_sends(&syn(f.pod, f.allowed, 443)),
                ALLOW,
                "{} at {at}",
                f.allowed
            );
            assert_eq!(h.stat(STAT_ALLOWED_LEARNED), 0);
        }
    }
}

/// A live slot's port set rewritten in place (same slot, same index
/// entry) judges the next new flow.
#[test]
#[ignore = "needs root"]
fn a_port_set_rewritten_in_place_judges_the_next_new_flow() {
    require_root();
    for f in FAMILIES {
        let mut h = learning_pod();
        h.learn_at(LO, f.x, future(), LEARNED_443);
        let at = h.learned_slot_of(LO, f.x).unwrap();
        assert_eq!(h.pod_sends(&tcp_flags(f.pod, 40000, f.x, 443, SYN)), ALLOW);
        assert_eq!(h.pod_sends(&tcp_flags(f.pod, 40000, f.x, 80, SYN)), DROP);

        h.learn_at(LO, f.x, future(), LEARNED_80);
        assert_eq!(h.learned_slot_of(LO, f.x), Some(at), "rewritten in place");
        assert_eq!(h.learned().get(&at, 0).unwrap().portset_id, LEARNED_80);
        assert_eq!(
            h.pod_sends(&tcp_flags(f.pod, 40001, f.x, 443, SYN)),
            DROP,
            "{}:443",
            f.x
        );
        assert_eq!(
            h.pod_sends(&tcp_flags(f.pod, 40001, f.x, 80, SYN)),
            ALLOW,
            "{}:80",
            f.x
        );
        assert_eq!(h.stat_dir(HOOK_FROM_POD, STAT_ALLOWED_LEARNED), 2);
    }
}
