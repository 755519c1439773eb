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
}

const GONE: &str = "the enforcer's reconciler has stopped";

impl Handle {
    /// `pod_up_deadline`: how long a pod-up waits for the pod's policy
    /// before the mode decides (strict refuses, standard starts it open and
    /// marked unprotected).
    pub fn new(tx: mpsc::Sender<Event>, pod_up_deadline: std::time::Duration) -> Self {
        Handle {
            tx,
            pod_up_deadline,
        }
    }

    pub fn sender(&self) -> mpsc::Sender<Event> {
        self.tx.clone()
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Event) -> Result<T, String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| GONE.to_string())?;
        rx.await.map_err(|_| GONE.to_string())
    }

    pub async fn plan(&self, msg: PlanMessage) -> Result<Result<u64, PlanError>, String> {
        self.ask(|r| Event::Plan(msg, r)).await
    }

    pub async fn plan_connected(&self, connected: bool) {
        let _ = self.tx.send(Event::PlanConnected(connected)).await;
    }

    pub async fn plan_stream_error(&self, error: String) {
        let _ = self.tx.send(Event::PlanStreamError(error)).await;
    }

    pub async fn pod_up(&self, up: PodUp) -> Result<PodUpOutcome, String> {
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
        answer?
    }

    pub async fn pod_plan_fetched(
        &self,
        pod: PodKey,
        policy: Option<palisade_proto::v1::PodPolicy>,
    ) {
        let _ = self.tx.send(Event::PodPlanFetched { pod, policy }).await;
    }

    pub async fn pod_down(&self, pod: Option<PodKey>, container_id: String) -> Result<(), String> {
        self.ask(|reply| Event::PodDown {
            pod,
            container_id,
            reply,
        })
        .await?
    }

    pub async fn pod_check(&self, pod: PodKey, container_id: String) -> Result<PodState, String> {
        self.ask(|reply| Event::PodCheck {
            pod,
            container_id,
            reply,
        })
        .await?
    }

    pub async fn dump(&self) -> Result<Dump, String> {
        self.ask(Event::Dump).await
    }

    /// Promotes every fast-attached interface to links (before exiting);
    /// how many are left on filters.
    pub async fn promote_all(&self) -> Result<usize, String> {
        self.ask(Event::PromoteAll).await
    }
}
