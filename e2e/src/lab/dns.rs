//! The scenario's DNS in the lab (see [`crate::dns`]): which pod serves
//! it, what it serves now, and where pods send their queries.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use anyhow::{anyhow, Context, Result};

use super::Lab;
use crate::dns::{self, DnsSpec, Records, SharedZone};
use crate::scenario::{PodName, Target};

pub(super) struct LabDns {
    server: PodName,
    learn: bool,
    resolver: Target,
    records: Records,
    /// What the server pod's UDP port 53 answers from.
    zone: SharedZone,
}

impl Lab {
    /// Takes the scenario's DNS; its server pod answers from the records
    /// once it is wired (set this before creating it).
    pub fn set_dns(&mut self, spec: &DnsSpec) -> Result<()> {
        if self.pods.contains_key(&spec.server) {
            anyhow::bail!(
                "dns.server: pod {} already runs its echo on port 53; set the DNS before creating it",
                spec.server
            );
        }
        self.dns = Some(LabDns {
            server: spec.server.clone(),
            learn: spec.learn,
            resolver: spec.resolver.clone(),
            records: spec.records.clone(),
            zone: Arc::new(RwLock::new(Default::default())),
        });
        self.refresh_dns()
    }

    /// The records served from now on (a step's `dns:`).
    pub fn set_dns_records(&mut self, records: &Records) -> Result<()> {
        let d = self
            .dns
            .as_mut()
            .ok_or_else(|| anyhow!("dns records: the lab has no DNS"))?;
        d.records = records.clone();
        self.refresh_dns()
    }

    /// Serves the records with every pod replaced by its address now.
    /// A record naming a pod that has no address yet is an error once the
    /// server pod is up (before, nobody can ask).
    pub fn refresh_dns(&mut self) -> Result<()> {
        let Some(d) = &self.dns else { return Ok(()) };
        let zone = match dns::zone(&d.records, |p| self.pod_ip(p)) {
            Ok(z) => z,
            Err(_) if !self.pods.contains_key(&d.server) => return Ok(()),
            Err(e) => return Err(e).context("dns"),
        };
        *d.zone.write().unwrap_or_else(|e| e.into_inner()) = zone;
        Ok(())
    }

    /// The zone `pod` serves on UDP port 53, when it is the DNS server.
    pub(super) fn dns_zone_of(&self, pod: &PodName) -> Option<SharedZone> {
        self.dns
            .as_ref()
            .filter(|d| &d.server == pod)
            .map(|d| d.zone.clone())
    }

    /// With `dns: {learn: true}`: restarts every enforcer trusting the
    /// resolver's address and the server pod's (`--dns-server`), once both
    /// exist; a no-op otherwise. Follow with [`Lab::wait_realized`].
    pub fn trust_dns(&mut self) -> Result<()> {
        let Some(d) = self.dns.as_ref().filter(|d| d.learn) else {
            return Ok(());
        };
        let server = self
            .pod_ip(&d.server)
            .ok_or_else(|| anyhow!("dns.learn: the server pod {} has no address", d.server))?;
        let resolver = self.dns_resolver()?.ip();
        let flag = format!("--dns-server={resolver},{server}");
        self.config
            .enforcer_args
            .retain(|a| !a.starts_with("--dns-server"));
        self.config.enforcer_args.push(flag);
        for i in 0..self.node_names().len() {
            self.restart_enforcer_of(i)?;
        }
        Ok(())
    }

    /// Where pods send their queries: the resolver's address, port 53.
    pub fn dns_resolver(&self) -> Result<SocketAddr> {
        let d = self
            .dns
            .as_ref()
            .ok_or_else(|| anyhow!("the lab has no DNS (a scenario's dns:)"))?;
        let ip = match &d.resolver {
            Target::Service(s) => self.cluster_ip(s).map(std::net::IpAddr::V4)?,
            Target::Ip(ip) => *ip,
            other => anyhow::bail!("dns resolver {other}: not a Service or an address"),
        };
        Ok(SocketAddr::new(ip, dns::DNS_PORT))
    }
}
