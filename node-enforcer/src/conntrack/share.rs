//! Each endpoint hook's share of the eBPF conntrack maps (DESIGN invariant
//! 17). The programs count the entries each hook of each endpoint creates
//! and removes (`pal_ct_share`, by endpoint slot) and drop a new flow once
//! the hook holds its share, so a pod opening flows as fast as it can fills
//! its own share and cannot evict every other pod's established flows.
//!
//! Two kinds of removal go uncounted: the table's LRU evicting an entry
//! (which happens only when the table is nearly full) and this cleanup's
//! own removals. Each pass therefore recounts, from its walk of the maps,
//! the entries every endpoint hook holds, and corrects the counters with
//! atomic adds (the programs keep counting meanwhile). Entries created
//! during the walk may or may not have been seen, so a count is lowered
//! only to what the walk saw plus every entry created meanwhile: a count
//! never drops below what the hook may hold, and a share is never passed
//! by more than the CPUs racing to create one entry each. (A count left
//! high by evictions only refuses that hook's new flows early, until the
//! next pass.)

use std::collections::HashMap;
use std::mem::offset_of;
use std::os::fd::AsFd;
use std::path::Path;

use aya::maps::MapData;
use palisade_ebpf::{CtShare, EpSlot, EP_SLOTS, MAP_CT_SHARE, MAP_EP_SLOTS};

use super::ConntrackError;
use crate::datapath::bpf::mapped::Mapped;

/// What a counter should be told, given what it says (`counted`: created
/// minus removed), what the walk saw the hook hold (`seen`), and how many
/// entries the hook created while the walk ran (`created_meanwhile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Correction {
    Keep,
    /// Count this many more as removed: evicted or cleaned up unseen.
    Removed(u64),
    /// Count this many more as created: entries no counter knew of (made
    /// by an older version, or lost while an endpoint moved slots).
    Created(u64),
}

pub fn correction(counted: u64, seen: u64, created_meanwhile: u64) -> Correction {
    let most = seen.saturating_add(created_meanwhile);
    if counted > most {
        Correction::Removed(counted - most)
    } else if counted < seen {
        Correction::Created(seen - counted)
    } else {
        Correction::Keep
    }
}

/// The counters and the slots they belong to, memory-mapped.
pub struct Shares {
    slots: Mapped<EpSlot>,
    shares: Mapped<CtShare>,
}

/// Who held each slot, and what it had created, when a pass began.
pub struct Before {
    held: Vec<(u32, [u64; 2])>,
}

const CREATED: usize = offset_of!(CtShare, created);
const REMOVED: usize = offset_of!(CtShare, removed);

fn map(pin_root: &Path, name: &str) -> Result<MapData, ConntrackError> {
    let path = pin_root.join(name);
    MapData::from_pin(&path).map_err(ConntrackError::pin(&path))
}

fn mmap(map: &'static str) -> impl FnOnce(std::io::Error) -> ConntrackError {
    move |source| ConntrackError::Mmap { map, source }
}

impl Shares {
    pub fn open(pin_root: &Path) -> Result<Self, ConntrackError> {
        let slots = map(pin_root, MAP_EP_SLOTS)?;
        let shares = map(pin_root, MAP_CT_SHARE)?;
        Ok(Shares {
            slots: Mapped::new(slots.fd().as_fd(), EP_SLOTS, false).map_err(mmap(MAP_EP_SLOTS))?,
            shares: Mapped::new(shares.fd().as_fd(), EP_SLOTS, true).map_err(mmap(MAP_CT_SHARE))?,
        })
    }

    fn occupant(&self, slot: u32) -> u32 {
        self.slots.read(slot).ifindex
    }

    fn created(&self, slot: u32) -> [u64; 2] {
        [0, 1].map(|hook| self.shares.load_u64(slot, CREATED + 8 * hook))
    }

    /// The (egress, ingress) entries the counters say the endpoint of
    /// `ifindex` holds, if a slot holds it.
    pub fn held(&self, ifindex: u32) -> Option<[u64; 2]> {
        let slot = (0..EP_SLOTS).find(|&s| ifindex != 0 && self.occupant(s) == ifindex)?;
        let created = self.created(slot);
        Some([0, 1].map(|o| created[o].wrapping_sub(self.shares.load_u64(slot, REMOVED + 8 * o))))
    }

    /// Taken before a pass reads the maps.
    pub fn before(&self) -> Before {
        Before {
            held: (0..EP_SLOTS)
                .map(|s| (self.occupant(s), self.created(s)))
                .collect(),
        }
    }

    /// Corrects every counter of a slot that held the same endpoint
    /// throughout the pass, given the entries the pass left each hook
    /// (`kept`, by ifindex and hook). Returns how many counters moved.
    pub fn correct(&self, before: &Before, kept: &HashMap<(u32, u8), u64>) -> usize {
        let mut moved = 0;
        for (slot, &(ifindex, created0)) in (0..EP_SLOTS).zip(&before.held) {
            if ifindex == 0 || self.occupant(slot) != ifindex {
                continue;
            }
            let created1 = self.created(slot);
            for hook in [0u8, 1] {
                let o = usize::from(hook);
                let removed = self.shares.load_u64(slot, REMOVED + 8 * o);
                let counted = created1[o].wrapping_sub(removed);
                let seen = kept.get(&(ifindex, hook)).copied().unwrap_or(0);
                let meanwhile = created1[o].wrapping_sub(created0[o]);
                match correction(counted, seen, meanwhile) {
                    Correction::Keep => continue,
                    Correction::Removed(n) => self.shares.add_u64(slot, REMOVED + 8 * o, n),
                    Correction::Created(n) => self.shares.add_u64(slot, CREATED + 8 * o, n),
                }
                moved += 1;
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_move_only_outside_what_the_walk_allows() {
        // Exactly what the walk saw: nothing to say.
        assert_eq!(correction(10, 10, 0), Correction::Keep);
        // Entries made during the walk may be unseen: up to that many more
        // stay counted.
        assert_eq!(correction(13, 10, 3), Correction::Keep);
        assert_eq!(correction(14, 10, 3), Correction::Removed(1));
        // Evicted or cleaned up: lowered to what was seen.
        assert_eq!(correction(50, 10, 0), Correction::Removed(40));
        // Entries no counter knew of (an older version's): raised.
        assert_eq!(correction(0, 7, 0), Correction::Created(7));
        assert_eq!(correction(5, 7, 9), Correction::Created(2));
        assert_eq!(correction(0, 0, 0), Correction::Keep);
        // Exhaustively: the result always lands between seen and
        // seen + meanwhile.
        for counted in 0..20u64 {
            for seen in 0..20u64 {
                for meanwhile in 0..5u64 {
                    let after = match correction(counted, seen, meanwhile) {
                        Correction::Keep => counted,
                        Correction::Removed(n) => counted - n,
                        Correction::Created(n) => counted + n,
                    };
                    assert!(
                        seen <= after && after <= seen + meanwhile,
                        "{counted} {seen} {meanwhile} -> {after}"
                    );
                    if (seen..=seen + meanwhile).contains(&counted) {
                        assert_eq!(after, counted, "in range: left alone");
                    }
                }
            }
        }
    }
}
