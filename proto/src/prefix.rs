//! The wire's address prefix (`IpPrefix`) and the standard library's
//! addresses: the one conversion each way, for the controller and the
//! enforcer. On the wire an IPv4 address is 4 bytes and an IPv6 one 16.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::v1::IpPrefix;

impl IpPrefix {
    /// `ip/len` as the wire carries it.
    pub fn new(ip: IpAddr, len: u8) -> IpPrefix {
        IpPrefix {
            addr: match ip {
                IpAddr::V4(a) => a.octets().to_vec(),
                IpAddr::V6(a) => a.octets().to_vec(),
            },
            prefix_len: u32::from(len),
        }
    }

    /// One address: /32 or /128.
    pub fn host(ip: IpAddr) -> IpPrefix {
        IpPrefix::new(ip, if ip.is_ipv4() { 32 } else { 128 })
    }

    /// The address, when it has the length of one (4 or 16 bytes); the
    /// prefix length is the caller's to check.
    pub fn ip(&self) -> Option<IpAddr> {
        match self.addr.len() {
            4 => <[u8; 4]>::try_from(self.addr.as_slice())
                .ok()
                .map(|a| IpAddr::V4(Ipv4Addr::from(a))),
            16 => <[u8; 16]>::try_from(self.addr.as_slice())
                .ok()
                .map(|a| IpAddr::V6(Ipv6Addr::from(a))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_go_to_the_wire_and_back() {
        for (s, len) in [("10.1.2.3", 32u32), ("fd00::7", 128)] {
            let ip: IpAddr = s.parse().unwrap();
            let p = IpPrefix::host(ip);
            assert_eq!(p.prefix_len, len);
            assert_eq!(p.addr.len(), if ip.is_ipv4() { 4 } else { 16 });
            assert_eq!(p.ip(), Some(ip));
        }
        let net = IpPrefix::new("10.0.0.0".parse().unwrap(), 8);
        assert_eq!(
            (net.addr.as_slice(), net.prefix_len),
            (&[10, 0, 0, 0][..], 8)
        );
        for bad in [vec![], vec![1, 2, 3], vec![0; 5], vec![0; 17]] {
            let p = IpPrefix {
                addr: bad.clone(),
                prefix_len: 0,
            };
            assert_eq!(p.ip(), None, "{bad:?}");
        }
    }
}
