//! Services as the lab realises them: what a `kind: Service` and a
//! `kind: EndpointSlice` say, which backends each service port translates to
//! (as kube-proxy computes them), and the EndpointSlices the EndpointSlice
//! controller would write for a Service with a selector.
//!
//! Everything here is pure; `nat.rs` turns the result into nftables rules and
//! the lab installs them in the node's namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::scenario::{ObjectKey, Protocol, ServiceRef};

/// The lab's Service range (the API server's --service-cluster-ip-range,
/// kubeadm's default): explicit ClusterIPs must be in it, and Services
/// without one get theirs from it.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    /// A container port name, resolved per backend pod.
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
    pub target: TargetPort,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub service: ServiceRef,
    /// The address to translate. None: headless (see `headless`), or not
    /// allocated yet (the scenario gave none; the lab allocates one when
    /// it creates the Service, as the API server does).
    pub cluster_ip: Option<Ipv4Addr>,
    /// `clusterIP: None`: never an address, nothing to translate.
    pub headless: bool,
    pub ports: Vec<ServicePort>,
    /// None: backends come from the scenario's EndpointSlices.
    pub selector: Option<BTreeMap<String, String>>,
}

impl ServiceSpec {
    /// Validates a Service body; errors name the field.
    pub fn parse(body: &Value) -> Result<Self> {
        let meta = &body["metadata"];
        let service = ServiceRef {
            namespace: meta["namespace"].as_str().unwrap_or("default").to_string(),
            name: meta["name"].as_str().unwrap_or_default().to_string(),
        };
        let spec = body
            .get("spec")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("spec: missing or not a mapping"))?;
        for key in spec.keys() {
            if !matches!(
                key.as_str(),
                "clusterIP" | "clusterIPs" | "ports" | "selector" | "type"
            ) {
                bail!("spec.{key}: not supported by the lab (clusterIP, ports, selector, type)");
            }
        }
        if let Some(t) = spec.get("type") {
            if t.as_str() != Some("ClusterIP") {
                bail!("spec.type: only ClusterIP Services are supported by the lab, got {t}");
            }
        }
        let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
        let cluster_ip = match spec.get("clusterIP") {
            None => None,
            Some(Value::String(s)) if s == "None" => None,
            Some(Value::String(s)) => match s.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) if !ip.is_unspecified() && !service_range().contains(&ip) => {
                    bail!("spec.clusterIP: {ip} is not in the lab's Service range {SERVICE_CIDR}")
                }
                Ok(IpAddr::V4(ip)) if !ip.is_unspecified() => Some(ip),
                Ok(IpAddr::V4(_)) => bail!("spec.clusterIP: 0.0.0.0 is not an address"),
                Ok(IpAddr::V6(_)) => {
                    bail!("spec.clusterIP: {s} is IPv6; the lab's Services are IPv4")
                }
                Err(_) => bail!("spec.clusterIP: {s:?} is not an IPv4 address or None"),
            },
            Some(other) => bail!("spec.clusterIP: expected a string, got {other}"),
        };
        if let Some(ips) = spec.get("clusterIPs") {
            if !spec.contains_key("clusterIP") {
                bail!("spec.clusterIPs: given without spec.clusterIP; give both, or neither for an allocated address");
            }
            let want = spec["clusterIP"].clone();
            if ips.as_array().map(|a| a.as_slice()) != Some(std::slice::from_ref(&want)) {
                bail!("spec.clusterIPs: must be [clusterIP] (the lab's Services are single-stack), got {ips}");
            }
        }
        let selector = match spec.get("selector") {
            None => None,
            Some(Value::Object(m)) if m.is_empty() => None,
            Some(Value::Object(m)) => Some(
                m.iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => Ok((k.clone(), s.clone())),
                        other => {
                            bail!("spec.selector.{k}: expected a string, got {other} (quote it)")
                        }
                    })
                    .collect::<Result<BTreeMap<_, _>>>()?,
            ),
            Some(other) => bail!("spec.selector: expected a mapping, got {other}"),
        };
        let list = spec
            .get("ports")
            .ok_or_else(|| anyhow!("spec.ports: missing"))?
            .as_array()
            .ok_or_else(|| anyhow!("spec.ports: expected a list"))?;
        if list.is_empty() && !headless {
            bail!("spec.ports: a Service with a ClusterIP needs at least one port");
        }
        let mut ports: Vec<ServicePort> = Vec::new();
        for (i, p) in list.iter().enumerate() {
            let port = parse_service_port(p).with_context(|| format!("spec.ports[{i}]"))?;
            if list.len() > 1 && port.name.is_empty() {
                bail!("spec.ports[{i}].name: required when a Service has several ports");
            }
            if ports
                .iter()
                .any(|q| q.port == port.port && q.protocol == port.protocol)
            {
                bail!(
                    "spec.ports[{i}]: {} port {} appears twice",
                    port.protocol,
                    port.port
                );
            }
            if !port.name.is_empty() && ports.iter().any(|q| q.name == port.name) {
                bail!("spec.ports[{i}].name: {:?} appears twice", port.name);
            }
            ports.push(port);
        }
        Ok(Self {
            service,
            cluster_ip,
            headless,
            ports,
            selector,
        })
    }

    pub fn port(&self, port: u16, protocol: Protocol) -> Option<&ServicePort> {
        self.ports
            .iter()
            .find(|p| p.port == port && p.protocol == protocol)
    }
}

fn parse_service_port(p: &Value) -> Result<ServicePort> {
    let obj = p
        .as_object()
        .ok_or_else(|| anyhow!("expected a mapping, got {p}"))?;
    for key in obj.keys() {
        if !matches!(key.as_str(), "name" | "port" | "targetPort" | "protocol") {
            bail!("{key}: not supported by the lab (name, port, targetPort, protocol)");
        }
    }
    let name = match obj.get("name") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => bail!("name: expected a string, got {other}"),
    };
    let port = port_number("port", obj.get("port"))?.ok_or_else(|| anyhow!("port: missing"))?;
    let protocol = protocol_of(obj.get("protocol"))?;
    let target = match obj.get("targetPort") {
        None => TargetPort::Number(port),
        Some(Value::String(s)) if s.parse::<u16>().is_ok() => {
            bail!("targetPort: {s:?} is a quoted number; write it unquoted")
        }
        Some(Value::String(s)) if !s.is_empty() => TargetPort::Name(s.clone()),
        Some(v) => {
            TargetPort::Number(port_number("targetPort", Some(v))?.expect("a value was given"))
        }
    };
    Ok(ServicePort {
        name,
        port,
        protocol,
        target,
    })
}

fn port_number(field: &str, v: Option<&Value>) -> Result<Option<u16>> {
    let Some(v) = v else { return Ok(None) };
    let n = v
        .as_i64()
        .ok_or_else(|| anyhow!("{field}: expected an integer, got {v}"))?;
    u16::try_from(n)
        .ok()
        .filter(|n| *n != 0)
        .map(Some)
        .ok_or_else(|| anyhow!("{field}: {n} is not a port (1-65535)"))
}

fn protocol_of(v: Option<&Value>) -> Result<Protocol> {
    match v.map(|v| v.as_str()) {
        None => Ok(Protocol::Tcp),
        Some(Some("TCP")) => Ok(Protocol::Tcp),
        Some(Some("UDP")) => Ok(Protocol::Udp),
        Some(Some("SCTP")) => {
            bail!("protocol: SCTP Services are not supported by the lab (TCP, UDP)")
        }
        Some(_) => bail!("protocol: expected TCP or UDP, got {}", v.unwrap()),
    }
}

fn service_range() -> ipnet::Ipv4Net {
    SERVICE_CIDR.parse().expect("SERVICE_CIDR is a CIDR")
}

/// How many addresses at the bottom of the range are kept for Services
/// that name their ClusterIP, as the API server keeps them (KEP 3070):
/// range size / 16, at least 16, at most 256.
fn static_band(size: u64) -> u64 {
    (size / 16).clamp(16, 256).min(size)
}

/// A free ClusterIP for a new Service, as the API server's allocator picks
/// one: never one in `used`, never the range's network or broadcast
/// address, from above the static band first (the lowest free one there:
/// the lab is deterministic where the API server is random), then from
/// the band. None: the range is full.
pub fn allocate_cluster_ip(used: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    allocate_in(service_range(), used)
}

fn allocate_in(range: ipnet::Ipv4Net, used: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    let base = u32::from(range.network()) as u64 + 1;
    let size = (1u64 << (32 - range.prefix_len())) - 2;
    let band = static_band(size);
    let pick = |from: u64, to: u64| {
        (from..to)
            .map(|i| Ipv4Addr::from((base + i) as u32))
            .find(|ip| !used.contains(ip))
    };
    pick(band, size).or_else(|| pick(0, band))
}

/// Refuses a set of Services and EndpointSlices the lab cannot realise:
/// a ClusterIP on the bridge chain (see [`BRIDGE_SERVICES`]), one ClusterIP
/// claimed by two Services, and a scenario EndpointSlice for a Service with
/// a selector (those are the EndpointSlice controller's, here the lab's) or
/// named like the lab's own.
pub fn check_realisable(
    services: &[(&ObjectKey, &ServiceSpec)],
    slices: &[(&ObjectKey, &SliceSpec)],
    bridge: bool,
) -> Result<()> {
    for (i, (key, svc)) in services.iter().enumerate() {
        let Some(ip) = svc.cluster_ip else { continue };
        if bridge {
            bail!("{key}: {BRIDGE_SERVICES}");
        }
        if let Some((other, _)) = services[..i].iter().find(|(_, s)| s.cluster_ip == Some(ip)) {
            bail!("{key}: clusterIP {ip} is already {other}'s");
        }
    }
    for (key, slice) in slices {
        if let Some((svc, _)) = services
            .iter()
            .find(|(_, s)| s.service == slice.service && s.selector.is_some())
        {
            bail!("{key}: {svc} has a selector; its EndpointSlices are the lab's to write (as the EndpointSlice controller's), give slices only for Services without one");
        }
        if let Some((svc, _)) = services.iter().find(|(_, s)| {
            s.selector.is_some()
                && key.namespace.as_deref() == Some(s.service.namespace.as_str())
                && key.name == generated_slice_name(&s.service)
        }) {
            bail!("{key}: that name is the lab's generated EndpointSlice of {svc}; rename it");
        }
    }
    Ok(())
}

/// Why Services with a ClusterIP are refused with the bridge chain.
pub const BRIDGE_SERVICES: &str = "Services with a ClusterIP need cni: ptp; with the bridge chain a backend on the same bridge replies to its client directly, past the node's un-DNAT (a real node needs br_netfilter for that, which the lab does not load: it is global to the machine)";

/// One EndpointSlice given by the scenario (for a Service without selector).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSpec {
    pub service: ServiceRef,
    /// Ready endpoints' addresses.
    pub addresses: Vec<Ipv4Addr>,
    /// Port name to (port, protocol).
    pub ports: Vec<(String, u16, Protocol)>,
}

impl SliceSpec {
    pub fn parse(body: &Value) -> Result<Self> {
        let meta = &body["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or("default").to_string();
        let service = meta["labels"][SERVICE_NAME_LABEL]
            .as_str()
            .ok_or_else(|| {
                anyhow!("metadata.labels: an EndpointSlice needs {SERVICE_NAME_LABEL} naming its Service")
            })?
            .to_string();
        match body.get("addressType").and_then(Value::as_str) {
            Some("IPv4") => {}
            Some(other) => bail!("addressType: the lab's Services are IPv4, got {other:?}"),
            None => bail!("addressType: missing (IPv4)"),
        }
        let mut addresses = Vec::new();
        let endpoints = match body.get("endpoints") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(other) => bail!("endpoints: expected a list, got {other}"),
        };
        for (i, ep) in endpoints.iter().enumerate() {
            let at = format!("endpoints[{i}]");
            let list = ep["addresses"]
                .as_array()
                .ok_or_else(|| anyhow!("{at}.addresses: missing or not a list"))?;
            if list.len() != 1 {
                bail!("{at}.addresses: expected exactly one address");
            }
            let ip: Ipv4Addr = list[0]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("{at}.addresses[0]: not an IPv4 address: {}", list[0]))?;
            // kube-proxy sends to ready endpoints only; absent means ready.
            let ready = match &ep["conditions"]["ready"] {
                Value::Null => true,
                Value::Bool(b) => *b,
                other => bail!("{at}.conditions.ready: expected a boolean, got {other}"),
            };
            if ready {
                addresses.push(ip);
            }
        }
        let mut ports = Vec::new();
        let list = match body.get("ports") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(other) => bail!("ports: expected a list, got {other}"),
        };
        for (i, p) in list.iter().enumerate() {
            let at = format!("ports[{i}]");
            let name = match p.get("name") {
                None => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => bail!("{at}.name: expected a string, got {other}"),
            };
            let port = port_number(&format!("{at}.port"), p.get("port"))?
                .ok_or_else(|| anyhow!("{at}.port: missing"))?;
            let protocol = protocol_of(p.get("protocol")).with_context(|| at.clone())?;
            ports.push((name, port, protocol));
        }
        Ok(Self {
            service: ServiceRef {
                namespace,
                name: service,
            },
            addresses,
            ports,
        })
    }
}

/// A pod as the Service machinery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// None while the pod has no address (not a backend yet).
    pub ip: Option<Ipv4Addr>,
    /// Named container ports: (name, protocol, port).
    pub named_ports: Vec<(String, Protocol, u16)>,
}

impl PodView {
    /// From a Pod body (as validated by the scenario) and its address.
    pub fn from_body(body: &Value, ip: Option<Ipv4Addr>) -> Self {
        let meta = &body["metadata"];
        let labels = meta["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let mut named_ports = Vec::new();
        for c in body["spec"]["containers"].as_array().into_iter().flatten() {
            for p in c["ports"].as_array().into_iter().flatten() {
                let (Some(name), Some(port)) = (p["name"].as_str(), p["containerPort"].as_u64())
                else {
                    continue;
                };
                let protocol = p["protocol"]
                    .as_str()
                    .and_then(Protocol::parse)
                    .unwrap_or(Protocol::Tcp);
                named_ports.push((name.to_string(), protocol, port as u16));
            }
        }
        Self {
            namespace: meta["namespace"].as_str().unwrap_or("default").to_string(),
            name: meta["name"].as_str().unwrap_or_default().to_string(),
            labels,
            ip,
            named_ports,
        }
    }

    fn selected_by(&self, svc: &ServiceSpec) -> bool {
        let Some(sel) = &svc.selector else {
            return false;
        };
        self.namespace == svc.service.namespace
            && self.ip.is_some()
            && sel.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }

    /// The port a service port translates to on this pod, as kube-proxy
    /// and the EndpointSlice controller resolve it; None: not a backend of
    /// that port (a named port the pod does not declare).
    fn target_port(&self, sp: &ServicePort) -> Option<u16> {
        match &sp.target {
            TargetPort::Number(n) => Some(*n),
            TargetPort::Name(name) => self
                .named_ports
                .iter()
                .find(|(n, proto, _)| n == name && *proto == sp.protocol)
                .map(|(_, _, port)| *port),
        }
    }
}

/// One service port as the node must translate it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translation {
    pub service: ServiceRef,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub protocol: Protocol,
    /// Sorted; empty: the port has no endpoint and is rejected, as
    /// kube-proxy does.
    pub backends: Vec<SocketAddrV4>,
}

/// Every service port with a ClusterIP and where it goes, sorted by
/// service then port: the node's whole Service state.
pub fn translations(
    services: &[ServiceSpec],
    pods: &[PodView],
    slices: &[SliceSpec],
) -> Vec<Translation> {
    let mut out = Vec::new();
    for svc in services {
        let Some(cluster_ip) = svc.cluster_ip else {
            continue;
        };
        for sp in &svc.ports {
            let mut backends: Vec<SocketAddrV4> = if svc.selector.is_some() {
                pods.iter()
                    .filter(|p| p.selected_by(svc))
                    .filter_map(|p| Some(SocketAddrV4::new(p.ip?, p.target_port(sp)?)))
                    .collect()
            } else {
                // kube-proxy maps a service port to the slice port of the
                // same name; the Service's targetPort plays no part.
                slices
                    .iter()
                    .filter(|s| s.service == svc.service)
                    .flat_map(|s| {
                        let port = s
                            .ports
                            .iter()
                            .find(|(n, _, proto)| *n == sp.name && *proto == sp.protocol)
                            .map(|(_, port, _)| *port);
                        s.addresses
                            .iter()
                            .filter_map(move |ip| Some(SocketAddrV4::new(*ip, port?)))
                    })
                    .collect()
            };
            backends.sort();
            backends.dedup();
            out.push(Translation {
                service: svc.service.clone(),
                cluster_ip,
                port: sp.port,
                protocol: sp.protocol,
                backends,
            });
        }
    }
    out.sort_by(|a, b| (&a.service, a.port, a.protocol).cmp(&(&b.service, b.port, b.protocol)));
    out
}

/// The EndpointSlice the EndpointSlice controller would write for a Service
/// with a selector (one slice, every selected pod with an address; a port
/// whose named target differs between pods would split it, which the lab
/// does not need: a pod without the named port is left out of that port).
/// None for a Service without selector: its slices are the scenario's.
pub fn generated_slice(svc: &ServiceSpec, pods: &[PodView]) -> Option<Value> {
    svc.selector.as_ref()?;
    let selected: Vec<&PodView> = pods.iter().filter(|p| p.selected_by(svc)).collect();
    let ports: Vec<Value> = svc
        .ports
        .iter()
        .filter_map(|sp| {
            let port = selected.iter().find_map(|p| p.target_port(sp))?;
            Some(json!({"name": sp.name, "port": port, "protocol": sp.protocol.as_str()}))
        })
        .collect();
    let endpoints: Vec<Value> = selected
        .iter()
        .map(|p| {
            json!({
                "addresses": [p.ip.expect("selected pods have an address").to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": p.namespace, "name": p.name},
            })
        })
        .collect();
    Some(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": generated_slice_name(&svc.service),
            "namespace": svc.service.namespace,
            "labels": {
                SERVICE_NAME_LABEL: svc.service.name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }))
}

/// `<service>-lab` (the EndpointSlice controller adds a random suffix
/// instead); a scenario slice of that name is refused by the lab.
pub fn generated_slice_name(svc: &ServiceRef) -> String {
    format!("{}-lab", svc.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(yaml: &str) -> Result<ServiceSpec> {
        let mut v: Value = serde_yaml::from_str(yaml).unwrap();
        v["metadata"] = json!({"name": "web", "namespace": "x"});
        ServiceSpec::parse(&v)
    }

    fn pod(name: &str, app: &str, ip: Option<[u8; 4]>, named: &[(&str, u16)]) -> PodView {
        PodView {
            namespace: "x".into(),
            name: name.into(),
            labels: [("app".to_string(), app.to_string())].into(),
            ip: ip.map(Ipv4Addr::from),
            named_ports: named
                .iter()
                .map(|(n, p)| (n.to_string(), Protocol::Tcp, *p))
                .collect(),
        }
    }

    #[test]
    fn service_fields_are_validated_by_name() {
        let e = |y: &str| format!("{:#}", svc(y).unwrap_err());
        assert!(e("{spec: {clusterIP: fd00::1, ports: [{port: 80}]}}").contains("IPv6"));
        assert!(
            e("{spec: {clusterIP: 10.96.0.1, ports: [{port: 80, protocol: SCTP}]}}")
                .contains("spec.ports[0]: protocol: SCTP")
        );
        assert!(e("{spec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}}").contains("port: 0"));
        assert!(
            e("{spec: {clusterIP: 10.96.0.1, ports: [{port: 80}, {port: 81}]}}")
                .contains("name: required")
        );
        assert!(
            e("{spec: {clusterIP: 10.96.0.1, type: NodePort, ports: [{port: 80}]}}")
                .contains("spec.type")
        );
        assert!(
            e("{spec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: '8080'}]}}")
                .contains("quoted number")
        );
        let s = svc("{spec: {clusterIP: None, ports: [], selector: {app: b}}}").unwrap();
        assert_eq!(s.cluster_ip, None);
        let s =
            svc("{spec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: http}]}}").unwrap();
        assert_eq!(s.ports[0].target, TargetPort::Name("http".into()));
        assert_eq!(s.selector, None);
    }

    #[test]
    fn a_missing_cluster_ip_is_to_be_allocated_and_explicit_ones_are_in_range() {
        let s = svc("{spec: {selector: {app: b}, ports: [{port: 80}]}}").unwrap();
        assert_eq!((s.cluster_ip, s.headless), (None, false));
        let s = svc("{spec: {clusterIP: None, ports: []}}").unwrap();
        assert_eq!((s.cluster_ip, s.headless), (None, true));
        let e = |y: &str| format!("{:#}", svc(y).unwrap_err());
        assert!(e("{spec: {ports: []}}").contains("at least one port"));
        assert!(e("{spec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}}")
            .contains("spec.clusterIP: 10.0.0.1 is not in the lab's Service range 10.96.0.0/12"));
        assert!(e("{spec: {clusterIPs: [10.96.0.1], ports: [{port: 80}]}}")
            .contains("spec.clusterIPs: given without spec.clusterIP"));
    }

    #[test]
    fn allocation_skips_the_static_band_and_what_is_taken() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let none = BTreeSet::new();
        // 10.96.0.0/12: 256 addresses after the network address are kept
        // for Services that name theirs.
        assert_eq!(allocate_cluster_ip(&none), Some(ip("10.96.1.1")));
        let taken: BTreeSet<Ipv4Addr> = [ip("10.96.1.1"), ip("10.96.1.2")].into();
        assert_eq!(allocate_cluster_ip(&taken), Some(ip("10.96.1.3")));
        // A /24: a band of 16; once the rest is full, the band is used.
        let small: ipnet::Ipv4Net = "10.96.0.0/24".parse().unwrap();
        assert_eq!(allocate_in(small, &none), Some(ip("10.96.0.17")));
        let upper: BTreeSet<Ipv4Addr> = (17..=254).map(|h| Ipv4Addr::new(10, 96, 0, h)).collect();
        assert_eq!(allocate_in(small, &upper), Some(ip("10.96.0.1")));
        let all: BTreeSet<Ipv4Addr> = (1..=254).map(|h| Ipv4Addr::new(10, 96, 0, h)).collect();
        assert_eq!(
            allocate_in(small, &all),
            None,
            "never the broadcast address"
        );
        assert_eq!(static_band(1 << 20), 256);
        assert_eq!(static_band(100), 16);
        assert_eq!(static_band(10), 10);
    }

    #[test]
    fn selector_backends_resolve_named_ports_per_pod() {
        let s = svc("{spec: {clusterIP: 10.96.0.1, selector: {app: b}, ports: [{name: h, port: 80, targetPort: http}, {name: n, port: 81, targetPort: 8081}]}}").unwrap();
        let pods = [
            pod("b1", "b", Some([10, 244, 0, 3]), &[("http", 8080)]),
            pod("b2", "b", Some([10, 244, 0, 4]), &[("http", 9090)]),
            pod("b3", "b", Some([10, 244, 0, 5]), &[]),
            pod("b4", "b", None, &[("http", 8080)]),
            pod("c", "c", Some([10, 244, 0, 6]), &[("http", 8080)]),
        ];
        let t = translations(std::slice::from_ref(&s), &pods, &[]);
        assert_eq!(t.len(), 2);
        let addr = |a: [u8; 4], p| SocketAddrV4::new(a.into(), p);
        assert_eq!(
            t[0].backends,
            [addr([10, 244, 0, 3], 8080), addr([10, 244, 0, 4], 9090)]
        );
        assert_eq!(
            t[1].backends,
            [
                addr([10, 244, 0, 3], 8081),
                addr([10, 244, 0, 4], 8081),
                addr([10, 244, 0, 5], 8081)
            ]
        );
        let slice = generated_slice(&s, &pods).unwrap();
        assert_eq!(slice["endpoints"].as_array().unwrap().len(), 3);
        assert_eq!(slice["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
    }

    #[test]
    fn selectorless_backends_come_from_slices_by_port_name() {
        let s = svc("{spec: {clusterIP: 10.96.0.1, ports: [{name: h, port: 80, targetPort: 1}]}}")
            .unwrap();
        let slice = SliceSpec::parse(&json!({
            "metadata": {"name": "web-1", "namespace": "x", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.9"]}, {"addresses": ["10.244.0.8"], "conditions": {"ready": false}}],
            "ports": [{"name": "h", "port": 8443}],
        }))
        .unwrap();
        let t = translations(std::slice::from_ref(&s), &[], &[slice]);
        assert_eq!(
            t[0].backends,
            [SocketAddrV4::new([10, 244, 0, 9].into(), 8443)]
        );
        assert!(generated_slice(&s, &[]).is_none());
        let e = SliceSpec::parse(&json!({"metadata": {"name": "s"}, "addressType": "IPv4"}))
            .unwrap_err();
        assert!(e.to_string().contains(SERVICE_NAME_LABEL), "{e}");
    }
}
