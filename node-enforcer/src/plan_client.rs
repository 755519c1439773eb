//! Holds the plan stream from the controller: subscribe, hand every message
//! to the reconciler, report realized state back; reconnect with capped
//! exponential backoff when anything breaks, trying the next controller
//! address (a standby refuses with UNAVAILABLE and names the leader).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_proto::v1::{
    plan_service_client::PlanServiceClient, subscribe_response::Update, NodeState,
    ReportStateRequest, SubscribeRequest,
};
use palisade_runtime::transport::{connect_with, source_chain, Address, ClientOptions};
use tokio::sync::watch;

use crate::handle::{Handle, HandleError};
use crate::reconciler::PlanMessage;
use crate::telemetry::{Fetch, Realize, ReportParent};
use palisade_runtime::telemetry::PlanMessageInfo;

/// Why the plan stream ended, or a pod's plan could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum PlanClientError {
    #[error("at least one controller address is required")]
    NoController,
    /// No connection to the controller (the transport's text says why).
    #[error("{0}")]
    Connect(String),
    /// The controller refused the subscription (a standby names the
    /// leader).
    #[error("subscribe: {}", .0.message())]
    Subscribe(#[source] tonic::Status),
    /// The stream broke.
    #[error("receive: {} ({})", .0.message(), source_chain(.0))]
    Receive(#[source] tonic::Status),
    /// The reconciler refused a plan message, or is gone.
    #[error(transparent)]
    Apply(#[from] HandleError),
    /// The controller did not answer for a pod's plan.
    #[error("{}", .0.message())]
    Fetch(#[source] tonic::Status),
    /// A fetched answer came from a deposed controller.
    #[error(
        "answer from leadership term {answer}, older than term {applied} already applied: refused"
    )]
    StaleTerm { answer: u64, applied: u64 },
}

/// Delay before reconnect attempt `n` (0-based): doubling from 100 ms, capped.
pub fn backoff(attempt: u32, cap: Duration) -> Duration {
    let ms = 100u64.saturating_mul(1u64 << attempt.min(16));
    Duration::from_millis(ms).min(cap)
}

/// The wait before trying the next address.
const QUICK_RETRY: Duration = Duration::from_millis(50);

/// Standby refusals in a row retried at once before the backoff applies:
/// the controller's Service sends each new connection to any Ready replica,
/// leader or standby (a Deployment rolls, and a drain evicts, only through
/// Ready replicas, so standbys are Ready too). With two replicas, 16 misses
/// in a row is one chance in 65,536; with no leader at all (an election
/// under way) the backoff takes over.
const STANDBY_QUICK_RETRIES: u32 = 16;

/// How long to wait after failed attempt `attempt` (from 0) over
/// `addresses` controller addresses, the last `standby_refusals` of them in
/// a row refused by a standby.
fn retry_delay(attempt: u32, addresses: u32, standby_refusals: u32) -> Duration {
    let addresses = addresses.max(1);
    if (1..=STANDBY_QUICK_RETRIES).contains(&standby_refusals)
        || attempt % addresses != addresses - 1
    {
        QUICK_RETRY
    } else {
        // Each full round of addresses doubles the wait.
        backoff(attempt / addresses, Duration::from_secs(5))
    }
}

/// The controller addresses, the one in use, and the highest leadership
/// term applied (shared by the stream, the reports and the fetches).
#[derive(Clone)]
pub struct Controllers {
    addrs: Arc<Vec<Address>>,
    current: Arc<AtomicUsize>,
    options: ClientOptions,
    term: Arc<AtomicU64>,
    /// The traced realization the next report describes.
    report_parent: ReportParent,
}

impl Controllers {
    /// `term`: the highest term already applied (from the checkpoint).
    pub fn new(
        addrs: Vec<Address>,
        options: ClientOptions,
        term: u64,
    ) -> Result<Self, PlanClientError> {
        if addrs.is_empty() {
            return Err(PlanClientError::NoController);
        }
        Ok(Controllers {
            addrs: Arc::new(addrs),
            current: Arc::new(AtomicUsize::new(0)),
            options,
            term: Arc::new(AtomicU64::new(term)),
            report_parent: ReportParent::default(),
        })
    }

    /// The address in use and its index.
    pub fn current(&self) -> (usize, &Address) {
        let i = self.current.load(Ordering::Relaxed) % self.addrs.len();
        (i, &self.addrs[i])
    }

    /// Moves on from address `i`, unless someone already has.
    pub fn failed(&self, i: usize) {
        let next = (i + 1) % self.addrs.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    async fn connect(&self, timeout: Duration) -> Result<(usize, Channel), PlanClientError> {
        let (i, addr) = self.current();
        match connect_with(addr, timeout, &self.options).await {
            Ok(c) => Ok((i, c)),
            Err(e) => {
                self.failed(i);
                Err(PlanClientError::Connect(e))
            }
        }
    }

    /// The highest term applied.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Relaxed)
    }

    fn applied(&self, term: u64) {
        self.term.fetch_max(term, Ordering::Relaxed);
    }
}

use tonic::transport::Channel;

/// `reachable` is notified when something else (an on-demand fetch) got an
/// answer from the controller: the stream then retries at once instead of
/// sleeping out its backoff.
pub async fn run(
    controllers: Controllers,
    node: String,
    enforcer_id: String,
    handle: Handle,
    mut shutdown: watch::Receiver<bool>,
    reachable: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut attempt = 0u32;
    let mut standby_refusals = 0u32;
    loop {
        let (i, controller) = controllers.current();
        let controller = controller.clone();
        let outcome = stream_once(&controllers, &node, &enforcer_id, &handle, &mut attempt).await;
        standby_refusals = match &outcome {
            Err(PlanClientError::Subscribe(s)) if palisade_proto::is_standby_refusal(s) => {
                standby_refusals.saturating_add(1)
            }
            _ => 0,
        };
        let why = match outcome {
            Ok(()) => "the plan stream ended".to_string(),
            Err(e) => e.to_string(),
        };
        // Whatever ended it (a standby's refusal, a lost leadership, a dead
        // peer), the next address may be the leader now.
        controllers.failed(i);
        tracing::warn!(%controller, "plan stream: {why}; keeping the current plan and retrying");
        handle.plan_connected(false).await;
        handle.plan_stream_error(why).await;
        let delay = retry_delay(attempt, controllers.len() as u32, standby_refusals);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = reachable.notified() => attempt = 0,
            _ = shutdown.changed() => return,
        }
    }
}

async fn stream_once(
    controllers: &Controllers,
    node: &str,
    enforcer_id: &str,
    handle: &Handle,
    attempt: &mut u32,
) -> Result<(), PlanClientError> {
    let (_, channel) = controllers.connect(Duration::from_secs(5)).await?;
    let controller = controllers.current().1.clone();
    let mut client = plan_service(channel);
    let mut stream = client
        .subscribe(SubscribeRequest {
            node_name: node.to_string(),
            enforcer_id: enforcer_id.to_string(),
        })
        .await
        .map_err(PlanClientError::Subscribe)?
        .into_inner();
    handle.plan_connected(true).await;
    tracing::info!(%controller, "plan stream connected");
    loop {
        let msg = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(s) => return Err(PlanClientError::Receive(s)),
        };
        let (msg, term, span) = match msg.update {
            Some(Update::Snapshot(mut s)) => {
                let info = PlanMessageInfo {
                    node,
                    kind: "snapshot",
                    version: s.version,
                    base_version: 0,
                    term: s.term,
                    pods: s.pods.len(),
                };
                let span = Realize::start(&std::mem::take(&mut s.trace_context), info);
                let t = s.term;
                (PlanMessage::Snapshot(s), t, span)
            }
            Some(Update::Delta(mut d)) => {
                let info = PlanMessageInfo {
                    node,
                    kind: "delta",
                    version: d.version,
                    base_version: d.base_version,
                    term: d.term,
                    pods: d.upserted.len() + d.removed.len(),
                };
                let span = Realize::start(&std::mem::take(&mut d.trace_context), info);
                let t = d.term;
                (PlanMessage::Delta(d), t, span)
            }
            None => continue,
        };
        // Before the reconciler can publish the state this message makes.
        let version = match &msg {
            PlanMessage::Snapshot(s) => s.version,
            PlanMessage::Delta(d) => d.version,
        };
        controllers.report_parent.realizing(version, span.context());
        // The reconciler refuses a plan of an older term too (and keeps the
        // highest across restarts); this is its mirror for fetched pods.
        let applied = handle.plan(msg).await;
        span.finish(&applied);
        match applied {
            Ok(version) => {
                *attempt = 0;
                controllers.applied(term);
                tracing::info!(version, term, "plan applied");
            }
            // Refused (out of sequence: a fresh subscription starts with a
            // snapshot), or no reconciler to apply it.
            Err(e) => return Err(e.into()),
        }
    }
}

/// Answers the reconciler's on-demand requests for one pod's plan (a pod
/// coming up before the stream delivered it). Failures are only logged: the
/// pod-up deadline decides what happens to a pod whose plan never comes.
pub async fn fetch_pods(
    controllers: Controllers,
    node: String,
    handle: Handle,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<crate::desired::PodKey>,
    give_up_after: Duration,
    reachable: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut client: Option<PlanServiceClient<tonic::transport::Channel>> = None;
    while let Some(pod) = requests.recv().await {
        // Retried on a fresh connection until the pod's deadline: the
        // controller may be coming back, or a cached channel may point at
        // one that died. A late answer is ignored by the reconciler.
        let deadline = tokio::time::Instant::now() + give_up_after;
        let mut attempt = 0u32;
        loop {
            match fetch_one(&controllers, &node, &pod, &mut client).await {
                Ok(policy) => {
                    reachable.notify_one();
                    handle.pod_plan_fetched(pod, policy).await;
                    break;
                }
                Err(e) => {
                    client = None;
                    tracing::debug!("fetching the plan of {}/{}: {e}", pod.0, pod.1);
                }
            }
            let delay = backoff(attempt, Duration::from_millis(400));
            attempt = attempt.saturating_add(1);
            if tokio::time::Instant::now() + delay >= deadline {
                break;
            }
            tokio::time::sleep(delay).await;
        }
    }
}

async fn fetch_one(
    controllers: &Controllers,
    node: &str,
    pod: &crate::desired::PodKey,
    client: &mut Option<PlanServiceClient<tonic::transport::Channel>>,
) -> Result<Option<palisade_proto::v1::PodPolicy>, PlanClientError> {
    let mut c = match client.take() {
        Some(c) => c,
        None => plan_service(controllers.connect(Duration::from_secs(1)).await?.1),
    };
    let request = palisade_proto::v1::GetPodPlanRequest {
        node_name: node.to_string(),
        pod: Some(palisade_proto::v1::PodRef {
            namespace: pod.0.clone(),
            name: pod.1.clone(),
        }),
    };
    let span = Fetch::start(node, pod);
    let mut request = tonic::Request::new(request);
    span.inject(request.metadata_mut());
    let r = c
        .get_pod_plan(request)
        .await
        .map_err(PlanClientError::Fetch);
    span.finish(&r);
    let r = r?.into_inner();
    *client = Some(c);
    if r.term < controllers.term() {
        return Err(PlanClientError::StaleTerm {
            answer: r.term,
            applied: controllers.term(),
        });
    }
    Ok(r.pod.filter(|_| r.known))
}

/// Sends every new realized state to the controller, retrying until it lands,
/// and always sending the newest state rather than a backlog.
pub async fn report(controllers: Controllers, mut state: watch::Receiver<NodeState>) {
    let mut attempt = 0u32;
    let mut client: Option<PlanServiceClient<tonic::transport::Channel>> = None;
    loop {
        let current = state.borrow_and_update().clone();
        if !current.node_name.is_empty() {
            let c = match client.take() {
                Some(c) => Some(c),
                None => controllers
                    .connect(Duration::from_secs(5))
                    .await
                    .map(|(_, c)| plan_service(c))
                    .map_err(|e| tracing::debug!("report: {e}"))
                    .ok(),
            };
            let sent = match c {
                Some(mut c) => {
                    let mut request = tonic::Request::new(ReportStateRequest {
                        state: Some(current),
                    });
                    // Of the realization that produced this state, when traced.
                    let realized = request
                        .get_ref()
                        .state
                        .as_ref()
                        .map_or(0, |s| s.realized_version);
                    controllers
                        .report_parent
                        .inject(realized, request.metadata_mut());
                    let r = c.report_state(request).await;
                    match r {
                        Ok(_) => {
                            client = Some(c);
                            true
                        }
                        Err(s) => {
                            tracing::debug!("report: {}", s.message());
                            false
                        }
                    }
                }
                None => false,
            };
            if !sent {
                let delay = backoff(attempt, Duration::from_secs(5));
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => continue,
                    r = state.changed() => if r.is_err() { return } else { continue },
                }
            }
            attempt = 0;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// The plan service on a channel, taking plan messages up to
/// [`palisade_proto::MAX_PLAN_MESSAGE_BYTES`] (tonic's default of 4 MiB
/// would fail the stream of a node one big policy selects a pod on).
fn plan_service(
    channel: tonic::transport::Channel,
) -> PlanServiceClient<tonic::transport::Channel> {
    PlanServiceClient::new(channel)
        .max_decoding_message_size(palisade_proto::MAX_PLAN_MESSAGE_BYTES)
        .max_encoding_message_size(palisade_proto::MAX_PLAN_MESSAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standbys_refusal_is_retried_at_once_then_backs_off() {
        // One address (the Service): other failures back off from the first.
        assert_eq!(retry_delay(0, 1, 0), Duration::from_millis(100));
        assert_eq!(retry_delay(3, 1, 0), Duration::from_millis(800));
        for refusals in 1..=STANDBY_QUICK_RETRIES {
            assert_eq!(retry_delay(refusals + 5, 1, refusals), QUICK_RETRY);
        }
        assert_eq!(
            retry_delay(40, 1, STANDBY_QUICK_RETRIES + 1),
            Duration::from_secs(5)
        );
        // Several addresses: the next one at once, a full round backs off.
        assert_eq!(retry_delay(0, 3, 0), QUICK_RETRY);
        assert_eq!(retry_delay(2, 3, 0), Duration::from_millis(100));
        assert_eq!(
            retry_delay(7, 0, 0),
            Duration::from_millis(12800).min(Duration::from_secs(5))
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let cap = Duration::from_secs(5);
        assert_eq!(backoff(0, cap), Duration::from_millis(100));
        assert_eq!(backoff(3, cap), Duration::from_millis(800));
        assert_eq!(backoff(10, cap), cap);
        assert_eq!(backoff(u32::MAX, cap), cap);
    }

    #[test]
    fn errors_read_as_before_and_keep_the_status() {
        let none = Controllers::new(vec![], ClientOptions::default(), 0).err();
        assert!(matches!(none, Some(PlanClientError::NoController)));
        let stale = PlanClientError::StaleTerm {
            answer: 2,
            applied: 3,
        };
        assert_eq!(
            stale.to_string(),
            "answer from leadership term 2, older than term 3 already applied: refused"
        );
        let refused =
            PlanClientError::Subscribe(tonic::Status::unavailable("standby; leader is b"));
        assert_eq!(refused.to_string(), "subscribe: standby; leader is b");
        let source = std::error::Error::source(&refused).unwrap();
        assert_eq!(
            source.downcast_ref::<tonic::Status>().unwrap().code(),
            tonic::Code::Unavailable
        );
        let fetch = PlanClientError::Fetch(tonic::Status::not_found("no pod"));
        assert_eq!(fetch.to_string(), "no pod");
        let gone = PlanClientError::from(HandleError::ReconcilerGone);
        assert_eq!(gone.to_string(), HandleError::ReconcilerGone.to_string());
    }
}
