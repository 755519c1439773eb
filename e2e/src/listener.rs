//! The servers inside each pod: an echo on every declared port.
//!
//! Sockets are created on a thread inside the pod's namespace (a socket
//! belongs to the namespace it was created in, for good) and then served on
//! the lab's tokio runtime, so one runtime serves every pod.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Handle;
use tokio::task::{JoinHandle, JoinSet};

use crate::dns::SharedZone;
use crate::netns::NetNs;
use crate::scenario::{Protocol, ServedPort};

/// The servers of one pod; dropping it stops them and closes their sockets.
#[derive(Default)]
pub struct Listeners {
    tasks: Vec<JoinHandle<()>>,
    /// The SCTP responder (a raw socket on a thread of its own), if the pod
    /// serves SCTP ports: set to stop it.
    sctp_stop: Option<Arc<AtomicBool>>,
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(stop) = &self.sctp_stop {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

enum Bound {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

/// Binds every TCP and UDP port in `ns` and serves them; SCTP ports are
/// answered by one raw-socket responder (see [`crate::sctp`]). `ip`: the
/// address to serve on (`0.0.0.0`: every address of the namespace). A
/// namespace with several addresses (a node's, for a host-network pod)
/// serves on one, so that UDP and SCTP answers leave from the address
/// asked: an unbound socket's answer would take the source address of the
/// route back (a node's pod-side address), which the client ignores.
/// `dns`: the pod is the scenario's DNS server; its UDP port 53 answers
/// from this zone instead of echoing (see [`crate::dns`]).
pub fn start(
    rt: &Handle,
    ns: &NetNs,
    ip: Ipv4Addr,
    ports: &[ServedPort],
    dns: Option<SharedZone>,
) -> Result<Listeners> {
    let sctp_ports: BTreeSet<u16> = ports
        .iter()
        .filter(|p| p.protocol == Protocol::Sctp)
        .map(|p| p.port)
        .collect();
    let sctp_socket = if sctp_ports.is_empty() {
        None
    } else {
        Some(
            ns.run(|| {
                let fd = crate::sctp::raw_socket()?;
                if !ip.is_unspecified() {
                    crate::sctp::bind(&fd, ip)?;
                }
                Ok::<_, anyhow::Error>(fd)
            })?
            .with_context(|| format!("the SCTP responder in netns {}", ns.name()))?,
        )
    };
    let bound = ns.run(|| {
        ports
            .iter()
            .filter(|p| p.protocol != Protocol::Sctp)
            .map(|p| {
                let addr = SocketAddr::from((ip, p.port));
                let sock = match p.protocol {
                    Protocol::Tcp => std::net::TcpListener::bind(addr).map(Bound::Tcp),
                    _ => std::net::UdpSocket::bind(addr).map(Bound::Udp),
                };
                sock.map(|s| (p.port, s)).with_context(|| {
                    format!("binding {} {addr} in netns {}", p.protocol, ns.name())
                })
            })
            .collect::<Result<Vec<_>>>()
    })??;
    let _guard = rt.enter();
    let mut listeners = Listeners::default();
    if let Some(fd) = sctp_socket {
        let stop = Arc::new(AtomicBool::new(false));
        listeners.sctp_stop = Some(stop.clone());
        std::thread::Builder::new()
            .name(format!("sctp-{}", ns.name()))
            .spawn(move || crate::sctp::respond(fd, sctp_ports, stop))
            .context("starting the SCTP responder")?;
    }
    for (port, b) in bound {
        let task = match b {
            Bound::Tcp(l) => {
                l.set_nonblocking(true)?;
                rt.spawn(serve_tcp(tokio::net::TcpListener::from_std(l)?))
            }
            Bound::Udp(s) => {
                s.set_nonblocking(true)?;
                let socket = tokio::net::UdpSocket::from_std(s)?;
                match &dns {
                    Some(zone) if port == crate::dns::DNS_PORT => {
                        rt.spawn(crate::dns::serve(socket, zone.clone()))
                    }
                    _ => rt.spawn(serve_udp(socket)),
                }
            }
        };
        listeners.tasks.push(task);
    }
    Ok(listeners)
}

async fn serve_tcp(listener: tokio::net::TcpListener) {
    // Connections live in this set, so aborting the accept task closes them.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut stream, _)) = accepted else { continue };
                conns.spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_udp(socket: tokio::net::UdpSocket) {
    let mut buf = [0u8; 65536];
    loop {
        if let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..n], peer).await;
        }
    }
}
