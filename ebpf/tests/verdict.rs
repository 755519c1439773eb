//! Runs the real programs in the kernel with BPF_PROG_TEST_RUN on hand-built
//! frames, in the spirit of tools/testing/selftests/bpf. Needs root and a
//! bpffs at /sys/fs/bpf; every test loads its own copy of the object into a
//! fresh pin directory, so tests never see each other's maps.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use aya::maps::lpm_trie::Key;
use aya::maps::{HashMap, LpmTrie, PerCpuArray};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use aya::{Ebpf, EbpfLoader};
use palisade_ebpf::*;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

/// BPF_PROG_TEST_RUN resolves `__sk_buff.ifindex` to a device in the caller's
/// netns; loopback is 1 everywhere.
const LO: u32 = 1;

const POD4: &str = "10.0.0.2";
const POD6: &str = "fd00::2";

// ---------------------------------------------------------------- harness

/// A pin directory under /sys/fs/bpf that disappears with the test, even
/// when the test panics.
struct PinDir(PathBuf);

impl PinDir {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = Path::new("/sys/fs/bpf").join(format!(
            "palisade-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("create {} (root and bpffs needed): {e}", path.display()));
        PinDir(path)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Harness {
    ebpf: Ebpf,
    // Declared last so it is removed after the maps are closed.
    pins: PinDir,
}

impl Harness {
    fn new() -> Self {
        let pins = PinDir::new();
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pins.0)
            .load(OBJECT)
            .unwrap_or_else(|e| panic!("load object: {e:?}"));
        for name in [PROG_FROM_POD, PROG_TO_POD] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("program {name} missing"))
                .try_into()
                .unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e:?}"));
        }
        Harness { ebpf, pins }
    }

    /// Isolates the pod on `LO`; a policy id of 0 leaves that direction open.
    fn endpoint(&mut self, ingress_policy: u32, egress_policy: u32) {
        let mut map: HashMap<_, u32, Endpoint> =
            HashMap::try_from(self.ebpf.map_mut(MAP_ENDPOINTS).unwrap()).unwrap();
        let ep = Endpoint {
            ingress_policy,
            egress_policy,
        };
        map.insert(LO, ep, 0).unwrap();
    }

    fn policies(&mut self) -> LpmTrie<&mut aya::maps::MapData, PolicyKey, PolicyValue> {
        LpmTrie::try_from(self.ebpf.map_mut(MAP_POLICY).unwrap()).unwrap()
    }

    /// `peers` is a CIDR such as "10.0.1.0/24".
    fn cidr(&mut self, policy_id: u32, peers: &str, portset_id: u32) {
        let key = cidr_key(policy_id, peers);
        self.policies()
            .insert(&key, PolicyValue { portset_id }, 0)
            .unwrap();
    }

    fn remove_cidr(&mut self, policy_id: u32, peers: &str) {
        self.policies().remove(&cidr_key(policy_id, peers)).unwrap();
    }

    fn port_keys(&mut self, key: Key<PortKey>) {
        let mut map: LpmTrie<_, PortKey, PortValue> =
            LpmTrie::try_from(self.ebpf.map_mut(MAP_PORTS).unwrap()).unwrap();
        map.insert(&key, PortValue::ALLOW, 0).unwrap();
    }

    fn ports(&mut self, portset_id: u32, proto: u8, start: u16, end: u16) {
        for (port, bits) in port_prefixes(start, end) {
            self.port_keys(PortKey::lpm(portset_id, proto, port, bits));
        }
    }

    fn run(&self, prog: &str, frame: &[u8]) -> u32 {
        let prog: &SchedClassifier = self.ebpf.program(prog).unwrap().try_into().unwrap();
        let ctx = skb_ctx(LO);
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        };
        prog.test_run(opts)
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN: {e:?}"))
            .return_value
    }

    fn pod_sends(&self, frame: &[u8]) -> u32 {
        self.run(PROG_FROM_POD, frame)
    }

    fn pod_receives(&self, frame: &[u8]) -> u32 {
        self.run(PROG_TO_POD, frame)
    }

    fn stat(&self, index: u32) -> u64 {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map(MAP_STATS).unwrap()).unwrap();
        map.get(&index, 0).unwrap().iter().sum()
    }

    fn stats(&self) -> [u64; STAT_COUNT as usize] {
        std::array::from_fn(|i| self.stat(i as u32))
    }

    fn conntrack(&mut self) -> HashMap<&mut aya::maps::MapData, CtKey, CtValue> {
        HashMap::try_from(self.ebpf.map_mut(MAP_CONNTRACK).unwrap()).unwrap()
    }

    fn ct_has(&mut self, key: &CtKey) -> bool {
        self.conntrack().get(key, 0).is_ok()
    }

    fn ct_len(&mut self) -> usize {
        self.conntrack().keys().count()
    }
}

fn cidr_key(policy_id: u32, cidr: &str) -> Key<PolicyKey> {
    let (addr, len) = cidr.split_once('/').expect("CIDR");
    PolicyKey::lpm(policy_id, ip(addr), len.parse().unwrap())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A `struct __sk_buff` up to and including `ifindex` (offset 40); the
/// kernel treats a shorter ctx_in as zero-filled.
fn skb_ctx(ifindex: u32) -> [u8; 44] {
    let mut ctx = [0u8; 44];
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    ctx
}

// ----------------------------------------------------------------- frames

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_ARP: u16 = 0x0806;

fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ipv4_with_frag(src: &str, dst: &str, proto: u8, frag_off: u16, l4: &[u8]) -> Vec<u8> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (ip(src), ip(dst)) else {
        panic!("IPv4 addresses expected");
    };
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 1]); // id
    h.extend_from_slice(&frag_off.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let sum = checksum(&h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h.extend_from_slice(l4);
    eth(ETH_P_IP, &h)
}

fn ipv6_with_hops(src: &str, dst: &str, next: u8, hop_limit: u8, l4: &[u8]) -> Vec<u8> {
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (ip(src), ip(dst)) else {
        panic!("IPv6 addresses expected");
    };
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    h.extend_from_slice(&[next, hop_limit]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(l4);
    eth(ETH_P_IPV6, &h)
}

/// An IP packet of the family of `src`.
fn ip_packet(src: &str, dst: &str, proto: u8, l4: &[u8]) -> Vec<u8> {
    if ip(src).is_ipv4() {
        ipv4_with_frag(src, dst, proto, 0, l4)
    } else {
        ipv6_with_hops(src, dst, proto, 64, l4)
    }
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn tcp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(20);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]); // seq, ack
    h.extend_from_slice(&[0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]); // SYN
    h
}

fn udp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&[0, 0, b'p', b'i', b'n', b'g']);
    h
}

fn sctp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&[0; 8]); // verification tag, checksum
    h
}

fn tcp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    ip_packet(src, dst, PROTO_TCP, &tcp_hdr(sport, dport))
}

fn udp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    ip_packet(src, dst, PROTO_UDP, &udp_hdr(sport, dport))
}

fn sctp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    ip_packet(src, dst, PROTO_SCTP, &sctp_hdr(sport, dport))
}

fn icmp_echo(src: &str, dst: &str) -> Vec<u8> {
    ipv4_with_frag(src, dst, PROTO_ICMP, 0, &[8, 0, 0, 0, 0, 1, 0, 1])
}

fn icmpv6(src: &str, dst: &str, icmp_type: u8, hop_limit: u8) -> Vec<u8> {
    let mut l4 = vec![icmp_type, 0, 0, 0, 0, 0, 0, 0];
    l4.extend_from_slice(
        &ip(dst)
            .to_string()
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    ipv6_with_hops(src, dst, PROTO_ICMPV6, hop_limit, &l4)
}

fn arp_request() -> Vec<u8> {
    let mut a = vec![0, 1, 0x08, 0, 6, 4, 0, 1];
    a.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 10, 0, 0, 2]);
    a.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
    f.extend_from_slice(&a);
    f
}

fn ct(src: &str, sport: u16, dst: &str, dport: u16, proto: u8, owner: u8) -> CtKey {
    CtKey::new(ip(src), ip(dst), sport, dport, proto, owner)
}

// ------------------------------------------------------------------ tests

#[test]
fn unknown_interface_is_not_judged() {
    let h = Harness::new();
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.9.9.9", 80)), TC_ACT_OK);
    assert_eq!(h.pod_receives(&tcp("10.9.9.9", 40000, POD4, 80)), TC_ACT_OK);
    assert_eq!(
        h.stats(),
        [0; STAT_COUNT as usize],
        "nothing judged, nothing counted"
    );
}

#[test]
fn not_isolated_passes_and_tracks_the_flow() {
    let mut h = Harness::new();
    h.endpoint(0, 0);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), TC_ACT_OK);
    assert!(h.ct_has(&ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, OWNER_FROM_POD)));
    assert_eq!(h.pod_receives(&udp("10.0.1.7", 5353, POD4, 53)), TC_ACT_OK);
    assert!(h.ct_has(&ct("10.0.1.7", 5353, POD4, 53, PROTO_UDP, OWNER_TO_POD)));
    assert_eq!(h.stat(STAT_ALLOWED_UNISOLATED), 2);
}

#[test]
fn refresh_keeps_one_entry_and_moves_the_timestamp() {
    let mut h = Harness::new();
    h.endpoint(0, 0);
    let key = ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, OWNER_FROM_POD);
    h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80));
    let first = h.conntrack().get(&key, 0).unwrap().last_seen_ns;
    h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80));
    let second = h.conntrack().get(&key, 0).unwrap().last_seen_ns;
    assert!(second > first, "{second} > {first}");
    assert_eq!(h.ct_len(), 1);
}

#[test]
fn isolated_without_rules_drops_both_ways() {
    let mut h = Harness::new();
    h.endpoint(1, 2);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), TC_ACT_SHOT);
    assert_eq!(
        h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)),
        TC_ACT_SHOT
    );
    assert_eq!(h.stat(STAT_DENIED), 2);
    assert_eq!(h.ct_len(), 0, "dropped flows leave no conntrack entry");
}

#[test]
fn one_direction_isolated_leaves_the_other_open() {
    let mut h = Harness::new();
    h.endpoint(0, 2);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), TC_ACT_SHOT);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), TC_ACT_OK);
}

#[test]
fn cidr_and_port_allow() {
    let mut h = Harness::new();
    h.endpoint(0, 5);
    h.cidr(5, "10.0.1.0/24", 9);
    h.ports(9, PROTO_TCP, 80, 80);

    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), TC_ACT_OK);
    assert!(h.ct_has(&ct(POD4, 40000, "10.0.1.5", 80, PROTO_TCP, OWNER_FROM_POD)));
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.255", 80)), TC_ACT_OK);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 81)),
        TC_ACT_SHOT,
        "other port"
    );
    assert_eq!(
        h.pod_sends(&udp(POD4, 40000, "10.0.1.5", 80)),
        TC_ACT_SHOT,
        "other protocol"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.2.5", 80)),
        TC_ACT_SHOT,
        "outside CIDR"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)),
        TC_ACT_SHOT,
        "source port ignored"
    );
    assert_eq!(h.stat(STAT_ALLOWED_POLICY), 2);
    assert_eq!(h.stat(STAT_DENIED), 4);
}

#[test]
fn ingress_policy_judges_the_source() {
    let mut h = Harness::new();
    h.endpoint(3, 0);
    h.cidr(3, "192.168.0.0/16", 1);
    h.ports(1, PROTO_TCP, 8080, 8080);
    assert_eq!(
        h.pod_receives(&tcp("192.168.3.4", 50000, POD4, 8080)),
        TC_ACT_OK
    );
    assert!(h.ct_has(&ct(
        "192.168.3.4",
        50000,
        POD4,
        8080,
        PROTO_TCP,
        OWNER_TO_POD
    )));
    assert_eq!(
        h.pod_receives(&tcp("192.169.3.4", 50000, POD4, 8080)),
        TC_ACT_SHOT
    );
    assert_eq!(
        h.pod_receives(&tcp("192.168.3.4", 50000, POD4, 8081)),
        TC_ACT_SHOT
    );
}

#[test]
fn port_range_edges() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "0.0.0.0/0", 2);
    h.ports(2, PROTO_TCP, 8000, 8100);
    for (port, want) in [
        (7999, TC_ACT_SHOT),
        (8000, TC_ACT_OK),
        (8001, TC_ACT_OK),
        (8063, TC_ACT_OK),
        (8064, TC_ACT_OK),
        (8099, TC_ACT_OK),
        (8100, TC_ACT_OK),
        (8101, TC_ACT_SHOT),
        (0, TC_ACT_SHOT),
        (65535, TC_ACT_SHOT),
    ] {
        assert_eq!(
            h.pod_sends(&tcp(POD4, 40000, "1.2.3.4", port)),
            want,
            "port {port}"
        );
    }
}

#[test]
fn every_port_of_a_protocol_and_every_protocol() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.1.0.0/16", 2);
    h.port_keys(PortKey::lpm(2, PROTO_UDP, 0, 0));
    h.cidr(1, "10.2.0.0/16", 3);
    h.port_keys(PortKey::lpm_any_protocol(3));

    assert_eq!(h.pod_sends(&udp(POD4, 1, "10.1.0.1", 0)), TC_ACT_OK);
    assert_eq!(h.pod_sends(&udp(POD4, 1, "10.1.0.1", 65535)), TC_ACT_OK);
    assert_eq!(h.pod_sends(&tcp(POD4, 1, "10.1.0.1", 53)), TC_ACT_SHOT);
    assert_eq!(h.pod_sends(&icmp_echo(POD4, "10.1.0.1")), TC_ACT_SHOT);

    assert_eq!(h.pod_sends(&tcp(POD4, 1, "10.2.0.1", 22)), TC_ACT_OK);
    assert_eq!(h.pod_sends(&sctp(POD4, 1, "10.2.0.1", 9)), TC_ACT_OK);
    assert_eq!(
        h.pod_sends(&icmp_echo(POD4, "10.2.0.1")),
        TC_ACT_OK,
        "ICMP needs all protocols"
    );
}

#[test]
fn longer_prefix_without_ports_carves_an_except() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    // Rule A: 10.0.0.0/8 except 10.1.0.0/16, any port.
    h.cidr(1, "10.0.0.0/8", 10);
    h.port_keys(PortKey::lpm_any_protocol(10));
    h.cidr(1, "10.1.0.0/16", 11); // portset 11 has no entries
                                  // Rule B: 10.1.2.0/24 on TCP 443; B must win inside A's except.
    h.cidr(1, "10.1.2.0/24", 12);
    h.ports(12, PROTO_TCP, 443, 443);

    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.2.3.4", 80)), TC_ACT_OK);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.1.3.4", 80)),
        TC_ACT_SHOT,
        "in the except"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.1.2.3", 443)),
        TC_ACT_OK,
        "rule B"
    );
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.1.2.3", 80)), TC_ACT_SHOT);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "11.0.0.1", 80)), TC_ACT_SHOT);
}

#[test]
fn policies_do_not_leak_between_ids() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(2, "0.0.0.0/0", 1);
    h.port_keys(PortKey::lpm_any_protocol(1));
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), TC_ACT_SHOT);
    h.endpoint(0, 2);
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)), TC_ACT_OK);
}

#[test]
fn reply_to_an_ingress_flow_passes_egress() {
    let mut h = Harness::new();
    h.endpoint(1, 2); // egress policy 2 allows nothing
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);

    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 40000, POD4, 80)), TC_ACT_OK);
    assert_eq!(
        h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)),
        TC_ACT_OK,
        "reply"
    );
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);

    assert_eq!(
        h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40001)),
        TC_ACT_SHOT,
        "other client port"
    );
    assert_eq!(
        h.pod_sends(&tcp(POD4, 40000, "10.0.1.5", 80)),
        TC_ACT_SHOT,
        "not a reply"
    );
    assert_eq!(
        h.pod_sends(&udp(POD4, 80, "10.0.1.5", 40000)),
        TC_ACT_SHOT,
        "other protocol"
    );
}

#[test]
fn reply_to_an_egress_flow_passes_ingress() {
    let mut h = Harness::new();
    h.endpoint(1, 2); // ingress policy 1 allows nothing
    h.cidr(2, "10.96.0.10/32", 3);
    h.ports(3, PROTO_UDP, 53, 53);

    assert_eq!(h.pod_sends(&udp(POD4, 33333, "10.96.0.10", 53)), TC_ACT_OK);
    assert_eq!(
        h.pod_receives(&udp("10.96.0.10", 53, POD4, 33333)),
        TC_ACT_OK,
        "reply"
    );
    assert_eq!(
        h.pod_receives(&udp("10.96.0.10", 53, POD4, 33334)),
        TC_ACT_SHOT,
        "unsolicited"
    );
    assert_eq!(
        h.pod_receives(&udp("10.96.0.11", 53, POD4, 33333)),
        TC_ACT_SHOT,
        "other peer"
    );
}

#[test]
fn reply_needs_the_other_hooks_entry() {
    let mut h = Harness::new();
    h.endpoint(1, 2); // neither policy allows anything
                      // An entry with the right tuple but written by an egress hook (say of
                      // the peer, were it a local pod) is no proof that this pod's ingress
                      // allowed the flow.
    let key = ct("10.0.1.5", 40000, POD4, 80, PROTO_TCP, OWNER_FROM_POD);
    h.conntrack()
        .insert(key, CtValue { last_seen_ns: 1 }, 0)
        .unwrap();
    assert_eq!(h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)), TC_ACT_SHOT);

    let key = CtKey {
        owner: OWNER_TO_POD,
        ..key
    };
    h.conntrack()
        .insert(key, CtValue { last_seen_ns: 1 }, 0)
        .unwrap();
    assert_eq!(h.pod_sends(&tcp(POD4, 80, "10.0.1.5", 40000)), TC_ACT_OK);
    assert!(
        h.conntrack().get(&key, 0).unwrap().last_seen_ns > 1,
        "reply refreshes"
    );
}

#[test]
fn tightened_policy_stops_an_established_flow() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let syn = tcp(POD4, 40000, "10.0.1.5", 80);
    assert_eq!(h.pod_sends(&syn), TC_ACT_OK);
    h.remove_cidr(1, "10.0.1.0/24");
    assert_eq!(
        h.pod_sends(&syn),
        TC_ACT_SHOT,
        "no conntrack bypass forward"
    );
}

#[test]
fn unisolated_replies_do_not_open_the_other_direction() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_TCP, 80, 80);
    let out = tcp(POD4, 40000, "10.0.1.5", 80);
    assert_eq!(h.pod_sends(&out), TC_ACT_OK);
    assert_eq!(h.pod_receives(&tcp("10.0.1.5", 80, POD4, 40000)), TC_ACT_OK);
    assert_eq!(h.stat(STAT_ALLOWED_REPLY), 1);
    assert_eq!(h.ct_len(), 1, "the reply made no entry of its own");
    h.remove_cidr(1, "10.0.1.0/24");
    assert_eq!(h.pod_sends(&out), TC_ACT_SHOT);
}

#[test]
fn sctp_and_udp_ports() {
    let mut h = Harness::new();
    h.endpoint(7, 0);
    h.cidr(7, "10.0.0.0/8", 4);
    h.ports(4, PROTO_SCTP, 9000, 9000);
    h.ports(4, PROTO_UDP, 53, 53);

    assert_eq!(
        h.pod_receives(&sctp("10.0.1.5", 5000, POD4, 9000)),
        TC_ACT_OK
    );
    assert_eq!(
        h.pod_receives(&sctp("10.0.1.5", 5000, POD4, 9001)),
        TC_ACT_SHOT
    );
    assert_eq!(
        h.pod_receives(&tcp("10.0.1.5", 5000, POD4, 9000)),
        TC_ACT_SHOT
    );
    assert_eq!(h.pod_receives(&udp("10.0.1.5", 5000, POD4, 53)), TC_ACT_OK);
    assert_eq!(
        h.pod_receives(&tcp("10.0.1.5", 5000, POD4, 53)),
        TC_ACT_SHOT
    );
    assert!(h.ct_has(&ct("10.0.1.5", 5000, POD4, 9000, PROTO_SCTP, OWNER_TO_POD)));
}

#[test]
fn ipv6_peers() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "fd00:1::/64", 2);
    h.ports(2, PROTO_TCP, 443, 443);
    // A v4 catch-all must not match v6 peers (they share one trie).
    h.cidr(1, "0.0.0.0/0", 3);
    h.port_keys(PortKey::lpm_any_protocol(3));

    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::5", 443)), TC_ACT_OK);
    assert!(h.ct_has(&ct(
        POD6,
        40000,
        "fd00:1::5",
        443,
        PROTO_TCP,
        OWNER_FROM_POD
    )));
    assert_eq!(h.pod_sends(&tcp(POD6, 40000, "fd00:1::5", 80)), TC_ACT_SHOT);
    assert_eq!(
        h.pod_sends(&tcp(POD6, 40000, "fd00:2::5", 443)),
        TC_ACT_SHOT
    );
    assert_eq!(h.pod_sends(&tcp(POD4, 40000, "8.8.8.8", 443)), TC_ACT_OK);
    assert_eq!(
        h.pod_receives(&tcp("fd00:1::5", 443, POD6, 40000)),
        TC_ACT_OK,
        "reply"
    );
}

#[test]
fn ipv6_sctp_and_udp() {
    let mut h = Harness::new();
    h.endpoint(1, 0);
    h.cidr(1, "::/0", 2);
    h.ports(2, PROTO_UDP, 5000, 5999);
    h.ports(2, PROTO_SCTP, 36412, 36412);
    assert_eq!(h.pod_receives(&udp("fd00:9::1", 1, POD6, 5999)), TC_ACT_OK);
    assert_eq!(
        h.pod_receives(&udp("fd00:9::1", 1, POD6, 6000)),
        TC_ACT_SHOT
    );
    assert_eq!(
        h.pod_receives(&sctp("fd00:9::1", 1, POD6, 36412)),
        TC_ACT_OK
    );
    assert_eq!(
        h.pod_receives(&tcp("10.0.0.9", 1, POD4, 5000)),
        TC_ACT_SHOT,
        "::/0 is v6 only"
    );
}

#[test]
fn arp_passes_an_isolated_pod() {
    let mut h = Harness::new();
    h.endpoint(1, 1);
    assert_eq!(h.pod_sends(&arp_request()), TC_ACT_OK);
    assert_eq!(h.pod_receives(&arp_request()), TC_ACT_OK);
    assert_eq!(h.stats(), [0; STAT_COUNT as usize]);
}

#[test]
fn neighbour_discovery_passes_other_icmpv6_does_not() {
    let mut h = Harness::new();
    h.endpoint(1, 1);
    let ns = icmpv6("fe80::1", "ff02::1:ff00:2", 135, 255);
    assert_eq!(h.pod_receives(&ns), TC_ACT_OK);
    assert_eq!(
        h.pod_sends(&icmpv6("fe80::2", "fe80::1", 136, 255)),
        TC_ACT_OK
    );
    assert_eq!(h.stat(STAT_ALLOWED_NDP), 2);
    assert_eq!(
        h.pod_receives(&icmpv6("fe80::1", "fe80::2", 135, 64)),
        TC_ACT_SHOT,
        "routed NDP"
    );
    assert_eq!(
        h.pod_receives(&icmpv6("fd00::9", POD6, 128, 64)),
        TC_ACT_SHOT,
        "echo request"
    );
}

#[test]
fn fragments_and_truncated_headers_fail_closed() {
    let mut h = Harness::new();
    h.endpoint(0, 1);
    h.cidr(1, "10.0.1.0/24", 1);
    h.ports(1, PROTO_UDP, 53, 53);
    // The first fragment has the ports; a later one has none.
    let first = ipv4_with_frag(POD4, "10.0.1.5", PROTO_UDP, 0x2000, &udp_hdr(1000, 53));
    let later = ipv4_with_frag(POD4, "10.0.1.5", PROTO_UDP, 0x0002, &[0; 16]);
    assert_eq!(h.pod_sends(&first), TC_ACT_OK);
    assert_eq!(h.pod_sends(&later), TC_ACT_SHOT);
    let truncated = ipv4_with_frag(POD4, "10.0.1.5", PROTO_UDP, 0, &[0, 1]);
    assert_eq!(h.pod_sends(&truncated), TC_ACT_SHOT);
    assert_eq!(
        h.pod_receives(&ipv4_with_frag("10.0.1.5", POD4, PROTO_UDP, 0, &[0, 1])),
        TC_ACT_OK
    );
}

#[test]
fn maps_are_pinned_by_name() {
    let h = Harness::new();
    for name in MAP_NAMES {
        assert!(h.pins.0.join(name).exists(), "{name} not pinned");
    }
}

#[test]
fn a_second_load_shares_the_pinned_maps() {
    let mut h = Harness::new();
    let mut second = EbpfLoader::new()
        .default_map_pin_directory(&h.pins.0)
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
    assert_eq!(
        result.return_value, TC_ACT_SHOT,
        "sees the first load's endpoint"
    );
    assert_eq!(h.stat(STAT_DENIED), 1, "and counts into the same stats");
}
