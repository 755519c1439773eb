//! gRPC clients to the controller and the enforcer over their unix sockets.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use palisade_proto::v1::debug_service_client::DebugServiceClient;
use palisade_proto::v1::{
    GetControllerStateRequest, GetControllerStateResponse, GetEnforcerStateRequest,
    GetEnforcerStateResponse,
};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Bounds every call, so a wedged server fails the wait it is part of
/// instead of hanging it.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub async fn connect(path: &Path) -> Result<Channel> {
    let path: PathBuf = path.to_path_buf();
    let shown = path.display().to_string();
    // The URI is required by the API but unused: the connector dials the socket.
    Endpoint::try_from("http://[::]:50051")?
        .timeout(CALL_TIMEOUT)
        .connect_timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
            }
        }))
        .await
        .with_context(|| format!("connecting to {shown}"))
}

/// The health of `service` on the TCP server at `addr`, dialled from inside
/// the network namespace at `netns` (as a kubelet's gRPC probe).
pub async fn health_in(
    netns: &Path,
    addr: SocketAddr,
    service: &str,
    timeout: Duration,
) -> Result<ServingStatus> {
    let netns = netns.to_path_buf();
    let channel = Endpoint::try_from("http://[::]:50051")?
        .timeout(timeout)
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_| {
            let ns = netns.clone();
            async move {
                let stream = tokio::task::spawn_blocking(move || {
                    crate::netns::connect_in(&ns, addr, timeout)
                })
                .await
                .map_err(std::io::Error::other)??;
                stream.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::TcpStream::from_std(stream)?))
            }
        }))
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .with_context(|| format!("health check of {service:?} on {addr}"))?;
    Ok(resp.into_inner().status())
}

/// The overall health (service "") of the server on `path`.
pub async fn health(path: &Path) -> Result<ServingStatus> {
    let mut client = HealthClient::new(connect(path).await?);
    let resp = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .with_context(|| format!("health check on {}", path.display()))?;
    Ok(resp.into_inner().status())
}

pub async fn controller_state(path: &Path) -> Result<GetControllerStateResponse> {
    let mut client = DebugServiceClient::new(connect(path).await?);
    Ok(client
        .get_controller_state(GetControllerStateRequest {})
        .await
        .with_context(|| format!("GetControllerState on {}", path.display()))?
        .into_inner())
}

pub async fn enforcer_state(path: &Path) -> Result<GetEnforcerStateResponse> {
    let mut client = DebugServiceClient::new(connect(path).await?);
    Ok(client
        .get_enforcer_state(GetEnforcerStateRequest {})
        .await
        .with_context(|| format!("GetEnforcerState on {}", path.display()))?
        .into_inner())
}
