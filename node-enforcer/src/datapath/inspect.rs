//! Reads what the kernel holds under a pin root, without changing anything:
//! the endpoint, policy and port tables and the pinned links. The real
//! datapath adopts from it at start-up; tests and checks compare it with
//! what the enforcer believes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, Map, MapData};
use palisade_ebpf::{
    EpSlot, PolicyKey, PolicyValue, PortKey, PortValue, MAP_EP_INDEX, MAP_EP_SLOTS, MAP_POLICY,
    MAP_PORTS, POLICY_ID_BITS,
};

use super::{Adopted, DatapathError, EndpointEntry, Result, LEARNED_PORTSET_BASE};
use crate::compile::{PortEntry, Prefix};

fn err(what: impl std::fmt::Display, e: impl Into<super::error::Cause>) -> DatapathError {
    DatapathError::caused(what, e)
}

fn open(pin_root: &Path, name: &str) -> Result<Map> {
    let path = pin_root.join(name);
    let data = MapData::from_pin(&path).map_err(|e| err(path.display(), e))?;
    Map::from_map_data(data).map_err(|e| err(path.display(), e))
}

/// An endpoint slot's entry as the reconciler sees it.
pub fn endpoint_entry(e: &EpSlot) -> EndpointEntry {
    EndpointEntry {
        ingress: e.ingress().policy,
        egress: e.egress().policy,
        pod_addrs: e.pod_addrs().to_vec(),
    }
}

/// Every endpoint: each index entry whose slot names its interface (as the
/// programs judge it).
pub fn read_endpoints(
    index: &HashMap<MapData, u32, u32>,
    slots: &Array<MapData, EpSlot>,
) -> Result<BTreeMap<u32, EpSlot>> {
    let mut out = BTreeMap::new();
    for item in index.iter() {
        let (ifindex, slot) = item.map_err(|e| err(MAP_EP_INDEX, e))?;
        let Ok(v) = slots.get(&slot, 0) else { continue };
        if v.ifindex == ifindex {
            out.insert(ifindex, v);
        }
    }
    Ok(out)
}

/// Decodes the endpoints and the policy and port tables into `out`.
pub fn read_tables(
    endpoints: &BTreeMap<u32, EpSlot>,
    policy: &LpmTrie<MapData, PolicyKey, PolicyValue>,
    ports: &LpmTrie<MapData, PortKey, PortValue>,
    out: &mut Adopted,
) -> Result<()> {
    for (&ifindex, e) in endpoints {
        out.endpoints.insert(ifindex, endpoint_entry(e));
    }
    for item in policy.iter() {
        let (key, value) = item.map_err(|e| err(MAP_POLICY, e))?;
        let data = key.data();
        let len = key.prefix_len().saturating_sub(POLICY_ID_BITS).min(128) as u8;
        out.policies
            .entry(data.policy_id)
            .or_default()
            .push((Prefix::new(data.addr, len), value.portset_id));
    }
    read_portsets(ports, out, |id| id < LEARNED_PORTSET_BASE)
}

/// The learner's port sets (ids from [`LEARNED_PORTSET_BASE`]) into
/// `out.portsets`.
pub fn read_learned_portsets(
    ports: &LpmTrie<MapData, PortKey, PortValue>,
    out: &mut Adopted,
) -> Result<()> {
    read_portsets(ports, out, |id| id >= LEARNED_PORTSET_BASE)
}

fn read_portsets(
    ports: &LpmTrie<MapData, PortKey, PortValue>,
    out: &mut Adopted,
    mine: impl Fn(u32) -> bool,
) -> Result<()> {
    for item in ports.iter() {
        let (key, value) = item.map_err(|e| err(MAP_PORTS, e))?;
        let data = key.data();
        if !mine(data.portset_id) {
            continue;
        }
        let allow = value.allow != 0;
        let entry = match (key.prefix_len(), allow) {
            (0..=39, _) => PortEntry::Any,
            (40, true) => PortEntry::Proto(data.proto),
            (40, false) => PortEntry::DenyProto(data.proto),
            (n, true) => PortEntry::Block {
                proto: data.proto,
                port: u16::from_be_bytes(data.port),
                bits: (n - 40).min(16) as u8,
            },
            (n, false) => PortEntry::DenyBlock {
                proto: data.proto,
                port: u16::from_be_bytes(data.port),
                bits: (n - 40).min(16) as u8,
            },
        };
        out.portsets
            .entry(data.portset_id)
            .or_default()
            .0
            .insert(entry);
    }
    Ok(())
}

/// The names the links under `pin_root/links` are pinned by: the names
/// their interfaces had when they were attached.
pub fn pinned_link_names(pin_root: &Path) -> Result<BTreeSet<String>> {
    let dir = pin_root.join("links");
    let mut names = BTreeSet::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(err(dir.display(), e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| err(dir.display(), e))?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if let Some((encoded, _)) = file.rsplit_once('@') {
            names.insert(super::bpf::ifname_of_pin(encoded));
        }
    }
    Ok(names)
}

/// Every endpoint's slot under `pin_root`, by ifindex, read-only.
pub fn endpoints(pin_root: &Path) -> Result<BTreeMap<u32, EpSlot>> {
    let index =
        HashMap::try_from(open(pin_root, MAP_EP_INDEX)?).map_err(|e| err(MAP_EP_INDEX, e))?;
    let slots = Array::try_from(open(pin_root, MAP_EP_SLOTS)?).map_err(|e| err(MAP_EP_SLOTS, e))?;
    read_endpoints(&index, &slots)
}

/// Everything under `pin_root`, read-only.
pub fn inspect(pin_root: &Path) -> Result<Adopted> {
    let endpoints = endpoints(pin_root)?;
    let policy = LpmTrie::try_from(open(pin_root, MAP_POLICY)?).map_err(|e| err(MAP_POLICY, e))?;
    let ports = LpmTrie::try_from(open(pin_root, MAP_PORTS)?).map_err(|e| err(MAP_PORTS, e))?;
    let mut attached: BTreeMap<String, u32> = pinned_link_names(pin_root)?
        .into_iter()
        .map(|n| {
            let index = super::bpf::pinned_link_index(pin_root, &n);
            (n, index)
        })
        .collect();
    // Endpoints attached fast (filters, not yet promoted to links).
    let linked: BTreeSet<u32> = attached.values().copied().collect();
    let filtered =
        super::bpf::filters::with_ours(endpoints.keys().copied().filter(|i| !linked.contains(i)))
            .map_err(|e| err("listing filters", e))?;
    attached.extend(filtered.into_iter().map(|(i, n)| (n, i)));
    let mut out = Adopted {
        attached,
        ..Adopted::default()
    };
    read_tables(&endpoints, &policy, &ports, &mut out)?;
    Ok(out)
}
