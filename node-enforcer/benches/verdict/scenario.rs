//! What is measured: the rows, and one pod's egress policy of n CIDR rules
//! with a peer it allows and one it denies, alone or behind Admin tier
//! rules of ClusterNetworkPolicies. Pure: no kernel here.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use palisade_proto::v1::{
    DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule, TierAction, TierRule,
};

/// One measurement of a round, in the order a round first takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Row {
    /// The floor: direct-access parse, TC_ACT_OK.
    Bare,
    /// The new-flow wrapper tail-calling a program that returns at once.
    Wrapper,
    /// A forward packet of a flow allowed under the current epoch.
    EstablishedFwd,
    /// The same through the build that reads every header by copy (the
    /// fallback for headers in paged data): what direct access saves.
    EstablishedFwdByCopy,
    /// A reply to such a flow, on the pod's other hook.
    EstablishedReply,
    /// A new TCP connection (its SYN) policy allows, conntrack empty at the
    /// start of the run.
    NewAllowed,
    /// The same, conntrack full (every insert evicts).
    NewAllowedCtFull,
    /// A new UDP flow policy allows, conntrack empty: no SYN tells it is
    /// new, so it pays both conntrack lookups before policy.
    NewAllowedUdp,
    /// The same, conntrack full.
    NewAllowedUdpCtFull,
    /// A new flow policy denies.
    NewDenied,
    /// A later fragment of a datagram whose first fragment policy allowed:
    /// judged by that first fragment's record.
    FragmentAllowed,
    /// A later fragment of a datagram whose first fragment policy denied.
    FragmentDenied,
    /// [`Row::EstablishedFwd`] of a pod whose direction has Admin rules
    /// in front of the same NetworkPolicy rules (a table of its own).
    EstablishedFwdTiers,
    /// [`Row::NewAllowed`] of that pod: the same flow, allowed.
    NewAllowedTiers,
    /// [`Row::NewDenied`] of that pod: the same flow, denied.
    NewDeniedTiers,
}

impl Row {
    pub const ALL: [Row; 15] = [
        Row::Bare,
        Row::Wrapper,
        Row::EstablishedFwd,
        Row::EstablishedFwdByCopy,
        Row::EstablishedReply,
        Row::NewAllowed,
        Row::NewAllowedCtFull,
        Row::NewAllowedUdp,
        Row::NewAllowedUdpCtFull,
        Row::NewDenied,
        Row::FragmentAllowed,
        Row::FragmentDenied,
        Row::EstablishedFwdTiers,
        Row::NewAllowedTiers,
        Row::NewDeniedTiers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Row::Bare => "bare",
            Row::Wrapper => "wrapper",
            Row::EstablishedFwd => "established_fwd",
            Row::EstablishedFwdByCopy => "established_fwd_by_copy",
            Row::EstablishedReply => "established_reply",
            Row::NewAllowed => "new_allowed",
            Row::NewAllowedCtFull => "new_allowed_ctfull",
            Row::NewAllowedUdp => "new_allowed_udp",
            Row::NewAllowedUdpCtFull => "new_allowed_udp_ctfull",
            Row::NewDenied => "new_denied",
            Row::FragmentAllowed => "fragment_allowed",
            Row::FragmentDenied => "fragment_denied",
            Row::EstablishedFwdTiers => "established_fwd_tiers",
            Row::NewAllowedTiers => "new_allowed_tiers",
            Row::NewDeniedTiers => "new_denied_tiers",
        }
    }

    /// Measured on a table with Admin rules (the others: NetworkPolicy's
    /// table alone).
    pub fn tiered(self) -> bool {
        matches!(
            self,
            Row::EstablishedFwdTiers | Row::NewAllowedTiers | Row::NewDeniedTiers
        )
    }

    /// Measured through the wrapper, whose cost is subtracted.
    pub fn through_wrapper(self) -> bool {
        matches!(
            self,
            Row::NewAllowed
                | Row::NewAllowedCtFull
                | Row::NewAllowedUdp
                | Row::NewAllowedUdpCtFull
                | Row::NewAllowedTiers
        )
    }
}

/// The measurements of round `round` at one rule count, as (row, Admin
/// rules): every NetworkPolicy row (0 Admin rules) and every tiered row at
/// each of `admin`, rotated so that no row always runs first (or right
/// after the conntrack fill of another).
pub fn round_order(round: usize, admin: &[usize]) -> Vec<(Row, usize)> {
    let mut rows: Vec<(Row, usize)> = Row::ALL
        .iter()
        .filter(|r| !r.tiered())
        .map(|&r| (r, 0))
        .collect();
    for &a in admin {
        rows.extend(Row::ALL.iter().filter(|r| r.tiered()).map(|&r| (r, a)));
    }
    let n = rows.len();
    rows.rotate_left(round % n);
    rows
}

/// A pod's egress policy of `n` CIDR rules, a peer one of them allows and a
/// peer none of them does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub rules: Vec<(Ipv4Addr, u8)>,
    pub allowed_peer: Ipv4Addr,
    pub denied_peer: Ipv4Addr,
}

/// `n` (at least 1) distinct rules in 10.0.0.0/8 made as a controller
/// would from pod selectors and ipBlocks: nine in ten a pod's /32, one in
/// ten a /24. Pseudo-random but the same for the same `n` and `seed`.
/// The denied peer differs from a /32 rule in its last bit only, so its
/// lookup walks as deep into the trie as a miss can.
pub fn policy(n: usize, seed: u64) -> Policy {
    assert!(n > 0, "a policy of no rules has no allowed peer");
    let mut rng = XorShift(seed | 1);
    let mut seen = HashSet::new();
    let mut rules = Vec::with_capacity(n);
    while rules.len() < n {
        let bits = rng.next() as u32;
        let addr = 0x0a00_0000 | (bits & 0x00ff_ffff);
        let rule = if rules.len() % 10 == 9 {
            (Ipv4Addr::from(addr & 0xffff_ff00), 24)
        } else {
            (Ipv4Addr::from(addr), 32)
        };
        if seen.insert(rule) {
            rules.push(rule);
        }
    }
    let allowed_peer = rules
        .iter()
        .find(|(_, len)| *len == 32)
        .map(|(a, _)| *a)
        .unwrap_or_else(|| host_in(rules[0]));
    let denied_peer = rules
        .iter()
        .filter(|(_, len)| *len == 32)
        .map(|(a, _)| Ipv4Addr::from(u32::from(*a) ^ 1))
        .find(|a| !covered(&rules, *a))
        .or_else(|| {
            (1u32..)
                .map(|i| Ipv4Addr::from(0x0b00_0000 + i))
                .find(|a| !covered(&rules, *a))
        })
        .expect("some address is not covered");
    Policy {
        rules,
        allowed_peer,
        denied_peer,
    }
}

/// The ports every rule of the bench allows: TCP and UDP 80.
pub const PEER_PORT: u16 = 80;

fn prefix(net: Ipv4Addr, len: u8) -> PeerBlock {
    PeerBlock {
        cidr: Some(IpPrefix {
            addr: net.octets().to_vec(),
            prefix_len: u32::from(len),
        }),
        except: vec![],
    }
}

fn port(protocol: Protocol, port: u16, end: u16) -> PortRange {
    PortRange {
        protocol: protocol as i32,
        port: u32::from(port),
        end_port: u32::from(end),
    }
}

/// `n` Admin tier rules as a controller sends them, ClusterNetworkPolicies
/// of five rules each in priority order: Accept, Deny and Pass in turn;
/// one peer each, a pod's /32 three times in four and a /24 otherwise, in
/// the same 10.0.0.0/8 as `policy`'s rules (so they overlap them); every
/// other rule on ports (TCP 443, TCP 8000-8100 or UDP 53), the others on
/// all. None covers `policy`'s allowed or denied peer: the flows measured
/// are decided by its NetworkPolicy rules, behind every Admin rule.
pub fn admin_rules(n: usize, seed: u64, policy: &Policy) -> Vec<TierRule> {
    let mut rng = XorShift(seed | 1);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let i = out.len();
        let addr = 0x0a00_0000 | (rng.next() as u32 & 0x00ff_ffff);
        let peer = if i % 4 == 3 {
            (Ipv4Addr::from(addr & 0xffff_ff00), 24)
        } else {
            (Ipv4Addr::from(addr), 32)
        };
        if covered(&[peer], policy.allowed_peer)
            || covered(&[peer], policy.denied_peer)
            || !seen.insert(peer)
        {
            continue;
        }
        let action = [TierAction::Accept, TierAction::Deny, TierAction::Pass][i % 3];
        let ports = match i % 6 {
            1 => vec![port(Protocol::Tcp, 443, 0)],
            3 => vec![port(Protocol::Tcp, 8000, 8100)],
            5 => vec![port(Protocol::Udp, 53, 0)],
            _ => vec![],
        };
        out.push(TierRule {
            action: action as i32,
            peers: vec![prefix(peer.0, peer.1)],
            ports,
            policy: format!("ClusterNetworkPolicy/bench-{}", i / 5),
            priority: (i / 5) as u32,
            rule_index: (i % 5) as u32,
            rule_name: format!("r{}", i % 5),
            domain_names: vec![],
        });
    }
    out
}

/// The pod's direction as the controller sends it: `admin` in front of
/// `policy`'s rules as one NetworkPolicy rule (a pod selector's peers) on
/// TCP and UDP [`PEER_PORT`], which is what the NetworkPolicy rows' table
/// holds.
pub fn direction(policy: &Policy, admin: Vec<TierRule>) -> DirectionPolicy {
    DirectionPolicy {
        rules: vec![Rule {
            peers: policy
                .rules
                .iter()
                .map(|&(net, len)| prefix(net, len))
                .collect(),
            ports: vec![
                port(Protocol::Tcp, PEER_PORT, 0),
                port(Protocol::Udp, PEER_PORT, 0),
            ],
            ..Default::default()
        }],
        admin,
        baseline: vec![],
        not_isolated: false,
    }
}

fn host_in((net, _): (Ipv4Addr, u8)) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net) | 7)
}

/// Does any rule cover `addr`?
pub fn covered(rules: &[(Ipv4Addr, u8)], addr: Ipv4Addr) -> bool {
    rules.iter().any(|&(net, len)| {
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        u32::from(addr) & mask == u32::from(net) & mask
    })
}

/// Marsaglia's xorshift64: enough to scatter addresses, no crate needed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

// Run from tests/bench_verdict.rs. The bench compiles them too (cfg(test)
// holds without a harness) but runs none, so their helpers go unused there.
#[cfg(test)]
#[allow(unused_imports, dead_code)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_distinct_and_peers_are_judged_as_named() {
        for n in [1, 10, 1000] {
            let p = policy(n, 42);
            assert_eq!(p.rules.len(), n);
            let distinct: HashSet<_> = p.rules.iter().collect();
            assert_eq!(distinct.len(), n);
            assert!(covered(&p.rules, p.allowed_peer), "n={n}");
            assert!(!covered(&p.rules, p.denied_peer), "n={n}");
        }
    }

    #[test]
    fn same_seed_same_policy() {
        assert_eq!(policy(100, 7), policy(100, 7));
        assert_ne!(policy(100, 7).rules, policy(100, 8).rules);
    }

    #[test]
    fn every_row_takes_every_position() {
        let admin = [10, 100];
        let all = round_order(0, &admin);
        let plain = Row::ALL.iter().filter(|r| !r.tiered()).count();
        let tiered = Row::ALL.len() - plain;
        assert_eq!(all.len(), plain + tiered * admin.len());
        let firsts: HashSet<(Row, usize)> =
            (0..all.len()).map(|r| round_order(r, &admin)[0]).collect();
        assert_eq!(firsts.len(), all.len());
        let mut sorted = all.clone();
        sorted.sort();
        for r in 0..all.len() {
            let mut rows = round_order(r, &admin);
            rows.sort();
            assert_eq!(rows, sorted);
        }
        assert!(round_order(3, &[])
            .iter()
            .all(|(r, a)| !r.tiered() && *a == 0));
    }

    #[test]
    fn admin_rules_mix_actions_and_leave_the_measured_flows_alone() {
        let p = policy(1000, 42);
        let rules = admin_rules(100, 7, &p);
        assert_eq!(rules.len(), 100);
        for action in [TierAction::Accept, TierAction::Deny, TierAction::Pass] {
            assert!(rules.iter().any(|r| r.action == action as i32));
        }
        assert!(rules.iter().any(|r| r.ports.is_empty()));
        assert!(rules.iter().any(|r| !r.ports.is_empty()));
        let peers: Vec<(Ipv4Addr, u8)> = rules
            .iter()
            .map(|r| {
                let c = r.peers[0].cidr.as_ref().unwrap();
                let a: [u8; 4] = c.addr.clone().try_into().unwrap();
                (Ipv4Addr::from(a), c.prefix_len as u8)
            })
            .collect();
        assert!(peers.iter().any(|p| p.1 == 24) && peers.iter().any(|p| p.1 == 32));
        assert!(!covered(&peers, p.allowed_peer));
        assert!(!covered(&peers, p.denied_peer));
        let d = direction(&p, rules);
        assert_eq!(d.rules[0].peers.len(), 1000);
        assert_eq!(d.admin.len(), 100);
    }
}
