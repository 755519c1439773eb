//! Mounts, as /proc/self/mountinfo lists them: the cgroup hierarchies, and
//! what containerd mounted under a lab's run dir (sandbox rootfs overlays,
//! /dev/shm) that a dead lab may have left.

use std::path::{Path, PathBuf};

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

/// Mount points whose filesystem type is one of `types`.
pub fn of_type(types: &[&str]) -> Vec<PathBuf> {
    parse(&mountinfo())
        .into_iter()
        .filter(|(_, t)| types.contains(&t.as_str()))
        .map(|(p, _)| p)
        .collect()
}

/// Mount points at or below `dir`, deepest first (the order to unmount).
pub fn under(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = parse(&mountinfo())
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Detaches every mount at or below `dir` (MNT_DETACH: a busy one goes once
/// its last user does). Returns what it could not detach.
pub fn detach_under(dir: &Path) -> Vec<String> {
    under(dir)
        .into_iter()
        .filter_map(|p| {
            nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH)
                .err()
                .map(|e| format!("unmounting {}: {e}", p.display()))
        })
        .collect()
}

/// (mount point, filesystem type) of every line: the mount point is field
/// 5, the type the first field after the ` - ` separator.
fn parse(text: &str) -> Vec<(PathBuf, String)> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fstype = after.split(' ').next()?.to_string();
            let point = before.split(' ').nth(4)?;
            Some((PathBuf::from(unescape(point)), fstype))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(n) if bytes[i] == b'\\' => {
                out.push(n);
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mount_points_and_types() {
        let info = "\
25 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 30 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
33 30 0:29 / /run/lab/with\\040space rw shared:5 - overlay overlay rw";
        assert_eq!(
            parse(info),
            [
                (PathBuf::from("/"), "ext4".to_string()),
                (PathBuf::from("/sys/fs/cgroup/cpu"), "cgroup".to_string()),
                (
                    PathBuf::from("/sys/fs/cgroup/unified"),
                    "cgroup2".to_string()
                ),
                (PathBuf::from("/run/lab/with space"), "overlay".to_string()),
            ]
        );
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("trailing\\"), "trailing\\");
    }
}
