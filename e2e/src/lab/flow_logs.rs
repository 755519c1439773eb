//! The enforcers' flow logs: each node's enforcer writes JSON lines to a
//! file of its own in the lab's log dir (kept with `keep_logs`), read back
//! here line by line.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::processes::POLL;
use super::Lab;
use crate::scenario::FlowLogMode;

impl Lab {
    pub(super) fn flow_log_path(&self, i: usize) -> PathBuf {
        self.log_dir
            .join(format!("flow-{}.jsonl", self.nodes[i].name))
    }

    /// Where node `name`'s enforcer writes its flow log.
    pub fn flow_log_path_of(&self, name: &str) -> Result<PathBuf> {
        Ok(self.flow_log_path(self.node_index(name)?))
    }

    /// Every complete line of node `name`'s flow log so far, parsed (a
    /// line still being written is left for the next read). No file yet:
    /// no lines.
    pub fn flow_log_lines(&self, name: &str) -> Result<Vec<Value>> {
        let path = self.flow_log_path_of(name)?;
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .enumerate()
            .map(|(n, line)| {
                serde_json::from_str(line)
                    .with_context(|| format!("{} line {}: {line}", path.display(), n + 1))
            })
            .collect()
    }

    /// Waits until node `name`'s flow log satisfies `done`; returns its
    /// lines then.
    pub fn wait_flow_log(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            self.config.cancel.check()?;
            let lines = self.flow_log_lines(name)?;
            if done(&lines) {
                return Ok(lines);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{what}: not in the flow log of {name} within {timeout:?}; it has {} lines:\n{}",
                    lines.len(),
                    lines
                        .iter()
                        .rev()
                        .take(20)
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            std::thread::sleep(POLL); // poll: the enforcer writes on its own schedule
        }
    }

    /// Restarts node 1's enforcer with another flow log mode (the rate
    /// stays), as a rollout with a changed flag would. Follow with
    /// [`Lab::wait_realized`].
    pub fn restart_enforcer_with_flow_log(&mut self, mode: FlowLogMode) -> Result<()> {
        self.config.flow_log = Some(mode);
        self.restart_enforcer()
    }
}
