//! `palisade-cni install --watch`: the DaemonSet's `cni-watch` container.
//!
//! A primary CNI's installer rewrites its own configuration when its agent
//! restarts (flannel's, the AWS VPC CNI's), and a vendor may add a file
//! that sorts before it; either drops palisade-cni from the chain the
//! runtime uses, and the pods that start after that get no enforcement at
//! all, in strict mode too. So the watch installs as `install` does, then
//! watches the conf dir (and the directory a symlinked file points into)
//! with inotify and runs the same install again after every change, and
//! every [`POLL_EVERY`] besides, for what inotify cannot see.
//!
//! It settles: an install that finds our entry in place writes nothing, so
//! the events of its own write lead to one more pass and no further. Two
//! watches (a rollout's old and new pod) settle too: a re-chain keeps any
//! single entry of ours that is last ([`Keep::AnyOfOurs`]).
//!
//! A failed pass is reported and tried again at the next change and within
//! [`POLL_EVERY`]; only options the plugin would refuse end it (no change
//! of the node can fix them), and the stop fd (SIGTERM's signalfd in the
//! binary) ends it cleanly.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::install::{self, Chained, InstallError, Installed, Keep, Options, PLUGIN_TYPE};

/// How long the watch waits for a change before it checks anyway.
pub const POLL_EVERY: Duration = Duration::from_secs(10);

/// After a change, how long the conf dir must stay quiet before the watch
/// reads it, and the most it waits for that: an installer that writes its
/// file in place (truncate, write, close), or several files in a row, is
/// read once it is done rather than half way.
const QUIET: Duration = Duration::from_millis(50);
const QUIET_AT_MOST: Duration = Duration::from_secs(1);

/// A failure that repeats word for word is reported again after this long
/// (not at every change and every poll).
const REPEAT_AFTER: Duration = Duration::from_secs(300);

/// Everything that can change which file the runtime uses or what it says.
fn dir_events() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// What started a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    Start,
    /// inotify reported changes.
    Changed,
    /// [`POLL_EVERY`] passed without one.
    Poll,
}

/// One install of the watch, as its observer sees it.
#[derive(Debug)]
pub struct Pass {
    pub wake: Wake,
    /// The names the changes were about (the watched directory's own
    /// events have none).
    pub names: Vec<OsString>,
    pub result: Result<Installed, InstallError>,
    /// What to log about it; empty when nothing changed.
    pub log: Vec<String>,
}

impl Pass {
    /// Whether the pass wrote anything (the binary or the file).
    pub fn wrote(&self) -> bool {
        matches!(&self.result, Ok(done) if done.wrote)
    }
}

/// Installs as `install` does, then again after every change of the conf
/// dir and every `poll_every`, until `stop` is readable (or hung up).
/// `observe` sees every pass (the binary logs [`Pass::log`]).
pub fn watch(
    opts: &Options,
    own_binary: &Path,
    stop: BorrowedFd<'_>,
    poll_every: Duration,
    observe: &mut dyn FnMut(&Pass),
) -> Result<(), InstallError> {
    // No change of the node makes options the plugin refuses work.
    install::checked_entry(opts)?;
    let (mut watches, mut notes) = Watches::new(poll_every);
    let mut wake = Wake::Start;
    let mut names = Vec::new();
    let mut installed_once = false;
    // The last failure reported, and when.
    let mut failed: Option<(String, Instant)> = None;
    loop {
        // Before the install reads: a change after its read wakes the next pass.
        notes.extend(watches.update(&dirs_to_watch(opts)));
        // Until one install has put our own options in place, exactly them.
        let keep = if installed_once {
            Keep::AnyOfOurs
        } else {
            Keep::OnlyOurs
        };
        let result = install::install_with(opts, own_binary, keep, &mut |_| {});
        let mut log = std::mem::take(&mut notes);
        match &result {
            Ok(done) if !installed_once => {
                log.extend(done.lines.iter().cloned());
                log.push(format!(
                    "watching {} for changes (and checking every {poll_every:?})",
                    watches.describe(&opts.conf_dir)
                ));
                installed_once = true;
                failed = None;
            }
            Ok(done) => {
                log.extend(rechained(done));
                if failed.take().is_some() && log.is_empty() {
                    log.push(format!("{}: {PLUGIN_TYPE} is chained", done.file));
                }
            }
            Err(e) => {
                let text = e.to_string();
                let repeat = failed
                    .as_ref()
                    .is_some_and(|(last, at)| *last == text && at.elapsed() < REPEAT_AFTER);
                if !repeat {
                    log.push(format!(
                        "{text} (trying again at the next change, and within {poll_every:?})"
                    ));
                    failed = Some((text, Instant::now()));
                }
            }
        }
        observe(&Pass {
            wake,
            names: std::mem::take(&mut names),
            result,
            log,
        });
        match wait(&watches, stop, poll_every)? {
            Woken::Stop => return Ok(()),
            Woken::Changed(changed) => {
                wake = Wake::Changed;
                names = changed;
            }
            Woken::Timeout => wake = Wake::Poll,
        }
    }
}

/// What a re-chain that wrote says about it.
fn rechained(done: &Installed) -> Vec<String> {
    let mut log: Vec<String> = done
        .lines
        .iter()
        .filter(|l| l.ends_with(": installed"))
        .map(|l| format!("{l} again (it was missing or not this binary)"))
        .collect();
    match done.chained {
        Chained::Already => {}
        Chained::Appended => log.push(format!(
            "{PLUGIN_TYPE} was missing from {}: chained again",
            done.file
        )),
        Chained::Replaced => log.push(format!(
            "{PLUGIN_TYPE} was not alone and last in {}: chained again",
            done.file
        )),
    }
    log
}

/// The conf dir, and the directory the runtime's file points into when it
/// is a symlink (a vendor's agent may rewrite it there).
fn dirs_to_watch(opts: &Options) -> Vec<PathBuf> {
    let mut dirs = vec![opts.conf_dir.clone()];
    let target = install::config_path(opts).and_then(|p| install::resolve(&p));
    if let Some(parent) = target.ok().as_deref().and_then(Path::parent) {
        if parent != opts.conf_dir && !parent.as_os_str().is_empty() {
            dirs.push(parent.to_path_buf());
        }
    }
    dirs
}

/// The inotify instance and what it watches. Without one (the node's
/// `fs.inotify.max_user_instances` reached), the watch polls only.
struct Watches {
    inotify: Option<Inotify>,
    watched: Vec<(PathBuf, WatchDescriptor)>,
    poll_every: Duration,
    /// What could not be watched last time, so that it is reported once.
    failed: Option<String>,
}

impl Watches {
    fn new(poll_every: Duration) -> (Self, Vec<String>) {
        let (inotify, notes) = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        {
            Ok(i) => (Some(i), Vec::new()),
            Err(e) => (
                None,
                vec![format!(
                    "cannot watch for changes (inotify_init1: {e}; see fs.inotify.max_user_instances): \
                     checking every {poll_every:?} only"
                )],
            ),
        };
        let watches = Watches {
            inotify,
            watched: Vec::new(),
            poll_every,
            failed: None,
        };
        (watches, notes)
    }

    /// Watches `dirs` and no others (a directory removed and made again
    /// is a new inode, watched anew); a note when what cannot be watched
    /// changed.
    fn update(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let inotify = self.inotify.as_ref()?;
        let mut now = Vec::new();
        let mut failures = Vec::new();
        for dir in dirs {
            match inotify.add_watch(dir.as_path(), dir_events()) {
                Ok(wd) => now.push((dir.clone(), wd)),
                Err(e) => failures.push(format!("{}: {e}", dir.display())),
            }
        }
        for (_, wd) in &self.watched {
            if !now.iter().any(|(_, w)| w == wd) {
                // Gone already when its directory was removed.
                let _ = inotify.rm_watch(*wd);
            }
        }
        self.watched = now;
        let failed = (!failures.is_empty()).then(|| {
            format!(
                "cannot watch {}: checking every {:?} until it can",
                failures.join(", "),
                self.poll_every
            )
        });
        if failed == self.failed {
            return None;
        }
        let was = std::mem::replace(&mut self.failed, failed.clone());
        failed.or_else(|| was.map(|_| format!("watching {} again", self.describe(&dirs[0]))))
    }

    fn describe(&self, conf_dir: &Path) -> String {
        let dirs: Vec<String> = self
            .watched
            .iter()
            .map(|(d, _)| d.display().to_string())
            .collect();
        if dirs.is_empty() {
            conf_dir.display().to_string()
        } else {
            dirs.join(" and ")
        }
    }
}

enum Woken {
    Stop,
    /// The names of the changes (after the conf dir went quiet).
    Changed(Vec<OsString>),
    Timeout,
}

/// Waits for `stop`, a change (then until [`QUIET`] passes without one,
/// at most [`QUIET_AT_MOST`]), or `timeout`.
fn wait(watches: &Watches, stop: BorrowedFd<'_>, timeout: Duration) -> Result<Woken, InstallError> {
    let deadline = Instant::now() + timeout;
    let mut changed: Vec<OsString> = Vec::new();
    // The first change, and the last.
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    loop {
        let now = Instant::now();
        let until = match first {
            None => deadline,
            Some(first) => (last + QUIET).min(first + QUIET_AT_MOST),
        };
        let left = until.saturating_duration_since(now);
        let mut fds = vec![PollFd::new(stop, PollFlags::POLLIN)];
        if let Some(inotify) = &watches.inotify {
            fds.push(PollFd::new(inotify.as_fd(), PollFlags::POLLIN));
        }
        // Rounded up: a timeout rounded down to 0 ms would spin until it passes.
        let millis = left.as_nanos().div_ceil(1_000_000);
        match poll(
            &mut fds,
            PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(InstallError::Io(format!("waiting for changes (poll): {e}"))),
        }
        if fds[0].any() == Some(true) {
            return Ok(Woken::Stop);
        }
        let readable = fds.get(1).is_some_and(|f| f.any() == Some(true));
        drop(fds);
        if readable {
            if let Some(inotify) = &watches.inotify {
                let before = changed.len();
                drain(inotify, &mut changed)?;
                if changed.len() > before {
                    // Read now, not `now`: that was before the poll, which
                    // may have waited seconds for this change.
                    last = Instant::now();
                    first.get_or_insert(last);
                }
            }
            continue;
        }
        let now = Instant::now();
        if first.is_some() && now >= until {
            return Ok(Woken::Changed(changed));
        }
        if first.is_none() && now >= deadline {
            return Ok(Woken::Timeout);
        }
    }
}

/// Reads every queued event; their names into `names` (an event on the
/// watched directory itself has none: its path then).
fn drain(inotify: &Inotify, names: &mut Vec<OsString>) -> Result<(), InstallError> {
    loop {
        match inotify.read_events() {
            Ok(events) => {
                for e in events {
                    names.push(e.name.unwrap_or_else(|| OsString::from(".")));
                }
            }
            Err(Errno::EAGAIN) => return Ok(()),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(InstallError::Io(format!("reading inotify events: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;

    use serde_json::{json, Value};

    use super::super::test_fixtures::{self, flannel, SOCKET};

    /// How long a test waits for the watch to do something; far above what
    /// it takes (tens of milliseconds), so a loaded machine does not fail it.
    const DEADLINE: Duration = Duration::from_secs(20);

    /// A pass as the test sees it.
    #[derive(Debug, Clone)]
    struct Seen {
        wake: Wake,
        names: Vec<String>,
        wrote: bool,
        file: Option<String>,
        chained: Option<Chained>,
        error: Option<String>,
        log: Vec<String>,
    }

    /// A watch running on a thread of its own.
    struct Running {
        stop: UnixStream,
        passes: mpsc::Receiver<Seen>,
        thread: std::thread::JoinHandle<Result<(), InstallError>>,
        /// Every pass received so far.
        seen: Vec<Seen>,
    }

    impl Running {
        fn start(opts: &Options, own: &Path, poll_every: Duration) -> Running {
            let (stop, theirs) = UnixStream::pair().unwrap();
            let (tx, passes) = mpsc::channel();
            let (opts, own) = (opts.clone(), own.to_path_buf());
            let thread = std::thread::spawn(move || {
                watch(&opts, &own, theirs.as_fd(), poll_every, &mut |pass| {
                    let _ = tx.send(Seen {
                        wake: pass.wake,
                        names: pass
                            .names
                            .iter()
                            .map(|n| n.to_string_lossy().into_owned())
                            .collect(),
                        wrote: pass.wrote(),
                        file: pass.result.as_ref().ok().map(|d| d.file.clone()),
                        chained: pass.result.as_ref().ok().map(|d| d.chained),
                        error: pass.result.as_ref().err().map(|e| e.to_string()),
                        log: pass.log.clone(),
                    });
                })
            });
            Running {
                stop,
                passes,
                thread,
                seen: Vec::new(),
            }
        }

        /// The passes from now up to the first that `until` accepts.
        fn passes_until(&mut self, what: &str, until: impl Fn(&Seen) -> bool) -> Vec<Seen> {
            let deadline = Instant::now() + DEADLINE;
            let mut got = Vec::new();
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.passes.recv_timeout(left) {
                    Ok(seen) => {
                        self.seen.push(seen.clone());
                        let done = until(&seen);
                        got.push(seen);
                        if done {
                            return got;
                        }
                    }
                    Err(_) => panic!("no pass {what} within {DEADLINE:?}; passes: {got:#?}"),
                }
            }
        }

        /// Stops it as SIGTERM does; it must end cleanly, at once.
        fn finish(mut self) -> Vec<Seen> {
            self.stop.write_all(b"x").unwrap();
            let deadline = Instant::now() + DEADLINE;
            while !self.thread.is_finished() {
                assert!(Instant::now() < deadline, "the watch did not stop");
                // Drained meanwhile, so the sender never blocks it.
                if let Ok(seen) = self.passes.recv_timeout(Duration::from_millis(10)) {
                    self.seen.push(seen);
                }
            }
            self.thread.join().unwrap().unwrap();
            self.seen.extend(self.passes.try_iter());
            self.seen
        }
    }

    /// The install tests' node, with the options of `install --watch`.
    fn node() -> (tempfile::TempDir, Options, PathBuf) {
        let (dir, opts, own) = test_fixtures::node(&flannel());
        (
            dir,
            Options {
                watch: true,
                ..opts
            },
            own,
        )
    }

    /// As flannel's and most agents' installers do: a new file renamed over.
    fn write_by_rename(path: &Path, conf: &Value) {
        let tmp = path.with_extension("vendor-tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(conf).unwrap()).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    fn types(path: &Path) -> Vec<String> {
        let conf: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        conf["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap().to_string())
            .collect()
    }

    fn started(w: &mut Running) -> Seen {
        let first = w.passes_until("at start", |_| true).remove(0);
        assert_eq!(first.wake, Wake::Start);
        assert!(first.error.is_none(), "{first:?}");
        first
    }

    #[test]
    fn a_rewrite_without_our_entry_is_chained_again() {
        let (_dir, opts, own) = node();
        let file = opts.conf_dir.join("10-flannel.conflist");
        let mut w = Running::start(&opts, &own, POLL_EVERY);
        let first = started(&mut w);
        assert_eq!(first.chained, Some(Chained::Appended), "{first:?}");
        assert!(first
            .log
            .iter()
            .any(|l| l.ends_with("10-flannel.conflist: updated")));
        assert_eq!(types(&file), ["flannel", "portmap", PLUGIN_TYPE]);

        // In place (truncate, write, close), as `cp` does; then by rename.
        fn in_place(path: &Path, conf: &Value) {
            std::fs::write(path, serde_json::to_vec(conf).unwrap()).unwrap()
        }
        for write in [in_place, write_by_rename] {
            write(&file, &flannel());
            let passes = w.passes_until("re-chaining it", |p| p.chained == Some(Chained::Appended));
            let pass = passes.last().unwrap();
            assert_eq!(pass.wake, Wake::Changed, "{passes:#?}");
            let want = format!(
                "{PLUGIN_TYPE} was missing from {}: chained again",
                file.display()
            );
            assert_eq!(pass.log, [want], "{passes:#?}");
            assert_eq!(types(&file), ["flannel", "portmap", PLUGIN_TYPE]);
        }
        w.finish();
    }

    /// Its own write wakes it once more, and that pass writes nothing: a
    /// change after it (a file nobody reads) finds every pass since the
    /// re-chain a no-op and the file the same inode.
    #[test]
    fn its_own_writes_do_not_make_it_write_again() {
        let (_dir, opts, own) = node();
        let file = opts.conf_dir.join("10-flannel.conflist");
        let mut w = Running::start(&opts, &own, POLL_EVERY);
        started(&mut w);
        for round in 0..3 {
            write_by_rename(&file, &flannel());
            w.passes_until("re-chaining it", |p| p.wrote);
            let chained = std::fs::metadata(&file).unwrap();
            // Its write's events are queued before the re-chain is
            // reported; the sentinel's after them.
            let sentinel = format!("README-{round}");
            std::fs::write(opts.conf_dir.join(&sentinel), b"").unwrap();
            let after = w.passes_until("after the sentinel", |p| p.names.contains(&sentinel));
            assert!(after.iter().all(|p| !p.wrote), "{after:#?}");
            // Its own write did wake it (else this proves nothing).
            let own_events = after
                .iter()
                .flat_map(|p| &p.names)
                .any(|n| n == "10-flannel.conflist");
            assert!(own_events, "{after:#?}");
            let now = std::fs::metadata(&file).unwrap();
            assert_eq!(
                (now.ino(), now.mtime_nsec()),
                (chained.ino(), chained.mtime_nsec())
            );
        }
        let seen = w.finish();
        assert_eq!(seen.iter().filter(|p| p.wrote).count(), 4, "{seen:#?}");
    }

    #[test]
    fn a_new_file_that_sorts_first_is_chained_too() {
        let (_dir, opts, own) = node();
        let mut w = Running::start(&opts, &own, POLL_EVERY);
        started(&mut w);
        let mut vendor = flannel();
        vendor["name"] = json!("vendor");
        let first = opts.conf_dir.join("05-vendor.conflist");
        write_by_rename(&first, &vendor);
        let passes = w.passes_until("chaining the new file", |p| {
            p.chained == Some(Chained::Appended)
        });
        let pass = passes.last().unwrap();
        assert_eq!(pass.file.as_deref(), first.to_str());
        assert_eq!(
            pass.log,
            [format!(
                "{PLUGIN_TYPE} was missing from {}: chained again",
                first.display()
            )]
        );
        assert_eq!(types(&first), ["flannel", "portmap", PLUGIN_TYPE]);
        // The file the runtime no longer reads keeps its entry.
        assert_eq!(
            types(&opts.conf_dir.join("10-flannel.conflist")),
            ["flannel", "portmap", PLUGIN_TYPE]
        );
        w.finish();
    }

    #[test]
    fn a_failed_pass_is_reported_once_and_tried_again_at_the_next_change() {
        let (_dir, opts, own) = node();
        let mut w = Running::start(&opts, &own, POLL_EVERY);
        started(&mut w);
        let broken = opts.conf_dir.join("00-broken.conflist");
        std::fs::write(&broken, b"{\"plugins\": [").unwrap();
        let passes = w.passes_until("failing", |p| p.error.is_some());
        let failed = passes.last().unwrap();
        let err = failed.error.as_deref().unwrap();
        assert!(err.starts_with(broken.to_str().unwrap()), "{err}");
        assert!(err.contains("not valid JSON"), "{err}");
        assert_eq!(failed.log.len(), 1, "{failed:?}");
        assert!(failed.log[0].contains("trying again"), "{failed:?}");
        // The same failure again: not reported again.
        std::fs::write(opts.conf_dir.join("README"), b"").unwrap();
        let again = w.passes_until("after README", |p| p.names.iter().any(|n| n == "README"));
        let again = again.last().unwrap();
        assert_eq!(again.error.as_deref(), Some(err));
        assert!(again.log.is_empty(), "{again:?}");

        write_by_rename(&broken, &flannel());
        let passes = w.passes_until("chaining it", |p| p.error.is_none());
        assert_eq!(passes.last().unwrap().chained, Some(Chained::Appended));
        assert_eq!(types(&broken), ["flannel", "portmap", PLUGIN_TYPE]);
        w.finish();
    }

    /// A write that keeps failing is retried at every poll and reported
    /// once: the message names the destination, not the temporary file,
    /// whose name is new each time. (Here the temporary file's name, the
    /// list's with 35 more bytes, is too long for the filesystem.)
    #[test]
    fn a_failing_write_is_retried_at_each_poll_and_reported_once() {
        let (_dir, opts, own) = node();
        std::fs::remove_file(opts.conf_dir.join("10-flannel.conflist")).unwrap();
        let long = opts.conf_dir.join(format!("{}.conflist", "a".repeat(240)));
        write_by_rename(&long, &flannel());
        let opts = Options {
            bin_dir: None,
            ..opts
        };
        let mut w = Running::start(&opts, &own, Duration::from_millis(100));
        let mut passes = w.passes_until("at start", |_| true);
        for _ in 0..3 {
            passes.extend(w.passes_until("a poll", |p| p.wake == Wake::Poll));
        }
        let errors: Vec<&str> = passes.iter().filter_map(|p| p.error.as_deref()).collect();
        assert_eq!(errors.len(), passes.len(), "{passes:#?}");
        let want = format!("creating a temporary file for {}", long.display());
        assert!(errors[0].starts_with(&want), "{errors:?}");
        assert!(errors.iter().all(|e| *e == errors[0]), "{errors:?}");
        let logged: Vec<&String> = passes.iter().flat_map(|p| &p.log).collect();
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(passes[0].log[0].contains("trying again"), "{passes:#?}");
        assert_eq!(types(&long), ["flannel", "portmap"]);
        w.finish();
    }

    /// A file behind two symlinks: the watch sees the conf dir and the
    /// final target's directory, not the link in between. Relinking that
    /// one is found by the poll.
    #[test]
    fn what_inotify_cannot_see_is_chained_at_the_next_poll() {
        let (dir, opts, own) = node();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::remove_file(opts.conf_dir.join("10-flannel.conflist")).unwrap();
        write_by_rename(&b.join("x.conflist"), &flannel());
        write_by_rename(&b.join("y.conflist"), &flannel());
        std::os::unix::fs::symlink("../b/x.conflist", a.join("link.conflist")).unwrap();
        std::os::unix::fs::symlink("../a/link.conflist", opts.conf_dir.join("10-x.conflist"))
            .unwrap();
        let poll_every = Duration::from_millis(300);
        let mut w = Running::start(&opts, &own, poll_every);
        let first = started(&mut w);
        let watched = b.canonicalize().unwrap();
        assert!(
            first
                .log
                .last()
                .unwrap()
                .contains(watched.to_str().unwrap()),
            "{first:?}"
        );
        assert_eq!(
            types(&b.join("x.conflist")),
            ["flannel", "portmap", PLUGIN_TYPE]
        );

        // Settled (its own write's events read) before the relink.
        std::fs::write(opts.conf_dir.join("README"), b"").unwrap();
        w.passes_until("after README", |p| p.names.iter().any(|n| n == "README"));
        let tmp = a.join("link.tmp");
        std::os::unix::fs::symlink("../b/y.conflist", &tmp).unwrap();
        std::fs::rename(&tmp, a.join("link.conflist")).unwrap();
        let passes = w.passes_until("chaining y", |p| p.chained == Some(Chained::Appended));
        let pass = passes.last().unwrap();
        assert_eq!(pass.wake, Wake::Poll, "{passes:#?}");
        assert!(
            pass.file.as_deref().unwrap().ends_with("b/y.conflist"),
            "{pass:?}"
        );
        assert_eq!(
            types(&b.join("y.conflist")),
            ["flannel", "portmap", PLUGIN_TYPE]
        );
        w.finish();
    }

    /// A rollout that changes our options runs the old pod's watch and the
    /// new one's side by side: the new one's entry stays, and neither
    /// rewrites the file after the other.
    #[test]
    fn two_watches_with_different_options_settle() {
        let (_dir, old_opts, own) = node();
        let file = old_opts.conf_dir.join("10-flannel.conflist");
        let mut old = Running::start(&old_opts, &own, POLL_EVERY);
        started(&mut old);
        let new_opts = Options {
            timeout_seconds: 20,
            ..old_opts.clone()
        };
        let mut new = Running::start(&new_opts, &own, POLL_EVERY);
        let first = started(&mut new);
        assert_eq!(first.chained, Some(Chained::Replaced), "{first:?}");
        let entry = || {
            let conf: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            conf["plugins"][2].clone()
        };
        assert_eq!(entry(), install::entry(SOCKET, 20));
        let settled = std::fs::metadata(&file).unwrap().ino();
        std::fs::write(new_opts.conf_dir.join("README"), b"").unwrap();
        for w in [&mut old, &mut new] {
            let after = w.passes_until("after README", |p| p.names.iter().any(|n| n == "README"));
            assert!(after.iter().all(|p| !p.wrote), "{after:#?}");
        }
        assert_eq!(std::fs::metadata(&file).unwrap().ino(), settled);
        assert_eq!(entry(), install::entry(SOCKET, 20));
        // Dropped again: whichever gets there first chains its own entry once.
        write_by_rename(&file, &flannel());
        for w in [&mut old, &mut new] {
            w.passes_until("after the rewrite", |p| {
                p.names.iter().any(|n| n == "10-flannel.conflist")
            });
        }
        assert_eq!(types(&file), ["flannel", "portmap", PLUGIN_TYPE]);
        let writes = old
            .finish()
            .iter()
            .chain(&new.finish())
            .filter(|p| p.wrote)
            .count();
        // Each start's, then one re-chain.
        assert_eq!(writes, 3);
    }

    #[test]
    fn options_the_plugin_refuses_end_it_at_once() {
        let (_dir, opts, own) = node();
        let opts = Options {
            timeout_seconds: 0,
            ..opts
        };
        let (_stop, theirs) = UnixStream::pair().unwrap();
        let err = watch(&opts, &own, theirs.as_fd(), POLL_EVERY, &mut |_| {
            panic!("no pass with options the plugin refuses")
        })
        .unwrap_err();
        assert!(matches!(err, InstallError::Usage(_)), "{err}");
        assert!(err.to_string().starts_with("--timeout-seconds"), "{err}");
    }
}
