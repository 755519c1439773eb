//! The node's addresses as the enforcer reads them (one rtnetlink address
//! dump) are the ones getifaddrs reads from the same kernel, without IPv6
//! link-local ones. Needs no root: any user may dump addresses.

use std::net::IpAddr;

use node_enforcer::datapath::addresses::node_addresses;

fn by_getifaddrs() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .unwrap()
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
