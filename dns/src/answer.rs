//! Which addresses an answer gives its question, and for how long.
//!
//! The pod asked for the question's name; a policy allows or not by that
//! name. The answer may lead from it through CNAME records (each owner the
//! previous target) to the address records; only records on that chain
//! count, so an answer cannot slip in addresses for a name nobody asked
//! about. Each address is trusted for the least TTL along its chain.

use std::collections::hash_map::{Entry, HashMap};
use std::net::IpAddr;

use crate::name::Name;
use crate::wire::{Message, RData, CLASS_IN, OPCODE_QUERY, RCODE_NOERROR, TYPE_A, TYPE_AAAA};

/// The longest CNAME chain followed; real ones are a handful long.
pub const MAX_CNAME_CHAIN: usize = 16;

/// What one answer teaches: the name asked, and each address with its TTL
/// in seconds (duplicates merged to the least TTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub name: Name,
    pub addrs: Vec<(IpAddr, u32)>,
}

/// Why an answer teaches nothing (each counted by the enforcer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unlearnable {
    #[error("the message is a query, not a response")]
    NotAResponse,
    #[error("opcode {0} is not a standard query")]
    Opcode(u8),
    #[error("response code {0} is not NOERROR")]
    Rcode(u8),
    #[error("question class {0} is not IN")]
    Class(u16),
    #[error("question type {0} is neither A nor AAAA")]
    QueryType(u16),
    #[error("the CNAME chain is longer than {MAX_CNAME_CHAIN} or loops")]
    Chain,
}

/// The addresses `msg` gives its question.
pub fn resolve(msg: &Message) -> Result<Resolution, Unlearnable> {
    let h = &msg.header;
    let q = &msg.question;
    if !h.response {
        return Err(Unlearnable::NotAResponse);
    }
    if h.opcode != OPCODE_QUERY {
        return Err(Unlearnable::Opcode(h.opcode));
    }
    if h.rcode != RCODE_NOERROR {
        return Err(Unlearnable::Rcode(h.rcode));
    }
    if q.qclass != CLASS_IN {
        return Err(Unlearnable::Class(q.qclass));
    }
    if q.qtype != TYPE_A && q.qtype != TYPE_AAAA {
        return Err(Unlearnable::QueryType(q.qtype));
    }
    let in_class = || msg.answers.iter().filter(|r| r.class == CLASS_IN);
    // Walk the chain from the question's name.
    let mut owner = &q.name;
    let mut ttl = u32::MAX;
    let mut hops = 0;
    while let Some((target, t)) = in_class().find_map(|r| match &r.data {
        RData::Cname(target) if &r.name == owner => Some((target, r.ttl)),
        _ => None,
    }) {
        hops += 1;
        if hops > MAX_CNAME_CHAIN {
            return Err(Unlearnable::Chain);
        }
        ttl = ttl.min(t);
        owner = target;
    }
    // In the answer's order (a client tries the first); a duplicate keeps
    // the first place and the least TTL. Indexed, so that a message of
    // thousands of records costs linear time.
    let mut addrs: Vec<(IpAddr, u32)> = Vec::new();
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    for r in in_class().filter(|r| &r.name == owner && r.rtype == q.qtype) {
        let addr = match r.data {
            RData::A(a) => IpAddr::V4(a),
            RData::Aaaa(a) => IpAddr::V6(a),
            _ => continue,
        };
        let t = ttl.min(r.ttl);
        match seen.entry(addr) {
            Entry::Occupied(i) => addrs[*i.get()].1 = addrs[*i.get()].1.min(t),
            Entry::Vacant(v) => {
                v.insert(addrs.len());
                addrs.push((addr, t));
            }
        }
    }
    Ok(Resolution {
        name: q.name.clone(),
        addrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::{name, rec, response};
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(i: u8) -> RData {
        RData::A(Ipv4Addr::new(192, 0, 2, i))
    }

    fn ip(i: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, i))
    }

    #[test]
    fn direct_addresses() {
        let m = response(
            1,
            "api.example.com",
            TYPE_A,
            vec![
                rec("api.example.com", 30, v4(1)),
                rec("API.Example.com", 20, v4(2)),
            ],
        );
        let r = resolve(&m).unwrap();
        assert_eq!(r.name, name("api.example.com"));
        assert_eq!(r.addrs, vec![(ip(1), 30), (ip(2), 20)]);
    }

    #[test]
    fn a_cname_chain_is_followed_with_its_least_ttl() {
        let m = response(
            1,
            "api.example.com",
            TYPE_A,
            vec![
                // Out of order, as the RFC allows.
                rec("b.cdn.net", 300, v4(3)),
                rec("a.cdn.net", 10, RData::Cname(name("b.cdn.net"))),
                rec("api.example.com", 60, RData::Cname(name("a.cdn.net"))),
                // Not on the chain: an address for a name not asked.
                rec("evil.example.org", 300, v4(66)),
                // On the chain's middle, not its end: not an answer.
                rec("a.cdn.net", 300, v4(77)),
            ],
        );
        assert_eq!(resolve(&m).unwrap().addrs, vec![(ip(3), 10)]);
    }

    #[test]
    fn only_the_asked_type_counts() {
        let six: Ipv6Addr = "2001:db8::5".parse().unwrap();
        let m = response(
            1,
            "a.b",
            TYPE_AAAA,
            vec![rec("a.b", 30, v4(1)), rec("a.b", 30, RData::Aaaa(six))],
        );
        assert_eq!(resolve(&m).unwrap().addrs, vec![(IpAddr::V6(six), 30)]);
        let m = response(1, "a.b", TYPE_A, vec![rec("a.b", 30, RData::Aaaa(six))]);
        assert!(resolve(&m).unwrap().addrs.is_empty());
    }

    #[test]
    fn order_is_the_answers_and_thousands_of_records_are_cheap() {
        let m = response(
            1,
            "a.b",
            TYPE_A,
            vec![rec("a.b", 30, v4(9)), rec("a.b", 30, v4(3))],
        );
        assert_eq!(resolve(&m).unwrap().addrs, vec![(ip(9), 30), (ip(3), 30)]);
        // As many A records as a 64 KiB message holds, half of them twice.
        let recs: Vec<_> = (0..4000u32)
            .map(|i| rec("a.b", 30, RData::A(Ipv4Addr::from(0x0A00_0000 + i % 2000))))
            .collect();
        let bytes = response(1, "a.b", TYPE_A, recs).encode();
        assert!(bytes.len() <= 65535);
        let got = resolve(&Message::parse(&bytes).unwrap()).unwrap();
        assert_eq!(got.addrs.len(), 2000);
    }

    #[test]
    fn duplicates_keep_the_least_ttl() {
        let m = response(
            1,
            "a.b",
            TYPE_A,
            vec![rec("a.b", 30, v4(1)), rec("a.b", 5, v4(1))],
        );
        assert_eq!(resolve(&m).unwrap().addrs, vec![(ip(1), 5)]);
    }

    #[test]
    fn loops_and_long_chains_teach_nothing() {
        let m = response(
            1,
            "a.b",
            TYPE_A,
            vec![
                rec("a.b", 1, RData::Cname(name("c.d"))),
                rec("c.d", 1, RData::Cname(name("a.b"))),
                rec("a.b", 1, v4(1)),
            ],
        );
        assert_eq!(resolve(&m), Err(Unlearnable::Chain));
        let mut chain: Vec<_> = (0..MAX_CNAME_CHAIN)
            .map(|i| {
                rec(
                    &format!("n{i}.x"),
                    1,
                    RData::Cname(name(&format!("n{}.x", i + 1))),
                )
            })
            .collect();
        chain.push(rec(&format!("n{MAX_CNAME_CHAIN}.x"), 1, v4(9)));
        assert_eq!(
            resolve(&response(1, "n0.x", TYPE_A, chain.clone()))
                .unwrap()
                .addrs,
            vec![(ip(9), 1)]
        );
        chain.insert(0, rec("pre.x", 1, RData::Cname(name("n0.x"))));
        assert_eq!(
            resolve(&response(1, "pre.x", TYPE_A, chain)),
            Err(Unlearnable::Chain)
        );
    }

    #[test]
    fn what_is_not_a_usable_answer() {
        let ok = response(1, "a.b", TYPE_A, vec![rec("a.b", 1, v4(1))]);
        let mut m = ok.clone();
        m.header.response = false;
        assert_eq!(resolve(&m), Err(Unlearnable::NotAResponse));
        let mut m = ok.clone();
        m.header.opcode = 2;
        assert_eq!(resolve(&m), Err(Unlearnable::Opcode(2)));
        let mut m = ok.clone();
        m.header.rcode = 3;
        assert_eq!(resolve(&m), Err(Unlearnable::Rcode(3)));
        let mut m = ok.clone();
        m.question.qclass = 3;
        assert_eq!(resolve(&m), Err(Unlearnable::Class(3)));
        let mut m = ok.clone();
        m.question.qtype = 255;
        assert_eq!(resolve(&m), Err(Unlearnable::QueryType(255)));
        // A record of another class, even on the chain, is not read.
        let mut m = ok;
        m.answers[0].class = 3;
        assert!(resolve(&m).unwrap().addrs.is_empty());
    }
}
