//! PolicyEndpoints as the AWS network policy controller writes them, served
//! through the API double and watched by the real kube source with
//! `--policy-source policyendpoint`, grant what the NetworkPolicies they
//! came from grant.
//!
//! `aws` below plays the AWS controller: from a cluster's NetworkPolicies it
//! writes PolicyEndpoints the way that controller does (the selected pods as
//! podSelectorEndpoints; pod peers as their addresses, namespace selectors
//! resolved to the pods' addresses; ipBlocks as CIDRs with excepts;
//! a missing `from`/`to` as 0.0.0.0/0 and ::/0; egress named ports resolved
//! per destination pod; entries packed a few per slice, several slices per
//! policy, reused and repacked in place when the policy's addresses change;
//! entries with the same CIDR in one slice merged). Clusters are fixed or
//! generated; generated ones then take changes that reach the controller one
//! object at a time.
//!
//! The oracle is the verdict, not the plan's shape: a peer that the
//! NetworkPolicy path names by selector arrives here as an address, and
//! rules are grouped differently. For every pod with an address, every
//! peer address (every pod's, and addresses outside the pods) and every
//! protocol/port of interest, the PolicyEndpoint plan's ingress and egress
//! must allow exactly what the NetworkPolicy plan (`resolve_cluster`)
//! allows. Where the AWS controller's own merging of same-CIDR entries lost
//! information (see `aws::combine`), the plan may only allow less, never
//! more; the clusters where that happened are counted and the rest are
//! compared for equality.
//!
//! ClusterNetworkPolicies (networking.k8s.aws) go the same way: `aws_cluster_slices`
//! plays the AWS controller writing ClusterPolicyEndpoints, and the verdicts
//! (judged through the Admin tier, NetworkPolicy and the Baseline tier, as the
//! datapath does) must equal those of the plans from the policies themselves.

#[allow(dead_code)] // the double serves more than these tests use
mod api_double;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use api_double::{ApiDouble, Kind};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_proto::v1::{
    DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, TierAction, TierRule,
};
use policy_controller::cluster::{ClusterState, Object};
use policy_controller::feed;
use policy_controller::hub::Hub;
use policy_controller::resolve::{resolve_cluster, Resolution};
use policy_controller::source::kube as kube_source;
use policy_controller::source::policy_endpoint::PolicySource;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

const DEADLINE: Duration = Duration::from_secs(30);

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
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The objects of a cluster, as the API serves them, keyed by kind and
/// (namespace, name).
#[derive(Clone, Default)]
struct Cluster(BTreeMap<(String, String, String), Value>);

impl Cluster {
    fn key(object: &Value) -> (String, String, String) {
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        (
            s(&object["kind"]),
            s(&object["metadata"]["namespace"]),
            s(&object["metadata"]["name"]),
        )
    }

    fn put(&mut self, object: Value) {
        self.0.insert(Self::key(&object), object);
    }

    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &Value> {
        let kind = kind.to_string();
        self.0
            .iter()
            .filter(move |(k, _)| k.0 == kind)
            .map(|(_, v)| v)
    }

    fn state(&self) -> ClusterState {
        let objects = self.0.values().map(|v| match v["kind"].as_str().unwrap() {
            "Namespace" => {
                Object::Namespace(serde_json::from_value::<Namespace>(v.clone()).unwrap())
            }
            "Pod" => Object::Pod(serde_json::from_value::<Pod>(v.clone()).unwrap()),
            "NetworkPolicy" => {
                Object::NetworkPolicy(serde_json::from_value::<NetworkPolicy>(v.clone()).unwrap())
            }
            "ClusterNetworkPolicy" => {
                let mut parsed = policy_controller::source::parse_objects(&v.to_string()).unwrap();
                parsed.pop().unwrap()
            }
            other => panic!("no {other} in these clusters"),
        });
        ClusterState::from_objects(objects, String::new())
    }
}

// ---------------------------------------------------------------------------
// Generated clusters: NetworkPolicy v1 in the part the AWS controller
// translates (see the module doc and the report's limitations): no named
// ports in ingress rules or next to ipBlocks or a missing `to`, no
// host-network pods, valid selectors, a Namespace object for every
// namespace, one address per pod.

const NAMESPACES: [&str; 4] = ["a", "b", "c", "d"];
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const APPS: [&str; 3] = ["web", "db", "cache"];

fn namespace(rng: &mut Rng, name: &str) -> Value {
    let mut l = serde_json::Map::new();
    l.insert("kubernetes.io/metadata.name".into(), json!(name));
    if rng.chance(80) {
        l.insert("team".into(), json!(rng.pick(&["red", "blue"])));
    }
    if rng.chance(30) {
        l.insert("env".into(), json!("prod"));
    }
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": l}})
}

/// Named ports are the same within a namespace and differ between
/// namespaces, so egress named ports resolve per destination.
fn container_ports(ns: &str) -> Value {
    match ns {
        "a" => {
            json!([{"name": "http", "containerPort": 80}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}])
        }
        "b" => json!([{"name": "http", "containerPort": 8080}]),
        "d" => {
            json!([{"name": "http", "containerPort": 80}, {"name": "dns", "containerPort": 5353, "protocol": "UDP"}])
        }
        _ => json!([]),
    }
}

fn pod(rng: &mut Rng, ns: &str, name: &str, ip: Option<String>) -> Value {
    let mut labels = serde_json::Map::new();
    if rng.chance(85) {
        labels.insert("app".into(), json!(rng.pick(&APPS)));
    }
    if rng.chance(40) {
        labels.insert("tier".into(), json!(rng.pick(&["1", "2"])));
    }
    let node = rng.pick(&NODES);
    let mut status = json!({"phase": "Running", "hostIP": format!("192.168.0.{}", &node[1..])});
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "ports": container_ports(ns)}]},
        "status": status,
    })
}

fn selector(rng: &mut Rng, key: &str, values: &[&str]) -> Value {
    match rng.below(6) {
        0 => json!({}),
        1 | 2 => json!({"matchLabels": {key: rng.pick(values)}}),
        3 => {
            json!({"matchExpressions": [{"key": key, "operator": "In", "values": [rng.pick(values), rng.pick(values)]}]})
        }
        4 => {
            let op = *rng.pick(&["NotIn", "Exists", "DoesNotExist"]);
            let values = if op == "NotIn" {
                json!([rng.pick(values)])
            } else {
                json!([])
            };
            json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]})
        }
        _ => {
            json!({"matchLabels": {key: rng.pick(values)}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]})
        }
    }
}

fn peer(rng: &mut Rng, allow_block: bool) -> Value {
    match rng.below(if allow_block { 5 } else { 4 }) {
        0 => json!({"podSelector": selector(rng, "app", &APPS)}),
        1 => json!({"namespaceSelector": selector(rng, "team", &["red", "blue"])}),
        2 => json!({
            "namespaceSelector": selector(rng, "team", &["red", "blue"]),
            "podSelector": selector(rng, "app", &APPS),
        }),
        3 => {
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": rng.pick(&NAMESPACES)}}})
        }
        _ => match rng.below(3) {
            0 => json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}),
            1 => json!({"ipBlock": {"cidr": "10.0.1.0/29"}}),
            _ => json!({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/24"]}}),
        },
    }
}

/// Ports as the API server stores them (protocol defaulted to TCP).
fn ports(rng: &mut Rng, named: bool) -> Value {
    let mut out = Vec::new();
    for _ in 0..1 + rng.below(2) {
        out.push(match rng.below(if named { 6 } else { 4 }) {
            0 => json!({"port": rng.pick(&[80, 443, 53]), "protocol": "TCP"}),
            1 => json!({"port": 8000, "endPort": 8100, "protocol": "TCP"}),
            2 => json!({"port": 53, "protocol": "UDP"}),
            3 => json!({"protocol": "UDP"}),
            4 => json!({"port": "http", "protocol": "TCP"}),
            _ => json!({"port": "dns", "protocol": "UDP"}),
        });
    }
    Value::Array(out)
}

fn rules(rng: &mut Rng, peers_key: &str) -> Value {
    let mut out = Vec::new();
    for _ in 0..rng.below(3) {
        let mut rule = serde_json::Map::new();
        let mut only_selectors = false;
        if rng.chance(75) {
            // Named ports (egress only) go with selector peers alone.
            let named = peers_key == "to" && rng.chance(40);
            let peers: Vec<Value> = (0..1 + rng.below(2)).map(|_| peer(rng, !named)).collect();
            rule.insert(peers_key.into(), Value::Array(peers));
            only_selectors = named;
        }
        if rng.chance(60) {
            rule.insert("ports".into(), ports(rng, only_selectors));
        }
        out.push(Value::Object(rule));
    }
    Value::Array(out)
}

fn policy(rng: &mut Rng, ns: &str, name: &str) -> Value {
    let mut spec = json!({"podSelector": selector(rng, "app", &APPS)});
    let mut types = vec!["Ingress"];
    if rng.chance(80) {
        spec["ingress"] = rules(rng, "from");
    }
    if rng.chance(50) {
        spec["egress"] = rules(rng, "to");
        types.push("Egress");
    }
    if rng.chance(40) {
        types = match rng.below(3) {
            0 => vec!["Ingress"],
            1 => vec!["Egress"],
            _ => vec!["Ingress", "Egress"],
        };
    }
    // As the API server stores it: policyTypes defaulted.
    spec["policyTypes"] = json!(types);
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Unique pod addresses, one /24 per namespace and a few in 10.0.1.0/24
/// (inside the ipBlocks' excepts) and fd00::/64.
struct Addresses(u32);

impl Addresses {
    fn next(&mut self, rng: &mut Rng) -> Option<String> {
        if rng.chance(8) {
            return None; // Pending: not yet given an address.
        }
        self.0 += 1;
        Some(match self.0 % 7 {
            0 => format!("fd00::{:x}", self.0),
            1 => format!("10.0.1.{}", self.0 % 250),
            _ => format!("10.0.{}.{}", 2 + self.0 % 3, self.0 % 250),
        })
    }
}

fn generated(rng: &mut Rng, addresses: &mut Addresses) -> Cluster {
    let mut c = Cluster::default();
    for ns in NAMESPACES {
        c.put(namespace(rng, ns));
        for i in 0..rng.below(5) {
            let ip = addresses.next(rng);
            c.put(pod(rng, ns, &format!("p{i}"), ip));
        }
        for i in 0..rng.below(3) {
            c.put(policy(rng, ns, &format!("np{i}")));
        }
    }
    c
}

/// One change to a generated cluster, as an operator or a controller would
/// make it.
fn mutate(rng: &mut Rng, c: &mut Cluster, addresses: &mut Addresses) {
    let ns = *rng.pick(&NAMESPACES);
    match rng.below(6) {
        0 => {
            let name = format!("p{}", rng.below(6));
            let ip = addresses.next(rng);
            c.put(pod(rng, ns, &name, ip));
        }
        1 => {
            let pods: Vec<Value> = c.of_kind("Pod").cloned().collect();
            if pods.is_empty() {
                return;
            }
            let mut p = rng.pick(&pods).clone();
            p["metadata"]["labels"] = json!({"app": rng.pick(&APPS)});
            c.put(p);
        }
        2 => {
            let pods: Vec<(String, String, String)> = c.of_kind("Pod").map(Cluster::key).collect();
            if pods.is_empty() {
                return;
            }
            let k = rng.pick(&pods).clone();
            c.0.remove(&k);
        }
        3 => {
            c.put(namespace(rng, ns));
        }
        4 => {
            let name = format!("np{}", rng.below(3));
            c.put(policy(rng, ns, &name));
        }
        _ => {
            let policies: Vec<(String, String, String)> =
                c.of_kind("NetworkPolicy").map(Cluster::key).collect();
            if policies.is_empty() {
                return;
            }
            let k = rng.pick(&policies).clone();
            c.0.remove(&k);
        }
    }
}

// ---------------------------------------------------------------------------

/// The AWS network policy controller, as far as what it writes goes.
mod aws {
    use std::collections::{BTreeMap, BTreeSet};

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use policy_controller::cluster::ClusterState;
    use policy_controller::resolve::selector_matches;
    use serde_json::{json, Value};

    use super::Rng;

    /// A write to the API.
    pub enum Op {
        Apply(Value),
        Delete(String, String),
    }

    #[derive(Clone, Default)]
    struct Slice {
        name: String,
        /// Entries as canonical JSON: the AWS controller tells entries
        /// apart by a hash of their content.
        ingress: Vec<String>,
        egress: Vec<String>,
        pods: Vec<String>,
    }

    impl Slice {
        fn list(&mut self, which: usize) -> &mut Vec<String> {
            match which {
                0 => &mut self.ingress,
                1 => &mut self.egress,
                _ => &mut self.pods,
            }
        }

        fn is_empty(&self) -> bool {
            self.ingress.is_empty() && self.egress.is_empty() && self.pods.is_empty()
        }
    }

    struct Desired {
        isolation: Value,
        pod_selector: Value,
        ingress: BTreeSet<String>,
        egress: BTreeSet<String>,
        pods: BTreeSet<String>,
    }

    pub struct Controller {
        /// Entries per list per slice (the real default is 1000).
        chunk: usize,
        rng: Rng,
        generated: u64,
        slices: BTreeMap<(String, String), Vec<Slice>>,
        written: BTreeMap<(String, String), Value>,
        /// Whether, in what is written now, merging same-CIDR entries in a
        /// slice lost something.
        pub lossy: bool,
    }

    impl Controller {
        pub fn new(chunk: usize, seed: u64) -> Self {
            Controller {
                chunk,
                rng: Rng(seed | 1),
                generated: 0,
                slices: BTreeMap::new(),
                written: BTreeMap::new(),
                lossy: false,
            }
        }

        /// Brings the PolicyEndpoints in line with `state`'s policies, as
        /// the controller reconciles each policy: entries still wanted stay
        /// in their slice, new ones fill slices with room, then new slices;
        /// slices left empty are deleted, but a policy keeps at least one.
        pub fn reconcile(&mut self, state: &ClusterState) -> Vec<Op> {
            let mut ops = Vec::new();
            let mut wanted = BTreeSet::new();
            for np in &state.policies {
                let key = (
                    np.metadata.namespace.clone().unwrap(),
                    np.metadata.name.clone().unwrap(),
                );
                wanted.insert(key.clone());
                let desired = desired(np, state);
                let mut slices = self.slices.remove(&key).unwrap_or_default();
                let mut pools = [desired.ingress, desired.egress, desired.pods];
                for s in &mut slices {
                    for (list, pool) in [&mut s.ingress, &mut s.egress, &mut s.pods]
                        .into_iter()
                        .zip(pools.iter_mut())
                    {
                        list.retain(|e| pool.remove(e));
                    }
                }
                for (which, pool) in pools.into_iter().enumerate() {
                    let mut remaining: Vec<String> = pool.into_iter().collect();
                    self.rng.shuffle(&mut remaining);
                    for s in slices.iter_mut() {
                        while s.list(which).len() < self.chunk {
                            let Some(e) = remaining.pop() else { break };
                            s.list(which).push(e);
                        }
                    }
                    while !remaining.is_empty() {
                        let mut s = Slice {
                            name: self.name(&key.1),
                            ..Default::default()
                        };
                        let take = remaining.len().min(self.chunk);
                        *s.list(which) = remaining.split_off(remaining.len() - take);
                        slices.push(s);
                    }
                }
                let (kept, emptied): (Vec<Slice>, Vec<Slice>) =
                    slices.into_iter().partition(|s| !s.is_empty());
                let mut kept = kept;
                let mut emptied = emptied.into_iter();
                if kept.is_empty() {
                    kept.push(emptied.next().unwrap_or_else(|| Slice {
                        name: self.name(&key.1),
                        ..Default::default()
                    }));
                }
                for gone in emptied {
                    self.written.remove(&(key.0.clone(), gone.name.clone()));
                    ops.push(Op::Delete(key.0.clone(), gone.name));
                }
                for s in &kept {
                    let object = render(&key, s, &desired.isolation, &desired.pod_selector);
                    let slot = (key.0.clone(), s.name.clone());
                    if self.written.get(&slot) != Some(&object) {
                        self.written.insert(slot, object.clone());
                        ops.push(Op::Apply(object));
                    }
                }
                self.slices.insert(key, kept);
            }
            let gone: Vec<(String, String)> = self
                .slices
                .keys()
                .filter(|k| !wanted.contains(*k))
                .cloned()
                .collect();
            for key in gone {
                for s in self.slices.remove(&key).unwrap() {
                    self.written.remove(&(key.0.clone(), s.name.clone()));
                    ops.push(Op::Delete(key.0.clone(), s.name));
                }
            }
            self.lossy = self.written.values().any(|o| {
                ["ingress", "egress"]
                    .iter()
                    .any(|d| combine(&o["spec"]["__raw"][d]).1)
            });
            ops
        }

        fn name(&mut self, policy: &str) -> String {
            self.generated += 1;
            format!("{policy}-{:05x}", self.generated * 7919 % 0xfffff)
        }
    }

    fn render(key: &(String, String), s: &Slice, isolation: &Value, pod_selector: &Value) -> Value {
        let parse = |list: &[String]| -> Vec<Value> {
            list.iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect()
        };
        let mut spec = json!({
            "isGlobal": false,
            "priority": 1001,
            "podSelector": pod_selector,
            "policyRef": {"name": key.1, "namespace": key.0},
            "podIsolation": isolation,
        });
        // What was packed, before merging: kept to judge the merge.
        spec["__raw"] = json!({"ingress": parse(&s.ingress), "egress": parse(&s.egress)});
        if !s.pods.is_empty() {
            spec["podSelectorEndpoints"] = json!(parse(&s.pods));
        }
        for (d, list) in [("ingress", &s.ingress), ("egress", &s.egress)] {
            if !list.is_empty() {
                spec[d] = json!(combine(&json!(parse(list))).0);
            }
        }
        json!({
            "apiVersion": "networking.k8s.aws/v1alpha1",
            "kind": "PolicyEndpoint",
            "metadata": {
                "name": s.name,
                "namespace": key.0,
                "ownerReferences": [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                                     "name": key.1, "uid": format!("uid-{}-{}", key.0, key.1),
                                     "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": spec,
        })
    }

    /// The AWS controller merges the entries of a slice that share a CIDR:
    /// ports and excepts appended. That is the union of the entries only
    /// when they agree on the excepts and on whether they name ports at
    /// all; otherwise the merge allows less (true in the second place).
    pub fn combine(entries: &Value) -> (Vec<Value>, bool) {
        let mut by_cidr: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
        for e in entries.as_array().into_iter().flatten() {
            by_cidr
                .entry(e["cidr"].as_str().unwrap().to_string())
                .or_default()
                .push(e);
        }
        let mut lossy = false;
        let mut out = Vec::new();
        for (cidr, group) in by_cidr {
            let list =
                |e: &Value, k: &str| -> Vec<Value> { e[k].as_array().cloned().unwrap_or_default() };
            let except_set = |e: &Value| -> BTreeSet<String> {
                list(e, "except").iter().map(|v| v.to_string()).collect()
            };
            let first = group[0];
            if group.iter().any(|e| {
                except_set(e) != except_set(first)
                    || list(e, "ports").is_empty() != list(first, "ports").is_empty()
            }) {
                lossy = true;
            }
            let mut merged = json!({"action": "", "cidr": cidr});
            let ports: Vec<Value> = group.iter().flat_map(|e| list(e, "ports")).collect();
            let except: Vec<Value> = group.iter().flat_map(|e| list(e, "except")).collect();
            if !ports.is_empty() {
                merged["ports"] = json!(ports);
            }
            if !except.is_empty() {
                merged["except"] = json!(except);
            }
            out.push(merged);
        }
        (out, lossy)
    }

    fn pod_ip(p: &Pod) -> Option<String> {
        p.status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty())
    }

    fn matches(
        sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
        labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        selector_matches(sel, &labels.cloned().unwrap_or_default())
            .expect("generated selectors are valid")
    }

    fn entry(cidr: &str, except: &[String], ports: &[Value]) -> String {
        let mut e = json!({"action": "", "cidr": cidr});
        if !except.is_empty() {
            e["except"] = json!(except);
        }
        if !ports.is_empty() {
            e["ports"] = json!(ports);
        }
        e.to_string()
    }

    /// A port as the controller writes it for a CIDR: named ports cannot be
    /// resolved without a pod, so they are dropped.
    fn cidr_port(p: &NetworkPolicyPort) -> Option<Value> {
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        match &p.port {
            None => Some(json!({"protocol": protocol})),
            Some(IntOrString::String(_)) => None,
            Some(IntOrString::Int(n)) => {
                let mut v = json!({"protocol": protocol, "port": n});
                if let Some(e) = p.end_port {
                    v["endPort"] = json!(e);
                }
                Some(v)
            }
        }
    }

    /// A port as the controller writes it for one pod: named ports looked
    /// up in its containers (by name and protocol), numbers as they are.
    fn pod_port(pod: &Pod, p: &NetworkPolicyPort) -> Option<Value> {
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let number = match &p.port {
            None => None,
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(name)) => Some(
                pod.spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|cp| {
                        cp.name.as_deref() == Some(name)
                            && cp.protocol.as_deref().unwrap_or("TCP") == protocol
                    })?
                    .container_port,
            ),
        };
        let mut v = json!({"protocol": protocol});
        if let Some(n) = number {
            v["port"] = json!(n);
        }
        if let Some(e) = p.end_port {
            v["endPort"] = json!(e);
        }
        Some(v)
    }

    fn desired(np: &NetworkPolicy, state: &ClusterState) -> Desired {
        let ns = np.metadata.namespace.clone().unwrap();
        let spec = np.spec.clone().unwrap_or_default();
        let targets: Vec<&Pod> = state
            .pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(&ns))
            .filter(|p| {
                matches(
                    spec.pod_selector.as_ref().unwrap(),
                    p.metadata.labels.as_ref(),
                )
            })
            .collect();
        let pods = targets
            .iter()
            .filter_map(|p| {
                let ip = pod_ip(p)?;
                let host = p
                    .status
                    .as_ref()
                    .and_then(|s| s.host_ip.clone())
                    .unwrap_or_default();
                Some(
                    json!({"hostIP": host, "podIP": ip, "name": p.metadata.name, "namespace": ns})
                        .to_string(),
                )
            })
            .collect();
        let namespaces = |peer: &NetworkPolicyPeer| -> Vec<String> {
            match &peer.namespace_selector {
                None => vec![ns.clone()],
                Some(sel) => state
                    .namespaces
                    .iter()
                    .filter(|n| matches(sel, n.metadata.labels.as_ref()))
                    .map(|n| n.metadata.name.clone().unwrap())
                    .collect(),
            }
        };
        let peers_of = |peer: &NetworkPolicyPeer| -> Vec<&Pod> {
            let nss = namespaces(peer);
            state
                .pods
                .iter()
                .filter(|p| nss.contains(p.metadata.namespace.as_ref().unwrap()))
                .filter(|p| {
                    peer.pod_selector
                        .as_ref()
                        .is_none_or(|s| matches(s, p.metadata.labels.as_ref()))
                })
                .filter(|p| pod_ip(p).is_some())
                .collect()
        };
        let all = |ports: &[NetworkPolicyPort], out: &mut BTreeSet<String>| {
            let converted: Vec<Value> = ports.iter().filter_map(cidr_port).collect();
            if !ports.is_empty() && converted.is_empty() {
                return;
            }
            for cidr in ["0.0.0.0/0", "::/0"] {
                out.insert(entry(cidr, &[], &converted));
            }
        };
        let block =
            |peer: &NetworkPolicyPeer, ports: &[NetworkPolicyPort], out: &mut BTreeSet<String>| {
                let b = peer.ip_block.as_ref().unwrap();
                let converted: Vec<Value> = ports.iter().filter_map(cidr_port).collect();
                if !ports.is_empty() && converted.is_empty() {
                    return;
                }
                out.insert(entry(
                    &b.cidr,
                    b.except.as_deref().unwrap_or_default(),
                    &converted,
                ));
            };

        let mut ingress = BTreeSet::new();
        for rule in spec.ingress.iter().flatten() {
            let ports = rule.ports.clone().unwrap_or_default();
            let Some(from) = &rule.from else {
                all(&ports, &mut ingress);
                continue;
            };
            // Ports of the policy's own pods, gathered over all of them.
            let to_apply: Vec<Value> = targets
                .iter()
                .flat_map(|t| ports.iter().filter_map(|p| pod_port(t, p)))
                .collect();
            for peer in from {
                if peer.ip_block.is_some() {
                    block(peer, &ports, &mut ingress);
                    continue;
                }
                for p in peers_of(peer) {
                    let own: Vec<Value> =
                        ports.iter().filter_map(|port| pod_port(p, port)).collect();
                    if !ports.is_empty() && own.is_empty() {
                        continue;
                    }
                    ingress.insert(entry(&pod_ip(p).unwrap(), &[], &to_apply));
                }
            }
        }
        let mut egress = BTreeSet::new();
        for rule in spec.egress.iter().flatten() {
            let ports = rule.ports.clone().unwrap_or_default();
            let Some(to) = &rule.to else {
                all(&ports, &mut egress);
                continue;
            };
            for peer in to {
                if peer.ip_block.is_some() {
                    block(peer, &ports, &mut egress);
                    continue;
                }
                for p in peers_of(peer) {
                    let own: Vec<Value> =
                        ports.iter().filter_map(|port| pod_port(p, port)).collect();
                    if !ports.is_empty() && own.is_empty() {
                        continue;
                    }
                    egress.insert(entry(&pod_ip(p).unwrap(), &[], &own));
                }
            }
        }
        Desired {
            isolation: json!(spec.policy_types.clone().unwrap_or_default()),
            pod_selector: serde_json::to_value(&spec.pod_selector).unwrap(),
            ingress,
            egress,
            pods,
        }
    }
}

// ---------------------------------------------------------------------------

/// The API double with the objects the controller reads in
/// policyendpoint mode (no NetworkPolicies: the AWS controller has turned
/// them into PolicyEndpoints), and the revision each kind last reached.
struct Served {
    double: ApiDouble,
    /// Every object written to the double, by kind and (namespace, name).
    held: BTreeMap<(Kind, String, String), Value>,
    last: BTreeMap<Kind, u64>,
}

impl Served {
    async fn start() -> Served {
        Served {
            double: ApiDouble::start().await,
            held: BTreeMap::new(),
            last: BTreeMap::new(),
        }
    }

    fn apply(&mut self, mut object: Value) {
        let kind = match object["kind"].as_str().unwrap() {
            "Namespace" => Kind::Namespace,
            "Pod" => Kind::Pod,
            "PolicyEndpoint" => Kind::PolicyEndpoint,
            "ClusterPolicyEndpoint" => Kind::ClusterPolicyEndpoint,
            _ => return,
        };
        // The rendering's record of what was packed before merging is not
        // part of the object.
        if let Some(spec) = object["spec"].as_object_mut() {
            spec.remove("__raw");
        }
        let k = (
            kind,
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            object["metadata"]["name"].as_str().unwrap().to_string(),
        );
        if self.held.get(&k) == Some(&object) {
            return;
        }
        self.held.insert(k, object.clone());
        let revision = self.double.apply(object);
        self.last.insert(kind, revision);
    }

    fn delete(&mut self, kind: Kind, ns: &str, name: &str) {
        let cluster_scoped = matches!(kind, Kind::Namespace | Kind::ClusterPolicyEndpoint);
        let ns_key = if cluster_scoped { "" } else { ns };
        if self
            .held
            .remove(&(kind, ns_key.to_string(), name.to_string()))
            .is_none()
        {
            return;
        }
        let revision = self
            .double
            .delete(kind, (!cluster_scoped).then_some(ns), name);
        self.last.insert(kind, revision);
    }

    /// Brings the double to `cluster`'s namespaces and pods and the
    /// AWS controller's PolicyEndpoints for its policies, in the order the
    /// writers would: pods first, then the controller's reaction.
    fn sync(&mut self, cluster: &Cluster, aws: &mut aws::Controller) {
        for kind in ["Namespace", "Pod"] {
            for object in cluster.of_kind(kind) {
                self.apply(object.clone());
            }
        }
        let gone: Vec<(Kind, String, String)> = self
            .held
            .keys()
            .filter(|(kind, ns, name)| {
                let kind_name = match kind {
                    Kind::Namespace => "Namespace",
                    Kind::Pod => "Pod",
                    _ => return false,
                };
                !cluster
                    .0
                    .contains_key(&(kind_name.to_string(), ns.clone(), name.clone()))
            })
            .cloned()
            .collect();
        for (kind, ns, name) in gone {
            self.delete(kind, &ns, &name);
        }
        for op in aws.reconcile(&cluster.state()) {
            match op {
                aws::Op::Apply(object) => self.apply(object),
                aws::Op::Delete(ns, name) => self.delete(Kind::PolicyEndpoint, &ns, &name),
            }
        }
    }

    fn marker(&self) -> String {
        let rv = |k| self.last.get(&k).map(u64::to_string).unwrap_or_default();
        format!(
            "k8s namespaces={} pods={} policyendpoints={} clusterpolicyendpoints={}",
            rv(Kind::Namespace),
            rv(Kind::Pod),
            rv(Kind::PolicyEndpoint),
            rv(Kind::ClusterPolicyEndpoint)
        )
    }

    /// Brings the double's ClusterPolicyEndpoints to `slices`.
    fn sync_cluster_slices(&mut self, slices: Vec<Value>) {
        let names: BTreeSet<String> = slices
            .iter()
            .map(|s| s["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        for s in slices {
            self.apply(s);
        }
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|k| k.0 == Kind::ClusterPolicyEndpoint && !names.contains(&k.2))
            .map(|k| k.2.clone())
            .collect();
        for name in gone {
            self.delete(Kind::ClusterPolicyEndpoint, "", &name);
        }
    }

    /// Waits until the controller has listed every kind it watches.
    async fn until_listed(&self) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let kinds = [
            Kind::Namespace,
            Kind::Pod,
            Kind::PolicyEndpoint,
            Kind::ClusterPolicyEndpoint,
        ];
        while !kinds.iter().all(|k| {
            self.double
                .requests()
                .iter()
                .any(|r| r.kind == *k && r.is_watch())
        }) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the controller has not listed every kind within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await; // poll: the double has no request signal
        }
    }

    fn slices(&self) -> usize {
        self.held
            .keys()
            .filter(|k| k.0 == Kind::PolicyEndpoint)
            .count()
    }
}

/// The controller's kube path as main.rs wires it with
/// `--policy-source policyendpoint`.
fn start_controller(url: &str) -> Hub {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let hub = Hub::new(1);
    let (tx, rx) = mpsc::unbounded_channel();
    let (etx, erx) = watch::channel(Vec::new());
    tokio::spawn(kube_source::run_with(
        client,
        tx,
        etx,
        PolicySource::PolicyEndpoint,
    ));
    tokio::spawn(feed::run_changes(hub.clone(), rx, erx));
    hub
}

/// Waits until the hub has taken in everything the double serves, and
/// returns the engine's plans.
async fn plans_once_caught_up(hub: &Hub, served: &Served, what: &str) -> Resolution {
    let want = served.marker();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let view = hub.view();
        if view.source_synced && view.source_marker == want {
            return hub.with_engine(|e| e.expect("synced").resolution());
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{what}: the hub has not caught up within {DEADLINE:?}: synced={} marker={:?}, want {want:?}",
                view.source_synced, view.source_marker
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await; // poll: the hub has no change signal
    }
}

fn net(p: &IpPrefix) -> IpNet {
    let addr = match p.addr.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(p.addr.as_slice()).unwrap()),
        _ => IpAddr::from(<[u8; 16]>::try_from(p.addr.as_slice()).unwrap()),
    };
    IpNet::new(addr, p.prefix_len as u8).unwrap()
}

/// Whether one direction of a pod's plan allows `ip` on `protocol`/`port`,
/// as the datapath judges it: the Admin tier's rules in order (the first
/// that matches decides Accept or Deny; Pass skips the rest of the tier),
/// then NetworkPolicy if it isolates (allowed iff a rule allows), then the
/// Baseline tier likewise, then allow.
fn allows(dir: Option<&DirectionPolicy>, ip: IpAddr, protocol: Protocol, port: u16) -> bool {
    let Some(dir) = dir else {
        return true;
    };
    let port = u32::from(port);
    let matches = |peers: &[PeerBlock], ports: &[PortRange]| {
        peers.iter().any(|b| {
            b.cidr.as_ref().is_some_and(|c| net(c).contains(&ip))
                && !b.except.iter().any(|e| net(e).contains(&ip))
        }) && (ports.is_empty()
            || ports.iter().any(|r| {
                r.protocol == protocol as i32
                    && (r.port == 0
                        || r.port == port
                        || (r.end_port != 0 && (r.port..=r.end_port).contains(&port)))
            }))
    };
    let tier = |rules: &[TierRule]| -> Option<bool> {
        let r = rules.iter().find(|r| matches(&r.peers, &r.ports))?;
        match TierAction::try_from(r.action) {
            Ok(TierAction::Accept) => Some(true),
            Ok(TierAction::Pass) => None,
            _ => Some(false),
        }
    };
    if let Some(verdict) = tier(&dir.admin) {
        return verdict;
    }
    if !dir.not_isolated {
        return dir.rules.iter().any(|r| matches(&r.peers, &r.ports));
    }
    tier(&dir.baseline).unwrap_or(true)
}

const PORTS: [(Protocol, u16); 12] = [
    (Protocol::Tcp, 80),
    (Protocol::Tcp, 443),
    (Protocol::Tcp, 8080),
    (Protocol::Tcp, 8000),
    (Protocol::Tcp, 8100),
    (Protocol::Tcp, 8101),
    (Protocol::Tcp, 53),
    (Protocol::Tcp, 22),
    (Protocol::Udp, 53),
    (Protocol::Udp, 5353),
    (Protocol::Udp, 80),
    (Protocol::Sctp, 80),
];

/// Addresses that are no pod's: inside and outside the ipBlocks and excepts.
const OUTSIDE: [&str; 5] = [
    "10.0.1.200",
    "10.0.0.9",
    "10.0.9.9",
    "192.0.2.1",
    "fd00::ffff",
];

#[derive(Default, Debug)]
struct Tally {
    checks: usize,
    exact: usize,
    narrower: usize,
    /// Checks where the NetworkPolicy plan allows and the PolicyEndpoint
    /// plan does not (only where the AWS merge lost something).
    fewer_allowed: usize,
}

/// Compares the verdicts of both plans for every pod with an address.
/// `exact`: equal verdicts; otherwise the PolicyEndpoint plan may only
/// allow less.
fn compare(np: &Resolution, pe: &Resolution, exact: bool, what: &str, tally: &mut Tally) {
    assert!(np.errors.is_empty(), "{what}: {:?}", np.errors);
    assert!(pe.errors.is_empty(), "{what}: {:?}", pe.errors);
    let mut ips: BTreeSet<IpAddr> = OUTSIDE.iter().map(|s| s.parse().unwrap()).collect();
    for plan in np.plans.values() {
        for pod in plan.pods.values() {
            ips.extend(pod.pod_ips.iter().map(|p| net(p).addr()));
        }
    }
    let keys = |r: &Resolution| -> BTreeSet<(String, (String, String))> {
        r.plans
            .iter()
            .flat_map(|(n, p)| p.pods.keys().map(move |k| (n.clone(), k.clone())))
            .collect()
    };
    assert_eq!(keys(np), keys(pe), "{what}: the plans list other pods");
    let mut wrong = Vec::new();
    // The first differing direction, whole on both sides: this comparison
    // has failed once in about 30 runs under a loaded machine (seed 2,
    // step 0), never alone; the plans are what will say why.
    let mut first = String::new();
    for (node, plan) in &np.plans {
        for (key, a) in &plan.pods {
            let b = &pe.plans[node].pods[key];
            assert_eq!(a.pod_ips, b.pod_ips, "{what}: {key:?}");
            if exact {
                // Pods without an address too: the slices' podSelector
                // isolates them before the AWS controller lists them.
                assert_eq!(
                    a.policies, b.policies,
                    "{what}: {key:?}: selecting policies"
                );
                // A tier rule whose peers select no address is a rule
                // without peers on one side, no entry on the other.
                let no_tiers = |d: &Option<DirectionPolicy>| {
                    d.as_ref()
                        .is_none_or(|d| d.admin.is_empty() && d.baseline.is_empty())
                };
                if [&a.ingress, &a.egress, &b.ingress, &b.egress]
                    .into_iter()
                    .all(no_tiers)
                {
                    assert_eq!(
                        (a.ingress.is_some(), a.egress.is_some()),
                        (b.ingress.is_some(), b.egress.is_some()),
                        "{what}: {key:?}: isolation"
                    );
                }
            }
            if a.pod_ips.is_empty() {
                // Nothing reaches a pod without an address.
                continue;
            }
            for ip in &ips {
                for (proto, port) in PORTS {
                    for (dir, x, y) in [
                        ("ingress from", a.ingress.as_ref(), b.ingress.as_ref()),
                        ("egress to", a.egress.as_ref(), b.egress.as_ref()),
                    ] {
                        let (want, got) =
                            (allows(x, *ip, proto, port), allows(y, *ip, proto, port));
                        tally.checks += 1;
                        if want && !got {
                            tally.fewer_allowed += 1;
                        }
                        let bad = if exact { want != got } else { got && !want };
                        if bad && first.is_empty() {
                            first = format!(
                                "{key:?} {dir} {ip}:\nNetworkPolicy plan: {x:?}\nPolicyEndpoint plan: {y:?}\nPolicyEndpoint errors: {:?}",
                                pe.errors
                            );
                        }
                        if bad {
                            wrong.push(format!(
                                "{key:?} {dir} {ip} {proto:?}/{port}: NetworkPolicy {} PolicyEndpoint {}",
                                if want { "allows" } else { "denies" },
                                if got { "allows" } else { "denies" },
                            ));
                        }
                    }
                }
            }
        }
    }
    if exact {
        tally.exact += 1;
    } else {
        tally.narrower += 1;
    }
    assert!(
        wrong.is_empty(),
        "{what}:\n{}\nfirst difference: {first}",
        wrong.join("\n")
    );
}

/// Serves `cluster` through the double, lets the controller take it in,
/// and compares the verdicts with the NetworkPolicy plans.
async fn check(
    hub: &Hub,
    served: &mut Served,
    aws: &mut aws::Controller,
    cluster: &Cluster,
    what: &str,
    tally: &mut Tally,
) {
    served.sync(cluster, aws);
    let pe = plans_once_caught_up(hub, served, what).await;
    let np = resolve_cluster(&cluster.state());
    compare(&np, &pe, !aws.lossy, what, tally);
}

const FIXED: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: prod, labels: {kubernetes.io/metadata.name: prod, team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: dev, labels: {kubernetes.io/metadata.name: dev, team: b}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: prod, labels: {app: web}}
spec:
  nodeName: node-a
  containers: [{name: c, image: i, ports: [{name: http, containerPort: 80}]}]
status: {phase: Running, hostIP: 192.168.0.1, podIP: 10.1.0.11, podIPs: [{ip: 10.1.0.11}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, namespace: prod, labels: {app: web}}
spec:
  nodeName: node-b
  containers: [{name: c, image: i, ports: [{name: http, containerPort: 80}]}]
status: {phase: Running, hostIP: 192.168.0.2, podIP: 10.1.0.12, podIPs: [{ip: 10.1.0.12}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: prod, labels: {app: db}}
spec:
  nodeName: node-a
  containers: [{name: c, image: i, ports: [{name: pg, containerPort: 5432}]}]
status: {phase: Running, hostIP: 192.168.0.1, podIP: 10.1.0.13, podIPs: [{ip: 10.1.0.13}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api-1, namespace: dev, labels: {app: api}}
spec:
  nodeName: node-b
  containers: [{name: c, image: i, ports: [{name: http, containerPort: 8080}]}]
status: {phase: Running, hostIP: 192.168.0.2, podIP: 10.1.0.21, podIPs: [{ip: 10.1.0.21}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-1, namespace: dev, labels: {app: client}}
spec:
  nodeName: node-a
  containers: [{name: c, image: i}]
status: {phase: Running, hostIP: 192.168.0.1, podIP: 10.1.0.22, podIPs: [{ip: 10.1.0.22}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: prod}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}}]
    ports: [{protocol: TCP, port: 80}]
  - from: [{ipBlock: {cidr: 10.1.0.0/16, except: [10.1.0.0/28]}}]
    ports: [{protocol: TCP, port: 8000, endPort: 8100}, {protocol: UDP}]
  egress:
  - to: [{podSelector: {matchLabels: {app: db}}}]
    ports: [{protocol: TCP, port: pg}]
  - to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: api}}}]
    ports: [{protocol: TCP, port: http}]
  - ports: [{protocol: UDP, port: 53}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client, namespace: dev}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.1.0.0/24, except: [10.1.0.12/32]}}]
"#;

fn fixed() -> Cluster {
    let mut c = Cluster::default();
    for doc in api_double::yaml_documents(FIXED) {
        c.put(doc);
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_cluster_policy_endpoints_grant_what_the_network_policies_grant() {
    let cluster = fixed();
    let mut served = Served::start().await;
    let hub = start_controller(&served.double.url);
    let mut tally = Tally::default();
    // Two entries a slice: several slices per policy.
    let mut aws = aws::Controller::new(2, 7);
    check(&hub, &mut served, &mut aws, &cluster, "fixed", &mut tally).await;
    assert!(!aws.lossy);
    assert!(served.slices() >= 5, "{} slices", served.slices());
    // Non-trivial: web-1 is isolated both ways by both policies, may take
    // api-1 on 80 and send to api-1 on its named port 8080, not on 80.
    let pe = plans_once_caught_up(&hub, &served, "fixed").await;
    let web = &pe.plans["node-a"].pods[&("prod".into(), "web-1".into())];
    assert_eq!(web.policies, ["prod/default-deny", "prod/web"]);
    let api: IpAddr = "10.1.0.21".parse().unwrap();
    assert!(allows(web.ingress.as_ref(), api, Protocol::Tcp, 80));
    assert!(!allows(web.ingress.as_ref(), api, Protocol::Tcp, 81));
    assert!(allows(web.egress.as_ref(), api, Protocol::Tcp, 8080));
    assert!(!allows(web.egress.as_ref(), api, Protocol::Tcp, 80));

    // Changes reach the controller one object at a time: api-1 relabelled
    // out of web's egress, the client policy deleted.
    let mut cluster = cluster;
    let api_key = ("Pod".to_string(), "dev".to_string(), "api-1".to_string());
    let mut api_pod = cluster.0[&api_key].clone();
    api_pod["metadata"]["labels"] = json!({"app": "batch"});
    cluster.put(api_pod);
    cluster
        .0
        .remove(&("NetworkPolicy".into(), "dev".into(), "client".into()));
    check(
        &hub,
        &mut served,
        &mut aws,
        &cluster,
        "fixed, changed",
        &mut tally,
    )
    .await;
    let pe = plans_once_caught_up(&hub, &served, "fixed, changed").await;
    let web = &pe.plans["node-a"].pods[&("prod".into(), "web-1".into())];
    assert!(!allows(web.egress.as_ref(), api, Protocol::Tcp, 8080));
    let client = &pe.plans["node-a"].pods[&("dev".into(), "client-1".into())];
    assert!(client.egress.is_none() && client.policies.is_empty());
    assert_eq!(tally.exact, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_clusters_policy_endpoints_grant_what_the_network_policies_grant() {
    const CLUSTERS: u64 = 40;
    const STEPS: usize = 6;
    let mut tally = Tally::default();
    let mut slices = 0;
    for seed in 1..=CLUSTERS {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut addresses = Addresses(0);
        let mut cluster = generated(&mut rng, &mut addresses);
        let mut served = Served::start().await;
        let hub = start_controller(&served.double.url);
        let mut aws = aws::Controller::new(1 + rng.below(4), seed);
        check(
            &hub,
            &mut served,
            &mut aws,
            &cluster,
            &format!("seed {seed}"),
            &mut tally,
        )
        .await;
        slices += served.slices();
        for step in 0..STEPS {
            for _ in 0..1 + rng.below(3) {
                mutate(&mut rng, &mut cluster, &mut addresses);
            }
            check(
                &hub,
                &mut served,
                &mut aws,
                &cluster,
                &format!("seed {seed} step {step}"),
                &mut tally,
            )
            .await;
        }
    }
    eprintln!("{tally:?}, {slices} slices in the first views");
    let views = (CLUSTERS as usize) * (STEPS + 1);
    assert_eq!(tally.exact + tally.narrower, views);
    // The oracle must mostly be equality, not the weaker "no more".
    assert!(tally.exact * 2 > views, "{tally:?}");
    assert!(tally.checks > 100_000, "{tally:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_slices_are_errors_naming_object_and_field_and_weaken_nothing() {
    let mut served = Served::start().await;
    let hub = start_controller(&served.double.url);
    let pod = |name: &str, ip: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "x", "labels": {"app": name}},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
               "status": {"podIP": ip, "podIPs": [{"ip": ip}]}})
    };
    let slice = |name: &str, spec: Value| {
        json!({"apiVersion": "networking.k8s.aws/v1alpha1", "kind": "PolicyEndpoint",
               "metadata": {"name": name, "namespace": "x"}, "spec": spec})
    };
    served.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}));
    served.apply(pod("server", "10.0.0.1"));
    served.apply(pod("client", "10.0.0.2"));
    served.apply(slice(
        "p-a",
        json!({
            "policyRef": {"name": "p", "namespace": "x"},
            "podIsolation": ["Ingress"],
            "podSelectorEndpoints": [{"name": "server", "namespace": "x", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}],
            "ingress": [{"cidr": "10.0.0.2", "ports": [{"protocol": "TCP", "port": 80}]}],
        }),
    ));
    served.apply(slice(
        "p-b",
        json!({
            "policyRef": {"name": "p", "namespace": "x"},
            "podIsolation": ["Ingress"],
            "ingress": [
                {"cidr": "10.0.0.0/33"},
                {"cidr": "10.0.0.3", "ports": [{"protocol": "ICMP", "port": 1}]},
                {"cidr": "10.0.0.4", "ports": [{"protocol": "UDP", "port": 53}]},
            ],
        }),
    ));
    let key = ("x".to_string(), "server".to_string());
    let client: IpAddr = "10.0.0.2".parse().unwrap();
    let fourth: IpAddr = "10.0.0.4".parse().unwrap();
    let pe = plans_once_caught_up(&hub, &served, "bad entries").await;
    let server = &pe.plans["n1"].pods[&key];
    assert!(allows(server.ingress.as_ref(), client, Protocol::Tcp, 80));
    assert!(allows(server.ingress.as_ref(), fourth, Protocol::Udp, 53));
    assert!(!allows(
        server.ingress.as_ref(),
        "10.0.0.9".parse().unwrap(),
        Protocol::Tcp,
        80
    ));
    assert_eq!(
        pe.errors,
        [
            "PolicyEndpoint x/p-b: spec.ingress[0].cidr: \"10.0.0.0/33\" is not a CIDR (want e.g. 10.0.0.0/8 or fd00::/64); entry ignored",
            "PolicyEndpoint x/p-b: spec.ingress[1].ports[0].protocol: unknown protocol \"ICMP\" (want TCP, UDP or SCTP); entry ignored",
        ]
    );
    assert_eq!(hub.view().errors, pe.errors, "operators see them");

    // A slice that stops parsing keeps its previous version in force.
    served.apply(slice(
        "p-a",
        json!({
            "policyRef": {"name": "p", "namespace": "x"},
            "podIsolation": "Ingress",
        }),
    ));
    let pe = plans_once_caught_up(&hub, &served, "unparsable slice").await;
    let server = &pe.plans["n1"].pods[&key];
    assert!(server.ingress.is_some() && allows(server.ingress.as_ref(), client, Protocol::Tcp, 80));
    assert!(
        pe.errors.iter().any(|e| e.starts_with(
            "PolicyEndpoint x/p-a: spec.podIsolation: Invalid value: \"string\": spec.podIsolation in body must be of type array"
        ) && e.ends_with("its previous version stays in force")),
        "{:?}",
        pe.errors
    );

    // Slices disagreeing on isolation: the union, and an error saying so.
    served.apply(slice(
        "p-a",
        json!({
            "policyRef": {"name": "p", "namespace": "x"},
            "podIsolation": ["Ingress", "Egress"],
            "podSelectorEndpoints": [{"name": "server", "namespace": "x", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}],
            "ingress": [{"cidr": "10.0.0.2", "ports": [{"protocol": "TCP", "port": 80}]}],
        }),
    ));
    let pe = plans_once_caught_up(&hub, &served, "disagreeing slices").await;
    let server = &pe.plans["n1"].pods[&key];
    assert_eq!(
        server.egress.as_ref().map(|e| e.rules.len()),
        Some(0),
        "egress isolated, nothing allowed"
    );
    assert!(pe.errors.iter().any(|e| e.starts_with(
        "NetworkPolicy x/p: its PolicyEndpoints disagree on podIsolation ([Egress, Ingress] in p-a; [Ingress] in p-b)"
    )), "{:?}", pe.errors);

    // A slice in one namespace cannot speak for a policy of another.
    served.apply(
        json!({"apiVersion": "networking.k8s.aws/v1alpha1", "kind": "PolicyEndpoint",
        "metadata": {"name": "intruder", "namespace": "y"},
        "spec": {"policyRef": {"name": "p", "namespace": "x"}, "podIsolation": ["Ingress"],
                 "podSelectorEndpoints": [{"name": "server", "namespace": "x", "podIP": "10.0.0.1", "hostIP": "192.168.0.1"}],
                 "ingress": [{"cidr": "0.0.0.0/0"}]}}),
    );
    let pe = plans_once_caught_up(&hub, &served, "foreign slice").await;
    let server = &pe.plans["n1"].pods[&key];
    assert!(!allows(
        server.ingress.as_ref(),
        "10.0.0.9".parse().unwrap(),
        Protocol::Tcp,
        80
    ));
    assert!(
        pe.errors.iter().any(|e| {
            e.starts_with(
        "PolicyEndpoint y/intruder: spec.policyRef.namespace: \"x\" is not the object's namespace"
    )
        }),
        "{:?}",
        pe.errors
    );

    // Deleting every slice lifts the policy; the errors go with them.
    for name in ["p-a", "p-b"] {
        served.delete(Kind::PolicyEndpoint, "x", name);
    }
    served.delete(Kind::PolicyEndpoint, "y", "intruder");
    let pe = plans_once_caught_up(&hub, &served, "slices deleted").await;
    let server = &pe.plans["n1"].pods[&key];
    assert!(server.ingress.is_none() && server.policies.is_empty());
    assert!(pe.errors.is_empty(), "{:?}", pe.errors);
}

// ---------------------------------------------------------------------------
// ClusterNetworkPolicies (networking.k8s.aws/v1alpha1) and the
// ClusterPolicyEndpoints the AWS controller resolves them into.

/// Plays the AWS controller for ClusterNetworkPolicies: every policy
/// becomes slices named after it carrying its tier, priority and subject;
/// the pods the subject selects (with an address, not host-network) as
/// podSelectorEndpoints; every peer resolved to addresses (namespaces and
/// pods to the pods' addresses, networks as written), one entry per
/// address with the rule's action and ports. Entries are deduplicated and
/// packed `chunk` to a slice in an order drawn from `seed` (the
/// controller's is a Go map's), so neither the slice nor the position says
/// which rule an entry came from.
fn aws_cluster_slices(cluster: &Cluster, chunk: usize, seed: u64) -> Vec<Value> {
    use policy_controller::resolve::selector_matches;
    let labels = |v: &Value| -> BTreeMap<String, String> {
        serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
    };
    let matches = |sel: &Value, l: &BTreeMap<String, String>| {
        let sel = serde_json::from_value(sel.clone()).unwrap();
        selector_matches(&sel, l).unwrap()
    };
    let ns_labels: BTreeMap<String, BTreeMap<String, String>> = cluster
        .of_kind("Namespace")
        .map(|n| {
            (
                n["metadata"]["name"].as_str().unwrap().to_string(),
                labels(n),
            )
        })
        .collect();
    let pods: Vec<&Value> = cluster
        .of_kind("Pod")
        .filter(|p| p["status"]["podIP"].is_string() && p["spec"]["hostNetwork"] != json!(true))
        .collect();
    let ns_of = |p: &Value| p["metadata"]["namespace"].as_str().unwrap().to_string();
    // Pods a `namespaces` selector (pods: None) or a `pods` peer selects.
    let select = |namespaces: &Value, pod_sel: Option<&Value>| -> Vec<&Value> {
        pods.iter()
            .copied()
            .filter(|p| {
                matches(namespaces, &ns_labels[&ns_of(p)])
                    && pod_sel.is_none_or(|s| matches(s, &labels(p)))
            })
            .collect()
    };
    let peer_pods = |peer: &Value| -> Vec<&Value> {
        if let Some(ns) = peer.get("namespaces") {
            select(ns, None)
        } else if let Some(p) = peer.get("pods") {
            select(&p["namespaceSelector"], Some(&p["podSelector"]))
        } else {
            vec![]
        }
    };
    let mut rng = Rng(seed | 1);
    let mut out = Vec::new();
    for cnp in cluster.of_kind("ClusterNetworkPolicy") {
        let name = cnp["metadata"]["name"].as_str().unwrap();
        let spec = &cnp["spec"];
        let subject = &spec["subject"];
        let subject_pods = peer_pods(subject);
        // (list, entry): 0 pods, 1 ingress, 2 egress.
        let mut items: BTreeSet<(usize, String)> = BTreeSet::new();
        for p in subject_pods {
            let pod = json!({"name": p["metadata"]["name"], "namespace": p["metadata"]["namespace"],
                             "podIP": p["status"]["podIP"], "hostIP": p["status"]["hostIP"]});
            items.insert((0, pod.to_string()));
        }
        for (list, key, peers_key) in [(1, "ingress", "from"), (2, "egress", "to")] {
            for rule in spec[key].as_array().into_iter().flatten() {
                let ports: Vec<Value> = rule["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        if let Some(n) = p.get("portNumber") {
                            json!({"protocol": n["protocol"], "port": n["port"]})
                        } else {
                            let r = &p["portRange"];
                            json!({"protocol": r["protocol"], "port": r["start"], "endPort": r["end"]})
                        }
                    })
                    .collect();
                let mut cidrs: Vec<String> = Vec::new();
                for peer in rule[peers_key].as_array().into_iter().flatten() {
                    for net in peer["networks"].as_array().into_iter().flatten() {
                        cidrs.push(net.as_str().unwrap().to_string());
                    }
                    for p in peer_pods(peer) {
                        cidrs.push(p["status"]["podIP"].as_str().unwrap().to_string());
                    }
                }
                for cidr in cidrs {
                    let mut entry = json!({"action": rule["action"], "cidr": cidr});
                    if !ports.is_empty() {
                        entry["ports"] = json!(ports);
                    }
                    items.insert((list, entry.to_string()));
                }
            }
        }
        let mut items: Vec<(usize, String)> = items.into_iter().collect();
        rng.shuffle(&mut items);
        let chunks: Vec<&[(usize, String)]> = if items.is_empty() {
            vec![&[]]
        } else {
            items.chunks(chunk).collect()
        };
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut spec = json!({"policyRef": {"name": name}, "tier": spec["tier"],
                                  "priority": spec["priority"], "subject": subject});
            for (list, key) in [(0, "podSelectorEndpoints"), (1, "ingress"), (2, "egress")] {
                let of: Vec<Value> = chunk
                    .iter()
                    .filter(|(l, _)| *l == list)
                    .map(|(_, e)| serde_json::from_str(e).unwrap())
                    .collect();
                if !of.is_empty() {
                    spec[key] = json!(of);
                }
            }
            out.push(
                json!({"apiVersion": "networking.k8s.aws/v1alpha1", "kind": "ClusterPolicyEndpoint",
                            "metadata": {"name": format!("{name}-{i}")}, "spec": spec}),
            );
        }
    }
    out
}

/// A generated AWS ClusterNetworkPolicy: either tier, a priority of three
/// (so ties, ordered by name), a subject, rules of every action written
/// Deny, then Pass, then Accept (see FIXED_CNPS), peers of every kind the
/// AWS CRD has but `domainNames`, ports by number and range.
fn cluster_policy(rng: &mut Rng, name: &str) -> Value {
    let team = |rng: &mut Rng| selector(rng, "team", &["red", "blue"]);
    let app = |rng: &mut Rng| selector(rng, "app", &APPS);
    let pods = |rng: &mut Rng| json!({"namespaceSelector": team(rng), "podSelector": app(rng)});
    let subject = if rng.chance(50) {
        json!({"namespaces": team(rng)})
    } else {
        json!({"pods": pods(rng)})
    };
    let mut spec = json!({"tier": rng.pick(&["Admin", "Baseline"]), "priority": 1 + rng.below(3),
                          "subject": subject});
    for (key, peers_key) in [("ingress", "from"), ("egress", "to")] {
        let mut rules = Vec::new();
        for _ in 0..rng.below(4) {
            let peers: Vec<Value> = (0..1 + rng.below(2))
                .map(|_| match rng.below(if key == "egress" { 3 } else { 2 }) {
                    0 => json!({"namespaces": team(rng)}),
                    1 => json!({"pods": pods(rng)}),
                    _ => json!({"networks": [rng.pick(&["10.0.0.0/16", "10.0.1.0/29", "0.0.0.0/0", "fd00::/64"])]}),
                })
                .collect();
            let mut rule =
                json!({"action": rng.pick(&["Deny", "Pass", "Accept"]), peers_key: peers});
            if rng.chance(50) {
                let ports: Vec<Value> = (0..1 + rng.below(2))
                    .map(|_| match rng.below(3) {
                        0 => json!({"portNumber": {"protocol": "TCP", "port": rng.pick(&[80, 443, 53])}}),
                        1 => json!({"portNumber": {"protocol": "UDP", "port": 53}}),
                        _ => json!({"portRange": {"protocol": "TCP", "start": 8000, "end": 8100}}),
                    })
                    .collect();
                rule["ports"] = json!(ports);
            }
            rules.push(rule);
        }
        let rank = |r: &Value| match r["action"].as_str().unwrap() {
            "Deny" => 0,
            "Pass" => 1,
            _ => 2,
        };
        rules.sort_by_key(rank);
        if !rules.is_empty() {
            spec[key] = json!(rules);
        }
    }
    json!({"apiVersion": "networking.k8s.aws/v1alpha1", "kind": "ClusterNetworkPolicy",
           "metadata": {"name": name}, "spec": spec})
}

/// Both tiers, priorities (two policies of one priority, ordered by name),
/// Accept, Deny and Pass, over FIXED's NetworkPolicies. Each policy's rules
/// are written Deny, then Pass, then Accept: a slice keeps no rule order,
/// and where one policy's rules of different actions overlap Palisade
/// judges its slices in that order (see `source::cluster_policy_endpoint`).
const FIXED_CNPS: &str = r#"
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: admin-guard}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress:
  - {action: Deny, from: [{namespaces: {matchLabels: {team: b}}}], ports: [{portRange: {protocol: TCP, start: 8000, end: 8050}}]}
  - {action: Pass, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}]}
  - {action: Accept, from: [{pods: {namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: api}}}}], ports: [{portNumber: {protocol: UDP, port: 5353}}]}
  egress:
  - {action: Deny, to: [{networks: [10.0.9.0/24, "fd00::/16"]}]}
  - {action: Accept, to: [{pods: {namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: api}}}}], ports: [{portNumber: {protocol: TCP, port: 443}}]}
---
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: admin-db}
spec:
  tier: Admin
  priority: 20
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: db}}}}
  ingress:
  - {action: Deny, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}]}
  - {action: Pass, from: [{namespaces: {matchLabels: {team: a}}}]}
  - {action: Accept, from: [{namespaces: {}}], ports: [{portNumber: {protocol: TCP, port: 22}}]}
---
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: baseline-dev}
spec:
  tier: Baseline
  priority: 5
  subject: {namespaces: {matchLabels: {team: b}}}
  ingress:
  - {action: Deny, from: [{namespaces: {matchLabels: {team: a}}}], ports: [{portNumber: {protocol: TCP, port: 80}}]}
  egress:
  - {action: Pass, to: [{networks: [192.0.2.0/24]}]}
---
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: baseline-open}
spec:
  tier: Baseline
  priority: 5
  subject: {namespaces: {}}
  ingress:
  - {action: Deny, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}], ports: [{portNumber: {protocol: UDP, port: 53}}]}
  - {action: Accept, from: [{namespaces: {}}]}
  egress:
  - {action: Deny, to: [{networks: [0.0.0.0/0]}], ports: [{portNumber: {protocol: SCTP, port: 80}}]}
  - {action: Accept, to: [{networks: [10.0.0.0/8]}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policy_endpoints_grant_what_the_cluster_network_policies_grant() {
    let mut cluster = fixed();
    for doc in api_double::yaml_documents(FIXED_CNPS) {
        cluster.put(doc);
    }
    let mut served = Served::start().await;
    let hub = start_controller(&served.double.url);
    let mut tally = Tally::default();
    let mut aws = aws::Controller::new(2, 7);
    let mut check_cnps = async |cluster: &Cluster, seed: u64, what: &str, tally: &mut Tally| {
        served.sync(cluster, &mut aws);
        served.sync_cluster_slices(aws_cluster_slices(cluster, 1 + (seed as usize % 3), seed));
        let pe = plans_once_caught_up(&hub, &served, what).await;
        let np = resolve_cluster(&cluster.state());
        compare(&np, &pe, true, what, tally);
        pe
    };
    for seed in 1..=4 {
        let pe = check_cnps(
            &cluster,
            seed,
            &format!("fixed CNPs, seed {seed}"),
            &mut tally,
        )
        .await;
        // Not trivial: the tiers decide some of these.
        let web = &pe.plans["node-a"].pods[&("prod".into(), "web-1".into())];
        let api: IpAddr = "10.1.0.21".parse().unwrap();
        let client: IpAddr = "10.1.0.22".parse().unwrap();
        assert!(!web.ingress.as_ref().unwrap().admin.is_empty());
        assert!(
            !allows(web.ingress.as_ref(), api, Protocol::Tcp, 8000),
            "Admin Deny"
        );
        assert!(
            allows(web.ingress.as_ref(), api, Protocol::Udp, 5353),
            "Admin Accept"
        );
        assert!(
            !allows(web.ingress.as_ref(), client, Protocol::Tcp, 8000),
            "Deny before Pass"
        );
        assert!(
            allows(web.ingress.as_ref(), client, Protocol::Tcp, 8060),
            "Pass, then the NetworkPolicy"
        );
        assert!(!allows(web.ingress.as_ref(), client, Protocol::Tcp, 22));
        let dev_api = &pe.plans["node-b"].pods[&("dev".into(), "api-1".into())];
        let web2: IpAddr = "10.1.0.12".parse().unwrap();
        assert!(
            !allows(dev_api.ingress.as_ref(), web2, Protocol::Tcp, 80),
            "baseline-dev before baseline-open"
        );
        assert!(allows(dev_api.ingress.as_ref(), web2, Protocol::Tcp, 81));
        assert_eq!(
            dev_api.policies,
            [
                "ClusterNetworkPolicy.networking.k8s.aws/baseline-dev",
                "ClusterNetworkPolicy.networking.k8s.aws/baseline-open"
            ]
        );
    }

    // Changes: a policy moves below another and changes its action, one is
    // deleted (its slices go), a pod leaves a subject.
    let key = |name: &str| {
        (
            "ClusterNetworkPolicy".to_string(),
            String::new(),
            name.to_string(),
        )
    };
    let mut guard = cluster.0[&key("admin-guard")].clone();
    guard["spec"]["priority"] = json!(30);
    guard["spec"]["ingress"][0]["action"] = json!("Pass");
    cluster.put(guard);
    cluster.0.remove(&key("baseline-dev"));
    let db = ("Pod".to_string(), "prod".to_string(), "db-1".to_string());
    let mut db_pod = cluster.0[&db].clone();
    db_pod["metadata"]["labels"] = json!({"app": "cache"});
    cluster.put(db_pod);
    let pe = check_cnps(&cluster, 5, "fixed CNPs, changed", &mut tally).await;
    assert!(!served.held.keys().any(|k| k.2.starts_with("baseline-dev-")));
    let dev_api = &pe.plans["node-b"].pods[&("dev".into(), "api-1".into())];
    let web2: IpAddr = "10.1.0.12".parse().unwrap();
    assert!(allows(dev_api.ingress.as_ref(), web2, Protocol::Tcp, 80));
    assert_eq!(tally.exact, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_slices_are_errors_naming_object_and_field_and_a_missing_crd_is_none() {
    let mut served = Served::start().await;
    // An AWS controller before ClusterNetworkPolicies: no CRD. The
    // controller syncs all the same.
    served.double.set_served(Kind::ClusterPolicyEndpoint, false);
    let hub = start_controller(&served.double.url);
    let pod = |name: &str, ip: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "x", "labels": {"app": name}},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
               "status": {"podIP": ip, "podIPs": [{"ip": ip}]}})
    };
    let slice = |name: &str, spec: Value| {
        json!({"apiVersion": "networking.k8s.aws/v1alpha1", "kind": "ClusterPolicyEndpoint",
               "metadata": {"name": name}, "spec": spec})
    };
    served.apply(json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": "x", "labels": {"team": "a"}}}));
    served.apply(pod("server", "10.0.0.1"));
    served.apply(pod("client", "10.0.0.2"));
    let key = ("x".to_string(), "server".to_string());
    let client: IpAddr = "10.0.0.2".parse().unwrap();
    let other: IpAddr = "10.0.0.9".parse().unwrap();
    let pe = plans_once_caught_up(&hub, &served, "no CRD").await;
    assert!(pe.plans["n1"].pods[&key].ingress.is_none());

    // The CRD installed, and slices: one denies the client on port 80, one
    // has an entry that cannot be read (a Deny: it denies everything), one
    // a field the CRD does not have (refused whole).
    served.double.set_served(Kind::ClusterPolicyEndpoint, true);
    let subject = json!({"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "server"}}}});
    served.apply(slice(
        "deny-client-a",
        json!({"policyRef": {"name": "deny-client"}, "tier": "Admin", "priority": 10,
               "subject": subject,
               "ingress": [{"action": "Deny", "cidr": "10.0.0.2", "ports": [{"protocol": "TCP", "port": 80}]}]}),
    ));
    served.apply(slice(
        "broken-a",
        json!({"policyRef": {"name": "broken"}, "tier": "Baseline", "priority": 1,
               "subject": subject,
               "ingress": [{"action": "Deny", "cidr": "10.0.0.300"}]}),
    ));
    served.apply(slice(
        "typo-a",
        json!({"policyRef": {"name": "typo"}, "tier": "Admin", "priority": 1,
               "subject": subject,
               "ingress": [{"actoin": "Accept", "cidr": "0.0.0.0/0"}]}),
    ));
    let pe = plans_once_caught_up(&hub, &served, "bad cluster slices").await;
    let server = &pe.plans["n1"].pods[&key];
    assert!(!allows(server.ingress.as_ref(), client, Protocol::Tcp, 80));
    assert!(
        !allows(server.ingress.as_ref(), other, Protocol::Tcp, 81),
        "the unreadable Deny denies everything"
    );
    let want = [
        "ClusterPolicyEndpoint broken-a: spec.ingress[0].cidr: \"10.0.0.300\" is not an address",
        "ClusterPolicyEndpoint typo-a: spec.ingress[0].action: Required value; \
         spec.ingress[0].actoin: unknown field",
    ];
    for w in want {
        assert!(
            pe.errors.iter().any(|e| e.contains(w)),
            "{w}: {:?}",
            pe.errors
        );
    }
    assert_eq!(hub.view().errors, pe.errors, "operators see them");

    // A slice that stops parsing keeps its previous version in force.
    served.apply(slice(
        "deny-client-a",
        json!({"policyRef": {"name": "deny-client"}, "tier": "Developer", "priority": 10,
               "subject": subject}),
    ));
    let pe = plans_once_caught_up(&hub, &served, "unparsable cluster slice").await;
    let server = &pe.plans["n1"].pods[&key];
    assert!(!allows(server.ingress.as_ref(), client, Protocol::Tcp, 80));
    assert!(
        pe.errors.iter().any(|e| e.starts_with(
            "ClusterPolicyEndpoint deny-client-a: spec.tier: Unsupported value: \"Developer\""
        ) && e.ends_with("its previous version stays in force")),
        "{:?}",
        pe.errors
    );

    // The CRD removed: its slices with it, and their errors.
    served.double.set_served(Kind::ClusterPolicyEndpoint, false);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let pe = hub.with_engine(|e| e.expect("synced").resolution());
        let server = &pe.plans["n1"].pods[&key];
        if server.ingress.is_none() && server.policies.is_empty() && pe.errors.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", pe.errors);
        tokio::time::sleep(Duration::from_millis(5)).await; // poll: the hub has no change signal
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_clusters_cluster_policy_endpoints_grant_what_the_cluster_network_policies_grant()
{
    const CLUSTERS: u64 = 20;
    const STEPS: usize = 4;
    let mut tally = Tally::default();
    let mut tiered = 0;
    for seed in 1..=CLUSTERS {
        let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
        let mut addresses = Addresses(0);
        let mut cluster = generated(&mut rng, &mut addresses);
        for i in 0..1 + rng.below(4) {
            cluster.put(cluster_policy(&mut rng, &format!("cnp{i}")));
        }
        let mut served = Served::start().await;
        let hub = start_controller(&served.double.url);
        if seed % 2 == 0 {
            // The first objects then reach the controller by its watches,
            // not in its lists.
            served.until_listed().await;
        }
        let mut aws = aws::Controller::new(1 + rng.below(4), seed);
        for step in 0..=STEPS {
            if step > 0 {
                for _ in 0..1 + rng.below(3) {
                    if rng.chance(30) {
                        let name = format!("cnp{}", rng.below(5));
                        if rng.chance(25) {
                            cluster.0.remove(&(
                                "ClusterNetworkPolicy".to_string(),
                                String::new(),
                                name,
                            ));
                        } else {
                            cluster.put(cluster_policy(&mut rng, &name));
                        }
                    } else {
                        mutate(&mut rng, &mut cluster, &mut addresses);
                    }
                }
            }
            let what = format!("seed {seed} step {step}");
            served.sync(&cluster, &mut aws);
            let chunk = 1 + rng.below(4);
            let slice_seed = rng.next();
            served.sync_cluster_slices(aws_cluster_slices(&cluster, chunk, slice_seed));
            let pe = plans_once_caught_up(&hub, &served, &what).await;
            let np = resolve_cluster(&cluster.state());
            compare(&np, &pe, !aws.lossy, &what, &mut tally);
            tiered += pe
                .plans
                .values()
                .flat_map(|p| p.pods.values())
                .filter(|p| {
                    [&p.ingress, &p.egress].into_iter().flatten().any(|d| {
                        d.admin
                            .iter()
                            .chain(&d.baseline)
                            .any(|r| !r.peers.is_empty())
                    })
                })
                .count();
        }
    }
    eprintln!("{tally:?}, {tiered} pod views with tier rules");
    // Not trivial: the tiers decide for many pods.
    assert!(tiered > 100, "{tiered}");
    let views = (CLUSTERS as usize) * (STEPS + 1);
    assert_eq!(tally.exact + tally.narrower, views);
    assert!(tally.exact * 2 > views, "{tally:?}");
}
