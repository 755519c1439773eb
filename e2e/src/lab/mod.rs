//! The lab: a small Kubernetes cluster built on this machine.
//!
//! Every node and every pod is a network namespace; pods are wired by the
//! real CNI chain of their node (ptp + host-local, then palisade-cni); nodes
//! are joined by a routed fabric (see [`node`]); the real controller reads
//! the lab's manifests and serves every node's real enforcer over TCP.
//! Everything is named after a random run id so parallel labs never collide,
//! and everything the lab makes is undone by [`Lab::shutdown`] (or by `Drop`
//! as a fallback), whatever state the lab is in.

mod bench;
mod conntrack;
mod cri_bench;
mod cri_pods;
mod dns;
mod dump;
mod faults;
mod flow_logs;
mod footprint;
mod forward;
mod image;
mod node;
mod otlp;
mod pods;
mod processes;
mod service_ips;
mod services;
mod traffic;
mod upgrade;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::runtime::Runtime;

use crate::cancel::Cancel;
use crate::manifests::Manifests;
use crate::netns::NetNs;
use crate::preflight;
use crate::process::{self, Daemon};
use crate::runtime::PodRuntime;
use crate::scenario::{CniKind, FlowLogMode, Mode, Object, ObjectKey, PodName};
use crate::sweep::{OWNER_FILE, PIDS_FILE};

pub use footprint::Footprint;
pub use image::{conflist_name, node_root_bpffs, ApiServer, ImageRun, LAB_LABEL};
use node::LabNode;
pub use node::{node_manifest, INTERNET, INTERNET6, MAX_NODES};
use pods::LabPod;
pub use services::services_table_exists;
pub use upgrade::{Handover, Retiring, Surge};

#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Where palisade-controller, palisade-enforcer and palisade-cni are.
    pub bin_dir: PathBuf,
    /// Where the standard CNI plugins (ptp, host-local) are.
    pub cni_bin_dir: PathBuf,
    /// Each lab gets `<run_root>/<id>/` for manifests, sockets, IPAM and logs.
    pub run_root: PathBuf,
    /// Node 1's pod range; node K gets the range K-1 sizes further on.
    pub pod_subnet: String,
    /// Dual stack: node 1's IPv6 pod range (a /64; node K gets the K-1th
    /// next one), every pod an address from it besides its IPv4 one
    /// ([`Lab::pod_ip6`]). `None`: IPv4 only.
    pub pod_subnet6: Option<String>,
    /// How many nodes (1 to [`MAX_NODES`]).
    pub nodes: usize,
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
    /// Who starts the pods: the lab itself, or a containerd per node.
    pub runtime: PodRuntime,
    /// Sysctls of the node's namespace, set when it is made (they go with
    /// it): e.g. short kernel conntrack timeouts.
    pub node_sysctls: Vec<(String, String)>,
    /// `--conntrack-cleanup-secs` for every enforcer; `None` passes no flag.
    pub conntrack_cleanup_secs: Option<u32>,
    /// Bind a TCP listener for an OTLP receiver in the fabric namespace, at
    /// the controller's address (reachable from every node), and start the
    /// controller and every enforcer with `--otlp-endpoint` pointing at it.
    /// The caller serves it: [`Lab::take_otlp_listener`].
    pub otlp_listener: bool,
    /// `--flow-log` for every enforcer, each writing to its own file in
    /// the lab's log dir ([`Lab::flow_log_path_of`]); `None` passes no flow
    /// log flag.
    pub flow_log: Option<FlowLogMode>,
    /// `--flow-log-rate` with [`LabConfig::flow_log`]; `None`: the default.
    pub flow_log_rate: Option<u32>,
    /// More flags for the controller (limits, say), after the lab's own.
    pub controller_args: Vec<String>,
    /// More flags for every enforcer, after the lab's own.
    pub enforcer_args: Vec<String>,
    /// `Some`: the controller and the enforcers run from this image as the
    /// chart's pods (`--node-processes image`); `None`: the workspace binaries
    /// in [`LabConfig::bin_dir`] as plain processes.
    pub image: Option<ImageRun>,
    /// Image mode: chart values (a values file's contents) under the lab's
    /// own (the image, each node's host paths); `Null`: none.
    pub chart_values: serde_json::Value,
    /// Image mode: the controller watches a Kubernetes API the caller
    /// serves, instead of the lab's manifests (see [`ApiServer`]).
    pub api: Option<ApiServer>,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            bin_dir: default_bin_dir(),
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            run_root: PathBuf::from("/run/palisade-lab"),
            pod_subnet: "10.244.0.0/24".to_string(),
            pod_subnet6: None,
            nodes: 1,
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
            runtime: PodRuntime::Lab,
            node_sysctls: Vec::new(),
            conntrack_cleanup_secs: None,
            otlp_listener: false,
            flow_log: None,
            flow_log_rate: None,
            controller_args: Vec::new(),
            enforcer_args: Vec::new(),
            image: None,
            chart_values: serde_json::Value::Null,
            api: None,
        }
    }
}

impl LabConfig {
    /// Takes the scenario's top-level settings: nodes, mode, pod-up
    /// deadline, CNI, runtime (when it names one), flow logs.
    pub fn for_scenario(self, scenario: &crate::scenario::Scenario) -> Self {
        Self {
            nodes: scenario.nodes as usize,
            mode: scenario.mode,
            pod_up_deadline: scenario.pod_up_deadline,
            cni: scenario.cni,
            runtime: scenario.runtime.unwrap_or(self.runtime),
            node_sysctls: scenario.node_sysctls.clone(),
            conntrack_cleanup_secs: scenario.conntrack_cleanup_secs,
            flow_log: scenario.flow_logs,
            flow_log_rate: scenario.flow_log_rate,
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
    run_dir: PathBuf,
    log_dir: PathBuf,
    controller_socket: PathBuf,
    rt: Option<Runtime>,
    /// The namespace joining the nodes, where the controller runs.
    fabric: Option<NetNs>,
    nodes: Vec<LabNode>,
    controller: Option<Daemon>,
    /// Set by a `break: manifests` fault.
    manifests_broken: bool,
    /// See [`LabConfig::otlp_listener`]; taken by the caller.
    otlp: Option<otlp::Listener>,
    /// Pods whose host veth a fault deleted, with that veth's name.
    unplugged: BTreeMap<PodName, String>,
    /// Processes a fault killed and left down (faults act on node 1).
    down: BTreeSet<&'static str>,
    manifests: Manifests,
    objects: BTreeMap<ObjectKey, Object>,
    pods: BTreeMap<PodName, LabPod>,
    /// Every namespace and host interface ever made, for [`Lab::footprint`].
    made_netns: Vec<String>,
    made_interfaces: Vec<String>,
    made_pids: Vec<u32>,
    /// Every CRI sandbox containerd made (runtime: containerd).
    made_sandboxes: Vec<String>,
    next_pod: u32,
    /// Where the next pod without `spec.nodeName` goes (round-robin).
    next_node: usize,
    /// The node of every pod the lab holds (wired or not yet).
    placement: BTreeMap<PodName, usize>,
    /// EndpointSlices written for Services with a selector, as the
    /// EndpointSlice controller would.
    generated_slices: BTreeMap<ObjectKey, serde_json::Value>,
    /// With `--node-processes image`.
    image: Option<image::ImageState>,
    /// The scenario's DNS (`dns:`), once set.
    dns: Option<dns::LabDns>,
    cleaned: bool,
}

impl Lab {
    /// Builds the node and starts the controller and enforcer; returns once
    /// the (empty) first revision is realized. On failure, whatever was
    /// built is removed before the error is returned.
    pub fn start(config: LabConfig) -> Result<Lab> {
        match &config.image {
            Some(run) if config.with_palisade => {
                preflight::check_image(&run.image, &config.cni_bin_dir)?
            }
            _ => preflight::check(&config.bin_dir, &config.cni_bin_dir, config.with_palisade)?,
        }
        if (config.api.is_some() || !config.chart_values.is_null()) && config.image.is_none() {
            bail!("an API for the controller and chart values need --node-processes image");
        }
        if config.runtime == PodRuntime::Containerd {
            if config.image.is_some() {
                bail!("runtime: containerd with --node-processes image is not supported yet: the image's CNI install writes the chain containerd reads, which the lab's containerd config does not point at");
            }
            let missing = crate::runtime::containerd::missing(&config.cni_bin_dir);
            if !missing.is_empty() {
                return Err(preflight::Missing(missing).into());
            }
        }
        if !(1..=MAX_NODES).contains(&config.nodes) {
            bail!("nodes: {} is out of range (1-{MAX_NODES})", config.nodes);
        }
        let id = random_id()?;
        let run_dir = config.run_root.join(&id);
        let log_dir = run_dir.join("logs");
        let nodes = (0..config.nodes)
            .map(|i| LabNode::new(&config, &id, &run_dir, i))
            .collect::<Result<Vec<_>>>()?;
        create_run_dir(&config.run_root, &id)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name(format!("lab-{id}"))
            .build()
            .context("starting the lab's tokio runtime")?;
        let mut lab = Lab {
            controller_socket: run_dir.join("controller.sock"),
            manifests: Manifests::create(&run_dir.join("manifests"))?,
            rt: Some(rt),
            fabric: None,
            otlp: None,
            nodes,
            controller: None,
            manifests_broken: false,
            unplugged: BTreeMap::new(),
            down: BTreeSet::new(),
            objects: BTreeMap::new(),
            pods: BTreeMap::new(),
            made_netns: Vec::new(),
            made_interfaces: Vec::new(),
            made_pids: Vec::new(),
            made_sandboxes: Vec::new(),
            next_pod: 0,
            next_node: 0,
            placement: BTreeMap::new(),
            generated_slices: BTreeMap::new(),
            image: config
                .image
                .clone()
                .filter(|_| config.with_palisade)
                .map(|run| image::ImageState {
                    run,
                    rendered: Vec::new(),
                    controller_pod: None,
                    forwarder: None,
                    kubeconfig: None,
                    cluster_dns: None,
                }),
            dns: None,
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
        let fabric_name = format!("pl{}-fabric", self.id);
        self.made_netns.push(fabric_name.clone());
        self.fabric = Some(NetNs::create(&fabric_name)?);
        node::make_fabric(self.fabric())?;
        node::make_internet(self.fabric(), self.config.pod_subnet6.is_some())?;
        if self.config.otlp_listener {
            self.otlp = Some(otlp::Listener::bind(self.fabric(), node::controller_ip())?);
        }
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].netns_name.clone();
            self.made_netns.push(name.clone());
            let ns = NetNs::create(&name)?;
            // ptp routes between pods through the node, as a real node does.
            ns.set_sysctl("net.ipv4.ip_forward", "1")?;
            if self.config.pod_subnet6.is_some() {
                ns.set_sysctl("net.ipv6.conf.all.forwarding", "1")?;
            }
            for (key, value) in &self.config.node_sysctls {
                ns.set_sysctl(key, value)?;
            }
            node::join_fabric(self.fabric(), &ns, i)?;
            if self.config.pod_subnet6.is_some() {
                node::join_fabric6(&ns, i)?;
            }
            self.nodes[i].ns = Some(ns);
        }
        for (i, n) in self.nodes.iter().enumerate() {
            node::join_internet(
                self.fabric(),
                n.ns(),
                i,
                &n.pod_subnet,
                n.pod_subnet6.as_deref(),
            )?;
            for (j, other) in self.nodes.iter().enumerate() {
                if i != j {
                    node::route_to(n.ns(), &other.pod_subnet, j)?;
                    if let Some(subnet6) = &other.pod_subnet6 {
                        node::route6_to(n.ns(), subnet6, j)?;
                    }
                }
            }
        }
        if self.config.runtime == PodRuntime::Containerd {
            for i in 0..self.nodes.len() {
                self.start_containerd(i)?;
            }
        }
        if !self.config.with_palisade {
            return Ok(());
        }
        if self.image.is_some() {
            for i in 0..self.nodes.len() {
                self.make_node_root(i)?;
            }
            self.render_charts()?;
        }
        for node in self.node_objects() {
            self.manifests.write_node(&node)?;
        }
        self.manifests.publish()?;
        if self.config.api.is_some() {
            self.serve_api()?;
        }
        self.start_controller()?;
        for i in 0..self.nodes.len() {
            self.start_enforcer(i)?;
        }
        if self.config.api.is_some() {
            // The manifests are not the controller's source: what the lab
            // can see is every enforcer's plan stream up.
            return self.wait_connected();
        }
        self.wait_realized()
    }

    fn fabric(&self) -> &NetNs {
        self.fabric
            .as_ref()
            .expect("the fabric namespace exists once booted")
    }

    /// The index of the node called `name` (`node-K`).
    pub(super) fn node_index(&self, name: &str) -> Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
                anyhow::anyhow!("no node {name:?} in the lab (it has {})", names.join(", "))
            })
    }

    /// The node a pod runs on (None: not a pod of the lab).
    pub(super) fn pod_node(&self, pod: &PodName) -> Option<usize> {
        self.placement.get(pod).copied()
    }

    fn record_pid(&mut self, pid: u32) -> Result<()> {
        self.made_pids.push(pid);
        let list: String = self.made_pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(self.run_dir.join(PIDS_FILE), list).context("recording process ids")
    }

    fn rt(&self) -> &Runtime {
        self.rt.as_ref().expect("the runtime lives until cleanup")
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Node 1's name.
    pub fn node_name(&self) -> &str {
        &self.nodes[0].name
    }

    /// Every node's Node object, as the lab serves it to the controller
    /// ([`node_manifest`]).
    pub fn node_objects(&self) -> Vec<serde_json::Value> {
        (0..self.nodes.len())
            .map(|i| node_manifest(i, self.config.pod_subnet6.is_some()))
            .collect()
    }

    /// Every node's name, in order (`node-1`, `node-2`, ...).
    pub fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.name.as_str()).collect()
    }

    pub fn controller_socket(&self) -> &Path {
        &self.controller_socket
    }

    /// The controller's TCP address on the fabric, where enforcers reach it.
    pub fn controller_address(&self) -> String {
        format!("{}:{}", node::controller_ip(), node::CONTROLLER_PORT)
    }

    /// Node 1's enforcer socket.
    pub fn enforcer_socket(&self) -> &Path {
        &self.nodes[0].enforcer_socket
    }

    /// The enforcer socket of node `name`.
    pub fn enforcer_socket_of(&self, name: &str) -> Result<&Path> {
        Ok(&self.nodes[self.node_index(name)?].enforcer_socket)
    }

    /// Image mode: node `name`'s host root (its bpffs, run, state, CNI and
    /// kubelet directories live under it).
    pub fn node_root_of(&self, name: &str) -> Option<&Path> {
        let i = self.node_index(name).ok()?;
        self.nodes[i].root.as_ref().map(|r| r.root.as_path())
    }

    /// Node 1's pin root.
    pub fn pin_root(&self) -> &Path {
        &self.nodes[0].pin_root
    }

    /// The pin root of node `name`.
    pub fn pin_root_of(&self, name: &str) -> Result<&Path> {
        Ok(&self.nodes[self.node_index(name)?].pin_root)
    }

    /// The name of the node pod `pod` runs on.
    pub fn node_of(&self, pod: &PodName) -> Option<&str> {
        self.pod_node(pod).map(|i| self.nodes[i].name.as_str())
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

    /// Node 1's network namespace.
    pub fn node_netns(&self) -> Option<&str> {
        self.nodes[0].ns.as_ref().map(NetNs::name)
    }

    /// The network namespace of node `name`.
    pub fn node_netns_of(&self, name: &str) -> Result<&str> {
        let i = self.node_index(name)?;
        self.nodes[i]
            .ns
            .as_ref()
            .map(NetNs::name)
            .ok_or_else(|| anyhow::anyhow!("node {name} has no namespace yet"))
    }

    /// The fabric's network namespace, where the controller runs.
    pub fn fabric_netns(&self) -> Option<&str> {
        self.fabric.as_ref().map(NetNs::name)
    }

    /// The namespace that answers for every address of [`INTERNET`] (the
    /// fabric's): a listener bound there on the unspecified address serves
    /// them all.
    pub fn internet_netns(&self) -> Option<&str> {
        self.fabric_netns()
    }

    pub fn footprint(&self) -> Footprint {
        Footprint {
            netns: self.made_netns.clone(),
            host_interfaces: self.made_interfaces.clone(),
            pin_roots: self.nodes.iter().map(|n| n.pin_root.clone()).collect(),
            pids: self.made_pids.clone(),
            run_dir: self.run_dir.clone(),
            cni_cache: self
                .made_sandboxes
                .iter()
                .flat_map(|s| crate::runtime::sweep::cache_paths(s))
                .collect(),
            cgroups: match self.config.runtime {
                PodRuntime::Containerd => vec![crate::runtime::cgroups::lab_cgroup(&self.id)],
                PodRuntime::Lab => Vec::new(),
            },
        }
    }

    /// The end of every process log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut paths = vec![self.log_dir.join("controller.log")];
        for n in &self.nodes {
            paths.extend([
                n.enforcer_log.clone(),
                n.second_log.clone(),
                n.cni.log.clone(),
                n.containerd_log.clone(),
            ]);
            let sidecars = n.sidecars.iter().chain(&n.second_sidecars);
            paths.extend(sidecars.map(|(_, d)| d.log_path().to_path_buf()));
        }
        for path in paths {
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
        // Second enforcers go first: one would take its node over once the
        // first one stops.
        for n in &mut self.nodes {
            if let Some(mut second) = n.second_enforcer.take() {
                if let Err(e) = second.stop(self.config.stop_grace) {
                    errors.push(format!("{e:#}"));
                }
            }
            for (_, mut d) in std::mem::take(&mut n.second_sidecars) {
                if let Err(e) = d.stop(self.config.stop_grace) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        // Pods first, while the enforcers are alive to answer palisade-cni
        // DEL: one a fault left down is started again for that.
        for i in 0..self.nodes.len() {
            let n = &self.nodes[i];
            if self.config.with_palisade && n.enforcer.is_none() && n.ns.is_some() {
                if let Err(e) = self.start_enforcer(i) {
                    errors.push(format!(
                        "restarting the enforcer of {} for pod teardown: {e:#}",
                        self.nodes[i].name
                    ));
                }
            }
        }
        let pods = std::mem::take(&mut self.pods);
        for (_, pod) in pods.into_iter().rev() {
            if let Err(e) = self.teardown_pod(pod) {
                errors.push(format!("{e:#}"));
            }
        }
        errors.extend(self.stop_containerds());
        for d in self
            .nodes
            .iter_mut()
            .flat_map(|n| {
                n.enforcer
                    .iter_mut()
                    .chain(n.sidecars.iter_mut().map(|(_, d)| d))
            })
            .chain(self.controller.as_mut())
        {
            if let Err(e) = d.stop(self.config.stop_grace) {
                errors.push(format!("{e:#}"));
            }
        }
        for n in &mut self.nodes {
            n.enforcer = None;
            n.sidecars.clear();
            n.pod = None;
            n.second_pod = None;
        }
        self.controller = None;
        if self.image.is_some() {
            match self.remove_lab_containers() {
                Ok(left) if left.is_empty() => {}
                Ok(left) => errors.push(format!(
                    "containers were left and removed: {}",
                    left.join(", ")
                )),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if let Some(state) = self.image.as_mut() {
            state.forwarder = None;
            state.controller_pod = None;
        }
        // Dropping the runtime closes every listener socket still open.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
        for i in 0..self.nodes.len() {
            if let Err(e) = self.remove_services_table(i) {
                errors.push(format!("{e:#}"));
            }
        }
        for n in &mut self.nodes {
            if let Some(ns) = n.ns.take() {
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
            if n.pin_root.exists() {
                if let Err(e) = std::fs::remove_dir_all(&n.pin_root) {
                    errors.push(format!("removing pin root {}: {e}", n.pin_root.display()));
                }
            }
            if let Err(e) = Self::unmount_node_root(n) {
                errors.push(format!("{e:#}"));
            }
        }
        if let Some(ns) = self.fabric.take() {
            if let Err(e) = ns.delete() {
                errors.push(format!("{e:#}"));
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
