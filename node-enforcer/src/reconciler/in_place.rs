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
    let narrows = !changed.is_empty() || !removals.is_empty();
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
mod tests;
