//! The compiled tables, written by the real datapath code into the real eBPF
//! maps, judged by the real programs (BPF_PROG_TEST_RUN): every verdict must
//! equal the table's model (`PolicySet::allows`), for random policies with
//! CIDRs, excepts, port ranges and all three protocols. Needs root and bpffs.

use palisade_test_support::require_root;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use node_enforcer::compile::{compile, PolicySet, PortSet};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Rule};

use palisade_ebpf::{VERDICT_DROP, VERDICT_NEXT};

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
        rules.push(Rule {
            peers,
            ports,
            ..Default::default()
        });
    }
    DirectionPolicy {
        rules,
        ..Default::default()
    }
}

/// A direction with ClusterNetworkPolicy tiers: random rules of
/// `random_policy`'s shape as Admin and Baseline rules of random actions,
/// with or without NetworkPolicy isolation.
fn random_tiered_policy(rng: &mut Rng) -> DirectionPolicy {
    let tier = |rng: &mut Rng| -> Vec<palisade_proto::v1::TierRule> {
        random_policy(rng)
            .rules
            .into_iter()
            .map(|r| palisade_proto::v1::TierRule {
                action: 1 + rng.below(3) as i32,
                peers: r.peers,
                ports: r.ports,
                ..Default::default()
            })
            .collect()
    };
    let admin = tier(rng);
    let baseline = tier(rng);
    let not_isolated = rng.below(2) == 0;
    DirectionPolicy {
        rules: if not_isolated {
            vec![]
        } else {
            random_policy(rng).rules
        },
        admin,
        baseline,
        not_isolated,
    }
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
        f[14 + 20 + 13] = 0x10; // ACK: a segment conntrack may vouch for (a SYN never is)
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

fn pin_root(name: &str) -> PinRoot {
    require_root();
    PinRoot(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-{name}-{}",
        std::process::id()
    )))
}

/// Points the pod's ingress at table `id` and checks 400 random packets'
/// verdicts against the model; returns (allowed, total).
fn probe(dp: &mut BpfDatapath, id: u32, set: &PolicySet, rng: &mut Rng) -> (usize, usize) {
    // The program judges the source against the pod's ingress table.
    dp.set_endpoint(
        IFINDEX,
        &EndpointEntry {
            ingress: id,
            ..Default::default()
        },
    )
    .unwrap();
    let (mut allowed, mut total) = (0, 0);
    for probe in 0..400u32 {
        let peer = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + rng.below(300) as u32);
        let proto = [6u8, 17, 132][rng.below(3) as usize];
        let port =
            [1u16, 79, 80, 81, 999, 1000, 2500, 3999, 4000, 65534, 65535][rng.below(11) as usize];
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
            if expect { VERDICT_NEXT } else { VERDICT_DROP },
            "table {id}: {peer} proto {proto} port {port}: {set:?}"
        );
        total += 1;
        allowed += usize::from(expect);
    }
    (allowed, total)
}

fn pinned_hash<K: aya::Pod, V: aya::Pod>(
    root: &std::path::Path,
    name: &str,
) -> aya::maps::HashMap<aya::maps::MapData, K, V> {
    let data = aya::maps::MapData::from_pin(root.join(name)).unwrap();
    aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).unwrap()
}

/// What an older version leaves on the pins (the policy trie alone, IPv4
/// flows in the IPv6 conntrack map), plus leftovers a crash could leave,
/// taken over by a new process: the exact lookup is filled in, the
/// leftovers go, IPv4 entries move, and every verdict matches the model.
#[test]
#[ignore = "needs root"]
fn tables_of_an_older_version_are_adopted_into_the_exact_lookup() {
    require_root();
    use palisade_ebpf::{
        Ct4Key, CtKey, CtValue, PolicyExactKey, PolicyLens, PolicyValue, HOOK_TO_POD,
        MAP_CONNTRACK, MAP_CT4, MAP_POLICY, MAP_POLICY_EXACT, MAP_POLICY_LENS,
    };
    let root = pin_root("adopt-exact");
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let mut rng = Rng(0x5eed_1234_abcd_0002);
    let mut portsets = BTreeMap::new();
    let sets: Vec<PolicySet> = (1..=12u32)
        .map(|id| {
            let set = compile(&random_policy(&mut rng), &[]).unwrap();
            write(&mut dp, id, &set, &mut portsets);
            set
        })
        .collect();
    drop(dp);

    // The older version's view: no exact entries, no length lists...
    let mut exact: aya::maps::HashMap<_, PolicyExactKey, PolicyValue> =
        pinned_hash(&root.0, MAP_POLICY_EXACT);
    let keys: Vec<PolicyExactKey> = exact.keys().map(Result::unwrap).collect();
    assert!(!keys.is_empty());
    for k in &keys {
        exact.remove(k).unwrap();
    }
    let mut lens: aya::maps::HashMap<_, u32, PolicyLens> = pinned_hash(&root.0, MAP_POLICY_LENS);
    let mut listed: Vec<u32> = lens.keys().map(Result::unwrap).collect();
    listed.sort();
    assert!(!listed.is_empty(), "some random policy has few lengths");
    for id in &listed {
        lens.remove(id).unwrap();
    }
    // ...a list left for an id no policy has (it would hide entries of
    // other lengths when the id is used again), an exact entry the trie
    // does not have...
    lens.insert(99, PolicyLens::new([160]).unwrap(), 0).unwrap();
    let orphan = PolicyExactKey {
        prefix_len: 160,
        key: palisade_ebpf::PolicyKey {
            policy_id: 99,
            addr: Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets(),
        },
    };
    exact
        .insert(orphan, PolicyValue { portset_id: 1 }, 0)
        .unwrap();
    // ...and an IPv4 flow in the IPv6 conntrack map, of a high epoch.
    let flow = CtKey::new(
        palisade_ebpf::Tuple {
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)),
            sport: 40000,
            dst: IpAddr::V4(POD),
            dport: 80,
            proto: 6,
        },
        IFINDEX,
        HOOK_TO_POD,
    );
    let mut v6: aya::maps::HashMap<_, CtKey, CtValue> = pinned_hash(&root.0, MAP_CONNTRACK);
    let seen = CtValue {
        last_seen_ns: 5,
        epoch: 1000,
        pad: 0,
    };
    v6.insert(flow, seen, 0).unwrap();

    let mut dp = BpfDatapath::load(&root.0).expect("reload the programs");
    let adopted = dp.adopt().unwrap();
    assert_eq!(adopted.policies.len(), sets.len());

    let trie: aya::maps::lpm_trie::LpmTrie<_, palisade_ebpf::PolicyKey, PolicyValue> = {
        let data = aya::maps::MapData::from_pin(root.0.join(MAP_POLICY)).unwrap();
        aya::maps::lpm_trie::LpmTrie::try_from(aya::maps::Map::LpmTrie(data)).unwrap()
    };
    let exact: aya::maps::HashMap<_, PolicyExactKey, PolicyValue> =
        pinned_hash(&root.0, MAP_POLICY_EXACT);
    assert_eq!(exact.keys().count(), trie.keys().count(), "exact = trie");
    assert!(exact.get(&orphan, 0).is_err(), "the orphan is gone");
    let lens: aya::maps::HashMap<_, u32, PolicyLens> = pinned_hash(&root.0, MAP_POLICY_LENS);
    let mut relisted: Vec<u32> = lens.keys().map(Result::unwrap).collect();
    relisted.sort();
    assert_eq!(relisted, listed, "the same policies listed, 99 not");

    let v6: aya::maps::HashMap<_, CtKey, CtValue> = pinned_hash(&root.0, MAP_CONNTRACK);
    let v4: aya::maps::HashMap<_, Ct4Key, CtValue> = pinned_hash(&root.0, MAP_CT4);
    assert_eq!(v6.keys().count(), 0, "moved out");
    assert_eq!(v4.get(&Ct4Key::of(&flow).unwrap(), 0).unwrap(), seen);

    for (i, set) in sets.iter().enumerate() {
        probe(&mut dp, i as u32 + 1, set, &mut rng);
    }
    assert!(
        endpoint_in_map(&root.0, IFINDEX).ingress_epoch > 1000,
        "epochs start above the moved entry's"
    );
}

#[test]
#[ignore = "needs root"]
fn programs_agree_with_the_compiled_tables() {
    require_root();
    let root = pin_root("oracle");
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut portsets = BTreeMap::new();
    let (mut allowed, mut total) = (0, 0);
    for id in 1..=40u32 {
        let set = compile(&random_policy(&mut rng), &[]).unwrap();
        write(&mut dp, id, &set, &mut portsets);
        // The pod's ingress uses this table; the program judges the source.
        let (a, t) = probe(&mut dp, id, &set, &mut rng);
        allowed += a;
        total += t;
    }
    eprintln!("{total} verdicts from the programs, {allowed} allowed");
    assert!(
        allowed > total / 20 && allowed < total * 19 / 20,
        "{allowed} of {total}"
    );
}

/// Tiered tables (ClusterNetworkPolicy), whose port sets deny inside what
/// they allow, judged by the real programs as the compiled set says, and
/// read back as written.
#[test]
#[ignore = "needs root"]
fn programs_agree_with_tiered_tables() {
    require_root();
    let root = pin_root("oracle-tiers");
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let mut rng = Rng(0x5eed_1234_abcd_0003);
    let mut portsets = BTreeMap::new();
    let (mut allowed, mut total) = (0, 0);
    let mut denying_entries = 0;
    for id in 1..=40u32 {
        let set = compile(&random_tiered_policy(&mut rng), &[]).unwrap();
        denying_entries += set
            .entries
            .values()
            .flat_map(|p| p.0.iter())
            .filter(|e| !e.allows())
            .count();
        write(&mut dp, id, &set, &mut portsets);
        let (a, t) = probe(&mut dp, id, &set, &mut rng);
        allowed += a;
        total += t;
    }
    eprintln!("{total} verdicts from the programs, {allowed} allowed, {denying_entries} denying port entries");
    assert!(denying_entries > 0, "no port set denied inside an allow");
    assert!(
        allowed > total / 20 && allowed < total * 19 / 20,
        "{allowed} of {total}"
    );
    let adopted = dp.adopt().unwrap();
    for (set, id) in &portsets {
        assert_eq!(
            adopted.portsets.get(id),
            Some(set),
            "port set {id} read back"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn endpoint_addresses_are_written_whole_and_read_back() {
    require_root();
    let root = pin_root("endpoint-addrs");
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let v6: std::net::Ipv6Addr = "fd00:9::1".parse().unwrap();
    let entry = EndpointEntry {
        ingress: 0,
        egress: 0,
        pod_addrs: vec![POD.to_ipv6_mapped().octets(), v6.octets()],
    };
    dp.set_endpoint(IFINDEX, &entry).unwrap();
    assert_eq!(dp.adopt().unwrap().endpoints.get(&IFINDEX), Some(&entry));

    let from = |dp: &BpfDatapath, src: Ipv4Addr| {
        dp.test_run(
            palisade_ebpf::PROG_FROM_POD,
            &frame(src, Ipv4Addr::new(10, 0, 0, 9), 17, 1000, 53),
            IFINDEX,
        )
        .unwrap()
    };
    assert_eq!(from(&dp, POD), VERDICT_NEXT, "the pod's own address");
    assert_eq!(
        from(&dp, Ipv4Addr::new(10, 9, 0, 2)),
        VERDICT_DROP,
        "spoofed"
    );

    // Too many addresses: refused, naming the count, and nothing written.
    let too_many = EndpointEntry {
        ingress: 7,
        egress: 7,
        pod_addrs: (1..=5u8)
            .map(|i| Ipv4Addr::new(10, 9, 1, i).to_ipv6_mapped().octets())
            .collect(),
    };
    let e = dp.set_endpoint(IFINDEX, &too_many).unwrap_err().to_string();
    assert!(e.contains("5 addresses"), "{e}");
    assert_eq!(dp.adopt().unwrap().endpoints.get(&IFINDEX), Some(&entry));
    assert_eq!(from(&dp, POD), VERDICT_NEXT, "the old entry still enforced");

    // No addresses: everything the pod sends drops.
    let none = EndpointEntry {
        pod_addrs: Vec::new(),
        ..entry
    };
    dp.set_endpoint(IFINDEX, &none).unwrap();
    assert_eq!(from(&dp, POD), VERDICT_DROP);
    dp.remove_endpoint(IFINDEX).unwrap();
}

/// Runs `test` on a thread of its own in a fresh network namespace holding
/// the veth pair `pal-a`/`pal-b` (both go away with the thread).
fn in_netns_with_veth(test: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("unshare(CLONE_NEWNET)");
                let status = std::process::Command::new("ip")
                    .args([
                        "link", "add", "pal-a", "type", "veth", "peer", "name", "pal-b",
                    ])
                    .status()
                    .expect("run ip");
                assert!(status.success(), "ip link add: {status}");
                test();
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    });
}

#[test]
#[ignore = "needs root"]
fn programs_attach_at_the_head_of_the_tcx_chain() {
    require_root();
    use aya::programs::{SchedClassifier, TcAttachType};
    let root = pin_root("tcx-order");
    let bystander_pins = pin_root("tcx-bystander");
    in_netns_with_veth(|| {
        // Another TC user that was there first, at the default (tail) spot.
        std::fs::create_dir_all(&bystander_pins.0).unwrap();
        let mut other = aya::EbpfLoader::new()
            .default_map_pin_directory(&bystander_pins.0)
            .load(palisade_ebpf::OBJECT)
            .unwrap();
        let mut bystander_ids = Vec::new();
        for (name, hook) in [
            (palisade_ebpf::PROG_FROM_POD, TcAttachType::Ingress),
            (palisade_ebpf::PROG_TO_POD, TcAttachType::Egress),
        ] {
            let prog: &mut SchedClassifier = other.program_mut(name).unwrap().try_into().unwrap();
            prog.load().unwrap();
            prog.attach("pal-a", hook).unwrap();
            bystander_ids.push(prog.info().unwrap().id());
        }

        let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
        let ifindex = dp.ifindex("pal-a").unwrap();
        dp.attach("pal-a", ifindex).unwrap();
        // A pod-up attaches by filters; the links come with the promotion.
        assert_eq!(dp.unpromoted().len(), 1);
        dp.promote("pal-a").unwrap();
        assert!(dp.unpromoted().is_empty());

        for (hook, bystander) in [TcAttachType::Ingress, TcAttachType::Egress]
            .into_iter()
            .zip(bystander_ids)
        {
            let (_, chain) = SchedClassifier::query_tcx("pal-a", hook).unwrap();
            let ids: Vec<u32> = chain.iter().map(|p| p.id()).collect();
            assert_eq!(ids.len(), 2, "{hook:?}: {ids:?}");
            assert_eq!(
                ids[1], bystander,
                "{hook:?}: ours first, then the other: {ids:?}"
            );
        }
        dp.detach("pal-a", ifindex).unwrap();
    });
}

/// The programs' filters on `dev`'s hook, as `tc` lists them.
fn our_filters(dev: &str, hook: &str) -> Vec<String> {
    let out = std::process::Command::new("tc")
        .args(["filter", "show", "dev", dev, hook])
        .output()
        .expect("run tc");
    assert!(out.status.success(), "tc filter show: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("palisade_"))
        .map(str::to_string)
        .collect()
}

fn tcx_chain(dev: &str, hook: aya::programs::TcAttachType) -> Vec<u32> {
    let (_, chain) = aya::programs::SchedClassifier::query_tcx(dev, hook).unwrap();
    chain.iter().map(|p| p.id()).collect()
}

#[test]
#[ignore = "needs root"]
fn a_fast_attach_judges_by_filters_until_promoted_to_links() {
    require_root();
    use aya::programs::TcAttachType::{Egress, Ingress};
    let root = pin_root("fast-attach");
    in_netns_with_veth(|| {
        let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
        let ifindex = dp.ifindex("pal-a").unwrap();
        dp.set_endpoint(ifindex, &EndpointEntry::default()).unwrap();
        dp.attach("pal-a", ifindex).unwrap();
        // Direct-action filters of the clsact qdisc, named for the programs.
        let ingress = our_filters("pal-a", "ingress");
        let egress = our_filters("pal-a", "egress");
        assert_eq!(ingress.len(), 1, "{ingress:?}");
        assert!(ingress[0].contains("palisade_from_pod") && ingress[0].contains("direct-action"));
        assert_eq!(egress.len(), 1, "{egress:?}");
        assert!(egress[0].contains("palisade_to_pod"));
        assert!(tcx_chain("pal-a", Ingress).is_empty());
        let waiting = dp.unpromoted();
        assert_eq!(waiting.len(), 1);
        assert_eq!((waiting[0].0.as_str(), waiting[0].1), ("pal-a", ifindex));
        // Attaching again changes nothing.
        dp.attach("pal-a", ifindex).unwrap();
        assert_eq!(our_filters("pal-a", "ingress").len(), 1);

        dp.promote("pal-a").unwrap();
        assert!(dp.unpromoted().is_empty());
        assert_eq!(tcx_chain("pal-a", Ingress).len(), 1);
        assert_eq!(tcx_chain("pal-a", Egress).len(), 1);
        assert!(our_filters("pal-a", "ingress").is_empty());
        assert!(our_filters("pal-a", "egress").is_empty());
        // Promoting again is a no-op.
        dp.promote("pal-a").unwrap();
        dp.detach("pal-a", ifindex).unwrap();
        // The link goes when its last reference does, which may be its
        // pin's inode, evicted after the unlink returns (a loaded machine
        // showed it still in the chain once): wait for it, bounded.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !tcx_chain("pal-a", Ingress).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the link is still in the chain 5 s after its detach"
            );
            std::thread::sleep(std::time::Duration::from_millis(5)); // poll: inside a loop bounded by a deadline
        }
        dp.remove_endpoint(ifindex).unwrap();
    });
}

#[test]
#[ignore = "needs root"]
fn a_detach_before_the_promotion_removes_the_filters() {
    require_root();
    let root = pin_root("fast-detach");
    in_netns_with_veth(|| {
        let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
        let ifindex = dp.ifindex("pal-a").unwrap();
        dp.set_endpoint(ifindex, &EndpointEntry::default()).unwrap();
        dp.attach("pal-a", ifindex).unwrap();
        dp.detach("pal-a", ifindex).unwrap();
        assert!(our_filters("pal-a", "ingress").is_empty());
        assert!(our_filters("pal-a", "egress").is_empty());
        assert!(dp.unpromoted().is_empty());
        dp.remove_endpoint(ifindex).unwrap();
    });
}

#[test]
#[ignore = "needs root"]
fn tcx_mode_attaches_links_at_once() {
    require_root();
    use aya::programs::TcAttachType::Ingress;
    let root = pin_root("tcx-attach");
    in_netns_with_veth(|| {
        let mut dp = BpfDatapath::load(&root.0)
            .expect("load the programs")
            .with_attach_mode(node_enforcer::datapath::AttachMode::Tcx);
        let ifindex = dp.ifindex("pal-a").unwrap();
        dp.set_endpoint(ifindex, &EndpointEntry::default()).unwrap();
        dp.attach("pal-a", ifindex).unwrap();
        assert!(dp.unpromoted().is_empty());
        assert_eq!(tcx_chain("pal-a", Ingress).len(), 1);
        assert!(our_filters("pal-a", "ingress").is_empty());
        dp.detach("pal-a", ifindex).unwrap();
        dp.remove_endpoint(ifindex).unwrap();
    });
}

#[test]
#[ignore = "needs root"]
fn a_new_process_promotes_the_filters_a_stopped_one_left() {
    require_root();
    use aya::programs::TcAttachType::{Egress, Ingress};
    let root = pin_root("fast-adopt");
    in_netns_with_veth(|| {
        let entry = EndpointEntry {
            ingress: 7,
            egress: 8,
            pod_addrs: vec![Ipv4Addr::new(10, 0, 0, 9).to_ipv6_mapped().octets()],
        };
        let ifindex = {
            let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
            let ifindex = dp.ifindex("pal-a").unwrap();
            dp.set_endpoint(ifindex, &entry).unwrap();
            dp.attach("pal-a", ifindex).unwrap();
            ifindex
            // The process stops before promoting: its filters stay.
        };
        assert_eq!(our_filters("pal-a", "ingress").len(), 1);
        let mut next = BpfDatapath::load(&root.0).expect("load the programs again");
        let adopted = next.adopt().unwrap();
        assert!(
            adopted.attached.contains_key("pal-a"),
            "{:?}",
            adopted.attached
        );
        assert_eq!(adopted.endpoints.get(&ifindex), Some(&entry));
        assert!(next.unpromoted().is_empty());
        assert_eq!(tcx_chain("pal-a", Ingress).len(), 1);
        assert_eq!(tcx_chain("pal-a", Egress).len(), 1);
        assert!(our_filters("pal-a", "ingress").is_empty());
        assert!(our_filters("pal-a", "egress").is_empty());
        next.detach("pal-a", ifindex).unwrap();
        next.remove_endpoint(ifindex).unwrap();
    });
}

/// What the endpoint's slot holds of its policies and epochs.
#[derive(Clone, Copy, Debug, PartialEq)]
struct InMap {
    ingress_policy: u32,
    egress_policy: u32,
    ingress_epoch: u32,
    egress_epoch: u32,
}

fn endpoint_in_map(root: &std::path::Path, ifindex: u32) -> InMap {
    let e = node_enforcer::datapath::inspect::endpoints(root).unwrap()[&ifindex];
    InMap {
        ingress_policy: e.ingress().policy,
        egress_policy: e.egress().policy,
        ingress_epoch: e.ingress().epoch,
        egress_epoch: e.egress().epoch,
    }
}

#[test]
#[ignore = "needs root"]
fn a_policy_change_stops_established_flows_it_no_longer_allows() {
    require_root();
    let root = pin_root("epochs");
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let allow_80 = compile(
        &DirectionPolicy {
            rules: vec![Rule {
                peers: vec![PeerBlock {
                    cidr: Some(prefix(Ipv4Addr::new(10, 0, 0, 0), 24)),
                    except: vec![],
                }],
                ports: vec![PortRange {
                    protocol: 6,
                    port: 80,
                    end_port: 0,
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
        &[],
    )
    .unwrap();
    let deny_all = compile(&DirectionPolicy::default(), &[]).unwrap();
    let mut portsets = BTreeMap::new();
    write(&mut dp, 1, &allow_80, &mut portsets);
    write(&mut dp, 2, &deny_all, &mut portsets);
    let entry = |ingress| EndpointEntry {
        ingress,
        egress: 0,
        pod_addrs: vec![POD.to_ipv6_mapped().octets()],
    };
    let request = frame(Ipv4Addr::new(10, 0, 0, 7), POD, 6, 40000, 80);
    let judge = |dp: &BpfDatapath| {
        dp.test_run(palisade_ebpf::PROG_TO_POD, &request, IFINDEX)
            .unwrap()
    };

    dp.set_endpoint(IFINDEX, &entry(1)).unwrap();
    let first = endpoint_in_map(&root.0, IFINDEX);
    assert_ne!(first.ingress_epoch, 0, "a new endpoint gets a fresh epoch");
    assert_eq!(judge(&dp), VERDICT_NEXT);
    assert_eq!(judge(&dp), VERDICT_NEXT, "established");

    // Same policies (say, only the addresses were rewritten): same epochs.
    dp.set_endpoint(IFINDEX, &entry(1)).unwrap();
    assert_eq!(endpoint_in_map(&root.0, IFINDEX), first);

    dp.set_endpoint(IFINDEX, &entry(2)).unwrap();
    let second = endpoint_in_map(&root.0, IFINDEX);
    assert_ne!(second.ingress_epoch, first.ingress_epoch);
    assert_eq!(second.egress_epoch, first.egress_epoch, "egress unchanged");
    assert_eq!(judge(&dp), VERDICT_DROP, "the established flow is stopped");

    // A new process on the same pins hands out epochs no entry holds.
    drop(dp);
    let mut dp = BpfDatapath::load(&root.0).expect("reload the programs");
    dp.set_endpoint(IFINDEX, &entry(1)).unwrap();
    let third = endpoint_in_map(&root.0, IFINDEX);
    assert!(
        third.ingress_epoch > second.ingress_epoch,
        "{third:?} after {second:?}"
    );
    assert_eq!(judge(&dp), VERDICT_NEXT);
    dp.remove_endpoint(IFINDEX).unwrap();
}

/// The reconciler's look at its interfaces after link events: the ones
/// that exist with their index, the missing ones absent, the same answer
/// the whole-node listing gives.
#[test]
#[ignore = "needs root"]
fn interfaces_are_looked_up_by_name() {
    let root = pin_root("names");
    let mut dp = BpfDatapath::load(&root.0).unwrap();
    let too_long = "x".repeat(40);
    let names = ["lo", "palisade-none0", too_long.as_str()];
    let named = dp.interfaces_named(&names).unwrap();
    let all = dp.interfaces().unwrap();
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named.get("lo"), all.get("lo"));
    assert!(named["lo"] > 0);
}
