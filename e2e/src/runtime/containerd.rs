//! One containerd per lab node, with its own root, state dir and socket
//! under the lab's run dir, started inside the node's network namespace so
//! that the CNI plugins it runs (its CRI plugin calls them with the pod's
//! real CNI_ARGS and the netns it made) leave the host side of each pod's
//! veth in the node, as on a real node.
//!
//! Nothing is pulled: the sandbox image is built here ([`super::image`])
//! and imported with `ctr` before the first pod, and the CRI plugin is told
//! to use it. The lab then starts pods as the kubelet does, over CRI.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use tokio::runtime::Handle;

use super::cri::{self, pb, CriClient, SandboxInfo};
use super::image::{self, PAUSE_IMAGE};
use crate::cancel::Cancel;
use crate::cni::{CNI_VERSION, NETWORK_NAME};
use crate::netns::NetNs;
use crate::process::{self, Daemon};

/// The namespace of containerd's store the CRI plugin uses.
pub const CRI_NAMESPACE: &str = "k8s.io";
pub const CONTAINERD_BIN: &str = "containerd";
pub const CTR_BIN: &str = "ctr";
/// The snapshotter the CRI plugin unpacks into; `ctr import` must use the
/// same one, or the image is not ready for sandboxes.
const SNAPSHOTTER: &str = "overlayfs";
/// The CNI plugins the lab's chains can name, from the CNI bin dir; the
/// CRI plugin also runs `loopback` for every sandbox's `lo`.
const STANDARD_PLUGINS: &[&str] = &["ptp", "bridge", "host-local", "loopback"];
const POLL: Duration = Duration::from_millis(50);

/// Where one containerd keeps everything, all under `dir`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.dir.join("cni-bin")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni-conf")
    }
}

/// containerd's configuration (version 2): every path under the layout,
/// the CRI plugin on the lab's CNI dirs and the lab's sandbox image.
pub fn config_toml(layout: &Layout) -> String {
    let d = |p: PathBuf| toml_string(&p.display().to_string());
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"# Written by palisade-lab for one lab node; everything under {dir}.
version = 2
root = {root}
state = {state}
# Snapshotters the lab does not use.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

# Unused (sandboxes run on the v2 shim), but the tasks service of 1.6 needs
# it loaded; its runc root is kept under the lab too.
[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = {runc_v1_root}

[{cri}]
  sandbox_image = {image}
  # Root here lacks CAP_SYS_RESOURCE: the kubelet's -998 for the sandbox
  # would make runc fail; containerd caps it at its own score instead.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [{cri}.containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        Root = {runc_root}
        SystemdCgroup = false

  [{cri}.cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1

  [{cri}.registry]
    config_path = {certs}
"#,
        dir = layout.dir.display(),
        root = d(layout.root()),
        state = d(layout.state()),
        socket = d(layout.socket()),
        ttrpc = d(layout.dir.join("containerd.sock.ttrpc")),
        opt = d(layout.dir.join("opt")),
        image = toml_string(PAUSE_IMAGE),
        snapshotter = SNAPSHOTTER,
        runc_root = d(layout.dir.join("runc")),
        runc_v1_root = d(layout.dir.join("runc-v1")),
        cni_bin = d(layout.cni_bin_dir()),
        cni_conf = d(layout.cni_conf_dir()),
        certs = d(layout.dir.join("certs.d")),
    )
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The network list the CRI plugin loads: the lab's chain, named as the
/// lab's own runs name it.
pub fn conflist(plugins: &[Value]) -> Value {
    json!({"cniVersion": CNI_VERSION, "name": NETWORK_NAME, "plugins": plugins})
}

/// What a lab node's containerd is started with.
pub struct Settings<'a> {
    pub layout: Layout,
    /// The CNI chain (ptp or bridge, then palisade-cni).
    pub plugins: &'a [Value],
    /// Where the standard plugins are.
    pub cni_bin_dir: &'a Path,
    /// Where palisade-cni is; None: a chain without it.
    pub palisade_cni: Option<PathBuf>,
    pub log: PathBuf,
    pub start_timeout: Duration,
    /// Bounds each CRI call (a RunPodSandbox runs the whole CNI ADD).
    pub call_timeout: Duration,
}

pub struct Containerd {
    daemon: Daemon,
    client: CriClient,
    handle: Handle,
    layout: Layout,
}

/// A sandbox the runtime refused, with the runtime's reason.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A CNI plugin failed its ADD: the runtime tore the sandbox down (DEL
    /// of the chain), as it must.
    #[error("{plugin} {command} failed (containerd RunPodSandbox of pod {pod}): {message}")]
    Cni {
        pod: String,
        plugin: String,
        command: String,
        message: String,
    },
    #[error("containerd RunPodSandbox of pod {pod} failed: {message}")]
    Runtime { pod: String, message: String },
}

impl Containerd {
    /// Lays out the dirs, writes the config and the CNI network, starts
    /// containerd in `node` and waits until its CRI answers and holds the
    /// sandbox image.
    pub fn start(
        s: Settings,
        node: &NetNs,
        handle: &Handle,
        cancel: &Cancel,
    ) -> Result<Containerd> {
        let layout = s.layout.clone();
        for dir in [layout.cni_bin_dir(), layout.cni_conf_dir()] {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        for name in STANDARD_PLUGINS {
            link(&s.cni_bin_dir.join(name), &layout.cni_bin_dir().join(name))?;
        }
        if let Some(p) = &s.palisade_cni {
            link(p, &layout.cni_bin_dir().join("palisade-cni"))?;
        }
        let conf = layout
            .cni_conf_dir()
            .join(format!("10-{NETWORK_NAME}.conflist"));
        std::fs::write(&conf, serde_json::to_vec_pretty(&conflist(s.plugins))?)
            .with_context(|| format!("writing {}", conf.display()))?;
        std::fs::write(layout.config(), config_toml(&layout))
            .with_context(|| format!("writing {}", layout.config().display()))?;

        let mut cmd = Command::new(CONTAINERD_BIN);
        cmd.arg("--config").arg(layout.config());
        // The shim and runc are found on PATH.
        cmd.env("PATH", with_sbin(std::env::var_os("PATH")));
        let mut daemon = Daemon::spawn("containerd", cmd, Some(node), &s.log)?;
        let client = match wait_ready(&mut daemon, &layout, handle, &s, cancel) {
            Ok(c) => c,
            Err(e) => {
                let _ = daemon.stop(Duration::from_secs(5));
                return Err(e);
            }
        };
        let me = Containerd {
            daemon,
            client,
            handle: handle.clone(),
            layout,
        };
        if let Err(e) = me.import_pause_image(s.start_timeout, cancel) {
            let mut me = me;
            let _ = me.daemon.stop(Duration::from_secs(5));
            return Err(e);
        }
        Ok(me)
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    pub fn socket(&self) -> PathBuf {
        self.layout.socket()
    }

    pub fn log_path(&self) -> &Path {
        self.daemon.log_path()
    }

    pub fn client(&self) -> &CriClient {
        &self.client
    }

    pub fn check_running(&mut self) -> Result<()> {
        self.daemon.check_running()
    }

    /// Imports the lab's pause image and waits until the CRI plugin lists
    /// it (it learns of images from containerd's events, asynchronously).
    fn import_pause_image(&self, timeout: Duration, cancel: &Cancel) -> Result<()> {
        let archive = image::archive(PAUSE_IMAGE, image::PAUSE_PROGRAM)
            .context("building the pause image")?;
        let path = self.layout.dir.join("pause-image.tar");
        std::fs::write(&path, archive).with_context(|| format!("writing {}", path.display()))?;
        let mut cmd = Command::new(CTR_BIN);
        cmd.arg("--address")
            .arg(self.layout.socket())
            .args(["--namespace", CRI_NAMESPACE, "images", "import"])
            .args(["--snapshotter", SNAPSHOTTER])
            .arg(&path);
        let done = process::run_with_input(cmd, None, b"", timeout, cancel)
            .context("importing the pause image with ctr")?;
        if !done.status.success() {
            bail!(
                "ctr images import of {PAUSE_IMAGE} failed ({}): {}{}",
                done.status,
                String::from_utf8_lossy(&done.stderr).trim(),
                String::from_utf8_lossy(&done.stdout).trim()
            );
        }
        let deadline = Instant::now() + timeout;
        loop {
            cancel.check()?;
            if self.handle.block_on(self.client.has_image(PAUSE_IMAGE))? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the CRI plugin does not list {PAUSE_IMAGE} {timeout:?} after its import");
            }
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
    }

    /// RunPodSandbox, then PodSandboxStatus: the ready sandbox, or why the
    /// runtime refused it.
    pub fn run(&self, pod: &str, config: pb::PodSandboxConfig) -> Result<SandboxInfo> {
        self.handle.block_on(self.run_async(pod, config))
    }

    pub async fn run_async(&self, pod: &str, config: pb::PodSandboxConfig) -> Result<SandboxInfo> {
        let id = self
            .client
            .run_sandbox(config)
            .await
            .map_err(|status| run_error(pod, status.message()))?;
        self.client
            .sandbox_info(&id)
            .await
            .with_context(|| format!("pod {pod}: reading its new sandbox {id}"))
    }

    /// StopPodSandbox (CNI DEL of the chain, the pause container stopped),
    /// then RemovePodSandbox, as the kubelet does for a deleted pod.
    pub fn remove(&self, id: &str) -> Result<()> {
        self.handle.block_on(self.remove_async(id))
    }

    pub async fn remove_async(&self, id: &str) -> Result<()> {
        self.client.stop_sandbox(id).await?;
        self.client.remove_sandbox(id).await
    }

    /// The sandboxes the runtime holds for a pod uid (none once a failed
    /// RunPodSandbox was cleaned up).
    pub fn sandboxes_of(&self, uid: &str) -> Result<Vec<pb::PodSandbox>> {
        self.handle.block_on(
            self.client
                .list_sandboxes(&[(super::sandbox::POD_UID_LABEL, uid)]),
        )
    }

    /// Removes every sandbox the runtime still holds (the lab removes its
    /// pods first; this catches any it lost track of), then stops the
    /// daemon.
    pub fn stop(&mut self, grace: Duration) -> Result<()> {
        let mut errors = Vec::new();
        if self.daemon.exit_status().is_none() {
            match self.handle.block_on(self.client.list_sandboxes(&[])) {
                Ok(left) => {
                    for s in left {
                        if let Err(e) = self.remove(&s.id) {
                            errors.push(format!("{e:#}"));
                        }
                    }
                }
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if let Err(e) = self.daemon.stop(grace) {
            errors.push(format!("{e:#}"));
        }
        if !errors.is_empty() {
            bail!("stopping containerd: {}", errors.join("; "));
        }
        Ok(())
    }
}

/// What the machine lacks to run a lab node's containerd (apt: containerd,
/// runc; the CRI plugin also runs the `loopback` CNI plugin).
pub fn missing(cni_bin_dir: &Path) -> Vec<String> {
    let path = with_sbin(std::env::var_os("PATH"));
    let mut out = Vec::new();
    for bin in [CONTAINERD_BIN, CTR_BIN, "containerd-shim-runc-v2", "runc"] {
        if !std::env::split_paths(&path).any(|d| d.join(bin).is_file()) {
            out.push(format!(
                "{bin} (runtime: containerd; Debian: apt-get install containerd runc)"
            ));
        }
    }
    if !cni_bin_dir.join("loopback").is_file() {
        out.push(format!(
            "{}/loopback (containerd runs it for every sandbox; Debian: containernetworking-plugins)",
            cni_bin_dir.display()
        ));
    }
    out
}

/// A refused RunPodSandbox, naming the plugin when the CNI chain failed.
fn run_error(pod: &str, message: &str) -> anyhow::Error {
    match cri::failed_plugin(message) {
        Some((plugin, command)) => RunError::Cni {
            pod: pod.to_string(),
            plugin,
            command,
            message: message.to_string(),
        }
        .into(),
        None => RunError::Runtime {
            pod: pod.to_string(),
            message: message.to_string(),
        }
        .into(),
    }
}

fn wait_ready(
    daemon: &mut Daemon,
    layout: &Layout,
    handle: &Handle,
    s: &Settings,
    cancel: &Cancel,
) -> Result<CriClient> {
    let deadline = Instant::now() + s.start_timeout;
    let mut last = anyhow!("its socket {} never appeared", layout.socket().display());
    loop {
        cancel.check()?;
        daemon.check_running()?;
        if layout.socket().exists() {
            let attempt = handle.block_on(async {
                let c = CriClient::connect(&layout.socket(), s.call_timeout).await?;
                c.version().await?;
                Ok::<_, anyhow::Error>(c)
            });
            match attempt {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline {
            return Err(last.context(format!(
                "containerd did not answer CRI within {:?}; last lines of {}:\n{}",
                s.start_timeout,
                daemon.log_path().display(),
                process::tail(daemon.log_path(), 20)
            )));
        }
        std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
    }
}

fn link(target: &Path, at: &Path) -> Result<()> {
    if !target.exists() {
        bail!("CNI plugin {} does not exist", target.display());
    }
    let _ = std::fs::remove_file(at);
    symlink(target, at).with_context(|| format!("linking {} to {}", at.display(), target.display()))
}

/// PATH with the sbin dirs (runc is in /usr/sbin on Debian).
fn with_sbin(path: Option<std::ffi::OsString>) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = path
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_of_the_config_is_under_the_layout() {
        let layout = Layout {
            dir: PathBuf::from("/run/palisade-lab/abc123/containerd"),
        };
        let toml = config_toml(&layout);
        for line in toml.lines() {
            let Some((_, value)) = line.split_once(" = \"/") else {
                continue;
            };
            assert!(
                value.starts_with("run/palisade-lab/abc123/containerd/"),
                "{line}"
            );
        }
        for want in [
            "sandbox_image = \"palisade.lab/pause:1\"",
            "restrict_oom_score_adj = true",
            "bin_dir = \"/run/palisade-lab/abc123/containerd/cni-bin\"",
            "conf_dir = \"/run/palisade-lab/abc123/containerd/cni-conf\"",
            "address = \"/run/palisade-lab/abc123/containerd/containerd.sock\"",
            "snapshotter = \"overlayfs\"",
        ] {
            assert!(toml.contains(want), "missing {want}:\n{toml}");
        }
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(toml_string("x\ny"), "\"x\\u000Ay\"");
    }

    #[test]
    fn the_network_is_the_lab_chain() {
        let list = conflist(&[json!({"type": "ptp"}), json!({"type": "palisade-cni"})]);
        assert_eq!(list["name"], NETWORK_NAME);
        assert_eq!(list["cniVersion"], CNI_VERSION);
        assert_eq!(list["plugins"][1]["type"], "palisade-cni");
    }

    #[test]
    fn a_cni_refusal_names_the_plugin() {
        let e = run_error(
            "x/d",
            r#"failed to setup network for sandbox "ab": plugin type="palisade-cni" name="palisade-lab" failed (add): refused"#,
        );
        let text = format!("{e:#}");
        assert!(text.starts_with("palisade-cni ADD failed"), "{text}");
        assert!(text.contains("pod x/d"), "{text}");
        let e = run_error("x/d", "failed to create containerd task: EOF");
        assert!(matches!(
            e.downcast_ref::<RunError>(),
            Some(RunError::Runtime { .. })
        ));
    }

    #[test]
    fn path_gets_the_sbin_dirs_once() {
        let p = with_sbin(Some("/usr/bin:/opt/x".into()));
        let dirs: Vec<PathBuf> = std::env::split_paths(&p).collect();
        assert_eq!(dirs[0], PathBuf::from("/usr/bin"));
        assert_eq!(
            dirs.iter().filter(|d| *d == Path::new("/usr/bin")).count(),
            1
        );
        assert!(dirs.contains(&PathBuf::from("/usr/sbin")));
    }
}
