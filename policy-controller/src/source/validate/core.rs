//! Namespace, Pod, Service and Node (core v1) as the API server validates
//! them (kubernetes pkg/apis/core/validation), for what Palisade reads and
//! the structure around it: names, containers and their ports, pod
//! addresses, service ports, selectors and ClusterIPs, a node's taints and
//! pod CIDRs. Rules about fields Palisade never
//! reads (volumes, probes, resources, security contexts...) are not
//! repeated; their field names and types still are checked by the strict
//! decode.
//!
//! Values are judged after the API server's defaulting, so what a default
//! fills (a port's protocol, a Service's type or targetPort) may be absent.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::field::{Errors, Path};
use super::meta;
use super::networkpolicy::PROTOCOLS;

pub const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
pub const SESSION_AFFINITIES: &[&str] = &["ClientIP", "None"];
pub const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];

pub fn namespace(ns: &Namespace, errs: &mut Errors) {
    meta::object_meta(&ns.metadata, false, meta::dns1123_label, errs);
    let path = Path::new("spec").child("finalizers");
    for (i, f) in ns
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        errs.invalid_each(&path.index(i), f.as_str(), meta::qualified_name(f));
        if !f.contains('/') && f != "kubernetes" {
            errs.invalid(
                &path.index(i),
                f.as_str(),
                "name is neither a standard finalizer name nor is it fully qualified",
            );
        }
    }
}

pub const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// A Node. Its status (the addresses a ClusterNetworkPolicy `nodes` peer
/// reads among them) is not validated: the API server takes a node's status
/// as the kubelet reports it, and a non-IP address is simply not an IP.
pub fn node(node: &Node, errs: &mut Errors) {
    meta::object_meta(&node.metadata, false, meta::dns1123_subdomain, errs);
    let Some(spec) = &node.spec else {
        return;
    };
    let path = Path::new("spec");
    let mut taints = BTreeSet::new();
    for (i, t) in spec.taints.iter().flatten().enumerate() {
        let at = path.child("taints").index(i);
        if t.key.is_empty() {
            errs.required(&at.child("key"), "");
        } else {
            meta::label_key(&t.key, &at.child("key"), errs);
        }
        if let Some(v) = t.value.as_deref() {
            errs.invalid_each(&at.child("value"), v, meta::label_value(v));
        }
        if t.effect.is_empty() {
            errs.required(&at.child("effect"), "");
        } else if !TAINT_EFFECTS.contains(&t.effect.as_str()) {
            errs.not_supported(&at.child("effect"), t.effect.as_str(), TAINT_EFFECTS);
        }
        if !taints.insert((t.key.as_str(), t.effect.as_str())) {
            errs.push(
                &at,
                super::field::Problem::Duplicate(format!(
                    "{:?}: taints must be unique by key and effect pair",
                    format!("{}:{}", t.key, t.effect)
                )),
            );
        }
    }
    // podCIDR is podCIDRs[0] (the API converts one into the other).
    let cidrs: Vec<&String> = match (&spec.pod_cidrs, &spec.pod_cidr) {
        (Some(list), _) if !list.is_empty() => list.iter().collect(),
        (_, Some(one)) if !one.is_empty() => vec![one],
        _ => vec![],
    };
    let at = path.child("podCIDRs");
    for (i, c) in cidrs.iter().enumerate() {
        errs.invalid_each(&at.index(i), c.as_str(), meta::cidr_legacy(c));
    }
    if cidrs.len() > 1 {
        let v4 = cidrs
            .iter()
            .filter_map(|c| crate::cidr::parse_sloppy(c))
            .filter(|n| matches!(n, ipnet::IpNet::V4(_)))
            .count();
        if cidrs.len() > 2 || v4 != 1 {
            errs.invalid(
                &at,
                format!("{cidrs:?}").as_str(),
                "may specify no more than one CIDR for each IP family",
            );
        }
        let mut seen = BTreeSet::new();
        for (i, c) in cidrs.iter().enumerate() {
            if !seen.insert(c.as_str()) {
                errs.duplicate(&at.index(i), c.as_str());
            }
        }
    }
}

pub fn pod(pod: &Pod, errs: &mut Errors) {
    meta::object_meta(&pod.metadata, true, meta::dns1123_subdomain, errs);
    let spec_path = Path::new("spec");
    let default_spec = Default::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    if spec.containers.is_empty() {
        errs.required(&spec_path.child("containers"), "");
    }
    let mut names = BTreeSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        container(c, &spec_path.child("containers").index(i), &mut names, errs);
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        container(
            c,
            &spec_path.child("initContainers").index(i),
            &mut names,
            errs,
        );
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        errs.invalid_each(
            &spec_path.child("nodeName"),
            node,
            meta::dns1123_subdomain(node),
        );
    }
    if spec.host_network == Some(true) {
        // Defaulting copies containerPort into an unset hostPort; any
        // other value cannot be what a host-network pod listens on.
        for (i, c) in spec.containers.iter().enumerate() {
            for (j, p) in c.ports.iter().flatten().enumerate() {
                if let Some(hp) = p.host_port.filter(|hp| *hp != 0 && *hp != p.container_port) {
                    errs.invalid(
                        &spec_path
                            .child("containers")
                            .index(i)
                            .child("ports")
                            .index(j)
                            .child("hostPort"),
                        hp,
                        "must match `containerPort` when `hostNetwork` is true",
                    );
                }
            }
        }
    }
    pod_ips(pod, errs);
}

fn container(c: &Container, path: &Path, names: &mut BTreeSet<String>, errs: &mut Errors) {
    if c.name.is_empty() {
        errs.required(&path.child("name"), "");
    } else {
        errs.invalid_each(
            &path.child("name"),
            c.name.as_str(),
            meta::dns1123_label(&c.name),
        );
        if !names.insert(c.name.clone()) {
            errs.duplicate(&path.child("name"), &c.name);
        }
    }
    if c.image.as_deref().unwrap_or("").is_empty() {
        errs.required(&path.child("image"), "");
    }
    let mut port_names = BTreeSet::new();
    for (i, p) in c.ports.iter().flatten().enumerate() {
        let at = path.child("ports").index(i);
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            let msgs = meta::port_name(name);
            if !msgs.is_empty() {
                errs.invalid_each(&at.child("name"), name, msgs);
            } else if !port_names.insert(name.to_string()) {
                errs.duplicate(&at.child("name"), name);
            }
        }
        if p.container_port == 0 {
            errs.required(&at.child("containerPort"), "");
        } else {
            errs.invalid_each(
                &at.child("containerPort"),
                p.container_port,
                meta::port_number(i64::from(p.container_port)),
            );
        }
        if let Some(hp) = p.host_port.filter(|hp| *hp != 0) {
            errs.invalid_each(&at.child("hostPort"), hp, meta::port_number(i64::from(hp)));
        }
        if let Some(proto) = p.protocol.as_deref() {
            if proto.is_empty() {
                errs.required(&at.child("protocol"), "");
            } else if !PROTOCOLS.contains(&proto) {
                errs.not_supported(&at.child("protocol"), proto, PROTOCOLS);
            }
        }
    }
}

/// `status.podIPs`, as a status update validates them (the manifests stand
/// for what the API serves, status included).
fn pod_ips(pod: &Pod, errs: &mut Errors) {
    let mut normalized = pod.clone();
    normalize_pod_ips(&mut normalized);
    let Some(status) = &normalized.status else {
        return;
    };
    let path = Path::new("status").child("podIPs");
    let ips = status.pod_ips.as_deref().unwrap_or_default();
    let mut parsed = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let msgs = meta::ip_strict(&ip.ip);
        if msgs.is_empty() {
            parsed.push(ip.ip.parse::<IpAddr>().ok());
        }
        errs.invalid_each(&path.index(i), ip.ip.as_str(), msgs);
    }
    if ips.len() > 1 {
        let v4 = parsed.iter().flatten().filter(|ip| ip.is_ipv4()).count();
        let v6 = parsed.iter().flatten().filter(|ip| ip.is_ipv6()).count();
        if ips.len() > 2 || v4 > 1 || v6 > 1 {
            errs.invalid(
                &path,
                "[...]",
                "may specify no more than one IP for each IP family",
            );
        }
        let mut seen = BTreeSet::new();
        for (i, ip) in ips.iter().enumerate() {
            if !seen.insert(ip.ip.as_str()) {
                errs.duplicate(&path.index(i), ip.ip.as_str());
            }
        }
    }
}

/// What the API server stores for a pod's addresses: when `podIP` and
/// `podIPs[0]` disagree, `podIP` wins and is the only address (its
/// conversion rule for older kubelets); a lone `podIP` becomes `podIPs`.
pub fn normalize_pod_ips(pod: &mut Pod) {
    let Some(status) = pod.status.as_mut() else {
        return;
    };
    let Some(ip) = status.pod_ip.clone().filter(|ip| !ip.is_empty()) else {
        return;
    };
    let agrees = status
        .pod_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .is_some_and(|first| first.ip == ip);
    if !agrees {
        status.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP { ip }]);
    }
}

pub fn service(svc: &Service, errs: &mut Errors) {
    meta::object_meta(&svc.metadata, true, meta::dns1035_label, errs);
    let path = Path::new("spec");
    let default_spec = Default::default();
    let spec = svc.spec.as_ref().unwrap_or(&default_spec);
    let ty = spec
        .type_
        .as_deref()
        .filter(|t| !t.is_empty())
        .unwrap_or("ClusterIP");
    let ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec
            .cluster_ip
            .iter()
            .map(String::as_str)
            .filter(|ip| !ip.is_empty())
            .collect(),
    };
    let headless = ips.first() == Some(&"None");
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ports.is_empty() && !headless && ty != "ExternalName" {
        errs.required(&path.child("ports"), "");
    }
    if !SERVICE_TYPES.contains(&ty) {
        errs.not_supported(&path.child("type"), ty, SERVICE_TYPES);
    }
    match ty {
        "LoadBalancer" | "NodePort" if headless => errs.invalid(
            &path.child("clusterIPs").index(0),
            "None",
            format!("may not be set to 'None' for {ty} services"),
        ),
        "ExternalName" => {
            if !ips.is_empty() {
                errs.forbidden(
                    &path.child("clusterIPs"),
                    "may not be set for ExternalName services",
                );
            }
            let cname = spec.external_name.as_deref().unwrap_or("");
            let cname = cname.strip_suffix('.').unwrap_or(cname);
            if cname.is_empty() {
                errs.required(&path.child("externalName"), "");
            } else {
                errs.invalid_each(
                    &path.child("externalName"),
                    cname,
                    meta::dns1123_subdomain(cname),
                );
            }
        }
        _ => {}
    }
    let mut names = BTreeSet::new();
    let mut keys = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = path.child("ports").index(i);
        match p.name.as_deref().filter(|n| !n.is_empty()) {
            None if ports.len() > 1 => errs.required(&at.child("name"), ""),
            None => {}
            Some(name) => {
                errs.invalid_each(&at.child("name"), name, meta::dns1123_label(name));
                if !names.insert(name.to_string()) {
                    errs.duplicate(&at.child("name"), name);
                }
            }
        }
        errs.invalid_each(
            &at.child("port"),
            p.port,
            meta::port_number(i64::from(p.port)),
        );
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        if proto.is_empty() {
            errs.required(&at.child("protocol"), "");
        } else if !PROTOCOLS.contains(&proto) {
            errs.not_supported(&at.child("protocol"), proto, PROTOCOLS);
        }
        match &p.target_port {
            // 0 and "" are defaulted to the port.
            None | Some(IntOrString::Int(0)) => {}
            Some(IntOrString::String(s)) if s.is_empty() => {}
            Some(IntOrString::Int(n)) => errs.invalid_each(
                &at.child("targetPort"),
                *n,
                meta::port_number(i64::from(*n)),
            ),
            Some(IntOrString::String(s)) => {
                errs.invalid_each(&at.child("targetPort"), s.as_str(), meta::port_name(s))
            }
        }
        if let Some(app) = p.app_protocol.as_deref() {
            errs.invalid_each(&at.child("appProtocol"), app, meta::qualified_name(app));
        }
        if ty == "ClusterIP" && p.node_port.is_some_and(|n| n != 0) {
            errs.forbidden(
                &at.child("nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            );
        }
        if !keys.insert((proto.to_string(), p.port)) {
            errs.duplicate(
                &at,
                format!("{{port: {}, protocol: {proto}}}", p.port).as_str(),
            );
        }
    }
    if let Some(sel) = &spec.selector {
        meta::labels(sel, &path.child("selector"), errs);
    }
    if let Some(a) = spec.session_affinity.as_deref().filter(|a| !a.is_empty()) {
        if !SESSION_AFFINITIES.contains(&a) {
            errs.not_supported(&path.child("sessionAffinity"), a, SESSION_AFFINITIES);
        }
    }
    if let Some(p) = spec.internal_traffic_policy.as_deref() {
        if !TRAFFIC_POLICIES.contains(&p) {
            errs.not_supported(&path.child("internalTrafficPolicy"), p, TRAFFIC_POLICIES);
        }
    }
    cluster_ips(
        spec.cluster_ip.as_deref(),
        spec.cluster_ips.as_deref(),
        &path,
        errs,
    );
}

/// ClusterIP and ClusterIPs: each "None" (alone) or an address; the first
/// of the list is clusterIP; at most one per family.
fn cluster_ips(ip: Option<&str>, ips: Option<&[String]>, path: &Path, errs: &mut Errors) {
    let ips = ips.unwrap_or_default();
    if let (Some(ip), Some(first)) = (ip.filter(|ip| !ip.is_empty()), ips.first()) {
        if ip != first {
            errs.invalid(
                &path.child("clusterIPs").index(0),
                first,
                "must match `clusterIP` if not empty",
            );
        }
    }
    let list: Vec<&str> = if ips.is_empty() {
        ip.into_iter().filter(|ip| !ip.is_empty()).collect()
    } else {
        ips.iter().map(String::as_str).collect()
    };
    let at = |i: usize| {
        if ips.is_empty() {
            path.child("clusterIP")
        } else {
            path.child("clusterIPs").index(i)
        }
    };
    if list.len() > 2 {
        errs.invalid(
            &path.child("clusterIPs"),
            "[...]",
            "may only hold up to 2 values",
        );
    }
    let mut families = Vec::new();
    for (i, value) in list.iter().enumerate() {
        if *value == "None" {
            if list.len() > 1 {
                errs.invalid(&at(i), *value, "must not have 'None' along with other IPs");
            }
            continue;
        }
        let msgs = meta::ip_legacy(value);
        if msgs.is_empty() {
            let family = crate::cidr::parse_ip_sloppy(value).is_some_and(|ip| ip.is_ipv4());
            if families.contains(&family) {
                errs.invalid(
                    &path.child("clusterIPs"),
                    "[...]",
                    "may specify no more than one IP for each IP family",
                );
            }
            families.push(family);
        }
        errs.invalid_each(&at(i), *value, msgs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn errors<T: serde::de::DeserializeOwned>(v: Value, f: fn(&T, &mut Errors)) -> Vec<String> {
        let t: T = serde_json::from_value(v).unwrap();
        let mut errs = Errors::default();
        f(&t, &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    fn pod_errors(spec: Value, status: Value) -> Vec<String> {
        errors(
            json!({"metadata": {"name": "p", "namespace": "x"}, "spec": spec, "status": status}),
            pod,
        )
    }

    fn svc_errors(spec: Value) -> Vec<String> {
        errors(
            json!({"metadata": {"name": "s", "namespace": "x"}, "spec": spec}),
            service,
        )
    }

    fn assert_refused(got: Vec<String>, want: &str) {
        assert!(
            got.iter().any(|g| g.starts_with(want)),
            "{got:#?}\n  want {want}"
        );
    }

    #[test]
    fn namespaces() {
        assert!(errors(
            json!({"metadata": {"name": "x", "labels": {"kubernetes.io/metadata.name": "x"}},
            "spec": {"finalizers": ["kubernetes"]}}),
            namespace
        )
        .is_empty());
        assert_refused(
            errors(json!({"metadata": {"name": "x.y"}}), namespace),
            "metadata.name: Invalid value: \"x.y\": must not contain dots",
        );
        assert_refused(
            errors(
                json!({"metadata": {"name": "x"}, "spec": {"finalizers": ["mine"]}}),
                namespace,
            ),
            "spec.finalizers[0]: Invalid value: \"mine\": name is neither",
        );
    }

    #[test]
    fn pods_accepted() {
        let ok = [
            (
                json!({"containers": [{"name": "c", "image": "i"}]}),
                json!({}),
            ),
            (
                json!({"nodeName": "node-1", "containers": [{"name": "c", "image": "i", "ports": [
                {"containerPort": 80, "name": "http"}, {"containerPort": 53, "protocol": "UDP", "name": "dns"},
                {"containerPort": 9, "protocol": "SCTP"}]}, {"name": "d", "image": "i", "ports": [{"containerPort": 80, "name": "http"}]}]}),
                json!({"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}], "phase": "Running"}),
            ),
            (
                json!({"hostNetwork": true, "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 81}]}]}),
                json!({"podIP": "10.0.0.1"}),
            ),
        ];
        for (spec, status) in ok {
            assert_eq!(
                pod_errors(spec.clone(), status),
                Vec::<String>::new(),
                "{spec}"
            );
        }
    }

    #[test]
    fn pods_refused() {
        let c = |ports: Value| json!({"containers": [{"name": "c", "image": "i", "ports": ports}]});
        let cases = [
            (json!({}), json!({}), "spec.containers: Required value"),
            (json!({"containers": [{"image": "i"}]}), json!({}), "spec.containers[0].name: Required value"),
            (json!({"containers": [{"name": "C", "image": "i"}]}), json!({}), "spec.containers[0].name: Invalid value: \"C\""),
            (json!({"containers": [{"name": "c", "image": "i"}, {"name": "c", "image": "i"}]}), json!({}),
             "spec.containers[1].name: Duplicate value: \"c\""),
            (json!({"containers": [{"name": "c", "image": "i"}], "initContainers": [{"name": "c", "image": "i"}]}), json!({}),
             "spec.initContainers[0].name: Duplicate value: \"c\""),
            (json!({"containers": [{"name": "c"}]}), json!({}), "spec.containers[0].image: Required value"),
            (c(json!([{"containerPort": 0}])), json!({}), "spec.containers[0].ports[0].containerPort: Required value"),
            (c(json!([{"containerPort": 70000}])), json!({}),
             "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"),
            (c(json!([{"containerPort": 80, "hostPort": 70000}])), json!({}), "spec.containers[0].ports[0].hostPort: Invalid value: 70000"),
            (c(json!([{"containerPort": 80, "protocol": "ICMP"}])), json!({}),
             "spec.containers[0].ports[0].protocol: Unsupported value: \"ICMP\""),
            (c(json!([{"containerPort": 80, "name": "HTTP"}])), json!({}), "spec.containers[0].ports[0].name: Invalid value: \"HTTP\""),
            (c(json!([{"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "http"}])), json!({}),
             "spec.containers[0].ports[1].name: Duplicate value: \"http\""),
            (json!({"nodeName": "Node_1", "containers": [{"name": "c", "image": "i"}]}), json!({}), "spec.nodeName: Invalid value: \"Node_1\""),
            (json!({"hostNetwork": true, "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 81}]}]}), json!({}),
             "spec.containers[0].ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true"),
            (c(json!([])), json!({"podIPs": [{"ip": "10.0.0.300"}]}), "status.podIPs[0]: Invalid value: \"10.0.0.300\": must be a valid IP"),
            (c(json!([])), json!({"podIPs": [{"ip": "010.0.0.1"}]}), "status.podIPs[0]: Invalid value: \"010.0.0.1\": must not have leading 0s"),
            (c(json!([])), json!({"podIP": "x"}), "status.podIPs[0]: Invalid value: \"x\""),
            (c(json!([])), json!({"podIPs": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}),
             "status.podIPs: Invalid value: \"[...]\": may specify no more than one IP for each IP family"),
            (c(json!([])), json!({"podIPs": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.1"}]}), "status.podIPs[1]: Duplicate value: \"10.0.0.1\""),
        ];
        for (spec, status, want) in cases {
            assert_refused(pod_errors(spec, status), want);
        }
    }

    #[test]
    fn pod_ips_are_stored_as_the_api_server_converts_them() {
        let mut p: Pod = serde_json::from_value(json!({"status": {"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}})).unwrap();
        normalize_pod_ips(&mut p);
        let ips: Vec<String> = p
            .status
            .unwrap()
            .pod_ips
            .unwrap()
            .into_iter()
            .map(|i| i.ip)
            .collect();
        assert_eq!(ips, ["10.0.0.2"]);
        let mut p: Pod = serde_json::from_value(json!({"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}})).unwrap();
        normalize_pod_ips(&mut p);
        assert_eq!(p.status.unwrap().pod_ips.unwrap().len(), 2);
        let mut p: Pod = serde_json::from_value(json!({"status": {"podIP": "10.0.0.1"}})).unwrap();
        normalize_pod_ips(&mut p);
        assert_eq!(p.status.unwrap().pod_ips.unwrap()[0].ip, "10.0.0.1");
    }

    #[test]
    fn services_accepted() {
        let ok = [
            json!({"clusterIP": "10.96.0.10", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}),
            json!({"clusterIP": "None", "selector": {"app": "web"}}),
            json!({"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"], "type": "ClusterIP",
                   "ports": [{"name": "a", "port": 80, "targetPort": 8080}, {"name": "b", "port": 80, "protocol": "UDP"},
                             {"name": "c", "port": 81, "targetPort": 0, "appProtocol": "http"}]}),
            json!({"type": "ExternalName", "externalName": "example.com."}),
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}], "sessionAffinity": "ClientIP", "internalTrafficPolicy": "Local"}),
        ];
        for spec in ok {
            assert_eq!(svc_errors(spec.clone()), Vec::<String>::new(), "{spec}");
        }
        assert_refused(
            errors(
                json!({"metadata": {"name": "1web", "namespace": "x"}, "spec": {"clusterIP": "None"}}),
                service,
            ),
            "metadata.name: Invalid value: \"1web\": a DNS-1035 label",
        );
    }

    #[test]
    fn services_refused() {
        let cases = [
            (json!({"clusterIP": "10.96.0.10"}), "spec.ports: Required value"),
            (json!({"ports": [{"port": 80}], "type": "Cluster"}), "spec.type: Unsupported value: \"Cluster\""),
            (json!({"ports": [{"port": 0}]}), "spec.ports[0].port: Invalid value: 0"),
            (json!({"ports": [{"port": 80, "protocol": "ICMP"}]}), "spec.ports[0].protocol: Unsupported value: \"ICMP\""),
            (json!({"ports": [{"port": 80, "name": "a"}, {"port": 81}]}), "spec.ports[1].name: Required value"),
            (json!({"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]}), "spec.ports[1].name: Duplicate value: \"a\""),
            (json!({"ports": [{"port": 80, "name": "A"}]}), "spec.ports[0].name: Invalid value: \"A\""),
            (json!({"ports": [{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]}), "spec.ports[1]: Duplicate value"),
            (json!({"ports": [{"port": 80, "targetPort": 70000}]}), "spec.ports[0].targetPort: Invalid value: 70000"),
            (json!({"ports": [{"port": 80, "targetPort": "8080"}]}), "spec.ports[0].targetPort: Invalid value: \"8080\": must contain at least one letter"),
            (json!({"ports": [{"port": 80, "nodePort": 30000}]}), "spec.ports[0].nodePort: Forbidden"),
            (json!({"ports": [{"port": 80}], "selector": {"app": "a b"}}), "spec.selector: Invalid value: \"a b\""),
            (json!({"ports": [{"port": 80}], "clusterIP": "10.96.0.300"}), "spec.clusterIP: Invalid value: \"10.96.0.300\""),
            (json!({"ports": [{"port": 80}], "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.2"]}), "spec.clusterIPs[0]: Invalid value: \"10.96.0.2\": must match `clusterIP`"),
            (json!({"ports": [{"port": 80}], "clusterIPs": ["10.96.0.1", "10.96.0.2"]}), "spec.clusterIPs: Invalid value: \"[...]\": may specify no more than one IP for each IP family"),
            (json!({"ports": [{"port": 80}], "clusterIPs": ["None", "10.96.0.2"]}), "spec.clusterIPs[0]: Invalid value: \"None\": must not have 'None'"),
            (json!({"ports": [{"port": 80}], "type": "NodePort", "clusterIP": "None"}), "spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services"),
            (json!({"type": "ExternalName"}), "spec.externalName: Required value"),
            (json!({"type": "ExternalName", "externalName": "a", "clusterIP": "10.0.0.1"}), "spec.clusterIPs: Forbidden"),
            (json!({"ports": [{"port": 80}], "sessionAffinity": "Sticky"}), "spec.sessionAffinity: Unsupported value: \"Sticky\""),
            (json!({"ports": [{"port": 80}], "internalTrafficPolicy": "Node"}), "spec.internalTrafficPolicy: Unsupported value"),
        ];
        for (spec, want) in cases {
            assert_refused(svc_errors(spec), want);
        }
    }
}
