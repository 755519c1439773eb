//! The endpoint slots (`pal_ep_slots`, memory-mapped) and their index
//! (`pal_ep_index`): every write of endpoint state, in the order that lets
//! a packet trust what it reads (DESIGN invariant 14; `struct ep_slot` in
//! the C header).
//!
//! Why not a hash of endpoints: the kernel hands a replaced or deleted hash
//! element to the next insert on that CPU without waiting for readers, so a
//! packet still reading one could read another endpoint's bytes. An array
//! slot is never anything but itself, and this writer changes one only in
//! ways a reader cannot misread:
//!
//! - a slot's ifindex, addresses and IPv4 list are written while its
//!   ifindex is 0 (no packet accepts it), then the ifindex with a release
//!   store, then the index entry (whose insert the kernel publishes after
//!   them): a packet that finds the slot through the index sees it whole;
//! - its home field is set to the ifindex a grace period later, so a packet
//!   that trusts the slot by its position alone sees it whole too;
//! - a direction's policy id and epoch are one word, the staged ids
//!   another: each changes with one 8-byte store;
//! - an endpoint leaves its slot (removed, or moving to another because
//!   its addresses changed or its home slot came free) by clearing home,
//!   then the index, then the ifindex; the slot is written again only a
//!   grace period later, when no packet that saw it is still running.
//!
//! The index entry itself may be read half-replaced or reused; the
//! programs only use a slot that names their interface, and drop the packet
//! otherwise.
//!
//! A thread of its own sets home fields and frees retired slots as their
//! grace periods pass, and brings endpoints living away from home back
//! when their home slot is free. The conntrack share counters of a slot
//! (`pal_ct_share`) follow its endpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::offset_of;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use aya::maps::{HashMap, MapData, MapError};
use aya::Ebpf;
use palisade_ebpf::{
    ep_home, CtShare, Direction, EpSlot, EP_SLOTS, MAP_CT_SHARE, MAP_EP_INDEX, MAP_EP_SLOTS,
};

use super::err;
use super::grace::Grace;
use super::mapped::Mapped;
use crate::datapath::{DatapathError, DatapathErrorKind, Result};

const IFINDEX: usize = offset_of!(EpSlot, ifindex);
const HOME: usize = offset_of!(EpSlot, home);
const INGRESS: usize = offset_of!(EpSlot, ingress);
const EGRESS: usize = offset_of!(EpSlot, egress);
const AUDIT: usize = offset_of!(EpSlot, audit);
const FLAGS: usize = offset_of!(EpSlot, flags);

/// What a slot is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    Free,
    Held(u32),
    /// Left by its endpoint at the grace period token; reusable once a
    /// grace period has passed since.
    Retired(u64),
}

struct State {
    slots: Mapped<EpSlot>,
    shares: Mapped<CtShare>,
    index: HashMap<MapData, u32, u32>,
    uses: Vec<Use>,
    /// ifindex → its slot.
    at: BTreeMap<u32, u32>,
    /// Slots written at their endpoint's home, waiting for a grace period
    /// past the token before their home field is set.
    homing: BTreeMap<u32, u64>,
    /// The token of the last write a packet may be acting on (a policy id
    /// or staged id put in or taken out of a slot): a table the old value
    /// named may be removed once a grace period has passed since.
    last_write: u64,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    grace: Arc<Grace>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere leaves the state as consistent as each write.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) struct EndpointSlots {
    shared: Arc<Shared>,
    filler: Option<JoinHandle<()>>,
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<MapData> {
    match ebpf.take_map(name) {
        Some(aya::maps::Map::Array(d)) | Some(aya::maps::Map::HashMap(d)) => Ok(d),
        Some(_) => Err(DatapathError::invariant(format!(
            "{name} is not of the expected type"
        ))),
        None => Err(DatapathError::invariant(format!(
            "map {name} missing from object"
        ))),
    }
}

fn mapped<T: Copy>(data: &MapData, name: &str) -> Result<Mapped<T>> {
    let info = data.info().map_err(|e| err(name, e))?;
    if info.max_entries() != EP_SLOTS {
        return Err(DatapathError::invariant(format!(
            "{name} has {} slots, this version needs {EP_SLOTS}",
            info.max_entries()
        )));
    }
    use std::os::fd::AsFd;
    Mapped::new(data.fd().as_fd(), EP_SLOTS, true)
        .map_err(|e| err(format!("memory-mapping {name}"), e))
}

impl EndpointSlots {
    /// Takes the maps and rebuilds what each slot holds from them: a slot
    /// the index names and that names the same interface is that
    /// endpoint's; anything else a previous process left half written is
    /// cleared and retired.
    pub(super) fn take(ebpf: &mut Ebpf, grace: Arc<Grace>) -> Result<Self> {
        let slots_data = take(ebpf, MAP_EP_SLOTS)?;
        let shares_data = take(ebpf, MAP_CT_SHARE)?;
        let index = HashMap::try_from(aya::maps::Map::HashMap(take(ebpf, MAP_EP_INDEX)?))
            .map_err(|e| err(MAP_EP_INDEX, e))?;
        let slots: Mapped<EpSlot> = mapped(&slots_data, MAP_EP_SLOTS)?;
        let shares: Mapped<CtShare> = mapped(&shares_data, MAP_CT_SHARE)?;
        let mut state = State {
            slots,
            shares,
            index,
            uses: vec![Use::Free; EP_SLOTS as usize],
            at: BTreeMap::new(),
            homing: BTreeMap::new(),
            last_write: grace.token(),
            stop: false,
        };
        let listed: Vec<(u32, u32)> = state.index.iter().filter_map(|item| item.ok()).collect();
        let token = grace.token();
        for (ifindex, slot) in listed {
            let named = slot < EP_SLOTS && state.slots.read(slot).ifindex == ifindex;
            if !named || state.uses[slot as usize] != Use::Free {
                tracing::warn!(
                    ifindex,
                    slot,
                    "dropping an endpoint index entry whose slot is not its own"
                );
                let _ = state.index.remove(&ifindex);
                continue;
            }
            state.uses[slot as usize] = Use::Held(ifindex);
            state.at.insert(ifindex, slot);
            if slot == ep_home(ifindex) && state.slots.read(slot).home != ifindex {
                state.homing.insert(slot, token);
            }
        }
        for slot in 0..EP_SLOTS {
            let v = state.slots.read(slot);
            let held = state.uses[slot as usize] != Use::Free;
            if !held && (v.ifindex != 0 || v.home != 0) {
                state.clear(slot, token);
            } else if held && v.home != 0 && v.home != v.ifindex {
                state.slots.store_u32(slot, HOME, 0);
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            work: Condvar::new(),
            grace,
        });
        let filler = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ep-slots".into())
                .spawn(move || fill_loop(&shared))
                .map_err(|e| err("starting the endpoint slot filler", e))?
        };
        Ok(EndpointSlots {
            shared,
            filler: Some(filler),
        })
    }

    /// Writes the endpoint of `ifindex`: its directions in place when its
    /// addresses stay, else a new slot made whole before the index points
    /// at it (the staged word and conntrack counts go along).
    pub(super) fn set(
        &self,
        ifindex: u32,
        ingress: Direction,
        egress: Direction,
        addrs: &[[u8; 16]],
    ) -> Result<()> {
        let value = EpSlot::new(ifindex, ingress, egress, addrs).ok_or_else(|| {
            DatapathError::invariant(format!(
                "endpoint {ifindex}: {} addresses, the datapath holds at most {}",
                addrs.len(),
                palisade_ebpf::MAX_POD_ADDRS
            ))
        })?;
        let mut state = self.shared.lock();
        let token = self.shared.grace.token();
        let result = match state.at.get(&ifindex).copied() {
            Some(slot) if state.slots.read(slot).pod_addrs() == addrs => {
                state.store_words(slot, ingress, egress);
                Ok(())
            }
            old => state.place(&self.shared.grace, value, old, token),
        };
        state.last_write = token;
        drop(state);
        self.shared.work.notify_one();
        result
    }

    /// Points the endpoint's staged (audit) policies at tables, one store.
    pub(super) fn set_audit(&self, ifindex: u32, word: u64) -> Result<()> {
        let mut state = self.shared.lock();
        let slot = *state.at.get(&ifindex).ok_or_else(|| {
            DatapathError::invariant(format!(
                "staged policies for ifindex {ifindex}: it has no endpoint entry"
            ))
        })?;
        state.slots.store_u64(slot, AUDIT, word);
        state.last_write = self.shared.grace.token();
        Ok(())
    }

    /// Sets the endpoint's `EP_FLAG_*` bits, one store.
    pub(super) fn set_flags(&self, ifindex: u32, flags: u32) -> Result<()> {
        let mut state = self.shared.lock();
        let slot = *state.at.get(&ifindex).ok_or_else(|| {
            DatapathError::invariant(format!(
                "flags for ifindex {ifindex}: it has no endpoint entry"
            ))
        })?;
        if state.slots.read(slot).flags != flags {
            state.slots.store_u32(slot, FLAGS, flags);
            state.last_write = self.shared.grace.token();
        }
        Ok(())
    }

    /// Removes the endpoint; one that is not there is fine.
    pub(super) fn remove(&self, ifindex: u32) -> Result<()> {
        let mut state = self.shared.lock();
        let Some(slot) = state.at.remove(&ifindex) else {
            return Ok(());
        };
        let token = self.shared.grace.token();
        state.slots.store_u32(slot, HOME, 0);
        state.homing.remove(&slot);
        let unindexed = state.unindex(ifindex);
        // Even if the index entry stayed, a cleared slot is never taken
        // for the interface's own.
        state.clear(slot, token);
        state.last_write = token;
        drop(state);
        self.shared.work.notify_one();
        unindexed
    }

    /// The endpoint's slot as it is now.
    pub(super) fn get(&self, ifindex: u32) -> Option<EpSlot> {
        let state = self.shared.lock();
        state.at.get(&ifindex).map(|&slot| state.slots.read(slot))
    }

    /// Every endpoint, by ifindex.
    pub(super) fn all(&self) -> BTreeMap<u32, EpSlot> {
        let state = self.shared.lock();
        state
            .at
            .iter()
            .map(|(&ifindex, &slot)| (ifindex, state.slots.read(slot)))
            .collect()
    }

    /// Token of the last write that changed what a packet may act on.
    pub(super) fn last_write(&self) -> u64 {
        self.shared.lock().last_write
    }

    /// Where the endpoint is, and whether packets trust it there by its
    /// position alone (for tests: `BpfDatapath::test_slot_position`).
    pub(super) fn where_is(&self, ifindex: u32) -> Option<(u32, bool)> {
        let state = self.shared.lock();
        let slot = *state.at.get(&ifindex)?;
        Some((slot, state.slots.read(slot).home == ifindex))
    }
}

impl State {
    fn store_words(&self, slot: u32, ingress: Direction, egress: Direction) {
        let v = self.slots.read(slot);
        if v.ingress != ingress.word() {
            self.slots.store_u64(slot, INGRESS, ingress.word());
        }
        if v.egress != egress.word() {
            self.slots.store_u64(slot, EGRESS, egress.word());
        }
    }

    fn unindex(&mut self, ifindex: u32) -> Result<()> {
        match self.index.remove(&ifindex) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(e) => Err(err(
                format!("removing endpoint {ifindex} from {MAP_EP_INDEX}"),
                e,
            )),
        }
    }

    /// Clears a slot no endpoint holds any more and retires it.
    fn clear(&mut self, slot: u32, token: u64) {
        self.slots.store_u32(slot, HOME, 0);
        self.slots.store_u32(slot, IFINDEX, 0);
        self.uses[slot as usize] = Use::Retired(token);
    }

    /// Frees the retired slots whose grace period has passed.
    fn free_retired(&mut self, grace: &Grace) {
        for u in self.uses.iter_mut() {
            if let Use::Retired(t) = *u {
                if grace.passed(t) {
                    *u = Use::Free;
                }
            }
        }
    }

    /// A free slot for `ifindex`: its home if free, else the highest free
    /// one (the homes of the small indexes a node starts with are low).
    /// With none free but some retired, waits for their grace period.
    fn alloc(&mut self, grace: &Grace, ifindex: u32) -> Result<u32> {
        self.free_retired(grace);
        let home = ep_home(ifindex);
        let pick = |uses: &[Use]| {
            if uses[home as usize] == Use::Free {
                return Some(home);
            }
            (0..EP_SLOTS).rev().find(|&s| uses[s as usize] == Use::Free)
        };
        if let Some(slot) = pick(&self.uses) {
            return Ok(slot);
        }
        let oldest = self.uses.iter().filter_map(|u| match u {
            Use::Retired(t) => Some(*t),
            _ => None,
        });
        let Some(token) = oldest.min() else {
            return Err(DatapathError::new(
                DatapathErrorKind::Full,
                format!("endpoint {ifindex}: all {EP_SLOTS} endpoint slots are in use"),
            ));
        };
        grace.wait_past(token).map_err(|e| {
            err(
                format!("endpoint {ifindex}: every free endpoint slot waits for a grace period"),
                e,
            )
        })?;
        self.free_retired(grace);
        pick(&self.uses).ok_or_else(|| {
            DatapathError::new(DatapathErrorKind::Full, "no endpoint slot came free")
        })
    }

    /// Puts `value` (of `value.ifindex`) in a fresh slot and points the
    /// index at it, then retires `old`, the slot it had.
    fn place(
        &mut self,
        grace: &Grace,
        mut value: EpSlot,
        old: Option<u32>,
        token: u64,
    ) -> Result<()> {
        let ifindex = value.ifindex;
        let slot = self.alloc(grace, ifindex)?;
        let share = match old {
            Some(o) => {
                let was = self.slots.read(o);
                value.audit = was.audit;
                value.flags = was.flags;
                self.shares.read(o)
            }
            None => CtShare::default(),
        };
        value.ifindex = 0;
        value.home = 0;
        self.slots.write(slot, value);
        self.shares.write(slot, share);
        self.slots.store_u32(slot, IFINDEX, ifindex);
        if let Err(e) = self.index.insert(ifindex, slot, 0) {
            self.clear(slot, token);
            return Err(err(
                format!("writing {MAP_EP_INDEX} for ifindex {ifindex}"),
                e,
            ));
        }
        self.uses[slot as usize] = Use::Held(ifindex);
        self.at.insert(ifindex, slot);
        if slot == ep_home(ifindex) {
            self.homing.insert(slot, token);
        }
        if let Some(o) = old {
            self.homing.remove(&o);
            self.clear(o, token);
        }
        Ok(())
    }

    /// Sets the home fields whose grace period has passed, and moves
    /// endpoints living away from home back when their home slot is free.
    fn settle(&mut self, grace: &Grace) -> std::result::Result<(), String> {
        self.free_retired(grace);
        let due: Vec<u32> = self
            .homing
            .iter()
            .filter(|(_, &t)| grace.passed(t))
            .map(|(&s, _)| s)
            .collect();
        for slot in due {
            self.homing.remove(&slot);
            if let Use::Held(ifindex) = self.uses[slot as usize] {
                if ep_home(ifindex) == slot {
                    self.slots.store_u32(slot, HOME, ifindex);
                }
            }
        }
        let away: Vec<(u32, u32)> = self
            .at
            .iter()
            .filter(|(&i, &s)| s != ep_home(i) && self.uses[ep_home(i) as usize] == Use::Free)
            .map(|(&i, &s)| (i, s))
            .collect();
        for (ifindex, slot) in away {
            let value = self.slots.read(slot);
            let token = grace.token();
            self.place(grace, value, Some(slot), token)
                .map_err(|e| format!("moving endpoint {ifindex} to its home slot: {e}"))?;
        }
        Ok(())
    }

    /// The earliest token anything waits on.
    fn pending(&self) -> Option<u64> {
        let retired = self.uses.iter().filter_map(|u| match u {
            Use::Retired(t) => Some(*t),
            _ => None,
        });
        retired.chain(self.homing.values().copied()).min()
    }
}

impl Drop for EndpointSlots {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_one();
        if let Some(t) = self.filler.take() {
            let _ = t.join();
        }
    }
}

fn fill_loop(shared: &Shared) {
    let mut completed = 0;
    let mut failed: BTreeSet<String> = BTreeSet::new();
    loop {
        {
            let mut state = shared.lock();
            if state.stop {
                return;
            }
            if let Err(e) = state.settle(&shared.grace) {
                if failed.insert(e.clone()) {
                    tracing::warn!(error = %e, "endpoint slots");
                }
            }
            match state.pending() {
                Some(token) if !shared.grace.stopped() => shared.grace.ask(token),
                _ => {
                    // Nothing to wait for (or no grace periods at all):
                    // sleep until a write brings work.
                    let _unused = shared.work.wait(state).unwrap_or_else(|p| p.into_inner());
                    continue;
                }
            }
        }
        completed = shared.grace.wait_change(completed);
        if shared.lock().stop {
            return;
        }
    }
}
