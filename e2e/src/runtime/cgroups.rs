//! The lab's cgroups: runc puts every sandbox of a lab under one cgroup
//! named after the lab (the sandbox's `cgroup_parent`), in every mounted
//! hierarchy (cgroup v1 controllers and the v2 tree alike). runc removes a
//! sandbox's own cgroup; the parents are the lab's to remove.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// The cgroup every pod of lab `id` sits under.
pub fn lab_cgroup(id: &str) -> String {
    format!("/palisade-lab-{id}")
}

/// Mount points of every cgroup hierarchy.
pub fn hierarchies() -> Vec<PathBuf> {
    super::mounts::of_type(&["cgroup", "cgroup2"])
}

/// The directories of `cgroup` that exist, one per hierarchy.
pub fn existing(cgroup: &str) -> Vec<PathBuf> {
    hierarchies()
        .into_iter()
        .map(|h| h.join(cgroup.trim_start_matches('/')))
        .filter(|p| p.is_dir())
        .collect()
}

/// The pids in `cgroup` and below, in every hierarchy.
pub fn pids(cgroup: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for dir in existing(cgroup) {
        walk(&dir, &mut |d| {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        });
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Removes `cgroup` and every cgroup below it, deepest first, in every
/// hierarchy. A cgroup still holding a process cannot be removed: that is
/// reported, never forced.
pub fn remove(cgroup: &str) -> Result<()> {
    let mut errors = Vec::new();
    for dir in existing(cgroup) {
        let mut dirs = Vec::new();
        walk(&dir, &mut |d| dirs.push(d.to_path_buf()));
        // walk lists parents before children.
        for d in dirs.iter().rev() {
            if let Err(e) = std::fs::remove_dir(d) {
                errors.push(format!("removing cgroup {}: {e}", d.display()));
            }
        }
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    Ok(())
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    f(dir);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&e.path(), f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_cgroups_are_named_after_the_lab() {
        assert_eq!(lab_cgroup("0a1b2c"), "/palisade-lab-0a1b2c");
    }
}
