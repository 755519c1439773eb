//! ClusterIPs, as the API server hands them out: a Service created without
//! `spec.clusterIP` gets a free address of the lab's Service range
//! ([`crate::service::SERVICE_CIDR`]), written into the object (both
//! `clusterIP` and `clusterIPs`) so that it stays the same for the
//! object's life; an update that leaves it out keeps it, one that names
//! another is refused (the field is immutable).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::Lab;
use crate::scenario::{Kind, Object};
use crate::service::{allocate_cluster_ip, SERVICE_CIDR};

impl Lab {
    /// `objects` with every Service's ClusterIP filled in.
    pub(super) fn assign_cluster_ips(&self, objects: &[Object]) -> Result<Vec<Object>> {
        let incoming_keys: BTreeSet<_> = objects.iter().map(Object::key).collect();
        // Taken: every address of a Service that stays as it is, and every
        // address the incoming objects name.
        let mut used: BTreeSet<Ipv4Addr> = self
            .objects
            .values()
            .filter(|o| o.key().kind == Kind::Service && !incoming_keys.contains(o.key()))
            .chain(objects.iter().filter(|o| o.key().kind == Kind::Service))
            .filter_map(|o| cluster_ip_of(o.body()))
            .collect();
        let mut out = Vec::with_capacity(objects.len());
        for o in objects {
            if o.key().kind != Kind::Service {
                out.push(o.clone());
                continue;
            }
            let now = self
                .objects
                .get(o.key())
                .map(|e| e.body()["spec"]["clusterIP"].clone());
            let given = o.body()["spec"].get("clusterIP").cloned();
            let ip = match (now, given) {
                (Some(now), Some(given)) if now != given => bail!(
                    "apply {}: spec.clusterIP: field is immutable (it is {now}, the update says {given})",
                    o.key()
                ),
                (_, Some(_)) => {
                    out.push(o.clone());
                    continue;
                }
                (Some(Value::String(now)), None) => now,
                (_, None) => {
                    let ip = allocate_cluster_ip(&used).ok_or_else(|| {
                        anyhow!("apply {}: spec.clusterIP: the Service range {SERVICE_CIDR} is full", o.key())
                    })?;
                    used.insert(ip);
                    ip.to_string()
                }
            };
            let mut body = o.body().clone();
            body["spec"]["clusterIP"] = ip.clone().into();
            body["spec"]["clusterIPs"] = vec![ip].into();
            out.push(Object::from_value(body).with_context(|| format!("apply {}", o.key()))?);
        }
        Ok(out)
    }
}

fn cluster_ip_of(body: &Value) -> Option<Ipv4Addr> {
    body["spec"]["clusterIP"].as_str()?.parse().ok()
}
