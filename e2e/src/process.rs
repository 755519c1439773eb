//! Child processes: the long-running controller and enforcer, and one-shot
//! CNI plugin runs.
//!
//! Every child gets its own process group, so a Ctrl-C on the terminal
//! reaches only the lab, which then tears its children down in order (the CNI
//! DELs need a live enforcer).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cancel::Cancel;
use crate::netns::NetNs;

const POLL: Duration = Duration::from_millis(20);
const CANCEL_CHECK: Duration = Duration::from_millis(50);

/// Makes `cmd` start inside `ns` and in its own process group.
pub fn prepare(cmd: &mut Command, ns: Option<&NetNs>) -> Result<Option<File>> {
    cmd.process_group(0);
    let Some(ns) = ns else { return Ok(None) };
    let file = ns.open()?;
    let fd = file.as_raw_fd();
    // SAFETY: setns is async-signal-safe, and the fd stays open until the
    // caller drops the returned File after spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(Some(file))
}

/// A long-running child whose output goes to a log file: a process, or a
/// container that `podman run` runs attached (the child is then podman, and
/// signals go through podman to the container).
pub struct Daemon {
    name: String,
    child: Child,
    /// The container's name, when the child is `podman run`.
    container: Option<String>,
    /// The process itself (the container's, not podman's).
    pid: u32,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Daemon {
    pub fn spawn(name: &str, mut cmd: Command, ns: Option<&NetNs>, log: &Path) -> Result<Self> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening log {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let ns_file = prepare(&mut cmd, ns)?;
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        drop(ns_file);
        Ok(Self {
            name: name.to_string(),
            pid: child.id(),
            child,
            container: None,
            log: log.to_path_buf(),
            exited: None,
        })
    }

    /// Runs `podman run --rm --pidfile PIDFILE ARGS` attached, its output
    /// (the container's) appended to `log`, and returns once the
    /// container's process runs (its pid is known), or fails with the log
    /// if it exits first or `timeout` passes.
    pub fn spawn_container(
        name: &str,
        container: &str,
        args: &[String],
        log: &Path,
        pidfile: &Path,
        timeout: Duration,
    ) -> Result<Self> {
        let _ = std::fs::remove_file(pidfile);
        let mut cmd = Command::new(crate::kubelet::podman::PODMAN);
        cmd.arg("run")
            .arg("--rm")
            .arg(format!("--pidfile={}", pidfile.display()))
            .args(args);
        let mut daemon = Self::spawn(name, cmd, None, log)?;
        daemon.container = Some(container.to_string());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pid) = crate::kubelet::podman::read_pid(pidfile) {
                daemon.pid = pid;
                return Ok(daemon);
            }
            daemon.check_running()?;
            if Instant::now() >= deadline {
                bail!(
                    "container {container} ({name}) did not start within {timeout:?}; last lines of {}:\n{}",
                    log.display(),
                    tail(log, 30)
                );
            }
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
    }

    /// The container's name, when this runs in one.
    pub fn container(&self) -> Option<&str> {
        self.container.as_deref()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Fails, with the end of the log, if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.poll_exit() {
            bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 30)
            );
        }
        Ok(())
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// SIGKILL and reap: a crash, with no chance to clean up.
    pub fn kill(&mut self) -> Result<()> {
        if self.poll_exit().is_some() {
            return Ok(());
        }
        match &self.container {
            // podman exits once the container's process is dead.
            Some(c) => crate::kubelet::podman::kill(c)?,
            None => {
                let _ = self.child.kill();
            }
        }
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        self.exited = Some(status);
        Ok(())
    }

    /// Whether the process has exited (and how), without waiting.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.poll_exit()
    }

    /// SIGTERM, then SIGKILL once `grace` is over; always reaps the child.
    pub fn stop(&mut self, grace: Duration) -> Result<()> {
        if self.poll_exit().is_some() {
            return Ok(());
        }
        if let Some(c) = self.container.clone() {
            return self.stop_container(&c, grace);
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.poll_exit().is_some() {
                return Ok(());
            }
            std::thread::sleep(POLL); // poll: inside a loop bounded by a deadline
        }
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        self.exited = Some(status);
        bail!(
            "{} did not stop within {grace:?} of SIGTERM and was killed",
            self.name
        )
    }
}

impl Daemon {
    /// The runtime's stop (SIGTERM, SIGKILL after `grace`); a container
    /// that needed the SIGKILL (exit 137) is reported as such.
    fn stop_container(&mut self, container: &str, grace: Duration) -> Result<()> {
        crate::kubelet::podman::stop(container, grace)?;
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        self.exited = Some(status);
        if status.code() == Some(137) {
            bail!(
                "{} did not stop within {grace:?} of SIGTERM and was killed",
                self.name
            );
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.poll_exit().is_none() {
            if let Some(c) = &self.container {
                let _ = crate::kubelet::podman::remove(c);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs a one-shot command with `input` on stdin, killing it after
/// `timeout` or when the lab is cancelled.
pub fn run_with_input(
    mut cmd: Command,
    ns: Option<&NetNs>,
    input: &[u8],
    timeout: Duration,
    cancel: &Cancel,
) -> Result<Finished> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    // Output goes to anonymous files, not pipes, so a chatty child can never
    // block on a full pipe while we wait for it.
    let mut out = tempfile::tempfile()?;
    let mut err = tempfile::tempfile()?;
    cmd.stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(err.try_clone()?);
    let ns_file = prepare(&mut cmd, ns)?;
    let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    drop(ns_file);
    let write_result = child.stdin.take().map(|mut s| s.write_all(input));
    // A waiter thread reaps the child and wakes us the moment it exits, so
    // the measured time of a plugin run is its own, not a poll interval.
    let pid = Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Bounded so that a cancel is noticed promptly.
        match rx.recv_timeout(left.min(CANCEL_CHECK)) {
            Ok(status) => break status?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                bail!("lost track of {program}")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() >= deadline || cancel.is_cancelled() {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = rx.recv();
            if cancel.is_cancelled() {
                return Err(crate::cancel::Interrupted.into());
            }
            bail!("{program} did not finish within {timeout:?} and was killed");
        }
    };
    // A plugin that exits without reading stdin makes the write fail; its
    // exit status is the real answer then.
    if let Some(Err(e)) = write_result {
        if status.success() {
            return Err(e).with_context(|| format!("writing stdin of {program}"));
        }
    }
    Ok(Finished {
        status,
        stdout: read_all(&mut out)?,
        stderr: read_all(&mut err)?,
    })
}

fn read_all(f: &mut File) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(0))?;
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// The last `lines` lines of a log file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(data) => {
            let text = String::from_utf8_lossy(&data);
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            if all.is_empty() {
                "  (empty)".to_string()
            } else {
                all[start..]
                    .iter()
                    .map(|l| format!("  | {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
        Err(e) => format!("  (cannot read: {e})"),
    }
}

/// Whether a process with this pid still exists (zombies count as gone).
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name, which may
            // itself contain spaces or parentheses.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}
