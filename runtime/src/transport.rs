//! Where a Palisade server listens and how a client reaches it: a unix socket
//! (`unix:/run/palisade/cni.sock`) or TCP (`127.0.0.1:7443`,
//! `http://controller:7443`). One parser for every process keeps the flags
//! consistent.

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// A URI tonic can dial, e.g. `http://10.0.0.1:7443`.
    Tcp(String),
}

impl std::str::FromStr for Address {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            if path.is_empty() {
                return Err(format!("{s:?}: unix socket path is empty"));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        if s.starts_with('/') {
            return Ok(Address::Unix(PathBuf::from(s)));
        }
        let uri = if s.starts_with("http://") || s.starts_with("https://") {
            s.to_string()
        } else {
            format!("http://{s}")
        };
        uri.parse::<tonic::transport::Uri>()
            .map_err(|e| format!("{s:?} is neither unix:PATH nor HOST:PORT: {e}"))?;
        Ok(Address::Tcp(uri))
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(u) => f.write_str(u),
        }
    }
}

/// How a client holds its connection beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// HTTP/2 pings at this interval, and the connection is dropped when one
    /// is not answered within it: a peer that is paused or cut off without
    /// a reset is noticed, not waited on forever.
    pub keepalive: Option<Duration>,
    /// TLS towards a TCP address (the address is dialled as https).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

/// The client side's TLS settings from PEM files: the CA that signed the
/// controller's certificate, optionally this client's certificate and key
/// (mutual TLS), and the name to verify the controller's certificate for.
pub fn client_tls(
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
    server_name: Option<&str>,
) -> Result<tonic::transport::ClientTlsConfig, String> {
    let read =
        |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()));
    let mut cfg = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
    if let Some((cert, key)) = identity {
        cfg = cfg.identity(tonic::transport::Identity::from_pem(
            read(cert)?,
            read(key)?,
        ));
    }
    if let Some(name) = server_name {
        cfg = cfg.domain_name(name);
    }
    Ok(cfg)
}

/// Connects lazily-failing: the error names the address.
pub async fn connect(addr: &Address, timeout: Duration) -> Result<Channel, String> {
    connect_with(addr, timeout, &ClientOptions::default()).await
}

fn with_options(mut e: Endpoint, opts: &ClientOptions) -> Result<Endpoint, String> {
    if let Some(k) = opts.keepalive {
        e = e
            .http2_keep_alive_interval(k)
            .keep_alive_timeout(k)
            .keep_alive_while_idle(true);
    }
    if let Some(tls) = &opts.tls {
        e = e
            .tls_config(tls.clone())
            .map_err(|err| format!("TLS: {}", source_chain(&err)))?;
    }
    Ok(e)
}

/// As [`connect`], with options.
pub async fn connect_with(
    addr: &Address,
    timeout: Duration,
    opts: &ClientOptions,
) -> Result<Channel, String> {
    match addr {
        Address::Unix(path) => {
            let path = path.clone();
            let shown = path.display().to_string();
            // The URI is required by the API but unused: the connector dials
            // the socket.
            with_options(Endpoint::from_static("http://[::]:50051"), opts)?
                .connect_timeout(timeout)
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(|e| format!("cannot connect to unix:{shown}: {}", source_chain(&e)))
        }
        Address::Tcp(uri) => {
            // tonic speaks TLS to https URIs only.
            let uri = match (&opts.tls, uri.strip_prefix("http://")) {
                (Some(_), Some(rest)) => format!("https://{rest}"),
                _ => uri.clone(),
            };
            with_options(
                Endpoint::from_shared(uri.clone()).map_err(|e| format!("{uri}: {e}"))?,
                opts,
            )?
            .connect_timeout(timeout)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {uri}: {}", source_chain(&e)))
        }
    }
}

/// Binds a unix socket, replacing a stale socket file left by a dead process
/// but refusing to replace anything that is not a socket.
pub fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    // Whoever can connect can detach a pod's policy (PodDown): root only,
    // whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// A bound listening socket: connections to it queue from the moment it
/// exists, so a daemon binds before it says it serves.
pub enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    /// Binds `addr`; the error names the address.
    pub async fn bind(addr: &Address) -> Result<Listener, String> {
        match addr {
            Address::Unix(path) => bind_unix(path).map(Listener::Unix),
            Address::Tcp(uri) => {
                let authority = uri
                    .trim_start_matches("http://")
                    .trim_start_matches("https://")
                    .trim_end_matches('/');
                tokio::net::TcpListener::bind(authority)
                    .await
                    .map(Listener::Tcp)
            }
        }
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
    }
}

/// Serves a router on an address until `shutdown` resolves.
pub async fn serve(
    router: tonic::transport::server::Router,
    addr: &Address,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    serve_on(router, Listener::bind(addr).await?, addr, shutdown).await
}

/// Serves a router on a socket already bound to `addr`.
pub async fn serve_on(
    router: tonic::transport::server::Router,
    listener: Listener,
    addr: &Address,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let result = match listener {
        Listener::Unix(l) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(l),
                    shutdown,
                )
                .await
        }
        Listener::Tcp(l) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(l),
                    shutdown,
                )
                .await
        }
    };
    result.map_err(|e| format!("serving {addr}: {}", source_chain(&e)))
}

/// Resolves on SIGINT or SIGTERM: how a daemon learns to stop serving.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        // Without a SIGTERM handler, Ctrl-C still works.
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Error chains from tonic hide the cause ("transport error"); show it.
pub fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unix_sockets_are_private_and_replace_only_stale_sockets() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("palisade-transport-{}", std::process::id()));
        let path = dir.join("a.sock");
        let first = bind_unix(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(first);
        // A stale socket file is replaced.
        let _second = bind_unix(&path).unwrap();
        // Anything else is refused, by name.
        let file = dir.join("not-a-socket");
        std::fs::write(&file, b"x").unwrap();
        let err = bind_unix(&file).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_addresses() {
        assert_eq!(
            "unix:/run/x.sock".parse::<Address>().unwrap(),
            Address::Unix("/run/x.sock".into())
        );
        assert_eq!(
            "/run/x.sock".parse::<Address>().unwrap(),
            Address::Unix("/run/x.sock".into())
        );
        assert_eq!(
            "127.0.0.1:7443".parse::<Address>().unwrap(),
            Address::Tcp("http://127.0.0.1:7443".into())
        );
        assert!("unix:".parse::<Address>().is_err());
        assert!("http://bad host:x".parse::<Address>().is_err());
    }
}
