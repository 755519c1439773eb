//! The reconciler's stall watchdog (issue 18). One event handled for longer
//! than a bound means every pod-up, delete and dump on the node is waiting
//! behind it, so the enforcer's gRPC health says NOT_SERVING until the
//! event is done, and a warning names how long it has been. NOT_SERVING
//! rather than a warning alone: the node cannot start pods meanwhile, which
//! is what health is for; the readiness probe takes the node's enforcer
//! out, and the liveness probe restarts it if the stall outlasts its
//! failure threshold (a restart takes the datapath over unchanged, DESIGN
//! invariant 6).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic_health::server::HealthReporter;

/// How long one event may keep the reconciler before health says
/// NOT_SERVING (`--stall-after-ms`). Big tables are written in slices of a
/// few milliseconds, so an event past this is a bug or a stuck syscall.
pub const STALL_AFTER: Duration = Duration::from_secs(5);

/// How often the watchdog looks.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long the reconciler has been on its current event, when that is
/// longer than `bound`. `busy_since_ms` and `now_ms` are [`now_ms`]
/// readings; `busy_since_ms` is 0 when idle.
pub fn stalled_for(busy_since_ms: u64, now_ms: u64, bound: Duration) -> Option<Duration> {
    if busy_since_ms == 0 {
        return None;
    }
    let busy = Duration::from_millis(now_ms.saturating_sub(busy_since_ms));
    (busy > bound).then_some(busy)
}

/// Milliseconds on the monotonic clock, counted from the first reading in
/// this process: what `busy_since` holds and the watchdog compares with.
/// Not the wall clock: an NTP step backwards would hide a stall, and one
/// forwards would report a stall that never was.
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Watches `busy_since` (the reconciler's) and turns health NOT_SERVING
/// while it is stalled, SERVING again when it is not. Runs until the
/// process ends.
pub async fn watch(busy_since: Arc<AtomicU64>, bound: Duration, health: HealthReporter) {
    let mut stalled = false;
    let mut every = tokio::time::interval(LOOK_EVERY);
    loop {
        every.tick().await;
        match stalled_for(busy_since.load(Ordering::Relaxed), now_ms(), bound) {
            Some(busy) => {
                if !stalled {
                    crate::server::set_not_serving(&health).await;
                }
                // Loud, but once a second at most.
                if !stalled || busy.as_millis() % 1000 < LOOK_EVERY.as_millis() {
                    tracing::warn!(
                        busy_ms = busy.as_millis() as u64,
                        "the reconciler has been on one event for {} ms (more than {} ms): pod-ups, deletes and dumps wait behind it; health says NOT_SERVING",
                        busy.as_millis(),
                        bound.as_millis()
                    );
                }
                stalled = true;
            }
            None if stalled => {
                crate::server::set_serving(&health).await;
                tracing::info!("the reconciler is answering again; health says SERVING");
                stalled = false;
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_event_longer_than_the_bound_is_a_stall() {
        let bound = Duration::from_millis(500);
        assert_eq!(stalled_for(0, 10_000, bound), None, "idle");
        assert_eq!(stalled_for(9_600, 10_000, bound), None);
        assert_eq!(stalled_for(9_500, 10_000, bound), None, "the bound itself");
        assert_eq!(
            stalled_for(9_000, 10_000, bound),
            Some(Duration::from_millis(1000))
        );
        // A clock that went back is not a stall.
        assert_eq!(stalled_for(11_000, 10_000, bound), None);
    }

    #[test]
    fn the_clock_counts_from_the_process_start() {
        let now = now_ms();
        // The wall clock would read some 1.7e12 ms since 1970 here.
        assert!(
            now < 24 * 3600 * 1000,
            "{now} ms: not the process's monotonic clock"
        );
    }
}
