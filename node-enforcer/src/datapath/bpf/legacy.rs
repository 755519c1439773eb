//! Taking over from an older version whose maps this one no longer reads
//! (`palisade_ebpf::legacy`): its endpoints (`pal_endpoints`) and staged
//! ids (`pal_audit`) move into the endpoint slots before any link runs
//! this version's programs, so every pod keeps its policy and epochs
//! (established flows stay established) across the upgrade; once every
//! link runs them, the older maps are unpinned.
//!
//! An older map that is still pinned was written by the older version that
//! ran last (this one unpins them once it has taken over), so it is the
//! truth: slots it does not list are stale (from before a downgrade) and go.

use std::collections::BTreeMap;
use std::path::Path;

use aya::maps::{HashMap, Map, MapData};
use palisade_ebpf::legacy::{self, AuditPolicy, Endpoint};
use palisade_ebpf::{audit_word, Direction};

use super::endpoint_slots::EndpointSlots;
use super::err;
use crate::datapath::Result;

fn open<V: aya::Pod>(pin_root: &Path, name: &str) -> Result<Option<BTreeMap<u32, V>>> {
    let path = pin_root.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).map_err(|e| err(path.display(), e))?;
    let map: HashMap<MapData, u32, V> =
        HashMap::try_from(Map::HashMap(data)).map_err(|e| err(path.display(), e))?;
    let mut out = BTreeMap::new();
    for item in map.iter() {
        let (k, v) = item.map_err(|e| err(path.display(), e))?;
        out.insert(k, v);
    }
    Ok(Some(out))
}

/// Moves an older version's endpoints and staged ids into `slots`;
/// returns how many endpoints it moved (None: there was no older map).
pub(super) fn take_over(pin_root: &Path, slots: &EndpointSlots) -> Result<Option<usize>> {
    let Some(endpoints) = open::<Endpoint>(pin_root, legacy::MAP_ENDPOINTS)? else {
        return Ok(None);
    };
    for (&ifindex, e) in &endpoints {
        let dir = |policy, epoch| Direction { policy, epoch };
        slots.set(
            ifindex,
            dir(e.ingress_policy, e.ingress_epoch),
            dir(e.egress_policy, e.egress_epoch),
            e.pod_addrs(),
        )?;
    }
    for ifindex in slots.all().into_keys() {
        if !endpoints.contains_key(&ifindex) {
            slots.remove(ifindex)?;
        }
    }
    let staged = open::<AuditPolicy>(pin_root, legacy::MAP_AUDIT)?.unwrap_or_default();
    for (ifindex, _) in slots.all() {
        let a = staged.get(&ifindex).copied().unwrap_or_default();
        slots.set_audit(ifindex, audit_word(a.ingress_policy, a.egress_policy))?;
    }
    Ok(Some(endpoints.len()))
}

/// Unpins the older maps: call once every link runs this version's
/// programs. A program of the older version still holding one keeps it
/// alive until it is unloaded.
pub(super) fn unpin(pin_root: &Path) -> Result<()> {
    for name in legacy::UNPINNED_AFTER_ADOPT {
        let path = pin_root.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!(path = %path.display(), "unpinned an older version's map"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(format!("unpinning {}", path.display()), e)),
        }
    }
    Ok(())
}
