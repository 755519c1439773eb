//! Incremental equals full: random clusters take random sequences of changes
//! (pods added, deleted, relabelled, moved to a node; namespaces relabelled,
//! added, deleted; policies added, edited, deleted). After every change the
//! engine's plans and errors must equal the full computation
//! (`resolve_with_errors`, the oracle), and every node's plan as rebuilt
//! from the deltas it received must equal its full plan, with a new version
//! exactly when its full plan changed.
//!
//! Changes reach the hub both ways a source can deliver them: as a whole new
//! view (`Hub::update`, which diffs) and as events (`Hub::apply`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use policy_controller::cluster::{ClusterState, Object};
use policy_controller::engine::Change;
use policy_controller::hub::{apply_delta, delta, Hub, VersionedPlan};
use policy_controller::resolve::{resolve_with_errors, NodePlan};
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
    let mut spec = json!({"containers": [{"name": "c", "ports": ports}]});
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

/// The cluster as objects by kind and key, so changes are easy to make.
#[derive(Clone, Default)]
struct Model {
    namespaces: BTreeMap<String, Namespace>,
    pods: BTreeMap<(String, String), Pod>,
    policies: BTreeMap<(String, String), NetworkPolicy>,
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
        m
    }

    fn state(&self, marker: String) -> ClusterState {
        let objects = self
            .namespaces
            .values()
            .cloned()
            .map(Object::Namespace)
            .chain(self.pods.values().cloned().map(Object::Pod))
            .chain(self.policies.values().cloned().map(Object::NetworkPolicy));
        ClusterState::from_objects(objects, marker)
    }

    /// Makes one random change to the model and returns it as an event.
    fn change(&mut self, rng: &mut Rng) -> Change {
        let ns = rng.pick(&NAMESPACES).to_string();
        match rng.below(10) {
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
            _ => match self.random_key(rng, false) {
                Some(key) => {
                    self.policies.remove(&key);
                    Change::DeletePolicy(key)
                }
                None => self.change(rng),
            },
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
    let mut full = resolve_with_errors(&state);
    let mut nodes: BTreeMap<&str, Receiver> = NODES
        .iter()
        .map(|n| {
            let sub = hub.subscribe(n).unwrap();
            let seen = sub.rx.borrow().clone();
            let plan = (*seen.plan).clone();
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
        let before = std::mem::replace(&mut full, resolve_with_errors(&state));
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
                apply_delta(&mut r.plan, &d);
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
