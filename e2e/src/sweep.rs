//! Removes what labs that died without cleaning up (SIGKILL, power loss)
//! left behind. A lab in use is recognised by its live owner pid and left
//! alone, so sweeping is safe while other labs run.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::netns::{NetNs, NETNS_DIR};
use crate::preflight::BPFFS;
use crate::process::is_alive;

pub const OWNER_FILE: &str = "owner.pid";
pub const PIDS_FILE: &str = "pids";

/// What a sweep removed (or failed to remove).
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: Vec<String>,
    pub errors: Vec<String>,
}

/// Whether `name` looks like a run id (6 lowercase hex digits).
fn is_run_id(name: &str) -> bool {
    name.len() == 6
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn in_use(run_dir: &Path) -> bool {
    read_pid(&run_dir.join(OWNER_FILE)).is_some_and(is_alive)
}

/// Sweeps every dead lab under `run_root`, plus namespaces and pin roots
/// whose run dir is gone.
pub fn sweep(run_root: &Path) -> Result<Swept> {
    let mut swept = Swept::default();
    let mut live_ids = Vec::new();
    let mut dead_ids = Vec::new();
    if let Ok(entries) = fs::read_dir(run_root) {
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if !is_run_id(&id) {
                continue;
            }
            if in_use(&e.path()) {
                live_ids.push(id);
            } else {
                dead_ids.push(id);
            }
        }
    }
    for id in &dead_ids {
        let dir = run_root.join(id);
        for pid in fs::read_to_string(dir.join(PIDS_FILE))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
        {
            // The pid may have been reused: only kill what is still ours.
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if is_alive(pid) && String::from_utf8_lossy(&cmdline).contains(id.as_str()) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                swept.removed.push(format!("process {pid}"));
            }
        }
    }
    for id in &dead_ids {
        // With runtime: containerd, what its sandboxes left (the daemon and
        // its shims were in the pid list).
        let (removed, errors) = crate::runtime::sweep::sweep_dead(&run_root.join(id), id);
        swept.removed.extend(removed);
        swept.errors.extend(errors);
    }
    // Asked again at each removal, not only from the first listing: a lab
    // that started since holds a live run dir before it makes namespaces or
    // pin roots, and its pin root must not go (a concurrent `clean` took a
    // starting enforcer's pin root from under it: BPF_OBJ_PIN ENOENT).
    let is_live = |id: &str| live_ids.iter().any(|l| l == id) || in_use(&run_root.join(id));
    // Image mode: the dead lab's containers, then its nodes' bpffs mounts
    // (the run dir cannot be removed under them).
    if crate::kubelet::podman::available() {
        for id in &dead_ids {
            let label = format!("{}={id}", crate::lab::LAB_LABEL);
            match crate::kubelet::podman::labelled(&label) {
                Ok(names) => {
                    for name in names {
                        match crate::kubelet::podman::remove(&name) {
                            Ok(()) => swept.removed.push(format!("container {name}")),
                            Err(e) => swept.errors.push(format!("{e:#}")),
                        }
                    }
                }
                Err(e) => swept.errors.push(format!("{e:#}")),
            }
        }
    }
    for id in &dead_ids {
        for bpffs in crate::lab::node_root_bpffs(&run_root.join(id)) {
            if is_mount_point(&bpffs) {
                match nix::mount::umount2(&bpffs, nix::mount::MntFlags::MNT_DETACH) {
                    Ok(()) => swept
                        .removed
                        .push(format!("bpffs mount {}", bpffs.display())),
                    Err(e) => swept
                        .errors
                        .push(format!("umount {}: {e}", bpffs.display())),
                }
            }
        }
    }

    for name in list(Path::new(NETNS_DIR)) {
        let Some(id) = name.strip_prefix("pl").and_then(|r| r.split('-').next()) else {
            continue;
        };
        if is_run_id(id) && name.starts_with(&format!("pl{id}-")) && !is_live(id) {
            match NetNs::from_existing(&name).delete() {
                Ok(()) => swept.removed.push(format!("network namespace {name}")),
                Err(e) => swept.errors.push(format!("{e:#}")),
            }
        }
    }
    for name in list(Path::new(BPFFS)) {
        // Node 1's pin root is `palisade-lab-<id>`, node K's
        // `palisade-lab-<id>-node-K`.
        let Some(id) = name
            .strip_prefix("palisade-lab-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if is_run_id(id) && !is_live(id) {
            remove(&Path::new(BPFFS).join(&name), &mut swept);
        }
    }
    for name in list(Path::new(crate::exec_trace::INSTANCES)) {
        // A benchmark's tracefs instance (`exec_trace::lab_instance`).
        let Some(id) = name.strip_prefix("palisade-lab-") else {
            continue;
        };
        if is_run_id(id) && !is_live(id) {
            let path = Path::new(crate::exec_trace::INSTANCES).join(&name);
            match fs::remove_dir(&path) {
                Ok(()) => swept.removed.push(format!("tracefs instance {name}")),
                Err(e) => swept
                    .errors
                    .push(format!("removing {}: {e}", path.display())),
            }
        }
    }
    for id in &dead_ids {
        // Kept logs stay; everything else of a dead lab goes.
        let dir = run_root.join(id);
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_name() != "logs" {
                remove(&e.path(), &mut swept);
            }
        }
        if list(&dir).is_empty() {
            let _ = fs::remove_dir(&dir);
        }
    }
    let _ = fs::remove_dir(run_root);
    Ok(swept)
}

/// Whether `path` is a mount point (its device differs from its parent's).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(here), Some(Ok(parent))) = (fs::metadata(path), path.parent().map(fs::metadata)) else {
        return false;
    };
    here.dev() != parent.dev()
}

fn list(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn remove(path: &PathBuf, swept: &mut Swept) {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Ok(()) => swept.removed.push(path.display().to_string()),
        Err(e) => swept
            .errors
            .push(format!("removing {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_run_ids() {
        assert!(is_run_id("0a9f3c"));
        assert!(!is_run_id("0A9F3C"));
        assert!(!is_run_id("0a9f3"));
        assert!(!is_run_id("logs"));
    }

    #[test]
    fn a_dead_owner_marks_a_dead_lab() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!in_use(dir.path()));
        fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string()).unwrap();
        assert!(in_use(dir.path()));
    }
}
