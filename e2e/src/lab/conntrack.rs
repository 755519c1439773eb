//! The node's two conntrack tables, for tests of the cleanup between them:
//! the enforcer's eBPF entries (the pinned map), the kernel's (conntrack -L
//! in the node's namespace), and the enforcer's cleanup runs (its dump).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use palisade_proto::v1::ConntrackState;

use super::Lab;
use crate::ctmap::{self, Entry};

impl Lab {
    /// Every entry of the enforcer's eBPF conntrack map, read from its pin.
    pub fn conntrack_entries(&self) -> Result<Vec<Entry>> {
        ctmap::read(&self.pin_root)
    }

    /// The kernel's conntrack table of the node, one `conntrack -L` line per
    /// entry (`src=... dst=... sport=... dport=...` for both directions).
    pub fn kernel_conntrack(&self) -> Result<Vec<String>> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.node_ns().path().display()))
            .args(["conntrack", "-L"])
            .output()
            .context("running conntrack -L in the node namespace")?;
        if !out.status.success() {
            bail!(
                "conntrack -L failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// The enforcer's conntrack cleanup account (GetEnforcerState).
    pub fn conntrack_state(&self) -> Result<ConntrackState> {
        Ok(self.enforcer_state()?.conntrack.unwrap_or_default())
    }

    /// Waits until the enforcer has finished `runs` more cleanups than
    /// `after` counted; returns the state then. A cleanup that fails is an
    /// error at once.
    pub fn wait_cleanups(
        &self,
        after: u64,
        runs: u64,
        timeout: Duration,
    ) -> Result<ConntrackState> {
        let deadline = Instant::now() + timeout;
        loop {
            self.config.cancel.check()?;
            let state = self.conntrack_state()?;
            if !state.error.is_empty() {
                bail!("the conntrack cleanup failed: {}", state.error);
            }
            if state.cleanups >= after + runs {
                return Ok(state);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{runs} conntrack cleanups after #{after} did not finish within {timeout:?} (at #{})",
                    state.cleanups
                );
            }
            std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
        }
    }
}
