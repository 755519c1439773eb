//! The controller's gRPC services: the plan stream (one per node), state
//! reports, and the debug dump. Handlers only read and write the hub.

mod plan_stream;

use palisade_proto::v1::{
    debug_service_server::{DebugService, DebugServiceServer},
    plan_service_server::{PlanService, PlanServiceServer},
    ExplainRequest, ExplainResponse, GetControllerStateRequest, GetControllerStateResponse,
    GetEnforcerStateRequest, GetEnforcerStateResponse, GetPodPlanRequest, GetPodPlanResponse,
    GetRealizationRequest, GetRealizationResponse, NodeView, ReportStateRequest,
    ReportStateResponse, SubscribeRequest,
};
use tonic::{Request, Response, Status};

use crate::hub::Hub;
use crate::leader::{Leadership, NotLeader};
use crate::telemetry::CallSpan;
use crate::tls::Authz;
use opentelemetry::KeyValue;
use plan_stream::TermGate;

pub struct PlanServer {
    hub: Hub,
    leadership: Leadership,
    authz: Authz,
}

fn not_leader(e: NotLeader) -> Status {
    let mut status = Status::unavailable(e.to_string());
    status.metadata_mut().insert(
        palisade_proto::STANDBY_METADATA,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    status
}

#[tonic::async_trait]
impl PlanService for PlanServer {
    type SubscribeStream = plan_stream::PlanStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        self.authz
            .check_node(&request, &request.get_ref().node_name)?;
        let req = request.into_inner();
        if req.node_name.is_empty() {
            return Err(Status::invalid_argument("node_name is required"));
        }
        // Only the leader serves; a standby says who is, and the enforcer
        // tries its next address.
        let serving = self.leadership.serving().map_err(not_leader)?;
        let term = serving.term;
        // Refusing (rather than holding the stream open) tells the enforcer
        // why at once; it keeps what it enforces and retries.
        let sub = self
            .hub
            .subscribe(&req.node_name)
            .map_err(|e| Status::unavailable(e.to_string()))?;
        tracing::info!(node = %req.node_name, enforcer = %req.enforcer_id, term, "enforcer subscribed");
        let gate = TermGate::new(self.leadership.clone(), term);
        Ok(Response::new(plan_stream::spawn(req.node_name, sub, gate)))
    }

    async fn get_pod_plan(
        &self,
        request: Request<GetPodPlanRequest>,
    ) -> Result<Response<GetPodPlanResponse>, Status> {
        let span = CallSpan::start("get pod plan", request.metadata(), || {
            let r = request.get_ref();
            let pod = r
                .pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .unwrap_or_default();
            vec![
                KeyValue::new("palisade.node", r.node_name.clone()),
                KeyValue::new("palisade.pod", pod),
            ]
        });
        let result = self.pod_plan(request);
        span.finish(&result);
        result
    }

    async fn report_state(
        &self,
        request: Request<ReportStateRequest>,
    ) -> Result<Response<ReportStateResponse>, Status> {
        let span = CallSpan::start("report state", request.metadata(), || {
            let state = request.get_ref().state.as_ref();
            vec![
                KeyValue::new(
                    "palisade.node",
                    state.map(|s| s.node_name.clone()).unwrap_or_default(),
                ),
                KeyValue::new(
                    "palisade.plan.realized_version",
                    state.map_or(0, |s| s.realized_version as i64),
                ),
            ]
        });
        let result = self.report(request);
        span.finish(&result);
        result
    }
}

impl PlanServer {
    fn pod_plan(
        &self,
        request: Request<GetPodPlanRequest>,
    ) -> Result<Response<GetPodPlanResponse>, Status> {
        self.authz
            .check_node(&request, &request.get_ref().node_name)?;
        let req = request.into_inner();
        if req.node_name.is_empty() {
            return Err(Status::invalid_argument("node_name is required"));
        }
        let pod = req
            .pod
            .filter(|p| !p.name.is_empty() && !p.namespace.is_empty())
            .ok_or_else(|| Status::invalid_argument("pod.namespace and pod.name are required"))?;
        let serving = self.leadership.serving().map_err(not_leader)?;
        let found = self
            .hub
            .pod_plan(&req.node_name, &(pod.namespace, pod.name))
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(GetPodPlanResponse {
            known: found.pod.is_some(),
            pod: found.pod,
            plan_version: found.plan_version,
            term: serving.term,
        }))
    }

    fn report(
        &self,
        request: Request<ReportStateRequest>,
    ) -> Result<Response<ReportStateResponse>, Status> {
        let node = request
            .get_ref()
            .state
            .as_ref()
            .map(|s| s.node_name.clone())
            .unwrap_or_default();
        self.authz.check_node(&request, &node)?;
        let state = request
            .into_inner()
            .state
            .ok_or_else(|| Status::invalid_argument("state is required"))?;
        if state.node_name.is_empty() {
            return Err(Status::invalid_argument("state.node_name is required"));
        }
        // Reports belong with the leader, which the enforcers follow.
        self.leadership.serving().map_err(not_leader)?;
        self.hub.report(state);
        Ok(Response::new(ReportStateResponse {}))
    }
}

pub struct DebugServer {
    hub: Hub,
    refusals: std::sync::Arc<crate::tls::Refusals>,
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
            refusals: Some(self.refusals.counts()),
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

/// Reports PlanService as serving exactly while this controller leads, so a
/// readiness probe (and a Service) points enforcers at the leader.
pub async fn report_leadership(
    health: tonic_health::server::HealthReporter,
    leadership: Leadership,
) {
    let mut rx = leadership.watch();
    let mut serving = leadership.serving();
    loop {
        if serving.is_ok() {
            health.set_serving::<PlanServiceServer<PlanServer>>().await;
        } else {
            health
                .set_not_serving::<PlanServiceServer<PlanServer>>()
                .await;
        }
        serving = crate::leader::role::next_serving(&leadership, &mut rx).await;
    }
}

/// Every service of the controller, with health and reflection, always
/// leading (no leader election), without TLS.
pub async fn router(hub: Hub) -> Result<tonic::transport::server::Router, ServeError> {
    Ok(router_with(hub, ServeOptions::default()).await?.0)
}

/// Why the controller's services could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection: {0}")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// The TLS settings were refused; the message says every cause, as
    /// tonic's own says only "transport error".
    #[error("TLS: {}", palisade_runtime::transport::source_chain(.0))]
    Tls(#[source] tonic::transport::Error),
}

/// How the controller serves: under which leadership, over which TLS.
#[derive(Clone)]
pub struct ServeOptions {
    pub leadership: Leadership,
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    pub authz: Authz,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            leadership: Leadership::always(),
            tls: None,
            authz: Authz::default(),
        }
    }
}

/// Every service of the controller, serving plans only while leading and
/// only to the node each caller's certificate names; and a router with
/// the health service alone, for a plaintext probe port.
pub async fn router_with(
    hub: Hub,
    options: ServeOptions,
) -> Result<
    (
        tonic::transport::server::Router,
        tonic::transport::server::Router,
    ),
    ServeError,
> {
    let ServeOptions {
        leadership,
        tls,
        authz,
    } = options;
    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_leadership(health.clone(), leadership.clone()));
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
    let reflection = v1.build_v1().map_err(ServeError::Reflection)?;
    let reflection_alpha = v1alpha.build_v1alpha().map_err(ServeError::Reflection)?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(ServeError::Tls)?;
    }
    // The debug service shows every node's plan: operators only.
    let operator_only = {
        let authz = authz.clone();
        move |r: Request<()>| authz.check_operator(&r).map(|_| r)
    };
    let health_only = tonic::transport::Server::builder().add_service(health_service.clone());
    let router = builder
        .add_service(health_service)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            reflection,
            operator_only.clone(),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            reflection_alpha,
            operator_only.clone(),
        ))
        .add_service(
            PlanServiceServer::new(PlanServer {
                hub: hub.clone(),
                leadership,
                authz: authz.clone(),
            })
            .max_encoding_message_size(palisade_proto::MAX_PLAN_MESSAGE_BYTES)
            .max_decoding_message_size(palisade_proto::MAX_PLAN_MESSAGE_BYTES),
        )
        .add_service(DebugServiceServer::with_interceptor(
            DebugServer {
                hub,
                refusals: authz.refusals,
            },
            operator_only,
        ));
    Ok((router, health_only))
}
