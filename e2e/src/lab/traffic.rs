//! Real traffic from inside the pods.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use super::Lab;
use crate::probe::{self, Outcome};
use crate::scenario::{Forge, PodName, ProbeSpec, Target};

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
                // A name is resolved from the pod itself, on the probe's
                // thread: resolving is part of what the probe tries.
                let to = match &s.to {
                    Target::Name(host) => Dest::Name(self.dns_resolver().context("probe")?, host),
                    other => Dest::Ip(self.resolve(other).context("probe")?),
                };
                let me = match s.forge {
                    None => None,
                    Some(Forge::Reply) => Some(self.forge_source(&s.from)?),
                };
                Ok((&from.netns, to, s, me))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(std::thread::scope(|scope| {
            let handles: Vec<_> = resolved
                .into_iter()
                .map(|(ns, to, s, me)| {
                    scope.spawn(move || {
                        let ip = match to {
                            Dest::Ip(ip) => ip,
                            Dest::Name(server, host) => {
                                match crate::dns::resolve(ns, server, host, s.timeout) {
                                    Ok(r) => r.addrs[0].0,
                                    Err(e) => return Outcome::Error(format!("{e:#}")),
                                }
                            }
                        };
                        let addr = SocketAddr::new(ip, s.port);
                        match (me, addr) {
                            (Some((ip, port)), SocketAddr::V4(to)) => {
                                probe::run_forged(ns, ip, port, to, s.timeout)
                            }
                            (Some(_), SocketAddr::V6(_)) => {
                                Outcome::Error("forged probes are IPv4 only".into())
                            }
                            (None, _) => probe::run(ns, addr, s.protocol, s.timeout),
                        }
                    })
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
        let ip = self.resolve_from(ns, to, timeout)?;
        probe::connect(ns, SocketAddr::new(ip, port), timeout)
            .map_err(|outcome| anyhow!("connect {from} -> {to}:{port}: {outcome}"))
    }

    /// Like [`Lab::connect`], from a chosen source port (IPv4), to reuse a
    /// 5-tuple; close with [`probe::abort`] to reuse it at once.
    pub fn connect_from_port(
        &self,
        from: &PodName,
        source_port: u16,
        to: &Target,
        port: u16,
        timeout: Duration,
    ) -> Result<std::net::TcpStream> {
        let ns = &self
            .pods
            .get(from)
            .ok_or_else(|| anyhow!("connect from {from}: no such pod in the lab"))?
            .netns;
        let ip = match self.resolve_from(ns, to, timeout)? {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => anyhow::bail!("connect from a port: IPv4 only"),
        };
        probe::connect_bound(
            ns,
            source_port,
            std::net::SocketAddrV4::new(ip, port),
            timeout,
        )
        .map_err(|outcome| anyhow!("connect {from}:{source_port} -> {to}:{port}: {outcome}"))
    }

    /// A connected UDP socket from a pod (check it with [`probe::udp_echo`]).
    pub fn connect_udp(
        &self,
        from: &PodName,
        to: &Target,
        port: u16,
    ) -> Result<std::net::UdpSocket> {
        let ns = &self
            .pods
            .get(from)
            .ok_or_else(|| anyhow!("connect from {from}: no such pod in the lab"))?
            .netns;
        let ip = self.resolve_from(ns, to, crate::scenario::DEFAULT_PROBE_TIMEOUT)?;
        probe::connect_udp(ns, SocketAddr::new(ip, port))
            .map_err(|outcome| anyhow!("udp {from} -> {to}:{port}: {outcome}"))
    }

    /// The pod's IPv4 address and a fresh source port for a forged probe:
    /// below the ephemeral range, so no other socket of the pod takes it.
    fn forge_source(&self, pod: &PodName) -> Result<(Ipv4Addr, u16)> {
        let ip = match self.pod_ip(pod) {
            Some(IpAddr::V4(ip)) => ip,
            _ => anyhow::bail!("forged probe from {pod}: the pod has no IPv4 address"),
        };
        let mut b = [0u8; 2];
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .context("reading /dev/urandom for a source port")?;
        Ok((ip, 20_000 + u16::from_be_bytes(b) % 10_000))
    }

    /// A target's address; a name only through [`Lab::resolve_from`].
    fn resolve(&self, to: &Target) -> Result<IpAddr> {
        match to {
            Target::Name(host) => Err(anyhow!(
                "name:{host}: a name is resolved from a pod (Lab::resolve_from)"
            )),
            Target::Ip(ip) => Ok(*ip),
            Target::Service(s) => self.cluster_ip(s).map(IpAddr::V4),
            Target::Pod(p) => self
                .pod_ip(p)
                .ok_or_else(|| anyhow!("{p}: no such pod in the lab")),
        }
    }

    /// A target's address as a pod in `ns` finds it: a name through the
    /// scenario's DNS from that pod (its first address), the rest directly.
    pub fn resolve_from(
        &self,
        ns: &crate::netns::NetNs,
        to: &Target,
        timeout: Duration,
    ) -> Result<IpAddr> {
        match to {
            Target::Name(host) => {
                Ok(crate::dns::resolve(ns, self.dns_resolver()?, host, timeout)?.addrs[0].0)
            }
            other => self.resolve(other),
        }
    }
}

/// Where a probe goes, before its thread runs.
enum Dest<'a> {
    Ip(IpAddr),
    /// Resolved on the probe's thread, from its pod, through this server.
    Name(SocketAddr, &'a str),
}
