//! Incremental equals full: random clusters take random sequences of changes
//! (pods added, deleted, relabelled, moved to a node; namespaces relabelled,
//! added, deleted; policies added, edited, deleted; Services with and
//! without selectors, headless and dual-stack, added, edited, deleted;
//! EndpointSlices added, edited, deleted — pod relabels change which pods
//! back a Service; ClusterNetworkPolicies of both tiers and groups added,
//! edited (rules, actions, priorities, subjects), deleted; nodes relabelled
//! and readdressed under `nodes` peers). After every change the
//! engine's plans and errors must equal the full computation
//! (`resolve_cluster`, the oracle), and every node's plan as rebuilt
//! from the deltas it received must equal its full plan, with a new version
//! exactly when its full plan changed.
//!
//! The full computation is itself checked against the reference model on
//! what Services add: for every pod and every ClusterIP and service port,
//! the plan's egress allows the connection exactly when
//! `model::egress_to_service_allowed` does.
//!
//! Changes reach the hub both ways a source can deliver them: as a whole new
//! view (`Hub::update`, which diffs) and as events (`Hub::apply`).

use std::collections::BTreeMap;
use std::sync::Arc;

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_apis::wire::{AwsClusterNetworkPolicy, UpstreamClusterNetworkPolicy};
use palisade_apis::{ApiGroup, ClusterNetworkPolicy};
use palisade_proto::plan::apply_delta;
use palisade_proto::v1::{IpPrefix, PodPolicy, Protocol};
use policy_controller::cluster::{ClusterState, Object};
use policy_controller::engine::Change;
use policy_controller::hub::{delta, Hub, VersionedPlan};
use policy_controller::model::{egress_to_service_allowed, Endpoint};
use policy_controller::resolve::{resolve_cluster, NodePlan, Resolution};
use serde_json::{json, Value};

/// xorshift64*: deterministic, so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const NAMESPACES: [&str; 4] = ["a", "b", "c", "d"];
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const APPS: [&str; 3] = ["web", "db", "cache"];

fn labels(rng: &mut Rng) -> Value {
    let mut l = serde_json::Map::new();
    if rng.chance(85) {
        l.insert("app".into(), json!(rng.pick(&APPS)));
    }
    if rng.chance(40) {
        l.insert("tier".into(), json!(rng.pick(&["1", "2"])));
    }
    Value::Object(l)
}

fn namespace(rng: &mut Rng, name: &str) -> Namespace {
    let mut l = serde_json::Map::new();
    if rng.chance(80) {
        l.insert("team".into(), json!(rng.pick(&["red", "blue"])));
    }
    if rng.chance(30) {
        l.insert("env".into(), json!("prod"));
    }
    serde_json::from_value(json!({"metadata": {"name": name, "labels": l}})).unwrap()
}

fn pod(rng: &mut Rng, ns: &str, name: &str) -> Pod {
    let mut ports = Vec::new();
    if rng.chance(50) {
        ports.push(json!({"name": "http", "containerPort": rng.pick(&[80, 8080])}));
    }
    if rng.chance(30) {
        ports.push(json!({"name": "dns", "containerPort": 53, "protocol": "UDP"}));
    }
    let mut spec = json!({"containers": [{"name": "c", "image": "i", "ports": ports}]});
    if rng.chance(90) {
        spec["nodeName"] = json!(rng.pick(&NODES));
    }
    if rng.chance(5) {
        spec["hostNetwork"] = json!(true);
    }
    let mut status = json!({});
    if rng.chance(85) {
        status["podIP"] = json!(format!("10.0.{}.{}", rng.below(2), rng.below(8)));
    }
    if rng.chance(5) {
        status["phase"] = json!("Succeeded");
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels(rng)},
        "spec": spec,
        "status": status,
    }))
    .unwrap()
}

fn selector(rng: &mut Rng, key: &str, values: &[&str]) -> Value {
    match rng.below(6) {
        0 => json!({}),
        1 | 2 => json!({"matchLabels": {key: rng.pick(values)}}),
        3 => {
            json!({"matchExpressions": [{"key": key, "operator": "In", "values": [rng.pick(values), rng.pick(values)]}]})
        }
        4 => {
            json!({"matchExpressions": [{"key": key, "operator": rng.pick(&["NotIn", "Exists", "DoesNotExist"]), "values": if rng.chance(50) { json!([rng.pick(values)]) } else { json!([]) }}]})
        }
        _ => {
            if rng.chance(15) {
                json!({"matchExpressions": [{"key": key, "operator": "Near"}]})
            } else {
                json!({"matchLabels": {key: rng.pick(values)}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]})
            }
        }
    }
}

fn peer(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => json!({"podSelector": selector(rng, "app", &APPS)}),
        1 => json!({"namespaceSelector": selector(rng, "team", &["red", "blue"])}),
        2 => json!({
            "namespaceSelector": selector(rng, "team", &["red", "blue"]),
            "podSelector": selector(rng, "app", &APPS),
        }),
        3 => {
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": rng.pick(&NAMESPACES)}}})
        }
        _ => {
            if rng.chance(50) {
                json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}})
            } else {
                json!({"ipBlock": {"cidr": "10.0.1.0/29"}})
            }
        }
    }
}

fn ports(rng: &mut Rng) -> Value {
    let mut out = Vec::new();
    for _ in 0..rng.below(3) {
        out.push(match rng.below(4) {
            0 => json!({"port": rng.pick(&[80, 443, 53])}),
            1 => json!({"port": 8000, "endPort": 8100, "protocol": "TCP"}),
            2 => json!({"port": "http"}),
            _ => json!({"port": "dns", "protocol": "UDP"}),
        });
    }
    Value::Array(out)
}

fn rules(rng: &mut Rng, peers_key: &str) -> Value {
    let mut out = Vec::new();
    for _ in 0..rng.below(3) {
        let mut rule = serde_json::Map::new();
        if rng.chance(75) {
            let peers: Vec<Value> = (0..1 + rng.below(2)).map(|_| peer(rng)).collect();
            rule.insert(peers_key.into(), Value::Array(peers));
        }
        if rng.chance(60) {
            rule.insert("ports".into(), ports(rng));
        }
        out.push(Value::Object(rule));
    }
    Value::Array(out)
}

fn policy(rng: &mut Rng, ns: &str, name: &str) -> NetworkPolicy {
    let mut spec = json!({"podSelector": selector(rng, "app", &APPS)});
    if rng.chance(80) {
        spec["ingress"] = rules(rng, "from");
    }
    if rng.chance(50) {
        spec["egress"] = rules(rng, "to");
    }
    if rng.chance(40) {
        spec["policyTypes"] = json!(match rng.below(3) {
            0 => vec!["Ingress"],
            1 => vec!["Egress"],
            _ => vec!["Ingress", "Egress"],
        });
    }
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))
        .unwrap()
}

/// A ClusterNetworkPolicy of either group, tier and a random priority
/// (often equal to another's, which the name then orders), subject and
/// rules of every action.
fn cluster_policy(rng: &mut Rng, group: ApiGroup, name: &str) -> ClusterNetworkPolicy {
    let subject = if rng.chance(50) {
        json!({"namespaces": selector(rng, "team", &["red", "blue"])})
    } else {
        json!({"pods": {"namespaceSelector": selector(rng, "team", &["red", "blue"]),
                        "podSelector": selector(rng, "app", &APPS)}})
    };
    let selector_peer = |rng: &mut Rng| {
        if rng.chance(50) {
            json!({"namespaces": selector(rng, "team", &["red", "blue"])})
        } else {
            json!({"pods": {"namespaceSelector": selector(rng, "team", &["red", "blue"]),
                            "podSelector": selector(rng, "app", &APPS)}})
        }
    };
    let upstream = group == ApiGroup::Upstream;
    let egress_peer = |rng: &mut Rng| match rng.below(5) {
        0 => json!({"networks": [rng.pick(&["10.0.0.0/16", "10.0.1.0/29", "0.0.0.0/0"])]}),
        1 if upstream => json!({"nodes": selector(rng, "zone", &["x", "y"])}),
        // In any action here (the sources refuse all but Accept): a Pass
        // or Deny reads it as unknown and denies everything.
        2 => {
            json!({"domainNames": [rng.pick(&["*.example.com", "api.example.com", "Example.ORG."])]})
        }
        _ => selector_peer(rng),
    };
    let ports = |rng: &mut Rng| -> Option<Value> {
        if rng.chance(40) {
            return None;
        }
        Some(Value::Array(
            (0..1 + rng.below(2))
                .map(|_| match (upstream, rng.below(3)) {
                    (true, 0) => {
                        json!({"tcp": {"destinationPort": {"number": rng.pick(&[80, 443])}}})
                    }
                    (true, 1) => {
                        json!({"udp": {"destinationPort": {"range": {"start": 53, "end": 60}}}})
                    }
                    (true, _) => json!({"destinationNamedPort": "http"}),
                    (false, 0) => json!({"portNumber": {"port": rng.pick(&[80, 443])}}),
                    (false, 1) => json!({"portRange": {"protocol": "UDP", "start": 53, "end": 60}}),
                    (false, _) => json!({"namedPort": "http"}),
                })
                .collect(),
        ))
    };
    let rule = |rng: &mut Rng, egress: bool| {
        let peers: Vec<Value> = (0..1 + rng.below(2))
            .map(|_| {
                if egress {
                    egress_peer(rng)
                } else {
                    selector_peer(rng)
                }
            })
            .collect();
        let mut r = json!({"name": format!("r{}", rng.below(9)),
                           "action": rng.pick(&["Accept", "Deny", "Pass"]),
                           if egress { "to" } else { "from" }: peers});
        if let Some(p) = ports(rng) {
            r[if upstream { "protocols" } else { "ports" }] = p;
        }
        r
    };
    let ingress: Vec<Value> = (0..rng.below(3)).map(|_| rule(rng, false)).collect();
    let egress: Vec<Value> = (0..rng.below(3)).map(|_| rule(rng, true)).collect();
    let mut metadata = json!({"name": name});
    if rng.chance(15) {
        metadata["annotations"] = json!({"palisade.io/audit": "true"});
    }
    let body = json!({
        "metadata": metadata,
        "spec": {"tier": rng.pick(&["Admin", "Baseline"]), "priority": rng.pick(&[0, 5, 5, 1000]),
                 "subject": subject, "ingress": ingress, "egress": egress},
    });
    match group {
        ApiGroup::Upstream => ClusterNetworkPolicy::from_upstream(
            &serde_json::from_value::<UpstreamClusterNetworkPolicy>(body).unwrap(),
        ),
        ApiGroup::Aws => ClusterNetworkPolicy::from_aws(
            &serde_json::from_value::<AwsClusterNetworkPolicy>(body).unwrap(),
        ),
    }
}

/// A node with a zone label and an address inside the ipBlocks policies use.
fn node(rng: &mut Rng, name: &str) -> Node {
    let i = NODES.iter().position(|n| *n == name).unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"zone": rng.pick(&["x", "y"])}},
        "status": {"addresses": [
            {"type": "InternalIP", "address": format!("10.0.1.{}", 1 + i + 3 * rng.below(2))},
            {"type": "Hostname", "address": name},
        ]},
    }))
    .unwrap()
}

const SERVICES: usize = 4;

/// A Service; its ClusterIP follows from its namespace and name, inside the
/// ipBlocks that policies use and apart from every pod address.
fn service(rng: &mut Rng, ns: &str, name: &str) -> Service {
    let i = NAMESPACES.iter().position(|n| *n == ns).unwrap() * SERVICES
        + name[1..].parse::<usize>().unwrap();
    let mut spec = json!({});
    match rng.below(10) {
        0 => spec["clusterIP"] = json!("None"),
        1 => {
            spec["clusterIP"] = json!(format!("10.0.5.{i}"));
            spec["clusterIPs"] = json!([format!("10.0.5.{i}"), format!("fd00::5:{i}")]);
        }
        _ => spec["clusterIP"] = json!(format!("10.0.5.{i}")),
    }
    match rng.below(10) {
        0..=5 => spec["selector"] = json!({"app": rng.pick(&APPS)}),
        6 => spec["selector"] = json!({"app": rng.pick(&APPS), "tier": rng.pick(&["1", "2"])}),
        7 => spec["selector"] = json!({}),
        _ => {}
    }
    let mut ports = Vec::new();
    for (k, name) in ["a", "b"].iter().enumerate().take(1 + rng.below(2)) {
        let number = [80, 443, 53][(k + rng.below(3)) % 3];
        let mut p = json!({"name": name, "port": number});
        if rng.chance(30) {
            p["protocol"] = json!("UDP");
        }
        match rng.below(6) {
            0 => {}
            1 => p["targetPort"] = json!(80),
            2 => p["targetPort"] = json!(8080),
            3 => p["targetPort"] = json!("http"),
            4 => p["targetPort"] = json!("dns"),
            _ => p["targetPort"] = json!(53),
        }
        ports.push(p);
    }
    spec["ports"] = json!(ports);
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))
        .unwrap()
}

fn endpoint_slice(rng: &mut Rng, ns: &str, name: &str) -> EndpointSlice {
    let mut endpoints = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let addr = if rng.chance(80) {
            format!("10.0.{}.{}", rng.below(2), rng.below(8))
        } else {
            format!("192.0.2.{}", rng.below(4))
        };
        endpoints.push(json!({"addresses": [addr]}));
    }
    let mut ports = Vec::new();
    for _ in 0..1 + rng.below(2) {
        let mut p = json!({"port": rng.pick(&[80, 8080, 53])});
        if rng.chance(80) {
            p["name"] = json!(rng.pick(&["a", "b"]));
        }
        if rng.chance(30) {
            p["protocol"] = json!("UDP");
        }
        ports.push(p);
    }
    let service = format!("s{}", rng.below(SERVICES));
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
        "addressType": if rng.chance(90) { "IPv4" } else { "FQDN" },
        "endpoints": endpoints,
        "ports": ports,
    }))
    .unwrap()
}

/// The cluster as objects by kind and key, so changes are easy to make.
#[derive(Clone, Default)]
struct Model {
    namespaces: BTreeMap<String, Namespace>,
    pods: BTreeMap<(String, String), Pod>,
    policies: BTreeMap<(String, String), NetworkPolicy>,
    services: BTreeMap<(String, String), Service>,
    slices: BTreeMap<(String, String), EndpointSlice>,
    cluster_policies: BTreeMap<(ApiGroup, String), ClusterNetworkPolicy>,
    nodes: BTreeMap<String, Node>,
}

impl Model {
    fn random(rng: &mut Rng) -> Model {
        let mut m = Model::default();
        // "d" has pods but never an object at first.
        for ns in &NAMESPACES[..3] {
            m.namespaces.insert(ns.to_string(), namespace(rng, ns));
        }
        for i in 0..8 + rng.below(6) {
            let ns = rng.pick(&NAMESPACES).to_string();
            let name = format!("p{i}");
            m.pods
                .insert((ns.clone(), name.clone()), pod(rng, &ns, &name));
        }
        for i in 0..1 + rng.below(4) {
            let ns = rng.pick(&NAMESPACES).to_string();
            let name = format!("np{i}");
            m.policies
                .insert((ns.clone(), name.clone()), policy(rng, &ns, &name));
        }
        for i in 0..1 + rng.below(6) {
            let ns = rng.pick(&NAMESPACES).to_string();
            let name = format!("s{}", i % SERVICES);
            m.services
                .insert((ns.clone(), name.clone()), service(rng, &ns, &name));
        }
        for i in 0..rng.below(4) {
            let ns = rng.pick(&NAMESPACES).to_string();
            let name = format!("e{i}");
            m.slices
                .insert((ns.clone(), name.clone()), endpoint_slice(rng, &ns, &name));
        }
        for i in 0..rng.below(4) {
            let group = *rng.pick(&[ApiGroup::Upstream, ApiGroup::Aws]);
            let name = format!("cnp{i}");
            m.cluster_policies
                .insert((group, name.clone()), cluster_policy(rng, group, &name));
        }
        for n in NODES {
            if rng.chance(70) {
                m.nodes.insert(n.to_string(), node(rng, n));
            }
        }
        m
    }

    fn state(&self, marker: String) -> ClusterState {
        let objects = self
            .namespaces
            .values()
            .cloned()
            .map(Object::Namespace)
            .chain(self.pods.values().cloned().map(Object::Pod))
            .chain(self.policies.values().cloned().map(Object::NetworkPolicy))
            .chain(self.services.values().cloned().map(Object::Service))
            .chain(self.slices.values().cloned().map(Object::EndpointSlice))
            .chain(
                self.cluster_policies
                    .values()
                    .cloned()
                    .map(Object::ClusterNetworkPolicy),
            )
            .chain(self.nodes.values().cloned().map(Object::Node));
        ClusterState::from_objects(objects, marker)
    }

    /// Makes one random change to the model and returns it as an event.
    fn change(&mut self, rng: &mut Rng) -> Change {
        let ns = rng.pick(&NAMESPACES).to_string();
        match rng.below(19) {
            // ClusterNetworkPolicy add or edit, and delete.
            15 | 16 => {
                let group = *rng.pick(&[ApiGroup::Upstream, ApiGroup::Aws]);
                let name = format!("cnp{}", rng.below(4));
                let p = cluster_policy(rng, group, &name);
                self.cluster_policies.insert((group, name), p.clone());
                Change::ApplyClusterPolicy(p)
            }
            17 => match self
                .cluster_policies
                .keys()
                .nth(rng.below(self.cluster_policies.len().max(1)))
                .cloned()
            {
                Some(key) => {
                    self.cluster_policies.remove(&key);
                    Change::DeleteClusterPolicy(key.0, key.1)
                }
                None => self.change(rng),
            },
            // A node added, relabelled or readdressed, or deleted.
            18 => {
                let name = rng.pick(&NODES).to_string();
                if rng.chance(75) {
                    let n = node(rng, &name);
                    self.nodes.insert(name, n.clone());
                    Change::ApplyNode(n)
                } else {
                    self.nodes.remove(&name);
                    Change::DeleteNode(name)
                }
            }
            // Service add or edit, and delete.
            10 | 11 => {
                let name = format!("s{}", rng.below(SERVICES));
                let s = service(rng, &ns, &name);
                self.services.insert((ns, name), s.clone());
                Change::ApplyService(s)
            }
            12 => match pick_key(rng, &self.services) {
                Some(key) => {
                    self.services.remove(&key);
                    Change::DeleteService(key)
                }
                None => self.change(rng),
            },
            // EndpointSlice add or edit, and delete.
            13 => {
                let name = format!("e{}", rng.below(5));
                let s = endpoint_slice(rng, &ns, &name);
                self.slices.insert((ns, name), s.clone());
                Change::ApplyEndpointSlice(s)
            }
            14 => match pick_key(rng, &self.slices) {
                Some(key) => {
                    self.slices.remove(&key);
                    Change::DeleteEndpointSlice(key)
                }
                None => self.change(rng),
            },
            // A new or replaced pod (may move it to a node, change its IP).
            0 | 1 => {
                let name = format!("p{}", rng.below(16));
                let p = pod(rng, &ns, &name);
                self.pods.insert((ns, name), p.clone());
                Change::ApplyPod(p)
            }
            // A relabel of an existing pod.
            2 | 3 => match self.random_key(rng, true) {
                Some(key) => {
                    let p = self.pods.get_mut(&key).unwrap();
                    p.metadata.labels = serde_json::from_value(labels(rng)).unwrap();
                    Change::ApplyPod(p.clone())
                }
                None => self.change(rng),
            },
            4 => match self.random_key(rng, true) {
                Some(key) => {
                    self.pods.remove(&key);
                    Change::DeletePod(key)
                }
                None => self.change(rng),
            },
            // Namespace relabel, creation or deletion.
            5 | 6 => {
                let n = namespace(rng, &ns);
                self.namespaces.insert(ns, n.clone());
                Change::ApplyNamespace(n)
            }
            7 => {
                self.namespaces.remove(&ns);
                Change::DeleteNamespace(ns)
            }
            // Policy add or edit, and delete.
            8 => {
                let name = format!("np{}", rng.below(5));
                let p = policy(rng, &ns, &name);
                self.policies.insert((ns, name), p.clone());
                Change::ApplyPolicy(p)
            }
            9 => match self.random_key(rng, false) {
                Some(key) => {
                    self.policies.remove(&key);
                    Change::DeletePolicy(key)
                }
                None => self.change(rng),
            },
            _ => unreachable!(),
        }
    }

    fn random_key(&self, rng: &mut Rng, pods: bool) -> Option<(String, String)> {
        let keys: Vec<&(String, String)> = if pods {
            self.pods.keys().collect()
        } else {
            self.policies.keys().collect()
        };
        (!keys.is_empty()).then(|| keys[rng.below(keys.len())].clone())
    }
}

fn pick_key<T>(rng: &mut Rng, map: &BTreeMap<(String, String), T>) -> Option<(String, String)> {
    let keys: Vec<&(String, String)> = map.keys().collect();
    (!keys.is_empty()).then(|| keys[rng.below(keys.len())].clone())
}

fn net(p: &IpPrefix) -> IpNet {
    let addr = match p.addr.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(p.addr.as_slice()).unwrap()),
        _ => IpAddr::from(<[u8; 16]>::try_from(p.addr.as_slice()).unwrap()),
    };
    IpNet::new(addr, p.prefix_len as u8).unwrap()
}

/// Whether a pod's plan lets it send to `ip` on `protocol`/`port`.
fn plan_allows_egress(pod: &PodPolicy, ip: IpAddr, protocol: Protocol, port: u16) -> bool {
    let Some(egress) = &pod.egress else {
        return true;
    };
    let port = u32::from(port);
    egress.rules.iter().any(|rule| {
        rule.peers.iter().any(|b| {
            b.cidr.as_ref().is_some_and(|c| net(c).contains(&ip))
                && !b.except.iter().any(|e| net(e).contains(&ip))
        }) && (rule.ports.is_empty()
            || rule.ports.iter().any(|r| {
                r.protocol == protocol as i32
                    && (r.port == 0
                        || r.port == port
                        || (r.end_port != 0 && (r.port..=r.end_port).contains(&port)))
            }))
    })
}

/// The plans' egress to every ClusterIP, on every service port, equals the
/// reference model's answer, for every pod with a plan.
fn check_services_against_model(state: &ClusterState, full: &Resolution, what: &str) {
    // The plan's tiers are judged against the model with tiers by the
    // enforcer's oracle test (node-enforcer/tests/oracle.rs); this reading
    // of a plan's egress is NetworkPolicy's alone.
    if !state.cluster_policies.is_empty() {
        return;
    }
    let mut vips = Vec::new();
    for svc in &state.services {
        let spec = svc.spec.as_ref().unwrap();
        let ips = spec
            .cluster_ips
            .clone()
            .unwrap_or_else(|| spec.cluster_ip.iter().cloned().collect());
        for ip in ips.iter().filter_map(|i| i.parse::<IpAddr>().ok()) {
            for p in spec.ports.iter().flatten() {
                let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                vips.push((ip, proto, p.port as u16));
            }
        }
    }
    for pod in &state.pods {
        let key = (
            pod.metadata.namespace.clone().unwrap(),
            pod.metadata.name.clone().unwrap(),
        );
        let Some(plan) = full.plans.values().find_map(|p| p.pods.get(&key)) else {
            continue;
        };
        let Some(src_ip) = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|i| i.parse().ok())
        else {
            continue;
        };
        let src = Endpoint { pod, ip: src_ip };
        for (vip, proto, port) in &vips {
            let protocol = match proto.as_str() {
                "UDP" => Protocol::Udp,
                _ => Protocol::Tcp,
            };
            let want = egress_to_service_allowed(state, src, *vip, proto, *port);
            let got = plan_allows_egress(plan, *vip, protocol, *port);
            assert_eq!(
                got, want,
                "{what}: {key:?} to {vip} {proto}/{port}: plan says {got}, model {want}"
            );
        }
    }
}

/// What one node has received: the last version it saw and the plan
/// rebuilt from the snapshot and deltas.
struct Receiver {
    sub: policy_controller::hub::Subscription,
    seen: Arc<VersionedPlan>,
    plan: NodePlan,
}

fn check(seed: u64, steps: usize) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut model = Model::random(&mut rng);
    let hub = Hub::new(1);
    let state = model.state("0".into());
    hub.update(&state);
    let mut full = resolve_cluster(&state);
    let mut nodes: BTreeMap<&str, Receiver> = NODES
        .iter()
        .map(|n| {
            let sub = hub.subscribe(n).unwrap();
            let seen = sub.rx.borrow().clone();
            let plan = seen.plan.decode();
            (*n, Receiver { sub, seen, plan })
        })
        .collect();
    for step in 1..=steps {
        let change = model.change(&mut rng);
        let what = format!("seed {seed} step {step}: {change:?}");
        let state = model.state(step.to_string());
        if rng.chance(50) {
            hub.update(&state);
        } else {
            hub.apply(vec![change], step.to_string());
        }
        let before = std::mem::replace(&mut full, resolve_cluster(&state));
        check_services_against_model(&state, &full, &what);
        let engine = hub.with_engine(|e| e.unwrap().resolution());
        assert_eq!(engine.errors, full.errors, "{what}");
        assert_eq!(engine.plans, full.plans, "{what}");
        assert_eq!(hub.view().errors, full.errors, "{what}");
        for (node, r) in nodes.iter_mut() {
            let want = full.plans.get(*node).cloned().unwrap_or_default();
            let was = before.plans.get(*node).cloned().unwrap_or_default();
            let now = r.sub.rx.borrow_and_update().clone();
            if let Some(d) = delta(&r.seen, &now) {
                assert_eq!(d.base_version, r.seen.version, "{what}");
                apply_delta(&mut r.plan.pods, d);
            }
            assert_eq!(r.plan, want, "{what}: node {node} rebuilt from deltas");
            assert_eq!(
                now.version != r.seen.version,
                want != was,
                "{what}: node {node} got a new version exactly when its plan changed"
            );
            r.seen = now;
        }
    }
}

#[test]
fn incremental_plans_and_deltas_equal_a_full_recompute() {
    for seed in 0..60 {
        check(seed, 60);
    }
}
