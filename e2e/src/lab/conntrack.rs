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
    /// Every entry of node 1's eBPF conntrack maps, read from their pins.
    pub fn conntrack_entries(&self) -> Result<Vec<Entry>> {
        ctmap::read(&self.nodes[0].pin_root)
    }

    /// Every entry of node `name`'s eBPF conntrack maps.
    pub fn conntrack_entries_on(&self, name: &str) -> Result<Vec<Entry>> {
        ctmap::read(&self.nodes[self.node_index(name)?].pin_root)
    }

    /// The kernel's conntrack table of node 1, one `conntrack -L` line per
    /// entry (`src=... dst=... sport=... dport=...` for both directions).
    pub fn kernel_conntrack(&self) -> Result<Vec<String>> {
        self.kernel_conntrack_of(0)
    }

    /// The kernel's conntrack table of node `name`.
    pub fn kernel_conntrack_on(&self, name: &str) -> Result<Vec<String>> {
        self.kernel_conntrack_of(self.node_index(name)?)
    }

    fn kernel_conntrack_of(&self, i: usize) -> Result<Vec<String>> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.nodes[i].ns().path().display()))
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

    /// Node 1's enforcer's conntrack cleanup account (GetEnforcerState).
    pub fn conntrack_state(&self) -> Result<ConntrackState> {
        Ok(self.enforcer_state()?.conntrack.unwrap_or_default())
    }

    /// Node `name`'s enforcer's conntrack cleanup account.
    pub fn conntrack_state_on(&self, name: &str) -> Result<ConntrackState> {
        Ok(self.enforcer_state_on(name)?.conntrack.unwrap_or_default())
    }

    /// Waits until node 1's enforcer has finished `runs` more cleanups than
    /// `after` counted; returns the state then. A cleanup that fails is an
    /// error at once.
    pub fn wait_cleanups(
        &self,
        after: u64,
        runs: u64,
        timeout: Duration,
    ) -> Result<ConntrackState> {
        let first = self.nodes[0].name.clone();
        self.wait_cleanups_on(&first, after, runs, timeout)
    }

    /// [`Lab::wait_cleanups`] on node `name`.
    pub fn wait_cleanups_on(
        &self,
        name: &str,
        after: u64,
        runs: u64,
        timeout: Duration,
    ) -> Result<ConntrackState> {
        let deadline = Instant::now() + timeout;
        loop {
            self.config.cancel.check()?;
            let state = self.conntrack_state_on(name)?;
            if !state.error.is_empty() {
                bail!("the conntrack cleanup failed: {}", state.error);
            }
            if state.cleanups >= after + runs {
                return Ok(state);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{runs} conntrack cleanups on {name} after #{after} did not finish within {timeout:?} (at #{})",
                    state.cleanups
                );
            }
            std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
        }
    }
}
