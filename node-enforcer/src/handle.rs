//! How everything else talks to the reconciler: send an event, await the
//! answer. Nothing outside the reconciler touches node state.

use palisade_proto::v1::PodState;
use tokio::sync::{mpsc, oneshot};

use crate::desired::PodKey;
use crate::reconciler::{Dump, Event, PlanError, PlanMessage, PodUp, PodUpOutcome};

#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Event>,
    pod_up_deadline: std::time::Duration,
    /// The DNS learner, where one runs (--dns-server): the dump and the
    /// metrics ask it for what it learned.
    learning: Option<crate::names::report::Learning>,
}

/// Why the reconciler did not do what it was asked.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HandleError {
    /// The reconciler has stopped: nothing that goes through it works
    /// (health says NOT_SERVING).
    #[error("the enforcer's reconciler has stopped")]
    ReconcilerGone,
    /// It refused a plan message (out of sequence, an older term, an
    /// unsynced source): the node keeps its current plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Its answer about a pod: the pod-up, delete or check was refused or
    /// failed, and the text says why.
    #[error("{0}")]
    Pod(String),
}

impl HandleError {
    /// A short, stable label for metrics and structured logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            HandleError::ReconcilerGone => "reconciler_gone",
            HandleError::Plan(_) => "plan_refused",
            HandleError::Pod(_) => "pod",
        }
    }
}

impl Handle {
    /// `pod_up_deadline`: how long a pod-up waits for the pod's policy
    /// before the mode decides (strict refuses, standard starts it open and
    /// marked unprotected).
    pub fn new(tx: mpsc::Sender<Event>, pod_up_deadline: std::time::Duration) -> Self {
        Handle {
            tx,
            pod_up_deadline,
            learning: None,
        }
    }

    pub fn with_learning(mut self, learning: crate::names::report::Learning) -> Self {
        self.learning = Some(learning);
        self
    }

    pub fn learning(&self) -> Option<&crate::names::report::Learning> {
        self.learning.as_ref()
    }

    pub fn sender(&self) -> mpsc::Sender<Event> {
        self.tx.clone()
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Event,
    ) -> Result<T, HandleError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| HandleError::ReconcilerGone)?;
        rx.await.map_err(|_| HandleError::ReconcilerGone)
    }

    /// The plan version applied.
    pub async fn plan(&self, msg: PlanMessage) -> Result<u64, HandleError> {
        Ok(self.ask(|r| Event::Plan(msg, r)).await??)
    }

    pub async fn plan_connected(&self, connected: bool) {
        let _ = self.tx.send(Event::PlanConnected(connected)).await;
    }

    pub async fn plan_stream_error(&self, error: String) {
        let _ = self.tx.send(Event::PlanStreamError(error)).await;
    }

    pub async fn pod_up(&self, up: PodUp) -> Result<PodUpOutcome, HandleError> {
        let deadline = Event::PodUpDeadline {
            pod: up.pod.clone(),
            container_id: up.runtime.container_id.clone(),
        };
        let (tx, after) = (self.tx.clone(), self.pod_up_deadline);
        // The reconciler never blocks on a wait: the deadline is an event.
        let timer = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(deadline).await;
        });
        let started = std::time::Instant::now();
        let answer = self.ask(|r| Event::PodUp(up, r)).await;
        crate::metrics::observe_pod_up(started.elapsed());
        timer.abort();
        answer?.map_err(HandleError::Pod)
    }

    pub async fn pod_plan_fetched(
        &self,
        pod: PodKey,
        policy: Option<palisade_proto::v1::PodPolicy>,
    ) {
        let _ = self
            .tx
            .send(Event::PodPlanFetched {
                pod,
                policy: policy.map(Box::new),
            })
            .await;
    }

    pub async fn pod_down(
        &self,
        pod: Option<PodKey>,
        container_id: String,
    ) -> Result<(), HandleError> {
        self.ask(|reply| Event::PodDown {
            pod,
            container_id,
            reply,
        })
        .await?
        .map_err(HandleError::Pod)
    }

    pub async fn pod_check(
        &self,
        pod: PodKey,
        container_id: String,
    ) -> Result<PodState, HandleError> {
        self.ask(|reply| Event::PodCheck {
            pod,
            container_id,
            reply,
        })
        .await?
        .map_err(HandleError::Pod)
    }

    pub async fn dump(&self) -> Result<Dump, HandleError> {
        self.ask(Event::Dump).await
    }

    /// Promotes every fast-attached interface to links (before exiting);
    /// how many are left on filters.
    pub async fn promote_all(&self) -> Result<usize, HandleError> {
        self.ask(Event::PromoteAll).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> (Handle, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(1);
        (Handle::new(tx, std::time::Duration::from_secs(60)), rx)
    }

    #[tokio::test]
    async fn a_stopped_reconciler_and_its_refusals_are_told_apart() {
        let (h, rx) = handle();
        drop(rx);
        let gone = h.dump().await.unwrap_err();
        assert_eq!(gone, HandleError::ReconcilerGone);
        assert_eq!(gone.to_string(), "the enforcer's reconciler has stopped");

        let (h, mut rx) = handle();
        let reconciler = tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                match event {
                    Event::PodDown { reply, .. } => {
                        let _ = reply.send(Err("pod x/a: busy".into()));
                    }
                    Event::Plan(_, reply) => {
                        let _ = reply.send(Err(PlanError::NotSynced(4)));
                    }
                    _ => {}
                }
            }
        });
        let refused = h.pod_down(None, "c".into()).await.unwrap_err();
        assert_eq!(refused, HandleError::Pod("pod x/a: busy".into()));
        assert_eq!(refused.to_string(), "pod x/a: busy");
        assert_eq!(refused.metric_label(), "pod");
        let snapshot = palisade_proto::v1::PlanSnapshot::default();
        let plan = h.plan(PlanMessage::Snapshot(snapshot)).await.unwrap_err();
        assert_eq!(plan, HandleError::Plan(PlanError::NotSynced(4)));
        assert_eq!(plan.to_string(), PlanError::NotSynced(4).to_string());
        drop(h);
        reconciler.await.unwrap();
    }
}
