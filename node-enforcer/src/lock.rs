//! One enforcer per node: an exclusive lock on the state directory and the
//! pin root, held for the life of the process. A second instance (a
//! DaemonSet surge rollout, an operator's mistake) waits for it instead of
//! unlinking the live socket, sharing checkpoint files and allocating
//! colliding table ids. The kernel drops the lock when the holder exits,
//! even on SIGKILL.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct Lock {
    _files: Vec<File>,
}

/// Why the node's lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// `action` ("creating state directory", "creating pin root",
    /// "opening", "locking") failed on `path`.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another enforcer still held `path` when the timeout ran out.
    #[error("another enforcer still holds {} after {waited:?}; only one enforcer may own a node", path.display())]
    Held { path: PathBuf, waited: Duration },
    /// The process was asked to exit while it waited.
    #[error("asked to stop while waiting for {}", path.display())]
    Stopped { path: PathBuf },
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LockError + 'a {
    move |source| LockError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn try_lock(f: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a valid, owned descriptor.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether another process holds this node's lock now (an enforcer that
/// starts would wait for it). A lock that cannot be read counts as held:
/// the caller then checks more before waiting, which is the safe side.
pub fn is_held(state_dir: &Path) -> bool {
    match File::open(state_dir.join("enforcer.lock")) {
        // Taken and let go at once (closing the file releases it).
        Ok(f) => !matches!(try_lock(&f), Ok(true)),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// Locks `<state_dir>/enforcer.lock` and the pin root directory, waiting up
/// to `timeout` (None: forever) for another enforcer to let go, or until
/// `stop` is set (the process was asked to exit while it waited).
pub fn acquire(
    state_dir: &Path,
    pin_root: &Path,
    timeout: Option<Duration>,
    stop: &AtomicBool,
) -> Result<Lock, LockError> {
    let had = crate::private::dir(state_dir).map_err(io("creating state directory", state_dir))?;
    crate::private::log_tightened("the state directory", state_dir, had);
    std::fs::create_dir_all(pin_root).map_err(io("creating pin root", pin_root))?;
    let lock_file = state_dir.join("enforcer.lock");
    let files = [
        (
            crate::private::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_file)
                .map_err(io("opening", &lock_file))?,
            lock_file.clone(),
        ),
        (
            File::open(pin_root).map_err(io("opening", pin_root))?,
            pin_root.to_path_buf(),
        ),
    ];
    let started = Instant::now();
    let mut said = false;
    let mut held = Vec::new();
    for (f, path) in files {
        let what = path.display();
        loop {
            match try_lock(&f) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return Err(io("locking", &path)(e)),
            }
            if !said {
                tracing::warn!(lock = %what, "another enforcer holds this node's lock; waiting for it to exit");
                eprintln!(
                    "palisade-enforcer: another enforcer holds {what}; waiting for it to exit"
                );
                said = true;
            }
            if stop.load(Ordering::Relaxed) {
                return Err(LockError::Stopped { path });
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                return Err(LockError::Held {
                    path,
                    waited: started.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(100)); // poll: flock has no timed wait
        }
        held.push(f);
    }
    if said {
        tracing::info!("took over the node's lock");
    }
    Ok(Lock { _files: held })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What decides whether a starting enforcer preflights first.
    #[test]
    fn is_held_says_whether_another_holds_the_lock_and_takes_nothing() {
        let state = tempfile::tempdir().unwrap();
        let pins = tempfile::tempdir().unwrap();
        let go = AtomicBool::new(false);
        assert!(!is_held(state.path()), "no lock file yet");
        let first = acquire(state.path(), pins.path(), Some(Duration::ZERO), &go).unwrap();
        assert!(is_held(state.path()));
        drop(first);
        assert!(!is_held(state.path()));
        // Looking did not keep it: it can be taken at once.
        acquire(state.path(), pins.path(), Some(Duration::ZERO), &go).unwrap();
    }

    #[test]
    fn a_second_holder_waits_and_times_out_with_a_clear_message() {
        let state = tempfile::tempdir().unwrap();
        let pins = tempfile::tempdir().unwrap();
        let go = AtomicBool::new(false);
        let first = acquire(state.path(), pins.path(), Some(Duration::ZERO), &go).unwrap();
        let err = acquire(
            state.path(),
            pins.path(),
            Some(Duration::from_millis(200)),
            &go,
        )
        .err()
        .expect("a second enforcer must not get the lock");
        assert!(matches!(err, LockError::Held { .. }), "{err:?}");
        assert!(err.to_string().contains("another enforcer"), "{err}");
        drop(first);
        acquire(state.path(), pins.path(), Some(Duration::ZERO), &go)
            .expect("free once the first is gone");
    }

    #[test]
    fn the_lock_file_and_state_dir_are_root_only() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let pins = tempfile::tempdir().unwrap();
        drop(
            acquire(
                &state,
                pins.path(),
                Some(Duration::ZERO),
                &AtomicBool::new(false),
            )
            .unwrap(),
        );
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&state.join("enforcer.lock")), 0o600);
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        drop(
            acquire(
                &state,
                pins.path(),
                Some(Duration::ZERO),
                &AtomicBool::new(false),
            )
            .unwrap(),
        );
        assert_eq!(mode(&state), 0o700, "tightened at start");
    }

    /// A waiting enforcer asked to exit stops waiting at once (a surge pod
    /// deleted before the old one let go).
    #[test]
    fn a_waiter_asked_to_stop_gives_up_without_the_lock() {
        let state = tempfile::tempdir().unwrap();
        let pins = tempfile::tempdir().unwrap();
        let go = AtomicBool::new(false);
        let _first = acquire(state.path(), pins.path(), None, &go).unwrap();
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let err = std::thread::scope(|s| {
            let waiter = s.spawn(|| acquire(state.path(), pins.path(), None, &stop));
            // The waiter is in its poll loop by now or soon; either way
            // the flag ends it.
            stop.store(true, Ordering::Relaxed);
            waiter
                .join()
                .unwrap()
                .err()
                .expect("no lock while the first holds it")
        });
        assert!(matches!(err, LockError::Stopped { .. }), "{err:?}");
        assert!(err.to_string().contains("asked to stop"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
