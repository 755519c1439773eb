//! How everything else talks to the reconciler: send an event, await the
//! answer. Nothing outside the reconciler touches node state.

use palisade_proto::v1::PodState;
use tokio::sync::{mpsc, oneshot};

use crate::desired::PodKey;
use crate::reconciler::{Dump, Event, PlanError, PlanMessage, PodUp, PodUpOutcome};

#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Event>,
}

const GONE: &str = "the enforcer's reconciler has stopped";

impl Handle {
    pub fn new(tx: mpsc::Sender<Event>) -> Self {
        Handle { tx }
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

    pub async fn pod_up(&self, up: PodUp) -> Result<PodUpOutcome, String> {
        self.ask(|r| Event::PodUp(up, r)).await?
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
}
