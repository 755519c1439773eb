//! The enforcer's gRPC services, served on one unix socket: the CNI service,
//! the AWS VPC CNI's NPBackend, the debug dump, health and reflection.

pub mod cni;
pub mod debug;
pub mod npbackend;

use palisade_proto::rpc::np_backend_server::NpBackendServer;
use palisade_proto::v1::cni_service_server::CniServiceServer;
use palisade_proto::v1::debug_service_server::DebugServiceServer;

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::handle::Handle;

/// Why the services could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The reflection service refused the descriptor set.
    #[error("reflection: {0}")]
    Reflection(#[source] tonic_reflection::server::Error),
}

/// Every service of the enforcer, and the health reporter so that health
/// can follow the reconciler rather than just the server.
pub async fn router(
    handle: Handle,
    aws_interface_prefix: String,
) -> Result<(tonic::transport::server::Router, HealthReporter), ServerError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<CniServiceServer<cni::CniServer>>()
        .await;
    health
        .set_serving::<NpBackendServer<npbackend::NpBackend>>()
        .await;
    health
        .set_serving::<DebugServiceServer<debug::DebugServer>>()
        .await;
    let descriptors = [
        palisade_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
    ];
    let mut v1 = tonic_reflection::server::Builder::configure();
    let mut v1alpha = tonic_reflection::server::Builder::configure();
    for d in descriptors {
        v1 = v1.register_encoded_file_descriptor_set(d);
        v1alpha = v1alpha.register_encoded_file_descriptor_set(d);
    }
    // Reflection lists only what this process serves, though the descriptor
    // set describes every Palisade service.
    for n in [
        palisade_proto::service_names::CNI,
        palisade_proto::service_names::NP_BACKEND,
        palisade_proto::service_names::DEBUG,
        "grpc.health.v1.Health",
    ] {
        v1 = v1.with_service_name(n);
        v1alpha = v1alpha.with_service_name(n);
    }
    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(v1.build_v1().map_err(ServerError::Reflection)?)
        .add_service(v1alpha.build_v1alpha().map_err(ServerError::Reflection)?)
        .add_service(CniServiceServer::new(cni::CniServer::new(handle.clone())))
        .add_service(NpBackendServer::new(npbackend::NpBackend::new(
            handle.clone(),
            aws_interface_prefix,
        )))
        .add_service(DebugServiceServer::new(debug::DebugServer::new(handle)));
    Ok((router, health))
}

/// Health for a process whose reconciler is gone: nothing it serves works.
pub async fn set_not_serving(health: &HealthReporter) {
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_not_serving::<CniServiceServer<cni::CniServer>>()
        .await;
    health
        .set_not_serving::<NpBackendServer<npbackend::NpBackend>>()
        .await;
    health
        .set_not_serving::<DebugServiceServer<debug::DebugServer>>()
        .await;
}

/// Health once the reconciler answers again (after a stall).
pub async fn set_serving(health: &HealthReporter) {
    health.set_service_status("", ServingStatus::Serving).await;
    health
        .set_serving::<CniServiceServer<cni::CniServer>>()
        .await;
    health
        .set_serving::<NpBackendServer<npbackend::NpBackend>>()
        .await;
    health
        .set_serving::<DebugServiceServer<debug::DebugServer>>()
        .await;
}
