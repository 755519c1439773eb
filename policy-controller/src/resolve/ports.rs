//! A rule's ports: numbered ranges, and names read off a pod's containers.

use k8s_openapi::api::networking::v1::NetworkPolicyPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use palisade_proto::v1::{PortRange, Protocol};

use super::objects::{parse_protocol, PodInfo};
use super::rules::{Path, RuleContext};

/// A port entry of a rule before named ports are resolved.
pub(super) enum PortSpec {
    Numbered(PortRange),
    Named(Protocol, String),
}

impl RuleContext<'_> {
    /// The rule's ports; None when a port is invalid, which drops the rule so
    /// an error can only narrow what is allowed.
    pub(super) fn ports(
        &mut self,
        field: &dyn std::fmt::Display,
        ports: Option<&[NetworkPolicyPort]>,
    ) -> Option<Vec<PortSpec>> {
        let mut out = Vec::new();
        for (i, p) in ports.unwrap_or_default().iter().enumerate() {
            let f = Path {
                parent: field,
                key: "ports",
                index: i,
            };
            let proto = match parse_protocol(p.protocol.as_deref()) {
                Ok(proto) => proto,
                Err(e) => {
                    self.error(&f, e);
                    return None;
                }
            };
            match (&p.port, p.end_port) {
                (None, None) => out.push(PortSpec::Numbered(range(proto, 0, 0))),
                (None, Some(_)) => {
                    self.error(&f, "endPort requires port");
                    return None;
                }
                (Some(IntOrString::String(name)), None) => {
                    if let Ok(n) = name.parse::<i32>() {
                        // Tolerate quoted numbers from hand-written manifests.
                        out.push(PortSpec::Numbered(self.number(&f, proto, n, None)?));
                    } else {
                        out.push(PortSpec::Named(proto, name.clone()));
                    }
                }
                (Some(IntOrString::String(_)), Some(_)) => {
                    self.error(&f, "endPort cannot be used with a named port");
                    return None;
                }
                (Some(IntOrString::Int(n)), end) => {
                    out.push(PortSpec::Numbered(self.number(&f, proto, *n, end)?));
                }
            }
        }
        Some(out)
    }

    /// The rule's ports when all are numbered (None: an invalid or a
    /// named one, which drops what they belong to).
    pub(super) fn numbered_ports(
        &mut self,
        field: &dyn std::fmt::Display,
        ports: Option<&[NetworkPolicyPort]>,
    ) -> Option<Vec<PortRange>> {
        self.ports(field, ports)?
            .into_iter()
            .map(|p| match p {
                PortSpec::Numbered(r) => Some(r),
                PortSpec::Named(..) => None,
            })
            .collect()
    }

    fn number(
        &mut self,
        f: &Path<'_>,
        proto: Protocol,
        port: i32,
        end: Option<i32>,
    ) -> Option<PortRange> {
        if !(1..=65535).contains(&port) {
            self.error(f, format!("port {port} is out of range 1-65535"));
            return None;
        }
        if let Some(end) = end {
            if !(1..=65535).contains(&end) || end < port {
                self.error(
                    f,
                    format!("endPort {end} must be between port {port} and 65535"),
                );
                return None;
            }
        }
        Some(range(proto, port as u32, end.map_or(0, |e| e as u32)))
    }
}

pub(super) fn named(pod: &PodInfo, proto: Protocol, name: &str) -> Vec<PortRange> {
    pod.named_ports
        .get(name)
        .into_iter()
        .flatten()
        .filter(|(p, _)| *p == proto)
        .map(|(p, n)| range(*p, u32::from(*n), 0))
        .collect()
}

pub(super) fn range(proto: Protocol, port: u32, end_port: u32) -> PortRange {
    PortRange {
        protocol: proto as i32,
        port,
        end_port,
    }
}
