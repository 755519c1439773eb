//! Which plan rule decided a flow: for a NetworkPolicy direction, the first
//! rule of the pod's direction policy that matches the peer, protocol and
//! port; with tiers, the rule the chain stops at (`decided_by`), by the
//! same reading of a rule as `compile` (a peer block's CIDR minus its
//! excepts; no ports means every protocol and port; port 0 every port of
//! the protocol; a rule without peer blocks matches nothing).

use std::net::IpAddr;

use palisade_proto::v1::{
    DirectionPolicy, PeerBlock, PortRange, Protocol, Rule, TierAction, TierRule,
};

use crate::compile::Prefix;

/// The first rule of `policy` that allows `peer` on `proto`/`port`, with
/// its position in the plan.
pub fn first_matching_rule(
    policy: &DirectionPolicy,
    peer: IpAddr,
    proto: u8,
    port: u16,
) -> Option<&Rule> {
    let peer = Prefix::from_ip(peer, if peer.is_ipv4() { 32 } else { 128 });
    policy
        .rules
        .iter()
        .find(|r| peers_match(r, &peer) && ports_match(&r.ports, proto, port))
}

/// What decided a flow in a direction's tier chain.
#[derive(Debug, PartialEq)]
pub enum Decided<'a> {
    /// A ClusterNetworkPolicy rule that accepted or denied it (`tier`:
    /// "Admin" or "Baseline").
    Tier {
        tier: &'static str,
        rule: &'a TierRule,
    },
    /// NetworkPolicy isolates the direction: the rule that allowed it, or
    /// None when none did (denied).
    NetworkPolicy(Option<&'a Rule>),
    /// No tier decided and no NetworkPolicy isolates: the default.
    Default,
}

/// The rule `policy`'s tier chain stops at for `peer` on `proto`/`port`
/// (see `compile::tiers`); a Pass goes on to the next tier.
pub fn decided_by(policy: &DirectionPolicy, peer: IpAddr, proto: u8, port: u16) -> Decided<'_> {
    let host = Prefix::from_ip(peer, if peer.is_ipv4() { 32 } else { 128 });
    let tier = |rules| tier_decides(rules, &host, proto, port);
    if let Some(rule) = tier(&policy.admin) {
        return Decided::Tier {
            tier: "Admin",
            rule,
        };
    }
    if !policy.not_isolated {
        return Decided::NetworkPolicy(first_matching_rule(policy, peer, proto, port));
    }
    match tier(&policy.baseline) {
        Some(rule) => Decided::Tier {
            tier: "Baseline",
            rule,
        },
        None => Decided::Default,
    }
}

/// The tier's first matching rule, unless it passes.
fn tier_decides<'a>(
    rules: &'a [TierRule],
    host: &Prefix,
    proto: u8,
    port: u16,
) -> Option<&'a TierRule> {
    rules
        .iter()
        .find(|r| blocks_match(&r.peers, host) && ports_match(&r.ports, proto, port))
        .filter(|r| TierAction::try_from(r.action) != Ok(TierAction::Pass))
}

fn peers_match(rule: &Rule, peer: &Prefix) -> bool {
    blocks_match(&rule.peers, peer)
}

fn blocks_match(blocks: &[PeerBlock], peer: &Prefix) -> bool {
    blocks.iter().any(|block| {
        let Some(cidr) = block.cidr.as_ref().and_then(|c| Prefix::from_wire(c).ok()) else {
            return false;
        };
        cidr.contains(peer)
            && !block
                .except
                .iter()
                .filter_map(|e| Prefix::from_wire(e).ok())
                .any(|e| e.contains(peer))
    })
}

fn ports_match(ports: &[PortRange], proto: u8, port: u16) -> bool {
    ports.is_empty()
        || ports.iter().any(|r| {
            let p = match Protocol::try_from(r.protocol) {
                Ok(Protocol::Tcp) => 6,
                Ok(Protocol::Udp) => 17,
                Ok(Protocol::Sctp) => 132,
                _ => return false,
            };
            let end = if r.end_port == 0 { r.port } else { r.end_port };
            p == proto && (r.port == 0 || (r.port..=end).contains(&u32::from(port)))
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use palisade_proto::v1::{IpPrefix, PeerBlock};

    pub fn prefix(s: &str) -> IpPrefix {
        let (a, len) = s.split_once('/').unwrap();
        let addr: IpAddr = a.parse().unwrap();
        IpPrefix {
            addr: match addr {
                IpAddr::V4(v4) => v4.octets().to_vec(),
                IpAddr::V6(v6) => v6.octets().to_vec(),
            },
            prefix_len: len.parse().unwrap(),
        }
    }

    pub fn rule(
        policy: &str,
        index: u32,
        cidr: &str,
        except: &[&str],
        ports: &[(i32, u32, u32)],
    ) -> Rule {
        Rule {
            peers: vec![PeerBlock {
                cidr: Some(prefix(cidr)),
                except: except.iter().map(|e| prefix(e)).collect(),
            }],
            ports: ports
                .iter()
                .map(|&(protocol, port, end_port)| PortRange {
                    protocol,
                    port,
                    end_port,
                })
                .collect(),
            policy: policy.into(),
            rule_index: index,
            domain_names: vec![],
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const TCP: i32 = Protocol::Tcp as i32;
    const UDP: i32 = Protocol::Udp as i32;

    fn decided(p: &DirectionPolicy, peer: &str, proto: u8, port: u16) -> Option<(String, u32)> {
        first_matching_rule(p, ip(peer), proto, port).map(|r| (r.policy.clone(), r.rule_index))
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let p = DirectionPolicy {
            rules: vec![
                rule(
                    "ns/web",
                    0,
                    "10.0.1.0/24",
                    &["10.0.1.128/25"],
                    &[(TCP, 80, 0)],
                ),
                rule("ns/web", 1, "10.0.0.0/16", &[], &[(TCP, 8000, 8080)]),
                rule("ns/dns", 0, "0.0.0.0/0", &[], &[(UDP, 0, 0)]),
                rule("ns/any", 2, "10.0.1.0/24", &[], &[]),
            ],
            ..Default::default()
        };
        assert_eq!(decided(&p, "10.0.1.5", 6, 80), Some(("ns/web".into(), 0)));
        // The except leaves it to a later rule.
        assert_eq!(decided(&p, "10.0.1.200", 6, 80), Some(("ns/any".into(), 2)));
        assert_eq!(decided(&p, "10.0.9.9", 6, 8080), Some(("ns/web".into(), 1)));
        assert_eq!(decided(&p, "10.0.9.9", 6, 8081), None);
        assert_eq!(decided(&p, "192.0.2.1", 17, 53), Some(("ns/dns".into(), 0)));
        assert_eq!(decided(&p, "10.0.1.7", 132, 9), Some(("ns/any".into(), 2)));
        assert_eq!(
            decided(&p, "fd00::1", 17, 53),
            None,
            "IPv4 blocks never match IPv6"
        );
    }

    #[test]
    fn a_rule_without_peers_matches_nothing_and_port_zero_only_whole_protocols() {
        let mut no_peers = rule("ns/x", 0, "0.0.0.0/0", &[], &[]);
        no_peers.peers.clear();
        let p = DirectionPolicy {
            rules: vec![no_peers, rule("ns/y", 3, "fd00::/8", &[], &[(TCP, 443, 0)])],
            ..Default::default()
        };
        assert_eq!(decided(&p, "10.0.0.1", 6, 443), None);
        assert_eq!(decided(&p, "fd00::5", 6, 443), Some(("ns/y".into(), 3)));
        // A later IPv4 fragment carries no ports: port 0 matches no range.
        assert_eq!(decided(&p, "fd00::5", 6, 0), None);
    }
}
