//! DebugService on the enforcer: a structured dump of the reconciler's state.

use palisade_proto::v1::{
    debug_service_server::DebugService, ExplainRequest, ExplainResponse, GetControllerStateRequest,
    GetControllerStateResponse, GetEnforcerStateRequest, GetEnforcerStateResponse,
    GetRealizationRequest, GetRealizationResponse, InterfaceState, PolicySetState,
};
use tonic::{Request, Response, Status};

use crate::handle::Handle;

pub struct DebugServer {
    handle: Handle,
}

impl DebugServer {
    pub fn new(handle: Handle) -> Self {
        DebugServer { handle }
    }
}

#[tonic::async_trait]
impl DebugService for DebugServer {
    async fn get_controller_state(
        &self,
        _: Request<GetControllerStateRequest>,
    ) -> Result<Response<GetControllerStateResponse>, Status> {
        Err(Status::unimplemented(
            "this is a node-enforcer; ask the policy-controller for its state",
        ))
    }

    async fn get_realization(
        &self,
        _: Request<GetRealizationRequest>,
    ) -> Result<Response<GetRealizationResponse>, Status> {
        Err(Status::unimplemented(
            "this is a node-enforcer; realization across nodes is the policy-controller's GetRealization",
        ))
    }

    async fn explain(
        &self,
        _: Request<ExplainRequest>,
    ) -> Result<Response<ExplainResponse>, Status> {
        Err(Status::unimplemented(
            "this is a node-enforcer; Explain is served by the policy-controller, which knows every policy",
        ))
    }

    async fn get_enforcer_state(
        &self,
        _: Request<GetEnforcerStateRequest>,
    ) -> Result<Response<GetEnforcerStateResponse>, Status> {
        let d = self
            .handle
            .dump()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(GetEnforcerStateResponse {
            state: Some(d.state),
            plan_version: d.plan_version,
            plan_connected: d.plan_connected,
            pin_root: d.datapath,
            mode: d.mode.to_string(),
            plan_stream_error: d.plan_stream_error.clone(),
            conntrack: Some(palisade_proto::v1::ConntrackState {
                entries: d.conntrack.last.entries as u64,
                kernel_entries: d.conntrack.last.kernel_entries as u64,
                kept: d.conntrack.last.kept as u64,
                removed: d.conntrack.last.removed as u64,
                took_ms: d.conntrack.last.took.as_millis() as u64,
                finished_unix_ms: d.conntrack.last.finished_unix_ms,
                cleanups: d.conntrack.cleanups,
                removed_total: d.conntrack.removed_total,
                error: d.conntrack.error.clone(),
                listed: d.conntrack.entry_lines().0,
                skipped: d.conntrack.last.skipped.clone(),
                asked_by: d.conntrack.last.asked_by.clone(),
            }),
            warnings: d.warnings,
            node_addresses: d
                .node_addresses
                .iter()
                .map(crate::compile::Prefix::to_wire)
                .collect(),
            policy_sets: d
                .policy_sets
                .into_iter()
                .map(|p| PolicySetState {
                    id: p.name,
                    map_id: p.id,
                    prefix_entries: p.prefix_entries as u32,
                    references: p.references as u32,
                })
                .collect(),
            interfaces: d
                .interfaces
                .into_iter()
                .map(|i| InterfaceState {
                    name: i.name,
                    ifindex: i.ifindex,
                    pod: i
                        .pod
                        .map(|p| format!("{}/{}", p.0, p.1))
                        .unwrap_or_default(),
                    ingress_policy_set: i.ingress,
                    egress_policy_set: i.egress,
                    audit_ingress_policy_set: i.audit_ingress,
                    audit_egress_policy_set: i.audit_egress,
                    attachment: i.attachment.to_string(),
                })
                .collect(),
        }))
    }
}
