//! Runs the pods of a rendered chart the way a kubelet would, on podman:
//! [`spec`] reads a pod template strictly (an unknown field is an error, so
//! a chart change cannot be silently skipped), [`run`] says what each field
//! becomes, [`podman`] runs it, and [`Pod`] keeps one pod's init containers,
//! containers and probes together.

pub mod podman;
pub mod run;
pub mod spec;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use serde_json::Value;

use crate::cancel::Cancel;
use crate::process::{self, Daemon};
pub use run::{ImageConfig, Node, Overlay, PodRun, Rlimits, RunError, CLUSTER_DOMAIN};
pub use spec::{parse_template, PodTemplate, Probe, ProbeAction, Seccomp, SpecError};

/// podman's own overhead for a `podman exec` (a runc exec), on top of the
/// probe's timeoutSeconds, which the kubelet counts from inside the runtime.
const EXEC_OVERHEAD: Duration = Duration::from_secs(10);
/// How long an init container may run.
const INIT_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

/// The pod template of the rendered object `kind`/`name` (a DaemonSet's or
/// a Deployment's `spec.template`).
pub fn template_of(objects: &[Value], kind: &str) -> Result<(String, PodTemplate)> {
    let object = objects
        .iter()
        .find(|o| o["kind"] == kind)
        .ok_or_else(|| anyhow!("the chart rendered no {kind}"))?;
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let at = format!("{kind} {name} .spec.template");
    let template = parse_template(&object["spec"]["template"], &at)?;
    Ok((name, template))
}

/// One pod on one node: its template, where it runs, and its containers'
/// start count (a restart is a new container of the same pod).
pub struct Pod {
    pub template: PodTemplate,
    pub run: PodRun,
    /// Prefix of every container's podman name.
    prefix: String,
    images: BTreeMap<String, ImageConfig>,
    starts: u32,
    /// Where pid files go.
    state_dir: PathBuf,
}

/// Which probe to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Readiness,
    Liveness,
}

impl Pod {
    /// Checks that the pod fits its node, makes its hostPath directories
    /// (DirectoryOrCreate) or checks them (Directory), writes its secret and
    /// configMap volumes from the rendered `objects` under `state_dir`, and
    /// reads its images' configs.
    pub fn new(
        template: PodTemplate,
        mut run: PodRun,
        objects: &[Value],
        prefix: &str,
        state_dir: &Path,
    ) -> Result<Pod> {
        let what = format!("pod {}/{}", run.namespace, run.name);
        run.check_node(&template)
            .map_err(|e| anyhow!("{what}: {e}"))?;
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        for v in &template.volumes {
            match &v.source {
                spec::VolumeSource::HostPath { path, kind } => {
                    host_path(path, *kind).with_context(|| format!("{what}: volume {}", v.name))?
                }
                spec::VolumeSource::EmptyDir => {
                    // Empty for each pod made, as the kubelet's.
                    let dir = state_dir.join("volumes").join(&v.name);
                    match std::fs::remove_dir_all(&dir) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(e).with_context(|| format!("emptying {}", dir.display()))
                        }
                        _ => {}
                    }
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    run.volume_dirs.insert(v.name.clone(), dir);
                }
                spec::VolumeSource::Secret { name } => {
                    let files = secret_files(objects, name)
                        .with_context(|| format!("{what}: volume {}", v.name))?;
                    let dir = state_dir.join("volumes").join(&v.name);
                    write_files(&dir, &files)?;
                    run.volume_dirs.insert(v.name.clone(), dir);
                }
                spec::VolumeSource::ConfigMap { name } => {
                    let files = config_map_files(objects, name)
                        .with_context(|| format!("{what}: volume {}", v.name))?;
                    let dir = state_dir.join("volumes").join(&v.name);
                    write_files(&dir, &files)?;
                    run.volume_dirs.insert(v.name.clone(), dir);
                }
            }
        }
        let mut images = BTreeMap::new();
        for c in template.init_containers.iter().chain(&template.containers) {
            if !images.contains_key(&c.image) {
                images.insert(c.image.clone(), podman::image_config(&c.image)?);
            }
        }
        Ok(Pod {
            template,
            run,
            prefix: prefix.to_string(),
            images,
            starts: 0,
            state_dir: state_dir.to_path_buf(),
        })
    }

    fn container_spec(&self, name: &str) -> Result<&spec::Container> {
        self.template
            .containers
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| anyhow!("pod {} has no container {name}", self.run.name))
    }

    /// The podman arguments of a container (for tests and for the log).
    pub fn args_for(&self, container: &spec::Container, name: &str) -> Result<Vec<String>> {
        let image = &self.images[&container.image];
        if let Some(profile) = self.run.seccomp_file(&self.template, container) {
            // The kubelet's CreateContainerError when the file is missing.
            if !profile.is_file() {
                bail!(
                    "pod {}, container {}: seccomp profile {} does not exist on node {}",
                    self.run.name,
                    container.name,
                    profile.display(),
                    self.run.node.name
                );
            }
        }
        Ok(self.run.args(&self.template, container, image, name)?)
    }

    /// Runs every init container in order, each to a zero exit; their
    /// output is appended to `log`. A failure is an error with that output
    /// (a kubelet would retry with back-off; a test wants to know).
    pub fn run_init_containers(&mut self, log: &Path, cancel: &Cancel) -> Result<()> {
        for c in self.template.init_containers.clone() {
            self.starts += 1;
            let name = format!("{}-{}-{}", self.prefix, c.name, self.starts);
            let args = self.args_for(&c, &name)?;
            let done = podman::run_to_completion(&args, INIT_TIMEOUT, cancel)?;
            let mut text = String::from_utf8_lossy(&done.stdout).into_owned();
            text += &String::from_utf8_lossy(&done.stderr);
            append(log, &format!("--- init container {}\n{text}", c.name))?;
            if !done.status.success() {
                bail!(
                    "pod {}: init container {} exited {}:\n{}",
                    self.run.name,
                    c.name,
                    done.status,
                    text.trim_end()
                );
            }
        }
        Ok(())
    }

    /// Starts container `container` (a new one each time: a restart of the
    /// same pod runs no init container), output to `log`, and returns once
    /// its process runs.
    pub fn start(
        &mut self,
        container: &str,
        label: &str,
        log: &Path,
        timeout: Duration,
    ) -> Result<Daemon> {
        let c = self.container_spec(container)?.clone();
        self.starts += 1;
        let name = format!("{}-{}-{}", self.prefix, c.name, self.starts);
        let args = self.args_for(&c, &name)?;
        append(log, &format!("--- podman run {}\n", args.join(" ")))?;
        let pidfile = self.state_dir.join(format!("{name}.pid"));
        Daemon::spawn_container(label, &name, &args, log, &pidfile, timeout)
    }

    /// Starts every regular container but `main` (the kubelet starts all
    /// of a pod's containers; a sidecar such as the enforcer pod's
    /// cni-watch runs beside the one the lab waits on), each with its own
    /// log beside `log` (`enforcer.log`: `enforcer.cni-watch.log`); each
    /// with its container's name.
    pub fn start_others(
        &mut self,
        main: &str,
        log: &Path,
        timeout: Duration,
    ) -> Result<Vec<(String, Daemon)>> {
        let others: Vec<String> = self
            .template
            .containers
            .iter()
            .filter(|c| c.name != main)
            .map(|c| c.name.clone())
            .collect();
        let mut started = Vec::new();
        for name in others {
            let stem = log.file_stem().unwrap_or_default().to_string_lossy();
            let own_log = log.with_file_name(format!("{stem}.{name}.log"));
            let label = format!("{} container {name}", self.run.name);
            let daemon = self.start(&name, &label, &own_log, timeout)?;
            started.push((name, daemon));
        }
        Ok(started)
    }

    /// Runs one probe of `container` against the running `daemon` once:
    /// Ok(true) when it passes.
    pub async fn probe_once(
        &self,
        container: &str,
        kind: ProbeKind,
        daemon: &Daemon,
    ) -> Result<bool> {
        let c = self.container_spec(container)?;
        let probe = match kind {
            ProbeKind::Readiness => c.readiness.as_ref(),
            ProbeKind::Liveness => c.liveness.as_ref(),
        }
        .ok_or_else(|| anyhow!("container {container} has no {kind:?} probe"))?;
        let name = daemon
            .container()
            .ok_or_else(|| anyhow!("{} is not a container", daemon.name()))?
            .to_string();
        match &probe.action {
            ProbeAction::Exec(command) => {
                let command = command.clone();
                let timeout = probe.timeout + EXEC_OVERHEAD;
                let done = tokio::task::spawn_blocking(move || {
                    podman::exec(&name, &command, timeout, &Cancel::new())
                })
                .await?;
                // The kubelet counts a probe that times out or cannot be
                // run as failed, and probes again: a loaded node's slow
                // `podman exec` is a failed probe, not a broken pod.
                match done {
                    Ok(done) => Ok(done.status.success()),
                    Err(e) => {
                        append(
                            daemon.log_path(),
                            &format!("--- {kind:?} probe failed to run: {e:#}\n"),
                        )?;
                        Ok(false)
                    }
                }
            }
            ProbeAction::Grpc { port, service } => {
                let netns = self
                    .run
                    .netns(&self.template)
                    .ok_or_else(|| anyhow!("pod {} has no network namespace", self.run.name))?
                    .to_path_buf();
                // The kubelet dials the pod's address; the pod listens on
                // all of its addresses, loopback included.
                let addr = SocketAddr::from(([127, 0, 0, 1], *port));
                let status = crate::grpc::health_in(&netns, addr, service, probe.timeout).await;
                Ok(matches!(
                    status,
                    Ok(tonic_health::pb::health_check_response::ServingStatus::Serving)
                ))
            }
        }
    }
}

/// The kubelet's hostPath checks, on this machine's filesystem.
fn host_path(path: &str, kind: spec::HostPathType) -> Result<()> {
    let p = Path::new(path);
    match kind {
        spec::HostPathType::Unchecked => Ok(()),
        spec::HostPathType::Directory if p.is_dir() => Ok(()),
        spec::HostPathType::Directory => {
            bail!("hostPath type check failed: {path} is not a directory")
        }
        spec::HostPathType::DirectoryOrCreate => {
            if !p.is_dir() {
                std::fs::create_dir_all(p).with_context(|| format!("creating hostPath {path}"))?;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))?;
            }
            Ok(())
        }
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .ok_or_else(|| {
            anyhow!("the chart rendered no {kind} {name:?} (and none exists on a fresh cluster)")
        })
}

fn secret_files(objects: &[Value], name: &str) -> Result<BTreeMap<String, Vec<u8>>> {
    let secret = find(objects, "Secret", name)?;
    let mut files = BTreeMap::new();
    for (key, value) in secret["data"].as_object().into_iter().flatten() {
        let text = value
            .as_str()
            .ok_or_else(|| anyhow!("Secret {name} data.{key} is not a string"))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .with_context(|| format!("Secret {name} data.{key} is not base64"))?;
        files.insert(key.clone(), bytes);
    }
    for (key, value) in secret["stringData"].as_object().into_iter().flatten() {
        files.insert(
            key.clone(),
            value.as_str().unwrap_or_default().as_bytes().to_vec(),
        );
    }
    Ok(files)
}

fn config_map_files(objects: &[Value], name: &str) -> Result<BTreeMap<String, Vec<u8>>> {
    let cm = find(objects, "ConfigMap", name)?;
    let mut files = BTreeMap::new();
    for (key, value) in cm["data"].as_object().into_iter().flatten() {
        let text = value
            .as_str()
            .ok_or_else(|| anyhow!("ConfigMap {name} data.{key} is not a string"))?;
        files.insert(key.clone(), text.as_bytes().to_vec());
    }
    Ok(files)
}

fn write_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, bytes) in files {
        if name.contains('/') || name.starts_with('.') {
            bail!("volume file name {name:?} is not a plain file name");
        }
        let path = dir.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        // The API's defaultMode.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

fn append(log: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", log.display()))
}

/// Runs `probe` of `container` every `poll` until it passes, the process
/// exits, or `timeout` passes (then the error holds the log's end).
pub fn wait_probe(
    rt: &tokio::runtime::Runtime,
    pod: &Pod,
    container: &str,
    kind: ProbeKind,
    daemon: &mut Daemon,
    timeout: Duration,
    cancel: &Cancel,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        cancel.check()?;
        daemon.check_running()?;
        if rt.block_on(pod.probe_once(container, kind, daemon))? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the {kind:?} probe of container {container} of pod {} did not pass within {timeout:?}; last lines of {}:\n{}",
                pod.run.name,
                daemon.log_path().display(),
                process::tail(daemon.log_path(), 30)
            );
        }
        std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
    }
}
