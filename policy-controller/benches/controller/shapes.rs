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

/// The whole cluster as one view, with `cnps`.
pub fn cluster(
    shape: Shape,
    scale: Scale,
    cnps: Vec<palisade_apis::ClusterNetworkPolicy>,
) -> ClusterState {
    let objects = (0..scale.namespaces)
        .flat_map(|i| namespace_objects(shape, scale, i, true))
        .chain(cnps.into_iter().map(Object::ClusterNetworkPolicy));
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

/// ClusterNetworkPolicies the `cnp` runs add to a shape: how many, and
/// which of them the edit measurements change.
pub const CLUSTER_POLICIES: usize = 100;

/// What subject ClusterNetworkPolicy `k` of [`cluster_policy`] has.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CnpKind {
    /// Every namespace (Admin: monitoring in, metadata out), or every
    /// `app-2` pod (Baseline): the policies an edit of reaches every node.
    Everywhere,
    /// One namespace (Admin).
    OneNamespace,
    /// `app-2` pods of ten namespaces (Admin).
    PodsOfTen,
    /// Five namespaces (Baseline).
    FiveNamespaces,
}

pub fn cnp_kind(k: usize) -> CnpKind {
    match k {
        0 | 1 => CnpKind::Everywhere,
        _ => match k % 3 {
            0 => CnpKind::OneNamespace,
            1 => CnpKind::PodsOfTen,
            _ => CnpKind::FiveNamespaces,
        },
    }
}

fn ns_in(first: usize, n: usize, scale: Scale) -> Value {
    let names: Vec<String> = (first..first + n)
        .map(|i| ns_name(i % scale.namespaces))
        .collect();
    json!({"matchExpressions": [{"key": "app", "operator": "In", "values": names}]})
}

fn ns_is(i: usize, scale: Scale) -> Value {
    json!({"matchLabels": {"app": ns_name(i % scale.namespaces)}})
}

/// ClusterNetworkPolicy `k` (0..[`CLUSTER_POLICIES`]) for the Antrea shape,
/// as the engine receives it: the upstream wire object, read. Admin and
/// Baseline, namespace and pod subjects, rules of every action with
/// namespace, pod and network peers, some with ports. `variant` edits it
/// (another port, another network) without changing its subject.
pub fn cluster_policy(k: usize, scale: Scale, variant: u32) -> palisade_apis::ClusterNetworkPolicy {
    // Policies' namespaces spread over the cluster.
    let at = k * (scale.namespaces / CLUSTER_POLICIES).max(1);
    let tcp = |port: u32| json!({"tcp": {"destinationPort": {"number": port}}});
    let (tier, subject, ingress, egress) = match cnp_kind(k) {
        CnpKind::Everywhere if k == 0 => (
            "Admin",
            json!({"namespaces": {}}),
            json!([{"name": "monitoring", "action": "Accept",
                    "from": [{"pods": {"namespaceSelector": ns_is(at + 1, scale), "podSelector": {}}}],
                    "protocols": [tcp(9100 + variant)]},
                   {"name": "scanners", "action": "Deny",
                    "from": [{"namespaces": ns_is(at + 2, scale)}]}]),
            json!([{"name": "metadata", "action": "Deny",
                    "to": [{"networks": ["169.254.169.254/32"]}]}]),
        ),
        CnpKind::Everywhere => (
            "Baseline",
            json!({"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app-2": "scale-2"}}}}),
            json!([]),
            json!([{"name": "no-lan", "action": "Deny",
                    "to": [{"networks": [format!("192.168.{variant}.0/24"), "172.16.0.0/12"]}]}]),
        ),
        CnpKind::OneNamespace => (
            "Admin",
            json!({"namespaces": ns_is(at, scale)}),
            json!([{"name": "peers", "action": "Accept",
                    "from": [{"pods": {"namespaceSelector": ns_is(at + 1, scale),
                                       "podSelector": {"matchLabels": {"app-1": "scale-1"}}}}]}]),
            json!([{"name": "blocked", "action": "Deny",
                    "to": [{"networks": [format!("10.200.{}.{}/32", k, variant + 1), "10.201.0.0/16"]}]},
                   {"name": "to-shared", "action": "Pass",
                    "to": [{"namespaces": ns_is(at + 2, scale)}],
                    "protocols": [tcp(443)]}]),
        ),
        CnpKind::PodsOfTen => (
            "Admin",
            json!({"pods": {"namespaceSelector": ns_in(at, 10, scale),
                            "podSelector": {"matchLabels": {"app-2": "scale-2"}}}}),
            json!([{"name": "no-ssh", "action": "Deny",
                    "from": [{"namespaces": ns_is(at + 10, scale)}],
                    "protocols": [tcp(22 + variant)]},
                   {"name": "lb", "action": "Accept",
                    "from": [{"namespaces": ns_is(at + 11, scale)}],
                    "protocols": [{"tcp": {"destinationPort": {"range": {"start": 8000, "end": 8100}}}}]}]),
            json!([{"name": "lb-out", "action": "Accept",
                    "to": [{"networks": ["10.202.0.0/16"]}],
                    "protocols": [{"tcp": {"destinationPort": {"range": {"start": 8000, "end": 8100}}}}]}]),
        ),
        CnpKind::FiveNamespaces => (
            "Baseline",
            json!({"namespaces": ns_in(at, 5, scale)}),
            json!([{"name": "team", "action": "Accept",
                    "from": [{"namespaces": ns_in(at, 5, scale)}]}]),
            json!([{"name": "no-partner", "action": "Deny",
                    "to": [{"networks": [format!("172.20.{}.0/24", k + variant as usize)]}]}]),
        ),
    };
    let body = json!({
        "apiVersion": palisade_apis::wire::UPSTREAM_API_VERSION,
        "kind": palisade_apis::wire::CLUSTER_NETWORK_POLICY,
        "metadata": {"name": format!("cnp-{k:03}")},
        "spec": {"tier": tier, "priority": k * 10, "subject": subject,
                 "ingress": ingress, "egress": egress},
    });
    let wire: palisade_apis::wire::UpstreamClusterNetworkPolicy =
        serde_json::from_value(body).expect("a valid ClusterNetworkPolicy");
    let policy = palisade_apis::ClusterNetworkPolicy::from_upstream(&wire);
    // A peer the API does not have (networks in ingress, say) is read as
    // Unknown, which fails closed: a Deny of everything, an edit of which
    // changes nothing. The shape must not measure that.
    assert!(
        policy
            .ingress
            .iter()
            .chain(&policy.egress)
            .flat_map(|r| &r.peers)
            .all(|p| !matches!(p, palisade_apis::Peer::Unknown)),
        "cnp-{k:03}: a peer the API does not have"
    );
    policy
}
