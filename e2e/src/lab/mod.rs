//! The lab: one Kubernetes node built on this machine.
//!
//! The node and every pod are network namespaces; pods are wired by the real
//! CNI chain (ptp + host-local, then palisade-cni); the real controller reads
//! the lab's manifests and the real enforcer runs inside the node namespace.
//! Everything is named after a random run id so parallel labs never collide,
//! and everything the lab makes is undone by [`Lab::shutdown`] (or by `Drop`
//! as a fallback), whatever state the lab is in.

mod bench;
mod conntrack;
mod dump;
mod faults;
mod footprint;
mod pods;
mod processes;
mod services;
mod traffic;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::runtime::Runtime;

use crate::cancel::Cancel;
use crate::cni::{lab_chain, CniChain};
use crate::manifests::Manifests;
use crate::netns::NetNs;
use crate::preflight::{self, BPFFS};
use crate::process::{self, Daemon};
use crate::scenario::{CniKind, Mode, Object, ObjectKey, PodName};
use crate::sweep::{OWNER_FILE, PIDS_FILE};

pub use footprint::Footprint;
use pods::LabPod;
pub use services::services_table_exists;

#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Where palisade-controller, palisade-enforcer and palisade-cni are.
    pub bin_dir: PathBuf,
    /// Where the standard CNI plugins (ptp, host-local) are.
    pub cni_bin_dir: PathBuf,
    /// Each lab gets `<run_root>/<id>/` for manifests, sockets, IPAM and logs.
    pub run_root: PathBuf,
    pub pod_subnet: String,
    /// Keep `<run dir>/logs` after shutdown.
    pub keep_logs: bool,
    /// `false` builds the node with plain ptp networking and no Palisade
    /// process at all: a baseline that tells lab problems from enforcer ones.
    pub with_palisade: bool,
    /// For each process to become healthy.
    pub start_timeout: Duration,
    /// For a published revision to be realized on the node.
    pub realize_timeout: Duration,
    /// For each CNI plugin invocation.
    pub cni_timeout: Duration,
    /// Between SIGTERM and SIGKILL when stopping a process.
    pub stop_grace: Duration,
    /// Set it (e.g. from a signal handler) to make the lab stop waiting.
    pub cancel: Cancel,
    /// `--mode` for every enforcer; `None` passes no flag.
    pub mode: Option<Mode>,
    /// `--pod-up-deadline-ms` for every enforcer; `None` passes no flag.
    pub pod_up_deadline: Option<Duration>,
    /// The plugin Palisade is chained after.
    pub cni: CniKind,
    /// Sysctls of the node's namespace, set when it is made (they go with
    /// it): e.g. short kernel conntrack timeouts.
    pub node_sysctls: Vec<(String, String)>,
    /// `--conntrack-cleanup-secs` for every enforcer; `None` passes no flag.
    pub conntrack_cleanup_secs: Option<u32>,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            bin_dir: default_bin_dir(),
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            run_root: PathBuf::from("/run/palisade-lab"),
            pod_subnet: "10.244.0.0/24".to_string(),
            keep_logs: false,
            with_palisade: true,
            start_timeout: Duration::from_secs(30),
            realize_timeout: Duration::from_secs(30),
            cni_timeout: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
            cancel: Cancel::new(),
            mode: None,
            pod_up_deadline: None,
            cni: CniKind::Ptp,
            node_sysctls: Vec::new(),
            conntrack_cleanup_secs: None,
        }
    }
}

impl LabConfig {
    /// Takes the scenario's top-level settings: mode, pod-up deadline, CNI.
    pub fn for_scenario(self, scenario: &crate::scenario::Scenario) -> Self {
        Self {
            mode: scenario.mode,
            pod_up_deadline: scenario.pod_up_deadline,
            cni: scenario.cni,
            node_sysctls: scenario.node_sysctls.clone(),
            conntrack_cleanup_secs: scenario.conntrack_cleanup_secs,
            ..self
        }
    }
}

/// The directory of the running executable; for a test binary in
/// `target/<profile>/deps`, its parent, where the workspace binaries are.
pub fn default_bin_dir() -> PathBuf {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    }
}

pub struct Lab {
    config: LabConfig,
    id: String,
    node_name: String,
    run_dir: PathBuf,
    log_dir: PathBuf,
    pin_root: PathBuf,
    controller_socket: PathBuf,
    enforcer_socket: PathBuf,
    rt: Option<Runtime>,
    node_ns: Option<NetNs>,
    controller: Option<Daemon>,
    enforcer: Option<Daemon>,
    /// Started by a `start: second-enforcer` fault; never waited on.
    second_enforcer: Option<Daemon>,
    /// Set by a `break: manifests` fault.
    manifests_broken: bool,
    /// Pods whose host veth a fault deleted, with that veth's name.
    unplugged: BTreeMap<PodName, String>,
    /// Processes a fault killed and left down.
    down: BTreeSet<&'static str>,
    bridge: String,
    manifests: Manifests,
    cni: CniChain,
    objects: BTreeMap<ObjectKey, Object>,
    pods: BTreeMap<PodName, LabPod>,
    /// Every namespace and host interface ever made, for [`Lab::footprint`].
    made_netns: Vec<String>,
    made_interfaces: Vec<String>,
    made_pids: Vec<u32>,
    next_pod: u32,
    /// The running enforcer's id, when it reports one.
    enforcer_id: Option<String>,
    /// EndpointSlices written for Services with a selector, as the
    /// EndpointSlice controller would.
    generated_slices: BTreeMap<ObjectKey, serde_json::Value>,
    /// The nft script in force in the node (None: the lab made no table).
    nat_script: Option<String>,
    cleaned: bool,
}

impl Lab {
    /// Builds the node and starts the controller and enforcer; returns once
    /// the (empty) first revision is realized. On failure, whatever was
    /// built is removed before the error is returned.
    pub fn start(config: LabConfig) -> Result<Lab> {
        preflight::check(&config.bin_dir, &config.cni_bin_dir, config.with_palisade)?;
        let id = random_id()?;
        let run_dir = config.run_root.join(&id);
        let log_dir = run_dir.join("logs");
        create_run_dir(&config.run_root, &id)?;
        let enforcer_socket = run_dir.join("enforcer.sock");
        // Interface names are at most 15 bytes; the id keeps labs apart.
        let bridge = format!("plbr{id}");
        let mut plugin_dirs = vec![config.cni_bin_dir.clone()];
        if config.with_palisade {
            plugin_dirs.push(config.bin_dir.clone());
        }
        let cni = CniChain {
            plugin_dirs,
            plugins: lab_chain(
                &run_dir.join("ipam"),
                &config.pod_subnet,
                config.cni,
                &bridge,
                config.with_palisade.then_some(enforcer_socket.as_path()),
            ),
            timeout: config.cni_timeout,
            log: log_dir.join("cni.log"),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name(format!("lab-{id}"))
            .build()
            .context("starting the lab's tokio runtime")?;
        let mut lab = Lab {
            node_name: format!("lab-{id}"),
            pin_root: Path::new(BPFFS).join(format!("palisade-lab-{id}")),
            controller_socket: run_dir.join("controller.sock"),
            enforcer_socket,
            manifests: Manifests::create(&run_dir.join("manifests"))?,
            cni,
            rt: Some(rt),
            node_ns: None,
            controller: None,
            enforcer: None,
            second_enforcer: None,
            manifests_broken: false,
            unplugged: BTreeMap::new(),
            down: BTreeSet::new(),
            bridge,
            objects: BTreeMap::new(),
            pods: BTreeMap::new(),
            made_netns: Vec::new(),
            made_interfaces: Vec::new(),
            made_pids: Vec::new(),
            next_pod: 0,
            enforcer_id: None,
            generated_slices: BTreeMap::new(),
            nat_script: None,
            cleaned: false,
            config,
            id,
            run_dir,
            log_dir,
        };
        match lab.boot() {
            Ok(()) => Ok(lab),
            Err(e) => {
                let e = e.context(format!("starting lab {}", lab.id));
                match lab.cleanup() {
                    Ok(()) => Err(e),
                    Err(c) => Err(e.context(format!("and cleaning up failed too: {c:#}"))),
                }
            }
        }
    }

    fn boot(&mut self) -> Result<()> {
        let node_ns_name = format!("pl{}-node", self.id);
        self.made_netns.push(node_ns_name.clone());
        let node_ns = NetNs::create(&node_ns_name)?;
        self.node_ns = Some(node_ns);
        // ptp routes between pods through the node, as a real node does.
        self.node_ns().set_sysctl("net.ipv4.ip_forward", "1")?;
        for (key, value) in &self.config.node_sysctls {
            self.node_ns().set_sysctl(key, value)?;
        }
        if !self.config.with_palisade {
            return Ok(());
        }
        self.manifests.publish()?;
        self.start_controller()?;
        self.start_enforcer()?;
        self.wait_realized()
    }

    fn record_pid(&mut self, pid: u32) -> Result<()> {
        self.made_pids.push(pid);
        let list: String = self.made_pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(self.run_dir.join(PIDS_FILE), list).context("recording process ids")
    }

    fn node_ns(&self) -> &NetNs {
        self.node_ns
            .as_ref()
            .expect("the node namespace exists once booted")
    }

    fn rt(&self) -> &Runtime {
        self.rt.as_ref().expect("the runtime lives until cleanup")
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn controller_socket(&self) -> &Path {
        &self.controller_socket
    }

    pub fn enforcer_socket(&self) -> &Path {
        &self.enforcer_socket
    }

    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    pub fn manifest_dir(&self) -> &Path {
        self.manifests.dir()
    }

    /// The last published manifest revision.
    pub fn revision(&self) -> u64 {
        self.manifests.revision()
    }

    pub fn node_netns(&self) -> Option<&str> {
        self.node_ns.as_ref().map(NetNs::name)
    }

    pub fn footprint(&self) -> Footprint {
        Footprint {
            netns: self.made_netns.clone(),
            host_interfaces: self.made_interfaces.clone(),
            pin_root: self.pin_root.clone(),
            pids: self.made_pids.clone(),
            run_dir: self.run_dir.clone(),
        }
    }

    /// The end of every process log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for name in [
            "controller.log",
            "enforcer.log",
            "enforcer-2.log",
            "cni.log",
        ] {
            let path = self.log_dir.join(name);
            if path.exists() {
                out += &format!(
                    "--- {} (last {lines} lines)\n{}\n",
                    path.display(),
                    process::tail(&path, lines)
                );
            }
        }
        out
    }

    /// Removes everything the lab made; reports whatever could not be removed.
    pub fn shutdown(mut self) -> Result<()> {
        self.cleanup()
    }

    fn cleanup(&mut self) -> Result<()> {
        if self.cleaned {
            return Ok(());
        }
        self.cleaned = true;
        let mut errors = Vec::new();
        // A second enforcer goes first: it would take the node over once the
        // first one stops.
        if let Some(mut second) = self.second_enforcer.take() {
            if let Err(e) = second.stop(self.config.stop_grace) {
                errors.push(format!("{e:#}"));
            }
        }
        // Pods first, while the enforcer is alive to answer palisade-cni DEL:
        // one a fault left down is started again for that.
        if self.config.with_palisade && self.enforcer.is_none() && self.node_ns.is_some() {
            if let Err(e) = self.start_enforcer() {
                errors.push(format!("restarting the enforcer for pod teardown: {e:#}"));
            }
        }
        let pods = std::mem::take(&mut self.pods);
        for (_, pod) in pods.into_iter().rev() {
            if let Err(e) = self.teardown_pod(pod) {
                errors.push(format!("{e:#}"));
            }
        }
        for d in [self.enforcer.as_mut(), self.controller.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Err(e) = d.stop(self.config.stop_grace) {
                errors.push(format!("{e:#}"));
            }
        }
        self.enforcer = None;
        self.controller = None;
        // Dropping the runtime closes every listener socket still open.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
        if let Err(e) = self.remove_services_table() {
            errors.push(format!("{e:#}"));
        }
        if let Some(ns) = self.node_ns.take() {
            match services::services_table_exists(Some(&ns.path().display().to_string())) {
                Ok(false) => {}
                Ok(true) => errors.push(format!(
                    "the Services' table is still in the node namespace {}",
                    ns.name()
                )),
                Err(e) => errors.push(format!("{e:#}")),
            }
            if let Err(e) = ns.delete() {
                errors.push(format!("{e:#}"));
            }
        }
        if self.pin_root.exists() {
            if let Err(e) = std::fs::remove_dir_all(&self.pin_root) {
                errors.push(format!(
                    "removing pin root {}: {e}",
                    self.pin_root.display()
                ));
            }
        }
        if let Err(e) = self.remove_run_dir() {
            errors.push(format!("{e:#}"));
        }
        if !errors.is_empty() {
            bail!(
                "cleanup of lab {} left problems:\n  - {}",
                self.id,
                errors.join("\n  - ")
            );
        }
        Ok(())
    }

    fn remove_run_dir(&self) -> Result<()> {
        if !self.run_dir.exists() {
            return Ok(());
        }
        if self.config.keep_logs {
            for entry in std::fs::read_dir(&self.run_dir)? {
                let entry = entry?;
                if entry.file_name() == "logs" {
                    continue;
                }
                let path = entry.path();
                let result = if entry.file_type()?.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                result.with_context(|| format!("removing {}", path.display()))?;
            }
            return Ok(());
        }
        std::fs::remove_dir_all(&self.run_dir)
            .with_context(|| format!("removing {}", self.run_dir.display()))?;
        // Other labs may be using the root concurrently; only an empty one goes.
        let _ = std::fs::remove_dir(&self.config.run_root);
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("palisade-lab: {e:#}");
        }
    }
}

/// The run dir appears (by rename) already holding the owner pid, so
/// `palisade-lab clean` never mistakes a starting lab for a dead one.
fn create_run_dir(run_root: &Path, id: &str) -> Result<()> {
    let staging = run_root.join(format!(".{id}.new"));
    std::fs::create_dir_all(staging.join("logs"))
        .with_context(|| format!("creating {}", staging.display()))?;
    std::fs::write(staging.join(OWNER_FILE), std::process::id().to_string())
        .context("writing the lab's owner pid")?;
    std::fs::rename(&staging, run_root.join(id))
        .with_context(|| format!("creating the run dir of lab {id}"))
}

fn random_id() -> Result<String> {
    let mut bytes = [0u8; 3];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the run id")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
