//! Writes `pal_flow_config`, which the datapath reads for every event.

use std::path::Path;

use aya::maps::{Array, Map, MapData};
use palisade_ebpf::{FlowConfig, MAP_FLOW_CONFIG};

use super::{FlowLogError, FlowLogMode};

/// What the datapath is told: the burst equals the rate, so a quiet node
/// may log one second's worth of events at once.
pub fn datapath_config(mode: FlowLogMode, rate_per_sec: u32) -> FlowConfig {
    FlowConfig {
        mode: mode.datapath(),
        rate_per_sec,
        burst: rate_per_sec,
        pad: 0,
    }
}

pub fn write(pin_root: &Path, mode: FlowLogMode, rate_per_sec: u32) -> Result<(), FlowLogError> {
    let path = super::pin(pin_root, MAP_FLOW_CONFIG);
    let what = FlowLogError::map("flow log config ", &path);
    let data = MapData::from_pin(&path).map_err(&what)?;
    let map = Map::from_map_data(data).map_err(&what)?;
    let mut config: Array<MapData, FlowConfig> = Array::try_from(map).map_err(&what)?;
    config
        .set(0, datapath_config(mode, rate_per_sec), 0)
        .map_err(&what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_is_the_rate() {
        let c = datapath_config(FlowLogMode::Deny, 1000);
        assert_eq!(
            (c.mode, c.rate_per_sec, c.burst),
            (palisade_ebpf::FLOW_LOG_DENY, 1000, 1000)
        );
    }
}
