//! Egress to Services.
//!
//! A client's egress hook sits on its pod's veth, before the kernel's DNAT:
//! it sees a Service's ClusterIP, not the backend the connection will be
//! translated to. An egress rule that allows a Service's backends must
//! therefore also allow the ClusterIP, on the service ports that translate
//! to ports the rule allows. Ingress needs nothing of this: the server's
//! hook sees the backend address after DNAT.
//!
//! Which backends: for a Service with a selector, the pods it selects in its
//! namespace (with an address; for a named targetPort, those with a
//! container port of that name and protocol, as the EndpointSlice controller
//! does); for a Service without a selector, the addresses its EndpointSlices
//! list, on the port the slice gives for the service port's name. A rule
//! covers a pod backend when its podSelector/namespaceSelector peers select
//! that pod; it covers an address backend when the address is one of a
//! selected pod's, or lies in one of its ipBlocks (or the rule has no `to`).
//! Headless Services have no ClusterIP to allow: clients reach the pods
//! directly.
//!
//! An ipBlock (or a rule without `to`) does not cover the pods behind a
//! Service with a selector, only EndpointSlice addresses: it would make
//! every such rule depend on every Service of the cluster, so that any
//! backend change anywhere recomputes every pod with an "egress anywhere on
//! port N" rule. Such a rule still allows a ClusterIP its block contains,
//! on its own ports; a Service whose port differs from its targetPort is
//! then not reachable through the ClusterIP unless a selector rule covers
//! its backends (narrower, never wider).
//!
//! Partial coverage: the ClusterIP (on one service port) is allowed only if
//! the rule covers EVERY backend of that port, on that backend's target
//! port. The AWS agent allows it when ANY backend matches; but once the
//! client's egress hook has passed a packet to the ClusterIP, the kernel may
//! translate it to any backend, including one the rule does not allow, and
//! nothing on the client's side sees the packet again. That would let a
//! client reach, through the Service, a pod its egress policy denies (only
//! the server's own ingress policy would stand in the way). So a Service
//! whose backends are only partly allowed is not reachable through its
//! ClusterIP; its allowed pods remain reachable directly. The check is per
//! rule, not over the union of a pod's rules: two rules that each allow half
//! of the backends do not open the ClusterIP (narrower than needed, never
//! wider). A Service port without backends adds nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use palisade_proto::v1::{Protocol, Rule};

use super::objects::{namespace_of, parse_protocol, PodInfo};
use super::peers::{block, block_contains, PeerSelection, PeerSpec, Selected};
use super::ports::{named, range, PortSpec};
use crate::keys::ObjectKey;

/// The label that ties an EndpointSlice to its Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service as egress resolution needs it: its ClusterIPs and, per port,
/// the backends a connection to that port may be translated to.
#[derive(Debug, PartialEq)]
pub(crate) struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePortInfo>,
}

#[derive(Debug, PartialEq)]
pub(crate) struct ServicePortInfo {
    pub protocol: Protocol,
    pub port: u16,
    pub backends: Vec<Backend>,
}

/// Where a connection to a service port may end up, and on which port.
#[derive(Debug, PartialEq)]
pub(crate) enum Backend {
    Pod(Arc<PodInfo>, u16),
    Address(IpAddr, u16),
}

impl ServiceInfo {
    pub fn key(&self) -> ObjectKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// The Service's selector, if it has one. An empty selector is no selector:
/// the API server stores `{}` as absent, and the EndpointSlice controller
/// leaves such a Service to whoever writes its slices.
pub(crate) fn selector_of(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()?
        .selector
        .as_ref()
        .filter(|s| !s.is_empty())
}

pub(crate) fn is_selectorless(svc: &Service) -> bool {
    selector_of(svc).is_none()
}

/// The Service an EndpointSlice belongs to.
pub(crate) fn slice_service(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .map(String::as_str)
}

/// The ClusterIPs, both families; none for a headless Service ("None") or
/// one without an address yet. An address that does not parse is left out.
fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = svc.spec.as_ref() else {
        return vec![];
    };
    let listed: Vec<&String> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    if listed.iter().any(|ip| ip.as_str() == "None") {
        return vec![];
    }
    let ips: BTreeSet<IpAddr> = listed.iter().filter_map(|ip| ip.parse().ok()).collect();
    ips.into_iter().collect()
}

/// A Service's ClusterIPs and backends. `pods` are the pods of its
/// namespace (others are ignored), `slices` its EndpointSlices (others are
/// ignored). None when there is no ClusterIP to allow.
pub(crate) fn service_info<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Arc<PodInfo>>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Option<ServiceInfo> {
    let cluster_ips = cluster_ips(svc);
    if cluster_ips.is_empty() {
        return None;
    }
    let namespace = namespace_of(&svc.metadata);
    let name = svc.metadata.name.clone().unwrap_or_default();
    let spec = svc.spec.as_ref()?;
    let selector = selector_of(svc);
    let pods: Vec<&Arc<PodInfo>> = match selector {
        Some(sel) => pods
            .into_iter()
            .filter(|p| p.namespace == namespace && !p.ips.is_empty())
            .filter(|p| sel.iter().all(|(k, v)| p.labels.get(k) == Some(v)))
            .collect(),
        None => vec![],
    };
    let slices: Vec<&EndpointSlice> = match selector {
        // Slices of a Service with a selector mirror its pods, which are
        // read directly.
        Some(_) => vec![],
        None => slices
            .into_iter()
            .filter(|s| namespace_of(&s.metadata) == namespace)
            .filter(|s| slice_service(s) == Some(name.as_str()))
            .filter(|s| matches!(s.address_type.as_str(), "IPv4" | "IPv6"))
            .collect(),
    };
    let mut ports = Vec::new();
    for sp in spec.ports.iter().flatten() {
        let (Ok(protocol), Ok(port)) = (
            parse_protocol(sp.protocol.as_deref()),
            u16::try_from(sp.port),
        ) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        let mut backends = Vec::new();
        if selector.is_some() {
            for pod in &pods {
                let target = match &sp.target_port {
                    None => Some(port),
                    Some(IntOrString::Int(n)) => u16::try_from(*n).ok().filter(|n| *n != 0),
                    Some(IntOrString::String(name)) => pod
                        .named_ports
                        .get(name)
                        .into_iter()
                        .flatten()
                        .find(|(p, _)| *p == protocol)
                        .map(|(_, n)| *n),
                };
                if let Some(target) = target {
                    backends.push(Backend::Pod((*pod).clone(), target));
                }
            }
        } else {
            // kube-proxy maps a service port to the slice port of the same
            // name; the Service's targetPort plays no part here.
            let port_name = sp.name.as_deref().unwrap_or("");
            let mut addrs = BTreeSet::new();
            for slice in &slices {
                for ep in slice.ports.iter().flatten() {
                    if ep.name.as_deref().unwrap_or("") != port_name
                        || parse_protocol(ep.protocol.as_deref()) != Ok(protocol)
                    {
                        continue;
                    }
                    let Some(target) = ep.port.and_then(|n| u16::try_from(n).ok()) else {
                        continue;
                    };
                    if target == 0 {
                        continue;
                    }
                    for e in &slice.endpoints {
                        for a in &e.addresses {
                            if let Ok(ip) = a.parse::<IpAddr>() {
                                addrs.insert((ip, target));
                            }
                        }
                    }
                }
            }
            backends.extend(addrs.into_iter().map(|(ip, t)| Backend::Address(ip, t)));
        }
        ports.push(ServicePortInfo {
            protocol,
            port,
            backends,
        });
    }
    Some(ServiceInfo {
        namespace,
        name,
        cluster_ips,
        ports,
    })
}

/// The ClusterIP rules one egress rule adds: for each Service all of whose
/// backends (on a port) the rule's peers and ports cover, its ClusterIPs on
/// that service port. See the module docs for why all and not any.
pub(super) fn service_rules(
    selection: &mut dyn PeerSelection,
    peers: &[PeerSpec],
    ports: &[PortSpec],
    coverage: super::rules::ServiceCoverage,
) -> Vec<Rule> {
    let pod_sets: Vec<&Arc<Selected>> = peers
        .iter()
        .filter_map(|p| match p {
            PeerSpec::Pods(s) => Some(s),
            PeerSpec::Block(_) => None,
        })
        .collect();
    let blocks: Vec<_> = peers
        .iter()
        .filter_map(|p| match p {
            PeerSpec::Block(b) => Some(b),
            PeerSpec::Pods(_) => None,
        })
        .collect();
    if blocks.is_empty() && pod_sets.iter().all(|s| s.pods.is_empty()) {
        return vec![];
    }
    // The Services are looked up first (which also records what this
    // target depends on); most rules meet none, and then the selected pods
    // need no indexing.
    let namespaces: BTreeSet<&str> = pod_sets
        .iter()
        .flat_map(|s| s.pods.iter().map(|p| p.namespace.as_str()))
        .collect();
    // Distinct already: one namespace's Services with a selector each, and
    // those without one.
    let mut services: Vec<Arc<ServiceInfo>> = Vec::new();
    for ns in namespaces {
        services.extend(selection.services_in(ns).iter().cloned());
    }
    services.extend(selection.selectorless_services().iter().cloned());
    if services.is_empty() {
        return vec![];
    }
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let backends = |pods: bool| {
        services.iter().any(|s| {
            s.ports
                .iter()
                .flat_map(|p| &p.backends)
                .any(|b| matches!(b, Backend::Pod(..)) == pods)
        })
    };
    // Indexes of the selected pods, built only for the kind of backend met.
    let selected: HashSet<(&str, &str)> = if backends(true) {
        pod_sets
            .iter()
            .flat_map(|s| s.pods.iter())
            .map(|p| (p.namespace.as_str(), p.name.as_str()))
            .collect()
    } else {
        HashSet::new()
    };
    let mut by_ip: HashMap<IpAddr, Vec<&Arc<PodInfo>>> = HashMap::new();
    if backends(false) {
        for pod in pod_sets.iter().flat_map(|s| s.pods.iter()) {
            for ip in &pod.ips {
                by_ip.entry(*ip).or_default().push(pod);
            }
        }
    }
    let covered = |protocol: Protocol, backend: &Backend| match backend {
        Backend::Pod(pod, target) => {
            selected.contains(&(pod.namespace.as_str(), pod.name.as_str()))
                && ports_allow(ports, Some(pod), protocol, *target)
        }
        Backend::Address(ip, target) => {
            by_ip
                .get(ip)
                .into_iter()
                .flatten()
                .any(|pod| ports_allow(ports, Some(pod), protocol, *target))
                || (blocks.iter().any(|b| block_contains(b, *ip))
                    && ports_allow(ports, None, protocol, *target))
        }
    };
    let mut rules = Vec::new();
    for svc in &services {
        let allowed: BTreeSet<(i32, u32)> = svc
            .ports
            .iter()
            .filter(|sp| !sp.backends.is_empty())
            .filter(|sp| match coverage {
                super::rules::ServiceCoverage::Every => {
                    sp.backends.iter().all(|b| covered(sp.protocol, b))
                }
                super::rules::ServiceCoverage::Any => {
                    sp.backends.iter().any(|b| covered(sp.protocol, b))
                }
            })
            .map(|sp| (sp.protocol as i32, u32::from(sp.port)))
            .collect();
        if allowed.is_empty() {
            continue;
        }
        rules.push(Rule {
            peers: svc
                .cluster_ips
                .iter()
                .map(|ip| block(palisade_proto::v1::IpPrefix::host(*ip), vec![]))
                .collect(),
            ports: allowed
                .into_iter()
                .map(|(proto, port)| {
                    range(Protocol::try_from(proto).unwrap_or(Protocol::Tcp), port, 0)
                })
                .collect(),
            ..Default::default()
        });
    }
    rules
}

/// Whether a rule's ports allow `target` on a backend. A named rule port is
/// read off the backend pod, so it never matches an address that is no
/// selected pod's.
fn ports_allow(ports: &[PortSpec], pod: Option<&PodInfo>, protocol: Protocol, target: u16) -> bool {
    if ports.is_empty() {
        return true;
    }
    let target = u32::from(target);
    ports.iter().any(|spec| match spec {
        PortSpec::Numbered(r) => {
            r.protocol == protocol as i32
                && (r.port == 0
                    || r.port == target
                    || (r.end_port != 0 && (r.port..=r.end_port).contains(&target)))
        }
        PortSpec::Named(proto, name) => {
            *proto == protocol
                && pod.is_some_and(|pod| named(pod, *proto, name).iter().any(|r| r.port == target))
        }
    })
}
