//! Injecting faults: crashes, restarts, a damaged checkpoint, a second
//! enforcer, a broken source, a veth pulled without a DEL. Process faults
//! act on node 1's enforcer; an unplug acts on the pod's own node.
//!
//! Waits after a fault: a restarted enforcer is awaited until SERVING; a
//! started controller only until it answers health (an unsynced one may say
//! NOT_SERVING); a second enforcer is never awaited as healthy, only until
//! it has shown what it does (logged that it waits, exited, or taken the
//! socket over). While a process is down, [`Lab::wait_realized`] refuses and
//! the runner skips it.

use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use super::processes::Role;
use super::Lab;
use crate::fault::{Fault, Process};
use crate::netns;
use crate::preflight::{CONTROLLER_BIN, ENFORCER_BIN};
use crate::process::{self, Daemon};
use crate::scenario::PodName;

/// YAML the controller reads and cannot parse.
const BROKEN_MANIFEST: &str = "zz-broken.yaml";

impl Lab {
    pub fn inject(&mut self, fault: &Fault) -> Result<()> {
        self.require_palisade()?;
        self.config.cancel.check()?;
        match fault {
            Fault::Kill { process, restart } => {
                self.kill(*process)?;
                if *restart {
                    self.start_process(*process)?;
                }
                Ok(())
            }
            Fault::Start(process) => self.start_process(*process),
            Fault::SecondEnforcer => self.start_second_enforcer(),
            Fault::CorruptCheckpoint => self.corrupt_checkpoint(),
            Fault::BreakManifests => self.break_manifests(),
            Fault::RepairManifests => self.repair_manifests(),
            Fault::Unplug(pod) => self.unplug(pod),
        }
        .with_context(|| format!("fault: {fault}"))
    }

    /// SIGKILL; the process stays down until [`Lab::start_process`].
    pub fn kill(&mut self, process: Process) -> Result<()> {
        let (slot, name) = match process {
            Process::Controller => (&mut self.controller, CONTROLLER_BIN),
            Process::Enforcer => (&mut self.nodes[0].enforcer, ENFORCER_BIN),
        };
        let mut daemon = slot
            .take()
            .ok_or_else(|| anyhow!("the {} is not running", process.as_str()))?;
        daemon.kill()?;
        self.down.insert(name);
        Ok(())
    }

    pub fn start_process(&mut self, process: Process) -> Result<()> {
        match process {
            Process::Controller if self.controller.is_none() => {
                self.spawn_controller()?;
                self.wait_answering(Role::Controller)
            }
            Process::Enforcer if self.nodes[0].enforcer.is_none() => self.start_enforcer(0),
            _ => bail!("the {} is already running", process.as_str()),
        }
    }

    /// Every file of the state dir truncated (the first, by name, to zero;
    /// the others to half their length) while the enforcer is dead, then a
    /// restart on them.
    pub fn corrupt_checkpoint(&mut self) -> Result<()> {
        if self.nodes[0].enforcer.is_some() {
            self.kill(Process::Enforcer)?;
        }
        let dir = self.state_dir();
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("the enforcer's state dir {} holds no file", dir.display());
        }
        for (i, path) in files.iter().enumerate() {
            let len = std::fs::metadata(path)?.len();
            let keep = if i == 0 { 0 } else { len / 2 };
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(keep))
                .with_context(|| format!("truncating {}", path.display()))?;
        }
        self.start_enforcer(0)
    }

    /// Another enforcer with the same flags (pin root, state dir, socket)
    /// while the first runs. Returns once it has shown what it does; fails
    /// if it neither waits, exits, nor takes over within the start timeout.
    pub fn start_second_enforcer(&mut self) -> Result<()> {
        if self.nodes[0].second_enforcer.is_some() {
            bail!("a second enforcer is already running");
        }
        let first_id = self.nodes[0].enforcer_id.clone();
        let log = self.nodes[0].second_log.clone();
        let second = if self.image.is_some() {
            self.spawn_second_enforcer_pod()?
        } else {
            let cmd = self.enforcer_command(0);
            Daemon::spawn(
                "second palisade-enforcer",
                cmd,
                self.nodes[0].ns.as_ref(),
                &log,
            )?
        };
        self.record_pid(second.pid())?;
        self.nodes[0].second_enforcer = Some(second);
        let deadline = Instant::now() + self.config.start_timeout;
        loop {
            self.config.cancel.check()?;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.to_lowercase().contains("wait") {
                return Ok(());
            }
            if let Some(second) = self.nodes[0].second_enforcer.as_mut() {
                if second.exit_status().is_some() {
                    return Ok(());
                }
            }
            let answering = self
                .enforcer_state_of(0)
                .ok()
                .and_then(|s| s.state)
                .map(|s| s.enforcer_id);
            if answering.is_some() && answering != first_id {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the second enforcer neither logged that it waits, exited, nor took over within {:?}:\n{}",
                    self.config.start_timeout,
                    process::tail(&log, 20)
                );
            }
            std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
        }
    }

    /// The enforcer that answers on the socket now (its id), if any.
    pub fn answering_enforcer_id(&self) -> Option<String> {
        self.answering_enforcer_id_of(0)
    }

    /// The id of the enforcer the lab started last (and believes in).
    pub fn enforcer_id(&self) -> Option<&str> {
        self.nodes[0].enforcer_id.as_deref()
    }

    /// Whether the second enforcer is still running (waiting for the lock).
    pub fn second_enforcer_running(&mut self) -> bool {
        self.nodes[0]
            .second_enforcer
            .as_mut()
            .is_some_and(|d| d.exit_status().is_none())
    }

    pub fn break_manifests(&mut self) -> Result<()> {
        if self.manifests_broken {
            bail!("the manifests are already broken");
        }
        std::fs::write(
            self.manifests.dir().join(BROKEN_MANIFEST),
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: broken, namespace: default}\nspec: {podSelector: [not, a, selector\n",
        )
        .context("writing a broken manifest")?;
        self.manifests_broken = true;
        Ok(())
    }

    pub fn repair_manifests(&mut self) -> Result<()> {
        if !self.manifests_broken {
            bail!("the manifests are not broken");
        }
        std::fs::remove_file(self.manifests.dir().join(BROKEN_MANIFEST))
            .context("removing the broken manifest")?;
        self.manifests_broken = false;
        // A new revision makes the controller read the repaired source.
        self.manifests.publish()?;
        Ok(())
    }

    /// Deletes the pod's host veth in its node with no CNI DEL.
    pub fn unplug(&mut self, pod: &PodName) -> Result<()> {
        let veth = self.host_veth(pod)?;
        netns::delete_link(self.pod_node_ns(pod)?.name(), &veth)?;
        self.unplugged.insert(pod.clone(), veth);
        Ok(())
    }

    /// The pod's host veth: the peer of its eth0, found in the kernel
    /// (a bridge result lists the bridge too), or the one a fault deleted.
    pub fn host_veth(&self, pod: &PodName) -> Result<String> {
        if let Some(name) = self.unplugged.get(pod) {
            return Ok(name.clone());
        }
        let ns = self
            .pod_netns(pod)
            .ok_or_else(|| anyhow!("pod {pod} is not in the lab"))?;
        netns::veth_peer(ns, crate::cni::IFNAME, self.pod_node_ns(pod)?.name())
    }

    /// The namespace of the node the pod runs on.
    pub(super) fn pod_node_ns(&self, pod: &PodName) -> Result<&crate::netns::NetNs> {
        let i = self
            .pod_node(pod)
            .ok_or_else(|| anyhow!("pod {pod} is not in the lab"))?;
        Ok(self.nodes[i].ns())
    }

    /// The bridge device of node 1 in a `cni: bridge` lab.
    pub fn bridge_name(&self) -> &str {
        &self.nodes[0].bridge
    }
}
