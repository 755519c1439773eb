//! `--flow-log`: which events besides staged policies' are logged.

use palisade_ebpf::{FLOW_LOG_ALL, FLOW_LOG_DENY, FLOW_LOG_OFF};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlowLogMode {
    /// Only staged (audit) policies' would-deny / would-allow.
    #[default]
    Off,
    /// And every dropped packet.
    Deny,
    /// And every new flow allowed.
    All,
}

impl FlowLogMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowLogMode::Off => "off",
            FlowLogMode::Deny => "deny",
            FlowLogMode::All => "all",
        }
    }

    /// `flow_config.mode` (`FLOW_LOG_*`).
    pub fn datapath(self) -> u32 {
        match self {
            FlowLogMode::Off => FLOW_LOG_OFF,
            FlowLogMode::Deny => FLOW_LOG_DENY,
            FlowLogMode::All => FLOW_LOG_ALL,
        }
    }
}

impl std::fmt::Display for FlowLogMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FlowLogMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(FlowLogMode::Off),
            "deny" => Ok(FlowLogMode::Deny),
            "all" => Ok(FlowLogMode::All),
            other => Err(format!(
                "flow log mode {other:?} is not one of off, deny, all"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_print_and_map_to_the_datapath() {
        for (text, mode, dp) in [
            ("off", FlowLogMode::Off, FLOW_LOG_OFF),
            ("deny", FlowLogMode::Deny, FLOW_LOG_DENY),
            ("all", FlowLogMode::All, FLOW_LOG_ALL),
        ] {
            assert_eq!(text.parse::<FlowLogMode>(), Ok(mode));
            assert_eq!(mode.to_string(), text);
            assert_eq!(mode.datapath(), dp);
        }
        let err = "denied".parse::<FlowLogMode>().unwrap_err();
        assert!(
            err.contains("\"denied\"") && err.contains("off, deny, all"),
            "{err}"
        );
    }
}
