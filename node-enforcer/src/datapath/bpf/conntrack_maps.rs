//! What the datapath itself needs of the conntrack maps: the epochs already
//! used in them, and the move of IPv4 entries an older version kept in the
//! IPv6 map (`pal_conntrack`, whose layout is unchanged) to `pal_ct4`.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::maps::{HashMap, MapData};
use aya::Ebpf;
use palisade_ebpf::{Ct4Key, CtKey, CtValue, MAP_CONNTRACK, MAP_CT4};

use super::err;
use crate::conntrack::batch;
use crate::datapath::{DatapathError, Result};

fn fd(ebpf: &Ebpf, name: &str) -> Result<RawFd> {
    let map = ebpf
        .map(name)
        .ok_or_else(|| DatapathError::invariant(format!("map {name} missing from object")))?;
    let data: &MapData = match map {
        aya::maps::Map::LruHashMap(d) | aya::maps::Map::HashMap(d) => d,
        _ => {
            return Err(DatapathError::invariant(format!(
                "map {name} is not a hash map"
            )))
        }
    };
    Ok(data.fd().as_fd().as_raw_fd())
}

/// The highest epoch any entry of either conntrack map holds.
pub(super) fn highest_epoch(ebpf: &Ebpf) -> Result<u32> {
    let mut highest = 0u32;
    let mut note = |_: &[_], values: &[CtValue]| {
        for v in values {
            highest = highest.max(v.epoch);
        }
    };
    batch::read_all::<Ct4Key, CtValue>(fd(ebpf, MAP_CT4)?, &mut note)
        .map_err(|e| err(MAP_CT4, e))?;
    batch::read_all::<CtKey, CtValue>(fd(ebpf, MAP_CONNTRACK)?, |_, values| {
        note(&[] as &[Ct4Key], values)
    })
    .map_err(|e| err(MAP_CONNTRACK, e))?;
    Ok(highest)
}

/// Moves the IPv4 entries of `pal_conntrack` (an older version's) into
/// `pal_ct4`, where the programs look IPv4 flows up, so established flows
/// stay established across the upgrade. Call once the older programs no
/// longer run (after the links are taken over). An entry the new programs
/// already wrote for the same flow is newer and stays. Returns how many
/// were moved.
pub(super) fn move_v4_entries(ebpf: &mut Ebpf) -> Result<usize> {
    let v6 = fd(ebpf, MAP_CONNTRACK)?;
    let mut found: Vec<(CtKey, Ct4Key, CtValue)> = Vec::new();
    batch::read_all::<CtKey, CtValue>(v6, |keys, values| {
        for (k, v) in keys.iter().zip(values) {
            if let Some(k4) = Ct4Key::of(k) {
                found.push((*k, k4, *v));
            }
        }
    })
    .map_err(|e| err(MAP_CONNTRACK, e))?;
    if found.is_empty() {
        return Ok(0);
    }
    let mut ct4: HashMap<&mut MapData, Ct4Key, CtValue> =
        HashMap::try_from(ebpf.map_mut(MAP_CT4).ok_or_else(|| {
            DatapathError::invariant(format!("map {MAP_CT4} missing from object"))
        })?)
        .map_err(|e| err(MAP_CT4, e))?;
    const BPF_NOEXIST: u64 = 1;
    let mut moved = 0;
    for (_, k4, v) in &found {
        match ct4.insert(k4, v, BPF_NOEXIST) {
            Ok(()) => moved += 1,
            // Already there: the new programs' entry is the newer one.
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(err(format!("moving an entry into {MAP_CT4}"), e)),
        }
    }
    let old: Vec<CtKey> = found.iter().map(|(k, _, _)| *k).collect();
    batch::delete_all(v6, &old).map_err(|e| err(MAP_CONNTRACK, e))?;
    Ok(moved)
}

/// The number of entries conntrack map `name` was made with.
pub(super) fn entries(ebpf: &Ebpf, name: &str) -> Result<u32> {
    let map = ebpf
        .map(name)
        .ok_or_else(|| DatapathError::invariant(format!("map {name} missing from object")))?;
    let data: &MapData = match map {
        aya::maps::Map::LruHashMap(d) | aya::maps::Map::HashMap(d) => d,
        _ => {
            return Err(DatapathError::invariant(format!(
                "map {name} is not a hash map"
            )))
        }
    };
    Ok(data.info().map_err(|e| err(name, e))?.max_entries())
}
