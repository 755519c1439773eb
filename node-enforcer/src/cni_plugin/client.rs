//! The only I/O in the plugin: one gRPC call to the enforcer's unix socket.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use palisade_proto::v1::cni_service_client::CniServiceClient;
use palisade_proto::v1::{
    PodCheckRequest, PodCheckResponse, PodDownRequest, PodDownResponse, PodUpRequest, PodUpResponse,
};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use super::error::{code, error_chain, CniError};

/// The enforcer's CniService at a socket path, with one deadline covering
/// connect and call together: the runtime cares about total time, not phases.
#[derive(Debug, Clone)]
pub struct EnforcerClient {
    socket: PathBuf,
    timeout: Duration,
}

impl EnforcerClient {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// Waits, within the deadline, for an enforcer that is not listening
    /// (restarting, or handing the node over in a rollout) to come back:
    /// failing the ADD would cost the pod a kubelet back-off, and the pod
    /// cannot start unenforced either way.
    pub fn pod_up(&self, request: PodUpRequest) -> Result<PodUpResponse, CniError> {
        self.call(
            "PodUp",
            Reconnect::UntilDeadline,
            request,
            |mut client, request| async move { client.pod_up(request).await },
        )
    }

    pub fn pod_down(&self, request: PodDownRequest) -> Result<PodDownResponse, CniError> {
        // One attempt: a DEL must never hold up a sandbox's teardown.
        self.call(
            "PodDown",
            Reconnect::Never,
            request,
            |mut client, request| async move {
                match client.pod_down(request).await {
                    // An unknown pod is already down, and DEL must be idempotent.
                    Err(status) if status.code() == Code::NotFound => {
                        Ok(tonic::Response::new(PodDownResponse {}))
                    }
                    other => other,
                }
            },
        )
    }

    pub fn pod_check(&self, request: PodCheckRequest) -> Result<PodCheckResponse, CniError> {
        self.call(
            "PodCheck",
            Reconnect::Never,
            request,
            |mut client, request| async move { client.pod_check(request).await },
        )
    }

    /// Whether the enforcer reports `service` ("" = the whole process) as
    /// SERVING on gRPC health: the DaemonSet's probes, which cannot reach
    /// a unix socket themselves, run `palisade-cni health`.
    pub fn serving(&self, service: &str) -> Result<bool, CniError> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::HealthCheckRequest;

        let runtime = one_call_runtime()?;
        let socket = self.socket.clone();
        let request = HealthCheckRequest {
            service: service.to_string(),
        };
        let timeout = self.timeout;
        let outcome = runtime.block_on(async move {
            tokio::time::timeout(timeout, async move {
                let channel = connect(&socket).await.map_err(Failure::Connect)?;
                HealthClient::new(channel)
                    .check(request)
                    .await
                    .map_err(Failure::Status)
            })
            .await
        });
        match outcome {
            Ok(Ok(response)) => Ok(response.into_inner().status == ServingStatus::Serving as i32),
            Ok(Err(failure)) => Err(self.map_failure("Health/Check", failure)),
            Err(_elapsed) => Err(self.deadline_error("Health/Check")),
        }
    }

    fn call<Req, Resp, F, Fut>(
        &self,
        rpc: &str,
        reconnect: Reconnect,
        message: Req,
        f: F,
    ) -> Result<Resp, CniError>
    where
        F: FnOnce(CniServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let runtime = one_call_runtime()?;

        let socket = self.socket.clone();
        let timeout = self.timeout;
        let outcome = runtime.block_on(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            tokio::time::timeout_at(deadline, async move {
                let channel = match reconnect {
                    Reconnect::Never => connect(&socket).await.map_err(Failure::Connect)?,
                    Reconnect::UntilDeadline => connect_before(&socket, deadline).await?,
                };
                let mut request = tonic::Request::new(message);
                // Lets the enforcer give up on work whose result nobody will read.
                request.set_timeout(timeout);
                f(CniServiceClient::new(channel), request)
                    .await
                    .map_err(Failure::Status)
            })
            .await
        });

        match outcome {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(Failure::Status(status))) if hit_deadline(&status) => {
                Err(self.deadline_error(rpc))
            }
            Ok(Err(failure)) => Err(self.map_failure(rpc, failure)),
            Err(_elapsed) => Err(self.deadline_error(rpc)),
        }
    }

    fn deadline_error(&self, rpc: &str) -> CniError {
        CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "the enforcer at {} did not complete {rpc} within {}s",
                self.socket.display(),
                self.timeout.as_secs()
            ),
        )
        .with_details(
            "deadline exceeded; raise timeoutSeconds in the network config if the \
             enforcer is slow under load",
        )
    }

    fn map_failure(&self, rpc: &str, failure: Failure) -> CniError {
        let socket = self.socket.display();
        match failure {
            Failure::Connect(e) => CniError::new(
                code::TRY_AGAIN_LATER,
                format!("cannot reach the palisade enforcer at {socket} for {rpc}"),
            )
            .with_details(format!(
                "{}; is the node-enforcer running on this node?",
                error_chain(&e)
            )),
            Failure::NotBack(e, waited) => CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "no palisade enforcer listened at {socket} for {rpc} in the {:.1}s waited for one",
                    waited.as_secs_f64()
                ),
            )
            .with_details(format!(
                "{}; is the node-enforcer running on this node?",
                error_chain(&e)
            )),
            Failure::Status(status) if is_transient(&status) => CniError::new(
                code::TRY_AGAIN_LATER,
                format!("the palisade enforcer at {socket} is unavailable for {rpc}"),
            )
            .with_details(describe_status(&status)),
            Failure::Status(status) => CniError::new(
                code::ENFORCER_REJECTED,
                format!("the palisade enforcer rejected {rpc}: {}", status.message()),
            )
            .with_details(describe_status(&status)),
        }
    }
}

/// A plugin invocation makes one call; a multi-threaded runtime would only
/// add start-up cost.
fn one_call_runtime() -> Result<tokio::runtime::Runtime, CniError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            CniError::new(code::INTERNAL, "failed to start the async runtime")
                .with_details(e.to_string())
        })
}

pub(super) enum Failure {
    Connect(tonic::transport::Error),
    /// Nothing listened on the socket until the deadline.
    NotBack(tonic::transport::Error, Duration),
    Status(Status),
}

/// Whether a call waits for an enforcer that is not listening.
#[derive(Debug, Clone, Copy)]
enum Reconnect {
    Never,
    UntilDeadline,
}

/// The longest pause between two connects to an absent enforcer: a
/// handover's new enforcer binds its socket once it holds the node, and a
/// pod waiting for it should not wait much longer than that.
const RECONNECT_PAUSE_MAX: Duration = Duration::from_millis(100);

/// Connects, trying again while nothing listens on the socket (no file, or
/// a stale one: connection refused), until `deadline`.
pub(super) async fn connect_before(
    socket: &Path,
    deadline: tokio::time::Instant,
) -> Result<Channel, Failure> {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        match connect(socket).await {
            Err(e) if not_listening(&e) => {
                let next = tokio::time::Instant::now() + pause;
                if next >= deadline {
                    return Err(Failure::NotBack(e, started.elapsed()));
                }
                tokio::time::sleep_until(next).await; // back-off between connects
                pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
            }
            other => return other.map_err(Failure::Connect),
        }
    }
}

/// No enforcer listens: its socket file is missing, or left by one that
/// is gone (a bound socket nobody serves refuses the connection).
fn not_listening(e: &tonic::transport::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            );
        }
        source = err.source();
    }
    false
}

async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The URI is required by the API but never dialled: the connector below
    // ignores it and opens the unix socket.
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

/// The deadline can fire in three places (our timer, tonic's client-side
/// grpc-timeout, or the enforcer's); all mean the same to the runtime.
fn hit_deadline(status: &Status) -> bool {
    if status.code() == Code::DeadlineExceeded {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Whether retrying later could succeed. A status carrying a local source
/// error was produced by our side of the connection (the enforcer went away
/// mid-call), not sent by the enforcer.
fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted
    ) || std::error::Error::source(status).is_some()
}

fn describe_status(status: &Status) -> String {
    let mut text = format!("gRPC status {:?}", status.code());
    if !status.message().is_empty() {
        text.push_str(": ");
        text.push_str(status.message());
    }
    if let Some(source) = std::error::Error::source(status) {
        text.push_str(" (");
        text.push_str(&error_chain(source));
        text.push(')');
    }
    text
}
