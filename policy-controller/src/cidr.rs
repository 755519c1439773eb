//! Addresses and CIDRs as text, in the two modes the controller reads them:
//!
//! - **strict**, for what Palisade enforces (an ipBlock, a PolicyEndpoint's
//!   entry): an address and a prefix length as `ipnet` reads them, and host
//!   bits set are refused, since what was meant is not clear ([`parse_strict`], and
//!   [`parse_strict_or_address`] where a bare address means its host
//!   prefix);
//! - **sloppy**, as the API server validates (Go's `ParseIPSloppy` and
//!   `ParseCIDRSloppy`): IPv4 octets may carry leading zeros, read as
//!   decimal, and host bits are masked ([`parse_sloppy`],
//!   [`parse_ip_sloppy`]).
//!
//! A manifest is validated sloppily (so it is refused exactly when `kubectl
//! apply` would refuse it), then resolved strictly (so a CIDR the API server
//! takes but whose meaning is unclear is named as an error and left out).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use palisade_proto::v1::IpPrefix;

/// Why a strict parse refused its text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CidrError {
    #[error("{text:?} is not a CIDR (want e.g. 10.0.0.0/8 or fd00::/64)")]
    NotACidr {
        text: String,
        #[source]
        cause: ipnet::AddrParseError,
    },
    #[error("{text:?} is not an address or a CIDR")]
    NotAnAddress {
        text: String,
        #[source]
        cause: std::net::AddrParseError,
    },
    #[error("{text:?} has host bits set (did you mean {network}?)")]
    HostBitsSet { text: String, network: IpNet },
}

/// A CIDR without host bits set.
pub fn parse_strict(s: &str) -> Result<IpNet, CidrError> {
    let net: IpNet = s.parse().map_err(|cause| CidrError::NotACidr {
        text: s.to_string(),
        cause,
    })?;
    if net.trunc() != net {
        return Err(CidrError::HostBitsSet {
            text: s.to_string(),
            network: net.trunc(),
        });
    }
    Ok(net)
}

/// A strict CIDR, or a bare address as its host prefix (the AWS controller
/// writes pod peers and ClusterIPs that way).
pub fn parse_strict_or_address(s: &str) -> Result<IpNet, CidrError> {
    if s.contains('/') {
        return parse_strict(s);
    }
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|cause| CidrError::NotAnAddress {
            text: s.to_string(),
            cause,
        })
}

/// An address as Go's ParseIPSloppy reads it: IPv4 octets may carry leading
/// zeros (read as decimal), which the API server's legacy IP fields accept.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let octets: Vec<&str> = s.split('.').collect();
    if octets.len() != 4 {
        return None;
    }
    let mut out = [0u8; 4];
    for (o, part) in out.iter_mut().zip(&octets) {
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = part.parse().ok()?;
    }
    Some(IpAddr::V4(Ipv4Addr::from(out)))
}

/// A CIDR as Go's ParseCIDRSloppy reads it; host bits may be set (the
/// network is the masked one).
pub fn parse_sloppy(s: &str) -> Option<IpNet> {
    let (addr, len) = s.split_once('/')?;
    let ip = parse_ip_sloppy(addr)?;
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    IpNet::new(ip, len).ok().map(|n| n.trunc())
}

/// A network as the plan carries it.
pub fn prefix(net: IpNet) -> IpPrefix {
    IpPrefix::new(net.addr(), net.prefix_len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn strict_takes_canonical_networks_only() {
        assert_eq!(parse_strict("10.0.0.0/8"), Ok(net("10.0.0.0/8")));
        assert_eq!(parse_strict("fd00::/64"), Ok(net("fd00::/64")));
        assert_eq!(
            parse_strict("10.0.0.1/8").unwrap_err().to_string(),
            "\"10.0.0.1/8\" has host bits set (did you mean 10.0.0.0/8?)"
        );
        // ipnet reads IPv4 octets with leading zeros as decimal, as the API
        // server's validation does.
        assert_eq!(parse_strict("010.0.0.0/8"), Ok(net("10.0.0.0/8")));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", ""] {
            let e = parse_strict(bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{bad:?} is not a CIDR (want e.g. 10.0.0.0/8 or fd00::/64)")
            );
            assert!(std::error::Error::source(&e).is_some(), "{bad}: the cause");
        }
    }

    #[test]
    fn strict_or_address_reads_a_bare_address_as_its_host_prefix() {
        assert_eq!(parse_strict_or_address("10.0.0.1"), Ok(net("10.0.0.1/32")));
        assert_eq!(parse_strict_or_address("fd00::1"), Ok(net("fd00::1/128")));
        assert_eq!(parse_strict_or_address("10.0.0.0/8"), Ok(net("10.0.0.0/8")));
        assert_eq!(
            parse_strict_or_address("10.0.0.1/8")
                .unwrap_err()
                .to_string(),
            "\"10.0.0.1/8\" has host bits set (did you mean 10.0.0.0/8?)"
        );
        assert_eq!(
            parse_strict_or_address("010.0.0.1")
                .unwrap_err()
                .to_string(),
            "\"010.0.0.1\" is not an address or a CIDR"
        );
    }

    #[test]
    fn sloppy_reads_as_go_does() {
        assert_eq!(
            parse_ip_sloppy("010.001.0.1"),
            Some("10.1.0.1".parse().unwrap())
        );
        assert_eq!(parse_ip_sloppy("1.2.3"), None);
        assert_eq!(parse_ip_sloppy("256.0.0.1"), None);
        assert_eq!(parse_ip_sloppy("fd00::1"), Some("fd00::1".parse().unwrap()));
        assert_eq!(parse_sloppy("10.0.0.1/24"), Some(net("10.0.0.0/24")));
        assert_eq!(parse_sloppy("010.0.0.0/08"), Some(net("10.0.0.0/8")));
        assert_eq!(parse_sloppy("::/0"), Some(net("::/0")));
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/",
            "x/8",
            "fd00::/129",
            "10.0.0.0/-1",
            "10.0.0.0/0008",
        ] {
            assert_eq!(parse_sloppy(bad), None, "{bad}");
        }
    }
}
