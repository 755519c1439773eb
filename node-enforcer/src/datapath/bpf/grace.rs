//! RCU grace periods for the datapath's writers: a point after which every
//! BPF program that was running when it was asked for has returned (TC
//! programs and BPF_PROG_TEST_RUN run inside RCU read-side sections).
//!
//! `membarrier(MEMBARRIER_CMD_GLOBAL)` is `synchronize_rcu()`. One thread
//! runs them back to back while anyone waits, numbered, so writers share
//! them: [`Grace::token`] names the moment of a write, and
//! [`Grace::passed`] / [`Grace::wait_past`] say whether a whole grace
//! period has run since. A kernel without it (nohz_full) answers every wait
//! with an error and `passed` never becomes true: what waits for one then
//! never happens, which is slower or refused, never unsafe.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::err;
use crate::datapath::{DatapathError, DatapathErrorKind, Result};

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;

fn grace_period() -> std::io::Result<()> {
    // SAFETY: membarrier takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn grace_periods_available() -> bool {
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
    r >= 0 && r & libc::c_long::from(MEMBARRIER_CMD_GLOBAL) != 0
}

struct State {
    /// Grace periods begun and finished; the one numbered n begins after
    /// `started` became n.
    started: u64,
    completed: u64,
    /// Run grace periods until `completed` reaches this.
    wanted: u64,
    /// Why there are none (the thread has stopped).
    unavailable: Option<String>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) struct Grace {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Grace {
    pub(crate) fn start() -> Result<Arc<Self>> {
        let unavailable = (!grace_periods_available())
            .then(|| "membarrier(MEMBARRIER_CMD_GLOBAL) is unavailable (nohz_full?)".to_string());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                started: 0,
                completed: 0,
                wanted: 0,
                unavailable: unavailable.clone(),
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let thread = match unavailable {
            Some(why) => {
                tracing::warn!(
                    "{why}: endpoints stay off their home slots and retired slots are not reused"
                );
                None
            }
            None => {
                let shared = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("grace".into())
                        .spawn(move || run(&shared))
                        .map_err(|e| err("starting the grace period thread", e))?,
                )
            }
        };
        Ok(Arc::new(Grace { shared, thread }))
    }

    /// The moment of a write: a grace period numbered above the token
    /// begins after this call.
    pub(crate) fn token(&self) -> u64 {
        self.shared.lock().started
    }

    /// Has a whole grace period run since `token`?
    pub(crate) fn passed(&self, token: u64) -> bool {
        self.shared.lock().completed > token
    }

    /// Asks for a grace period past `token` without waiting for it.
    pub(crate) fn ask(&self, token: u64) {
        let mut s = self.shared.lock();
        if s.wanted <= token {
            s.wanted = token + 1;
            self.shared.changed.notify_all();
        }
    }

    /// Returns once a whole grace period has run since `token` (at once
    /// when one has).
    pub(crate) fn wait_past(&self, token: u64) -> Result<()> {
        let mut s = self.shared.lock();
        if s.wanted <= token {
            s.wanted = token + 1;
            self.shared.changed.notify_all();
        }
        while s.completed <= token {
            if let Some(why) = &s.unavailable {
                // The kernel has none to give (nohz_full).
                return Err(DatapathError::new(
                    DatapathErrorKind::Kernel,
                    format!("waiting for an RCU grace period: {why}"),
                ));
            }
            s = self
                .shared
                .changed
                .wait(s)
                .unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }

    /// Blocks until `completed` moves past `seen` or the engine stops
    /// (for threads that act on finished grace periods); returns the new
    /// count.
    pub(crate) fn wait_change(&self, seen: u64) -> u64 {
        let mut s = self.shared.lock();
        while s.completed == seen && s.unavailable.is_none() && !s.stop {
            s = self
                .shared
                .changed
                .wait(s)
                .unwrap_or_else(|p| p.into_inner());
        }
        s.completed
    }

    pub(crate) fn stopped(&self) -> bool {
        let s = self.shared.lock();
        s.stop || s.unavailable.is_some()
    }
}

impl Drop for Grace {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared) {
    loop {
        let n = {
            let mut s = shared.lock();
            while s.completed >= s.wanted && !s.stop {
                s = shared.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            if s.stop {
                return;
            }
            s.started += 1;
            s.started
        };
        let result = grace_period();
        let mut s = shared.lock();
        match result {
            Ok(()) => s.completed = n,
            Err(e) => {
                tracing::warn!(error = %e, "grace periods failed; none will be waited for");
                s.unavailable = Some(format!("membarrier(MEMBARRIER_CMD_GLOBAL): {e}"));
                shared.changed.notify_all();
                return;
            }
        }
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_passed_only_after_a_grace_period_that_began_later() {
        let g = Grace::start().unwrap();
        assert!(
            !g.stopped(),
            "membarrier(MEMBARRIER_CMD_GLOBAL) unavailable"
        );
        let t = g.token();
        assert!(!g.passed(t));
        g.wait_past(t).unwrap();
        assert!(g.passed(t));
        // A token taken now needs a grace period that begins later still.
        let u = g.token();
        assert!(!g.passed(u));
        g.wait_past(u).unwrap();
        assert!(g.passed(u));
    }
}
