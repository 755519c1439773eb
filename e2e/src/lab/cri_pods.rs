//! Pods started by containerd (`runtime: containerd`): every node runs its
//! own containerd (see [`crate::runtime::containerd`]), and every pod is a
//! CRI sandbox the lab asks for as the kubelet does. containerd makes the
//! netns and runs the node's CNI chain (ptp or bridge, then palisade-cni)
//! with the real CNI_ARGS; the lab then finds the sandbox's netns in its
//! status and runs the pod's listeners and probes there.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use super::pods::{pod_manifest, LabPod};
use super::Lab;
use crate::cni::{Attachment, Sandbox};
use crate::listener::Listeners;
use crate::netns::{NetNs, NETNS_DIR};
use crate::preflight::CNI_BIN;
use crate::runtime::containerd::{Containerd, Layout, Settings};
use crate::runtime::cri::SandboxInfo;
use crate::runtime::sandbox::{self, SandboxRequest};
use crate::runtime::sweep::SANDBOXES_FILE;
use crate::runtime::{cgroups, PodRuntime};
use crate::scenario::{Object, ObjectKey, PodName};

/// containerd's own margin over the CNI chain's bound, per CRI call.
const CALL_MARGIN: Duration = Duration::from_secs(30);

/// What the lab knows of a pod containerd started.
pub(crate) struct CriPod {
    pub(crate) uid: String,
    /// 0 for the pod's first sandbox, one more for each recreation.
    pub(crate) attempt: u32,
}

impl Lab {
    /// Starts node `i`'s containerd on the node's CNI chain.
    pub(super) fn start_containerd(&mut self, i: usize) -> Result<()> {
        let n = &self.nodes[i];
        let settings = Settings {
            layout: Layout {
                dir: n.containerd_dir.clone(),
            },
            plugins: &n.cni.plugins,
            cni_bin_dir: &self.config.cni_bin_dir,
            palisade_cni: self
                .config
                .with_palisade
                .then(|| self.config.bin_dir.join(CNI_BIN)),
            log: n.containerd_log.clone(),
            start_timeout: self.config.start_timeout,
            call_timeout: self.config.cni_timeout + CALL_MARGIN,
        };
        let started = Containerd::start(settings, n.ns(), self.rt().handle(), &self.config.cancel)
            .with_context(|| format!("starting containerd on {}", n.name))?;
        let pid = started.pid();
        self.nodes[i].containerd = Some(started);
        self.record_pid(pid)
    }

    /// Stops every node's containerd (removing any sandbox left), then the
    /// lab's cgroups; returns what went wrong.
    pub(super) fn stop_containerds(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        let grace = self.config.stop_grace;
        for n in &mut self.nodes {
            if let Some(mut c) = n.containerd.take() {
                if let Err(e) = c.stop(grace) {
                    errors.push(format!("{}: {e:#}", n.name));
                }
            }
        }
        if self.config.runtime == PodRuntime::Containerd {
            if let Err(e) = cgroups::remove(&cgroups::lab_cgroup(&self.id)) {
                errors.push(format!("{e:#}"));
            }
        }
        errors
    }

    /// A new pod, as the kubelet starts it: RunPodSandbox on its node.
    pub(super) fn add_pod_cri(
        &mut self,
        pod: &PodName,
        object: &Object,
        node: usize,
    ) -> Result<()> {
        let uid = match object.body()["metadata"]["uid"].as_str() {
            Some(uid) => uid.to_string(),
            None => new_uid()?,
        };
        let made = self.start_sandbox(pod, object, node, &uid, 0)?;
        self.pods.insert(pod.clone(), made);
        self.publish_started(pod, object, node)
    }

    /// Writes the pod Running with its address and starts its listeners.
    fn publish_started(&mut self, pod: &PodName, object: &Object, node: usize) -> Result<()> {
        let ips = self.pods[pod]
            .attachment
            .as_ref()
            .map(|a| a.ips.clone())
            .unwrap_or_default();
        let manifest = pod_manifest(object, &self.nodes[node], Some(&ips));
        self.manifests.write(object.key(), &manifest)?;
        self.restart_listeners(pod, object.ports())
    }

    /// RunPodSandbox for `pod`, then what the lab keeps of it. A refusal is
    /// returned as containerd gave it (naming the CNI plugin that failed),
    /// after checking that containerd removed the failed sandbox.
    fn start_sandbox(
        &mut self,
        pod: &PodName,
        object: &Object,
        node: usize,
        uid: &str,
        attempt: u32,
    ) -> Result<LabPod> {
        let log_root = self.run_dir.join("pods");
        let cgroup_root = cgroups::lab_cgroup(&self.id);
        let config = sandbox::config(&SandboxRequest {
            pod,
            uid,
            attempt,
            body: object.body(),
            log_root: &log_root,
            cgroup_root: &cgroup_root,
        })?;
        std::fs::create_dir_all(&config.log_directory)
            .with_context(|| format!("creating {}", config.log_directory))?;
        let n = &mut self.nodes[node];
        let name = n.name.clone();
        let containerd = n
            .containerd
            .as_mut()
            .ok_or_else(|| anyhow!("pod {pod}: {name} has no containerd"))?;
        containerd.check_running()?;
        let info = match containerd.run(&pod.to_string(), config) {
            Ok(info) => info,
            Err(e) => {
                let left: Vec<String> = containerd
                    .sandboxes_of(uid)
                    .with_context(|| format!("after the failed sandbox of pod {pod}"))?
                    .into_iter()
                    .filter(|s| s.metadata.as_ref().is_some_and(|m| m.attempt == attempt))
                    .map(|s| s.id)
                    .collect();
                if !left.is_empty() {
                    return Err(e.context(format!(
                        "and containerd kept the failed sandbox {} instead of removing it",
                        left.join(", ")
                    )));
                }
                return Err(e);
            }
        };
        self.keep_sandbox(pod, uid, attempt, info)
    }

    /// Records a ready sandbox: its netns (containerd's, in /run/netns), its
    /// host veth, its shim.
    fn keep_sandbox(
        &mut self,
        pod: &PodName,
        uid: &str,
        attempt: u32,
        info: SandboxInfo,
    ) -> Result<LabPod> {
        let netns = netns_of(&info.netns_path).with_context(|| format!("pod {pod}"))?;
        self.made_netns.push(netns.name().to_string());
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.run_dir.join(SANDBOXES_FILE))
            .context("recording the sandbox")?;
        writeln!(f, "{} {}", info.id, netns.name()).context("recording the sandbox")?;
        self.made_sandboxes.push(info.id.clone());
        self.made_interfaces
            .extend(info.host_interfaces.iter().cloned());
        // The shim outlives any one call: the footprint and the sweep
        // know it by pid (its command line names the lab's socket).
        if let Some(shim) = info.pid.and_then(parent_of) {
            self.record_pid(shim)?;
        }
        Ok(LabPod {
            netns,
            sandbox: Sandbox {
                pod: pod.clone(),
                container_id: info.id,
                netns: info.netns_path,
            },
            attachment: Some(Attachment {
                result: info.cni_result,
                ips: info.ips,
                host_interfaces: info.host_interfaces,
            }),
            ports: Vec::new(),
            listeners: Listeners::default(),
            cri: Some(CriPod {
                uid: uid.to_string(),
                attempt,
            }),
            host_ips: None,
        })
    }

    /// StopPodSandbox (containerd runs the chain's DEL) and
    /// RemovePodSandbox; the netns must be gone after.
    pub(super) fn teardown_pod_cri(&self, pod: LabPod) -> Result<()> {
        let mut errors = Vec::new();
        let node = self
            .pod_node(&pod.sandbox.pod)
            .and_then(|i| self.nodes.get(i));
        match node.and_then(|n| n.containerd.as_ref()) {
            Some(c) => {
                if let Err(e) = c.remove(&pod.sandbox.container_id) {
                    errors.push(format!("{e:#}"));
                } else if NetNs::exists(pod.netns.name()) {
                    errors.push(format!(
                        "containerd removed sandbox {} but left its netns {}",
                        pod.sandbox.container_id,
                        pod.netns.name()
                    ));
                }
            }
            None => errors.push("its node has no containerd".to_string()),
        }
        drop(pod.listeners);
        if !errors.is_empty() {
            bail!("removing pod {}: {}", pod.sandbox.pod, errors.join("; "));
        }
        Ok(())
    }

    /// Recreates a pod's sandbox as the kubelet does when the old one is
    /// gone bad: a new sandbox of the same pod (same name, namespace and
    /// uid, the next attempt), and only then the old one stopped and
    /// removed, so the old sandbox's CNI DEL comes after the new one's ADD.
    /// The pod keeps its name; its address is the new sandbox's.
    pub fn recreate_sandbox(&mut self, pod: &PodName) -> Result<()> {
        self.config.cancel.check()?;
        let node = self
            .pod_node(pod)
            .ok_or_else(|| anyhow!("recreate {pod}: no such pod in the lab"))?;
        let (uid, attempt) = match self.pods.get(pod).and_then(|p| p.cri.as_ref()) {
            Some(c) => (c.uid.clone(), c.attempt),
            None => {
                bail!("recreate {pod}: only a pod containerd started has a sandbox to recreate")
            }
        };
        let object = self
            .objects
            .get(&ObjectKey::pod(pod))
            .cloned()
            .ok_or_else(|| anyhow!("recreate {pod}: no such pod in the lab"))?;
        let new = self.start_sandbox(pod, &object, node, &uid, attempt + 1)?;
        let old = self.pods.insert(pod.clone(), new).expect("checked above");
        let removed = self.teardown_pod_cri(old);
        self.publish_started(pod, &object, node)?;
        // Backends follow the pod's new address.
        self.sync_services()?;
        self.manifests.publish()?;
        removed
    }

    /// The CRI id of the pod's current sandbox (containerd pods only).
    pub fn sandbox_id(&self, pod: &PodName) -> Option<&str> {
        self.pods
            .get(pod)
            .filter(|p| p.cri.is_some())
            .map(|p| p.sandbox.container_id.as_str())
    }

    /// Node `name`'s containerd socket, for `crictl` or `ctr`.
    pub fn containerd_socket_of(&self, name: &str) -> Result<std::path::PathBuf> {
        let n = &self.nodes[self.node_index(name)?];
        n.containerd
            .as_ref()
            .map(Containerd::socket)
            .ok_or_else(|| anyhow!("{name} runs no containerd (runtime: containerd)"))
    }
}

/// containerd's sandbox netns as a named namespace: it must live in
/// /run/netns, where `ip netns` (and so the lab's tools) find it.
fn netns_of(path: &Path) -> Result<NetNs> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("sandbox netns path {} has no name", path.display()))?;
    let ns = NetNs::from_existing(name);
    let same = std::fs::canonicalize(path).ok() == std::fs::canonicalize(ns.path()).ok();
    if !same || !ns.path().exists() {
        bail!(
            "the sandbox's netns {} is not in {NETNS_DIR}",
            path.display()
        );
    }
    Ok(ns)
}

/// The parent pid of `pid`, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the parenthesised name: state, then ppid.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A random pod uid, formatted as the API server's (a version 4 UUID).
fn new_uid() -> Result<String> {
    let mut b = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom for a pod uid")?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_look_like_the_api_servers() {
        let u = new_uid().unwrap();
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'4');
        assert_ne!(u, new_uid().unwrap());
    }

    #[test]
    fn reads_the_parent_pid() {
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
    }

    #[test]
    fn refuses_a_netns_outside_the_named_dir() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cni-x");
        std::fs::write(&path, "").unwrap();
        assert!(netns_of(&path).is_err());
    }
}
