//! The learned overlay as the learner writes it: slots of `pal_learned`
//! found through `pal_learned_index`, each naming a port set of
//! `pal_ports` in the learner's own id range (from
//! [`LEARNED_PORTSET_BASE`]). The rules that keep every packet's reading
//! whole are [`LearnedSlot`]'s; this module is their one writer:
//!
//! - a slot is filled while free (no index entry names it, `ifindex` 0):
//!   everything but `ifindex`, then `ifindex` with a release store, then
//!   the index entry;
//! - a live slot's port set and expiry are rewritten in place, each with
//!   one atomic store;
//! - a slot is retired by deleting its index entry, then clearing
//!   `ifindex`, and is filled again only a grace period later;
//! - a port set no slot names is removed only a grace period after the
//!   last slot stopped naming it (a packet may still be judging by it),
//!   and its id is taken again only after that.
//!
//! Port sets are shared by content, as the reconciler's are: most learned
//! addresses of a pod get the same one.

use std::collections::{HashMap as StdHashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{HashMap, Map, MapData};
use palisade_ebpf::{
    LearnedKey, LearnedSlot, PortKey, PortValue, MAP_LEARNED, MAP_LEARNED_INDEX, MAP_PORTS,
    MAX_LEARNED_ENTRIES,
};

use super::err;
use super::grace::Grace;
use super::mapped::Mapped;
use crate::compile::PortSet;
use crate::datapath::{DatapathError, PortSetId, Result, LEARNED_PORTSET_BASE};

const IFINDEX: usize = std::mem::offset_of!(LearnedSlot, ifindex);
const PORTSET: usize = std::mem::offset_of!(LearnedSlot, portset_id);
const AUDIT: usize = std::mem::offset_of!(LearnedSlot, audit_portset_id);
const EXPIRES: usize = std::mem::offset_of!(LearnedSlot, expires_ns);

/// One overlay entry as the maps hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnedEntry {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub ports: PortSet,
    /// The staged (audit) egress's port set for the host, if it has one.
    pub staged: Option<PortSet>,
    pub expiry: u64,
}

/// The port sets a live slot names.
#[derive(Clone)]
struct Sets {
    ports: PortSet,
    staged: Option<PortSet>,
}

struct SharedSet {
    id: PortSetId,
    users: usize,
}

pub struct LearnedMaps {
    index: HashMap<MapData, LearnedKey, u32>,
    slots: Mapped<LearnedSlot>,
    _slots_data: MapData,
    ports: LpmTrie<MapData, PortKey, PortValue>,
    grace: Arc<Grace>,
    /// Live entries: key → (slot, its port sets).
    at: StdHashMap<LearnedKey, (u32, Sets)>,
    /// Slots free to fill now.
    free: Vec<u32>,
    /// Slots retired at a grace token, oldest first.
    retired: VecDeque<(u64, u32)>,
    sets: StdHashMap<PortSet, SharedSet>,
    /// Port sets no slot names, to remove once their token has passed.
    dropped_sets: VecDeque<(u64, PortSetId, PortSet)>,
    next_id: PortSetId,
}

fn open(pin_root: &Path, name: &str) -> Result<MapData> {
    MapData::from_pin(pin_root.join(name)).map_err(|e| err(format!("opening pinned {name}"), e))
}

fn port_keys(id: PortSetId, set: &PortSet) -> Vec<(aya::maps::lpm_trie::Key<PortKey>, PortValue)> {
    super::port_keys(id, set)
}

impl LearnedMaps {
    /// Opens the pinned maps under `pin_root` (the datapath has loaded
    /// them) and takes over what a previous learner left: every slot the
    /// index names and that names its key stays, with its port set; any
    /// other slot and any port set of the learner's range no slot names
    /// is cleared.
    pub fn open(pin_root: &Path) -> Result<(Self, Vec<LearnedEntry>)> {
        let grace = Grace::start()?;
        let slots_data = open(pin_root, MAP_LEARNED)?;
        let info = slots_data.info().map_err(|e| err(MAP_LEARNED, e))?;
        if info.max_entries() != MAX_LEARNED_ENTRIES {
            return Err(DatapathError::invariant(format!(
                "{MAP_LEARNED} has {} slots, this version needs {MAX_LEARNED_ENTRIES}",
                info.max_entries()
            )));
        }
        let slots: Mapped<LearnedSlot> =
            Mapped::new(slots_data.fd().as_fd(), MAX_LEARNED_ENTRIES, true)
                .map_err(|e| err(format!("memory-mapping {MAP_LEARNED}"), e))?;
        let index = HashMap::try_from(Map::HashMap(open(pin_root, MAP_LEARNED_INDEX)?))
            .map_err(|e| err(MAP_LEARNED_INDEX, e))?;
        let ports = LpmTrie::try_from(Map::LpmTrie(open(pin_root, MAP_PORTS)?))
            .map_err(|e| err(MAP_PORTS, e))?;
        let mut maps = LearnedMaps {
            index,
            slots,
            _slots_data: slots_data,
            ports,
            grace,
            at: StdHashMap::new(),
            free: Vec::new(),
            retired: VecDeque::new(),
            sets: StdHashMap::new(),
            dropped_sets: VecDeque::new(),
            next_id: LEARNED_PORTSET_BASE,
        };
        let adopted = maps.adopt()?;
        Ok((maps, adopted))
    }

    fn adopt(&mut self) -> Result<Vec<LearnedEntry>> {
        // The learner's port sets, by id.
        let mut by_id: StdHashMap<PortSetId, PortSet> = StdHashMap::new();
        let mut adopted = crate::datapath::Adopted::default();
        super::super::inspect::read_learned_portsets(&self.ports, &mut adopted)?;
        for (id, set) in adopted.portsets {
            by_id.insert(id, set);
        }
        let listed: Vec<(LearnedKey, u32)> = self.index.iter().filter_map(|r| r.ok()).collect();
        let mut used = vec![false; MAX_LEARNED_ENTRIES as usize];
        let mut out = Vec::new();
        for (key, slot) in listed {
            let v = (slot < MAX_LEARNED_ENTRIES).then(|| self.slots.read(slot));
            let ok = v.is_some_and(|v| {
                v.ifindex == key.ifindex && v.addr == key.addr && !used[slot as usize]
            }) && v.is_some_and(|v| by_id.contains_key(&v.portset_id));
            if !ok {
                let _ = self.index.remove(&key);
                continue;
            }
            let v = v.expect("checked");
            used[slot as usize] = true;
            let mut adopt_set = |id: PortSetId| {
                let set = by_id.get(&id)?.clone();
                self.sets
                    .entry(set.clone())
                    .or_insert(SharedSet { id, users: 0 })
                    .users += 1;
                self.next_id = self.next_id.max(id);
                Some(set)
            };
            let set = adopt_set(v.portset_id).expect("checked");
            // A staged port set the range does not hold is dropped: the
            // staged table judges that host again (reports only).
            let staged = match v.audit_portset_id {
                0 => None,
                id => adopt_set(id),
            };
            if v.audit_portset_id != 0 && staged.is_none() {
                self.slots.store_u32(slot, AUDIT, 0);
            }
            self.at.insert(
                key,
                (
                    slot,
                    Sets {
                        ports: set.clone(),
                        staged: staged.clone(),
                    },
                ),
            );
            out.push(LearnedEntry {
                ifindex: key.ifindex,
                addr: std::net::Ipv6Addr::from(key.addr)
                    .to_ipv4_mapped()
                    .map_or(IpAddr::V6(std::net::Ipv6Addr::from(key.addr)), IpAddr::V4),
                ports: set,
                staged,
                expiry: v.expires_ns,
            });
        }
        // Everything else is free: slots no live key holds are cleared
        // (no index entry names them now, and none did a grace period
        // from now: wait it out once before any is filled).
        let token = self.grace.token();
        for slot in (0..MAX_LEARNED_ENTRIES).rev() {
            if used[slot as usize] {
                continue;
            }
            if self.slots.read(slot).ifindex != 0 {
                self.slots.store_u32(slot, IFINDEX, 0);
                self.retired.push_back((token, slot));
            } else {
                self.free.push(slot);
            }
        }
        // Port sets of the range no slot names: a packet that read a
        // cleared slot may still use one; removed a grace period on.
        let kept: std::collections::HashSet<PortSetId> = self.sets.values().map(|s| s.id).collect();
        for (id, set) in by_id {
            if !kept.contains(&id) {
                self.dropped_sets.push_back((token, id, set));
            }
        }
        Ok(out)
    }

    /// Writes the entry of (ifindex, addr): `ports` until `expiry`, and
    /// `staged` for the pod's staged egress (None: its table decides).
    pub fn set(
        &mut self,
        ifindex: u32,
        addr: IpAddr,
        ports: &PortSet,
        staged: Option<&PortSet>,
        expiry: u64,
    ) -> Result<()> {
        self.collect();
        let key = LearnedKey::new(ifindex, addr);
        let id = self.acquire(ports)?;
        let staged_id = match staged.map(|s| self.acquire(s)).transpose() {
            Ok(id) => id.unwrap_or(0),
            Err(e) => {
                self.release(ports);
                return Err(e);
            }
        };
        let sets = Sets {
            ports: ports.clone(),
            staged: staged.cloned(),
        };
        if let Some((slot, old)) = self.at.get(&key).cloned() {
            self.slots.store_u32(slot, PORTSET, id);
            self.slots.store_u32(slot, AUDIT, staged_id);
            self.slots.store_u64(slot, EXPIRES, expiry);
            self.at.insert(key, (slot, sets));
            self.release_sets(&old);
            return Ok(());
        }
        let slot = match self.take_slot() {
            Ok(s) => s,
            Err(e) => {
                self.release_sets(&sets);
                return Err(e);
            }
        };
        let mut value = LearnedSlot::new(&key, id, staged_id, expiry);
        value.ifindex = 0;
        self.slots.write(slot, value);
        self.slots.store_u32(slot, IFINDEX, ifindex);
        if let Err(e) = self.index.insert(key, slot, 0) {
            self.slots.store_u32(slot, IFINDEX, 0);
            self.retired.push_back((self.grace.token(), slot));
            self.release_sets(&sets);
            return Err(err(format!("writing {MAP_LEARNED_INDEX}"), e));
        }
        self.at.insert(key, (slot, sets));
        Ok(())
    }

    /// Removes the entry of (ifindex, addr); one that is not there is fine.
    pub fn clear(&mut self, ifindex: u32, addr: IpAddr) -> Result<()> {
        self.collect();
        let key = LearnedKey::new(ifindex, addr);
        let Some((slot, sets)) = self.at.remove(&key) else {
            return Ok(());
        };
        let removed = self.index.remove(&key);
        self.slots.store_u32(slot, IFINDEX, 0);
        self.retired.push_back((self.grace.token(), slot));
        self.release_sets(&sets);
        removed.map_err(|e| err(format!("removing from {MAP_LEARNED_INDEX}"), e))
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Port sets written (shared ones once).
    pub fn port_sets(&self) -> usize {
        self.sets.len()
    }

    /// The entry as the slot holds it now (for tests and the dump).
    pub fn slot_of(&self, ifindex: u32, addr: IpAddr) -> Option<(u32, LearnedSlot)> {
        let (slot, _) = self.at.get(&LearnedKey::new(ifindex, addr))?;
        Some((*slot, self.slots.read(*slot)))
    }

    fn take_slot(&mut self) -> Result<u32> {
        if let Some(s) = self.free.pop() {
            return Ok(s);
        }
        let Some(&(token, slot)) = self.retired.front() else {
            return Err(DatapathError::invariant(format!(
                "{MAP_LEARNED} is full: {MAX_LEARNED_ENTRIES} learned entries on this node"
            )));
        };
        self.grace.wait_past(token)?;
        self.retired.pop_front();
        Ok(slot)
    }

    /// Frees what a grace period has made safe: retired slots, dropped
    /// port sets.
    fn collect(&mut self) {
        while let Some(&(token, slot)) = self.retired.front() {
            if !self.grace.passed(token) {
                self.grace.ask(token);
                break;
            }
            self.retired.pop_front();
            self.free.push(slot);
        }
        while let Some((token, _, _)) = self.dropped_sets.front() {
            if !self.grace.passed(*token) {
                self.grace.ask(*token);
                break;
            }
            let (_, id, set) = self.dropped_sets.pop_front().expect("front");
            for (k, _) in port_keys(id, &set) {
                let _ = self.ports.remove(&k);
            }
        }
    }

    fn acquire(&mut self, set: &PortSet) -> Result<PortSetId> {
        if let Some(s) = self.sets.get_mut(set) {
            s.users += 1;
            return Ok(s.id);
        }
        let busy = |id: PortSetId, maps: &LearnedMaps| {
            maps.sets.values().any(|s| s.id == id) || maps.dropped_sets.iter().any(|d| d.1 == id)
        };
        let span = u32::MAX - LEARNED_PORTSET_BASE;
        let mut id = self.next_id;
        for _ in 0..=span {
            id = if id == u32::MAX {
                LEARNED_PORTSET_BASE
            } else {
                id + 1
            };
            if !busy(id, self) {
                break;
            }
        }
        self.next_id = id;
        for (k, v) in port_keys(id, set) {
            self.ports
                .insert(&k, v, 0)
                .map_err(|e| err(format!("writing {MAP_PORTS}"), e))?;
        }
        self.sets.insert(set.clone(), SharedSet { id, users: 1 });
        Ok(id)
    }

    fn release_sets(&mut self, sets: &Sets) {
        self.release(&sets.ports);
        if let Some(staged) = &sets.staged {
            self.release(staged);
        }
    }

    fn release(&mut self, set: &PortSet) {
        let Some(s) = self.sets.get_mut(set) else {
            return;
        };
        s.users -= 1;
        if s.users == 0 {
            let id = s.id;
            self.sets.remove(set);
            self.dropped_sets
                .push_back((self.grace.token(), id, set.clone()));
        }
    }
}
