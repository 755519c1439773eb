//! Editing a policy table in place instead of writing its new content under
//! a new id: a peer joining or leaving a large peer set costs a handful of
//! map writes, not a rewrite of every table that names the set.
//!
//! Safety rule. Packets see every intermediate table of an in-place edit,
//! so during the sequence of single-key writes each address's effective
//! value (the port set of its longest matching prefix, or a miss) must
//! always be either its old or its new value. That holds when
//!   - every key ADDED or REMOVED is a host prefix (length 128: an IPv4
//!     /32, IPv4-mapped, or an IPv6 /128), which decides only its own
//!     address, so the shorter prefixes are the same keys before and after;
//!   - a key whose value changes is rewritten with one atomic update;
//!   - the writes go: additions, then value changes, then removals. An
//!     added host key must go in while the shorter prefix covering its
//!     address still has its old value (its address's old value), and a
//!     removed one must go once that prefix has its new value (its
//!     address's new value); every other address keeps its longest match
//!     throughout and sees that key's old or new value.
//!
//! A diff that adds or removes a shorter prefix moves the longest match of
//! addresses other than its own, and is written under a new id instead.
//!
//! Revocation stays immediate: a diff that narrows anything (removes a key
//! or changes a value) moves the epoch of every endpoint direction using
//! the table, once the table is final, so established flows are judged
//! again on their next packet. An add-only diff leaves epochs alone.
//!
//! The edit is taken only when every endpoint direction using the table
//! moves to the same new content (the old content has no user left) and
//! that content has no table yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::dump::Counted;
use super::realized::RealizedPolicy;
use super::Reconciler;
use crate::compile::{PolicySet, PortSet, Prefix};
use crate::datapath::{Datapath, PolicyId, PortSetId};
use crate::desired::{Desired, Verdict};

/// The host-prefix length: such a key decides only its own address.
const HOST: u8 = 128;

/// The single-key writes that turn one table content into another, in the
/// order that keeps every address at its old or new value.
#[derive(Debug, PartialEq)]
pub(super) struct TableDiff<'a> {
    /// Additions first, then value changes of existing keys.
    pub upserts: Vec<(Prefix, &'a PortSet)>,
    pub removals: Vec<Prefix>,
    /// A key removed or a value changed: established flows must be judged
    /// again.
    pub narrows: bool,
}

/// The value `set` gives the addresses of host prefix `p`: its longest
/// matching entry.
fn longest_match<'a>(set: &'a PolicySet, p: &Prefix) -> Option<&'a PortSet> {
    (0..=p.len)
        .rev()
        .find_map(|len| set.entries.get(&Prefix::new(p.addr, len)))
}

/// The in-place diff from `old` to `new`, or None when it would add or
/// remove a non-host prefix (see the module comment).
pub(super) fn host_only_diff<'a>(old: &PolicySet, new: &'a PolicySet) -> Option<TableDiff<'a>> {
    // One walk of both sorted tables: the cost is the table's, once, with
    // no lookups.
    let mut added = Vec::new();
    let mut changed = Vec::new();
    let mut removals = Vec::new();
    let mut olds = old.entries.iter().peekable();
    let mut news = new.entries.iter().peekable();
    loop {
        match (olds.peek(), news.peek()) {
            (None, None) => break,
            (Some((o, _)), Some((n, _))) if o == n => {
                let ((_, was), (p, ports)) = (olds.next()?, news.next()?);
                if was != ports {
                    changed.push((*p, ports));
                }
            }
            (Some((o, _)), n) if n.is_none_or(|(n, _)| o < n) => {
                if o.len != HOST {
                    return None;
                }
                removals.push(**o);
                olds.next();
            }
            _ => {
                let (p, ports) = news.next()?;
                if p.len != HOST {
                    return None;
                }
                added.push((*p, ports));
            }
        }
    }
    // An added key narrows too when its address allowed more before (its
    // longest match in `old`): never so under NetworkPolicy's union (a
    // longer prefix allows at least what a shorter one does), but a tier's
    // Deny can give a new address less than the prefix around it.
    let narrows = !changed.is_empty()
        || !removals.is_empty()
        || added.iter().any(|(p, ports)| {
            longest_match(old, p).is_some_and(|before| !ports.allows_all_of(before))
        });
    added.extend(changed);
    Some(TableDiff {
        upserts: added,
        removals,
        narrows,
    })
}

/// A table's entries after a diff: few keys change in a long sorted list.
fn edited_entries(
    mut entries: Vec<(Prefix, PortSetId)>,
    upserts: &[(Prefix, PortSetId)],
    removals: &[Prefix],
) -> Vec<(Prefix, PortSetId)> {
    if !entries.is_sorted_by_key(|(p, _)| *p) {
        entries.sort_by_key(|(p, _)| *p);
    }
    for p in removals {
        if let Ok(i) = entries.binary_search_by_key(p, |(q, _)| *q) {
            entries.remove(i);
        }
    }
    for (p, ps) in upserts {
        match entries.binary_search_by_key(p, |(q, _)| *q) {
            Ok(i) => entries[i].1 = *ps,
            Err(i) => entries.insert(i, (*p, *ps)),
        }
    }
    entries
}

/// Records where one user of table `id` moves (None: it stays, goes, or is
/// not safe to reason on): the table keeps a single move only while every
/// user agrees on it.
fn merge_move(
    moves: &mut BTreeMap<PolicyId, Option<Arc<PolicySet>>>,
    id: PolicyId,
    next: Option<Arc<PolicySet>>,
) {
    match (moves.get(&id), next) {
        (None, Some(n)) => {
            moves.insert(id, Some(n));
        }
        (Some(Some(m)), Some(n)) if Arc::ptr_eq(m, &n) || *m == n => {}
        _ => {
            moves.insert(id, None);
        }
    }
}

/// A table all of whose users move to one new content.
struct Candidate {
    id: PolicyId,
    old: Arc<PolicySet>,
    new: Arc<PolicySet>,
}

/// An endpoint direction that renewing failed for, retried on every
/// convergence until it succeeds or the endpoint goes.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct OwedRenewal {
    pub ifindex: u32,
    pub ingress: bool,
    pub egress: bool,
}

impl<D: Datapath> Reconciler<D> {
    /// Step 0 of `apply`: edits in place every table whose users all move
    /// to one new content, where that is safe. Whatever it does not edit
    /// (unsafe diff, failed write) is left to the new-id path that follows.
    pub(super) fn edit_tables_in_place(&mut self, want: &Desired, in_scope: &dyn Fn(&str) -> bool) {
        self.retry_owed_renewals();
        if !self.ctx.in_place_edits {
            return;
        }
        for c in self.in_place_candidates(want, in_scope) {
            // An earlier edit of this pass may have given the content a
            // table already: its users then switch to that one.
            if self.realized.policies.contains_key(&c.new) {
                continue;
            }
            self.edit_in_place(c);
        }
    }

    fn in_place_candidates(
        &self,
        want: &Desired,
        in_scope: &dyn Fn(&str) -> bool,
    ) -> Vec<Candidate> {
        let content: BTreeMap<PolicyId, &Arc<PolicySet>> = self
            .realized
            .policies
            .iter()
            .map(|(s, p)| (p.id, s))
            .collect();
        // Per table: the one content all its users move to, or None when
        // some user stays, goes, or moves elsewhere.
        let mut moves: BTreeMap<PolicyId, Option<Arc<PolicySet>>> = BTreeMap::new();
        for (name, re) in &self.realized.endpoints {
            let wanted = want.endpoints.get(name).filter(|_| in_scope(name));
            for (id, now, ingress) in [
                (re.entry.ingress, &re.ingress, true),
                (re.entry.egress, &re.egress, false),
            ] {
                let Some(old) = content.get(&id) else {
                    continue;
                };
                // The record must name the table's content: anything else
                // is not safe to reason on, and takes the new-id path.
                let consistent =
                    matches!(now, Verdict::Policy(s) if Arc::ptr_eq(s, old) || s == *old);
                let next = match wanted {
                    Some(de) if consistent && de.ifindex == re.ifindex => {
                        match if ingress { &de.ingress } else { &de.egress } {
                            Verdict::Policy(n) if !Arc::ptr_eq(n, old) && n != *old => {
                                Some(n.clone())
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                merge_move(&mut moves, id, next);
            }
        }
        // Staged (audit) users of a table are users like any other: the
        // table is edited only when they move to the same content too.
        for (name, ra) in &self.realized.audit {
            let wanted = self
                .audit
                .want
                .get(name)
                .filter(|_| want.endpoints.get(name).map(|de| de.ifindex) == Some(ra.ifindex));
            for (id, now, next_want) in [
                (
                    ra.entry.ingress,
                    &ra.ingress,
                    wanted.and_then(|w| w.ingress.as_ref()),
                ),
                (
                    ra.entry.egress,
                    &ra.egress,
                    wanted.and_then(|w| w.egress.as_ref()),
                ),
            ] {
                let Some(old) = content.get(&id) else {
                    continue;
                };
                let consistent = now
                    .as_ref()
                    .is_some_and(|s| Arc::ptr_eq(s, old) || s == *old);
                let next = next_want
                    .filter(|n| consistent && !Arc::ptr_eq(n, old) && *n != *old)
                    .cloned();
                merge_move(&mut moves, id, next);
            }
        }
        let mut out: Vec<Candidate> = moves
            .into_iter()
            .filter_map(|(id, new)| {
                Some(Candidate {
                    id,
                    old: content[&id].clone(),
                    new: new?,
                })
            })
            .collect();
        if out.is_empty() {
            return out;
        }
        // A new endpoint that wants the old content keeps it alive.
        for (name, de) in &want.endpoints {
            if !in_scope(name) {
                continue;
            }
            for v in [&de.ingress, &de.egress] {
                let Verdict::Policy(s) = v else { continue };
                out.retain(|c| Arc::ptr_eq(s, &c.new) || !(Arc::ptr_eq(s, &c.old) || *s == c.old));
            }
        }
        for aw in self.audit.want.values() {
            for s in [&aw.ingress, &aw.egress].into_iter().flatten() {
                out.retain(|c| Arc::ptr_eq(s, &c.new) || !(Arc::ptr_eq(s, &c.old) || *s == c.old));
            }
        }
        out
    }

    /// Edits table `c.id` from `c.old` to `c.new`. False: not edited, or
    /// the edit failed part-way and the table was retired (its users are
    /// then moved to a new id by the rest of `apply`, with fresh epochs).
    fn edit_in_place(&mut self, c: Candidate) -> bool {
        let Some(diff) = host_only_diff(&c.old, &c.new) else {
            return false;
        };
        // Port sets the new values need, before any key points at them;
        // those nothing uses any more go at the end of `apply`.
        let mut upserts = Vec::with_capacity(diff.upserts.len());
        for (prefix, ports) in &diff.upserts {
            match self.portset_for(ports) {
                Ok(ps) => upserts.push((*prefix, ps)),
                Err(e) => {
                    self.health
                        .errors
                        .push(format!("editing policy table {} in place: {e}", c.id));
                    return false;
                }
            }
        }
        let Some(realized) = self.realized.policies.remove(&c.old) else {
            return false;
        };
        if let Err(e) = self
            .datapath
            .update_policy(c.id, &upserts, &diff.removals)
            .counted(&mut self.health)
        {
            // Each address now holds its old or new value, but which is
            // unknown: retire the table (removed once no endpoint points at
            // it, with every key it may hold) and let the new-id path give
            // its users a complete table, or deny them. A key may be listed
            // with its old and its new port set: both stay until it goes.
            let mut keys = realized.entries;
            keys.extend(upserts.iter().copied());
            self.realized.garbage_policies.push((c.id, keys));
            self.health.errors.push(format!(
                "editing policy table {} in place failed, writing it anew: {e}",
                c.id
            ));
            return false;
        }
        let entries = edited_entries(realized.entries, &upserts, &diff.removals);
        self.realized
            .policies
            .insert(c.new.clone(), RealizedPolicy { id: c.id, entries });
        // The table its users point at holds the new content now.
        let mut users = Vec::new();
        for (name, re) in self.realized.endpoints.iter_mut() {
            let (ingress, egress) = (re.entry.ingress == c.id, re.entry.egress == c.id);
            if ingress {
                re.ingress = Verdict::Policy(c.new.clone());
            }
            if egress {
                re.egress = Verdict::Policy(c.new.clone());
            }
            if ingress || egress {
                users.push((
                    name.clone(),
                    OwedRenewal {
                        ifindex: re.ifindex,
                        ingress,
                        egress,
                    },
                ));
            }
        }
        // Audit users follow without an epoch renewal: audit judges only
        // new flows.
        for ra in self.realized.audit.values_mut() {
            if ra.entry.ingress == c.id {
                ra.ingress = Some(c.new.clone());
            }
            if ra.entry.egress == c.id {
                ra.egress = Some(c.new.clone());
            }
        }
        if diff.narrows {
            for (name, owed) in users {
                self.renew(name, owed);
            }
        }
        true
    }

    /// The id of a port set with this content, written first if new.
    fn portset_for(&mut self, ports: &PortSet) -> Result<PortSetId, String> {
        if ports.0.is_empty() {
            return Ok(0);
        }
        if let Some(id) = self.realized.portsets.get(ports) {
            return Ok(*id);
        }
        let id = self.realized.alloc_portset()?;
        self.datapath
            .add_portset(id, ports)
            .counted(&mut self.health)
            .map_err(|e| format!("port set: {e}"))?;
        self.realized.portsets.insert(ports.clone(), id);
        Ok(id)
    }

    /// Moves an endpoint's epochs; on failure the pod is marked failed and
    /// the renewal owed until it succeeds.
    fn renew(&mut self, ifname: String, owed: OwedRenewal) {
        match self
            .datapath
            .renew_epochs(owed.ifindex, owed.ingress, owed.egress)
            .counted(&mut self.health)
        {
            Ok(()) => {
                self.realized.owed_renewals.remove(&ifname);
            }
            Err(e) => {
                let pod = self
                    .realized
                    .endpoints
                    .get(&ifname)
                    .and_then(|re| re.claim.pod().cloned());
                self.fail(
                    pod.as_ref(),
                    format!("{ifname}: its policy was narrowed but established flows were not re-judged: {e}; retrying"),
                );
                let merged = match self.realized.owed_renewals.get(&ifname) {
                    Some(o) if o.ifindex == owed.ifindex => OwedRenewal {
                        ingress: o.ingress || owed.ingress,
                        egress: o.egress || owed.egress,
                        ..owed
                    },
                    _ => owed,
                };
                self.realized.owed_renewals.insert(ifname, merged);
            }
        }
    }

    /// A predecessor may have died between narrowing a table in place and
    /// renewing its users' epochs, and its table is final: nothing left to
    /// diff would say so. So a new process renews every direction that has
    /// a table once, before anything else: established flows are judged
    /// again, by the tables as they are now, on their next packet.
    pub(super) fn renew_after_recovery(&mut self) {
        let table = |id: PolicyId| id != 0 && id != super::DENY_ALL;
        let all: Vec<(String, OwedRenewal)> = self
            .realized
            .endpoints
            .iter()
            .filter(|(_, re)| table(re.entry.ingress) || table(re.entry.egress))
            .map(|(name, re)| {
                (
                    name.clone(),
                    OwedRenewal {
                        ifindex: re.ifindex,
                        ingress: table(re.entry.ingress),
                        egress: table(re.entry.egress),
                    },
                )
            })
            .collect();
        for (name, owed) in all {
            self.renew(name, owed);
        }
    }

    fn retry_owed_renewals(&mut self) {
        let owed = std::mem::take(&mut self.realized.owed_renewals);
        for (ifname, o) in owed {
            // Gone, or a new interface under the name: its entry is new and
            // its epochs with it.
            if self
                .realized
                .endpoints
                .get(&ifname)
                .is_some_and(|re| re.ifindex == o.ifindex)
            {
                self.renew(ifname, o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! In-place table edits: the diff and its write order (pure), and the
    //! reconciler's choice between an in-place edit and a new table, epoch
    //! renewals, failures, and random plan changes checked against a
    //! from-scratch compile.

    use std::collections::{BTreeMap, BTreeSet};

    use super::super::fixtures::snapshot;
    use super::super::*;
    use super::host_only_diff;
    use crate::compile::{compile, PortEntry, PortSet, Prefix};
    use crate::datapath::fake::FakeDatapath;
    use palisade_proto::v1::PodRef;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PlanDelta, PortRange, Rule};

    // ---- helpers ----

    fn v4(a: [u8; 4], len: u8) -> Prefix {
        Prefix::from_ip(std::net::IpAddr::from(a), len)
    }

    fn proto_prefix(p: &Prefix) -> IpPrefix {
        p.to_wire()
    }

    /// One rule allowing TCP `port` from each of `peers`.
    fn rule(peers: &[Prefix], port: u32) -> Rule {
        Rule {
            peers: peers
                .iter()
                .map(|p| PeerBlock {
                    cidr: Some(proto_prefix(p)),
                    except: vec![],
                })
                .collect(),
            ports: vec![PortRange {
                protocol: 6,
                port,
                end_port: 0,
            }],
            ..Default::default()
        }
    }

    fn direction(rules: Vec<Rule>) -> Option<DirectionPolicy> {
        Some(DirectionPolicy {
            rules,
            ..Default::default()
        })
    }

    fn pod(
        name: &str,
        ingress: Option<DirectionPolicy>,
        egress: Option<DirectionPolicy>,
    ) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            ingress,
            egress,
            policies: vec!["x/p".into()],
            ..Default::default()
        }
    }

    const IFACES: [&str; 6] = ["veth-a", "veth-b", "veth-c", "veth-d", "veth-e", "veth-f"];

    fn reconciler() -> Reconciler<FakeDatapath> {
        Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&IFACES),
        )
    }

    /// Brings up pod `name` on its interface (`veth-<name>`).
    fn up(r: &mut Reconciler<FakeDatapath>, name: &str) {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        r.pod_up(
            PodUp {
                pod: ("x".into(), name.into()),
                runtime: crate::desired::PodRuntime {
                    container_id: format!("c-{name}"),
                    netns: String::new(),
                    host_interfaces: vec![format!("veth-{name}")],
                    ips: vec![],
                    ifindexes: Default::default(),
                    mode: None,
                },
            },
            tx,
        );
        rx.try_recv().expect("answered").expect("up");
    }

    fn ifindex(r: &Reconciler<FakeDatapath>, name: &str) -> u32 {
        r.datapath.interfaces[&format!("veth-{name}")]
    }

    fn ingress_id(r: &Reconciler<FakeDatapath>, name: &str) -> PolicyId {
        r.datapath.endpoint_of(&format!("veth-{name}")).unwrap().0
    }

    /// A table of the fake as content.
    fn table(dp: &FakeDatapath, id: PolicyId) -> PolicySet {
        PolicySet::new(
            dp.policies[&id]
                .iter()
                .map(|(p, ps)| {
                    let ports = if *ps == 0 {
                        PortSet::default()
                    } else {
                        dp.portsets[ps].clone()
                    };
                    (*p, ports)
                })
                .collect(),
        )
    }

    fn log_since(r: &Reconciler<FakeDatapath>, from: usize) -> Vec<String> {
        r.datapath.log[from..].to_vec()
    }

    fn hosts(range: std::ops::Range<u8>) -> Vec<Prefix> {
        range.map(|i| v4([10, 0, 0, i], 32)).collect()
    }

    // ---- the diff ----

    fn ports(port: u16) -> PortSet {
        PortSet(BTreeSet::from([PortEntry::Block {
            proto: 6,
            port,
            bits: 16,
        }]))
    }

    fn set(entries: &[(Prefix, u16)]) -> PolicySet {
        PolicySet::new(
            entries
                .iter()
                .map(|(p, port)| {
                    let ps = if *port == 0 {
                        PortSet::default()
                    } else {
                        ports(*port)
                    };
                    (*p, ps)
                })
                .collect(),
        )
    }

    #[test]
    fn host_additions_and_removals_are_diffed_and_anything_shorter_is_refused() {
        let a = v4([10, 0, 0, 1], 32);
        let b = v4([10, 0, 0, 2], 32);
        let net = v4([10, 0, 0, 0], 24);
        let old = set(&[(net, 80), (a, 80)]);

        // A host joins as NetworkPolicy's union makes it: what its /24
        // allows, and more.
        let both = PortSet(ports(80).0.union(&ports(443).0).copied().collect());
        let mut join = old.entries.clone();
        join.insert(b, both.clone());
        let join = PolicySet::new(join);
        let d = host_only_diff(&old, &join).unwrap();
        assert_eq!(d.upserts, vec![(b, &both)]);
        assert!(d.removals.is_empty());
        assert!(!d.narrows, "adding a host that allows more widens only");
        // A tier's Deny can give a new host less than its /24: narrowing.
        let denied = set(&[(net, 80), (a, 80), (b, 443)]);
        assert!(host_only_diff(&old, &denied).unwrap().narrows);
        let nothing = set(&[(net, 80), (a, 80), (b, 0)]);
        assert!(host_only_diff(&old, &nothing).unwrap().narrows);

        let leave = set(&[(net, 80)]);
        let d = host_only_diff(&old, &leave).unwrap();
        assert_eq!(d.removals, vec![a]);
        assert!(d.narrows);

        // A value change on a CIDR is one atomic write: in place, narrowing.
        let changed = set(&[(net, 81), (a, 80), (b, 80)]);
        let d = host_only_diff(&old, &changed).unwrap();
        assert_eq!(
            d.upserts,
            vec![(b, &ports(80)), (net, &ports(81))],
            "additions before value changes"
        );
        assert!(d.narrows);

        // Adding or removing anything shorter than a host moves other
        // addresses' longest match.
        assert!(host_only_diff(
            &old,
            &set(&[(net, 80), (a, 80), (v4([10, 1, 0, 0], 16), 80)])
        )
        .is_none());
        assert!(host_only_diff(&old, &set(&[(a, 80)])).is_none());
        // IPv6 hosts are hosts too.
        let v6 = Prefix::from_ip("fd00::1".parse().unwrap(), 128);
        assert!(host_only_diff(&old, &set(&[(net, 80), (a, 80), (v6, 80)])).is_some());
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random table over 10.0.0.0/29 and its sub-prefixes, values 0 (deny
    /// entry), 80 or 81.
    fn random_table(rng: &mut Rng) -> BTreeMap<Prefix, u16> {
        let mut t = BTreeMap::new();
        for _ in 0..rng.below(6) {
            let len = [29u8, 30, 31, 32, 32, 32][rng.below(6) as usize];
            let last = (rng.below(8) as u8) & !(((1u16 << (32 - len)) - 1) as u8);
            t.insert(
                v4([10, 0, 0, last], len),
                [0, 80, 81][rng.below(3) as usize],
            );
        }
        t
    }

    fn value(t: &BTreeMap<Prefix, u16>, addr: &Prefix) -> Option<u16> {
        t.iter()
            .filter(|(p, _)| p.contains(addr))
            .max_by_key(|(p, _)| p.len)
            .map(|(_, v)| *v)
    }

    /// Applies a diff's writes one at a time (upserts in the order given, then
    /// removals) and returns the first address that saw neither its old nor
    /// its new value, checking every address of the /29 and one outside it.
    fn first_unsafe_step(
        old: &BTreeMap<Prefix, u16>,
        new: &BTreeMap<Prefix, u16>,
        upserts: &[(Prefix, u16)],
        removals: &[Prefix],
    ) -> Option<String> {
        let addrs: Vec<Prefix> = (0..9).map(|i| v4([10, 0, 0, i], 32)).collect();
        let mut now = old.clone();
        let writes = upserts
            .iter()
            .map(|(p, v)| (*p, Some(*v)))
            .chain(removals.iter().map(|p| (*p, None)));
        for (p, v) in writes {
            match v {
                Some(v) => now.insert(p, v),
                None => now.remove(&p),
            };
            for a in &addrs {
                let seen = value(&now, a);
                if seen != value(old, a) && seen != value(new, a) {
                    return Some(format!("{} after writing {}", a.display(), p.display()));
                }
            }
        }
        None
    }

    fn port_of(ps: &PortSet) -> u16 {
        match ps.0.iter().next() {
            None => 0,
            Some(PortEntry::Block { port, .. }) => *port,
            Some(e) => panic!("{e:?}"),
        }
    }

    /// The safety rule, checked exhaustively on small random tables: every
    /// intermediate table of an accepted diff, written in its order, gives
    /// every address its old or new value. And the order is needed: writing
    /// value changes before additions (or removals first) breaks it on some
    /// table, so the check can fail.
    #[test]
    fn every_intermediate_table_of_an_accepted_diff_is_old_or_new_per_address() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let (mut accepted, mut refused, mut wrong_order_caught) = (0, 0, 0);
        for _ in 0..20_000 {
            let (old, new) = (random_table(&mut rng), random_table(&mut rng));
            let as_set = |t: &BTreeMap<Prefix, u16>| {
                set(&t.iter().map(|(p, v)| (*p, *v)).collect::<Vec<_>>())
            };
            let (old_set, new_set) = (as_set(&old), as_set(&new));
            let Some(d) = host_only_diff(&old_set, &new_set) else {
                refused += 1;
                continue;
            };
            accepted += 1;
            let upserts: Vec<(Prefix, u16)> =
                d.upserts.iter().map(|(p, ps)| (*p, port_of(ps))).collect();
            if let Some(e) = first_unsafe_step(&old, &new, &upserts, &d.removals) {
                panic!("{old:?} -> {new:?}: {e}");
            }
            let mut reversed = upserts.clone();
            reversed.reverse();
            if first_unsafe_step(&old, &new, &reversed, &d.removals).is_some() {
                wrong_order_caught += 1;
            }
            // A new host narrows when its address allowed something else
            // before (each value here is one port, or nothing).
            let before = |p: &Prefix| {
                (0..=p.len)
                    .rev()
                    .find_map(|len| old.get(&Prefix::new(p.addr, len)).copied())
            };
            let added_narrows = new
                .iter()
                .filter(|(p, _)| !old.contains_key(*p))
                .any(|(p, v)| before(p).is_some_and(|b| b != 0 && b != *v));
            assert_eq!(
                d.narrows,
                old.iter().any(|(p, v)| new.get(p) != Some(v)) || added_narrows
            );
        }
        assert!(accepted > 1000 && refused > 1000, "{accepted} {refused}");
        assert!(wrong_order_caught > 0, "the order check never bit");
    }

    // ---- the reconciler ----

    /// Three pods share a table naming a peer set; a fourth has its own.
    fn shared_setup(r: &mut Reconciler<FakeDatapath>, peers: &[Prefix]) {
        let shared = direction(vec![rule(peers, 80)]);
        r.apply_plan(snapshot(
            1,
            vec![
                pod("a", shared.clone(), None),
                pod("b", shared.clone(), None),
                pod("c", None, shared),
                pod("d", direction(vec![rule(&hosts(50..52), 22)]), None),
            ],
        ))
        .unwrap();
        for p in ["a", "b", "c", "d"] {
            up(r, p);
        }
    }

    fn peer_change(version: u64, peers: &[Prefix]) -> PlanMessage {
        let shared = direction(vec![rule(peers, 80)]);
        PlanMessage::Delta(PlanDelta {
            term: 0,
            base_version: version - 1,
            version,
            upserted: vec![
                pod("a", shared.clone(), None),
                pod("b", shared.clone(), None),
                pod("c", None, shared),
            ],
            removed: vec![],
            ..Default::default()
        })
    }

    #[test]
    fn a_peer_joining_is_one_write_in_place_and_renews_no_epoch() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let id = ingress_id(&r, "a");
        assert_eq!(r.datapath.endpoint_of("veth-c"), Some((0, id)));
        let epochs = r.datapath.epochs.clone();
        let from = r.datapath.log.len();

        r.apply_plan(peer_change(2, &hosts(1..12))).unwrap();

        assert_eq!(
            log_since(&r, from),
            vec![format!(
                "update_policy {id} upsert 10.0.0.11/32 {}",
                r.datapath.policies[&id][0].1
            )],
            "one write, nothing else"
        );
        assert_eq!(ingress_id(&r, "a"), id);
        assert_eq!(
            r.datapath.epochs, epochs,
            "widening keeps established flows"
        );
        let want = compile(&direction(vec![rule(&hosts(1..12), 80)]).unwrap(), &[]).unwrap();
        assert_eq!(table(&r.datapath, id), want);
        assert_eq!(r.datapath.policies.len(), 2);
        r.datapath.assert_no_violations();
        assert!(r.node_state().errors.is_empty());
    }

    #[test]
    fn a_peer_leaving_is_one_delete_and_renews_exactly_the_users_directions() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let id = ingress_id(&r, "a");
        let epochs = r.datapath.epochs.clone();
        let from = r.datapath.log.len();

        r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();

        let (a, b, c, d) = (
            ifindex(&r, "a"),
            ifindex(&r, "b"),
            ifindex(&r, "c"),
            ifindex(&r, "d"),
        );
        let log = log_since(&r, from);
        assert_eq!(log[0], format!("update_policy {id} remove 10.0.0.1/32"));
        let mut renewals: Vec<&String> = log[1..].iter().collect();
        renewals.sort();
        assert_eq!(
            renewals,
            vec![
                &format!("renew_epochs {a} true false"),
                &format!("renew_epochs {b} true false"),
                &format!("renew_epochs {c} false true"),
            ]
        );
        let now = &r.datapath.epochs;
        assert_ne!(now[&a].0, epochs[&a].0);
        assert_eq!(
            now[&a].1, epochs[&a].1,
            "egress of a is not the table's user"
        );
        assert_ne!(now[&c].1, epochs[&c].1);
        assert_eq!(now[&c].0, epochs[&c].0);
        assert_eq!(now[&d], epochs[&d], "another table's user keeps its flows");
        assert_eq!(ingress_id(&r, "a"), id);
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_cidr_change_or_a_user_left_behind_takes_a_new_table() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..4));
        let id = ingress_id(&r, "a");
        // A /24 joins: it would move the longest match of 253 other addresses.
        let mut peers = hosts(1..4);
        peers.push(v4([10, 0, 9, 0], 24));
        r.apply_plan(peer_change(2, &peers)).unwrap();
        let new = ingress_id(&r, "a");
        assert_ne!(new, id);
        assert!(!r.datapath.policies.contains_key(&id), "old table removed");
        assert!(!r
            .datapath
            .log
            .iter()
            .any(|l| l.starts_with("update_policy")));

        // Only a and b move: c keeps the table, so it is not edited.
        let shared = direction(vec![rule(&hosts(1..5), 80)]);
        r.apply_plan(PlanMessage::Delta(PlanDelta {
            term: 0,
            base_version: 2,
            version: 3,
            upserted: vec![pod("a", shared.clone(), None), pod("b", shared, None)],
            removed: vec![],
            ..Default::default()
        }))
        .unwrap();
        assert_ne!(ingress_id(&r, "a"), new);
        assert_eq!(r.datapath.endpoint_of("veth-c").unwrap().1, new);
        assert!(!r
            .datapath
            .log
            .iter()
            .any(|l| l.starts_with("update_policy")));

        // Switched off, a host change takes a new table as well.
        let mut r = reconciler().with_in_place_edits(false);
        shared_setup(&mut r, &hosts(1..4));
        let id = ingress_id(&r, "a");
        r.apply_plan(peer_change(2, &hosts(1..5))).unwrap();
        assert_ne!(ingress_id(&r, "a"), id);
        assert!(!r
            .datapath
            .log
            .iter()
            .any(|l| l.starts_with("update_policy")));
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_new_pod_wanting_the_old_content_keeps_the_old_table() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..4));
        let id = ingress_id(&r, "a");
        let old = direction(vec![rule(&hosts(1..4), 80)]);
        let new = direction(vec![rule(&hosts(1..5), 80)]);
        // e is up (unselected) when the change makes it want the old content.
        let v2 = vec![
            pod("a", old.clone(), None),
            pod("b", old.clone(), None),
            pod("c", None, old.clone()),
            pod("d", direction(vec![rule(&hosts(50..52), 22)]), None),
            pod("e", None, None),
        ];
        r.apply_plan(snapshot(2, v2)).unwrap();
        up(&mut r, "e");
        r.apply_plan(snapshot(
            3,
            vec![
                pod("a", new.clone(), None),
                pod("b", new.clone(), None),
                pod("c", None, new),
                pod("d", direction(vec![rule(&hosts(50..52), 22)]), None),
                pod("e", old, None),
            ],
        ))
        .unwrap();
        assert_eq!(ingress_id(&r, "e"), id, "e gets the old content's table");
        assert_ne!(ingress_id(&r, "a"), id);
        assert_eq!(
            table(&r.datapath, id),
            compile(&direction(vec![rule(&hosts(1..4), 80)]).unwrap(), &[]).unwrap()
        );
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_failed_edit_moves_the_users_to_a_complete_new_table() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let id = ingress_id(&r, "a");
        // Dies after the addition, before the removal: the table is neither.
        r.datapath
            .fail
            .insert(format!("update_policy {id} remove 10.0.0.1/32"));
        let mut peers = hosts(2..11);
        peers.push(v4([10, 0, 0, 99], 32));
        r.apply_plan(peer_change(2, &peers)).unwrap();

        let new = ingress_id(&r, "a");
        assert_ne!(new, id, "users moved to a new table");
        assert_eq!(r.datapath.endpoint_of("veth-c").unwrap().1, new);
        assert!(
            !r.datapath.policies.contains_key(&id),
            "half-edited table removed"
        );
        let want = compile(&direction(vec![rule(&peers, 80)]).unwrap(), &[]).unwrap();
        assert_eq!(table(&r.datapath, new), want);
        let errors = r.node_state().errors;
        assert!(
            errors.iter().any(|e| e.contains("in place failed")),
            "{errors:?}"
        );
        // The new id gave every user a fresh epoch: nothing owed.
        r.datapath.assert_no_violations();

        // Both the edit and the new table fail: the users are denied, visibly.
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let id = ingress_id(&r, "a");
        r.datapath.fail.insert(format!("update_policy {id} remove"));
        r.datapath.fail.insert("add_policy".into());
        r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();
        assert_eq!(ingress_id(&r, "a"), DENY_ALL);
        assert_eq!(r.datapath.endpoint_of("veth-c").unwrap().1, DENY_ALL);
        assert!(r.node_state().pods[0].error.contains("not written"));
        r.datapath.assert_no_violations();
        // Retried on the tick once writes work again.
        r.datapath.fail.clear();
        r.handle(Event::Tick);
        let new = ingress_id(&r, "a");
        assert_ne!(new, DENY_ALL);
        assert_eq!(
            table(&r.datapath, new),
            compile(&direction(vec![rule(&hosts(2..11), 80)]).unwrap(), &[]).unwrap()
        );
        assert_eq!(r.datapath.policies.len(), 2, "{:?}", r.datapath.policies);
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_failed_epoch_renewal_is_visible_and_retried() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let b = ifindex(&r, "b");
        r.datapath.fail.insert(format!("renew_epochs {b}"));
        r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();
        assert_eq!(
            r.datapath.stale_flows,
            BTreeSet::from([(b, true)]),
            "only b's renewal failed"
        );
        let state = r.node_state();
        let pod_b = state
            .pods
            .iter()
            .find(|p| p.pod.as_ref().unwrap().name == "b")
            .unwrap();
        assert!(pod_b.error.contains("not re-judged"), "{pod_b:?}");

        // A change elsewhere does not forget it.
        r.datapath.fail.clear();
        r.handle(Event::Tick);
        assert!(r.datapath.stale_flows.is_empty());
        assert!(r.node_state().pods.iter().all(|p| p.error.is_empty()));
        r.datapath.assert_no_violations();
    }

    // ---- random plan changes against a from-scratch compile ----

    /// A random direction policy over a small pool: mostly host peers (so
    /// consecutive plans often differ by hosts only), sometimes a CIDR, an
    /// except or another port.
    fn random_direction(rng: &mut Rng) -> Option<DirectionPolicy> {
        if rng.below(6) == 0 {
            return None;
        }
        let rules = (0..rng.below(3))
            .map(|_| {
                let mut peers: Vec<PeerBlock> = (0..rng.below(5))
                    .map(|_| PeerBlock {
                        cidr: Some(proto_prefix(&v4([10, 0, 0, rng.below(12) as u8], 32))),
                        except: vec![],
                    })
                    .collect();
                if rng.below(4) == 0 {
                    peers.push(PeerBlock {
                        cidr: Some(proto_prefix(&v4([10, 0, 0, 0], 28))),
                        except: (rng.below(2) == 0)
                            .then(|| proto_prefix(&v4([10, 0, 0, rng.below(12) as u8], 32)))
                            .into_iter()
                            .collect(),
                    });
                }
                Rule {
                    peers,
                    ports: vec![PortRange {
                        protocol: 6,
                        port: [80, 80, 80, 443][rng.below(4) as usize],
                        end_port: 0,
                    }],
                    ..Default::default()
                }
            })
            .collect();
        Some(DirectionPolicy {
            rules,
            ..Default::default()
        })
    }

    /// Every pod that is up points at tables equal to its policy compiled from
    /// scratch, no table is left that nothing uses, and no flow is owed a
    /// renewal.
    fn check_against_scratch(
        r: &Reconciler<FakeDatapath>,
        plan: &BTreeMap<String, PodPolicy>,
        node: &[Prefix],
        what: &str,
    ) {
        r.datapath.assert_no_violations();
        let mut used = BTreeSet::new();
        for (name, p) in plan {
            let (ingress, egress) = r.datapath.endpoint_of(&format!("veth-{name}")).unwrap();
            for (id, d, dir) in [
                (ingress, &p.ingress, "ingress"),
                (egress, &p.egress, "egress"),
            ] {
                match d {
                    None => assert_eq!(id, 0, "{what}: {name} {dir} should be open"),
                    Some(d) => {
                        assert!(id != 0 && id != DENY_ALL, "{what}: {name} {dir} is {id}");
                        assert_eq!(
                            table(&r.datapath, id),
                            compile(d, node).unwrap(),
                            "{what}: {name} {dir} (table {id})"
                        );
                        used.insert(id);
                    }
                }
            }
        }
        let tables: BTreeSet<PolicyId> = r.datapath.policies.keys().copied().collect();
        assert_eq!(tables, used, "{what}: tables nothing uses are left");
        // One table per content.
        let contents: BTreeSet<PolicySet> = used.iter().map(|id| table(&r.datapath, *id)).collect();
        assert_eq!(contents.len(), used.len(), "{what}: duplicate tables");
    }

    #[test]
    fn random_plan_changes_leave_exactly_the_compiled_tables() {
        let names = ["a", "b", "c", "d", "e", "f"];
        let (mut in_place, mut narrowing) = (0, 0);
        for seed in 1..=60u64 {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
            let mut r = reconciler();
            r.datapath.node_addresses = vec!["10.0.0.200".parse().unwrap()];
            let node = [v4([10, 0, 0, 200], 32)];
            // Replicas: pods share one of a few policies, so tables have users.
            let mut shapes: Vec<(Option<DirectionPolicy>, Option<DirectionPolicy>)> = (0..3)
                .map(|_| (random_direction(&mut rng), random_direction(&mut rng)))
                .collect();
            let assign: Vec<usize> = names.iter().map(|_| rng.below(3) as usize).collect();
            let plan_of = |shapes: &[(Option<DirectionPolicy>, Option<DirectionPolicy>)]| {
                names
                    .iter()
                    .zip(&assign)
                    .map(|(n, s)| {
                        (
                            n.to_string(),
                            pod(n, shapes[*s].0.clone(), shapes[*s].1.clone()),
                        )
                    })
                    .collect::<BTreeMap<String, PodPolicy>>()
            };
            let mut overrides: BTreeMap<String, PodPolicy> = BTreeMap::new();
            let mut plan = plan_of(&shapes);
            let mut version = 1;
            r.apply_plan(snapshot(version, plan.values().cloned().collect()))
                .unwrap();
            for n in names {
                up(&mut r, n);
            }
            check_against_scratch(&r, &plan, &node, &format!("seed {seed} start"));
            for step in 0..25 {
                // Change one shape (all its replicas), or one pod's assignment.
                let s = rng.below(3) as usize;
                match rng.below(5) {
                    // A peer joins or leaves one rule: the churn this is for.
                    0..=2 => {
                        let d = if rng.below(2) == 0 {
                            &mut shapes[s].0
                        } else {
                            &mut shapes[s].1
                        };
                        if let Some(d) = d {
                            if let Some(rule) = d.rules.first_mut() {
                                let host = proto_prefix(&v4([10, 0, 0, rng.below(12) as u8], 32));
                                if let Some(i) =
                                    rule.peers.iter().position(|p| p.cidr == Some(host.clone()))
                                {
                                    rule.peers.remove(i);
                                } else {
                                    rule.peers.push(PeerBlock {
                                        cidr: Some(host),
                                        except: vec![],
                                    });
                                }
                            }
                        }
                    }
                    3 => shapes[s] = (random_direction(&mut rng), random_direction(&mut rng)),
                    // One pod leaves its replicas' policy, or returns to it.
                    _ => {
                        let p = names[rng.below(names.len() as u64) as usize].to_string();
                        if overrides.remove(&p).is_none() {
                            let d = random_direction(&mut rng);
                            overrides.insert(p.clone(), pod(&p, d, None));
                        }
                    }
                }
                let mut next = plan_of(&shapes);
                next.extend(overrides.clone());
                let changed: Vec<PodPolicy> = next
                    .iter()
                    .filter(|(n, p)| plan.get(*n) != Some(p))
                    .map(|(_, p)| p.clone())
                    .collect();
                plan = next;
                let from = r.datapath.log.len();
                version += 1;
                let msg = if rng.below(3) == 0 {
                    snapshot(version, plan.values().cloned().collect())
                } else {
                    PlanMessage::Delta(PlanDelta {
                        term: 0,
                        base_version: version - 1,
                        version,
                        upserted: changed,
                        removed: vec![],
                        ..Default::default()
                    })
                };
                // Sometimes a write fails part-way; the tick after retries.
                let fail = rng.below(6) == 0;
                if fail {
                    r.datapath.fail.insert(
                        ["update_policy", "renew_epochs", "add_policy", "add_portset"]
                            [rng.below(4) as usize]
                            .into(),
                    );
                }
                r.apply_plan(msg).unwrap();
                let log = log_since(&r, from);
                in_place += log
                    .iter()
                    .filter(|l| l.starts_with("update_policy"))
                    .count();
                narrowing += log.iter().filter(|l| l.starts_with("renew_epochs")).count();
                assert!(
                    r.datapath.violations.is_empty(),
                    "seed {seed} step {step}: {:?}",
                    r.datapath.violations
                );
                if fail {
                    r.datapath.fail.clear();
                    r.handle(Event::Tick);
                }
                check_against_scratch(&r, &plan, &node, &format!("seed {seed} step {step}"));
                assert!(
                    r.node_state().errors.is_empty(),
                    "seed {seed} step {step}: {:?}",
                    r.node_state().errors
                );
            }
        }
        assert!(
            in_place > 100 && narrowing > 50,
            "{in_place} edits, {narrowing} renewals"
        );
    }

    /// The enforcer dies after narrowing a table in place, before renewing its
    /// users' epochs: the table is final, so nothing is left to diff. The next
    /// process renews every isolated direction on takeover.
    #[test]
    fn a_restart_renews_what_a_dead_predecessor_may_have_owed() {
        let dir = tempfile::tempdir().unwrap();
        let mut r =
            reconciler().with_checkpoint(crate::checkpoint::Checkpoint::open(dir.path()).unwrap());
        shared_setup(&mut r, &hosts(1..11));
        // Every renewal fails: as good as dead right after the edit.
        r.datapath.fail.insert("renew_epochs".into());
        r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();
        assert_eq!(r.datapath.stale_flows.len(), 3);
        r.flush();

        let mut datapath = std::mem::take(&mut r.datapath);
        datapath.fail.clear();
        let cp = crate::checkpoint::Checkpoint::open(dir.path()).unwrap();
        let saved = cp.load().unwrap();
        let mut r2 = Reconciler::new("n1".into(), "e2".into(), datapath).with_checkpoint(cp);
        r2.recover(saved).unwrap();
        assert!(
            r2.datapath.stale_flows.is_empty(),
            "{:?}",
            r2.datapath.stale_flows
        );
        r2.datapath.assert_no_violations();
    }

    /// Every churn event compiles new tables; the memo must not keep the ones
    /// nothing uses any more.
    #[test]
    fn compiled_tables_do_not_pile_up_under_churn() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let before = r.target.compiled.len();
        for v in 2..40u64 {
            let last = 11 + (v % 2) as u8;
            r.apply_plan(peer_change(v, &hosts(1..last))).unwrap();
        }
        assert!(
            r.target.compiled.len() <= before,
            "{} > {before}",
            r.target.compiled.len()
        );
        r.datapath.assert_no_violations();
    }

    /// A failed edit whose users cannot all be moved off the half-edited table:
    /// it stays, with every port set any of its keys may point at.
    #[test]
    fn a_half_edited_table_still_in_use_keeps_its_port_sets() {
        let mut r = reconciler();
        shared_setup(&mut r, &hosts(1..11));
        let id = ingress_id(&r, "a");
        let b = ifindex(&r, "b");
        // Every key's value changes (port 80 -> 81); the edit dies half-way,
        // the new table cannot be written, and b cannot be moved to deny-all.
        r.datapath
            .fail
            .insert(format!("update_policy {id} upsert 10.0.0.5/32"));
        r.datapath.fail.insert("add_policy".into());
        r.datapath.fail.insert(format!("set_endpoint {b}"));
        let moved = direction(vec![rule(&hosts(1..11), 81)]);
        r.apply_plan(PlanMessage::Delta(PlanDelta {
            term: 0,
            base_version: 1,
            version: 2,
            upserted: vec![
                pod("a", moved.clone(), None),
                pod("b", moved.clone(), None),
                pod("c", None, moved),
            ],
            removed: vec![],
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(ingress_id(&r, "a"), DENY_ALL);
        assert_eq!(ingress_id(&r, "b"), id, "b stays on the half-edited table");
        assert!(
            r.datapath.violations.is_empty(),
            "{:?}",
            r.datapath.violations
        );
        assert!(!r.node_state().errors.is_empty());

        r.datapath.fail.clear();
        r.handle(Event::Tick);
        let new = ingress_id(&r, "b");
        assert!(new != id && new != DENY_ALL);
        assert_eq!(ingress_id(&r, "a"), new);
        assert!(!r.datapath.policies.contains_key(&id));
        r.datapath.assert_no_violations();
    }
}
