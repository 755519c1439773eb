//! A rolling upgrade of one node's enforcer (`--node-processes image`), as
//! the DaemonSet's `maxSurge: 1` rollout does it: a pod of the new image
//! starts beside the old one (its init containers run, its enforcer waits
//! on the node lock); the old pod is deleted (SIGTERM, the pod's grace
//! period); the new enforcer takes the node over. A rollback is the same
//! with the images swapped.
//!
//! The steps are separate calls so that a test can act between them: start
//! pods while no enforcer serves, keep traffic flowing throughout.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tonic_health::pb::health_check_response::ServingStatus;

use super::image::{self, ENFORCER_CONTAINER};
use super::Lab;
use crate::chart;
use crate::grpc;
use crate::process;

/// The DaemonSet pod of the new image, waiting on the node lock.
pub struct Surge {
    node: usize,
    from: String,
    image: String,
    rendered: Vec<serde_json::Value>,
}

/// The old pod deleted; the new enforcer taking over.
pub struct Retiring {
    node: usize,
    from: String,
    image: String,
    rendered: Vec<serde_json::Value>,
    /// When the old enforcer got SIGTERM.
    stopped_at: Instant,
    old_exited_after: Duration,
    old_exit_code: Option<i32>,
    /// Says when the new enforcer first answered SERVING on the socket.
    watcher: std::thread::JoinHandle<Result<Instant>>,
}

/// What one handover measured.
#[derive(Debug, Clone)]
pub struct Handover {
    pub from: String,
    pub to: String,
    /// From the old enforcer's SIGTERM to the new one answering SERVING.
    pub took: Duration,
    /// From the SIGTERM to the old container's exit.
    pub old_exited_after: Duration,
    /// The old container's exit code (0: it stopped cleanly).
    pub old_exit_code: Option<i32>,
}

/// How often the watcher asks the socket for health: fine enough to time a
/// handover to about this.
const WATCH_EVERY: Duration = Duration::from_millis(10);

impl Lab {
    /// The image node `i`'s enforcer runs (image mode).
    pub fn enforcer_image(&self, i: usize) -> Result<String> {
        let pod = self.nodes[i]
            .pod
            .as_ref()
            .ok_or_else(|| anyhow!("node {} runs no enforcer pod", self.nodes[i].name))?;
        pod.template
            .containers
            .iter()
            .find(|c| c.name == ENFORCER_CONTAINER)
            .map(|c| c.image.clone())
            .ok_or_else(|| anyhow!("the enforcer pod has no container {ENFORCER_CONTAINER}"))
    }

    /// Starts the surge pod of `image` on node `i`: the chart rendered for
    /// that image (as `helm upgrade --set image.tag=...` would), its init
    /// containers (palisade-cni and the seccomp profile of the new image
    /// installed on the node), its enforcer; returns once that enforcer
    /// says it waits for the node lock, the old one still serving.
    pub fn surge_enforcer(&mut self, i: usize, image: &str) -> Result<Surge> {
        self.surge_enforcer_with(i, image, serde_json::Value::Null)
    }

    /// [`Lab::surge_enforcer`] with chart values of its own over the
    /// lab's (`helm upgrade --set ...` that came with the new image). If
    /// its enforcer exits instead of waiting, the error says why; the pod
    /// stays until [`Lab::abandon_surge`].
    pub fn surge_enforcer_with(
        &mut self,
        i: usize,
        image: &str,
        values: serde_json::Value,
    ) -> Result<Surge> {
        let state = self
            .image()
            .ok_or_else(|| anyhow!("an upgrade needs --node-processes image"))?;
        if self.nodes[i].second_enforcer.is_some() {
            bail!("node {} already has a second enforcer", self.nodes[i].name);
        }
        let old_id = self.nodes[i].enforcer_id.clone();
        let from = self.enforcer_image(i)?;
        let mut run = state.run.clone();
        run.image = image.to_string();
        let root = self.nodes[i]
            .root
            .as_ref()
            .expect("image mode nodes have a root");
        let values = image::values(&self.config, &run, root).map(|mut v| {
            if !values.is_null() {
                image::merge(&mut v, values);
            }
            v
        })?;
        let rendered = chart::render(&run.chart, &values, &self.run_dir)
            .with_context(|| format!("rendering the chart for {image}"))?;
        self.nodes[i].rollouts += 1;
        let suffix = format!("-r{}", self.nodes[i].rollouts);
        let mut pod = self.new_enforcer_pod_from(i, &suffix, &rendered)?;
        let log = self.nodes[i].second_log.clone();
        // Only what this pod writes counts (the log may hold an earlier
        // rollout's lines).
        let from_byte = std::fs::metadata(&log)
            .map(|m| m.len() as usize)
            .unwrap_or(0);
        let daemon = pod.start(
            ENFORCER_CONTAINER,
            "surge palisade-enforcer",
            &log,
            self.config.start_timeout,
        )?;
        self.record_pid(daemon.pid())?;
        self.nodes[i].second_enforcer = Some(daemon);
        self.nodes[i].second_pod = Some(pod);
        let sidecars = self.start_sidecars(i, true, &log)?;
        self.nodes[i].second_sidecars = sidecars;
        let deadline = Instant::now() + self.config.start_timeout;
        loop {
            self.config.cancel.check()?;
            let second = self.nodes[i].second_enforcer.as_mut().expect("set above");
            second.check_running()?;
            let text = std::fs::read(&log).unwrap_or_default();
            let text = String::from_utf8_lossy(text.get(from_byte..).unwrap_or_default());
            if text.contains("waiting for it to exit") {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "the surge enforcer did not say it waits for the node lock within {:?}:\n{}",
                    self.config.start_timeout,
                    process::tail(&log, 20)
                );
            }
            std::thread::sleep(super::processes::POLL); // poll: inside a loop bounded by a deadline
        }
        let answering = self.answering_enforcer_id_of(i);
        if answering != old_id {
            bail!(
                "while the surge enforcer waits, the node's socket is answered by {answering:?}, not the old enforcer {old_id:?}"
            );
        }
        // The DaemonSet deletes the old pod only once this one is Ready:
        // its readiness probe, as the chart sets it (the old enforcer's
        // socket, and this pod's own programs loaded).
        let n = &mut self.nodes[i];
        crate::kubelet::wait_probe(
            self.rt.as_ref().expect("the runtime lives until cleanup"),
            n.second_pod.as_ref().expect("set above"),
            ENFORCER_CONTAINER,
            crate::kubelet::ProbeKind::Readiness,
            n.second_enforcer.as_mut().expect("set above"),
            self.config.start_timeout,
            &self.config.cancel,
        )
        .context("the surge pod's readiness probe")?;
        Ok(Surge {
            node: i,
            from,
            image: image.to_string(),
            rendered,
        })
    }

    /// The directory of node `i`'s surge pod's volume `name` (an emptyDir
    /// or a file volume), while that pod exists.
    pub fn surge_volume(&self, i: usize, name: &str) -> Option<PathBuf> {
        self.nodes[i]
            .second_pod
            .as_ref()
            .and_then(|p| p.run.volume_dirs.get(name).cloned())
    }

    /// Deletes the surge pod of node `i` whose enforcer did not take the
    /// node over (as an operator rolling back a rollout that stalled): its
    /// containers are stopped, and the node stays the old pod's.
    pub fn abandon_surge(&mut self, i: usize) -> Result<()> {
        let grace = self.config.stop_grace;
        let n = &mut self.nodes[i];
        if let Some(mut second) = n.second_enforcer.take() {
            second.stop(grace).context("stopping the surge enforcer")?;
        }
        for (name, mut d) in std::mem::take(&mut n.second_sidecars) {
            d.stop(grace)
                .with_context(|| format!("stopping the surge pod's {name}"))?;
        }
        n.second_pod = None;
        Ok(())
    }

    /// Deletes the old pod (SIGTERM to its enforcer, SIGKILL after the
    /// pod's grace period, as the kubelet does) and returns once it has
    /// exited. From here the surge pod is the node's: pods can be started
    /// while it takes over. Follow with [`Lab::finish_handover`].
    pub fn retire_enforcer(&mut self, surge: Surge) -> Result<Retiring> {
        let i = surge.node;
        let grace = self.nodes[i]
            .pod
            .as_ref()
            .map(|p| p.template.termination_grace)
            .ok_or_else(|| anyhow!("node {} runs no enforcer pod", self.nodes[i].name))?;
        let mut old = self.nodes[i]
            .enforcer
            .take()
            .ok_or_else(|| anyhow!("node {} has no enforcer to retire", self.nodes[i].name))?;
        let stopped_at = Instant::now();
        let stopped = old.stop(grace);
        let old_exited_after = stopped_at.elapsed();
        let old_exit_code = old.exit_status().and_then(|s| s.code());
        stopped.context("stopping the old enforcer")?;
        // The socket is the new enforcer's alone from here.
        let socket = self.nodes[i].enforcer_socket.clone();
        let deadline = stopped_at + self.config.start_timeout;
        let watcher = std::thread::spawn(move || watch_serving(socket, deadline));
        // The rest of the old pod goes too.
        let n = &mut self.nodes[i];
        for (name, mut old) in std::mem::take(&mut n.sidecars) {
            old.stop(grace)
                .with_context(|| format!("stopping the old pod's {name}"))?;
        }
        n.sidecars = std::mem::take(&mut n.second_sidecars);
        n.enforcer = n.second_enforcer.take();
        n.pod = n.second_pod.take();
        // The node's enforcer log is the new one's; the next surge writes
        // to the other.
        std::mem::swap(&mut n.enforcer_log, &mut n.second_log);
        n.enforcer_id = None;
        Ok(Retiring {
            node: i,
            from: surge.from,
            image: surge.image,
            rendered: surge.rendered,
            stopped_at,
            old_exited_after,
            old_exit_code,
            watcher,
        })
    }

    /// Waits for the new enforcer to serve (the watcher's first SERVING,
    /// then its pod's readiness probe, as the kubelet decides) and returns
    /// the handover's figures.
    pub fn finish_handover(&mut self, retiring: Retiring) -> Result<Handover> {
        let i = retiring.node;
        let served = retiring
            .watcher
            .join()
            .map_err(|_| anyhow!("the handover watcher panicked"))?
            .with_context(|| {
                format!(
                    "the new enforcer of {}; its log:\n{}",
                    self.nodes[i].name,
                    process::tail(&self.nodes[i].enforcer_log, 30)
                )
            })?;
        self.image.as_mut().expect("image mode").rendered[i] = retiring.rendered;
        self.wait_probe(super::processes::Role::Enforcer(i), true)?;
        let id = self
            .enforcer_state_of(i)?
            .state
            .map(|s| s.enforcer_id)
            .unwrap_or_default();
        self.nodes[i].enforcer_id = (!id.is_empty()).then_some(id);
        Ok(Handover {
            from: retiring.from,
            to: retiring.image,
            took: served.duration_since(retiring.stopped_at),
            old_exited_after: retiring.old_exited_after,
            old_exit_code: retiring.old_exit_code,
        })
    }

    /// The id of the enforcer answering node `i`'s socket now, if any.
    pub(super) fn answering_enforcer_id_of(&self, i: usize) -> Option<String> {
        self.enforcer_state_of(i)
            .ok()
            .and_then(|s| s.state)
            .map(|s| s.enforcer_id)
    }
}

/// Asks `socket` for health every [`WATCH_EVERY`] until it says SERVING
/// (then the instant it did), or fails at `deadline` with the last answer.
fn watch_serving(socket: PathBuf, deadline: Instant) -> Result<Instant> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut last = String::from("the socket does not exist yet");
    loop {
        if socket.exists() {
            match rt.block_on(grpc::health(&socket)) {
                Ok(ServingStatus::Serving) => return Ok(Instant::now()),
                Ok(status) => last = format!("health status {status:?}"),
                Err(e) => last = format!("{e:#}"),
            }
        }
        if Instant::now() >= deadline {
            bail!("did not serve on {} in time: {last}", socket.display());
        }
        std::thread::sleep(WATCH_EVERY); // poll: inside a loop bounded by a deadline
    }
}
