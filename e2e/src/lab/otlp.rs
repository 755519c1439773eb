//! Where the lab's processes export traces when a test asks for it: a TCP
//! listener in the fabric namespace, at the controller's address, which
//! both the controller (in the fabric) and every enforcer (routed over the
//! fabric) reach. The lab only binds it and hands it over; the test serves
//! the OTLP receiver on it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;

use anyhow::{Context, Result};

use super::Lab;
use crate::netns::NetNs;

pub(super) struct Listener {
    addr: SocketAddr,
    /// None once the caller took it.
    socket: Option<TcpListener>,
}

impl Listener {
    /// A socket made inside `fabric` stays there for its whole life; port
    /// 0 lets parallel labs never collide.
    pub(super) fn bind(fabric: &NetNs, ip: Ipv4Addr) -> Result<Listener> {
        let socket = fabric
            .run(|| TcpListener::bind((ip, 0)))?
            .with_context(|| format!("binding the OTLP listener on {ip} in {}", fabric.name()))?;
        Ok(Listener {
            addr: socket.local_addr()?,
            socket: Some(socket),
        })
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Lab {
    /// The listener [`super::LabConfig::otlp_listener`] asked for, to serve
    /// an OTLP receiver on; None when not asked for or already taken.
    /// Connections wait in its backlog until it is served.
    pub fn take_otlp_listener(&mut self) -> Option<TcpListener> {
        self.otlp.as_mut().and_then(|l| l.socket.take())
    }

    /// The endpoint the processes export to (`http://IP:PORT`).
    pub fn otlp_endpoint(&self) -> Option<String> {
        self.otlp.as_ref().map(Listener::endpoint)
    }

    pub(super) fn otlp_args(&self, cmd: &mut Command) {
        if let Some(endpoint) = self.otlp_endpoint() {
            cmd.arg("--otlp-endpoint").arg(endpoint);
        }
    }
}
