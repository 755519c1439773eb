//! Dump checks against the live node: the enforcer's GetEnforcerState and
//! the kernel's TC hooks (bpftool, run in the node namespace).

use std::time::Instant;

use anyhow::{bail, Result};

use super::Lab;
use crate::dump::{self, DumpCheck};
use crate::tcx;

impl Lab {
    /// Polls until every check holds or the realize timeout passes; returns
    /// each check with `Err(reason)` for those that never held.
    pub fn check_dump(
        &mut self,
        checks: &[DumpCheck],
    ) -> Result<Vec<(DumpCheck, Result<(), String>)>> {
        let deadline = Instant::now() + self.config.realize_timeout;
        loop {
            self.config.cancel.check()?;
            let results: Vec<_> = checks.iter().map(|c| (c.clone(), self.judge(c))).collect();
            if results.iter().all(|(_, r)| r.is_ok()) || Instant::now() >= deadline {
                return Ok(results);
            }
            std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
        }
    }

    fn judge(&self, check: &DumpCheck) -> Result<(), String> {
        // A pod's checks read its own node's enforcer; the bridge is node 1's.
        let node = match check {
            DumpCheck::Realized { pod, .. }
            | DumpCheck::VethAttached(pod)
            | DumpCheck::VethGone(pod) => self.pod_node(pod).unwrap_or(0),
            DumpCheck::BridgeClean => 0,
        };
        let state = self
            .enforcer_state_of(node)
            .map_err(|e| format!("reading the enforcer's state: {e:#}"))?;
        match check {
            DumpCheck::Realized { pod, realized } => dump::judge_realized(&state, pod, *realized),
            DumpCheck::VethAttached(pod) => {
                let veth = self.host_veth(pod).map_err(|e| format!("{e:#}"))?;
                let progs = self
                    .tc_programs_in(node, &veth)
                    .map_err(|e| format!("{e:#}"))?;
                if progs.is_empty() {
                    return Err(format!("no TC program on {veth}, the host veth of {pod}"));
                }
                if !dump::dump_lists_interface(&state, &veth) {
                    return Err(format!(
                        "the dump does not list {veth}, the host veth of {pod}"
                    ));
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
                let bridge = &self.nodes[0].bridge;
                let progs = self.tc_programs_on(bridge).map_err(|e| format!("{e:#}"))?;
                if progs.is_empty() {
                    Ok(())
                } else {
                    Err(format!("programs attached to bridge {bridge}: {progs:?}"))
                }
            }
        }
    }

    /// The TC programs the kernel has on a device of node 1: TCX counts
    /// from BPF_PROG_QUERY and classic BPF filters, one string each.
    pub fn tc_programs_on(&self, dev: &str) -> Result<Vec<String>> {
        self.tc_programs_in(0, dev)
    }

    fn tc_programs_in(&self, node: usize, dev: &str) -> Result<Vec<String>> {
        let node = self.nodes[node].ns();
        let name = dev.to_string();
        let (ingress, egress) = node.run(move || -> Result<(u32, u32)> {
            let c = std::ffi::CString::new(name.clone())?;
            // SAFETY: c is a valid NUL-terminated string for the call.
            let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
            if index == 0 {
                bail!("no device {name} in the node");
            }
            tcx::tcx_counts(index)
        })??;
        let mut found: Vec<String> = (0..ingress)
            .map(|i| format!("tcx/ingress #{i}"))
            .chain((0..egress).map(|i| format!("tcx/egress #{i}")))
            .collect();
        found.extend(tcx::classic_bpf_filters(
            &node.path().display().to_string(),
            dev,
        )?);
        Ok(found)
    }
}
