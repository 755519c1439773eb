//! Explain against the verdict it explains.
//!
//! - Random clusters (NetworkPolicies, ClusterNetworkPolicies of both
//!   tiers, host-network pods, Nodes): for every pair of pods (and pods
//!   against external addresses), protocols and ports, explain's allow/deny
//!   per direction equals the reference model's `allowed`, in both modes
//!   (and its overall answer their conjunction), and a rule it names really
//!   is in the named policy.
//! - The engine's copy of the cluster (what the Explain RPC reads) judges
//!   every such connection as the objects it was built from do.
//! - The Explain RPC over a real socket, fed by the manifest source: the
//!   deciding policy and rule, named ports, external peers, and each refusal.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_apis::{wire, Action, ClusterNetworkPolicy};
use palisade_model::explain::{
    explain, explain_direction, Decided, Decision, Explanation, Peer, Query,
};
use palisade_model::tiers::Mode;
use palisade_model::verdict::{allowed_in, Direction};
use palisade_proto::v1::{
    debug_service_client::DebugServiceClient, ExplainRequest, ExplainResponse,
};
use palisade_runtime::transport::{connect, serve, Address};
use policy_controller::cluster::{ClusterState, Object};
use policy_controller::engine::Engine;
use policy_controller::model::{allowed, Endpoint};
use policy_controller::{feed, hub::Hub, server, source::manifest};
use serde_json::{json, Value};
use tokio::sync::watch;
use tonic::Code;

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

const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const APPS: [&str; 3] = ["web", "db", "cache"];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const PORTS: [u16; 5] = [53, 80, 443, 8080, 8050];
const EXTERNAL: [&str; 3] = ["192.0.2.7", "10.0.1.3", "10.9.0.1"];

fn selector(rng: &mut Rng, key: &str, values: &[&str]) -> Value {
    match rng.below(5) {
        0 => json!({}),
        1 | 2 => json!({"matchLabels": {key: rng.pick(values)}}),
        3 => {
            json!({"matchExpressions": [{"key": key, "operator": "In", "values": [rng.pick(values), rng.pick(values)]}]})
        }
        _ => {
            json!({"matchExpressions": [{"key": key, "operator": rng.pick(&["NotIn", "Exists", "DoesNotExist"]), "values": [rng.pick(values)]}]})
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
        3 => json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}),
        _ => json!({"ipBlock": {"cidr": "192.0.2.0/24"}}),
    }
}

fn ports(rng: &mut Rng) -> Value {
    let out: Vec<Value> = (0..rng.below(3))
        .map(|_| match rng.below(4) {
            0 => json!({"port": rng.pick(&[80, 443, 53])}),
            1 => json!({"port": 8000, "endPort": 8100, "protocol": "TCP"}),
            2 => json!({"port": "http"}),
            _ => json!({"port": "dns", "protocol": "UDP"}),
        })
        .collect();
    Value::Array(out)
}

fn rules(rng: &mut Rng, key: &str) -> Value {
    let out: Vec<Value> = (0..rng.below(3))
        .map(|_| {
            let mut rule = serde_json::Map::new();
            if rng.chance(75) {
                let peers: Vec<Value> = (0..1 + rng.below(2)).map(|_| peer(rng)).collect();
                rule.insert(key.into(), Value::Array(peers));
            }
            if rng.chance(60) {
                rule.insert("ports".into(), ports(rng));
            }
            Value::Object(rule)
        })
        .collect();
    Value::Array(out)
}

/// A ClusterNetworkPolicy peer; now and then one this version cannot read
/// (an empty peer, a domain name), which fails closed.
fn tier_peer(rng: &mut Rng, egress: bool) -> Value {
    let n = if egress { 8 } else { 3 };
    match rng.below(n) {
        0 => json!({"namespaces": selector(rng, "team", &["red", "blue"])}),
        1 => json!({"pods": {"namespaceSelector": selector(rng, "team", &["red", "blue"]),
                             "podSelector": selector(rng, "app", &APPS)}}),
        2 if rng.chance(20) => json!({}),
        2 => json!({"pods": {"namespaceSelector": {}, "podSelector": selector(rng, "app", &APPS)}}),
        3 => {
            json!({"networks": [rng.pick(&["10.0.0.0/16", "10.0.1.0/24", "192.0.2.0/24", "0.0.0.0/0"])]})
        }
        4 => json!({"networks": ["10.0.0.10/32", "::/0"]}),
        5 => json!({"nodes": selector(rng, "zone", &["a", "b"])}),
        6 if rng.chance(30) => json!({"domainNames": ["example.com"]}),
        _ => json!({"networks": ["10.9.0.0/24"]}),
    }
}

fn tier_rules(rng: &mut Rng, key: &str) -> Value {
    let out: Vec<Value> = (0..rng.below(4))
        .map(|i| {
            let peers: Vec<Value> = (0..1 + rng.below(2))
                .map(|_| tier_peer(rng, key == "to"))
                .collect();
            let mut rule = json!({
                "name": format!("r{i}"),
                "action": rng.pick(&["Accept", "Deny", "Pass"]),
                key: peers,
            });
            if rng.chance(50) {
                let protocols: Vec<Value> = (0..1 + rng.below(2))
                    .map(|_| match rng.below(5) {
                        0 => json!({"tcp": {"destinationPort": {"number": rng.pick(&[80, 443, 53])}}}),
                        1 => json!({"tcp": {"destinationPort": {"range": {"start": 8000, "end": 8100}}}}),
                        2 => json!({"udp": {"destinationPort": {"number": 53}}}),
                        3 => json!({"sctp": {"destinationPort": {"number": 80}}}),
                        _ => json!({"destinationNamedPort": rng.pick(&["http", "dns"])}),
                    })
                    .collect();
                rule["protocols"] = Value::Array(protocols);
            }
            rule
        })
        .collect();
    Value::Array(out)
}

fn random_cluster_policy(rng: &mut Rng, i: usize) -> ClusterNetworkPolicy {
    let subject = if rng.chance(50) {
        json!({"namespaces": selector(rng, "team", &["red", "blue"])})
    } else {
        json!({"pods": {"namespaceSelector": selector(rng, "team", &["red", "blue"]),
                        "podSelector": selector(rng, "app", &APPS)}})
    };
    let mut spec = json!({
        "tier": rng.pick(&["Admin", "Baseline"]),
        "priority": rng.below(3),
        "subject": subject,
    });
    if rng.chance(70) {
        spec["ingress"] = tier_rules(rng, "from");
    }
    if rng.chance(70) {
        spec["egress"] = tier_rules(rng, "to");
    }
    let annotations = if rng.chance(10) {
        json!({"palisade.io/audit": "true"})
    } else {
        json!({})
    };
    let o: wire::UpstreamClusterNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": wire::UPSTREAM_API_VERSION, "kind": "ClusterNetworkPolicy",
        "metadata": {"name": format!("cnp{i}"), "annotations": annotations},
        "spec": spec,
    }))
    .unwrap();
    ClusterNetworkPolicy::from_upstream(&o)
}

/// The nodes' addresses: n1's is one of the external addresses, so that
/// own-node traffic shows up against external peers.
const NODES: [(&str, &str, &str); 2] = [("n1", "10.9.0.1", "a"), ("n2", "10.0.9.2", "b")];

fn random_cluster(rng: &mut Rng) -> ClusterState {
    let mut objects = Vec::new();
    for ns in &NAMESPACES[..2] {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": ns, "labels": {"team": rng.pick(&["red", "blue"])}}
        }))
        .unwrap();
        objects.push(Object::Namespace(ns));
    }
    for (name, ip, zone) in NODES {
        let node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"zone": zone}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
        }))
        .unwrap();
        objects.push(Object::Node(node));
    }
    for i in 0..4 + rng.below(5) {
        let mut ports = Vec::new();
        if rng.chance(60) {
            ports.push(json!({"name": "http", "containerPort": rng.pick(&[80, 8080])}));
        }
        if rng.chance(30) {
            ports.push(json!({"name": "dns", "containerPort": 53, "protocol": "UDP"}));
        }
        let mut labels = serde_json::Map::new();
        if rng.chance(85) {
            labels.insert("app".into(), json!(rng.pick(&APPS)));
        }
        let (node, node_ip, _) = *rng.pick(&NODES);
        // Now and then a host-network pod: its address is its node's.
        let host = rng.chance(10);
        let ip = if host {
            node_ip.to_string()
        } else {
            format!("10.0.{}.{}", i % 2, 10 + i)
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}"), "namespace": rng.pick(&NAMESPACES), "labels": labels},
            "spec": {"nodeName": node, "hostNetwork": host, "containers": [{"name": "c", "image": "i", "ports": ports}]},
            "status": {"podIP": ip},
        }))
        .unwrap();
        objects.push(Object::Pod(pod));
    }
    for i in 0..1 + rng.below(4) {
        let mut spec = json!({"podSelector": selector(rng, "app", &APPS)});
        if rng.chance(80) {
            spec["ingress"] = rules(rng, "from");
        }
        if rng.chance(60) {
            spec["egress"] = rules(rng, "to");
        }
        if rng.chance(40) {
            spec["policyTypes"] = json!(match rng.below(3) {
                0 => vec!["Ingress"],
                1 => vec!["Egress"],
                _ => vec!["Ingress", "Egress"],
            });
        }
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": format!("np{i}"), "namespace": rng.pick(&NAMESPACES)},
            "spec": spec,
        }))
        .unwrap();
        objects.push(Object::NetworkPolicy(np));
    }
    for i in 0..rng.below(4) {
        objects.push(Object::ClusterNetworkPolicy(random_cluster_policy(rng, i)));
    }
    ClusterState::from_objects(objects, "random".into())
}

fn ip_of(pod: &Pod) -> IpAddr {
    pod.status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()
        .unwrap()
}

/// The tier rules an explanation names (the Pass chain, the deciding rule)
/// exist in the policies they name, in `dir`, with the action named.
fn check_named_tier_rules(cluster: &ClusterState, e: &Explanation, dir: Direction) {
    let decided = match &e.decided {
        Decided::Rule(r) => Some(r),
        _ => None,
    };
    for r in e.passed.iter().chain(decided) {
        let policy = cluster
            .cluster_policies
            .iter()
            .find(|p| p.id() == r.policy)
            .expect("the named cluster policy exists");
        let rules = match dir {
            Direction::Ingress => &policy.ingress,
            Direction::Egress => &policy.egress,
        };
        let rule = &rules[r.rule];
        assert_eq!(
            (r.tier, r.priority, &r.name),
            (policy.tier, policy.priority, &rule.name)
        );
        assert!(
            r.action == rule.action || r.action == Action::Deny,
            "{r:?}: only a fail-closed rule changes its action, to Deny"
        );
    }
    if let Decided::NetworkPolicy(d) = &e.decided {
        check_named_rule(cluster, d, dir);
    }
}

/// The rule `decision` names exists in the policy it names, in `dir`.
fn check_named_rule(cluster: &ClusterState, decision: &Decision, dir: Direction) {
    let Decision::Allowed(rule) = decision else {
        return;
    };
    if rule.policy.starts_with("ClusterNetworkPolicy") || rule.policy.is_empty() {
        return;
    }
    let (ns, name) = rule.policy.split_once('/').unwrap();
    let policy = cluster
        .policies
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        })
        .expect("the named policy exists");
    let spec = policy.spec.as_ref().unwrap();
    let count = match dir {
        Direction::Ingress => spec.ingress.as_ref().map_or(0, Vec::len),
        Direction::Egress => spec.egress.as_ref().map_or(0, Vec::len),
    };
    assert!(rule.rule < count, "{rule:?} is out of the policy's rules");
}

#[test]
fn explain_agrees_with_the_verdict_on_random_clusters() {
    let mut compared = 0usize;
    // Admin/Baseline Accept, Admin/Baseline Deny, NetworkPolicy allowed,
    // NetworkPolicy denied, the default, own node or host network; and
    // answers that passed through a Pass.
    let mut decided = [0usize; 7];
    for seed in 1..=150u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let cluster = random_cluster(&mut rng);
        for src in &cluster.pods {
            for dst in &cluster.pods {
                let (s, d) = (
                    Endpoint {
                        pod: src,
                        ip: ip_of(src),
                    },
                    Endpoint {
                        pod: dst,
                        ip: ip_of(dst),
                    },
                );
                for protocol in PROTOCOLS {
                    for port in PORTS {
                        for mode in [Mode::Standard, Mode::Strict] {
                            let ask = |subject, peer, dir| {
                                let q = Query {
                                    subject,
                                    peer,
                                    server: Some(dst),
                                    protocol,
                                    port,
                                    dir,
                                };
                                explain(&cluster, mode, &q)
                            };
                            let egress = ask(src, Peer::Pod(d), Direction::Egress);
                            let ingress = ask(dst, Peer::Pod(s), Direction::Ingress);
                            check_named_tier_rules(&cluster, &egress, Direction::Egress);
                            check_named_tier_rules(&cluster, &ingress, Direction::Ingress);
                            for e in [&egress, &ingress] {
                                decided[match &e.decided {
                                    Decided::Rule(r) if r.action == Action::Accept => 0,
                                    Decided::Rule(_) => 1,
                                    Decided::NetworkPolicy(d) if d.allowed() => 2,
                                    Decided::NetworkPolicy(_) => 3,
                                    Decided::Default { .. } => 4,
                                    Decided::OwnNode | Decided::HostNetwork => 5,
                                }] += 1;
                                decided[6] += usize::from(!e.passed.is_empty());
                            }
                            assert_eq!(
                                egress.allowed() && ingress.allowed(),
                                allowed_in(&cluster, mode, s, d, protocol, port),
                                "seed {seed} {mode:?}: {protocol}/{port} from {:?} to {:?}: egress {egress:?}, ingress {ingress:?}",
                                src.metadata.name,
                                dst.metadata.name,
                            );
                            if mode == Mode::Standard {
                                // The summary the controller's RPC reads says the same.
                                let summary = explain_direction(
                                    &cluster,
                                    src,
                                    Peer::Pod(d),
                                    Some(dst),
                                    protocol,
                                    port,
                                    Direction::Egress,
                                );
                                check_named_rule(&cluster, &summary, Direction::Egress);
                                assert_eq!(summary.allowed(), egress.allowed());
                                assert_eq!(
                                    egress.allowed() && ingress.allowed(),
                                    allowed(&cluster, s, d, protocol, port)
                                );
                            }
                            compared += 1;
                        }
                    }
                }
            }
        }
    }
    // Each kind of decision must have been exercised, or the comparison
    // proves little.
    assert!(compared > 100_000, "{compared}");
    assert!(decided.iter().all(|n| *n > 1000), "{decided:?}");
}

#[test]
fn an_external_peer_is_allowed_only_by_an_ip_block_or_a_rule_without_peers() {
    let mut checked = [0usize; 2];
    for seed in 1..=100u64 {
        let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
        let cluster = random_cluster(&mut rng);
        for pod in &cluster.pods {
            for ext in EXTERNAL {
                let ip: IpAddr = ext.parse().unwrap();
                for port in PORTS {
                    let d = explain_direction(
                        &cluster,
                        pod,
                        Peer::External(ip),
                        Some(pod),
                        "TCP",
                        port,
                        Direction::Ingress,
                    );
                    check_named_rule(&cluster, &d, Direction::Ingress);
                    let Decision::Allowed(rule) = &d else {
                        checked[1] += 1;
                        continue;
                    };
                    // A ClusterNetworkPolicy's Accept, or the pod's own node
                    // (n1's address is external here): no NetworkPolicy rule.
                    if rule.policy.starts_with("ClusterNetworkPolicy") || rule.policy.is_empty() {
                        continue;
                    }
                    checked[0] += 1;
                    let (ns, name) = rule.policy.split_once('/').unwrap();
                    let np = cluster
                        .policies
                        .iter()
                        .find(|p| {
                            p.metadata.namespace.as_deref() == Some(ns)
                                && p.metadata.name.as_deref() == Some(name)
                        })
                        .unwrap();
                    let r = &np.spec.as_ref().unwrap().ingress.as_ref().unwrap()[rule.rule];
                    let open = match r.from.as_ref().filter(|f| !f.is_empty()) {
                        None => true,
                        Some(from) => from.iter().any(|p| {
                            p.ip_block.as_ref().is_some_and(|b| {
                                let inside =
                                    |c: &str| c.parse::<ipnet::IpNet>().unwrap().contains(&ip);
                                inside(&b.cidr) && !b.except.iter().flatten().any(|e| inside(e))
                            })
                        }),
                    };
                    assert!(open, "seed {seed}: {ext} allowed by {rule:?}");
                }
            }
        }
    }
    assert!(checked.iter().all(|n| *n > 100), "{checked:?}");
}

#[test]
fn the_engines_copy_of_the_cluster_judges_as_the_objects_do() {
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let cluster = random_cluster(&mut rng);
        let (engine, _) = Engine::from_state(&cluster);
        let copy = engine.cluster_view("m".into());
        assert_eq!(copy.marker, "m");
        assert_eq!(copy.policies, cluster.policies);
        assert_eq!(copy.pods.len(), cluster.pods.len());
        for (a, b) in copy.pods.iter().zip(&cluster.pods) {
            for (x, y) in copy.pods.iter().zip(&cluster.pods) {
                for protocol in PROTOCOLS {
                    for port in PORTS {
                        let (ia, ix) = (ip_of_any(a), ip_of_any(x));
                        assert_eq!(
                            allowed(
                                &copy,
                                Endpoint { pod: a, ip: ia },
                                Endpoint { pod: x, ip: ix },
                                protocol,
                                port
                            ),
                            allowed(
                                &cluster,
                                Endpoint { pod: b, ip: ia },
                                Endpoint { pod: y, ip: ix },
                                protocol,
                                port
                            ),
                            "seed {seed}: {protocol}/{port} {:?} -> {:?}",
                            a.metadata.name,
                            x.metadata.name
                        );
                    }
                }
            }
        }
    }
}

fn ip_of_any(pod: &Pod) -> IpAddr {
    pod.status.as_ref().unwrap().pod_ips.as_ref().unwrap()[0]
        .ip
        .parse()
        .unwrap()
}

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: prod, labels: {team: red}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: prod, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.1.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: prod, labels: {app: client}}
spec: {nodeName: n2, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.2}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: prod}
spec: {clusterIP: 10.96.0.10, selector: {app: web}, ports: [{port: 80, targetPort: http}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: 192.0.2.0/24}}]
    ports: [{port: 22}]
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: prod}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {team: red}}}]
"#;

const DEADLINE: Duration = Duration::from_secs(20);

async fn start(dir: &Path, socket: &Address) {
    start_with(dir, socket, MANIFESTS).await
}

async fn start_with(dir: &Path, socket: &Address, manifests: &str) {
    std::fs::write(dir.join("all.yaml"), manifests).unwrap();
    let hub = Hub::new(1000);
    let (tx, rx) = watch::channel(None);
    let (etx, erx) = watch::channel(Vec::new());
    tokio::spawn(manifest::run_with_interval(
        dir.to_path_buf(),
        Duration::from_millis(10),
        tx,
        etx,
    ));
    tokio::spawn(feed::run(hub.clone(), rx, erx));
    let router = server::router(hub).await.unwrap();
    let addr = socket.clone();
    tokio::spawn(async move { serve(router, &addr, std::future::pending()).await.unwrap() });
}

/// A client of the controller serving on `socket`, and its answer to
/// `first` once it has one: the server binds, and the source reads the
/// manifests, on their own schedules.
async fn explain_when_ready(
    socket: &Address,
    first: ExplainRequest,
) -> (
    DebugServiceClient<tonic::transport::Channel>,
    ExplainResponse,
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut client = loop {
        if let Ok(c) = connect(socket, Duration::from_secs(1)).await {
            break DebugServiceClient::new(c);
        }
        assert!(tokio::time::Instant::now() < deadline, "no server");
        tokio::time::sleep(Duration::from_millis(20)).await; // poll: the server binds asynchronously
    };
    loop {
        match client.explain(first.clone()).await {
            Ok(r) => return (client, r.into_inner()),
            Err(s) if s.code() == Code::Unavailable || s.code() == Code::NotFound => {
                assert!(tokio::time::Instant::now() < deadline, "{s}");
                tokio::time::sleep(Duration::from_millis(20)).await; // poll: the source scans every 10 ms
            }
            Err(s) => panic!("{s}"),
        }
    }
}

fn req(source: &str, destination: &str, port: u32, protocol: &str) -> ExplainRequest {
    ExplainRequest {
        source: source.into(),
        destination: destination.into(),
        port,
        protocol: protocol.into(),
        mode: String::new(),
    }
}

/// MANIFESTS without the NetworkPolicies, with an Admin tier that passes
/// client's egress on to a Baseline tier that denies it on TCP/8080.
const TIERED: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: prod, labels: {team: red}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: prod, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.1.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: prod, labels: {app: client}}
spec: {nodeName: n2, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.2}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: platform}
spec:
  tier: Admin
  priority: 7
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}
  egress:
  - {name: to-namespace-owners, action: Pass, to: [{namespaces: {matchLabels: {team: red}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: defaults}
spec:
  tier: Baseline
  priority: 3
  subject: {namespaces: {}}
  egress:
  - {name: no-web, action: Deny, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}}], protocols: [{tcp: {destinationPort: {number: 8080}}}]}
"#;

#[tokio::test]
async fn the_explain_rpc_names_the_tier_rule_and_the_pass_chain() {
    let manifests = tempfile::tempdir().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(sock_dir.path().join("controller.sock"));
    start_with(manifests.path(), &socket, TIERED).await;
    let (mut client, r) =
        explain_when_ready(&socket, req("prod/client", "prod/web", 8080, "")).await;
    assert!(!r.allowed, "{r:?}");
    let egress = r.egress.unwrap();
    assert_eq!(
        (
            egress.reason.as_str(),
            egress.policy.as_str(),
            egress.tier.as_str(),
            egress.priority,
            egress.rule_name.as_str(),
            egress.rule_index
        ),
        (
            "denied by a Baseline tier rule",
            "ClusterNetworkPolicy/defaults",
            "Baseline",
            3,
            "no-web",
            0
        )
    );
    assert_eq!(egress.passed.len(), 1, "{egress:?}");
    assert!(
        egress.passed[0].starts_with("Admin tier, ClusterNetworkPolicy/platform (priority 7)"),
        "{egress:?}"
    );
    // Another port: nothing decides; standard mode allows, strict denies.
    let r = client
        .explain(req("prod/client", "prod/web", 80, ""))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed);
    let egress = r.egress.unwrap();
    assert_eq!(egress.reason, "no tier decides and no NetworkPolicy isolates this pod: the default (standard mode: allowed)");
    assert_eq!(egress.passed.len(), 1, "the Pass still shows");
    let mut strict = req("prod/client", "prod/web", 80, "");
    strict.mode = "strict".into();
    let r = client.explain(strict).await.unwrap().into_inner();
    assert!(!r.allowed);
    let mut bad = req("prod/client", "prod/web", 80, "");
    bad.mode = "lenient".into();
    let status = client.explain(bad).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("mode \"lenient\""), "{status}");
}

#[tokio::test]
async fn the_explain_rpc_names_the_deciding_policy_and_rule() {
    let manifests = tempfile::tempdir().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(sock_dir.path().join("controller.sock"));
    start(manifests.path(), &socket).await;
    let (mut client, first) =
        explain_when_ready(&socket, req("prod/client", "prod/web", 8080, "")).await;
    assert!(first.allowed, "{first:?}");
    assert_eq!(first.source, "pod prod/client (10.1.0.2)");
    assert_eq!(first.destination, "pod prod/web (10.1.0.1)");
    let egress = first.egress.unwrap();
    assert_eq!(
        (
            egress.pod.as_str(),
            egress.policy.as_str(),
            egress.rule_index
        ),
        ("prod/client", "prod/client-egress", 0)
    );
    assert_eq!(
        egress.rule,
        "egress[0]: to all pods in namespaces{team=red} on any port"
    );
    let ingress = first.ingress.unwrap();
    assert_eq!(
        (
            ingress.policy.as_str(),
            ingress.rule_index,
            ingress.reason.as_str()
        ),
        ("prod/web-ingress", 1, "allowed by rule")
    );
    assert_eq!(
        ingress.rule,
        "ingress[1]: from pods{app=client} in the policy's namespace on TCP/http"
    );

    // The named port means 8080 on web, so 80 is denied on ingress only.
    let r = client
        .explain(req("10.1.0.2", "prod/web", 80, "tcp"))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.allowed);
    assert!(r.egress.unwrap().allowed);
    let ingress = r.ingress.unwrap();
    assert_eq!(
        (
            ingress.allowed,
            ingress.reason.as_str(),
            ingress.isolated_by
        ),
        (
            false,
            "isolated, no rule allows",
            vec!["prod/web-ingress".to_string()]
        )
    );

    // An external source: no egress of its own; the ipBlock rule decides.
    let r = client
        .explain(req("192.0.2.9", "prod/web", 22, "TCP"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed && r.egress.is_none(), "{r:?}");
    assert_eq!(r.source, "external 192.0.2.9");
    assert_eq!(r.ingress.unwrap().rule_index, 0);

    // web has no egress policy: nothing isolates it; the external
    // destination has no ingress to judge.
    let r = client
        .explain(req("prod/web", "203.0.113.1", 443, "UDP"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed && r.ingress.is_none());
    assert_eq!(r.egress.unwrap().reason, "no policy isolates this pod");
    // client's egress reaches only namespaces labelled team=red.
    let r = client
        .explain(req("prod/client", "203.0.113.1", 443, "TCP"))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.allowed);

    for (request, code, text) in [
        (
            req("prod/nope", "prod/web", 80, ""),
            Code::NotFound,
            "source prod/nope: no such pod",
        ),
        (
            req("prod/web", "10.96.0.10", 80, ""),
            Code::InvalidArgument,
            "ClusterIP of Service prod/web",
        ),
        (
            req("prod/web", "prod/client", 80, "ICMP"),
            Code::InvalidArgument,
            "protocol \"ICMP\"",
        ),
        (
            req("prod/web", "prod/client", 0, ""),
            Code::InvalidArgument,
            "port 0",
        ),
        (
            req("web", "prod/client", 80, ""),
            Code::InvalidArgument,
            "expected namespace/name of a pod, or an IP address",
        ),
        (
            req("192.0.2.1", "192.0.2.2", 80, ""),
            Code::InvalidArgument,
            "neither source nor destination is a pod",
        ),
    ] {
        let status = client.explain(request.clone()).await.expect_err("refused");
        assert_eq!(status.code(), code, "{request:?}: {status}");
        assert!(status.message().contains(text), "{request:?}: {status}");
    }
}

/// TIERED's pods, with an Admin Accept by name above a Deny of the rest.
const BY_NAME: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: prod, labels: {team: red}}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: prod, labels: {app: client}}
spec: {nodeName: n2, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.2}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: egress-by-name}
spec:
  tier: Admin
  priority: 4
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}
  egress:
  - {name: api, action: Accept, to: [{domainNames: ["*.example.com"]}], protocols: [{tcp: {destinationPort: {number: 443}}}]}
  - {name: rest, action: Deny, to: [{networks: ["0.0.0.0/0"]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: prod, labels: {app: app}}
spec: {nodeName: n2, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.3}
---
apiVersion: networking.k8s.aws/v1alpha1
kind: ApplicationNetworkPolicy
metadata: {name: app-egress, namespace: prod}
spec:
  podSelector: {matchLabels: {app: app}}
  policyTypes: [Egress]
  egress:
  - {to: [{domainNames: [api.example.com]}], ports: [{port: 443}]}
"#;

#[tokio::test]
async fn the_explain_rpc_lists_the_accepts_by_name_it_cannot_judge() {
    let manifests = tempfile::tempdir().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(sock_dir.path().join("controller.sock"));
    start_with(manifests.path(), &socket, BY_NAME).await;
    let (mut client, r) =
        explain_when_ready(&socket, req("prod/client", "203.0.113.7", 443, "TCP")).await;
    assert!(!r.allowed, "{r:?}");
    let egress = r.egress.unwrap();
    assert_eq!(egress.rule_name, "rest");
    assert_eq!(egress.by_name.len(), 1, "{egress:?}");
    assert!(
        egress.by_name[0]
            .starts_with("Admin tier, ClusterNetworkPolicy/egress-by-name (priority 4)"),
        "{egress:?}"
    );
    assert!(egress.by_name[0].contains("*.example.com"), "{egress:?}");
    // On a port the rule by name does not take: nothing to list.
    let r = client
        .explain(req("prod/client", "203.0.113.7", 80, "TCP"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.egress.unwrap().by_name.is_empty());
    // An ApplicationNetworkPolicy's rule by name, in the NetworkPolicy
    // tier that denied.
    let r = client
        .explain(req("prod/app", "203.0.113.7", 443, "TCP"))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.allowed, "{r:?}");
    assert_eq!(
        r.egress.unwrap().by_name,
        ["NetworkPolicy tier, prod/ApplicationNetworkPolicy:app-egress: egress[0]: to domainNames api.example.com on TCP/443"]
    );
}
