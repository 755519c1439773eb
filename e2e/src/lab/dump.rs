//! Dump checks against the live node: the enforcer's GetEnforcerState and
//! the kernel's TC hooks (bpftool, run in the node namespace).

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::Lab;
use crate::dump::{self, DumpCheck};
use crate::grpc;

impl Lab {
    /// Polls until every check holds or the realize timeout passes; returns
    /// each check with `Err(reason)` for those that never held.
    pub fn check_dump(&mut self, checks: &[DumpCheck]) -> Result<Vec<(DumpCheck, Result<(), String>)>> {
        let deadline = Instant::now() + self.config.realize_timeout;
        loop {
            self.config.cancel.check()?;
            let results: Vec<_> = checks
                .iter()
                .map(|c| (c.clone(), self.judge(c)))
                .collect();
            if results.iter().all(|(_, r)| r.is_ok()) || Instant::now() >= deadline {
                return Ok(results);
            }
            std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
        }
    }

    fn judge(&self, check: &DumpCheck) -> Result<(), String> {
        let state = self
            .rt()
            .block_on(grpc::enforcer_state(&self.enforcer_socket))
            .map_err(|e| format!("reading the enforcer's state: {e:#}"))?;
        match check {
            DumpCheck::Realized { pod, realized } => dump::judge_realized(&state, pod, *realized),
            DumpCheck::VethAttached(pod) => {
                let veth = self.host_veth(pod).map_err(|e| format!("{e:#}"))?;
                let progs = self.tc_programs_on(&veth).map_err(|e| format!("{e:#}"))?;
                if progs.is_empty() {
                    return Err(format!("no TC program on {veth}, the host veth of {pod}"));
                }
                if !dump::dump_lists_interface(&state, &veth) {
                    return Err(format!("the dump does not list {veth}, the host veth of {pod}"));
                }
                Ok(())
            }
            DumpCheck::VethGone(pod) => {
                let veth = self.host_veth(pod).map_err(|e| format!("{e:#}"))?;
                if dump::dump_lists_interface(&state, &veth) {
                    return Err(format!(
                        "the dump still lists {veth}, the deleted host veth of {pod}"
                    ));
                }
                Ok(())
            }
            DumpCheck::BridgeClean => {
                let progs = self
                    .tc_programs_on(&self.bridge)
                    .map_err(|e| format!("{e:#}"))?;
                if progs.is_empty() {
                    Ok(())
                } else {
                    Err(format!("programs attached to bridge {}: {progs:?}", self.bridge))
                }
            }
        }
    }

    /// The TC/TCX programs the kernel has on a device of the node.
    pub fn tc_programs_on(&self, dev: &str) -> Result<Vec<String>> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.node_ns().path().display()))
            .args(["bpftool", "-j", "net", "show", "dev", dev])
            .output()
            .context("running bpftool net show in the node namespace")?;
        if !out.status.success() {
            bail!(
                "bpftool net show dev {dev} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        dump::tc_programs(&String::from_utf8_lossy(&out.stdout))
    }
}
