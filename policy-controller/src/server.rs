//! The controller's gRPC services: the plan stream (one per node), state
//! reports, and the debug dump. Handlers only read and write the hub.

use std::pin::Pin;

use futures::Stream;
use palisade_proto::v1::{
    debug_service_server::{DebugService, DebugServiceServer},
    plan_service_server::{PlanService, PlanServiceServer},
    subscribe_response::Update,
    ExplainRequest, ExplainResponse, GetControllerStateRequest, GetControllerStateResponse,
    GetEnforcerStateRequest, GetEnforcerStateResponse, GetPodPlanRequest, GetPodPlanResponse,
    GetRealizationRequest, GetRealizationResponse, NodeView, ReportStateRequest,
    ReportStateResponse, SubscribeRequest, SubscribeResponse,
};
use tonic::{Request, Response, Status};

use crate::hub::{delta, Hub};

pub struct PlanServer {
    hub: Hub,
}

type PlanStream = Pin<Box<dyn Stream<Item = Result<SubscribeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PlanService for PlanServer {
    type SubscribeStream = PlanStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let req = request.into_inner();
        if req.node_name.is_empty() {
            return Err(Status::invalid_argument("node_name is required"));
        }
        // Refusing (rather than holding the stream open) tells the enforcer
        // why at once; it keeps what it enforces and retries.
        let mut sub = self
            .hub
            .subscribe(&req.node_name)
            .map_err(|e| Status::unavailable(e.to_string()))?;
        tracing::info!(node = %req.node_name, enforcer = %req.enforcer_id, "enforcer subscribed");
        let node = req.node_name.clone();
        let stream = async_stream(move |tx| async move {
            let mut sent = sub.rx.borrow_and_update().clone();
            let first = SubscribeResponse {
                update: Some(Update::Snapshot(sent.snapshot())),
            };
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            while sub.rx.changed().await.is_ok() {
                let next = sub.rx.borrow_and_update().clone();
                if let Some(d) = delta(&sent, &next) {
                    let msg = SubscribeResponse {
                        update: Some(Update::Delta(d)),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        break;
                    }
                }
                sent = next;
            }
            tracing::info!(%node, "enforcer stream ended");
        });
        Ok(Response::new(stream))
    }

    async fn get_pod_plan(
        &self,
        request: Request<GetPodPlanRequest>,
    ) -> Result<Response<GetPodPlanResponse>, Status> {
        let req = request.into_inner();
        if req.node_name.is_empty() {
            return Err(Status::invalid_argument("node_name is required"));
        }
        let pod = req
            .pod
            .filter(|p| !p.name.is_empty() && !p.namespace.is_empty())
            .ok_or_else(|| Status::invalid_argument("pod.namespace and pod.name are required"))?;
        let found = self
            .hub
            .pod_plan(&req.node_name, &(pod.namespace, pod.name))
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(GetPodPlanResponse {
            known: found.pod.is_some(),
            pod: found.pod,
            plan_version: found.plan_version,
        }))
    }

    async fn report_state(
        &self,
        request: Request<ReportStateRequest>,
    ) -> Result<Response<ReportStateResponse>, Status> {
        let state = request
            .into_inner()
            .state
            .ok_or_else(|| Status::invalid_argument("state is required"))?;
        if state.node_name.is_empty() {
            return Err(Status::invalid_argument("state.node_name is required"));
        }
        self.hub.report(state);
        Ok(Response::new(ReportStateResponse {}))
    }
}

/// Runs a producer task feeding a channel-backed stream; the task stops when
/// the client goes away and the channel closes.
fn async_stream<F, Fut>(f: F) -> PlanStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<SubscribeResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

pub struct DebugServer {
    hub: Hub,
}

#[tonic::async_trait]
impl DebugService for DebugServer {
    async fn get_controller_state(
        &self,
        _: Request<GetControllerStateRequest>,
    ) -> Result<Response<GetControllerStateResponse>, Status> {
        let view = self.hub.view();
        Ok(Response::new(GetControllerStateResponse {
            source_synced: view.source_synced,
            source_revision: view.source_revision,
            source_marker: view.source_marker,
            errors: view.errors,
            nodes: view
                .nodes
                .into_iter()
                .map(|n| NodeView {
                    node_name: n.node_name,
                    plan_version: n.plan.version,
                    // Every plan is current as of the hub's revision: a
                    // revision that did not change a plan left it as it was.
                    plan_source_revision: view.source_revision,
                    connected: n.subscribers > 0,
                    reported: n.reported,
                    plan: Some(n.plan.snapshot()),
                })
                .collect(),
        }))
    }

    async fn get_enforcer_state(
        &self,
        _: Request<GetEnforcerStateRequest>,
    ) -> Result<Response<GetEnforcerStateResponse>, Status> {
        Err(Status::unimplemented(
            "this is the policy-controller; ask a node-enforcer (GetControllerState shows what each node reported)",
        ))
    }

    async fn get_realization(
        &self,
        request: Request<GetRealizationRequest>,
    ) -> Result<Response<GetRealizationResponse>, Status> {
        let req = request.into_inner();
        let only = Some(req.policy.as_str()).filter(|p| !p.is_empty());
        if only.is_some_and(|p| p.split_once('/').is_none()) {
            return Err(Status::invalid_argument(format!(
                "policy {:?}: expected namespace/name",
                req.policy
            )));
        }
        Ok(Response::new(crate::debug::realization::realization(
            &self.hub.view(),
            only,
        )))
    }

    async fn explain(
        &self,
        request: Request<ExplainRequest>,
    ) -> Result<Response<ExplainResponse>, Status> {
        use crate::debug::explain::{explain, ExplainError};
        let req = request.into_inner();
        let hub = self.hub.clone();
        // Copying the cluster out of the engine waits for a resolution in
        // progress: off the async runtime.
        let answer = tokio::task::spawn_blocking(move || {
            hub.with_engine(|engine| {
                // Under the engine lock, the hub's marker is the one of the
                // view the engine holds (publication happens under it too).
                let view = hub.view();
                match engine {
                    Some(engine) if view.source_synced => {
                        Ok(explain(&engine.cluster_view(view.source_marker), &req))
                    }
                    _ => Err(Status::unavailable(
                        "the controller has not read a complete view of the cluster yet",
                    )),
                }
            })
        })
        .await
        .map_err(|e| Status::internal(format!("explain failed: {e}")))??;
        answer.map(Response::new).map_err(|e| match e {
            ExplainError::Invalid(m) => Status::invalid_argument(m),
            ExplainError::NotFound(m) => Status::not_found(m),
        })
    }
}

/// Every service of the controller, with health and reflection.
pub async fn router(hub: Hub) -> Result<tonic::transport::server::Router, String> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<PlanServiceServer<PlanServer>>().await;
    health
        .set_serving::<DebugServiceServer<DebugServer>>()
        .await;
    // Reflection lists only what this process serves, though the descriptor
    // set describes every Palisade service.
    let names = [
        palisade_proto::service_names::PLAN,
        palisade_proto::service_names::DEBUG,
        "grpc.health.v1.Health",
    ];
    let mut v1 = tonic_reflection::server::Builder::configure();
    let mut v1alpha = tonic_reflection::server::Builder::configure();
    for d in [
        palisade_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
    ] {
        v1 = v1.register_encoded_file_descriptor_set(d);
        v1alpha = v1alpha.register_encoded_file_descriptor_set(d);
    }
    for n in names {
        v1 = v1.with_service_name(n);
        v1alpha = v1alpha.with_service_name(n);
    }
    let reflection = v1.build_v1().map_err(|e| format!("reflection: {e}"))?;
    let reflection_alpha = v1alpha
        .build_v1alpha()
        .map_err(|e| format!("reflection: {e}"))?;
    Ok(tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(PlanServiceServer::new(PlanServer { hub: hub.clone() }))
        .add_service(DebugServiceServer::new(DebugServer { hub })))
}
