//! The podman commands the pod runner uses, and nothing else: every call
//! names the container and says what failed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use super::run::ImageConfig;
use crate::cancel::Cancel;
use crate::process::{run_with_input, Finished};

pub const PODMAN: &str = "podman";

fn podman(args: &[&str]) -> Result<String> {
    let out = Command::new(PODMAN)
        .args(args)
        .output()
        .with_context(|| format!("running podman {} (apt install podman)", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "podman {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether podman is installed at all.
pub fn available() -> bool {
    Command::new(PODMAN)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What the kubelet reads from the image config; the image must be here.
pub fn image_config(image: &str) -> Result<ImageConfig> {
    let user =
        podman(&["image", "inspect", "--format", "{{.Config.User}}", image]).map_err(|e| {
            anyhow!(
                "image {image} is not on this machine (scripts/image.sh builds Palisade's): {e:#}"
            )
        })?;
    Ok(ImageConfig { user })
}

/// The labels of a local image.
pub fn image_label(image: &str, label: &str) -> Result<String> {
    podman(&[
        "image",
        "inspect",
        "--format",
        &format!("{{{{index .Config.Labels \"{label}\"}}}}"),
        image,
    ])
}

/// Runs a container to completion (`podman run --rm`), bounded by `timeout`.
pub fn run_to_completion(args: &[String], timeout: Duration, cancel: &Cancel) -> Result<Finished> {
    let mut cmd = Command::new(PODMAN);
    cmd.arg("run").arg("--rm").args(args);
    run_with_input(cmd, None, b"", timeout, cancel)
}

/// `podman exec` in a running container, bounded by `timeout`.
pub fn exec(
    container: &str,
    command: &[String],
    timeout: Duration,
    cancel: &Cancel,
) -> Result<Finished> {
    let mut cmd = Command::new(PODMAN);
    cmd.arg("exec").arg(container).args(command);
    run_with_input(cmd, None, b"", timeout, cancel)
}

/// SIGKILL to the container's process: a crash.
pub fn kill(container: &str) -> Result<()> {
    podman(&["kill", "--signal", "KILL", container]).map(|_| ())
}

/// The runtime's stop: SIGTERM, SIGKILL after `grace`.
pub fn stop(container: &str, grace: Duration) -> Result<()> {
    let secs = grace.as_secs().max(1).to_string();
    podman(&["stop", "--time", &secs, container]).map(|_| ())
}

/// Removes the container whatever its state; absent is fine.
pub fn remove(container: &str) -> Result<()> {
    podman(&["rm", "--force", "--ignore", container]).map(|_| ())
}

/// The containers (running or not) with this label.
pub fn labelled(label: &str) -> Result<Vec<String>> {
    Ok(podman(&[
        "ps",
        "--all",
        "--filter",
        &format!("label={label}"),
        "--format",
        "{{.Names}}",
    ])?
    .lines()
    .map(str::to_string)
    .filter(|l| !l.is_empty())
    .collect())
}

/// Reads the pid file podman writes once the container's process runs.
pub fn read_pid(pidfile: &Path) -> Option<u32> {
    std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()
}
