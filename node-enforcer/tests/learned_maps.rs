//! The learner's writer of the overlay maps, on the real pinned maps:
//! entries land in slots found through the index, port sets are shared by
//! content in the learner's id range (which the reconciler's adoption
//! never takes), a new process adopts what the last one wrote, and a
//! retired slot is filled again only after a grace period. Needs root.

use std::net::IpAddr;
use std::path::PathBuf;

use node_enforcer::compile::{PortEntry, PortSet};
use node_enforcer::datapath::bpf::learned::LearnedMaps;
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, LEARNED_PORTSET_BASE};

struct PinRoot(PathBuf);
impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tcp(port: u16) -> PortSet {
    PortSet(
        [PortEntry::Block {
            proto: 6,
            port,
            bits: 16,
        }]
        .into(),
    )
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
#[ignore = "needs root"]
fn entries_share_port_sets_survive_a_new_process_and_stay_out_of_the_reconcilers_tables() {
    palisade_test_support::require_root();
    let root = PinRoot(PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-learned-{}",
        std::process::id()
    )));
    let mut dp = BpfDatapath::load(&root.0).unwrap();
    // The reconciler's own port set, to tell them apart.
    dp.add_portset(1, &tcp(22)).unwrap();

    let (mut maps, adopted) = LearnedMaps::open(&root.0).unwrap();
    assert!(adopted.is_empty());
    maps.set(7, ip("192.0.2.7"), &tcp(443), None, 1_000)
        .unwrap();
    // With a staged port set (its staged egress's rules by name).
    maps.set(7, ip("2001:db8::7"), &tcp(443), Some(&tcp(53)), 2_000)
        .unwrap();
    maps.set(8, ip("192.0.2.7"), &tcp(80), None, 3_000).unwrap();
    assert_eq!(maps.len(), 3);
    assert_eq!(maps.port_sets(), 3, "the two 443 entries share one");
    let (slot, v) = maps.slot_of(7, ip("192.0.2.7")).unwrap();
    assert_eq!((v.ifindex, v.expires_ns, v.audit_portset_id), (7, 1_000, 0));
    assert!(v.portset_id >= LEARNED_PORTSET_BASE, "{}", v.portset_id);
    assert_eq!(v.addr[10..], [0xff, 0xff, 192, 0, 2, 7]);
    let shared = v.portset_id;
    let v6 = maps.slot_of(7, ip("2001:db8::7")).unwrap().1;
    assert_eq!(v6.portset_id, shared);
    assert!(v6.audit_portset_id >= LEARNED_PORTSET_BASE && v6.audit_portset_id != shared);

    // In place: the same slot, a new port set and expiry.
    maps.set(7, ip("192.0.2.7"), &tcp(8443), None, 5_000)
        .unwrap();
    let (again, v) = maps.slot_of(7, ip("192.0.2.7")).unwrap();
    assert_eq!(again, slot);
    assert_ne!(v.portset_id, shared);
    assert_eq!(v.expires_ns, 5_000);
    assert_eq!(maps.port_sets(), 4);

    // The reconciler's adoption sees its own port set only.
    drop(dp);
    let mut dp = BpfDatapath::load(&root.0).unwrap();
    let reconciler = dp.adopt().unwrap();
    assert_eq!(reconciler.portsets.keys().copied().collect::<Vec<_>>(), [1]);

    // A new learner adopts every entry, with its port set and expiry.
    maps.clear(8, ip("192.0.2.7")).unwrap();
    maps.clear(8, ip("192.0.2.7")).unwrap();
    drop(maps);
    let (mut maps, mut adopted) = LearnedMaps::open(&root.0).unwrap();
    adopted.sort_by_key(|e| (e.ifindex, e.addr));
    let seen: Vec<(u32, IpAddr, PortSet, Option<PortSet>, u64)> = adopted
        .into_iter()
        .map(|e| (e.ifindex, e.addr, e.ports, e.staged, e.expiry))
        .collect();
    assert_eq!(
        seen,
        [
            (7, ip("192.0.2.7"), tcp(8443), None, 5_000),
            (7, ip("2001:db8::7"), tcp(443), Some(tcp(53)), 2_000),
        ]
    );
    assert_eq!(maps.port_sets(), 3);

    // Many entries written and retired in a row: each takes a free slot,
    // retired ones wait out their grace period before they are free.
    for i in 0..300u32 {
        let a = IpAddr::from([10, 1, (i >> 8) as u8, i as u8]);
        maps.set(9, a, &tcp(443), None, 1).unwrap();
        maps.clear(9, a).unwrap();
    }
    maps.set(9, ip("10.9.9.9"), &tcp(443), None, 1).unwrap();
    assert_eq!(maps.len(), 3);
}

/// `--dns-held-bytes`: the ring of held DNS frames is created at the size
/// asked; a ring already pinned keeps its size; a size the kernel cannot
/// have is refused by name.
#[test]
#[ignore = "needs root"]
fn the_held_frames_ring_is_created_at_the_size_asked_and_keeps_it() {
    use node_enforcer::datapath::bpf::{check_dns_frames_bytes, LoadOptions};
    palisade_test_support::require_root();
    let root = PinRoot(PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-ring-{}",
        std::process::id()
    )));
    let ring_size = || {
        let data =
            aya::maps::MapData::from_pin(root.0.join(palisade_ebpf::MAP_DNS_FRAMES)).unwrap();
        data.info().unwrap().max_entries()
    };
    let opts = |bytes| LoadOptions {
        dns_frames_bytes: Some(bytes),
        ..Default::default()
    };
    let dp = BpfDatapath::load_opts(&root.0, opts(1 << 16)).unwrap();
    assert_eq!(ring_size(), 1 << 16);
    drop(dp);
    let _dp = BpfDatapath::load_opts(&root.0, opts(1 << 20)).unwrap();
    assert_eq!(ring_size(), 1 << 16, "a pinned ring keeps its size");
    for bad in [0, 4095, 3 << 12, 1 << 31] {
        let e = check_dns_frames_bytes(bad).unwrap_err();
        assert!(e.contains("a power of two from 4096"), "{bad}: {e}");
    }
    assert_eq!(
        check_dns_frames_bytes(palisade_ebpf::DNS_FRAMES_BYTES),
        Ok(())
    );
}
