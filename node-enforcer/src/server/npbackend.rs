//! The AWS VPC CNI's NPBackend service, so that CNI can call Palisade
//! unchanged. Its requests name only the pod; the host interface is derived
//! the way the VPC CNI names it: a prefix and the first 11 hex digits of
//! SHA-1("namespace.name").

use palisade_proto::rpc::{
    np_backend_server::NpBackend as NpBackendService, DeleteNpReply, DeleteNpRequest,
    EnforceNpReply, EnforceNpRequest,
};
use sha1::{Digest, Sha1};
use tonic::{Request, Response, Status};

use crate::desired::PodRuntime;
use crate::handle::Handle;
use crate::reconciler::PodUp;

pub struct NpBackend {
    handle: Handle,
    prefix: String,
}

impl NpBackend {
    pub fn new(handle: Handle, prefix: String) -> Self {
        NpBackend { handle, prefix }
    }
}

/// The host-side veth name the AWS VPC CNI gives a pod.
pub fn aws_host_interface(prefix: &str, namespace: &str, name: &str) -> String {
    let digest = Sha1::digest(format!("{namespace}.{name}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{}", &hex[..11])
}

fn key(namespace: &str, name: &str) -> Result<(String, String), Status> {
    if namespace.is_empty() || name.is_empty() {
        return Err(Status::invalid_argument(
            "K8S_POD_NAMESPACE and K8S_POD_NAME are required",
        ));
    }
    Ok((namespace.to_string(), name.to_string()))
}

#[tonic::async_trait]
impl NpBackendService for NpBackend {
    async fn enforce_np_to_pod(
        &self,
        request: Request<EnforceNpRequest>,
    ) -> Result<Response<EnforceNpReply>, Status> {
        let req = request.into_inner();
        let pod = key(&req.k8s_pod_namespace, &req.k8s_pod_name)?;
        let iface = aws_host_interface(&self.prefix, &pod.0, &pod.1);
        // The VPC CNI says which mode it runs in; empty: the enforcer's own.
        let mode = match req.network_policy_mode.as_str() {
            "" => None,
            m => Some(m.parse().map_err(|e: String| {
                Status::invalid_argument(format!("NETWORK_POLICY_MODE: {e}"))
            })?),
        };
        let up = PodUp {
            pod,
            runtime: PodRuntime {
                container_id: String::new(),
                netns: String::new(),
                host_interfaces: vec![iface],
                // NPBackend does not say; the plan's pod IPs stand in.
                ips: vec![],
                ifindexes: Default::default(),
                mode,
            },
        };
        self.handle
            .pod_up(up)
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(EnforceNpReply { success: true }))
    }

    async fn delete_pod_np(
        &self,
        request: Request<DeleteNpRequest>,
    ) -> Result<Response<DeleteNpReply>, Status> {
        let req = request.into_inner();
        let pod = key(&req.k8s_pod_namespace, &req.k8s_pod_name)?;
        self.handle
            .pod_down(Some(pod), String::new())
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(DeleteNpReply { success: true }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_name_follows_the_vpc_cni() {
        let name = aws_host_interface("eni", "default", "nginx");
        assert_eq!(name.len(), 14);
        assert!(name.starts_with("eni"));
        // SHA-1("default.nginx") begins with these 11 hex digits.
        let digest = Sha1::digest(b"default.nginx");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&name[3..], &hex[..11]);
    }
}
