//! The node's addresses as the enforcer reads them (one rtnetlink address
//! dump) are the ones getifaddrs reads from the same kernel, without IPv6
//! link-local ones and those of the Service interfaces (kube-proxy's
//! `kube-ipvs0`, NodeLocal DNSCache's `nodelocaldns`). The first test needs
//! no root: any user may dump addresses.

use std::net::IpAddr;
use std::process::Command;

use node_enforcer::datapath::addresses::{node_addresses, SERVICE_INTERFACES};
use palisade_test_support::require_root;

fn by_getifaddrs() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .unwrap()
        .filter(|ifa| !SERVICE_INTERFACES.contains(&ifa.interface_name.as_str()))
        .filter_map(|ifa| {
            let a = ifa.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .filter(|a| !matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()))
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_address_dump_reads_what_getifaddrs_reads() {
    // Addresses may come and go while other tests run: three tries for one
    // quiet moment in which both readings agree.
    let mut last = None;
    for _ in 0..3 {
        let (ours, theirs) = (node_addresses().unwrap(), by_getifaddrs());
        assert!(
            ours.contains(&"127.0.0.1".parse().unwrap()),
            "loopback missing: {ours:?}"
        );
        if ours == theirs {
            return;
        }
        last = Some((ours, theirs));
    }
    let (ours, theirs) = last.unwrap();
    panic!("address dump {ours:?}\ngetifaddrs   {theirs:?}");
}

fn ip(args: &str) {
    let status = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .expect("run ip");
    assert!(status.success(), "ip {args}: {status}");
}

/// What kube-proxy in IPVS mode and NodeLocal DNSCache leave on a node:
/// their Service addresses are not the node's (every policy would allow
/// them); a node address on an interface of another name (a dummy holding
/// a BGP router id) is.
#[test]
#[ignore = "needs root"]
fn service_interfaces_addresses_are_not_the_nodes() {
    require_root();
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        ip("link set lo up");
        for (name, addrs) in [
            ("kube-ipvs0", ["10.96.0.1/32", "fd00:96::1/128"]),
            ("nodelocaldns", ["169.254.20.10/32", "10.96.0.10/32"]),
            ("router-id", ["192.0.2.7/32", "fd00:7::7/128"]),
        ] {
            // Dummies in a cluster; this kernel has no dummy driver, and
            // only the name matters.
            ip(&format!("link add {name} type veth peer name {name}-p"));
            for a in addrs {
                ip(&format!("addr add {a} dev {name} nodad"));
            }
            ip(&format!("link set {name} up"));
        }
        // An address another interface carries too is the node's.
        ip("addr add 10.96.0.1/32 dev router-id");
        let got = node_addresses().unwrap();
        let want: Vec<IpAddr> = ["10.96.0.1", "127.0.0.1", "192.0.2.7", "::1", "fd00:7::7"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(got, want);
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}
