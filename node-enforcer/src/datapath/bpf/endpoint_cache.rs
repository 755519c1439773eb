//! The endpoint cache (`pal_ep_cache`): the epochs and IPv4 addresses of
//! each endpoint again, in an array slot the IPv4 fast path reads with an
//! inlined lookup instead of a hash lookup by ifindex. `pal_endpoints`
//! stays the authority: a slot counts only while it is valid and names the
//! packet's interface, and the programs read `pal_endpoints` otherwise.
//!
//! An array write copies the value in place, so a packet racing it may
//! read old and new bytes mixed. The cache is therefore written so that no
//! packet ever trusts a mix:
//!
//! 1. a valid slot changes only by clearing `valid`, its other bytes
//!    rewritten as they are (a one-bit change cannot tear);
//! 2. a grace period later (every packet that saw it valid is done) the
//!    slot's new content is written, still invalid;
//! 3. a grace period after that (every packet that starts later sees the
//!    whole write, on any memory model) it is set valid, again changing
//!    only that bit.
//!
//! Step 1 runs in the caller, before the `pal_endpoints` write it goes
//! with, so once that write returns no packet starts with the old cache;
//! steps 2 and 3 run on a thread of their own, batched, so a burst of
//! changes costs two grace periods, not two per endpoint. Grace periods
//! come from `membarrier(MEMBARRIER_CMD_GLOBAL)`, which is
//! `synchronize_rcu()`: TC programs run inside RCU read-side sections. A
//! kernel without it (nohz_full) leaves every slot invalid: slower, never
//! wrong.
//!
//! Interfaces whose index is past the array share slots
//! (`ep_cache_slot`): a slot holds at most one of them, the others take
//! the hash path. Nothing is ever unenforced for want of a slot.

use std::collections::HashMap as StdHashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use aya::maps::{Array, MapData};
use aya::Ebpf;
use palisade_ebpf::{ep_cache_slot, Endpoint, EndpointCache, EP_CACHE_SLOTS, MAP_EP_CACHE};

use super::err;
use crate::conntrack::batch;
use crate::datapath::{DatapathError, Result};

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

/// Waits for an RCU grace period: every BPF program running when it was
/// called has returned.
fn grace_period() -> std::io::Result<()> {
    // SAFETY: membarrier takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn grace_periods_available() -> bool {
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
    r >= 0 && r & libc::c_long::from(MEMBARRIER_CMD_GLOBAL) != 0
}

struct State {
    map: Array<MapData, EndpointCache>,
    /// What each slot holds in the kernel (slots never written: zeroes).
    written: StdHashMap<u32, EndpointCache>,
    /// Slots to fill, with the value and the version they were asked at.
    wanted: StdHashMap<u32, (EndpointCache, u64)>,
    /// Bumped by every change of a slot's endpoint; a fill asked at an
    /// older version is abandoned.
    versions: StdHashMap<u32, u64>,
    stop: bool,
    /// The last failure of the filler, for the log and the tests.
    error: Option<String>,
}

impl State {
    fn write(&mut self, slot: u32, value: EndpointCache) -> Result<()> {
        self.map
            .set(slot, value, 0)
            .map_err(|e| err(format!("writing {MAP_EP_CACHE}[{slot}]"), e))?;
        self.written.insert(slot, value);
        Ok(())
    }

    /// Step 1: the slot is no longer trusted, and any fill in flight for
    /// it is abandoned.
    fn invalidate(&mut self, slot: u32) -> Result<()> {
        *self.versions.entry(slot).or_default() += 1;
        self.wanted.remove(&slot);
        match self.written.get(&slot) {
            Some(v) if v.valid != 0 => self.write(slot, EndpointCache { valid: 0, ..*v }),
            _ => Ok(()),
        }
    }
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere leaves the state as consistent as each write.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) struct EndpointCacheWriter {
    shared: Arc<Shared>,
    filler: Option<JoinHandle<()>>,
}

impl EndpointCacheWriter {
    /// Takes the map and invalidates every valid slot: a slot may have
    /// been left by a process whose successor changed `pal_endpoints`
    /// without knowing the cache (a downgrade). Those that are still right
    /// are filled again as [`EndpointCacheWriter::fill`] asks.
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let data = ebpf
            .take_map(MAP_EP_CACHE)
            .ok_or_else(|| DatapathError::new(format!("map {MAP_EP_CACHE} missing from object")))?;
        let fd = match &data {
            aya::maps::Map::Array(d) => d.fd().as_fd().as_raw_fd(),
            _ => {
                return Err(DatapathError::new(format!(
                    "{MAP_EP_CACHE} is not an array"
                )))
            }
        };
        // The fd stays open as long as the map, which owns it.
        let map: Array<MapData, EndpointCache> =
            Array::try_from(data).map_err(|e| err(MAP_EP_CACHE, e))?;
        if map.len() != EP_CACHE_SLOTS {
            return Err(DatapathError::new(format!(
                "{MAP_EP_CACHE} has {} slots, this version needs {EP_CACHE_SLOTS}",
                map.len()
            )));
        }
        let mut written = StdHashMap::new();
        batch::read_all::<u32, EndpointCache>(fd, |slots, values| {
            for (slot, v) in slots.iter().zip(values) {
                if *v != EndpointCache::default() {
                    written.insert(*slot, *v);
                }
            }
        })
        .map_err(|e| err(MAP_EP_CACHE, e))?;
        let mut state = State {
            map,
            written,
            wanted: StdHashMap::new(),
            versions: StdHashMap::new(),
            stop: false,
            error: None,
        };
        let valid: Vec<u32> = state
            .written
            .iter()
            .filter(|(_, v)| v.valid != 0)
            .map(|(s, _)| *s)
            .collect();
        for slot in valid {
            state.invalidate(slot)?;
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Condvar::new(),
        });
        let filler = if grace_periods_available() {
            let shared = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("ep-cache".into())
                    .spawn(move || fill_loop(&shared))
                    .map_err(|e| err("starting the endpoint cache filler", e))?,
            )
        } else {
            tracing::warn!(
                "membarrier(MEMBARRIER_CMD_GLOBAL) unavailable (nohz_full?): the endpoint cache stays empty, established IPv4 flows take the slower lookup"
            );
            None
        };
        Ok(EndpointCacheWriter { shared, filler })
    }

    /// Runs `write` (a `pal_endpoints` write for `ifindex`, which then
    /// claims the slot) after invalidating the interface's slot, so no
    /// packet that starts after it returns reads the old cache. The slot is
    /// filled again by [`EndpointCacheWriter::fill`].
    pub(super) fn change<T>(&self, ifindex: u32, write: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut state = self.shared.lock();
        state.invalidate(ep_cache_slot(ifindex))?;
        write()
    }

    /// Runs `write` (the removal of `ifindex` from `pal_endpoints`) after
    /// invalidating the slot if it holds, or is being filled for, that
    /// interface; another interface's entry in a shared slot stays.
    pub(super) fn forget<T>(&self, ifindex: u32, write: impl FnOnce() -> Result<T>) -> Result<T> {
        let slot = ep_cache_slot(ifindex);
        let mut state = self.shared.lock();
        let ours = |v: Option<&EndpointCache>| v.is_some_and(|v| v.ifindex == ifindex);
        if ours(state.written.get(&slot)) || ours(state.wanted.get(&slot).map(|(v, _)| v)) {
            state.invalidate(slot)?;
        }
        write()
    }

    /// Asks for `ep`, now in `pal_endpoints` for `ifindex`, to be cached;
    /// the slot goes valid two grace periods later unless it changes
    /// again meanwhile.
    pub(super) fn fill(&self, ifindex: u32, ep: &Endpoint) {
        if self.filler.is_none() {
            return;
        }
        let slot = ep_cache_slot(ifindex);
        let mut state = self.shared.lock();
        let version = *state.versions.entry(slot).or_default();
        let value = EndpointCache {
            valid: 0,
            ..EndpointCache::of(ifindex, ep)
        };
        state.wanted.insert(slot, (value, version));
        self.shared.wake.notify_one();
    }

    /// Whether the slot of `ifindex` is valid and holds `ep` (tests).
    #[cfg(test)]
    pub(super) fn holds(&self, ifindex: u32, ep: &Endpoint) -> Result<bool> {
        let state = self.shared.lock();
        let v = state
            .map
            .get(&ep_cache_slot(ifindex), 0)
            .map_err(|e| err(MAP_EP_CACHE, e))?;
        Ok(v == EndpointCache::of(ifindex, ep))
    }

    /// The slot of `ifindex` as the kernel holds it (tests).
    #[cfg(test)]
    pub(super) fn slot(&self, ifindex: u32) -> Result<EndpointCache> {
        let state = self.shared.lock();
        state
            .map
            .get(&ep_cache_slot(ifindex), 0)
            .map_err(|e| err(MAP_EP_CACHE, e))
    }

    /// The filler's last failure, if any (tests).
    #[cfg(test)]
    pub(super) fn error(&self) -> Option<String> {
        self.shared.lock().error.clone()
    }
}

impl Drop for EndpointCacheWriter {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.filler.take() {
            let _ = t.join();
        }
    }
}

/// Steps 2 and 3 for every slot asked since the last round.
fn fill_loop(shared: &Shared) {
    loop {
        let batch: Vec<(u32, EndpointCache, u64)> = {
            let mut state = shared.lock();
            while state.wanted.is_empty() && !state.stop {
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            state.wanted.drain().map(|(s, (v, n))| (s, v, n)).collect()
        };
        if let Err(e) = fill(shared, batch) {
            tracing::warn!(error = %e, "endpoint cache: slots left invalid");
            shared.lock().error = Some(e);
        }
    }
}

fn fill(shared: &Shared, batch: Vec<(u32, EndpointCache, u64)>) -> std::result::Result<(), String> {
    let current = |state: &State, slot: u32, version: u64| {
        state.versions.get(&slot).copied().unwrap_or_default() == version
    };
    // Every packet that saw these slots valid (before their invalidation,
    // which came before they were asked for) is done.
    grace_period().map_err(|e| format!("grace period: {e}"))?;
    let mut written = Vec::with_capacity(batch.len());
    {
        let mut state = shared.lock();
        for (slot, value, version) in batch {
            if current(&state, slot, version) {
                state.write(slot, value).map_err(|e| e.to_string())?;
                written.push((slot, value, version));
            }
        }
    }
    // Every packet that starts from now on sees those writes whole.
    grace_period().map_err(|e| format!("grace period: {e}"))?;
    let mut state = shared.lock();
    for (slot, value, version) in written {
        if current(&state, slot, version) {
            state
                .write(slot, EndpointCache { valid: 1, ..value })
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
