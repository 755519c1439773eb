//! The lab's way to the controller when it runs as a pod: a unix socket at
//! the usual place whose every connection is carried to the controller's
//! TCP port in the pod's network namespace, as `kubectl port-forward`
//! would. The pod itself stays as rendered (it listens on TCP only).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::UnixListener;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// How long one connection to the pod may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) struct Forwarder {
    task: JoinHandle<()>,
}

impl Forwarder {
    /// Listens on `socket` (replacing a stale file) and forwards to `addr`
    /// dialled from inside the network namespace at `netns`.
    pub(super) fn start(
        rt: &Runtime,
        socket: &Path,
        netns: &Path,
        addr: SocketAddr,
    ) -> Result<Self> {
        let _ = std::fs::remove_file(socket);
        let listener = {
            let _guard = rt.enter();
            UnixListener::bind(socket)
                .with_context(|| format!("listening on {}", socket.display()))?
        };
        let netns: PathBuf = netns.to_path_buf();
        let task = rt.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let ns = netns.clone();
                tokio::spawn(async move {
                    let upstream = tokio::task::spawn_blocking(move || {
                        crate::netns::connect_in(&ns, addr, CONNECT_TIMEOUT)
                    })
                    .await;
                    // A refused connection closes the client's: the caller
                    // sees the controller as not answering yet.
                    let Ok(Ok(stream)) = upstream else { return };
                    if stream.set_nonblocking(true).is_err() {
                        return;
                    }
                    let Ok(mut server) = tokio::net::TcpStream::from_std(stream) else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Ok(Self { task })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
