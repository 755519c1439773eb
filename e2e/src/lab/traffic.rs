//! Real traffic from inside the pods.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use super::Lab;
use crate::probe::{self, Outcome};
use crate::scenario::{PodName, ProbeSpec, Target};

impl Lab {
    /// Sends real traffic as described by `spec`.
    pub fn probe(&self, spec: &ProbeSpec) -> Result<Outcome> {
        Ok(self.probe_all(std::slice::from_ref(spec))?.remove(0))
    }

    /// Runs the probes concurrently (each waits up to its own timeout).
    pub fn probe_all(&self, specs: &[ProbeSpec]) -> Result<Vec<Outcome>> {
        self.config.cancel.check()?;
        let resolved = specs
            .iter()
            .map(|s| {
                let from = self
                    .pods
                    .get(&s.from)
                    .ok_or_else(|| anyhow!("probe from {}: no such pod in the lab", s.from))?;
                let ip = self.resolve(&s.to).context("probe")?;
                Ok((&from.netns, SocketAddr::new(ip, s.port), s))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(std::thread::scope(|scope| {
            let handles: Vec<_> = resolved
                .into_iter()
                .map(|(ns, addr, s)| {
                    scope.spawn(move || probe::run(ns, addr, s.protocol, s.timeout))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Outcome::Error("probe thread panicked".into()))
                })
                .collect()
        }))
    }

    /// Opens a TCP connection from a pod and keeps it, to check later (with
    /// [`probe::echo`]) that an established flow survives a change.
    pub fn connect(
        &self,
        from: &PodName,
        to: &Target,
        port: u16,
        timeout: Duration,
    ) -> Result<std::net::TcpStream> {
        let ns = &self
            .pods
            .get(from)
            .ok_or_else(|| anyhow!("connect from {from}: no such pod in the lab"))?
            .netns;
        let ip = self.resolve(to)?;
        probe::connect(ns, SocketAddr::new(ip, port), timeout)
            .map_err(|outcome| anyhow!("connect {from} -> {to}:{port}: {outcome}"))
    }

    fn resolve(&self, to: &Target) -> Result<IpAddr> {
        match to {
            Target::Ip(ip) => Ok(*ip),
            Target::Pod(p) => self
                .pod_ip(p)
                .ok_or_else(|| anyhow!("{p}: no such pod in the lab")),
        }
    }
}
