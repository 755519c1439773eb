//! The compiled tables, written by the real datapath code into the real eBPF
//! maps, judged by the real programs (BPF_PROG_TEST_RUN): every verdict must
//! equal the table's model (`PolicySet::allows`), for random policies with
//! CIDRs, excepts, port ranges and all three protocols. Needs root and bpffs.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use node_enforcer::compile::{compile, PolicySet, PortSet};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Rule};

const TC_ACT_OK: i32 = 0;
const TC_ACT_SHOT: i32 = 2;
/// The programs key endpoints by ifindex; loopback exists everywhere and
/// nothing is attached to it (test runs need no attachment).
const IFINDEX: u32 = 1;
const POD: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);

struct PinRoot(std::path::PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn prefix(a: Ipv4Addr, len: u32) -> IpPrefix {
    IpPrefix {
        addr: a.octets().to_vec(),
        prefix_len: len,
    }
}

fn random_policy(rng: &mut Rng) -> DirectionPolicy {
    let mut rules = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let mut peers = Vec::new();
        for _ in 0..1 + rng.below(2) {
            let len = 24 + rng.below(6) as u32;
            let base = u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (rng.below(256) as u32);
            let net = ipnet::Ipv4Net::new(Ipv4Addr::from(base), len as u8)
                .unwrap()
                .trunc();
            let mut except = Vec::new();
            if rng.below(2) == 0 {
                let elen = (len + 1 + rng.below(3) as u32).min(32);
                let inside = u32::from(net.network()) + rng.below(1 << (32 - len)) as u32;
                let e = ipnet::Ipv4Net::new(Ipv4Addr::from(inside), elen as u8)
                    .unwrap()
                    .trunc();
                except.push(prefix(e.network(), elen));
            }
            peers.push(PeerBlock {
                cidr: Some(prefix(net.network(), len)),
                except,
            });
        }
        let mut ports = Vec::new();
        for _ in 0..rng.below(3) {
            let protocol = [6, 17, 132][rng.below(3) as usize];
            let port = [0u32, 80, 1000, 65535][rng.below(4) as usize];
            let end_port = if port != 0 && port < 65535 && rng.below(2) == 0 {
                port + rng.below(3000) as u32
            } else {
                0
            }
            .min(65535);
            ports.push(PortRange {
                protocol,
                port,
                end_port,
            });
        }
        rules.push(Rule { peers, ports });
    }
    DirectionPolicy { rules }
}

/// Ethernet + IPv4 + the first 8 bytes of TCP/UDP/SCTP (ports first in all three).
fn frame(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
    let l4_len: u16 = if proto == 6 { 20 } else { 12 };
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&(20 + l4_len).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0, 0, 64, proto, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.resize(14 + 20 + l4_len as usize, 0);
    if proto == 6 {
        f[14 + 20 + 12] = 0x50;
        f[14 + 20 + 13] = 0x02;
    }
    f
}

/// Writes a compiled set the way the reconciler does: port sets first, then
/// the prefix table pointing at them.
fn write(dp: &mut BpfDatapath, id: u32, set: &PolicySet, portsets: &mut BTreeMap<PortSet, u32>) {
    let mut entries = Vec::new();
    for (p, ports) in &set.entries {
        let ps = if ports.0.is_empty() {
            0
        } else {
            let next = portsets.len() as u32 + 1;
            let ps = *portsets.entry(ports.clone()).or_insert(next);
            if ps == next {
                dp.add_portset(ps, ports).unwrap();
            }
            ps
        };
        entries.push((*p, ps));
    }
    dp.add_policy(id, &entries).unwrap();
}

#[test]
fn programs_agree_with_the_compiled_tables() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root to load eBPF programs"
    );
    let root = PinRoot(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-oracle-{}",
        std::process::id()
    )));
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut portsets = BTreeMap::new();
    let (mut allowed, mut total) = (0, 0);
    for id in 1..=40u32 {
        let set = compile(&random_policy(&mut rng), &[]).unwrap();
        write(&mut dp, id, &set, &mut portsets);
        // The pod's ingress uses this table; the program judges the source.
        dp.set_endpoint(
            IFINDEX,
            &EndpointEntry {
                ingress: id,
                ..Default::default()
            },
        )
        .unwrap();
        for probe in 0..400u32 {
            let peer =
                Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + rng.below(300) as u32);
            let proto = [6u8, 17, 132][rng.below(3) as usize];
            let port = [1u16, 79, 80, 81, 999, 1000, 2500, 3999, 4000, 65534, 65535]
                [rng.below(11) as usize];
            let sport = 20000 + (probe as u16);
            let verdict = dp
                .test_run(
                    palisade_ebpf::PROG_TO_POD,
                    &frame(peer, POD, proto, sport, port),
                    IFINDEX,
                )
                .unwrap();
            let expect = set.allows(IpAddr::V4(peer), proto, port);
            assert_eq!(
                verdict,
                if expect { TC_ACT_OK } else { TC_ACT_SHOT },
                "table {id}: {peer} proto {proto} port {port}: {set:?}"
            );
            total += 1;
            allowed += usize::from(expect);
        }
    }
    eprintln!("{total} verdicts from the programs, {allowed} allowed");
    assert!(
        allowed > total / 20 && allowed < total * 19 / 20,
        "{allowed} of {total}"
    );
}
