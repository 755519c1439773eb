//! In-place edits on the real maps, judged by the real programs
//! (BPF_PROG_TEST_RUN): a host peer added under a table in use is allowed
//! at once and established flows keep going; a host peer removed stops new
//! flows at once, and its established flows once the epochs are renewed
//! (which is why the reconciler renews them after every narrowing edit).
//! Needs root and bpffs.

use palisade_test_support::require_root;
use std::net::Ipv4Addr;

use node_enforcer::compile::{PortEntry, PortSet, Prefix};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Datapath, EndpointEntry};
use palisade_ebpf::{VERDICT_DROP, VERDICT_NEXT};

/// Loopback: every namespace has it, and test runs need no attachment.
const IFINDEX: u32 = 1;
const POD: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);

struct PinRoot(std::path::PathBuf);

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ethernet + IPv4 + a TCP segment (ACK) from `src:40000` to the pod's `port`.
fn segment(src: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&40u16.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&POD.octets());
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.resize(14 + 40, 0);
    f[14 + 20 + 12] = 0x50;
    f[14 + 20 + 13] = 0x10; // ACK: a segment conntrack may vouch for (a SYN never is)
    f
}

fn host(last: u8) -> Prefix {
    Prefix::from_ip(Ipv4Addr::new(10, 0, 0, last).into(), 32)
}

fn epochs(root: &std::path::Path) -> (u32, u32) {
    let e = node_enforcer::datapath::inspect::endpoints(root).unwrap()[&IFINDEX];
    (e.ingress().epoch, e.egress().epoch)
}

#[test]
#[ignore = "needs root"]
fn host_peers_edited_in_place_take_effect_and_renewal_stops_revoked_flows() {
    require_root();
    let root = PinRoot(std::path::PathBuf::from(format!(
        "/sys/fs/bpf/palisade-test-in-place-{}",
        std::process::id()
    )));
    let mut dp = BpfDatapath::load(&root.0).expect("load the programs");
    let port_80 = PortSet(
        [PortEntry::Block {
            proto: 6,
            port: 80,
            bits: 16,
        }]
        .into(),
    );
    dp.add_portset(1, &port_80).unwrap();
    dp.add_policy(7, &[(host(1), 1), (host(2), 1)]).unwrap();
    dp.set_endpoint(
        IFINDEX,
        &EndpointEntry {
            ingress: 7,
            egress: 0,
            pod_addrs: vec![POD.to_ipv6_mapped().octets()],
        },
    )
    .unwrap();
    let judge = |dp: &BpfDatapath, from: u8| {
        dp.test_run(
            palisade_ebpf::PROG_TO_POD,
            &segment(Ipv4Addr::new(10, 0, 0, from), 80),
            IFINDEX,
        )
        .unwrap()
    };
    assert_eq!(judge(&dp, 2), VERDICT_NEXT, "10.0.0.2 establishes a flow");
    assert_eq!(judge(&dp, 3), VERDICT_DROP);
    let first = epochs(&root.0);

    // A peer joins: allowed at once, nothing else moves.
    dp.update_policy(7, &[(host(3), 1)], &[]).unwrap();
    assert_eq!(judge(&dp, 3), VERDICT_NEXT);
    assert_eq!(judge(&dp, 2), VERDICT_NEXT);
    assert_eq!(epochs(&root.0), first);

    // A peer leaves: its key is gone, but its established flow still
    // passes on its conntrack entry until the epoch moves...
    dp.update_policy(7, &[], &[host(2)]).unwrap();
    assert_eq!(
        judge(&dp, 2),
        VERDICT_NEXT,
        "established under the current epoch"
    );
    // ...and is judged again, and dropped, once it does.
    dp.renew_epochs(IFINDEX, true, false).unwrap();
    let second = epochs(&root.0);
    assert_ne!(second.0, first.0);
    assert_eq!(second.1, first.1, "egress untouched");
    assert_eq!(judge(&dp, 2), VERDICT_DROP, "revoked at once");
    assert_eq!(judge(&dp, 1), VERDICT_NEXT, "the others stay allowed");
    assert_eq!(judge(&dp, 3), VERDICT_NEXT);

    // Renewing an endpoint that does not exist is an error, not a no-op.
    assert!(dp.renew_epochs(4242, true, true).is_err());
    dp.remove_endpoint(IFINDEX).unwrap();
}
