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

const POLL: Duration = Duration::from_millis(50);

impl Lab {
    pub(super) fn start_controller(&mut self) -> Result<()> {
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
        self.record_pid(controller.pid())?;
        self.controller = Some(controller);
        self.wait_healthy(Role::Controller)
    }

    pub(super) fn start_enforcer(&mut self) -> Result<()> {
        let mut cmd = Command::new(self.config.bin_dir.join(ENFORCER_BIN));
        cmd.arg("--node-name")
            .arg(&self.node_name)
            .arg("--controller")
            .arg(format!("unix:{}", self.controller_socket.display()))
            .arg("--cni-socket")
            .arg(&self.enforcer_socket)
            .arg("--pin-root")
            .arg(&self.pin_root)
            // Kept across restart_enforcer, as a DaemonSet's hostPath would be.
            .arg("--state-dir")
            .arg(self.run_dir.join("enforcer-state"));
        default_log_level(&mut cmd);
        let enforcer = Daemon::spawn(
            ENFORCER_BIN,
            cmd,
            self.node_ns.as_ref(),
            &self.log_dir.join("enforcer.log"),
        )?;
        self.record_pid(enforcer.pid())?;
        self.enforcer = Some(enforcer);
        self.wait_healthy(Role::Enforcer)?;
        // Realization is only believed from this process: a report left by
        // a previous enforcer says nothing about the datapath now.
        let id = self
            .enforcer_state()?
            .state
            .map(|s| s.enforcer_id)
            .unwrap_or_default();
        self.enforcer_id = (!id.is_empty()).then_some(id);
        Ok(())
    }

    /// Stops the enforcer (SIGTERM) and starts a new one with the same pin
    /// root, as a DaemonSet rollout would; returns once it is healthy. Its
    /// output is appended to the same log. Follow with [`Lab::wait_realized`].
    pub fn restart_enforcer(&mut self) -> Result<()> {
        self.require_palisade()?;
        if let Some(mut old) = self.enforcer.take() {
            old.stop(self.config.stop_grace)?;
        }
        self.start_enforcer()
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

    fn require_palisade(&self) -> Result<()> {
        if !self.config.with_palisade {
            bail!("this lab runs without Palisade (with_palisade = false)");
        }
        Ok(())
    }

    pub fn controller_pid(&self) -> Option<u32> {
        self.controller.as_ref().map(Daemon::pid)
    }

    pub fn enforcer_pid(&self) -> Option<u32> {
        self.enforcer.as_ref().map(Daemon::pid)
    }

    pub fn controller_state(&self) -> Result<GetControllerStateResponse> {
        self.rt()
            .block_on(grpc::controller_state(&self.controller_socket))
    }

    pub fn enforcer_state(&self) -> Result<GetEnforcerStateResponse> {
        self.rt()
            .block_on(grpc::enforcer_state(&self.enforcer_socket))
    }

    /// Waits until the last published revision is realized on the node:
    /// read by the controller, planned for the node, and reported realized
    /// by the enforcer.
    pub fn wait_realized(&mut self) -> Result<()> {
        if !self.config.with_palisade {
            return Ok(());
        }
        let revision = self.manifests.revision();
        let pods: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.attachment.is_some())
            .map(|(name, _)| name.to_string())
            .collect();
        let (node, enforcer_id) = (self.node_name.clone(), self.enforcer_id.clone());
        let want = realized::Expected {
            node: &node,
            revision,
            enforcer_id: enforcer_id.as_deref(),
            pods: &pods,
        };
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
                Ok(state) => match realized::check(&state, &want) {
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
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
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
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
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

fn default_log_level(cmd: &mut Command) {
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
}
