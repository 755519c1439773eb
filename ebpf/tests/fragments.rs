//! IP fragments and IPv6 extension headers through the real programs
//! (BPF_PROG_TEST_RUN), forged as an attacker would forge them: a later
//! fragment claiming another flow, overlapping offsets, a first fragment
//! too short for its L4 header, long chains of extension headers, later
//! fragments without a first. The stance (c/lib/fragments.h): no fragment ever
//! opens a port policy denies, and every fragment of an allowed datagram
//! passes. Needs root and bpffs, as tests/verdict.rs.

use palisade_ebpf::testkit::frames::*;
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;
use palisade_test_support::require_root;

mod common;
use common::with_two_pods;

const PEER4: &str = "10.0.1.5";
const PEER6: &str = "fd00:1::5";
/// The pod's egress: UDP 53 and TCP 80 to the peers' networks.
const EGRESS: u32 = 1;
/// The pod's ingress: isolated, nothing allowed (replies ride on conntrack).
const INGRESS: u32 = 2;

/// The pod isolated both ways: its egress allows [`EGRESS`]'s ports, its
/// ingress nothing.
fn isolated() -> Harness {
    let mut h = Harness::new();
    h.endpoint(INGRESS, EGRESS);
    h.cidr(EGRESS, "10.0.1.0/24", 1);
    h.cidr(EGRESS, "fd00:1::/64", 1);
    h.ports(1, PROTO_UDP, 53, 53);
    h.ports(1, PROTO_TCP, 80, 80);
    h
}

/// Both families: (pod address, peer address).
const FAMILIES: [(&str, &str); 2] = [(POD4, PEER4), (POD6, PEER6)];

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

/// A TCP segment (ACK) of `len` bytes, its 20-byte header included.
fn tcp_segment(sport: u16, dport: u16, len: usize) -> Vec<u8> {
    let mut s = tcp_hdr(sport, dport);
    s.resize(len, 0xcd);
    s
}

/// `datagram` cut at `cuts` (offsets, multiples of 8) into the fragments of
/// datagram `id` from `src` to `dst`, in order.
fn fragments(
    src: &str,
    dst: &str,
    proto: u8,
    id: u32,
    datagram: &[u8],
    cuts: &[usize],
) -> Vec<Vec<u8>> {
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(datagram.len());
    bounds
        .windows(2)
        .map(|w| {
            let last = w[1] == datagram.len();
            fragment(
                src,
                dst,
                proto,
                id,
                w[0] as u16,
                !last,
                &datagram[w[0]..w[1]],
            )
        })
        .collect()
}

/// Counters of `STAT_*` kinds, both directions.
fn counted(h: &Harness, kinds: &[u32]) -> Vec<u64> {
    kinds.iter().map(|&k| h.stat(k)).collect()
}

#[test]
#[ignore = "needs root"]
fn every_fragment_of_an_allowed_datagram_passes() {
    require_root();
    let mut h = isolated();
    for (me, peer) in FAMILIES {
        let frags = fragments(
            me,
            peer,
            PROTO_UDP,
            7,
            &udp_datagram(1000, 53, 3000),
            &[1480, 2960],
        );
        for (i, f) in frags.iter().enumerate() {
            assert_eq!(h.pod_sends(f), ALLOW, "{me} -> {peer}: fragment {i}");
        }
    }
    assert_eq!(
        counted(&h, &[STAT_ALLOWED_POLICY, STAT_ALLOWED_FRAGMENT]),
        [2, 4],
        "first fragments by policy, the later ones by their record"
    );
    // Conntrack knows the datagram's flow by its real ports, and nothing
    // else: no entry of port 0.
    for (me, peer) in FAMILIES {
        assert!(h.ct_has(&ct(me, 1000, peer, 53, PROTO_UDP, HOOK_FROM_POD)));
    }
    assert_eq!(h.ct_len(), 2, "{:?}", h.ct_keys());
}

#[test]
#[ignore = "needs root"]
fn no_fragment_of_a_denied_port_passes() {
    require_root();
    let mut h = isolated();
    for (me, peer) in FAMILIES {
        let frags = fragments(
            me,
            peer,
            PROTO_UDP,
            7,
            &udp_datagram(1000, 54, 3000),
            &[1480, 2960],
        );
        for (i, f) in frags.iter().enumerate() {
            assert_eq!(h.pod_sends(f), DROP, "{me} -> {peer}: fragment {i}");
        }
    }
    assert_eq!(
        counted(
            &h,
            &[STAT_DENIED, STAT_DENIED_FRAGMENT, STAT_ALLOWED_FRAGMENT]
        ),
        [2, 4, 0]
    );
    assert_eq!(h.ct_len(), 0, "{:?}", h.ct_keys());
}

#[test]
#[ignore = "needs root"]
fn a_later_fragment_without_its_first_is_dropped_even_where_nothing_is_isolated() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    for (me, peer) in FAMILIES {
        let frags = fragments(
            me,
            peer,
            PROTO_UDP,
            7,
            &udp_datagram(1000, 53, 3000),
            &[1480, 2960],
        );
        // Later fragments before their first (the first lost, or forged
        // ones alone) have nothing to be judged by.
        assert_eq!(h.pod_sends(&frags[1]), DROP, "{me}: before its first");
        assert_eq!(h.pod_receives(&frags[2]), DROP, "{me}: towards the pod");
        assert_eq!(h.pod_sends(&frags[0]), ALLOW, "{me}: the first");
        assert_eq!(h.pod_sends(&frags[2]), ALLOW, "{me}: after its first");
    }
    assert_eq!(h.stat(STAT_DENIED_FRAGMENT), 4);
}

/// A later fragment is bound to its datagram's name (addresses, id, and
/// IPv4's protocol) and to the hook that judged its first fragment: one
/// differing in any of them finds no record.
#[test]
#[ignore = "needs root"]
fn a_later_fragment_claiming_another_flow_is_dropped() {
    require_root();
    let h = isolated();
    for (me, peer) in FAMILIES {
        let other = if me == POD4 { "10.0.1.6" } else { "fd00:1::6" };
        let first = fragment(me, peer, PROTO_UDP, 7, 0, true, &udp_datagram(1000, 53, 16));
        assert_eq!(h.pod_sends(&first), ALLOW);
        let rest = udp_datagram(1000, 53, 32)[16..].to_vec();
        let mut claims = vec![
            (
                "another id",
                fragment(me, peer, PROTO_UDP, 8, 16, false, &rest),
            ),
            (
                "another peer",
                fragment(me, other, PROTO_UDP, 7, 16, false, &rest),
            ),
        ];
        if me == POD4 {
            // (An IPv6 receiver reassembles without the next header, so
            // there a later fragment naming TCP is still part of it.)
            claims.push((
                "another protocol",
                fragment(me, peer, PROTO_TCP, 7, 16, false, &rest),
            ));
        }
        for (what, f) in &claims {
            assert_eq!(h.pod_sends(f), DROP, "{me}: {what}");
        }
        // The other hook of the pod: what comes back is no part of it.
        let back = fragment(peer, me, PROTO_UDP, 7, 16, false, &rest);
        assert_eq!(h.pod_receives(&back), DROP, "{me}: the other hook");
        let genuine = fragment(me, peer, PROTO_UDP, 7, 16, false, &rest);
        assert_eq!(h.pod_sends(&genuine), ALLOW, "{me}: the datagram's own");
    }
    assert_eq!(h.stat(STAT_DENIED_FRAGMENT), 7);
    // A second first fragment under the same name is judged by its own
    // ports: it cannot borrow the first one's verdict, and it leaves its
    // own for what follows.
    for (me, peer) in FAMILIES {
        let denied = fragment(me, peer, PROTO_UDP, 7, 0, true, &udp_datagram(1000, 22, 16));
        assert_eq!(
            h.pod_sends(&denied),
            DROP,
            "{me}: first fragment to a denied port"
        );
        let rest = fragment(me, peer, PROTO_UDP, 7, 16, false, &[0; 16]);
        assert_eq!(
            h.pod_sends(&rest),
            DROP,
            "{me}: after a denied first fragment"
        );
    }
}

/// Two pods: what one pod's hook allowed vouches for nothing on another's.
#[test]
#[ignore = "needs root"]
fn one_hooks_record_does_not_pass_another_pods_fragments() {
    require_root();
    with_two_pods(|a, b| {
        let mut h = Harness::new();
        h.endpoint_at(a, 0, 0, &["10.0.0.10"]);
        // b accepts every UDP port from a, and no TCP.
        h.endpoint_at(b, 5, 0, &["10.0.0.11"]);
        h.cidr(5, "10.0.0.10/32", 5);
        h.port_keys(PortKey::lpm(5, PROTO_UDP, 0, 0));
        let datagram = |proto, id| {
            let body = match proto {
                PROTO_UDP => udp_datagram(1000, 53, 3000),
                _ => tcp_segment(40000, 80, 3000),
            };
            fragments("10.0.0.10", "10.0.0.11", proto, id, &body, &[1480])
        };
        let udp = datagram(PROTO_UDP, 3);
        assert_eq!(h.sends_at(a, &udp[0]), ALLOW, "a may send it");
        assert_eq!(h.sends_at(a, &udp[1]), ALLOW);
        assert_eq!(
            h.receives_at(b, &udp[1]),
            DROP,
            "b never saw its first fragment, whatever b allows"
        );
        let tcp = datagram(PROTO_TCP, 4);
        assert_eq!(h.sends_at(a, &tcp[0]), ALLOW);
        assert_eq!(h.sends_at(a, &tcp[1]), ALLOW);
        assert_eq!(h.receives_at(b, &tcp[0]), DROP, "b's ingress denies TCP");
        assert_eq!(h.receives_at(b, &tcp[1]), DROP, "and so the rest of it");
        assert_eq!(h.stat_dir(HOOK_TO_POD, STAT_DENIED_FRAGMENT), 2);
    });
}

#[test]
#[ignore = "needs root"]
fn fragments_overlapping_the_l4_header_are_dropped() {
    require_root();
    let h = isolated();
    for (me, peer) in FAMILIES {
        // TCP: a first fragment of 24 bytes holds the 20-byte header; one
        // starting at 8 or 16 would rewrite its flags or checksum, as RFC
        // 3128's attack does. The whole datagram is then dropped, as an
        // RFC 5722 receiver drops it.
        let seg = tcp_segment(40000, 80, 48);
        let first = fragment(me, peer, PROTO_TCP, 11, 0, true, &seg[..24]);
        assert_eq!(h.pod_sends(&first), ALLOW, "{me}");
        for at in [8usize, 16] {
            let overlap = fragment(me, peer, PROTO_TCP, 11, at as u16, true, &seg[at..at + 8]);
            assert_eq!(h.pod_sends(&overlap), DROP, "{me}: TCP fragment at {at}");
        }
        let rest = fragment(me, peer, PROTO_TCP, 11, 24, false, &seg[24..]);
        assert_eq!(
            h.pod_sends(&rest),
            DROP,
            "{me}: the rest of an overlapped datagram"
        );
        // A datagram without overlap passes whole.
        let first = fragment(me, peer, PROTO_TCP, 12, 0, true, &seg[..24]);
        let rest = fragment(me, peer, PROTO_TCP, 12, 24, false, &seg[24..]);
        assert_eq!(h.pod_sends(&first), ALLOW, "{me}");
        assert_eq!(h.pod_sends(&rest), ALLOW, "{me}");
        // UDP's header is 8 bytes: the next fragment may start right after.
        let d = udp_datagram(1000, 53, 24);
        let first = fragment(me, peer, PROTO_UDP, 13, 0, true, &d[..8]);
        let rest = fragment(me, peer, PROTO_UDP, 13, 8, false, &d[8..]);
        assert_eq!(h.pod_sends(&first), ALLOW, "{me}");
        assert_eq!(h.pod_sends(&rest), ALLOW, "{me}");
    }
    assert_eq!(h.stat(STAT_DENIED_FRAGMENT), 6);
}

/// IPv6 may put extension headers inside the fragmentable part: the L4
/// header then starts after them, and so does the range no later fragment
/// may touch.
#[test]
#[ignore = "needs root"]
fn ipv6_headers_inside_the_fragmentable_part_are_protected_too() {
    require_root();
    let h = isolated();
    let d = udp_datagram(1000, 53, 32);
    let first_of = |id: u32, opts: bool, part: &[u8]| {
        let mut exts = vec![Ext::Fragment {
            id,
            offset: 0,
            more: true,
        }];
        if opts {
            exts.push(Ext::DestOpts(8));
        }
        ipv6_with_exts(POD6, PEER6, &exts, PROTO_UDP, part)
    };
    // Fragment header, destination options (bytes 0-7 of the fragmentable
    // part), UDP header (8-15).
    assert_eq!(h.pod_sends(&first_of(21, true, &d[..16])), ALLOW);
    let later = |id: u32, at: u16, part: &[u8]| ipv6_fragment(POD6, PEER6, 60, id, at, false, part);
    assert_eq!(
        h.pod_sends(&later(21, 16, &d[16..])),
        ALLOW,
        "after the UDP header"
    );
    assert_eq!(
        h.pod_sends(&later(21, 8, &d[..8])),
        DROP,
        "over the UDP header"
    );
    // Of two first fragments laid out differently, the later one does not
    // narrow what is protected (a receiver might keep either).
    assert_eq!(h.pod_sends(&first_of(22, true, &d[..16])), ALLOW);
    assert_eq!(h.pod_sends(&first_of(22, false, &d[..8])), ALLOW);
    assert_eq!(h.pod_sends(&later(22, 16, &d[16..])), ALLOW);
    assert_eq!(h.pod_sends(&later(22, 8, &d[..8])), DROP);
    assert_eq!(h.stat(STAT_DENIED_FRAGMENT), 2);
}

/// RFC 1858's tiny fragment attack: a first fragment too short for the L4
/// header leaves part of it (TCP's flags) to a later fragment. Dropped
/// whatever the policy, and its later fragments with it.
#[test]
#[ignore = "needs root"]
fn a_first_fragment_too_short_for_its_l4_header_is_dropped() {
    require_root();
    let mut h = Harness::new();
    h.endpoint(0, 0);
    for (me, peer) in FAMILIES {
        let seg = tcp_segment(40000, 80, 40);
        for len in [8usize, 16] {
            let tiny = fragment(me, peer, PROTO_TCP, 31, 0, true, &seg[..len]);
            assert_eq!(
                h.pod_sends(&tiny),
                DROP,
                "{me}: TCP first fragment of {len} bytes"
            );
        }
        let rest = fragment(me, peer, PROTO_TCP, 31, 16, false, &seg[16..]);
        assert_eq!(
            h.pod_sends(&rest),
            DROP,
            "{me}: the rest of a tiny first fragment"
        );
        // UDP's whole header fits in 8 bytes.
        let d = udp_datagram(1000, 53, 16);
        let first = fragment(me, peer, PROTO_UDP, 32, 0, true, &d[..8]);
        assert_eq!(
            h.pod_sends(&first),
            ALLOW,
            "{me}: UDP first fragment of 8 bytes"
        );
    }
    // The IP header decides where a fragment ends: bytes past it are not
    // the datagram's, whatever the frame holds.
    let mut short = ipv4_fragment(
        POD4,
        PEER4,
        PROTO_UDP,
        33,
        0,
        true,
        &udp_datagram(1, 53, 16),
    );
    short[16..18].copy_from_slice(&(20u16 + 4).to_be_bytes());
    assert_eq!(
        h.pod_sends(&short),
        DROP,
        "IPv4 total length short of the UDP header"
    );
    let mut short6 = ipv6_fragment(
        POD6,
        PEER6,
        PROTO_UDP,
        33,
        0,
        true,
        &udp_datagram(1, 53, 16),
    );
    short6[18..20].copy_from_slice(&(8u16 + 4).to_be_bytes());
    assert_eq!(
        h.pod_sends(&short6),
        DROP,
        "IPv6 payload length short of it"
    );
    assert_eq!(h.stat(STAT_DENIED_FRAGMENT), 2 * 3 + 2);
}

#[test]
#[ignore = "needs root"]
fn ipv6_extension_headers_are_walked_to_the_ports() {
    require_root();
    let mut h = isolated();
    let hbh_udp = |dport| {
        ipv6_with_exts(
            POD6,
            PEER6,
            &[Ext::HopByHop(8)],
            PROTO_UDP,
            &udp_hdr(1000, dport),
        )
    };
    assert_eq!(
        h.pod_sends(&hbh_udp(53)),
        ALLOW,
        "hop-by-hop, then an allowed port"
    );
    assert_eq!(
        h.pod_sends(&hbh_udp(54)),
        DROP,
        "hop-by-hop, then a denied port"
    );
    let chain = [
        Ext::DestOpts(16),
        Ext::Routing(24),
        Ext::Ah(16),
        Ext::DestOpts(8),
    ];
    let tcp80 = ipv6_with_exts(POD6, PEER6, &chain, PROTO_TCP, &tcp_hdr(40000, 80));
    assert_eq!(
        h.pod_sends(&tcp80),
        ALLOW,
        "options, routing, AH, options, then TCP 80"
    );
    // Judged by the real ports, so conntrack knows the flows and their
    // replies come back.
    assert!(h.ct_has(&ct(POD6, 1000, PEER6, 53, PROTO_UDP, HOOK_FROM_POD)));
    assert!(h.ct_has(&ct(POD6, 40000, PEER6, 80, PROTO_TCP, HOOK_FROM_POD)));
    let reply = ipv6_with_exts(
        PEER6,
        POD6,
        &[Ext::DestOpts(8)],
        PROTO_UDP,
        &udp_hdr(53, 1000),
    );
    assert_eq!(h.pod_receives(&reply), ALLOW);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);
    // ESP ends the walk: a protocol without ports, which port rules deny.
    let esp = ipv6_with_exts(POD6, PEER6, &[Ext::HopByHop(8)], 50, &[0; 16]);
    assert_eq!(h.pod_sends(&esp), DROP);
    assert_eq!(counted(&h, &[STAT_ALLOWED_POLICY, STAT_DENIED]), [2, 2]);
}

/// The walk's bound (7): the 8th extension header in a row fails closed,
/// whatever the policy, rather than being judged without ports.
#[test]
#[ignore = "needs root"]
fn eight_chained_extension_headers_fail_closed() {
    require_root();
    let seven = [
        Ext::HopByHop(8),
        Ext::DestOpts(8),
        Ext::Routing(8),
        Ext::DestOpts(8),
        Ext::Ah(16),
        Ext::DestOpts(16),
        Ext::DestOpts(8),
    ];
    let mut eight = seven.to_vec();
    eight.push(Ext::DestOpts(8));
    let h = isolated();
    let udp53 = |exts: &[Ext]| ipv6_with_exts(POD6, PEER6, exts, PROTO_UDP, &udp_hdr(1000, 53));
    assert_eq!(h.pod_sends(&udp53(&seven)), ALLOW, "7 headers: walked");
    assert_eq!(h.pod_sends(&udp53(&eight)), DROP, "8 headers");
    let mut open = Harness::new();
    open.endpoint(0, 0);
    assert_eq!(
        open.pod_sends(&udp53(&eight)),
        DROP,
        "8 headers, nothing isolated"
    );
    assert_eq!(
        open.pod_receives(&ipv6_with_exts(
            PEER6,
            POD6,
            &eight,
            PROTO_UDP,
            &udp_hdr(53, 1000)
        )),
        DROP,
        "8 headers towards the pod"
    );
    assert_eq!(
        h.stat(STAT_DENIED_EXT_HEADERS) + open.stat(STAT_DENIED_EXT_HEADERS),
        3
    );
    // A fragment header counts as one of them.
    let mut frag_chain = seven[..3].to_vec();
    frag_chain.push(Ext::Fragment {
        id: 5,
        offset: 0,
        more: true,
    });
    frag_chain.extend_from_slice(&seven[3..6]);
    assert_eq!(frag_chain.len(), 7);
    assert_eq!(
        h.pod_sends(&udp53(&frag_chain)),
        ALLOW,
        "7 with a first fragment"
    );
    let later = ipv6_with_exts(
        POD6,
        PEER6,
        &[
            Ext::HopByHop(8),
            Ext::Fragment {
                id: 5,
                offset: 72,
                more: false,
            },
        ],
        60,
        &[0; 8],
    );
    assert_eq!(h.pod_sends(&later), ALLOW, "its later fragment");
}

/// A large answer to a query comes back in fragments: they pass as the
/// reply they are part of, and conntrack stays keyed by the real ports.
#[test]
#[ignore = "needs root"]
fn fragments_of_a_reply_pass_as_the_reply_does() {
    require_root();
    let mut h = isolated();
    for (me, peer) in FAMILIES {
        assert_eq!(
            h.pod_sends(&udp(me, 5000, peer, 53)),
            ALLOW,
            "{me}: the query"
        );
        let answer = fragments(
            peer,
            me,
            PROTO_UDP,
            41,
            &udp_datagram(53, 5000, 3000),
            &[1480, 2960],
        );
        for (i, f) in answer.iter().enumerate() {
            assert_eq!(h.pod_receives(f), ALLOW, "{me}: answer fragment {i}");
        }
        // From a port the pod never asked.
        let stray = fragments(
            peer,
            me,
            PROTO_UDP,
            42,
            &udp_datagram(54, 5000, 3000),
            &[1480, 2960],
        );
        for (i, f) in stray.iter().enumerate() {
            assert_eq!(h.pod_receives(f), DROP, "{me}: stray fragment {i}");
        }
    }
    assert_eq!(
        counted(
            &h,
            &[
                STAT_ALLOWED_REPLY,
                STAT_ALLOWED_FRAGMENT,
                STAT_DENIED,
                STAT_DENIED_FRAGMENT
            ]
        ),
        [2, 4, 2, 4]
    );
    for (me, peer) in FAMILIES {
        assert!(h.ct_has(&ct(me, 5000, peer, 53, PROTO_UDP, HOOK_FROM_POD)));
    }
    assert_eq!(h.ct_len(), 2, "replies make no entries: {:?}", h.ct_keys());
}

#[test]
#[ignore = "needs root"]
fn an_id_used_again_takes_the_verdict_of_its_newest_first_fragment() {
    require_root();
    let mut h = isolated();
    for (me, peer) in FAMILIES {
        for (dport, verdict) in [(53, ALLOW), (54, DROP), (53, ALLOW)] {
            let frags = fragments(
                me,
                peer,
                PROTO_UDP,
                9,
                &udp_datagram(1000, dport, 2000),
                &[1480],
            );
            for (i, f) in frags.iter().enumerate() {
                assert_eq!(h.pod_sends(f), verdict, "{me}: port {dport}, fragment {i}");
            }
        }
    }
    // Each hook keeps one record per datagram name.
    let records = h.frag_values();
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records
        .iter()
        .all(|v| v.allowed == 1 && v.dport == 53u16.to_be()));
}

/// The spoof check comes first: a fragment from an address the pod does not
/// own neither reads nor writes a record.
#[test]
#[ignore = "needs root"]
fn fragments_from_spoofed_sources_are_dropped_as_spoofed() {
    require_root();
    let mut h = isolated();
    let d = udp_datagram(1000, 53, 2000);
    let frags = fragments(POD4, PEER4, PROTO_UDP, 51, &d, &[1480]);
    let spoofed = fragments("10.0.0.99", PEER4, PROTO_UDP, 51, &d, &[1480]);
    assert_eq!(h.pod_sends(&frags[0]), ALLOW);
    assert_eq!(
        h.pod_sends(&spoofed[1]),
        DROP,
        "a later one under a stolen id"
    );
    assert_eq!(h.pod_sends(&spoofed[0]), DROP, "a first one");
    assert_eq!(h.pod_sends(&spoofed[1]), DROP, "and its later one");
    assert_eq!(
        h.pod_sends(&frags[1]),
        ALLOW,
        "the genuine datagram is untouched"
    );
    assert_eq!(
        counted(&h, &[STAT_DENIED_SPOOF, STAT_DENIED_FRAGMENT]),
        [3, 0]
    );
    assert_eq!(h.frag_values().len(), 1);
}

/// A policy change between a datagram's fragments: the rest is judged
/// again, by the first fragment's ports, as the next packet of any flow is.
#[test]
#[ignore = "needs root"]
fn a_policy_change_judges_the_rest_of_a_datagram_again() {
    require_root();
    let mut h = isolated();
    // Policy 3: the same peers, TCP 80 only.
    h.cidr(3, "10.0.1.0/24", 3);
    h.cidr(3, "fd00:1::/64", 3);
    h.ports(3, PROTO_TCP, 80, 80);
    let mut epoch = 10;
    for (me, peer) in FAMILIES {
        let frags = fragments(
            me,
            peer,
            PROTO_UDP,
            61,
            &udp_datagram(1000, 53, 4000),
            &[1480, 2960],
        );
        assert_eq!(h.pod_sends(&frags[0]), ALLOW, "{me}");
        h.switch(INGRESS, 3, epoch, epoch);
        assert_eq!(
            h.pod_sends(&frags[1]),
            DROP,
            "{me}: UDP 53 no longer allowed"
        );
        h.switch(INGRESS, EGRESS, epoch + 1, epoch + 1);
        assert_eq!(h.pod_sends(&frags[2]), ALLOW, "{me}: allowed again");
        epoch += 2;
    }
    assert_eq!(counted(&h, &[STAT_DENIED, STAT_ALLOWED_FRAGMENT]), [2, 0]);
}

/// Neighbour discovery passes before the spoof check only as it is sent:
/// right after the IPv6 header. Behind an extension header (MLD reports
/// from `::` carry a hop-by-hop router alert) ICMPv6 is judged as any
/// protocol, as it was before the walk: spoof check, then policy.
#[test]
#[ignore = "needs root"]
fn neighbour_discovery_behind_an_extension_header_is_judged_as_icmpv6() {
    require_root();
    let h = isolated();
    assert_eq!(
        h.pod_sends(&icmpv6(POD6, "fe80::1", 135, 255)),
        ALLOW,
        "bare"
    );
    let behind_hbh = |src: &str, dst: &str, icmp_type: u8| {
        let mut l4 = vec![icmp_type, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&[0; 16]);
        let mut f = ipv6_with_exts(src, dst, &[Ext::HopByHop(8)], PROTO_ICMPV6, &l4);
        f[14 + 7] = 255; // hop limit
        f
    };
    assert_eq!(
        h.pod_sends(&behind_hbh("::", "ff02::16", 143)),
        DROP,
        "MLD report from ::"
    );
    assert_eq!(h.stat(STAT_DENIED_SPOOF), 1);
    assert_eq!(
        h.pod_sends(&behind_hbh(POD6, "fe80::1", 135)),
        DROP,
        "NS behind hop-by-hop"
    );
    assert_eq!(
        h.pod_receives(&behind_hbh("fe80::1", POD6, 130)),
        DROP,
        "MLD query"
    );
    assert_eq!(h.stat(STAT_DENIED), 2);
    assert_eq!(h.stat(STAT_ALLOWED_NDP), 1);
}

/// The build that reads every header by copy (the path of headers in paged
/// data) judges fragments and extension headers as the in-place build does.
#[test]
#[ignore = "needs root"]
fn headers_read_by_copy_judge_fragments_alike() {
    require_root();
    let seg = tcp_segment(40000, 80, 48);
    let mut frames: Vec<(bool, Vec<u8>)> = Vec::new();
    for (me, peer) in FAMILIES {
        let out = fragments(
            me,
            peer,
            PROTO_UDP,
            7,
            &udp_datagram(1000, 53, 3000),
            &[1480, 2960],
        );
        let denied = fragments(
            me,
            peer,
            PROTO_UDP,
            8,
            &udp_datagram(1000, 54, 2000),
            &[1480],
        );
        frames.extend(out.into_iter().chain(denied).map(|f| (true, f)));
        frames.push((true, fragment(me, peer, PROTO_TCP, 9, 0, true, &seg[..16])));
        frames.push((true, fragment(me, peer, PROTO_TCP, 10, 0, true, &seg[..24])));
        frames.push((
            true,
            fragment(me, peer, PROTO_TCP, 10, 8, true, &seg[8..16]),
        ));
        frames.push((
            true,
            fragment(me, peer, PROTO_TCP, 10, 24, false, &seg[24..]),
        ));
        frames.push((true, udp(me, 5000, peer, 53)));
        let answer = fragments(
            peer,
            me,
            PROTO_UDP,
            11,
            &udp_datagram(53, 5000, 2000),
            &[1480],
        );
        frames.extend(answer.into_iter().map(|f| (false, f)));
    }
    let chain = |n: usize| vec![Ext::DestOpts(8); n];
    for n in [1, 7, 8] {
        frames.push((
            true,
            ipv6_with_exts(POD6, PEER6, &chain(n), PROTO_UDP, &udp_hdr(1000, 53)),
        ));
    }
    let judge = |object: &[u8]| {
        let mut h = Harness::with_object(object);
        h.endpoint(INGRESS, EGRESS);
        h.cidr(EGRESS, "10.0.1.0/24", 1);
        h.cidr(EGRESS, "fd00:1::/64", 1);
        h.ports(1, PROTO_UDP, 53, 53);
        h.ports(1, PROTO_TCP, 80, 80);
        let verdicts: Vec<u32> = frames
            .iter()
            .map(|(out, f)| {
                if *out {
                    h.pod_sends(f)
                } else {
                    h.pod_receives(f)
                }
            })
            .collect();
        (verdicts, h.stats(), h.frags4(), h.frags6())
    };
    let in_place = judge(OBJECT);
    assert_eq!(in_place, judge(testkit::HEADERS_BY_COPY_OBJECT));
    assert!(in_place.1[STAT_ALLOWED_FRAGMENT as usize] > 0);
    assert!(in_place.1[STAT_DENIED_FRAGMENT as usize] > 0);
    assert!(in_place.1[STAT_DENIED_EXT_HEADERS as usize] > 0);
}

/// A fragment finds its endpoint as every packet does (struct ep_slot):
/// through the index when its home slot is not trusted, with the same
/// answers; and once the index names a slot that holds another interface
/// (an element reused under the lookup), every fragment drops as
/// endpoint_unsure, later ones of a datagram whose first fragment passed
/// included: neither the other slot's policy nor its epochs decide.
#[test]
#[ignore = "needs root"]
fn fragments_are_judged_by_their_own_endpoint_slot() {
    require_root();
    let mut h = Harness::new().off_home();
    h.endpoint(INGRESS, EGRESS);
    h.cidr(EGRESS, "10.0.1.0/24", 1);
    h.cidr(EGRESS, "fd00:1::/64", 1);
    h.ports(1, PROTO_UDP, 53, 53);
    let mine = h.slot_of(LO);
    assert_ne!(mine, ep_home(LO), "found through the index only");
    let cuts = [1480, 2960];
    for (me, peer) in FAMILIES {
        let allowed = fragments(me, peer, PROTO_UDP, 7, &udp_datagram(1000, 53, 3000), &cuts);
        for (i, f) in allowed.iter().enumerate() {
            assert_eq!(h.pod_sends(f), ALLOW, "{me} -> {peer}: fragment {i}");
        }
        let denied = fragments(me, peer, PROTO_UDP, 8, &udp_datagram(1000, 54, 3000), &cuts);
        for (i, f) in denied.iter().enumerate() {
            assert_eq!(h.pod_sends(f), DROP, "{me} -> {peer}:54 fragment {i}");
        }
    }
    assert_eq!(
        counted(
            &h,
            &[
                STAT_ALLOWED_POLICY,
                STAT_ALLOWED_FRAGMENT,
                STAT_DENIED,
                STAT_DENIED_FRAGMENT
            ]
        ),
        [2, 4, 2, 4]
    );

    // First fragments pass; then the index names another interface's slot,
    // one open both ways under the same epochs.
    let mut pending = Vec::new();
    for (me, peer) in FAMILIES {
        let mut frags = fragments(me, peer, PROTO_UDP, 9, &udp_datagram(1000, 53, 3000), &cuts);
        assert_eq!(h.pod_sends(&frags[0]), ALLOW, "{me}: first fragment");
        pending.extend(frags.drain(1..));
    }
    let ours = h.ep_slots().get(&mine, 0).unwrap();
    let elsewhere = ep_home(LO + 1);
    let open = Direction {
        policy: 0,
        epoch: 0,
    };
    let other = EpSlot {
        ifindex: LO + 1,
        home: 0,
        ingress: open.word(),
        egress: open.word(),
        ..ours
    };
    h.ep_slots().set(elsewhere, other, 0).unwrap();
    h.ep_index().insert(LO, elsewhere, 0).unwrap();
    let before = counted(&h, &[STAT_ALLOWED_FRAGMENT, STAT_DENIED_FRAGMENT]);
    for (i, f) in pending.iter().enumerate() {
        assert_eq!(
            h.pod_sends(f),
            DROP,
            "later fragment {i} on a slot not ours"
        );
    }
    let denied = fragments(
        POD4,
        PEER4,
        PROTO_UDP,
        10,
        &udp_datagram(1000, 54, 3000),
        &cuts,
    );
    assert_eq!(h.pod_sends(&denied[0]), DROP, "the open slot never judges");
    assert_eq!(
        h.stat(STAT_DENIED_ENDPOINT_UNSURE),
        pending.len() as u64 + 1
    );
    assert_eq!(
        counted(&h, &[STAT_ALLOWED_FRAGMENT, STAT_DENIED_FRAGMENT]),
        before,
        "no record consulted"
    );

    // The index names our slot again: the datagram's record stands.
    h.ep_index().insert(LO, mine, 0).unwrap();
    for (i, f) in pending.iter().enumerate() {
        assert_eq!(h.pod_sends(f), ALLOW, "later fragment {i} on our slot");
    }
}
