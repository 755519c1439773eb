//! What a killed lab's containerd left, for `palisade-lab clean`: sandbox
//! processes (the pause containers, in the lab's cgroup), mounts under the
//! run dir (rootfs overlays, /dev/shm), the sandbox netns containerd made
//! (listed by the lab as it went), and the lab's cgroups. containerd itself
//! and its shims are in the lab's pid list, killed before this runs.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::cgroups;
use crate::netns::NetNs;

/// The file, in a lab's run dir, with a line `<sandbox id> <netns>` for
/// each sandbox containerd made.
pub const SANDBOXES_FILE: &str = "sandboxes";
/// Where libcni (in containerd) caches each attachment's result, as
/// `<network>-<container id>-<ifname>`: a sandbox that got no DEL leaves
/// its files there.
const CNI_CACHE: &str = "/var/lib/cni/results";

/// Removes what lab `id` (run dir `dir`, owner dead) left; returns what it
/// removed and what it could not.
pub fn sweep_dead(dir: &Path, id: &str) -> (Vec<String>, Vec<String>) {
    let (mut removed, mut errors) = (Vec::new(), Vec::new());
    let cgroup = cgroups::lab_cgroup(id);
    let doomed = cgroups::pids(&cgroup);
    for pid in &doomed {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        removed.push(format!("sandbox process {pid}"));
    }
    // A killed process leaves its cgroup once the kernel has reaped it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cgroups::pids(&cgroup).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20)); // poll: bounded by the deadline
    }
    for e in super::mounts::detach_under(dir) {
        errors.push(e);
    }
    let listed = std::fs::read_to_string(dir.join(SANDBOXES_FILE)).unwrap_or_default();
    for (sandbox, netns) in listed.lines().filter_map(|l| l.split_once(' ')) {
        if netns.starts_with("cni-") && NetNs::exists(netns) {
            match NetNs::from_existing(netns).delete() {
                Ok(()) => removed.push(format!("sandbox network namespace {netns}")),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        for path in cache_paths(sandbox) {
            if path.exists() {
                match std::fs::remove_file(&path) {
                    Ok(()) => removed.push(path.display().to_string()),
                    Err(e) => errors.push(format!("removing {}: {e}", path.display())),
                }
            }
        }
    }
    if !cgroups::existing(&cgroup).is_empty() {
        match cgroups::remove(&cgroup) {
            Ok(()) => removed.push(format!("cgroup {cgroup}")),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    (removed, errors)
}

/// [`cache_files`] as paths.
pub fn cache_paths(sandbox: &str) -> Vec<std::path::PathBuf> {
    cache_files(sandbox)
        .into_iter()
        .map(|f| Path::new(CNI_CACHE).join(f))
        .collect()
}

/// libcni's cache files of one sandbox: the lab's network on eth0 and the
/// CRI plugin's loopback network on lo.
pub fn cache_files(sandbox: &str) -> Vec<String> {
    if sandbox.is_empty() || !sandbox.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Vec::new();
    }
    vec![
        format!(
            "{}-{sandbox}-{}",
            crate::cni::NETWORK_NAME,
            crate::cni::IFNAME
        ),
        format!("cni-loopback-{sandbox}-lo"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_files_are_named_as_libcni_names_them() {
        assert_eq!(
            cache_files("0a1b"),
            ["palisade-lab-0a1b-eth0", "cni-loopback-0a1b-lo"]
        );
        assert!(cache_files("../../etc").is_empty());
        assert!(cache_files("").is_empty());
    }
}
