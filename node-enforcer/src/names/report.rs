//! What the learner tells the state dump and the metrics: asked of the
//! learner task itself (a request answered between two records), so that
//! a learner that stopped is seen as stopped, not as a stale copy.

use std::net::IpAddr;

use tokio::sync::{mpsc, oneshot};

use super::learner::Counters;

/// An address learned for a pod: until when (CLOCK_BOOTTIME, ns) its new
/// flows are judged by the rules it was learned for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedAddr {
    pub addr: IpAddr,
    pub expiry: u64,
}

/// What one pod (by its host interface) has learned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodReport {
    pub ifindex: u32,
    /// Each learned name with its addresses, by name.
    pub names: Vec<(String, Vec<LearnedAddr>)>,
    /// Entries a previous enforcer process learned, kept until they expire:
    /// their names are not known to this one.
    pub adopted: Vec<LearnedAddr>,
}

/// What the caps pushed out (cumulative): each an answer, a query or a
/// fragment the learner could not keep, never an opening.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evictions {
    pub names: u64,
    pub addrs: u64,
    pub entries: u64,
    pub queries: u64,
    pub fragments: u64,
}

/// The learner as of one request.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// CLOCK_BOOTTIME (ns) when it was taken: expiries are read against it.
    pub now: u64,
    pub counters: Counters,
    pub evicted: Evictions,
    /// Held answers (and fragments) re-injected.
    pub released: u64,
    pub reinject_errors: u64,
    pub write_errors: u64,
    pub pending_queries: usize,
    /// Overlay entries in the datapath: one per (pod, address).
    pub overlay_entries: usize,
    pub pods: Vec<PodReport>,
    /// How long the most recent held frames were held, from the
    /// datapath's copy to their re-injection (the learner's writes come
    /// in between).
    pub holds: Holds,
}

/// Most held frames [`Holds`] keeps.
pub const RECENT_HOLDS: usize = 4096;

/// Hold times of the last [`RECENT_HOLDS`] held frames, in µs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holds {
    recent: std::collections::VecDeque<u32>,
}

impl Holds {
    pub fn record(&mut self, held: std::time::Duration) {
        if self.recent.len() == RECENT_HOLDS {
            self.recent.pop_front();
        }
        self.recent
            .push_back(u32::try_from(held.as_micros()).unwrap_or(u32::MAX));
    }

    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// The `p`th percentile (nearest rank) in µs; 0 when none was held.
    pub fn percentile_us(&self, p: f64) -> u32 {
        let mut sorted: Vec<u32> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return 0;
        }
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }
}

impl Report {
    pub fn names(&self) -> usize {
        self.pods.iter().map(|p| p.names.len()).sum()
    }

    pub fn adopted(&self) -> usize {
        self.pods.iter().map(|p| p.adopted.len()).sum()
    }
}

/// How the learner is asked for its report.
pub type Request = oneshot::Sender<Report>;

/// A running learner, as the dump and the metrics see it.
#[derive(Clone, Debug)]
pub struct Learning {
    /// The DNS servers whose answers teach.
    pub servers: Vec<IpAddr>,
    requests: mpsc::Sender<Request>,
}

/// How long a report may take: the learner answers between two records,
/// so a learner this late is stuck or swamped, and the dump says so rather
/// than wait on it.
pub const REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the learner gave no report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LearnerGone {
    /// Its task ended. Rules by name then allow nothing new (the datapath
    /// passes answers unheld; DNS keeps working).
    #[error("the DNS learner has stopped: rules by domain name allow no new address on this node")]
    Stopped,
    /// It did not answer within [`REPORT_TIMEOUT`].
    #[error("the DNS learner did not answer within {0:?}: it is stuck or swamped")]
    Slow(std::time::Duration),
}

impl Learning {
    pub fn new(servers: Vec<IpAddr>, requests: mpsc::Sender<Request>) -> Self {
        Learning { servers, requests }
    }

    pub async fn report(&self) -> Result<Report, LearnerGone> {
        let ask = async {
            let (tx, rx) = oneshot::channel();
            self.requests
                .send(tx)
                .await
                .map_err(|_| LearnerGone::Stopped)?;
            rx.await.map_err(|_| LearnerGone::Stopped)
        };
        tokio::time::timeout(REPORT_TIMEOUT, ask)
            .await
            .map_err(|_| LearnerGone::Slow(REPORT_TIMEOUT))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_percentiles_are_over_the_recent_holds_only() {
        let mut h = Holds::default();
        assert_eq!(h.percentile_us(99.0), 0);
        for us in 1..=100u64 {
            h.record(std::time::Duration::from_micros(us));
        }
        assert_eq!((h.percentile_us(50.0), h.percentile_us(99.0)), (50, 99));
        assert_eq!(h.percentile_us(100.0), 100);
        for _ in 0..RECENT_HOLDS {
            h.record(std::time::Duration::from_micros(7));
        }
        assert_eq!(h.len(), RECENT_HOLDS);
        assert_eq!(h.percentile_us(100.0), 7, "the old ones are gone");
    }

    #[tokio::test]
    async fn a_learner_that_stopped_or_does_not_answer_is_told_apart() {
        let (tx, rx) = mpsc::channel(1);
        let learning = Learning::new(vec![], tx);
        drop(rx);
        assert_eq!(learning.report().await.unwrap_err(), LearnerGone::Stopped);

        let (tx, _rx) = mpsc::channel(1);
        let learning = Learning::new(vec![], tx);
        tokio::time::pause();
        assert_eq!(
            learning.report().await.unwrap_err(),
            LearnerGone::Slow(REPORT_TIMEOUT)
        );
    }
}
