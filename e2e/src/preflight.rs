//! Checks that the machine can host a lab, naming everything that is missing
//! at once rather than failing on the first missing piece mid-build.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};
use nix::sys::statfs::{statfs, BPF_FS_MAGIC};

pub const BPFFS: &str = "/sys/fs/bpf";
pub const CONTROLLER_BIN: &str = "palisade-controller";
pub const ENFORCER_BIN: &str = "palisade-enforcer";
pub const CNI_BIN: &str = "palisade-cni";

/// The lab needs root for namespaces, veths and eBPF.
#[derive(Debug)]
pub struct NotRoot;

impl std::fmt::Display for NotRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "palisade-lab must run as root: it creates network namespaces, veths and eBPF programs",
        )
    }
}

impl std::error::Error for NotRoot {}

/// What the machine lacks to host a lab.
#[derive(Debug)]
pub struct Missing(pub Vec<String>);

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the lab cannot start; missing:\n  - {}",
            self.0.join("\n  - ")
        )
    }
}

impl std::error::Error for Missing {}

pub fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(NotRoot.into());
    }
    Ok(())
}

/// `with_palisade` = false checks only what a plain CNI lab needs.
pub fn check(bin_dir: &Path, cni_bin_dir: &Path, with_palisade: bool) -> Result<()> {
    require_root()?;
    let mut missing = Vec::new();
    for name in ["ptp", "host-local"] {
        check_exec(
            &cni_bin_dir.join(name),
            &mut missing,
            "no such executable CNI plugin (apt install containernetworking-plugins, or use --cni-bin-dir)",
        );
    }
    if with_palisade {
        for name in [CONTROLLER_BIN, ENFORCER_BIN, CNI_BIN] {
            check_exec(
                &bin_dir.join(name),
                &mut missing,
                "no such executable Palisade binary (cargo build --bins, or use --bin-dir)",
            );
        }
    }
    if which("ip").is_none() {
        missing.push("the `ip` command (iproute2) on PATH".to_string());
    }
    if with_palisade {
        if let Err(e) = ensure_bpffs() {
            missing.push(format!("bpffs at {BPFFS}: {e:#}"));
        }
    }
    if !missing.is_empty() {
        return Err(Missing(missing).into());
    }
    Ok(())
}

/// What `--node-processes image` needs: the image, podman, the chart renderer
/// (python3 with helm-sdkpy), the CNI plugins and bpffs.
pub fn check_image(image: &str, cni_bin_dir: &Path) -> Result<()> {
    require_root()?;
    let mut missing = Vec::new();
    for name in ["ptp", "host-local"] {
        check_exec(
            &cni_bin_dir.join(name),
            &mut missing,
            "no such executable CNI plugin (apt install containernetworking-plugins, or use --cni-bin-dir)",
        );
    }
    if !crate::kubelet::podman::available() {
        missing.push("podman (apt install podman; scripts/setup.sh installs it)".to_string());
    } else if let Err(e) = crate::kubelet::podman::image_config(image) {
        missing.push(format!("{e:#}"));
    }
    if which("python3").is_none() {
        missing.push("python3 with helm-sdkpy, to render the chart (scripts/setup.sh)".to_string());
    }
    if which("ip").is_none() {
        missing.push("the `ip` command (iproute2) on PATH".to_string());
    }
    if let Err(e) = ensure_bpffs() {
        missing.push(format!("bpffs at {BPFFS}: {e:#}"));
    }
    if !missing.is_empty() {
        return Err(Missing(missing).into());
    }
    Ok(())
}

fn check_exec(path: &Path, missing: &mut Vec<String>, what: &str) {
    let ok = path
        .metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    if !ok {
        missing.push(format!("{}: {what}", path.display()));
    }
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(cmd))
            .find(|p| p.is_file())
    })
}

/// Mounts bpffs when it is not there: pins need it.
pub fn ensure_bpffs() -> Result<()> {
    if is_bpffs(Path::new(BPFFS)) {
        return Ok(());
    }
    std::fs::create_dir_all(BPFFS).with_context(|| format!("creating {BPFFS}"))?;
    mount(
        Some("bpf"),
        BPFFS,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| format!("mount -t bpf bpf {BPFFS}"))?;
    if !is_bpffs(Path::new(BPFFS)) {
        bail!("{BPFFS} is still not a bpf filesystem after mounting");
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    statfs(path)
        .map(|s| s.filesystem_type() == BPF_FS_MAGIC)
        .unwrap_or(false)
}
