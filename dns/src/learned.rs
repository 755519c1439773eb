//! The addresses each pod may reach by name.
//!
//! A pod's egress may have several domain rules (each one policy rule's
//! `domainNames` with its ports, in its tier and place); the plan numbers
//! them, and that number is the rule's *slot*. What the datapath needs is,
//! per pod, slot and address, until when a new connection may use it: an
//! *entry*. An answer to a name some rule matches sets, for each of its
//! addresses and each slot whose patterns match the name, the entry's
//! expiry to the answer's time plus its TTL (bounded by [`Limits::ttl`]),
//! never lowering one already later: each entry is justified by one answer
//! within its TTL.
//!
//! The learner also remembers which names gave which addresses, for the
//! state dump, and to rebuild the entries when the pod's rules change
//! (slots renumbered, patterns added or removed). Names, addresses per
//! name, and entries are capped per pod ([`Limits`]); what a cap pushes out
//! is counted, and an entry pushed out is removed from the datapath at
//! once (fail closed: the next connection to it needs a new answer).
//!
//! Every method returns the datapath changes to make, in order.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::net::IpAddr;

use crate::answer::Resolution;
use crate::limits::Limits;
use crate::name::Name;
use crate::pattern::Pattern;
use crate::NS_PER_S;

/// A rule's number among its pod's domain rules.
pub type Slot = u16;

/// One change to the datapath's table of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// New connections from the pod to `addr` match rule `slot` until
    /// `expiry` (the caller's clock, ns).
    Upsert {
        slot: Slot,
        addr: IpAddr,
        expiry: u64,
    },
    Remove {
        slot: Slot,
        addr: IpAddr,
    },
}

/// What one answer did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Learning {
    /// The rules whose patterns matched the name (empty: nothing learned).
    pub slots: Vec<Slot>,
    pub changes: Vec<Change>,
}

/// What the caps pushed out, and answers no rule wanted; cumulative.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counters {
    pub names_evicted: u64,
    pub addrs_evicted: u64,
    pub entries_evicted: u64,
    /// Answers for a name no rule of the pod matches (nothing kept).
    pub unmatched: u64,
}

#[derive(Default)]
struct NameRecord {
    /// Each address with its expiry, as the latest answers gave it.
    addrs: Vec<(IpAddr, u64)>,
    /// When the name was last answered (which name a full pod forgets).
    answered: u64,
}

#[derive(Default)]
struct PodLearned {
    names: HashMap<Name, NameRecord>,
    entries: HashMap<(Slot, IpAddr), u64>,
    /// The same entries ordered by expiry: what expires next, what a full
    /// pod drops first.
    by_expiry: BTreeSet<(u64, Slot, IpAddr)>,
}

impl PodLearned {
    /// Raises an entry's expiry (never lowers it); returns the change.
    fn raise(&mut self, slot: Slot, addr: IpAddr, expiry: u64) -> Option<Change> {
        let current = self.entries.entry((slot, addr)).or_insert(0);
        if *current >= expiry {
            return None;
        }
        self.by_expiry.remove(&(*current, slot, addr));
        *current = expiry;
        self.by_expiry.insert((expiry, slot, addr));
        Some(Change::Upsert { slot, addr, expiry })
    }

    fn remove(&mut self, slot: Slot, addr: IpAddr) -> Option<Change> {
        let expiry = self.entries.remove(&(slot, addr))?;
        self.by_expiry.remove(&(expiry, slot, addr));
        Some(Change::Remove { slot, addr })
    }

    /// Removes the entry that expires first.
    fn pop_soonest(&mut self) -> Option<Change> {
        let (_, slot, addr) = *self.by_expiry.first()?;
        self.remove(slot, addr)
    }
}

/// The slots of `rules` whose patterns match `name`.
pub fn matching_slots(rules: &[Vec<Pattern>], name: &Name) -> Vec<Slot> {
    rules
        .iter()
        .enumerate()
        .filter(|(_, patterns)| patterns.iter().any(|p| p.matches(name)))
        .map(|(i, _)| i as Slot)
        .collect()
}

/// What every pod `P` learned.
pub struct Learned<P> {
    pods: HashMap<P, PodLearned>,
    limits: Limits,
    pub counters: Counters,
}

impl<P: Eq + Hash + Clone> Learned<P> {
    pub fn new(limits: Limits) -> Self {
        Learned {
            pods: HashMap::new(),
            limits,
            counters: Counters::default(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Learns from one answer `pod` received at `now`, the pod's domain
    /// rules being `rules` (slot = index). The answer must already have
    /// matched a query of the pod's, from a server the policy trusts.
    pub fn learn(
        &mut self,
        now: u64,
        pod: &P,
        rules: &[Vec<Pattern>],
        answer: &Resolution,
    ) -> Learning {
        let slots = matching_slots(rules, &answer.name);
        if slots.is_empty() {
            self.counters.unmatched += 1;
            return Learning::default();
        }
        let limits = &self.limits;
        let learned = self.pods.entry(pod.clone()).or_default();
        // The answer's addresses, longest-lived first, at most the cap.
        let mut addrs: Vec<(IpAddr, u64)> = answer
            .addrs
            .iter()
            .map(|&(addr, ttl)| {
                (
                    addr,
                    now.saturating_add(u64::from(limits.ttl(ttl)) * NS_PER_S),
                )
            })
            .collect();
        if addrs.len() > limits.addrs_per_name {
            addrs.sort_by_key(|&(_, expiry)| std::cmp::Reverse(expiry));
            self.counters.addrs_evicted += (addrs.len() - limits.addrs_per_name) as u64;
            addrs.truncate(limits.addrs_per_name);
        }
        if !learned.names.contains_key(&answer.name) && learned.names.len() >= limits.names_per_pod
        {
            let oldest = learned
                .names
                .iter()
                .min_by_key(|(_, r)| r.answered)
                .map(|(n, _)| n.clone())
                .expect("a full table is not empty");
            learned.names.remove(&oldest);
            self.counters.names_evicted += 1;
        }
        let record = learned.names.entry(answer.name.clone()).or_default();
        record.answered = now;
        for &(addr, expiry) in &addrs {
            match record.addrs.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, e)) => *e = (*e).max(expiry),
                None => record.addrs.push((addr, expiry)),
            }
        }
        if record.addrs.len() > limits.addrs_per_name {
            record
                .addrs
                .sort_by_key(|&(_, expiry)| std::cmp::Reverse(expiry));
            self.counters.addrs_evicted += (record.addrs.len() - limits.addrs_per_name) as u64;
            record.addrs.truncate(limits.addrs_per_name);
        }
        let mut changes = Vec::new();
        for &(addr, expiry) in &addrs {
            for &slot in &slots {
                changes.extend(learned.raise(slot, addr, expiry));
            }
        }
        while learned.entries.len() > limits.entries_per_pod {
            changes.extend(learned.pop_soonest());
            self.counters.entries_evicted += 1;
        }
        Learning { slots, changes }
    }

    /// Removes every entry expired at `now` (the datapath already refuses
    /// them; this frees their space) and the addresses names no longer have.
    pub fn expire(&mut self, now: u64) -> Vec<(P, Change)> {
        let mut out = Vec::new();
        self.pods.retain(|pod, learned| {
            while let Some(&(expiry, slot, addr)) = learned.by_expiry.first() {
                if expiry > now {
                    break;
                }
                out.extend(learned.remove(slot, addr).map(|c| (pod.clone(), c)));
            }
            learned.names.retain(|_, r| {
                r.addrs.retain(|&(_, e)| e > now);
                !r.addrs.is_empty()
            });
            !(learned.names.is_empty() && learned.entries.is_empty())
        });
        out
    }

    /// The pod's domain rules changed: its entries become what its names
    /// give under the new rules.
    pub fn rules_changed(&mut self, now: u64, pod: &P, rules: &[Vec<Pattern>]) -> Vec<Change> {
        let Some(learned) = self.pods.get_mut(pod) else {
            return Vec::new();
        };
        let mut want: HashMap<(Slot, IpAddr), u64> = HashMap::new();
        for (name, record) in &learned.names {
            for slot in matching_slots(rules, name) {
                for &(addr, expiry) in record.addrs.iter().filter(|(_, e)| *e > now) {
                    let e = want.entry((slot, addr)).or_insert(0);
                    *e = (*e).max(expiry);
                }
            }
        }
        let stale: Vec<(Slot, IpAddr)> = learned
            .entries
            .iter()
            .filter(|(k, e)| want.get(k) != Some(e))
            .map(|(k, _)| *k)
            .collect();
        let mut changes: Vec<Change> = stale
            .into_iter()
            .filter(|k| !want.contains_key(k))
            .filter_map(|(slot, addr)| learned.remove(slot, addr))
            .collect();
        for ((slot, addr), expiry) in want {
            if learned.entries.get(&(slot, addr)) != Some(&expiry) {
                learned.remove(slot, addr);
                changes.extend(learned.raise(slot, addr, expiry));
            }
        }
        while learned.entries.len() > self.limits.entries_per_pod {
            changes.extend(learned.pop_soonest());
            self.counters.entries_evicted += 1;
        }
        changes
    }

    /// Takes an entry found in the datapath (after a restart) as learned,
    /// so that expiry, caps and later answers account for it.
    pub fn adopt(&mut self, pod: &P, slot: Slot, addr: IpAddr, expiry: u64) {
        self.pods
            .entry(pod.clone())
            .or_default()
            .raise(slot, addr, expiry);
    }

    /// The pod is gone (its datapath table goes with it).
    pub fn forget(&mut self, pod: &P) {
        self.pods.remove(pod);
    }

    /// The pod's names, each with its addresses and their expiries, for
    /// the state dump.
    pub fn names(&self, pod: &P) -> impl Iterator<Item = (&Name, &[(IpAddr, u64)])> {
        self.pods
            .get(pod)
            .into_iter()
            .flat_map(|l| l.names.iter().map(|(n, r)| (n, r.addrs.as_slice())))
    }

    /// When the pod's entry (slot, addr) expires, if it has one.
    pub fn expiry(&self, pod: &P, slot: Slot, addr: IpAddr) -> Option<u64> {
        self.pods.get(pod)?.entries.get(&(slot, addr)).copied()
    }

    /// The pod's entries: (slot, address) and expiry.
    pub fn entries(&self, pod: &P) -> impl Iterator<Item = ((Slot, IpAddr), u64)> + '_ {
        self.pods
            .get(pod)
            .into_iter()
            .flat_map(|l| l.entries.iter().map(|(k, e)| (*k, *e)))
    }

    /// Entries over all pods.
    pub fn entry_count(&self) -> usize {
        self.pods.values().map(|l| l.entries.len()).sum()
    }

    /// Names over all pods.
    pub fn name_count(&self) -> usize {
        self.pods.values().map(|l| l.names.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::name;
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;

    const S: u64 = NS_PER_S;

    fn ip(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0xC000_0200 + i))
    }

    fn res(n: &str, addrs: &[(u32, u32)]) -> Resolution {
        Resolution {
            name: name(n),
            addrs: addrs.iter().map(|&(a, ttl)| (ip(a), ttl)).collect(),
        }
    }

    fn rules(r: &[&[&str]]) -> Vec<Vec<Pattern>> {
        r.iter()
            .map(|ps| ps.iter().map(|p| p.parse().unwrap()).collect())
            .collect()
    }

    fn limits() -> Limits {
        Limits {
            min_ttl_s: 5,
            max_ttl_s: 3600,
            ..Limits::default()
        }
    }

    /// The datapath table as the changes leave it.
    #[derive(Default)]
    struct Table(BTreeMap<(Slot, IpAddr), u64>);
    impl Table {
        fn apply(&mut self, changes: impl IntoIterator<Item = Change>) {
            for c in changes {
                match c {
                    Change::Upsert { slot, addr, expiry } => {
                        self.0.insert((slot, addr), expiry);
                    }
                    Change::Remove { slot, addr } => {
                        assert!(
                            self.0.remove(&(slot, addr)).is_some(),
                            "removed {slot} {addr}, absent"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_answer_sets_entries_for_every_matching_rule() {
        let mut l = Learned::new(limits());
        let r = rules(&[&["api.example.com"], &["*.example.com"], &["other.org"]]);
        let got = l.learn(
            10 * S,
            &"pod",
            &r,
            &res("api.example.com", &[(1, 60), (2, 1)]),
        );
        assert_eq!(got.slots, vec![0, 1]);
        let mut t = Table::default();
        t.apply(got.changes);
        // TTL 1 is raised to the 5 s minimum.
        assert_eq!(
            t.0,
            BTreeMap::from([
                ((0, ip(1)), 70 * S),
                ((1, ip(1)), 70 * S),
                ((0, ip(2)), 15 * S),
                ((1, ip(2)), 15 * S)
            ])
        );
        // A name no rule matches teaches nothing and is not kept.
        let got = l.learn(10 * S, &"pod", &r, &res("www.other.org", &[(3, 60)]));
        assert_eq!(got, Learning::default());
        assert_eq!(l.counters.unmatched, 1);
        assert_eq!(l.name_count(), 1);
    }

    #[test]
    fn expiry_never_moves_back_and_entries_expire() {
        let mut l = Learned::new(limits());
        let r = rules(&[&["*.example.com"]]);
        let mut t = Table::default();
        t.apply(
            l.learn(0, &"pod", &r, &res("a.example.com", &[(1, 100)]))
                .changes,
        );
        // A shorter TTL for the same address, from another name: no change.
        let got = l.learn(10 * S, &"pod", &r, &res("b.example.com", &[(1, 20)]));
        assert!(got.changes.is_empty());
        // A later one raises it.
        t.apply(
            l.learn(90 * S, &"pod", &r, &res("b.example.com", &[(1, 20)]))
                .changes,
        );
        assert_eq!(t.0[&(0, ip(1))], 110 * S);
        // Nothing expires at 109 s; the entry does at 110 s.
        assert!(l.expire(109 * S).is_empty());
        let gone = l.expire(110 * S);
        assert_eq!(
            gone,
            vec![(
                "pod",
                Change::Remove {
                    slot: 0,
                    addr: ip(1)
                }
            )]
        );
        t.apply(gone.into_iter().map(|(_, c)| c));
        assert!(t.0.is_empty());
        assert_eq!(l.name_count(), 0);
    }

    #[test]
    fn pods_are_apart() {
        let mut l = Learned::new(limits());
        let r = rules(&[&["a.example.com"]]);
        l.learn(0, &"one", &r, &res("a.example.com", &[(1, 60)]));
        assert_eq!(l.entries(&"one").count(), 1);
        assert_eq!(l.entries(&"two").count(), 0);
        l.forget(&"one");
        assert_eq!(l.entry_count(), 0);
    }

    #[test]
    fn caps_push_out_and_count() {
        let mut l = Learned::new(Limits {
            names_per_pod: 2,
            addrs_per_name: 3,
            entries_per_pod: 5,
            ..limits()
        });
        let r = rules(&[&["*.example.com"]]);
        let mut t = Table::default();
        // Five addresses for one name, cap three: the three longest-lived.
        t.apply(
            l.learn(
                0,
                &"pod",
                &r,
                &res(
                    "a.example.com",
                    &[(1, 10), (2, 50), (3, 20), (4, 40), (5, 30)],
                ),
            )
            .changes,
        );
        assert_eq!(l.counters.addrs_evicted, 2);
        assert_eq!(
            t.0.keys().map(|k| k.1).collect::<Vec<_>>(),
            vec![ip(2), ip(4), ip(5)]
        );
        // Two more names: the first one answered is forgotten as a name,
        // and the entries beyond five go, soonest expiry first.
        t.apply(
            l.learn(S, &"pod", &r, &res("b.example.com", &[(6, 100), (7, 100)]))
                .changes,
        );
        t.apply(
            l.learn(2 * S, &"pod", &r, &res("c.example.com", &[(8, 100)]))
                .changes,
        );
        assert_eq!(l.counters.names_evicted, 1);
        assert_eq!(l.names(&"pod").count(), 2);
        assert!(l.names(&"pod").all(|(n, _)| *n != name("a.example.com")));
        assert_eq!(t.0.len(), 5);
        assert_eq!(l.counters.entries_evicted, 1);
        assert!(!t.0.contains_key(&(0, ip(5))), "the soonest (30 s) went");
        assert_eq!(t.0.len(), l.entry_count());
    }

    #[test]
    fn rules_changing_rebuild_entries_from_names() {
        let mut l = Learned::new(limits());
        let before = rules(&[&["a.example.com"], &["*.example.com"]]);
        let mut t = Table::default();
        t.apply(
            l.learn(0, &"pod", &before, &res("a.example.com", &[(1, 60)]))
                .changes,
        );
        t.apply(
            l.learn(0, &"pod", &before, &res("b.example.com", &[(2, 60)]))
                .changes,
        );
        assert_eq!(t.0.len(), 3);
        // The wildcard rule goes; a new exact rule for b comes first.
        let after = rules(&[&["b.example.com"], &["a.example.com"]]);
        t.apply(l.rules_changed(S, &"pod", &after));
        assert_eq!(
            t.0,
            BTreeMap::from([((0, ip(2)), 60 * S), ((1, ip(1)), 60 * S)])
        );
        assert_eq!(t.0, l.entries(&"pod").collect());
        // No rules: nothing stays.
        t.apply(l.rules_changed(S, &"pod", &[]));
        assert!(t.0.is_empty());
    }

    #[test]
    fn adopted_entries_count_as_learned() {
        let mut l = Learned::new(limits());
        l.adopt(&"pod", 0, ip(1), 100 * S);
        let r = rules(&[&["a.example.com"]]);
        assert!(l
            .learn(0, &"pod", &r, &res("a.example.com", &[(1, 60)]))
            .changes
            .is_empty());
        assert_eq!(
            l.expire(100 * S),
            vec![(
                "pod",
                Change::Remove {
                    slot: 0,
                    addr: ip(1)
                }
            )]
        );
    }

    /// Random answers, rule changes, expiry and caps: the changes always
    /// leave the datapath table equal to the learner's entries, within
    /// the caps, and no entry outlives the answer that justifies it.
    #[test]
    fn changes_keep_the_datapath_in_step() {
        for seed in 0..40 {
            let mut rng = crate::tests::Rng(seed);
            let lim = Limits {
                names_per_pod: 4,
                addrs_per_name: 5,
                entries_per_pod: 12,
                ..limits()
            };
            let mut l = Learned::new(lim.clone());
            let pods = ["p0", "p1", "p2"];
            let all_rules = [
                rules(&[&["*.example.com"], &["a.example.com", "b.example.com"]]),
                rules(&[&["b.example.com"]]),
                rules(&[&["*.a.example.com"], &["*.example.com"], &["c.example.com"]]),
            ];
            let names = [
                "a.example.com",
                "b.example.com",
                "c.example.com",
                "x.a.example.com",
                "d.example.com",
                "other.net",
            ];
            let mut current: HashMap<&str, usize> = pods.iter().map(|p| (*p, 0)).collect();
            let mut tables: HashMap<&str, Table> = HashMap::new();
            // Latest justification per (pod, slot, addr): the greatest
            // expiry any answer gave it under the rules at that time.
            let mut now = 0;
            for _ in 0..400 {
                now += rng.below(3 * S);
                let pod = pods[rng.below(3) as usize];
                match rng.below(10) {
                    0 => {
                        let next = rng.below(3) as usize;
                        current.insert(pod, next);
                        let ch = l.rules_changed(now, &pod, &all_rules[next]);
                        tables.entry(pod).or_default().apply(ch);
                    }
                    1 => {
                        for (p, c) in l.expire(now) {
                            tables.entry(p).or_default().apply([c]);
                        }
                    }
                    _ => {
                        let n = names[rng.below(names.len() as u64) as usize];
                        let addrs: Vec<(u32, u32)> = (0..rng.below(8))
                            .map(|_| (rng.below(10) as u32, rng.below(30) as u32))
                            .collect();
                        let got = l.learn(now, &pod, &all_rules[current[pod]], &res(n, &addrs));
                        tables.entry(pod).or_default().apply(got.changes);
                    }
                }
                for p in pods {
                    let mine: BTreeMap<_, _> = l.entries(&p).collect();
                    assert_eq!(
                        tables.get(p).map(|t| &t.0).cloned().unwrap_or_default(),
                        mine,
                        "seed {seed}"
                    );
                    assert!(mine.len() <= lim.entries_per_pod);
                    assert!(l.names(&p).count() <= lim.names_per_pod);
                    for ((slot, _), expiry) in mine {
                        assert!((slot as usize) < all_rules[current[p]].len(), "seed {seed}");
                        assert!(expiry <= now + u64::from(lim.max_ttl_s) * S);
                    }
                }
            }
        }
    }
}
