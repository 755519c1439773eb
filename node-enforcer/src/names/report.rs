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
