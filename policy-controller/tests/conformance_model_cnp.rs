//! The ClusterNetworkPolicy conformance scenarios (e2e/conformance/cnp/*.yaml,
//! upstream network-policy-api's conformance tests as lab scenarios) judged
//! by the reference model alone: every step of every file is played, every
//! pair of every matrix checked against `palisade_model::verdict::allowed`.
//!
//! The `cnp:` topology is built here as upstream's base manifests build it
//! (see e2e/conformance/cnp/README.md), independently of the lab's code:
//! five namespaces, two pods in each of four, `-0` on node-1 and `-1` on
//! node-2, and with `hostNetwork: true` forbidden-forrest's two
//! host-network pods (centaur-0 on node-2, centaur-1 on node-1) whose
//! address is their node's. Nodes are labelled `kubernetes.io/os: linux`.
//!
//! Namespaces, pods and NetworkPolicies go through the manifest parser
//! (`parse_objects`); ClusterNetworkPolicies are read straight into
//! `palisade_apis`'s wire type and its one typed reading, as the sources
//! do, since `parse_objects` does not read them yet.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use palisade_apis::{wire, ClusterNetworkPolicy};
use policy_controller::cluster::{ClusterState, Object};
use policy_controller::model::{allowed, Endpoint};
use policy_controller::source::parse_objects;
use serde_json::{json, Value};

const PREFIX: &str = "network-policy-conformance-";
const HOUSES: [(&str, &str); 5] = [
    ("gryffindor", "harry-potter"),
    ("slytherin", "draco-malfoy"),
    ("hufflepuff", "cedric-diggory"),
    ("ravenclaw", "luna-lovegood"),
    ("forbidden-forrest", "centaur"),
];
/// (port, protocol, name) as upstream's pods declare or serve them.
const PORTS: [(u16, &str, Option<&str>); 6] = [
    (80, "TCP", Some("web")),
    (8080, "TCP", None),
    (53, "UDP", Some("dns")),
    (5353, "UDP", None),
    (9003, "SCTP", None),
    (9005, "SCTP", None),
];
const HOST_PORTS: [(u16, &str, Option<&str>); 6] = [
    (34340, "TCP", Some("web-34340")),
    (34341, "TCP", Some("web-34341")),
    (34342, "UDP", Some("dns-34342")),
    (34344, "UDP", Some("dns-34344")),
    (34346, "SCTP", None),
    (34347, "SCTP", None),
];

fn node_ip(node: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 168, 100, node))
}

/// The cluster as the steps so far left it.
struct World {
    namespaces: BTreeMap<String, Value>,
    pods: BTreeMap<String, Value>,
    policies: BTreeMap<(String, String), Value>,
    cluster_policies: BTreeMap<String, Value>,
    ips: BTreeMap<String, IpAddr>,
}

impl World {
    fn new(host_network: bool) -> Self {
        let mut world = World {
            namespaces: BTreeMap::new(),
            pods: BTreeMap::new(),
            policies: BTreeMap::new(),
            cluster_policies: BTreeMap::new(),
            ips: BTreeMap::new(),
        };
        let ports: Vec<_> = if host_network {
            PORTS.iter().chain(&HOST_PORTS).collect()
        } else {
            PORTS.iter().collect()
        };
        for (house, prefix) in HOUSES {
            let ns = format!("{PREFIX}{house}");
            world.namespaces.insert(
                ns.clone(),
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns,
                       "labels": {"conformance-house": house, "kubernetes.io/metadata.name": ns}}}),
            );
            let host = house == "forbidden-forrest";
            if host && !host_network {
                continue;
            }
            for i in 0..2u8 {
                let node = if host { 2 - i } else { i + 1 };
                let ip = if host {
                    node_ip(node)
                } else {
                    IpAddr::V4(Ipv4Addr::new(10, 244, node, 10 + world.pods.len() as u8))
                };
                let containers: Vec<Value> = ports
                    .iter()
                    .map(|(port, protocol, name)| {
                        let mut p = json!({"containerPort": port, "protocol": protocol});
                        if let Some(name) = name {
                            p["name"] = json!(name);
                        }
                        json!({"name": format!("c-{port}-{}", protocol.to_lowercase()),
                               "image": "agnhost", "ports": [p]})
                    })
                    .collect();
                let name = format!("{prefix}-{i}");
                let key = format!("{ns}/{name}");
                world.pods.insert(
                    key.clone(),
                    json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": ns, "labels": {"conformance-house": house}},
                           "spec": {"nodeName": format!("node-{node}"), "hostNetwork": host, "containers": containers},
                           "status": {"podIP": ip.to_string(), "hostIP": node_ip(node).to_string()}}),
                );
                world.ips.insert(key, ip);
            }
        }
        world
    }

    fn cluster(&self) -> ClusterState {
        let text: String = self
            .namespaces
            .values()
            .chain(self.pods.values())
            .chain(self.policies.values())
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        let mut objects = parse_objects(&text).expect("objects parse");
        for body in self.cluster_policies.values() {
            let o: wire::UpstreamClusterNetworkPolicy =
                serde_json::from_value(body.clone()).expect("a ClusterNetworkPolicy");
            objects.push(Object::ClusterNetworkPolicy(
                ClusterNetworkPolicy::from_upstream(&o),
            ));
        }
        for n in 1..=2u8 {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": format!("node-{n}"), "labels": {"kubernetes.io/os": "linux"}},
                "status": {"addresses": [{"type": "InternalIP", "address": node_ip(n).to_string()},
                                         {"type": "Hostname", "address": format!("node-{n}")}]},
            }))
            .unwrap();
            objects.push(Object::Node(node));
        }
        ClusterState::from_objects(objects, String::new())
    }

    /// Replaces `{pod: ns/name, prefix: n}` in `networks` (and ipBlocks)
    /// with the pod's address masked to that prefix, as the lab does.
    fn resolve_cidrs(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::Array(networks)) = map.get_mut("networks") {
                    for n in networks {
                        *n = self.cidr(n);
                    }
                }
                if let Some(Value::Object(block)) = map.get_mut("ipBlock") {
                    if let Some(cidr) = block.get_mut("cidr") {
                        *cidr = self.cidr(cidr);
                    }
                }
                for v in map.values_mut() {
                    self.resolve_cidrs(v);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.resolve_cidrs(v)),
            _ => {}
        }
    }

    fn cidr(&self, v: &Value) -> Value {
        let Some(pod) = v.get("pod").and_then(Value::as_str) else {
            return v.clone();
        };
        let prefix = v["prefix"].as_u64().expect("prefix") as u8;
        let net = IpNet::new(self.ips[pod], prefix)
            .expect("valid prefix")
            .trunc();
        Value::String(net.to_string())
    }

    fn apply(&mut self, object: &Value) {
        let mut object = object.clone();
        self.resolve_cidrs(&mut object);
        let meta = &object["metadata"];
        let name = meta["name"].as_str().unwrap().to_string();
        match object["kind"].as_str().unwrap() {
            "ClusterNetworkPolicy" => {
                self.cluster_policies.insert(name, object);
            }
            "NetworkPolicy" => {
                let ns = meta["namespace"].as_str().unwrap().to_string();
                self.policies.insert((ns, name), object);
            }
            other => panic!("apply of kind {other}"),
        }
    }

    fn step(&mut self, step: &Value) {
        for l in step["label"].as_array().into_iter().flatten() {
            assert_eq!(l["kind"], "Namespace", "only namespaces are relabelled");
            let ns = self
                .namespaces
                .get_mut(l["name"].as_str().unwrap())
                .expect("the namespace exists");
            ns["metadata"]["labels"] = l["labels"].clone();
        }
        for object in step["apply"].as_array().into_iter().flatten() {
            self.apply(object);
        }
        for r in step["delete"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap().to_string();
            let gone = match r["kind"].as_str().unwrap() {
                "ClusterNetworkPolicy" => self.cluster_policies.remove(&name).is_some(),
                "NetworkPolicy" => {
                    let ns = r["namespace"].as_str().unwrap().to_string();
                    self.policies.remove(&(ns, name)).is_some()
                }
                other => panic!("delete of kind {other}"),
            };
            assert!(gone, "delete of {r}");
        }
    }
}

/// Does `pattern` (`*`, `ns/*` or `ns/name`) name `pod`?
fn matches(pattern: &str, pod: &str) -> bool {
    pattern == "*"
        || pattern == pod
        || pattern
            .strip_suffix("/*")
            .is_some_and(|ns| pod.split_once('/').map(|(p, _)| p) == Some(ns))
}

fn verdict(word: &str) -> bool {
    match word {
        "allow" => true,
        "deny" => false,
        other => panic!("verdict {other:?} is neither allow nor deny"),
    }
}

/// Every disagreement between one matrix and the model; the number of
/// pairs checked.
fn check_matrix(world: &World, cluster: &ClusterState, matrix: &Value) -> (Vec<String>, usize) {
    let protocol = matrix["protocol"].as_str().expect("protocol");
    let port = matrix["port"].as_u64().expect("port") as u16;
    let default = verdict(matrix["default"].as_str().unwrap_or("allow"));
    let endpoint = |name: &str| {
        let (ns, pod) = name.split_once('/').unwrap();
        let pod = cluster
            .pods
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(pod)
            })
            .unwrap();
        Endpoint {
            pod,
            ip: world.ips[name],
        }
    };
    let (mut wrong, mut pairs) = (Vec::new(), 0);
    for from in world.pods.keys() {
        for to in world.pods.keys() {
            // Loopback is not subject to ClusterNetworkPolicy (upstream's
            // hairpin rule), and a matrix leaves it out.
            if from == to {
                continue;
            }
            let mut want = default;
            for e in matrix["expect"].as_array().into_iter().flatten() {
                if matches(e["from"].as_str().unwrap(), from)
                    && matches(e["to"].as_str().unwrap(), to)
                {
                    want = verdict(e["is"].as_str().unwrap());
                }
            }
            let got = allowed(cluster, endpoint(from), endpoint(to), protocol, port);
            pairs += 1;
            if got != want {
                wrong.push(format!(
                    "{from} -> {to} {protocol}/{port}: scenario says {}, model says {}",
                    if want { "allow" } else { "deny" },
                    if got { "allow" } else { "deny" },
                ));
            }
        }
    }
    (wrong, pairs)
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/conformance/cnp")
}

fn scenarios() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir().display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_cluster_network_policy_scenario_agrees_with_the_model() {
    let files = scenarios();
    assert_eq!(files.len(), 24, "one file per upstream test");
    let (mut failures, mut matrices, mut pairs) = (Vec::new(), 0, 0);
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        let scenario: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(scenario["nodes"], 2, "{name}");
        let host_network = scenario["cnp"]["hostNetwork"].as_bool().unwrap_or(false);
        let mut world = World::new(host_network);
        for object in scenario["objects"].as_array().into_iter().flatten() {
            world.apply(object);
        }
        for step in scenario["steps"].as_array().expect("steps") {
            world.step(step);
            let cluster = world.cluster();
            for matrix in step["reachability"].as_array().expect("reachability") {
                matrices += 1;
                let (wrong, n) = check_matrix(&world, &cluster, matrix);
                pairs += n;
                for line in wrong {
                    failures.push(format!(
                        "{name} / {}: {line}",
                        step["name"].as_str().unwrap_or("?")
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        matrices >= 200 && pairs >= 10_000,
        "{matrices} matrices, {pairs} pairs"
    );
}

#[test]
fn the_readme_table_lists_every_scenario() {
    let readme = std::fs::read_to_string(dir().join("README.md")).expect("README.md");
    let missing: Vec<String> = scenarios()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| !readme.contains(&format!("]({name}")))
        .collect();
    assert!(missing.is_empty(), "not in the README table: {missing:?}");
}
