//! Keeps [`crate::MAP_POLICY_LENS`] exact as a policy's entries come and go:
//! the programs look a policy up by one exact lookup per prefix length it
//! lists, so a listed length with no entry costs a lookup, and an entry of
//! an unlisted length goes unseen (a wrong verdict). Pure: the caller owns
//! the maps and follows the order each method names.

use std::collections::BTreeMap;

use crate::PolicyLens;

/// What to do with a policy's [`crate::MAP_POLICY_LENS`] entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LensUpdate {
    /// The lengths are as listed; nothing to write.
    Unchanged,
    /// Write this value.
    Write(PolicyLens),
    /// Remove the entry: the policy has no entries, or more lengths than a
    /// [`PolicyLens`] holds, and is looked up in the trie.
    Delete,
}

/// How many entries of each trie prefix length every policy has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyLenCounts(BTreeMap<u32, BTreeMap<u32, usize>>);

impl PolicyLenCounts {
    /// Counts entries of `prefix_lens` added to `policy_id`. Apply the
    /// update BEFORE writing the entries (trie first, then the exact map):
    /// a length listed ahead of its entries only costs a lookup, while
    /// entries ahead of their length would be missed. The first call for a
    /// policy never answers `Unchanged`, so a leftover value is overwritten.
    pub fn adding(
        &mut self,
        policy_id: u32,
        prefix_lens: impl IntoIterator<Item = u32>,
    ) -> LensUpdate {
        let new_policy = !self.0.contains_key(&policy_id);
        let counts = self.0.entry(policy_id).or_default();
        let before = counts.len();
        for len in prefix_lens {
            *counts.entry(len).or_default() += 1;
        }
        if !new_policy && counts.len() == before {
            return LensUpdate::Unchanged;
        }
        lens_of(counts)
    }

    /// Counts entries of `prefix_lens` removed from `policy_id` (lengths it
    /// does not have are ignored). Apply the update AFTER removing the
    /// entries (exact map first, then the trie), for the same reason.
    pub fn removing(
        &mut self,
        policy_id: u32,
        prefix_lens: impl IntoIterator<Item = u32>,
    ) -> LensUpdate {
        let Some(counts) = self.0.get_mut(&policy_id) else {
            return LensUpdate::Delete;
        };
        let before = counts.len();
        for len in prefix_lens {
            if let Some(n) = counts.get_mut(&len) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&len);
                }
            }
        }
        if counts.is_empty() {
            self.0.remove(&policy_id);
            return LensUpdate::Delete;
        }
        if counts.len() == before {
            return LensUpdate::Unchanged;
        }
        lens_of(counts)
    }

    /// Forgets a policy whose every entry was removed.
    pub fn forget(&mut self, policy_id: u32) {
        self.0.remove(&policy_id);
    }

    pub fn policies(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.keys().copied()
    }

    /// The value the policy's entry should hold now (`Delete`: none).
    pub fn current(&self, policy_id: u32) -> LensUpdate {
        match self.0.get(&policy_id) {
            Some(counts) => lens_of(counts),
            None => LensUpdate::Delete,
        }
    }
}

fn lens_of(counts: &BTreeMap<u32, usize>) -> LensUpdate {
    match PolicyLens::new(counts.keys().copied()) {
        Some(v) if v.count > 0 => LensUpdate::Write(v),
        _ => LensUpdate::Delete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_POLICY_LENS;

    fn written(u: LensUpdate) -> Vec<u32> {
        match u {
            LensUpdate::Write(v) => v.lens().to_vec(),
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn lengths_are_listed_longest_first_once_each() {
        let mut c = PolicyLenCounts::default();
        assert_eq!(written(c.adding(1, [152, 160, 160, 128])), [160, 152, 128]);
        assert_eq!(c.adding(1, [160]), LensUpdate::Unchanged);
        assert_eq!(written(c.adding(1, [140])), [160, 152, 140, 128]);
    }

    #[test]
    fn a_new_policy_always_gets_a_write() {
        let mut c = PolicyLenCounts::default();
        assert_eq!(written(c.adding(7, [160])), [160]);
        assert_eq!(written(c.adding(8, [160])), [160]);
    }

    #[test]
    fn a_length_leaves_the_list_with_its_last_entry() {
        let mut c = PolicyLenCounts::default();
        c.adding(1, [160, 160, 152]);
        assert_eq!(c.removing(1, [160]), LensUpdate::Unchanged);
        assert_eq!(written(c.removing(1, [160])), [152]);
        assert_eq!(c.removing(1, [152]), LensUpdate::Delete);
        assert_eq!(c.current(1), LensUpdate::Delete);
        assert_eq!(c.removing(1, [152]), LensUpdate::Delete, "unknown policy");
    }

    #[test]
    fn too_many_lengths_fall_back_to_the_trie_and_back() {
        let mut c = PolicyLenCounts::default();
        let many: Vec<u32> = (0..=MAX_POLICY_LENS as u32).map(|i| 160 - i).collect();
        assert_eq!(c.adding(1, many.iter().copied()), LensUpdate::Delete);
        assert_eq!(c.adding(1, [160]), LensUpdate::Unchanged);
        assert_eq!(
            written(c.removing(1, [many[MAX_POLICY_LENS]])).len(),
            MAX_POLICY_LENS
        );
    }
}
