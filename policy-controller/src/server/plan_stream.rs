//! One enforcer's plan stream: a snapshot of its node's plan, then a delta
//! for every version after it, each sent only while this controller still
//! leads under the term the stream was opened in.
//!
//! A producer task feeds a bounded channel that the gRPC response reads; it
//! stops when the enforcer goes away (the channel closes), when the node's
//! plan is withdrawn ([`Hub::close`](crate::hub::Hub::close)), or when the
//! term ends, which it tells the enforcer as UNAVAILABLE.

use std::pin::Pin;

use futures::Stream;
use palisade_proto::v1::{subscribe_response::Update, PlanDelta, SubscribeResponse};
use palisade_runtime::telemetry::PlanMessageInfo;
use tokio::sync::mpsc;
use tonic::Status;

use crate::hub::{delta, Subscription, VersionedPlan};
use crate::leader::{Leadership, Serving};
use crate::telemetry::PlanSend;

pub type PlanStream = Pin<Box<dyn Stream<Item = Result<SubscribeResponse, Status>> + Send>>;

type Sender = mpsc::Sender<Result<SubscribeResponse, Status>>;

/// Whether this controller still leads under the term a stream was opened
/// in. Checked right before every send: what leaves this process is sent
/// by the leader of that term, or not at all.
pub(super) struct TermGate {
    leadership: Leadership,
    term: u64,
}

impl TermGate {
    pub(super) fn new(leadership: Leadership, term: u64) -> Self {
        TermGate { leadership, term }
    }

    /// The leadership to serve under; None once the term has ended.
    fn open(&self) -> Option<Serving> {
        self.leadership
            .serving()
            .ok()
            .filter(|s| s.term == self.term)
    }

    /// Why the term is over, for the log and the enforcer.
    fn ended(&self) -> String {
        let term = self.term;
        match self.leadership.serving() {
            Ok(_) => format!("leadership term {term} ended"),
            Err(e) => format!("leadership term {term} ended: {e}"),
        }
    }
}

/// Starts the producer of `node`'s stream and returns what the response
/// reads.
pub(super) fn spawn(node: String, sub: Subscription, gate: TermGate) -> PlanStream {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(Producer { node, sub, gate }.run(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

struct Producer {
    node: String,
    sub: Subscription,
    gate: TermGate,
}

/// Why a stream stopped.
enum End {
    /// The enforcer did not take the snapshot: the stream never started.
    SnapshotRefused,
    /// The enforcer went away, or the node's plan was withdrawn.
    Closed,
    /// The term ended: the enforcer is told, and tries its next address.
    TermEnded,
}

impl Producer {
    async fn run(mut self, tx: Sender) {
        let node = self.node.clone();
        match self.stream(&tx).await {
            // Nothing was streamed, so there is no end to log.
            End::SnapshotRefused => return,
            End::Closed => {}
            End::TermEnded => {
                let why = self.gate.ended();
                tracing::warn!(%node, "ending the plan stream: {why}");
                let _ = tx.send(Err(Status::unavailable(why))).await;
            }
        }
        tracing::info!(%node, "enforcer stream ended");
    }

    /// The snapshot, then a delta per new version, until the stream ends.
    async fn stream(&mut self, tx: &Sender) -> End {
        let term = self.gate.term;
        let mut sent = self.sub.rx.borrow_and_update().clone();
        let first = Outgoing::snapshot(&self.node, term, &sent);
        if self.gate.open().is_none() {
            return End::TermEnded;
        }
        if !first.send(tx).await {
            return End::SnapshotRefused;
        }
        loop {
            let Some(serving) = self.gate.open() else {
                return End::TermEnded;
            };
            tokio::select! {
                changed = self.sub.rx.changed() => if changed.is_err() { return End::Closed },
                _ = self.gate.leadership.may_have_ended(serving) => continue,
                // A gone enforcer ends its subscription now, not at the
                // next plan change: "connected" must mean connected.
                _ = tx.closed() => return End::Closed,
            }
            let next = self.sub.rx.borrow_and_update().clone();
            if let Some(d) = delta(&sent, &next) {
                if self.gate.open().is_none() {
                    return End::TermEnded;
                }
                if !Outgoing::delta(&self.node, term, d, &next).send(tx).await {
                    return End::Closed;
                }
            }
            sent = next;
        }
    }
}

/// One plan message stamped with its term, and the span that sends it (a
/// child of the span that published its version; the message carries it
/// on for the enforcer's realization).
struct Outgoing {
    update: Update,
    span: PlanSend,
}

impl Outgoing {
    fn snapshot(node: &str, term: u64, plan: &VersionedPlan) -> Outgoing {
        let mut snapshot = plan.snapshot();
        snapshot.term = term;
        let span = PlanSend::start(
            &plan.trace,
            PlanMessageInfo {
                node,
                kind: "snapshot",
                version: snapshot.version,
                base_version: 0,
                term,
                pods: snapshot.pods.len(),
            },
        );
        snapshot.trace_context = span.context_map();
        Outgoing {
            update: Update::Snapshot(snapshot),
            span,
        }
    }

    fn delta(node: &str, term: u64, mut d: PlanDelta, next: &VersionedPlan) -> Outgoing {
        d.term = term;
        let span = PlanSend::start(
            &next.trace,
            PlanMessageInfo {
                node,
                kind: "delta",
                version: d.version,
                base_version: d.base_version,
                term,
                pods: d.upserted.len() + d.removed.len(),
            },
        );
        d.trace_context = span.context_map();
        Outgoing {
            update: Update::Delta(d),
            span,
        }
    }

    /// Sends the message and ends its span; false when the enforcer's
    /// stream is gone.
    async fn send(self, tx: &Sender) -> bool {
        let msg = SubscribeResponse {
            update: Some(self.update),
        };
        let ok = tx.send(Ok(msg)).await.is_ok();
        self.span.finish(ok);
        ok
    }
}
