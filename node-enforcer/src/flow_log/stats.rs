//! The datapath's flow event counters (`pal_flow_stats`, one slot per CPU,
//! summed here), read from the pin for metrics.

use std::path::Path;

use aya::maps::{Map, MapData, PerCpuArray};
use palisade_ebpf::{
    FLOW_STAT_COUNT, FLOW_STAT_EMITTED, FLOW_STAT_OVERFLOW, FLOW_STAT_RATE_LIMITED, MAP_FLOW_STATS,
};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Events put in the ring buffer.
    pub emitted: u64,
    /// Events the node's rate limit dropped.
    pub rate_limited: u64,
    /// Events dropped because the ring buffer was full.
    pub overflow: u64,
    /// Every slot, by `FLOW_STAT_*` index (the staged policies' counters
    /// are exported from here by `metrics::audit`).
    pub slots: [u64; FLOW_STAT_COUNT as usize],
}

pub fn read(pin_root: &Path) -> Result<FlowStats, super::FlowLogError> {
    let path = super::pin(pin_root, MAP_FLOW_STATS);
    let what = super::FlowLogError::map("", &path);
    let data = MapData::from_pin(&path).map_err(&what)?;
    let map = Map::from_map_data(data).map_err(&what)?;
    let stats: PerCpuArray<MapData, u64> = PerCpuArray::try_from(map).map_err(&what)?;
    let mut slots = [0u64; FLOW_STAT_COUNT as usize];
    for (i, slot) in slots.iter_mut().enumerate() {
        let per_cpu = stats.get(&(i as u32), 0).map_err(&what)?;
        *slot = per_cpu.iter().copied().fold(0, u64::wrapping_add);
    }
    let at = |i: u32| slots[i as usize];
    Ok(FlowStats {
        emitted: at(FLOW_STAT_EMITTED),
        rate_limited: at(FLOW_STAT_RATE_LIMITED),
        overflow: at(FLOW_STAT_OVERFLOW),
        slots,
    })
}
