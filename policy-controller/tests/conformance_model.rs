//! The conformance scenarios (e2e/conformance/*.yaml) judged by the
//! reference model alone.
//!
//! Each scenario writes down, as upstream's network policy e2e suite states
//! them, which pods may reach which after each step. This test plays every
//! step against the model (`policy_controller::model::allowed`) and checks
//! every pair of every matrix, so the scenarios' expectations and the model
//! are checked against each other without a lab: a wrong expectation, or a
//! misreading of the API in the model, fails here in milliseconds.
//!
//! Pods and namespaces are those the `netpol:` block names, built as the
//! upstream suite builds them (see e2e/conformance/README.md); addresses are
//! assigned here, one per pod, which is all the model needs.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use policy_controller::cluster::ClusterState;
use policy_controller::model::{allowed, Endpoint};
use policy_controller::source::parse_objects;
use serde_json::{json, Value};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const PORTS: [u16; 2] = [80, 81];

/// The cluster as the steps so far left it.
struct World {
    namespaces: BTreeMap<String, Value>,
    pods: BTreeMap<String, Value>,
    policies: BTreeMap<(String, String), Value>,
    ips: BTreeMap<String, IpAddr>,
}

impl World {
    fn new(pods: &[String], nodes: usize) -> Self {
        let namespaces = NAMESPACES
            .iter()
            .map(|ns| {
                let object = json!({
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                });
                (ns.to_string(), object)
            })
            .collect();
        let mut world = World {
            namespaces,
            pods: BTreeMap::new(),
            policies: BTreeMap::new(),
            ips: BTreeMap::new(),
        };
        for (i, name) in pods.iter().enumerate() {
            let (ns, pod) = name.split_once('/').expect("pods are namespace/name");
            let node = i % nodes;
            let ip = IpAddr::V4(Ipv4Addr::new(10, 100, node as u8, 10 + i as u8));
            // One container per port and protocol, named as upstream names them.
            let containers: Vec<Value> = PORTS
                .iter()
                .flat_map(|port| {
                    PROTOCOLS.iter().map(move |proto| {
                        let lower = proto.to_lowercase();
                        json!({
                            "name": format!("cont-{port}-{lower}"),
                            "image": "agnhost",
                            "ports": [{
                                "name": format!("serve-{port}-{lower}"),
                                "containerPort": port,
                                "protocol": proto,
                            }],
                        })
                    })
                })
                .collect();
            let object = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": ns, "labels": {"pod": pod}},
                "spec": {"nodeName": format!("node-{}", node + 1), "containers": containers},
                "status": {"podIP": ip.to_string()},
            });
            world.pods.insert(name.clone(), object);
            world.ips.insert(name.clone(), ip);
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
        ClusterState::from_objects(parse_objects(&text).expect("objects parse"), String::new())
    }

    /// Replaces `{pod: ns/name, prefix: n}` wherever a CIDR may stand with
    /// the pod's address masked to that prefix, as the lab does.
    fn resolve_cidrs(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(block)) = map.get_mut("ipBlock") {
                    if let Some(cidr) = block.get_mut("cidr") {
                        *cidr = self.cidr(cidr);
                    }
                    if let Some(Value::Array(except)) = block.get_mut("except") {
                        for e in except {
                            *e = self.cidr(e);
                        }
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
        let ip = self.ips[pod];
        let net = IpNet::new(ip, prefix).expect("valid prefix").trunc();
        Value::String(net.to_string())
    }

    fn step(&mut self, step: &Value) {
        for object in step["apply"].as_array().into_iter().flatten() {
            let mut object = object.clone();
            self.resolve_cidrs(&mut object);
            let meta = &object["metadata"];
            let key = (
                meta["namespace"].as_str().unwrap().to_string(),
                meta["name"].as_str().unwrap().to_string(),
            );
            assert_eq!(object["kind"], "NetworkPolicy", "only policies are applied");
            self.policies.insert(key, object);
        }
        for r in step["delete"].as_array().into_iter().flatten() {
            let key = (
                r["namespace"].as_str().unwrap().to_string(),
                r["name"].as_str().unwrap().to_string(),
            );
            assert!(self.policies.remove(&key).is_some(), "delete of {key:?}");
        }
        for l in step["label"].as_array().into_iter().flatten() {
            let labels = l["labels"].clone();
            let name = l["name"].as_str().unwrap();
            let object = match l["kind"].as_str().unwrap() {
                "Namespace" => self.namespaces.get_mut(name),
                "Pod" => {
                    let ns = l["namespace"].as_str().unwrap();
                    self.pods.get_mut(&format!("{ns}/{name}"))
                }
                other => panic!("label of kind {other}"),
            };
            object.expect("labelled object exists")["metadata"]["labels"] = labels;
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

/// Every disagreement between one matrix and the model, as readable lines.
fn check_matrix(world: &World, cluster: &ClusterState, matrix: &Value) -> Vec<String> {
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
    let mut wrong = Vec::new();
    for from in world.pods.keys() {
        for to in world.pods.keys() {
            // Upstream ignores loopback: its verdict is not defined.
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
            if got != want {
                wrong.push(format!(
                    "{from} -> {to} {protocol}/{port}: scenario says {}, model says {}",
                    if want { "allow" } else { "deny" },
                    if got { "allow" } else { "deny" },
                ));
            }
        }
    }
    wrong
}

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_conformance_scenario_agrees_with_the_model() {
    let files = scenarios();
    assert!(files.len() >= 40, "only {} scenarios found", files.len());
    let mut failures = Vec::new();
    let mut matrices = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let scenario: Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let pods: Vec<String> = serde_json::from_value(scenario["netpol"]["pods"].clone())
            .unwrap_or_else(|e| panic!("{}: netpol.pods: {e}", file.display()));
        let nodes = scenario["nodes"].as_u64().unwrap_or(1) as usize;
        let mut world = World::new(&pods, nodes);
        for step in scenario["steps"].as_array().expect("steps") {
            world.step(step);
            let cluster = world.cluster();
            for matrix in step["reachability"].as_array().expect("reachability") {
                matrices += 1;
                for line in check_matrix(&world, &cluster, matrix) {
                    failures.push(format!(
                        "{} / {}: {line}",
                        file.file_name().unwrap().to_string_lossy(),
                        step["name"].as_str().unwrap_or("?"),
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(matrices >= files.len(), "{matrices} matrices");
}

#[test]
fn patterns_name_what_they_say() {
    assert!(matches("*", "x/a"));
    assert!(matches("x/*", "x/a"));
    assert!(!matches("x/*", "y/a"));
    assert!(matches("x/a", "x/a"));
    assert!(!matches("x/a", "x/b"));
}

#[test]
fn the_readme_table_lists_every_scenario() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/conformance");
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let missing: Vec<String> = scenarios()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| !readme.contains(&format!("]({name})")))
        .collect();
    assert!(missing.is_empty(), "not in the README table: {missing:?}");
}
