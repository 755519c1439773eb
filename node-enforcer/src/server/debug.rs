//! DebugService on the enforcer: a structured dump of the reconciler's state.

use palisade_proto::v1::{
    debug_service_server::DebugService, ExplainRequest, ExplainResponse, GetControllerStateRequest,
    GetControllerStateResponse, GetEnforcerStateRequest, GetEnforcerStateResponse,
    GetRealizationRequest, GetRealizationResponse, InterfaceState, LearnedAddress, LearnedName,
    LearnedPodState, NamesEvictions, NamesState, PolicySetState,
};
use tonic::{Request, Response, Status};

use crate::handle::Handle;
use crate::names::report::{LearnedAddr, Learning};
use crate::reconciler::InterfaceDump;

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
        let names = match self.handle.learning() {
            Some(l) => Some(names_state(l, &d.interfaces).await),
            None => None,
        };
        Ok(Response::new(GetEnforcerStateResponse {
            names,
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

/// The learner's report for the dump, its interfaces named as the
/// reconciler knows them. A learner that stopped says so, and why.
async fn names_state(learning: &Learning, interfaces: &[InterfaceDump]) -> NamesState {
    let servers = learning.servers.iter().map(|s| s.to_string()).collect();
    let r = match learning.report().await {
        Ok(r) => r,
        Err(e) => {
            return NamesState {
                servers,
                learning: false,
                error: e.to_string(),
                ..Default::default()
            }
        }
    };
    let address = |a: &LearnedAddr| LearnedAddress {
        address: a.addr.to_string(),
        expires_in_ms: a.expiry.saturating_sub(r.now) / 1_000_000,
    };
    let pods = r
        .pods
        .iter()
        .map(|p| {
            let known = interfaces.iter().find(|i| i.ifindex == p.ifindex);
            LearnedPodState {
                ifindex: p.ifindex,
                interface: known.map(|i| i.name.clone()).unwrap_or_default(),
                pod: known
                    .and_then(|i| i.pod.as_ref())
                    .map(|p| format!("{}/{}", p.0, p.1))
                    .unwrap_or_default(),
                names: p
                    .names
                    .iter()
                    .map(|(name, addrs)| LearnedName {
                        name: name.clone(),
                        addresses: addrs.iter().map(address).collect(),
                    })
                    .collect(),
                adopted: p.adopted.iter().map(address).collect(),
            }
        })
        .collect();
    NamesState {
        servers,
        learning: true,
        error: String::new(),
        queries: r.counters.queries,
        answers: r.counters.answers,
        answers_learned_from: r.counters.learned,
        ignored: r
            .counters
            .ignored
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        released: r.released,
        reinject_errors: r.reinject_errors,
        write_errors: r.write_errors,
        pending_queries: r.pending_queries as u64,
        evicted: Some(NamesEvictions {
            names: r.evicted.names,
            addresses: r.evicted.addrs,
            entries: r.evicted.entries,
            queries: r.evicted.queries,
            fragments: r.evicted.fragments,
        }),
        overlay_entries: r.overlay_entries as u64,
        pods,
        recent_holds: r.holds.len() as u64,
        hold_p50_us: u64::from(r.holds.percentile_us(50.0)),
        hold_p99_us: u64::from(r.holds.percentile_us(99.0)),
        hold_max_us: u64::from(r.holds.percentile_us(100.0)),
    }
}
