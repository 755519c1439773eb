//! The policy tables as the programs read them: every entry in the
//! `pal_policy` trie, and again in `pal_policy_exact` under its exact key,
//! with `pal_policy_lens` listing each policy's prefix lengths so a lookup
//! is one hash probe per length instead of a trie walk that deepens with
//! the policy's size. The order of writes keeps every packet's answer the
//! trie's own: the exact map is a subset of the trie at all times, and a
//! policy's length list covers every entry the exact map holds for it.
//!
//! Hash elements are reused at once: the kernel hands a replaced or deleted
//! element of `pal_policy_exact` or `pal_policy_lens` to the next insert on
//! that CPU without waiting for readers (the trie frees its nodes only
//! after a grace period). So a table packets read is never edited in those
//! maps while its length list is there: an edit that would replace or
//! delete an element of either (a key's new port set, a removed key, a new
//! length list) first deletes the list, waits a grace period (packets now
//! judge by the trie alone, which every step keeps right), edits, and only
//! then lists the lengths again, in a fresh element. Tables no packet
//! reads (new ids, and retired ones once the endpoints' last write that
//! named them is a grace period old) are written and removed directly.

use std::collections::BTreeMap;
use std::sync::Arc;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap, MapData};
use aya::Ebpf;
use palisade_ebpf::policy_lens::{LensUpdate, PolicyLenCounts};
use palisade_ebpf::{
    PolicyExactKey, PolicyKey, PolicyLens, PolicyValue, MAP_POLICY, MAP_POLICY_EXACT,
    MAP_POLICY_LENS, POLICY_ID_BITS,
};

use super::err;
use super::grace::Grace;
use crate::compile::Prefix;
use crate::datapath::{DatapathError, PolicyId, PortSetId, Result};

pub(super) fn policy_key(id: PolicyId, p: &Prefix) -> Key<PolicyKey> {
    Key::new(
        POLICY_ID_BITS + u32::from(p.len),
        PolicyKey {
            policy_id: id,
            addr: p.addr,
        },
    )
}

/// A removal of a key that is not there.
fn not_found(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

pub(super) struct PolicyTables {
    pub(super) trie: LpmTrie<MapData, PolicyKey, PolicyValue>,
    exact: HashMap<MapData, PolicyExactKey, PolicyValue>,
    lens: HashMap<MapData, u32, PolicyLens>,
    counts: PolicyLenCounts,
    grace: Arc<Grace>,
}

impl PolicyTables {
    pub(super) fn take(ebpf: &mut Ebpf, grace: Arc<Grace>) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| DatapathError::invariant(format!("map {name} missing from object")))
        };
        Ok(PolicyTables {
            trie: LpmTrie::try_from(take(MAP_POLICY)?).map_err(|e| err(MAP_POLICY, e))?,
            exact: HashMap::try_from(take(MAP_POLICY_EXACT)?)
                .map_err(|e| err(MAP_POLICY_EXACT, e))?,
            lens: HashMap::try_from(take(MAP_POLICY_LENS)?).map_err(|e| err(MAP_POLICY_LENS, e))?,
            counts: PolicyLenCounts::default(),
            grace,
        })
    }

    fn apply(&mut self, id: PolicyId, update: LensUpdate) -> Result<()> {
        match update {
            LensUpdate::Unchanged => Ok(()),
            // Without grace periods no list could ever be edited safely:
            // every table is judged by the trie alone.
            LensUpdate::Write(_) if self.grace.stopped() => Ok(()),
            LensUpdate::Write(v) => self
                .lens
                .insert(id, v, 0)
                .map_err(|e| err(format!("writing {MAP_POLICY_LENS} for policy {id}"), e)),
            LensUpdate::Delete => match self.lens.remove(&id) {
                Ok(()) => Ok(()),
                Err(e) if not_found(&e) => Ok(()),
                Err(e) => Err(err(format!("removing {MAP_POLICY_LENS} of policy {id}"), e)),
            },
        }
    }

    /// Adds entries to policy `id`, a table no packet reads yet: lengths
    /// listed first, then each entry into the trie and then the exact map.
    pub(super) fn add(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        let keys: Vec<Key<PolicyKey>> = entries.iter().map(|(p, _)| policy_key(id, p)).collect();
        let update = self.counts.adding(id, keys.iter().map(|k| k.prefix_len()));
        if let Err(e) = self.apply(id, update) {
            // The counts ran ahead of the map; the trie alone is always right.
            let _ = self.lens.remove(&id);
            return Err(e);
        }
        for (key, (_, ps)) in keys.iter().zip(entries) {
            let value = PolicyValue { portset_id: *ps };
            self.trie
                .insert(key, value, 0)
                .map_err(|e| err(format!("writing {MAP_POLICY}"), e))?;
            self.exact
                .insert(PolicyExactKey::of(key), value, 0)
                .map_err(|e| err(format!("writing {MAP_POLICY_EXACT}"), e))?;
        }
        Ok(())
    }

    /// Removes entries of policy `id`, a table no packet reads any more:
    /// each from the exact map and then the trie, then the lengths no entry
    /// has any more. Missing entries are fine (removal follows a partial
    /// insert too).
    pub(super) fn remove(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        let keys: Vec<Key<PolicyKey>> = entries.iter().map(|(p, _)| policy_key(id, p)).collect();
        // A key already gone is fine (removal follows a partial insert too);
        // any other failure is reported: an in-place edit that narrows a
        // table must not leave an allow behind unseen.
        for key in &keys {
            if let Err(e) = self.exact.remove(&PolicyExactKey::of(key)) {
                if !not_found(&e) {
                    return Err(err(format!("removing from {MAP_POLICY_EXACT}"), e));
                }
            }
            if let Err(e) = self.trie.remove(key) {
                if !not_found(&e) {
                    return Err(err(format!("removing from {MAP_POLICY}"), e));
                }
            }
        }
        let update = self
            .counts
            .removing(id, keys.iter().map(|k| k.prefix_len()));
        self.apply(id, update)
    }

    /// Edits policy `id`, a table packets read (an in-place edit, in the
    /// order `reconciler::in_place` chose: every upsert, then every
    /// removal). Each trie write is one atomic step; the exact map and the
    /// length list are edited only while the list is gone and a grace
    /// period has passed (see the module comment) whenever the edit would
    /// replace or delete an element of either. An add-only edit that keeps
    /// the lengths writes only fresh elements and needs no wait. A failed
    /// wait leaves the table as it was, judged by the trie alone.
    pub(super) fn edit(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()> {
        let up: Vec<Key<PolicyKey>> = upserts.iter().map(|(p, _)| policy_key(id, p)).collect();
        let gone: Vec<Key<PolicyKey>> = removals.iter().map(|p| policy_key(id, p)).collect();
        let before = self.counts.current(id);
        let mut after = self.counts.clone();
        after.adding(id, up.iter().map(|k| k.prefix_len()));
        after.removing(id, gone.iter().map(|k| k.prefix_len()));
        let listed = matches!(before, LensUpdate::Write(_));
        let replaces = up
            .iter()
            .any(|k| self.exact.get(&PolicyExactKey::of(k), 0).is_ok());
        let quiet = listed && (replaces || !gone.is_empty() || after.current(id) != before);
        if quiet {
            self.apply(id, LensUpdate::Delete)?;
            if let Err(e) = self.grace.wait_past(self.grace.token()) {
                // Judged by the trie, which is unchanged; the caller
                // retires the table.
                self.counts.forget(id);
                return Err(err(format!("editing policy {id} in place"), e));
            }
        }
        for (key, (_, ps)) in up.iter().zip(upserts) {
            let value = PolicyValue { portset_id: *ps };
            self.trie
                .insert(key, value, 0)
                .map_err(|e| err(format!("writing {MAP_POLICY}"), e))?;
            self.exact
                .insert(PolicyExactKey::of(key), value, 0)
                .map_err(|e| err(format!("writing {MAP_POLICY_EXACT}"), e))?;
        }
        for key in &gone {
            if let Err(e) = self.exact.remove(&PolicyExactKey::of(key)) {
                if !not_found(&e) {
                    return Err(err(format!("removing from {MAP_POLICY_EXACT}"), e));
                }
            }
            if let Err(e) = self.trie.remove(key) {
                if !not_found(&e) {
                    return Err(err(format!("removing from {MAP_POLICY}"), e));
                }
            }
        }
        self.counts = after;
        if quiet || !listed {
            self.apply(id, self.counts.current(id))?;
        }
        Ok(())
    }

    /// After a restart: `adopted` is what the trie holds, the one table
    /// every version wrote. The exact map and length lists are rebuilt from
    /// it: every list is removed first (each policy answered by the trie,
    /// always right), then the exact map is made equal to the trie (filled
    /// in where an older version wrote the trie alone or a crash stopped
    /// between the two; entries the trie lacks, from a downgrade and
    /// upgrade say, removed), and only then are the lists written again.
    pub(super) fn adopt(
        &mut self,
        adopted: &BTreeMap<PolicyId, Vec<(Prefix, PortSetId)>>,
    ) -> Result<()> {
        let listed: Vec<u32> = self.lens.keys().filter_map(|k| k.ok()).collect();
        let token = self.grace.token();
        for &id in &listed {
            self.apply(id, LensUpdate::Delete)?;
        }
        // Packets may still read the lists just deleted (and the exact
        // entries they led to): nothing is written again before they are
        // done. Without grace periods the tables stay on the trie alone.
        if !listed.is_empty() {
            if let Err(e) = self.grace.wait_past(token) {
                tracing::warn!(error = %e, "policies are judged by the trie alone");
            }
        }
        let mut known = std::collections::HashSet::new();
        for (&id, entries) in adopted {
            for (p, ps) in entries {
                let key = PolicyExactKey::of(&policy_key(id, p));
                self.exact
                    .insert(key, PolicyValue { portset_id: *ps }, 0)
                    .map_err(|e| err(format!("writing {MAP_POLICY_EXACT}"), e))?;
                known.insert(key);
            }
        }
        let orphans: Vec<PolicyExactKey> = self
            .exact
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !known.contains(k))
            .collect();
        for k in orphans {
            let _ = self.exact.remove(&k);
        }
        self.counts = PolicyLenCounts::default();
        for (&id, entries) in adopted {
            let lens = entries.iter().map(|(p, _)| policy_key(id, p).prefix_len());
            let update = self.counts.adding(id, lens);
            self.apply(id, update)?;
        }
        Ok(())
    }
}
