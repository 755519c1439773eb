//! The pods checkpoint, written on a thread of its own.
//!
//! Why: a checkpoint write is a file, an fsync, a rename and an fsync of
//! the directory, 1.5 to 8 ms on this machine's disk. Written on the
//! reconciler's thread, every pod-up queued behind it waited for the disk
//! (issue 19.6). A pod-up is answered before the checkpoint is written
//! either way (a pod a restart finds no record of keeps what the kernel
//! enforces, see `reconciler::recover`), so nothing waits for the write
//! but the next write and shutdown.
//!
//! Only the newest snapshot matters: one submitted while a write is under
//! way replaces any other waiting, so a burst costs one write after the
//! one in progress (group commit). A failed write is kept for the
//! reconciler to report on its next turn, unless a later write succeeded
//! first.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::desired::{PodKey, PodRuntime};

type Pods = BTreeMap<PodKey, PodRuntime>;

#[derive(Default)]
struct Slot {
    /// The newest snapshot not yet taken by the writer.
    waiting: Option<Pods>,
    /// Snapshots submitted, and written (or failed), so far.
    submitted: u64,
    done: u64,
    /// The last write's failure, until taken or a later write succeeds.
    error: Option<CheckpointError>,
    closing: bool,
    /// The writer is gone (it panicked): callers write in line again and
    /// nobody waits for it.
    stopped: bool,
}

struct Shared {
    slot: Mutex<Slot>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        // A panic while holding the lock leaves plain data behind.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer thread of one checkpoint directory's pods file.
pub struct PodsSaver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl PodsSaver {
    /// Starts the writer. Without a thread (the system refused one) every
    /// save is written by the caller, as before this existed.
    pub fn start(checkpoint: Checkpoint) -> Self {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot::default()),
            changed: Condvar::new(),
        });
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || write_loop(&checkpoint, &theirs))
            .map_err(|e| tracing::warn!("no checkpoint thread ({e}); pods are saved in line"))
            .ok();
        PodsSaver { shared, thread }
    }

    /// Hands `pods` to the writer; returns at once.
    pub fn submit(&self, pods: Pods) {
        let mut slot = self.shared.lock();
        slot.waiting = Some(pods);
        slot.submitted += 1;
        drop(slot);
        self.shared.changed.notify_all();
    }

    /// Waits until everything submitted is on disk (or failed).
    pub fn wait(&self) {
        if self.thread.is_none() {
            return;
        }
        let mut slot = self.shared.lock();
        while slot.done < slot.submitted && !slot.stopped {
            slot = self
                .shared
                .changed
                .wait(slot)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The last failed write since the last call, if any.
    pub fn take_error(&self) -> Option<CheckpointError> {
        self.shared.lock().error.take()
    }

    /// Whether the writer runs (false: the caller writes in line).
    pub fn running(&self) -> bool {
        self.thread.is_some() && !self.shared.lock().stopped
    }
}

impl Drop for PodsSaver {
    /// Writes what is waiting, then stops the thread.
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Marks the writer stopped however its loop ends, a panic included, so a
/// shutdown never waits for a write that will not come.
struct Stopped<'a>(&'a Shared);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.lock().stopped = true;
        self.0.changed.notify_all();
    }
}

fn write_loop(checkpoint: &Checkpoint, shared: &Shared) {
    let _stopped = Stopped(shared);
    let mut slot = shared.lock();
    loop {
        if let Some(pods) = slot.waiting.take() {
            let upto = slot.submitted;
            drop(slot);
            let result = checkpoint.save_pods(&pods);
            slot = shared.lock();
            slot.done = upto;
            // A later write that succeeded makes an earlier failure stale:
            // the file on disk is whole and current again.
            slot.error = result.err();
            shared.changed.notify_all();
            continue;
        }
        if slot.closing {
            return;
        }
        slot = shared.changed.wait(slot).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(n: usize) -> Pods {
        (0..n)
            .map(|i| {
                (
                    ("ns".to_string(), format!("p{i}")),
                    PodRuntime {
                        container_id: format!("c{i}"),
                        netns: String::new(),
                        host_interfaces: vec![format!("veth{i}")],
                        ips: vec![],
                        ifindexes: Default::default(),
                        mode: None,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_newest_snapshot_is_on_disk_once_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let saver = PodsSaver::start(Checkpoint::open(dir.path()).unwrap());
        assert!(saver.running());
        for n in 1..=50 {
            saver.submit(pods(n));
        }
        saver.wait();
        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(saved.pods, pods(50));
        assert!(saver.take_error().is_none());
    }

    #[test]
    fn dropping_the_saver_writes_what_waits() {
        let dir = tempfile::tempdir().unwrap();
        let saver = PodsSaver::start(Checkpoint::open(dir.path()).unwrap());
        saver.submit(pods(3));
        drop(saver);
        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(saved.pods, pods(3));
    }

    #[test]
    fn a_stopped_writer_is_not_waited_for_and_callers_write_in_line() {
        let dir = tempfile::tempdir().unwrap();
        let saver = PodsSaver::start(Checkpoint::open(dir.path()).unwrap());
        // End the loop as a panic would, without dropping the saver.
        saver.shared.lock().closing = true;
        saver.shared.changed.notify_all();
        let mut slot = saver.shared.lock();
        while !slot.stopped {
            slot = saver.shared.changed.wait(slot).unwrap();
        }
        drop(slot);
        assert!(!saver.running(), "the reconciler writes in line now");
        saver.submit(pods(2));
        saver.wait(); // returns: nothing will write it
    }

    #[test]
    fn a_failed_write_is_kept_for_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        // The directory gone: the write cannot create its temp file.
        std::fs::remove_dir_all(dir.path()).unwrap();
        let saver = PodsSaver::start(cp);
        saver.submit(pods(1));
        saver.wait();
        let e = saver.take_error().expect("the write failed");
        assert!(e.to_string().contains("pods.json"), "{e}");
        assert!(saver.take_error().is_none(), "taken once");
    }

    #[test]
    fn a_write_that_succeeds_clears_an_earlier_failure_not_yet_taken() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        std::fs::remove_dir_all(dir.path()).unwrap();
        let saver = PodsSaver::start(cp);
        saver.submit(pods(1));
        saver.wait();
        // The directory is back before the reconciler looked: the next
        // write lands, and the file is current.
        std::fs::create_dir(dir.path()).unwrap();
        saver.submit(pods(2));
        saver.wait();
        assert!(
            saver.take_error().is_none(),
            "a stale failure would be reported as the checkpoint's state"
        );
        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(saved.pods, pods(2));
    }
}
