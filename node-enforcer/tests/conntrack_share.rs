//! Each pod hook's count of its conntrack entries, kept right by the
//! cleanup (DESIGN invariant 17): entries no program counted (an older
//! version's, or ones the LRU evicted or anyone removed behind the
//! programs' back) are recounted by a pass, on the real pinned maps.
//! Needs root and bpffs.

use node_enforcer::conntrack::{monotonic_ns, sweep};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use palisade_ebpf::{Ct4Key, CtKey, CtValue, Tuple, HOOK_FROM_POD, HOOK_TO_POD};
use palisade_test_support::require_root;

const POD: u32 = 7;
const GONE: u32 = 8;

struct PinRoot(std::path::PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn entry(ifindex: u32, sport: u16, hook: u8) -> CtKey {
    CtKey::new(
        Tuple {
            src: "10.0.0.2".parse().unwrap(),
            sport,
            dst: "10.0.1.5".parse().unwrap(),
            dport: 80,
            proto: 6,
        },
        ifindex,
        hook,
    )
}

#[test]
#[ignore = "needs root"]
fn a_cleanup_pass_recounts_what_each_pod_hook_holds() {
    require_root();
    let root = PinRoot(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-ct-share-{}",
        std::process::id()
    )));
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    dp.set_endpoint(
        POD,
        &EndpointEntry {
            ingress: 0,
            egress: 0,
            pod_addrs: vec![],
        },
    )
    .unwrap();
    let mut maps = sweep::open(&root.0, sweep::Asking::with(sweep::AskWith::Dump)).unwrap();
    // Seen long after any pass begins: no pass removes them.
    let live = CtValue {
        last_seen_ns: monotonic_ns() + 3_600_000_000_000,
        epoch: 1,
        pad: 0,
    };
    for sport in 0..5 {
        maps.insert(entry(POD, 40000 + sport, HOOK_FROM_POD), live)
            .unwrap();
    }
    for sport in 0..2 {
        maps.insert(entry(POD, 50000 + sport, HOOK_TO_POD), live)
            .unwrap();
    }
    // An interface with no endpoint: counted for nobody.
    maps.insert(entry(GONE, 40000, HOOK_FROM_POD), live)
        .unwrap();
    assert_eq!(
        maps.shares.held(POD),
        Some([0, 0]),
        "written behind the programs' back"
    );
    assert_eq!(maps.shares.held(GONE), None);

    let report = sweep::sweep(&mut maps).unwrap();
    assert_eq!(report.shares_corrected, 2, "{report:?}");
    assert_eq!(maps.shares.held(POD), Some([5, 2]));

    // Three go unseen by the programs (as LRU evictions do).
    for sport in 0..3 {
        let k = Ct4Key::of(&entry(POD, 40000 + sport, HOOK_FROM_POD)).unwrap();
        maps.v4.remove(&k).unwrap();
    }
    let report = sweep::sweep(&mut maps).unwrap();
    assert_eq!(report.shares_corrected, 1, "{report:?}");
    assert_eq!(maps.shares.held(POD), Some([2, 2]));
    let report = sweep::sweep(&mut maps).unwrap();
    assert_eq!(report.shares_corrected, 0, "right already: {report:?}");
}
