//! The controller and enforcer processes: starting, health, restarts, and
//! waiting until the node has realized what the lab published.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use palisade_proto::v1::{GetControllerStateResponse, GetEnforcerStateResponse};
use tonic_health::pb::health_check_response::ServingStatus;

use super::Lab;
use crate::preflight::{CONTROLLER_BIN, ENFORCER_BIN};
use crate::process::{self, Daemon};
use crate::{grpc, realized};

pub(super) const POLL: Duration = Duration::from_millis(50);

impl Lab {
    pub(super) fn start_controller(&mut self) -> Result<()> {
        self.spawn_controller()?;
        self.wait_healthy(Role::Controller)
    }

    pub(super) fn spawn_controller(&mut self) -> Result<()> {
        if self.image.is_some() {
            let controller = self.spawn_controller_pod()?;
            self.record_pid(controller.pid())?;
            self.controller = Some(controller);
            self.down.remove(CONTROLLER_BIN);
            return Ok(());
        }
        let mut cmd = Command::new(self.config.bin_dir.join(CONTROLLER_BIN));
        // TCP on the fabric for the enforcers, as in a cluster; the unix
        // socket for the lab and for people with grpcurl.
        cmd.arg("--manifests")
            .arg(self.manifests.dir())
            .arg("--listen")
            .arg(self.controller_address())
            .arg("--listen")
            .arg(format!("unix:{}", self.controller_socket.display()))
            .args(&self.config.controller_args);
        self.otlp_args(&mut cmd);
        default_log_level(&mut cmd);
        let controller = Daemon::spawn(
            CONTROLLER_BIN,
            cmd,
            self.fabric.as_ref(),
            &self.log_dir.join("controller.log"),
        )?;
        self.record_pid(controller.pid())?;
        self.controller = Some(controller);
        self.down.remove(CONTROLLER_BIN);
        Ok(())
    }

    /// Starts node `i`'s enforcer and waits until it is healthy.
    pub(super) fn start_enforcer(&mut self, i: usize) -> Result<()> {
        let enforcer = if self.image.is_some() {
            self.spawn_enforcer_pod(i)?
        } else {
            let cmd = self.enforcer_command(i);
            let node = &self.nodes[i];
            Daemon::spawn(ENFORCER_BIN, cmd, node.ns.as_ref(), &node.enforcer_log)?
        };
        self.record_pid(enforcer.pid())?;
        self.nodes[i].enforcer = Some(enforcer);
        if i == 0 {
            self.down.remove(ENFORCER_BIN);
        }
        self.wait_healthy(Role::Enforcer(i))?;
        // Realization is only believed from this process: a report left by
        // a previous enforcer says nothing about the datapath now.
        let id = self
            .enforcer_state_of(i)?
            .state
            .map(|s| s.enforcer_id)
            .unwrap_or_default();
        self.nodes[i].enforcer_id = (!id.is_empty()).then_some(id);
        Ok(())
    }

    /// Node `i`'s enforcer command line; every enforcer of the node
    /// (restarts, a second one) gets the same. `--mode` and
    /// `--pod-up-deadline-ms` only when configured, so enforcers without
    /// those flags still run.
    pub(super) fn enforcer_command(&self, i: usize) -> Command {
        let node = &self.nodes[i];
        let mut cmd = Command::new(self.config.bin_dir.join(ENFORCER_BIN));
        cmd.arg("--node-name")
            .arg(&node.name)
            .arg("--controller")
            .arg(self.controller_address())
            .arg("--cni-socket")
            .arg(&node.enforcer_socket)
            .arg("--pin-root")
            .arg(&node.pin_root)
            // Kept across restart_enforcer, as a DaemonSet's hostPath would be.
            .arg("--state-dir")
            .arg(&node.state_dir);
        if let Some(mode) = self.config.mode {
            cmd.arg("--mode").arg(mode.as_str());
        }
        if let Some(secs) = self.config.conntrack_cleanup_secs {
            cmd.arg("--conntrack-cleanup-secs").arg(secs.to_string());
        }
        if let Some(deadline) = self.config.pod_up_deadline {
            cmd.arg("--pod-up-deadline-ms")
                .arg(deadline.as_millis().to_string());
        }
        self.otlp_args(&mut cmd);
        if let Some(mode) = self.config.flow_log {
            cmd.arg("--flow-log")
                .arg(mode.as_str())
                .arg("--flow-log-path")
                .arg(self.flow_log_path(i));
            if let Some(rate) = self.config.flow_log_rate {
                cmd.arg("--flow-log-rate").arg(rate.to_string());
            }
        }
        cmd.args(&self.config.enforcer_args);
        default_log_level(&mut cmd);
        cmd
    }

    /// Node 1's enforcer state dir.
    pub fn state_dir(&self) -> std::path::PathBuf {
        self.nodes[0].state_dir.clone()
    }

    /// Stops node 1's enforcer (SIGTERM) and starts a new one with the same
    /// pin root, as a DaemonSet rollout would; returns once it is healthy.
    /// Its output is appended to the same log. Follow with
    /// [`Lab::wait_realized`].
    pub fn restart_enforcer(&mut self) -> Result<()> {
        self.restart_enforcer_of(0)
    }

    pub(super) fn restart_enforcer_of(&mut self, i: usize) -> Result<()> {
        self.require_palisade()?;
        if let Some(mut old) = self.nodes[i].enforcer.take() {
            old.stop(self.config.stop_grace)?;
        }
        self.start_enforcer(i)
    }

    /// Stops the controller and starts a new one on the same manifests;
    /// returns once it is healthy. Follow with [`Lab::wait_realized`].
    pub fn restart_controller(&mut self) -> Result<()> {
        self.require_palisade()?;
        if let Some(mut old) = self.controller.take() {
            old.stop(self.config.stop_grace)?;
        }
        self.start_controller()
    }

    pub(super) fn require_palisade(&self) -> Result<()> {
        if !self.config.with_palisade {
            bail!("this lab runs without Palisade (with_palisade = false)");
        }
        Ok(())
    }

    pub fn controller_pid(&self) -> Option<u32> {
        self.controller.as_ref().map(Daemon::pid)
    }

    /// Node 1's enforcer.
    pub fn enforcer_pid(&self) -> Option<u32> {
        self.nodes[0].enforcer.as_ref().map(Daemon::pid)
    }

    pub fn controller_state(&self) -> Result<GetControllerStateResponse> {
        self.rt()
            .block_on(grpc::controller_state(&self.controller_socket))
    }

    /// Node 1's enforcer's dump.
    pub fn enforcer_state(&self) -> Result<GetEnforcerStateResponse> {
        self.enforcer_state_of(0)
    }

    pub(super) fn enforcer_state_of(&self, i: usize) -> Result<GetEnforcerStateResponse> {
        self.rt()
            .block_on(grpc::enforcer_state(&self.nodes[i].enforcer_socket))
    }

    /// The dump of node `name`'s enforcer.
    pub fn enforcer_state_on(&self, name: &str) -> Result<GetEnforcerStateResponse> {
        self.enforcer_state_of(self.node_index(name)?)
    }

    /// Waits until the last published revision is realized on every node:
    /// read by the controller, planned for the node, and reported realized
    /// by its enforcer.
    ///
    /// Refused while a fault has a process down or the manifests broken:
    /// nothing can be realized through a missing process, so waiting would
    /// only time out. Callers check [`Lab::can_realize`].
    pub fn wait_realized(&mut self) -> Result<()> {
        if !self.config.with_palisade {
            return Ok(());
        }
        if self.config.api.is_some() {
            bail!("cannot wait for realization: the controller watches the caller's API, not the lab's manifests");
        }
        if let Some(why) = self.why_not_realizable() {
            bail!("cannot wait for realization: {why}");
        }
        let revision = self.manifests.revision();
        let tolerated: Vec<String> = self.unplugged.keys().map(ToString::to_string).collect();
        let per_node: Vec<(String, Option<String>, Vec<String>)> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let pods = self
                    .pods
                    .iter()
                    .filter(|(name, p)| {
                        self.placement.get(*name) == Some(&i)
                            && p.attachment.is_some()
                            && !self.unplugged.contains_key(*name)
                    })
                    .map(|(name, _)| name.to_string())
                    .collect();
                (n.name.clone(), n.enforcer_id.clone(), pods)
            })
            .collect();
        let wants: Vec<realized::Expected> = per_node
            .iter()
            .map(|(node, enforcer_id, pods)| realized::Expected {
                node,
                revision,
                enforcer_id: enforcer_id.as_deref(),
                pods,
                tolerated: &tolerated,
            })
            .collect();
        let deadline = Instant::now() + self.config.realize_timeout;
        let mut last;
        let mut last_state = String::from("none");
        let mut last_node = self.nodes[0].name.clone();
        loop {
            self.config.cancel.check()?;
            self.check_processes()?;
            match self
                .rt()
                .block_on(grpc::controller_state(&self.controller_socket))
            {
                Ok(state) => match wants
                    .iter()
                    .map(|want| realized::check(&state, want).map_err(|r| (want.node, r)))
                    .collect::<Result<Vec<()>, _>>()
                {
                    Ok(_) => return Ok(()),
                    Err((node, reason)) => {
                        last = reason;
                        last_state = realized::describe(&state, node);
                        last_node = node.to_string();
                    }
                },
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() >= deadline {
                bail!(
                    "revision {revision} was not realized on node {last_node} within {:?}: {last}\n  last controller state: {last_state}",
                    self.config.realize_timeout
                );
            }
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
    }

    pub(super) fn check_processes(&mut self) -> Result<()> {
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
            d.check_running()?;
        }
        Ok(())
    }

    /// Whether the controller and every enforcer are running.
    pub fn processes_up(&self) -> bool {
        self.down.is_empty()
    }

    /// Whether [`Lab::wait_realized`] can succeed now.
    pub fn can_realize(&self) -> bool {
        self.why_not_realizable().is_none()
    }

    fn why_not_realizable(&self) -> Option<String> {
        if !self.down.is_empty() {
            let down: Vec<&str> = self.down.iter().copied().collect();
            return Some(format!("{} left down by a fault", down.join(" and ")));
        }
        if self.manifests_broken {
            return Some("the manifests are broken".into());
        }
        None
    }

    /// Waits until the controller reports a source error containing `want`
    /// (a manifest it refused): `Ok(Ok(error))` with the error, or
    /// `Ok(Err(why))` at the realize timeout, with what it reported.
    pub fn wait_source_error(&mut self, want: &str) -> Result<std::result::Result<String, String>> {
        let deadline = Instant::now() + self.config.realize_timeout;
        loop {
            self.config.cancel.check()?;
            self.check_processes()?;
            let last = match self
                .rt()
                .block_on(grpc::controller_state(&self.controller_socket))
            {
                Ok(state) => match state.errors.iter().find(|e| e.contains(want)) {
                    Some(e) => return Ok(Ok(e.clone())),
                    None => format!("the controller reports errors {:?}", state.errors),
                },
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                return Ok(Err(format!(
                    "no source error containing {want:?} within {:?}: {last}",
                    self.config.realize_timeout
                )));
            }
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
    }

    /// Waits until every enforcer's stream is connected to the controller
    /// and the enforcer has applied whatever the controller serves its node
    /// (the same plan version), or the controller serves no plan at all: used
    /// where realization cannot be awaited because the source is broken, so
    /// that probes see the outcome and not a race. Assumes an unsynced
    /// controller still accepts the stream (and sends nothing on it).
    pub fn wait_settled(&mut self) -> Result<()> {
        for i in 0..self.nodes.len() {
            self.wait_node_settled(i)?;
        }
        Ok(())
    }

    fn wait_node_settled(&mut self, i: usize) -> Result<()> {
        let deadline = Instant::now() + self.config.realize_timeout;
        let name = self.nodes[i].name.clone();
        let mut last;
        loop {
            self.config.cancel.check()?;
            self.check_processes()?;
            let controller = self
                .rt()
                .block_on(grpc::controller_state(&self.controller_socket));
            let enforcer = self.enforcer_state_of(i);
            match (controller, enforcer) {
                // A controller that has not synced its source serves no
                // plan to anyone (it refuses the stream): nothing will
                // change on the node until it does.
                (Ok(c), Ok(_)) if !c.source_synced => return Ok(()),
                (Ok(c), Ok(e)) => match realized::node_view(&c, &name) {
                    // Until the enforcer's stream reaches this controller,
                    // nothing it serves has had a chance to be applied.
                    None => last = format!("the controller has no view of node {name}"),
                    Some(v) if v.connected && v.plan_version == 0 => return Ok(()),
                    Some(v) if v.connected && e.plan_version == v.plan_version => return Ok(()),
                    Some(v) => {
                        last = format!(
                            "controller plan version {} (connected: {}), enforcer at {}",
                            v.plan_version, v.connected, e.plan_version
                        )
                    }
                },
                (Err(e), _) | (_, Err(e)) => last = format!("{e:#}"),
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {name} did not settle within {:?}: {last}",
                    self.config.realize_timeout
                );
            }
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
    }

    fn wait_healthy(&mut self, role: Role) -> Result<()> {
        self.wait_health(role, true)
    }

    /// Until the process answers health at all: an unsynced controller may
    /// rightly say NOT_SERVING.
    pub(super) fn wait_answering(&mut self, role: Role) -> Result<()> {
        self.wait_health(role, false)
    }

    fn wait_health(&mut self, role: Role, serving: bool) -> Result<()> {
        if self.image.is_some() {
            // The pod's own probes, as the kubelet would run them.
            return self.wait_probe(role, serving);
        }
        let timeout = self.config.start_timeout;
        let socket = match role {
            Role::Controller => self.controller_socket.clone(),
            Role::Enforcer(i) => self.nodes[i].enforcer_socket.clone(),
        };
        let deadline = Instant::now() + timeout;
        let mut last = String::from("the socket does not exist yet");
        loop {
            self.config.cancel.check()?;
            self.check_processes()?;
            if socket.exists() {
                match self.rt().block_on(grpc::health(&socket)) {
                    Ok(ServingStatus::Serving) => return Ok(()),
                    Ok(_) if !serving => return Ok(()),
                    Ok(status) => last = format!("health status {status:?}"),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if Instant::now() >= deadline {
                let daemon = match role {
                    Role::Controller => self.controller.as_ref(),
                    Role::Enforcer(i) => self.nodes[i].enforcer.as_ref(),
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
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Role {
    Controller,
    /// Node `i`'s enforcer.
    Enforcer(usize),
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Controller => CONTROLLER_BIN,
            Role::Enforcer(_) => ENFORCER_BIN,
        }
    }
}

fn default_log_level(cmd: &mut Command) {
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
}
