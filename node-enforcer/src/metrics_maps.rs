//! Reads the pinned eBPF maps for metrics, read-only and apart from the
//! datapath the reconciler owns: the verdict counters (pal_verdicts, one
//! slot per direction and kind, one value per CPU, summed here) and how
//! full each main map is.
//!
//! Entries are counted by walking the keys, as the kernel keeps no count of
//! a hash map's or trie's entries; a walk races the datapath's own changes
//! and so is an estimate to within the changes made meanwhile.

use std::path::Path;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray};
use aya::Pod;
use palisade_ebpf::{
    Ct4Key, CtConfig, CtKey, CtValue, Frag4Key, Frag6Key, FragValue, LearnedKey, PolicyExactKey,
    PolicyKey, PolicyLens, PolicyValue, PortKey, PortValue, HOOK_FROM_POD, HOOK_TO_POD,
    MAP_CONNTRACK, MAP_CT4, MAP_CT_CONFIG, MAP_EP_INDEX, MAP_FRAGS4, MAP_FRAGS6, MAP_LEARNED_INDEX,
    MAP_POLICY, MAP_POLICY_EXACT, MAP_POLICY_LENS, MAP_PORTS, MAP_STATS, STAT_ALLOWED_ESTABLISHED,
    STAT_ALLOWED_FRAGMENT, STAT_ALLOWED_LEARNED, STAT_ALLOWED_NDP, STAT_ALLOWED_POLICY,
    STAT_ALLOWED_REPLY, STAT_ALLOWED_UNISOLATED, STAT_COUNT, STAT_DENIED, STAT_DENIED_CT_SHARE,
    STAT_DENIED_ENDPOINT_UNSURE, STAT_DENIED_EXT_HEADERS, STAT_DENIED_FRAGMENT,
    STAT_DENIED_MALFORMED, STAT_DENIED_SPOOF, STAT_SLOTS,
};

/// Each `STAT_*` slot as (verdict, reason) labels.
pub const STAT_LABELS: [(u32, &str, &str); STAT_COUNT as usize] = [
    (STAT_ALLOWED_POLICY, "allowed", "policy"),
    (STAT_ALLOWED_REPLY, "allowed", "reply"),
    (STAT_ALLOWED_UNISOLATED, "allowed", "not_isolated"),
    (STAT_DENIED, "denied", "policy"),
    (STAT_ALLOWED_NDP, "allowed", "ndp"),
    (STAT_DENIED_SPOOF, "denied", "spoofed_source"),
    (STAT_DENIED_MALFORMED, "denied", "malformed"),
    (STAT_ALLOWED_ESTABLISHED, "allowed", "established"),
    (STAT_ALLOWED_FRAGMENT, "allowed", "fragment"),
    (STAT_DENIED_FRAGMENT, "denied", "fragment"),
    (STAT_DENIED_EXT_HEADERS, "denied", "extension_headers"),
    (STAT_DENIED_ENDPOINT_UNSURE, "denied", "endpoint_unsure"),
    (STAT_DENIED_CT_SHARE, "denied", "conntrack_share"),
    (STAT_ALLOWED_LEARNED, "allowed", "learned"),
];

/// Each hook as the `direction` label: the pod's egress (packets it sends)
/// and its ingress (packets to it).
pub const DIRECTION_LABELS: [(u8, &str); 2] = [(HOOK_FROM_POD, "egress"), (HOOK_TO_POD, "ingress")];

/// One map's fill level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapLevel {
    pub name: &'static str,
    pub entries: u64,
    pub capacity: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatapathReading {
    /// Packets per `pal_verdicts` slot (`palisade_ebpf::stat_slot` of a
    /// direction and a `STAT_*` kind), summed over CPUs.
    pub verdicts: Vec<u64>,
    pub maps: Vec<MapLevel>,
    /// Most conntrack entries one hook of one pod may hold.
    pub conntrack_share: u32,
}

fn open(pin_root: &Path, name: &str) -> Result<Map, String> {
    let path = pin_root.join(name);
    let data = MapData::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Map::from_map_data(data).map_err(|e| format!("{}: {e}", path.display()))
}

fn capacity(map: &Map, name: &str) -> Result<u32, String> {
    let data = match map {
        Map::HashMap(d) | Map::LruHashMap(d) | Map::LpmTrie(d) | Map::PerCpuArray(d) => d,
        _ => return Err(format!("{name}: unexpected map type")),
    };
    data.info()
        .map(|i| i.max_entries())
        .map_err(|e| format!("{name}: {e}"))
}

fn hash_level<K: Pod, V: Pod>(pin_root: &Path, name: &'static str) -> Result<MapLevel, String> {
    let map = open(pin_root, name)?;
    let capacity = capacity(&map, name)?;
    let table: HashMap<MapData, K, V> =
        HashMap::try_from(map).map_err(|e| format!("{name}: {e}"))?;
    let entries = table.keys().take_while(Result::is_ok).count() as u64;
    Ok(MapLevel {
        name,
        entries,
        capacity,
    })
}

fn trie_level<K: Pod, V: Pod>(pin_root: &Path, name: &'static str) -> Result<MapLevel, String> {
    let map = open(pin_root, name)?;
    let capacity = capacity(&map, name)?;
    let trie: LpmTrie<MapData, K, V> =
        LpmTrie::try_from(map).map_err(|e| format!("{name}: {e}"))?;
    let entries = trie.keys().take_while(Result::is_ok).count() as u64;
    Ok(MapLevel {
        name,
        entries,
        capacity,
    })
}

/// The verdict counters and fill levels of the maps pinned under
/// `pin_root`.
pub fn read(pin_root: &Path) -> Result<DatapathReading, String> {
    let stats: PerCpuArray<MapData, u64> = PerCpuArray::try_from(open(pin_root, MAP_STATS)?)
        .map_err(|e| format!("{MAP_STATS}: {e}"))?;
    let mut verdicts = Vec::with_capacity(STAT_SLOTS as usize);
    for slot in 0..STAT_SLOTS {
        let per_cpu = stats
            .get(&slot, 0)
            .map_err(|e| format!("{MAP_STATS}[{slot}]: {e}"))?;
        verdicts.push(per_cpu.iter().copied().fold(0u64, u64::wrapping_add));
    }
    let maps = vec![
        hash_level::<u32, u32>(pin_root, MAP_EP_INDEX)?,
        trie_level::<PolicyKey, PolicyValue>(pin_root, MAP_POLICY)?,
        hash_level::<PolicyExactKey, PolicyValue>(pin_root, MAP_POLICY_EXACT)?,
        hash_level::<u32, PolicyLens>(pin_root, MAP_POLICY_LENS)?,
        trie_level::<PortKey, PortValue>(pin_root, MAP_PORTS)?,
        hash_level::<CtKey, CtValue>(pin_root, MAP_CONNTRACK)?,
        hash_level::<Ct4Key, CtValue>(pin_root, MAP_CT4)?,
        // Full, they evict the records of datagrams still in flight, whose
        // later fragments then drop.
        hash_level::<Frag4Key, FragValue>(pin_root, MAP_FRAGS4)?,
        hash_level::<Frag6Key, FragValue>(pin_root, MAP_FRAGS6)?,
        // Addresses pods learned by domain name, by their index (one entry
        // per live slot of pal_learned, an array whose fill level the
        // kernel does not count; its capacity is the array's size). Full,
        // a new one is not learned and its name's new connections fail
        // closed. Slots retired and waiting for a grace period are not
        // counted, though no new entry can take them yet.
        hash_level::<LearnedKey, u32>(pin_root, MAP_LEARNED_INDEX)?,
    ];
    let config: Array<MapData, CtConfig> = Array::try_from(open(pin_root, MAP_CT_CONFIG)?)
        .map_err(|e| format!("{MAP_CT_CONFIG}: {e}"))?;
    let conntrack_share = config
        .get(&0, 0)
        .map_err(|e| format!("{MAP_CT_CONFIG}[0]: {e}"))?
        .share;
    Ok(DatapathReading {
        verdicts,
        maps,
        conntrack_share,
    })
}
