//! What a lab leaves on the machine, to check that cleanup removed it all.

use std::path::PathBuf;

use crate::netns::{self, NetNs};
use crate::process;

/// Everything a lab creates on the machine, to check that it is all gone.
#[derive(Debug, Clone)]
pub struct Footprint {
    pub netns: Vec<String>,
    pub host_interfaces: Vec<String>,
    pub pin_roots: Vec<PathBuf>,
    pub pids: Vec<u32>,
    pub run_dir: PathBuf,
    /// The lab's cgroup (runtime: containerd), in every hierarchy.
    pub cgroups: Vec<String>,
    /// libcni's cached results of the lab's sandboxes: gone once
    /// containerd ran each one's DEL.
    pub cni_cache: Vec<PathBuf>,
}

impl Footprint {
    /// What still exists; empty once the lab is fully cleaned up.
    pub fn remaining(&self) -> Vec<String> {
        let mut left = Vec::new();
        for ns in &self.netns {
            if NetNs::exists(ns) {
                left.push(format!("network namespace {ns}"));
            }
        }
        if let Ok(links) = netns::link_names(None) {
            for i in &self.host_interfaces {
                if links.contains(i) {
                    left.push(format!("interface {i} in the root namespace"));
                }
            }
        }
        // The table belongs in the node's namespace; one in the machine's
        // would translate the machine's own traffic.
        if let Ok(true) = super::services_table_exists(None) {
            left.push(format!(
                "nftables table {} {} in the root namespace",
                crate::nat::FAMILY,
                crate::nat::TABLE
            ));
        }
        for root in &self.pin_roots {
            if root.exists() {
                left.push(format!("pin root {}", root.display()));
            }
        }
        for pid in &self.pids {
            if process::is_alive(*pid) {
                left.push(format!("process {pid}"));
            }
        }
        for cg in &self.cgroups {
            for dir in crate::runtime::cgroups::existing(cg) {
                left.push(format!("cgroup {}", dir.display()));
            }
        }
        for f in &self.cni_cache {
            if f.exists() {
                left.push(format!("CNI cache file {} (no DEL?)", f.display()));
            }
        }
        let logs_only = std::fs::read_dir(&self.run_dir)
            .map(|entries| entries.flatten().all(|e| e.file_name() == "logs"))
            .unwrap_or(true);
        if !logs_only {
            left.push(format!("run dir {}", self.run_dir.display()));
        }
        left
    }
}
