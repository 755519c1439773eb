//! Files that hold the node's policy (the plan names every peer address of
//! every pod on the node; the pod list, their interfaces and addresses)
//! are root's alone: directories 0700, files 0600. A file is created with
//! its mode (never chmod'ed after it was written, which leaves a window in
//! which it is readable), and a directory or file an older version left
//! wider is tightened when the enforcer starts.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const DIR_MODE: u32 = 0o700;
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` (missing parents as usual, the directory itself 0700), or
/// tightens an existing one to 0700. Returns the mode it had when that was
/// wider, so the caller can say so.
pub fn dir(dir: &Path) -> io::Result<Option<u32>> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    tighten(dir, DIR_MODE)
}

/// Tightens an existing regular file to 0600; nothing when it is missing
/// or not a regular file (a flow log sent to /dev/stderr or a pipe is not
/// ours to change). Returns the mode it had when that was wider.
pub fn tighten_file(path: &Path) -> io::Result<Option<u32>> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(m) if !m.is_file() => Ok(None),
        Ok(_) => tighten(path, FILE_MODE),
    }
}

fn tighten(path: &Path, mode: u32) -> io::Result<Option<u32>> {
    let had = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if had & !mode == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(path, Permissions::from_mode(mode))?;
    Ok(Some(had))
}

/// A new file, 0600 from its creation (the umask can only narrow it). A
/// stale file at the path (a temp file a crashed process of the same pid
/// left) is removed first, since opening it would keep its mode.
pub fn create_new(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Options that create a missing file 0600.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Logs a tightening `dir`/`tighten_file` did.
pub fn log_tightened(what: &str, path: &Path, had: Option<u32>) {
    if let Some(had) = had {
        tracing::warn!(
            path = %path.display(),
            was = %format!("{had:o}"),
            now = %format!("{:o}", if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) { DIR_MODE } else { FILE_MODE }),
            "{what} was readable by other users; tightened"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_new_dir_is_0700_and_a_wider_one_is_tightened() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("a/state");
        assert_eq!(dir(&d).unwrap(), None);
        assert_eq!(mode(&d), 0o700);
        std::fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        assert_eq!(dir(&d).unwrap(), Some(0o755));
        assert_eq!(mode(&d), 0o700);
        assert_eq!(dir(&d).unwrap(), None, "already private");
        // Narrower than 0700 is left alone.
        std::fs::set_permissions(&d, Permissions::from_mode(0o500)).unwrap();
        assert_eq!(dir(&d).unwrap(), None);
        assert_eq!(mode(&d), 0o500);
    }

    #[test]
    fn files_are_created_0600_and_stale_ones_replaced() {
        let root = tempfile::tempdir().unwrap();
        let f = root.path().join("f");
        std::fs::write(&f, "old").unwrap();
        std::fs::set_permissions(&f, Permissions::from_mode(0o666)).unwrap();
        drop(create_new(&f).unwrap());
        assert_eq!(mode(&f), 0o600);
        assert_eq!(std::fs::read(&f).unwrap(), b"");
        let g = root.path().join("g");
        std::fs::write(&g, "x").unwrap();
        std::fs::set_permissions(&g, Permissions::from_mode(0o644)).unwrap();
        assert_eq!(tighten_file(&g).unwrap(), Some(0o644));
        assert_eq!(mode(&g), 0o600);
        assert_eq!(tighten_file(&root.path().join("missing")).unwrap(), None);
        assert_eq!(tighten_file(Path::new("/dev/null")).unwrap(), None);
        assert_eq!(mode(Path::new("/dev/null")), 0o666);
        let h = root.path().join("h");
        drop(options().create(true).append(true).open(&h).unwrap());
        assert_eq!(mode(&h), 0o600);
    }
}
