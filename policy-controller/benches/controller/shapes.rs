//! Synthetic clusters shaped like Antrea's controller benchmark (namespaces
//! of 4 pods and 3 policies, pods spread over nodes), and a "mixed" variant
//! whose policies also use ipBlock with except, port ranges,
//! namespaceSelector with podSelector, and named ports, and whose
//! namespaces each have a `db` Service (named targetPort), which the `web`
//! pods' egress reaches through its ClusterIP.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use policy_controller::cluster::{ClusterState, Object};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    Antrea,
    Mixed,
}

#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub name: &'static str,
    pub namespaces: usize,
    pub nodes: usize,
}

pub const SMALL: Scale = Scale {
    name: "small",
    namespaces: 1_000,
    nodes: 40,
};
pub const MEDIUM: Scale = Scale {
    name: "medium",
    namespaces: 5_000,
    nodes: 200,
};
pub const FULL: Scale = Scale {
    name: "full",
    namespaces: 25_000,
    nodes: 1_000,
};

pub fn ns_name(i: usize) -> String {
    format!("ns-{i:05}")
}

/// Namespaces that share a team label in the mixed shape.
const TEAM_SIZE: usize = 5;

pub fn team(i: usize) -> String {
    format!("t{}", i / TEAM_SIZE)
}

pub fn namespace(shape: Shape, i: usize, team_of: &str) -> Namespace {
    let name = ns_name(i);
    let labels = match shape {
        Shape::Antrea => json!({"app": name}),
        Shape::Mixed => {
            json!({"team": team_of, "env": if i.is_multiple_of(2) { "prod" } else { "dev" }})
        }
    };
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn ip(index: usize) -> String {
    // 10.0.0.0/8 holds 16M pods; the last octet skips 0.
    format!(
        "10.{}.{}.{}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        (index & 0xff).max(1)
    )
}

/// Pod `j` (0-3) of namespace `i`; `index` numbers it cluster-wide.
pub fn pod(shape: Shape, i: usize, j: usize, index: usize, nodes: usize, app: &str) -> Pod {
    let ports = match (shape, app) {
        (Shape::Mixed, "web") | (Shape::Mixed, "app-1") => {
            json!([{"name": "http", "containerPort": 8080}])
        }
        (Shape::Mixed, _) => json!([{"name": "pg", "containerPort": 5432}]),
        _ => json!([]),
    };
    let labels = match shape {
        Shape::Antrea => {
            let key = if app == "app-1" { "app-1" } else { "app-2" };
            let value = if app == "app-1" { "scale-1" } else { "scale-2" };
            json!({ key: value })
        }
        Shape::Mixed => json!({"app": app}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{j}"), "namespace": ns_name(i), "labels": labels},
        "spec": {"nodeName": format!("node-{:04}", index % nodes), "containers": [{"name": "c", "image": "i", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ip(index)},
    }))
    .unwrap()
}

pub fn default_app(shape: Shape, j: usize) -> &'static str {
    match (shape, j < 2) {
        (Shape::Antrea, true) => "app-1",
        (Shape::Antrea, false) => "app-2",
        (Shape::Mixed, true) => "web",
        (Shape::Mixed, false) => "db",
    }
}

fn policy(ns: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))
        .unwrap()
}

/// The three policies of namespace `i`; `variant` edits one of them.
pub fn policies(shape: Shape, i: usize, variant: u32) -> Vec<NetworkPolicy> {
    let ns = ns_name(i);
    match shape {
        Shape::Antrea => {
            let allow_same = |n: &str, k: &str, v: &str| {
                policy(
                    &ns,
                    n,
                    json!({
                        "podSelector": {"matchLabels": {k: v}},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {k: v}}}]}],
                        "policyTypes": ["Ingress"],
                    }),
                )
            };
            let np1 = if variant == 0 {
                allow_same("np-1", "app-1", "scale-1")
            } else {
                // Edited: np-1 now also lets app-2 pods in.
                policy(
                    &ns,
                    "np-1",
                    json!({
                        "podSelector": {"matchLabels": {"app-1": "scale-1"}},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app-2": "scale-2"}}}]}],
                        "policyTypes": ["Ingress"],
                    }),
                )
            };
            vec![
                policy(
                    &ns,
                    "default-deny-all",
                    json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
                ),
                np1,
                allow_same("np-2", "app-2", "scale-2"),
            ]
        }
        Shape::Mixed => {
            let t = team(i);
            let octet = i % 256;
            let range_end = 8100 + variant;
            vec![
                policy(
                    &ns,
                    "web",
                    json!({
                        "podSelector": {"matchLabels": {"app": "web"}},
                        "policyTypes": ["Ingress", "Egress"],
                        "ingress": [
                            {"from": [{"namespaceSelector": {"matchLabels": {"team": t}},
                                       "podSelector": {"matchLabels": {"app": "web"}}}],
                             "ports": [{"port": "http"}]},
                            {"from": [{"ipBlock": {"cidr": "192.168.0.0/16",
                                                   "except": [format!("192.168.{octet}.0/24")]}}],
                             "ports": [{"port": 8000, "endPort": range_end}]}
                        ],
                        "egress": [
                            {"to": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                             "ports": [{"port": "pg"}]}
                        ],
                    }),
                ),
                policy(
                    &ns,
                    "db",
                    json!({
                        "podSelector": {"matchLabels": {"app": "db"}},
                        "policyTypes": ["Ingress", "Egress"],
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                     "ports": [{"port": "pg"}]}],
                        "egress": [{"to": [{"ipBlock": {"cidr": "172.16.0.0/12",
                                                        "except": ["172.16.5.0/24"]}}],
                                    "ports": [{"port": 5432, "endPort": 5440}]}],
                    }),
                ),
                policy(
                    &ns,
                    "dns",
                    json!({
                        "podSelector": {},
                        "policyTypes": ["Egress"],
                        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": t}}}],
                                    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]}],
                    }),
                ),
            ]
        }
    }
}

/// The `db` Service of namespace `i` (mixed shape): its ClusterIP is in
/// 10.96.0.0/12, apart from the pods'.
pub fn db_service(i: usize) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": ns_name(i)},
        "spec": {
            "selector": {"app": "db"},
            "clusterIP": format!("10.{}.{}.{}", 96 + ((i >> 16) & 0xf), (i >> 8) & 0xff, i & 0xff),
            "ports": [{"name": "pg", "port": 5432, "targetPort": "pg"}],
        },
    }))
    .unwrap()
}

/// The objects of namespace `i`: the namespace, its pods, its Service (mixed)
/// and, with `with_policies`, its policies.
pub fn namespace_objects(shape: Shape, scale: Scale, i: usize, with_policies: bool) -> Vec<Object> {
    let mut objects = vec![Object::Namespace(namespace(shape, i, &team(i)))];
    for j in 0..4 {
        objects.push(Object::Pod(pod(
            shape,
            i,
            j,
            i * 4 + j,
            scale.nodes,
            default_app(shape, j),
        )));
    }
    if with_policies {
        objects.extend(policies(shape, i, 0).into_iter().map(Object::NetworkPolicy));
    }
    if shape == Shape::Mixed {
        objects.push(Object::Service(db_service(i)));
    }
    objects
}

/// The whole cluster as one view.
pub fn cluster(shape: Shape, scale: Scale) -> ClusterState {
    let objects = (0..scale.namespaces).flat_map(|i| namespace_objects(shape, scale, i, true));
    ClusterState::from_objects(objects, "bench".into())
}

/// Median of a list of numbers.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[allow(dead_code)]
pub fn counts(state: &ClusterState) -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("namespaces", state.namespaces.len()),
        ("pods", state.pods.len()),
        ("policies", state.policies.len()),
        ("services", state.services.len()),
    ])
}
