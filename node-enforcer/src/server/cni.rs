//! CniService: what the palisade-cni plugin calls on pod ADD, DEL and CHECK.

use palisade_proto::v1::{
    cni_service_server::CniService, PodCheckRequest, PodCheckResponse, PodDownRequest,
    PodDownResponse, PodRef, PodUpRequest, PodUpResponse,
};
use tonic::{Request, Response, Status};

use crate::desired::{PodKey, PodRuntime};
use crate::handle::Handle;
use crate::reconciler::{prefixes, PodUp};

pub struct CniServer {
    handle: Handle,
}

impl CniServer {
    pub fn new(handle: Handle) -> Self {
        CniServer { handle }
    }
}

pub fn pod_key(pod: Option<&PodRef>) -> Result<PodKey, Status> {
    let pod = pod.ok_or_else(|| Status::invalid_argument("pod is required"))?;
    if pod.namespace.is_empty() || pod.name.is_empty() {
        return Err(Status::invalid_argument(
            "pod namespace and name are required",
        ));
    }
    Ok((pod.namespace.clone(), pod.name.clone()))
}

#[tonic::async_trait]
impl CniService for CniServer {
    async fn pod_up(
        &self,
        request: Request<PodUpRequest>,
    ) -> Result<Response<PodUpResponse>, Status> {
        let req = request.into_inner();
        let pod = pod_key(req.pod.as_ref())?;
        let ips = prefixes(&req.pod_ips).map_err(Status::invalid_argument)?;
        let up = PodUp {
            pod,
            runtime: PodRuntime {
                container_id: req.container_id,
                netns: req.netns,
                host_interfaces: req.host_interfaces,
                ips,
                ifindexes: Default::default(),
                mode: None,
            },
        };
        let out = self
            .handle
            .pod_up(up)
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(PodUpResponse {
            plan_version: out.plan_version,
            ingress_isolated: out.ingress_isolated,
            egress_isolated: out.egress_isolated,
            policy_realized: out.realized,
            warning: out.warning,
        }))
    }

    async fn pod_down(
        &self,
        request: Request<PodDownRequest>,
    ) -> Result<Response<PodDownResponse>, Status> {
        let req = request.into_inner();
        let pod = match req.pod.as_ref() {
            None => None,
            Some(_) => Some(pod_key(req.pod.as_ref())?),
        };
        self.handle
            .pod_down(pod, req.container_id)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(PodDownResponse {}))
    }

    async fn pod_check(
        &self,
        request: Request<PodCheckRequest>,
    ) -> Result<Response<PodCheckResponse>, Status> {
        let req = request.into_inner();
        let pod = pod_key(req.pod.as_ref())?;
        let state = self
            .handle
            .pod_check(pod, req.container_id)
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(PodCheckResponse { state: Some(state) }))
    }
}
