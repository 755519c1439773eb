//! Services on the nodes: the EndpointSlices the EndpointSlice controller
//! would write for Services with a selector, and every node's DNAT (the
//! lab's nftables table, kube-proxy style: the same rules on every node),
//! both recomputed from the lab's objects and pod addresses on every change.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};

use super::Lab;
use crate::nat;
use crate::scenario::{CniKind, Kind, Object, ObjectKey, ServiceRef};
use crate::service::{self, PodView, ServiceSpec, SliceSpec};

impl Lab {
    /// Brings the generated EndpointSlices (in the manifest directory, not
    /// yet published) and the node's nftables table in line with the lab's
    /// Services, EndpointSlices and pods. Called before each publish of a
    /// change.
    pub(super) fn sync_services(&mut self) -> Result<()> {
        let (services, slices) = self.service_inputs(self.objects.values())?;
        let pods: Vec<PodView> = self
            .objects
            .values()
            .filter_map(|o| {
                let name = o.key().pod_name()?;
                let ip = match self.pod_ip(&name) {
                    Some(IpAddr::V4(ip)) => Some(ip),
                    _ => None,
                };
                Some(PodView::from_body(o.body(), ip))
            })
            .collect();
        let mut wanted: BTreeMap<ObjectKey, serde_json::Value> = BTreeMap::new();
        for svc in &services {
            if let Some(body) = service::generated_slice(svc, &pods) {
                wanted.insert(generated_key(&svc.service), body);
            }
        }
        for key in self.generated_slices.keys() {
            if !wanted.contains_key(key) {
                self.manifests.remove(key)?;
            }
        }
        for (key, body) in &wanted {
            if self.generated_slices.get(key) != Some(body) {
                self.manifests.write(key, body)?;
            }
        }
        self.generated_slices = wanted;

        let translations = service::translations(&services, &pods, &slices);
        let script = nat::script(&translations);
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            if translations.is_empty() && node.nat_script.is_none() {
                // No Service yet: no table, and no kernel conntrack in the
                // node until a scenario asks for it.
                continue;
            }
            if node.nat_script.as_deref() == Some(script.as_str()) {
                continue;
            }
            self.nft(i, &script)
                .with_context(|| format!("installing the Services' DNAT in {}", node.name))?;
            self.nodes[i].nat_script = Some(script.clone());
        }
        Ok(())
    }

    /// Checks that the lab's objects plus `incoming` (which replace objects
    /// of the same key) make Services the lab can realise, before any of
    /// them is written.
    pub(super) fn check_services(&self, incoming: &[Object]) -> Result<()> {
        let mut all: BTreeMap<&ObjectKey, &Object> = self.objects.iter().collect();
        for o in incoming {
            all.insert(o.key(), o);
        }
        self.service_inputs(all.into_values()).map(|_| ())
    }

    /// The Services and EndpointSlices among `objects`, refusing what the
    /// lab cannot realise.
    fn service_inputs<'a>(
        &self,
        objects: impl Iterator<Item = &'a Object>,
    ) -> Result<(Vec<ServiceSpec>, Vec<SliceSpec>)> {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for o in objects {
            match o.key().kind {
                Kind::Service => services
                    .push(ServiceSpec::parse(o.body()).with_context(|| o.key().to_string())?),
                Kind::EndpointSlice => slices.push((
                    o.key().clone(),
                    SliceSpec::parse(o.body()).with_context(|| o.key().to_string())?,
                )),
                _ => {}
            }
        }
        let keyed: Vec<(ObjectKey, &ServiceSpec)> =
            services.iter().map(|s| (s.service.key(), s)).collect();
        service::check_realisable(
            &keyed.iter().map(|(k, s)| (k, *s)).collect::<Vec<_>>(),
            &slices.iter().map(|(k, s)| (k, s)).collect::<Vec<_>>(),
            self.config.cni == CniKind::Bridge,
        )?;
        Ok((services, slices.into_iter().map(|(_, s)| s).collect()))
    }

    /// Runs an nft script in node `i`'s namespace.
    fn nft(&self, i: usize, script: &str) -> Result<()> {
        let node = self.nodes[i].ns();
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", node.path().display()))
            .args(["nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft (nftables) in the node namespace")?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(script.as_bytes())
            .context("writing the nft script")?;
        let out = child.wait_with_output().context("waiting for nft")?;
        if !out.status.success() {
            bail!(
                "nft -f failed ({}): {}\n--- script\n{script}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Removes the lab's table from node `i`, if it made one.
    pub(super) fn remove_services_table(&mut self, i: usize) -> Result<()> {
        if self.nodes[i].nat_script.take().is_none() || self.nodes[i].ns.is_none() {
            return Ok(());
        }
        self.nft(i, &nat::delete_script())
            .with_context(|| format!("removing the Services' table from {}", self.nodes[i].name))
    }

    /// The ClusterIP of a Service of the lab.
    pub fn cluster_ip(&self, svc: &ServiceRef) -> Result<Ipv4Addr> {
        let object = self
            .objects
            .get(&svc.key())
            .ok_or_else(|| anyhow!("{svc}: no such Service in the lab"))?;
        let spec = ServiceSpec::parse(object.body())?;
        match spec.cluster_ip {
            Some(ip) => Ok(ip),
            None if spec.headless => {
                bail!("{svc} is headless (clusterIP: None): it has no address")
            }
            None => bail!("{svc} has no ClusterIP allocated"),
        }
    }

    /// The nft script last installed in node 1 (None: no table); every
    /// node holds the same.
    pub fn services_ruleset(&self) -> Option<&str> {
        self.nodes[0].nat_script.as_deref()
    }
}

fn generated_key(svc: &ServiceRef) -> ObjectKey {
    ObjectKey {
        kind: Kind::EndpointSlice,
        namespace: Some(svc.namespace.clone()),
        name: service::generated_slice_name(svc),
    }
}

/// Whether the lab's table exists in the namespace `nsenter_net` names
/// (None: this process's own), for leftover checks.
pub fn services_table_exists(nsenter_net: Option<&str>) -> Result<bool> {
    let mut cmd = match nsenter_net {
        Some(path) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={path}")).arg("nft");
            c
        }
        None => Command::new("nft"),
    };
    let out = cmd
        .args(["list", "tables", nat::FAMILY])
        .output()
        .context("running nft list tables")?;
    if !out.status.success() {
        bail!(
            "nft list tables failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == format!("table {} {}", nat::FAMILY, nat::TABLE)))
}
