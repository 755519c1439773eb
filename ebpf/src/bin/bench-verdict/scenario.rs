//! What is measured: the rows, and one pod's egress policy of n CIDR rules
//! with a peer it allows and one it denies. Pure: no kernel here.

use std::collections::HashSet;
use std::net::Ipv4Addr;

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
}

impl Row {
    pub const ALL: [Row; 12] = [
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
        }
    }

    /// Measured through the wrapper, whose cost is subtracted.
    pub fn through_wrapper(self) -> bool {
        matches!(
            self,
            Row::NewAllowed | Row::NewAllowedCtFull | Row::NewAllowedUdp | Row::NewAllowedUdpCtFull
        )
    }
}

/// The rows of round `round`, rotated so that no row always runs first
/// (or right after the conntrack fill of another).
pub fn round_order(round: usize) -> Vec<Row> {
    let mut rows = Row::ALL.to_vec();
    rows.rotate_left(round % Row::ALL.len());
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

#[cfg(test)]
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
        let firsts: HashSet<Row> = (0..Row::ALL.len()).map(|r| round_order(r)[0]).collect();
        assert_eq!(firsts.len(), Row::ALL.len());
        for r in 0..Row::ALL.len() {
            let mut rows = round_order(r);
            rows.sort();
            assert_eq!(rows, Row::ALL.to_vec());
        }
    }
}
