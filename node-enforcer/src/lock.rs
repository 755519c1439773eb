//! One enforcer per node: an exclusive lock on the state directory and the
//! pin root, held for the life of the process. A second instance (a
//! DaemonSet surge rollout, an operator's mistake) waits for it instead of
//! unlinking the live socket, sharing checkpoint files and allocating
//! colliding table ids. The kernel drops the lock when the holder exits,
//! even on SIGKILL.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct Lock {
    _files: Vec<File>,
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

/// Locks `<state_dir>/enforcer.lock` and the pin root directory, waiting up
/// to `timeout` (None: forever) for another enforcer to let go, or until
/// `stop` is set (the process was asked to exit while it waited).
pub fn acquire(
    state_dir: &Path,
    pin_root: &Path,
    timeout: Option<Duration>,
    stop: &AtomicBool,
) -> Result<Lock, String> {
    let had = crate::private::dir(state_dir)
        .map_err(|e| format!("creating state directory {}: {e}", state_dir.display()))?;
    crate::private::log_tightened("the state directory", state_dir, had);
    std::fs::create_dir_all(pin_root)
        .map_err(|e| format!("creating pin root {}: {e}", pin_root.display()))?;
    let lock_file = state_dir.join("enforcer.lock");
    let files = [
        (
            crate::private::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_file)
                .map_err(|e| format!("opening {}: {e}", lock_file.display()))?,
            lock_file.display().to_string(),
        ),
        (
            File::open(pin_root).map_err(|e| format!("opening {}: {e}", pin_root.display()))?,
            pin_root.display().to_string(),
        ),
    ];
    let started = Instant::now();
    let mut said = false;
    let mut held = Vec::new();
    for (f, what) in files {
        loop {
            match try_lock(&f) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return Err(format!("locking {what}: {e}")),
            }
            if !said {
                tracing::warn!(lock = %what, "another enforcer holds this node's lock; waiting for it to exit");
                eprintln!(
                    "palisade-enforcer: another enforcer holds {what}; waiting for it to exit"
                );
                said = true;
            }
            if stop.load(Ordering::Relaxed) {
                return Err(format!("asked to stop while waiting for {what}"));
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                return Err(format!(
                    "another enforcer still holds {what} after {:?}; only one enforcer may own a node",
                    started.elapsed()
                ));
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
        assert!(err.contains("another enforcer"), "{err}");
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
        assert!(err.contains("asked to stop"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
