//! What one watch has delivered, by key and resourceVersion, so that its
//! events become changes to single objects. A relist (after the watch fell
//! too far behind, or on the first list) replays every object: those whose
//! resourceVersion did not move are no change at all, and objects the relist
//! no longer holds were deleted while the watch was down.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

pub struct Tracker<K> {
    /// Every object the watch holds, with its resourceVersion.
    known: HashMap<K, String>,
    /// The keys a relist in progress has delivered so far.
    relisting: Option<HashSet<K>>,
    /// Whether a list has completed once.
    listed: bool,
}

impl<K> Default for Tracker<K> {
    fn default() -> Self {
        Tracker {
            known: HashMap::new(),
            relisting: None,
            listed: false,
        }
    }
}

impl<K: Hash + Eq + Clone> Tracker<K> {
    /// A list starts.
    pub fn init(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// An object of a list; true when it is new or changed since the watch
    /// last delivered it.
    pub fn init_apply(&mut self, key: K, version: &str) -> bool {
        if let Some(seen) = &mut self.relisting {
            seen.insert(key.clone());
        }
        self.apply(key, version)
    }

    /// The list is complete: the keys it did not deliver, which are gone.
    pub fn init_done(&mut self) -> Vec<K> {
        self.listed = true;
        let Some(seen) = self.relisting.take() else {
            // InitDone without Init: nothing to compare with.
            return Vec::new();
        };
        let gone: Vec<K> = self
            .known
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in &gone {
            self.known.remove(key);
        }
        gone
    }

    /// An object created or changed; true unless it is the version already
    /// delivered. An empty version never counts as the same.
    pub fn apply(&mut self, key: K, version: &str) -> bool {
        match self.known.get_mut(&key) {
            Some(v) if !version.is_empty() && v == version => false,
            Some(v) => {
                *v = version.to_string();
                true
            }
            None => {
                self.known.insert(key, version.to_string());
                true
            }
        }
    }

    /// An object deleted.
    pub fn delete(&mut self, key: &K) {
        self.known.remove(key);
        if let Some(seen) = &mut self.relisting {
            seen.remove(key);
        }
    }

    pub fn listed(&self) -> bool {
        self.listed
    }

    /// How many objects the watch holds.
    pub fn count(&self) -> usize {
        self.known.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_list_applies_everything_and_deletes_nothing() {
        let mut t = Tracker::default();
        t.init();
        assert!(t.init_apply("a", "1"));
        assert!(t.init_apply("b", "2"));
        assert!(!t.listed());
        assert!(t.init_done().is_empty());
        assert!(t.listed());
        assert_eq!(t.count(), 2);
    }

    #[test]
    fn relist_skips_unchanged_objects_and_reports_the_ones_gone() {
        let mut t = Tracker::default();
        t.init();
        for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
            t.init_apply(k, v);
        }
        t.init_done();
        // Watch events, then the watch falls behind and relists.
        assert!(t.apply("d", "4"));
        assert!(!t.apply("d", "4"), "the same version again is no change");
        t.delete(&"a");
        t.init();
        assert!(!t.init_apply("b", "2"), "unchanged");
        assert!(t.init_apply("c", "7"), "changed while the watch was down");
        assert!(t.init_apply("e", "8"), "created while the watch was down");
        let mut gone = t.init_done();
        gone.sort();
        assert_eq!(gone, ["d"], "deleted while the watch was down");
        assert_eq!(t.count(), 3);
        assert!(t.init_done().is_empty(), "a stray InitDone deletes nothing");
    }

    #[test]
    fn an_object_without_a_version_always_counts_as_changed() {
        let mut t = Tracker::default();
        assert!(t.apply("a", ""));
        assert!(t.apply("a", ""));
    }
}
