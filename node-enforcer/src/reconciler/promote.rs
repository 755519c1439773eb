//! Promotion of fast-attached interfaces to links (see
//! `datapath::AttachMode`): a pod-up attaches by filters, which costs no
//! grace period, and the interface moves to TCX links at the head of its
//! chains once the node is quiet, when each link's grace period (held
//! under RTNL) delays no pod-up and no other plugin of the chain.
//!
//! Quiet means no pod-up or pod-down for `quiet`; an interface waits at
//! most `max_wait` while pod-ups keep coming. One interface is promoted
//! per turn of the event loop, so an event waits behind one promotion at
//! most. On shutdown every interface is promoted (`promote_all`), so an
//! older version that knows no filters finds links everywhere.

use std::time::{Duration, Instant};

use super::dump::Counted;
use super::Reconciler;
use crate::datapath::Datapath;

/// How long the node must go without a pod-up or pod-down before an
/// interface is promoted.
pub const QUIET: Duration = Duration::from_millis(250);
/// The longest an interface stays on filters while pod-ups keep coming.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// After a failed promotion, the next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub(super) struct Promotion {
    pub quiet: Duration,
    pub max_wait: Duration,
    /// The last pod-up or pod-down.
    pub last_pod_event: Option<Instant>,
    /// After a failure: not before then.
    retry_at: Option<Instant>,
    /// The last failure, shown in the dump until a promotion succeeds.
    pub error: Option<String>,
    pub promoted: u64,
}

impl Default for Promotion {
    fn default() -> Self {
        Promotion {
            quiet: QUIET,
            max_wait: MAX_WAIT,
            last_pod_event: None,
            retry_at: None,
            error: None,
            promoted: 0,
        }
    }
}

impl Promotion {
    /// When the oldest of interfaces attached at `oldest` is due, seen at
    /// `now`: once the node was quiet for `quiet`, or it waited `max_wait`,
    /// and not before a retry is due.
    pub fn due_at(&self, oldest: Instant, now: Instant) -> Instant {
        let quiet_at = self.last_pod_event.map_or(now, |t| t + self.quiet);
        let due = quiet_at.min(oldest + self.max_wait);
        match self.retry_at {
            Some(r) => due.max(r),
            None => due,
        }
    }
}

impl<D: Datapath> Reconciler<D> {
    /// Sets how long the node must be quiet before promotions, and the
    /// longest an interface waits for it.
    pub fn with_promotion(mut self, quiet: Duration, max_wait: Duration) -> Self {
        self.promotion.quiet = quiet;
        self.promotion.max_wait = max_wait;
        self
    }

    /// How long until the next promotion is due (zero: now); None when no
    /// interface waits for one.
    pub fn promotion_due_in(&self, now: Instant) -> Option<Duration> {
        let (_, _, oldest) = self.datapath.unpromoted().into_iter().next()?;
        Some(
            self.promotion
                .due_at(oldest, now)
                .saturating_duration_since(now),
        )
    }

    /// Promotes the interface that waited longest.
    pub fn promote_next(&mut self) {
        let Some((ifname, _, _)) = self.datapath.unpromoted().into_iter().next() else {
            return;
        };
        self.promote_one(&ifname);
    }

    fn promote_one(&mut self, ifname: &str) -> bool {
        match self.datapath.promote(ifname).counted(&mut self.health) {
            Ok(()) => {
                self.promotion.retry_at = None;
                self.promotion.error = None;
                self.promotion.promoted += 1;
                true
            }
            Err(e) => {
                let e = format!(
                    "promoting {ifname} from filters to links: {e}; its filters keep enforcing its policy"
                );
                tracing::warn!("{e}");
                self.promotion.retry_at = Some(Instant::now() + RETRY_AFTER);
                self.promotion.error = Some(e);
                false
            }
        }
    }

    /// Promotes every interface now (shutdown); how many are left on
    /// filters.
    pub fn promote_all(&mut self) -> usize {
        for (ifname, _, _) in self.datapath.unpromoted() {
            self.promote_one(&ifname);
        }
        self.datapath.unpromoted().len()
    }

    /// A pod-up or pod-down: the node is not quiet.
    pub(super) fn pod_event(&mut self) {
        self.promotion.last_pod_event = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, PodUp};
    use super::*;
    use crate::datapath::fake::FakeDatapath;
    use crate::desired::PodRuntime;
    use palisade_proto::v1::{NodeState, PlanSnapshot, PodPolicy, PodRef};

    fn fast_node() -> Reconciler<FakeDatapath> {
        let mut dp = FakeDatapath::with_interfaces(&["veth-a", "veth-b"]);
        dp.fast_attach = true;
        let mut r = Reconciler::new("n1".into(), "e1".into(), dp);
        let pods = ["a", "b"]
            .iter()
            .map(|n| PodPolicy {
                pod: Some(PodRef {
                    namespace: "x".into(),
                    name: n.to_string(),
                }),
                ..Default::default()
            })
            .collect();
        let plan = super::super::PlanMessage::Snapshot(PlanSnapshot {
            version: 1,
            pods,
            source_synced: true,
            ..Default::default()
        });
        r.apply_plan(plan).unwrap();
        r
    }

    fn runtime(name: &str, iface: &str) -> PodRuntime {
        PodRuntime {
            container_id: format!("c-{name}"),
            netns: String::new(),
            host_interfaces: vec![iface.into()],
            ips: vec![],
            ifindexes: Default::default(),
            mode: None,
        }
    }

    fn up(r: &mut Reconciler<FakeDatapath>, name: &str, iface: &str) {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        r.handle(Event::PodUp(
            PodUp {
                pod: ("x".into(), name.into()),
                runtime: runtime(name, iface),
            },
            tx,
        ));
        rx.try_recv().expect("answered at once").expect("pod up");
    }

    fn attachment(r: &Reconciler<FakeDatapath>, iface: &str) -> &'static str {
        r.dump()
            .interfaces
            .iter()
            .find(|i| i.name == iface)
            .expect("listed")
            .attachment
    }

    #[test]
    fn a_pod_up_waits_on_filters_for_a_quiet_node_then_its_interface_gets_links() {
        let mut r =
            fast_node().with_promotion(Duration::from_secs(3600), Duration::from_secs(7200));
        up(&mut r, "a", "veth-a");
        assert_eq!(attachment(&r, "veth-a"), "filters");
        let now = Instant::now();
        let due = r.promotion_due_in(now).expect("one interface waits");
        assert!(
            due > Duration::from_secs(3500),
            "not before the node is quiet: {due:?}"
        );
        // The oldest goes first, one a turn.
        up(&mut r, "b", "veth-b");
        r.promote_next();
        assert_eq!(attachment(&r, "veth-a"), "links");
        assert_eq!(attachment(&r, "veth-b"), "filters");
        assert_eq!(r.promote_all(), 0);
        assert_eq!(attachment(&r, "veth-b"), "links");
        assert_eq!(r.promotion_due_in(Instant::now()), None);
        r.datapath.assert_no_violations();
    }

    #[test]
    fn a_failed_promotion_keeps_the_filters_shows_why_and_is_retried_later() {
        let mut r = fast_node().with_promotion(Duration::ZERO, Duration::ZERO);
        up(&mut r, "a", "veth-a");
        r.datapath.fail.insert("promote veth-a".into());
        assert_eq!(r.promote_all(), 1, "left on filters");
        assert_eq!(attachment(&r, "veth-a"), "filters");
        let warnings = r.dump().warnings;
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("promoting veth-a from filters to links")
                    && w.contains("its filters keep enforcing")),
            "{warnings:?}"
        );
        let due = r.promotion_due_in(Instant::now()).expect("still waiting");
        assert!(
            due > Duration::from_millis(500),
            "not retried at once: {due:?}"
        );
        r.datapath.fail.clear();
        r.promote_all();
        assert_eq!(attachment(&r, "veth-a"), "links");
        assert!(r.dump().warnings.is_empty());
    }

    #[test]
    fn the_event_loop_promotes_once_the_node_is_quiet() {
        let r = fast_node().with_promotion(Duration::from_millis(1), Duration::from_secs(3600));
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (state_tx, _state) = tokio::sync::watch::channel(NodeState::default());
        let thread = std::thread::spawn(move || r.run(rx, state_tx));
        let (reply, answer) = tokio::sync::oneshot::channel();
        tx.blocking_send(Event::PodUp(
            PodUp {
                pod: ("x".into(), "a".into()),
                runtime: runtime("a", "veth-a"),
            },
            reply,
        ))
        .unwrap();
        answer.blocking_recv().unwrap().expect("pod up");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (reply, dump) = tokio::sync::oneshot::channel();
            tx.blocking_send(Event::Dump(reply)).unwrap();
            let d = dump.blocking_recv().unwrap();
            if d.interfaces.iter().all(|i| i.attachment == "links") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never promoted: {:?}",
                d.interfaces
            );
            std::thread::yield_now();
        }
        drop(tx);
        thread.join().unwrap();
    }

    #[test]
    fn due_once_quiet_or_after_the_longest_wait_and_never_before_a_retry() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Promotion {
            quiet: ms(250),
            max_wait: ms(10_000),
            ..Promotion::default()
        };
        // No pod event since start: due at once.
        assert_eq!(p.due_at(t0, t0), t0);
        // A pod event pushes it to quiet after that event...
        p.last_pod_event = Some(t0 + ms(100));
        assert_eq!(p.due_at(t0, t0 + ms(100)), t0 + ms(350));
        // ...but never past the longest wait of the oldest.
        p.last_pod_event = Some(t0 + ms(9_900));
        assert_eq!(p.due_at(t0, t0 + ms(9_900)), t0 + ms(10_000));
        // A failure holds the next try back.
        p.last_pod_event = None;
        p.retry_at = Some(t0 + ms(1_000));
        assert_eq!(p.due_at(t0, t0), t0 + ms(1_000));
    }
}
