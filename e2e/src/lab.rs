//! The lab: one Kubernetes node built on this machine.
//!
//! The node and every pod are network namespaces; pods are wired by the real
//! CNI chain (ptp + host-local, then palisade-cni); the real controller reads
//! the lab's manifests and the real enforcer runs inside the node namespace.
//! Everything is named after a random run id so parallel labs never collide,
//! and everything the lab makes is undone by [`Lab::shutdown`] (or by `Drop`
//! as a fallback), whatever state the lab is in.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use palisade_proto::v1::{GetControllerStateResponse, GetEnforcerStateResponse};
use serde_json::{json, Value};
use tokio::runtime::Runtime;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::cancel::Cancel;
use crate::cni::{lab_chain, Attachment, CniChain, Sandbox};
use crate::listener::{self, Listeners};
use crate::manifests::Manifests;
use crate::netns::{self, NetNs};
use crate::preflight::{self, BPFFS, CONTROLLER_BIN, ENFORCER_BIN};
use crate::probe::{self, Outcome};
use crate::process::{self, Daemon};
use crate::scenario::{Kind, Object, ObjectKey, PodName, ProbeSpec, ServedPort, Target};
use crate::{grpc, realized};

const POLL: Duration = Duration::from_millis(50);

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

struct LabPod {
    netns: NetNs,
    sandbox: Sandbox,
    attachment: Option<Attachment>,
    ports: Vec<ServedPort>,
    listeners: Listeners,
}

/// Everything a lab creates on the machine, to check that it is all gone.
#[derive(Debug, Clone)]
pub struct Footprint {
    pub netns: Vec<String>,
    pub host_interfaces: Vec<String>,
    pub pin_root: PathBuf,
    pub pids: Vec<u32>,
    pub run_dir: PathBuf,
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
        if self.pin_root.exists() {
            left.push(format!("pin root {}", self.pin_root.display()));
        }
        for pid in &self.pids {
            if process::is_alive(*pid) {
                left.push(format!("process {pid}"));
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
    manifests: Manifests,
    cni: CniChain,
    objects: BTreeMap<ObjectKey, Object>,
    pods: BTreeMap<PodName, LabPod>,
    /// Every namespace and host interface ever made, for [`Lab::footprint`].
    made_netns: Vec<String>,
    made_interfaces: Vec<String>,
    made_pids: Vec<u32>,
    next_pod: u32,
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
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let enforcer_socket = run_dir.join("enforcer.sock");
        let mut plugin_dirs = vec![config.cni_bin_dir.clone()];
        if config.with_palisade {
            plugin_dirs.push(config.bin_dir.clone());
        }
        let cni = CniChain {
            plugin_dirs,
            plugins: lab_chain(
                &run_dir.join("ipam"),
                &config.pod_subnet,
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
            objects: BTreeMap::new(),
            pods: BTreeMap::new(),
            made_netns: Vec::new(),
            made_interfaces: Vec::new(),
            made_pids: Vec::new(),
            next_pod: 0,
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
        if !self.config.with_palisade {
            return Ok(());
        }
        self.manifests.publish()?;

        let mut cmd = Command::new(self.config.bin_dir.join(CONTROLLER_BIN));
        cmd.arg("--manifests")
            .arg(self.manifests.dir())
            .arg("--listen")
            .arg(format!("unix:{}", self.controller_socket.display()));
        default_log_level(&mut cmd);
        let controller = Daemon::spawn(
            CONTROLLER_BIN,
            cmd,
            None,
            &self.log_dir.join("controller.log"),
        )?;
        self.made_pids.push(controller.pid());
        self.controller = Some(controller);
        self.wait_healthy(Role::Controller)?;

        let mut cmd = Command::new(self.config.bin_dir.join(ENFORCER_BIN));
        cmd.arg("--node-name")
            .arg(&self.node_name)
            .arg("--controller")
            .arg(format!("unix:{}", self.controller_socket.display()))
            .arg("--cni-socket")
            .arg(&self.enforcer_socket)
            .arg("--pin-root")
            .arg(&self.pin_root);
        default_log_level(&mut cmd);
        let enforcer = Daemon::spawn(
            ENFORCER_BIN,
            cmd,
            self.node_ns.as_ref(),
            &self.log_dir.join("enforcer.log"),
        )?;
        self.made_pids.push(enforcer.pid());
        self.enforcer = Some(enforcer);
        self.wait_healthy(Role::Enforcer)?;
        self.wait_realized()
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

    pub fn controller_pid(&self) -> Option<u32> {
        self.controller.as_ref().map(Daemon::pid)
    }

    pub fn enforcer_pid(&self) -> Option<u32> {
        self.enforcer.as_ref().map(Daemon::pid)
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodName> {
        self.pods.keys()
    }

    pub fn pod_ip(&self, pod: &PodName) -> Option<IpAddr> {
        self.pods
            .get(pod)
            .and_then(|p| p.attachment.as_ref())
            .and_then(|a| a.ips.first().copied())
    }

    pub fn pod_netns(&self, pod: &PodName) -> Option<&str> {
        self.pods.get(pod).map(|p| p.netns.name())
    }

    pub fn host_interfaces(&self, pod: &PodName) -> Vec<String> {
        self.pods
            .get(pod)
            .and_then(|p| p.attachment.as_ref())
            .map(|a| a.host_interfaces.clone())
            .unwrap_or_default()
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

    pub fn controller_state(&self) -> Result<GetControllerStateResponse> {
        self.rt()
            .block_on(grpc::controller_state(&self.controller_socket))
    }

    pub fn enforcer_state(&self) -> Result<GetEnforcerStateResponse> {
        self.rt()
            .block_on(grpc::enforcer_state(&self.enforcer_socket))
    }

    /// The end of every process log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for name in ["controller.log", "enforcer.log", "cni.log"] {
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

    /// Creates or updates objects, wires new pods through the CNI chain,
    /// starts their listeners, and publishes. Returns the new revision;
    /// [`Lab::wait_realized`] waits for it.
    pub fn apply(&mut self, objects: &[Object]) -> Result<u64> {
        self.config.cancel.check()?;
        for o in objects {
            if let Some(ns) = &o.key().namespace {
                let declared = |k: &ObjectKey| k.kind == Kind::Namespace && &k.name == ns;
                if !self.objects.keys().any(declared) && !objects.iter().any(|o| declared(o.key()))
                {
                    bail!(
                        "apply {}: namespace {ns} does not exist in the lab",
                        o.key()
                    );
                }
            }
        }
        // Namespaces first, like kubectl: the controller may read at any time.
        let mut ordered: Vec<&Object> = objects.iter().collect();
        ordered.sort_by_key(|o| o.key().kind != Kind::Namespace);
        let mut new_pods = Vec::new();
        for o in ordered {
            let key = o.key().clone();
            if let Some(pod) = key.pod_name() {
                let ips = self
                    .pods
                    .get(&pod)
                    .and_then(|p| p.attachment.as_ref())
                    .map(|a| a.ips.clone());
                if ips.is_none() {
                    new_pods.push(pod);
                }
                // A new pod is first written Pending, as the scheduler would,
                // so its policy can be known before its network exists.
                self.manifests
                    .write(&key, &pod_manifest(o, &self.node_name, ips.as_deref()))?;
            } else {
                self.manifests.write(&key, o.body())?;
            }
            self.objects.insert(key, o.clone());
        }
        self.manifests.publish()?;

        for o in objects {
            if let Some(pod) = o.key().pod_name() {
                if !new_pods.contains(&pod) && self.pods[&pod].ports != o.ports() {
                    self.restart_listeners(&pod, o.ports())?;
                }
            }
        }
        for pod in new_pods {
            self.config.cancel.check()?;
            let object = self.objects[&ObjectKey::pod(&pod)].clone();
            if let Err(e) = self.add_pod(&pod, &object) {
                self.objects.remove(object.key());
                let _ = self.manifests.remove(object.key());
                let _ = self.manifests.publish();
                return Err(e);
            }
        }
        self.manifests.publish()
    }

    fn add_pod(&mut self, pod: &PodName, object: &Object) -> Result<()> {
        let index = self.next_pod;
        self.next_pod += 1;
        let ns_name = format!("pl{}-p{index}", self.id);
        self.made_netns.push(ns_name.clone());
        let netns = NetNs::create(&ns_name).with_context(|| format!("pod {pod}"))?;
        let sandbox = Sandbox {
            pod: pod.clone(),
            container_id: format!("pl{}p{index}", self.id),
            netns: netns.path().to_path_buf(),
        };
        let attachment = match self.cni.add(self.node_ns(), &sandbox, &self.config.cancel) {
            Ok(a) => a,
            Err(e) => {
                let _ = netns.delete();
                return Err(e);
            }
        };
        self.made_interfaces
            .extend(attachment.host_interfaces.iter().cloned());
        let manifest = pod_manifest(object, &self.node_name, Some(&attachment.ips));
        self.pods.insert(
            pod.clone(),
            LabPod {
                netns,
                sandbox,
                attachment: Some(attachment),
                ports: Vec::new(),
                listeners: Listeners::default(),
            },
        );
        self.manifests.write(object.key(), &manifest)?;
        self.restart_listeners(pod, object.ports())
    }

    fn restart_listeners(&mut self, pod: &PodName, ports: &[ServedPort]) -> Result<()> {
        let handle = self.rt().handle().clone();
        let p = self
            .pods
            .get_mut(pod)
            .ok_or_else(|| anyhow!("pod {pod} is not in the lab"))?;
        // The old sockets must close before the same ports can be bound again.
        p.listeners = Listeners::default();
        p.ports = Vec::new();
        let listeners = retry_bind(|| listener::start(&handle, &p.netns, ports))
            .with_context(|| format!("starting the listeners of pod {pod}"))?;
        p.listeners = listeners;
        p.ports = ports.to_vec();
        Ok(())
    }

    /// Deletes objects. A deleted pod gets CNI DEL and loses its namespace;
    /// a deleted namespace takes its pods and policies with it. Returns the
    /// new revision.
    pub fn delete(&mut self, keys: &[ObjectKey]) -> Result<u64> {
        self.config.cancel.check()?;
        for key in keys {
            if !self.objects.contains_key(key) {
                bail!("delete {key}: it is not in the lab");
            }
        }
        let mut errors = Vec::new();
        for key in keys {
            let doomed: Vec<ObjectKey> = if key.kind == Kind::Namespace {
                self.objects
                    .keys()
                    .filter(|k| k.namespace.as_deref() == Some(&key.name))
                    .cloned()
                    .chain([key.clone()])
                    .collect()
            } else {
                vec![key.clone()]
            };
            for k in doomed {
                if let Some(pod) = k.pod_name().and_then(|p| self.pods.remove(&p)) {
                    if let Err(e) = self.teardown_pod(pod) {
                        errors.push(format!("{e:#}"));
                    }
                }
                self.manifests.remove(&k)?;
                self.objects.remove(&k);
            }
        }
        let revision = self.manifests.publish()?;
        if !errors.is_empty() {
            bail!("delete: {}", errors.join("; "));
        }
        Ok(revision)
    }

    fn teardown_pod(&self, pod: LabPod) -> Result<()> {
        let mut errors = Vec::new();
        if let (Some(a), Some(node)) = (&pod.attachment, &self.node_ns) {
            if let Err(e) = self.cni.del(node, &pod.sandbox, Some(&a.result)) {
                errors.push(format!("{e:#}"));
            }
        }
        // Open sockets would keep the namespace alive after it is unmounted.
        drop(pod.listeners);
        if let Err(e) = pod.netns.delete() {
            errors.push(format!("{e:#}"));
        }
        if !errors.is_empty() {
            bail!("removing pod {}: {}", pod.sandbox.pod, errors.join("; "));
        }
        Ok(())
    }

    /// Waits until the last published revision is realized on the node:
    /// read by the controller, planned for the node, and reported realized
    /// by the enforcer.
    pub fn wait_realized(&mut self) -> Result<()> {
        if !self.config.with_palisade {
            return Ok(());
        }
        let revision = self.manifests.revision();
        let deadline = Instant::now() + self.config.realize_timeout;
        let mut last;
        let mut last_state = String::from("none");
        loop {
            self.config.cancel.check()?;
            self.check_processes()?;
            match self
                .rt()
                .block_on(grpc::controller_state(&self.controller_socket))
            {
                Ok(state) => match realized::check(&state, &self.node_name, revision) {
                    Ok(()) => return Ok(()),
                    Err(reason) => {
                        last = reason;
                        last_state = realized::describe(&state, &self.node_name);
                    }
                },
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() >= deadline {
                bail!(
                    "revision {revision} was not realized on node {} within {:?}: {last}\n  last controller state: {last_state}",
                    self.node_name,
                    self.config.realize_timeout
                );
            }
            std::thread::sleep(POLL);
        }
    }

    fn check_processes(&mut self) -> Result<()> {
        for d in [self.controller.as_mut(), self.enforcer.as_mut()]
            .into_iter()
            .flatten()
        {
            d.check_running()?;
        }
        Ok(())
    }

    fn wait_healthy(&mut self, role: Role) -> Result<()> {
        let (socket, timeout) = match role {
            Role::Controller => (self.controller_socket.clone(), self.config.start_timeout),
            Role::Enforcer => (self.enforcer_socket.clone(), self.config.start_timeout),
        };
        let deadline = Instant::now() + timeout;
        let mut last = String::from("the socket does not exist yet");
        loop {
            self.config.cancel.check()?;
            self.check_processes()?;
            if socket.exists() {
                match self.rt().block_on(grpc::health(&socket)) {
                    Ok(ServingStatus::Serving) => return Ok(()),
                    Ok(status) => last = format!("health status {status:?}"),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if Instant::now() >= deadline {
                let daemon = match role {
                    Role::Controller => self.controller.as_ref(),
                    Role::Enforcer => self.enforcer.as_ref(),
                };
                let log = daemon
                    .map(|d| {
                        format!(
                            "\n  last lines of {}:\n{}",
                            d.log_path().display(),
                            process::tail(d.log_path(), 30)
                        )
                    })
                    .unwrap_or_default();
                bail!(
                    "{} was not SERVING on {} within {timeout:?}: {last}{log}",
                    role.name(),
                    socket.display()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Sends real traffic as described by `spec`.
    pub fn probe(&self, spec: &ProbeSpec) -> Result<Outcome> {
        Ok(self.probe_all(std::slice::from_ref(spec))?.remove(0))
    }

    /// Runs the probes concurrently (each waits up to its own timeout).
    pub fn probe_all(&self, specs: &[ProbeSpec]) -> Result<Vec<Outcome>> {
        self.config.cancel.check()?;
        let resolved = specs
            .iter()
            .map(|s| {
                let from = self
                    .pods
                    .get(&s.from)
                    .ok_or_else(|| anyhow!("probe from {}: no such pod in the lab", s.from))?;
                let ip = match &s.to {
                    Target::Ip(ip) => *ip,
                    Target::Pod(p) => self
                        .pod_ip(p)
                        .ok_or_else(|| anyhow!("probe to {p}: no such pod in the lab"))?,
                };
                Ok((&from.netns, SocketAddr::new(ip, s.port), s))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(std::thread::scope(|scope| {
            let handles: Vec<_> = resolved
                .into_iter()
                .map(|(ns, addr, s)| {
                    scope.spawn(move || probe::run(ns, addr, s.protocol, s.timeout))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Outcome::Error("probe thread panicked".into()))
                })
                .collect()
        }))
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
        // Pods first, while the enforcer is alive to answer palisade-cni DEL.
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
        if let Some(ns) = self.node_ns.take() {
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

#[derive(Clone, Copy)]
enum Role {
    Controller,
    Enforcer,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Controller => CONTROLLER_BIN,
            Role::Enforcer => ENFORCER_BIN,
        }
    }
}

/// The pod as the API server would show it once scheduled to the node
/// (`ips` = None) or running with its addresses.
fn pod_manifest(object: &Object, node: &str, ips: Option<&[IpAddr]>) -> Value {
    let mut body = object.body().clone();
    body["spec"]["nodeName"] = node.into();
    body["status"] = match ips {
        Some(ips) => json!({
            "phase": "Running",
            "podIP": ips.first().map(ToString::to_string),
            "podIPs": ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect::<Vec<_>>(),
        }),
        None => json!({"phase": "Pending"}),
    };
    body
}

fn default_log_level(cmd: &mut Command) {
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
}

/// Aborted listener tasks close their sockets asynchronously, so a rebind of
/// the same port may briefly see EADDRINUSE.
fn retry_bind<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline && is_addr_in_use(&e) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_addr_in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    })
}

fn random_id() -> Result<String> {
    let mut bytes = [0u8; 3];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the run id")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
