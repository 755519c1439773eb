//! Random clusters, every pod-to-pod connection: the controller's resolution
//! followed by the enforcer's table compilation must give exactly the verdict
//! of the reference model (`policy_controller::model`), which reads the
//! NetworkPolicy objects directly.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::Pod;
use node_enforcer::compile::compile;
use palisade_proto::v1::PodPolicy;
use policy_controller::cluster::{ClusterState, Object};
use policy_controller::model::{allowed, Endpoint};
use policy_controller::resolve::resolve_cluster;
use serde_json::{json, Value};

/// xorshift64*: deterministic, so a failure names a seed that reproduces it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const APPS: [&str; 3] = ["a", "b", "c"];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const PORTS: [u16; 4] = [80, 81, 443, 8080];

fn selector(rng: &mut Rng, key: &str, values: &[&str]) -> Value {
    match rng.below(4) {
        0 => json!({}),
        1 => json!({"matchLabels": {key: rng.pick(values)}}),
        2 => {
            let op = *rng.pick(&["In", "NotIn", "Exists", "DoesNotExist"]);
            let mut expr = json!({"key": key, "operator": op});
            if op == "In" || op == "NotIn" {
                expr["values"] = json!([rng.pick(values), rng.pick(values)]);
            }
            json!({"matchExpressions": [expr]})
        }
        _ => json!({"matchLabels": {key: rng.pick(values), "tier": rng.pick(&["web", "db"])}}),
    }
}

fn peer(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => {
            let cidr = *rng.pick(&[
                "10.0.0.0/24",
                "10.0.0.0/25",
                "10.0.0.0/26",
                "0.0.0.0/0",
                "10.0.0.8/29",
            ]);
            let mut block = json!({"cidr": cidr});
            if rng.chance(50) {
                let net: ipnet::Ipv4Net = cidr.parse().unwrap();
                let len = (net.prefix_len() + 1 + rng.below(4) as u8).min(32);
                let offset = (rng.below(16) as u32) << (32 - len.max(28));
                let base = u32::from(net.network())
                    + (offset & !(u32::MAX >> net.prefix_len().max(1)).wrapping_neg());
                let except = ipnet::Ipv4Net::new(Ipv4Addr::from(base), len)
                    .unwrap()
                    .trunc();
                if net.contains(&except) {
                    block["except"] = json!([except.to_string()]);
                }
            }
            json!({"ipBlock": block})
        }
        1 => json!({"podSelector": selector(rng, "app", &APPS)}),
        2 => json!({"namespaceSelector": selector(rng, "team", &["red", "blue"])}),
        _ => json!({
            "namespaceSelector": selector(rng, "team", &["red", "blue"]),
            "podSelector": selector(rng, "app", &APPS),
        }),
    }
}

fn port(rng: &mut Rng) -> Value {
    let protocol = *rng.pick(&PROTOCOLS);
    match rng.below(4) {
        0 => json!({"protocol": protocol}),
        1 => json!({"protocol": protocol, "port": rng.pick(&PORTS)}),
        2 => json!({"protocol": protocol, "port": 80, "endPort": *rng.pick(&[81u16, 443, 8080])}),
        _ => json!({"protocol": protocol, "port": rng.pick(&["http", "alt"])}),
    }
}

fn rules(rng: &mut Rng, key: &str) -> Value {
    let n = rng.below(3);
    let mut out = Vec::new();
    for _ in 0..n {
        let mut rule = json!({});
        if rng.chance(75) {
            rule[key] = Value::Array((0..rng.below(3)).map(|_| peer(rng)).collect());
        }
        if rng.chance(60) {
            rule["ports"] = Value::Array((0..rng.below(3)).map(|_| port(rng)).collect());
        }
        out.push(rule);
    }
    Value::Array(out)
}

fn cluster(seed: u64) -> ClusterState {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut objects = Vec::new();
    for (i, ns) in NAMESPACES.iter().enumerate() {
        let team = if i % 2 == 0 { "red" } else { "blue" };
        objects.push(Object::Namespace(
            serde_json::from_value(json!({"metadata": {"name": ns, "labels": {"team": team}}}))
                .unwrap(),
        ));
    }
    let pods = 3 + rng.below(5);
    for i in 0..pods {
        let ns = *rng.pick(&NAMESPACES);
        let mut ports = vec![];
        if rng.chance(60) {
            ports.push(json!({"name": "http", "containerPort": rng.pick(&PORTS), "protocol": rng.pick(&PROTOCOLS)}));
        }
        if rng.chance(40) {
            ports.push(json!({"name": "alt", "containerPort": rng.pick(&PORTS)}));
        }
        objects.push(Object::Pod(
            serde_json::from_value(json!({
                "metadata": {"name": format!("p{i}"), "namespace": ns,
                             "labels": {"app": rng.pick(&APPS), "tier": rng.pick(&["web", "db"])}},
                "spec": {"nodeName": format!("n{}", i % 2), "containers": [{"name": "c", "ports": ports}]},
                "status": {"podIP": format!("10.0.0.{}", 1 + i * 9)}
            }))
            .unwrap(),
        ));
    }
    for i in 0..rng.below(5) {
        let mut spec = json!({"podSelector": selector(&mut rng, "app", &APPS)});
        match rng.below(4) {
            0 => {}
            1 => spec["policyTypes"] = json!(["Ingress"]),
            2 => spec["policyTypes"] = json!(["Egress"]),
            _ => spec["policyTypes"] = json!(["Ingress", "Egress"]),
        }
        if rng.chance(70) {
            spec["ingress"] = rules(&mut rng, "from");
        }
        if rng.chance(60) {
            spec["egress"] = rules(&mut rng, "to");
        }
        objects.push(Object::NetworkPolicy(
            serde_json::from_value(json!({
                "metadata": {"name": format!("np{i}"), "namespace": rng.pick(&NAMESPACES)},
                "spec": spec
            }))
            .unwrap(),
        ));
    }
    ClusterState::from_objects(objects, String::new())
}

fn proto_number(p: &str) -> u8 {
    match p {
        "TCP" => 6,
        "UDP" => 17,
        _ => 132,
    }
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

#[test]
fn resolution_and_compilation_agree_with_the_model() {
    let mut checked = 0usize;
    let mut allowed_count = 0usize;
    // How often the generator exercised each feature, so it cannot quietly
    // stop covering one.
    let mut features: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in 0..1000u64 {
        let c = cluster(seed);
        let text = serde_json::to_string(&c.policies).unwrap();
        for f in [
            "except",
            "endPort",
            "\"http\"",
            "namespaceSelector",
            "NotIn",
            "DoesNotExist",
            "SCTP",
            "Egress",
        ] {
            *features.entry(f).or_default() += usize::from(text.contains(f));
        }
        let resolution = resolve_cluster(&c);
        assert!(
            resolution.errors.is_empty(),
            "seed {seed}: {:?}",
            resolution.errors
        );
        let plan_of = |pod: &Pod| -> Option<PodPolicy> {
            let node = pod.spec.as_ref()?.node_name.clone()?;
            let key = (
                pod.metadata.namespace.clone().unwrap(),
                pod.metadata.name.clone().unwrap(),
            );
            resolution
                .plans
                .get(&node)?
                .pods
                .get(&key)
                .map(|p| (**p).clone())
        };
        let mut compiled: BTreeMap<String, (Option<_>, Option<_>)> = BTreeMap::new();
        for pod in &c.pods {
            let plan = plan_of(pod);
            let comp = |d: Option<&palisade_proto::v1::DirectionPolicy>| {
                d.map(|d| compile(d, &[]).expect("compiles"))
            };
            compiled.insert(
                pod.metadata.name.clone().unwrap(),
                (
                    comp(plan.as_ref().and_then(|p| p.ingress.as_ref())),
                    comp(plan.as_ref().and_then(|p| p.egress.as_ref())),
                ),
            );
        }
        for src in &c.pods {
            for dst in &c.pods {
                if std::ptr::eq(src, dst) {
                    continue;
                }
                let (s_ip, d_ip) = (ip_of(src), ip_of(dst));
                let (_, s_egress) = &compiled[src.metadata.name.as_ref().unwrap()];
                let (d_ingress, _) = &compiled[dst.metadata.name.as_ref().unwrap()];
                for proto in PROTOCOLS {
                    for port in PORTS.iter().copied().chain([82, 9090]) {
                        let p = proto_number(proto);
                        let pipeline = s_egress.as_ref().is_none_or(|t| t.allows(d_ip, p, port))
                            && d_ingress.as_ref().is_none_or(|t| t.allows(s_ip, p, port));
                        let model = allowed(
                            &c,
                            Endpoint { pod: src, ip: s_ip },
                            Endpoint { pod: dst, ip: d_ip },
                            proto,
                            port,
                        );
                        assert_eq!(
                            pipeline,
                            model,
                            "seed {seed}: {}/{} -> {}/{} {proto}/{port}\npolicies: {}",
                            src.metadata.namespace.as_ref().unwrap(),
                            src.metadata.name.as_ref().unwrap(),
                            dst.metadata.namespace.as_ref().unwrap(),
                            dst.metadata.name.as_ref().unwrap(),
                            serde_json::to_string_pretty(&c.policies).unwrap()
                        );
                        checked += 1;
                        allowed_count += usize::from(model);
                    }
                }
            }
        }
    }
    eprintln!("{checked} connections checked, {allowed_count} allowed; feature use: {features:?}");
    for (f, n) in &features {
        assert!(*n >= 20, "only {n} clusters used {f}: {features:?}");
    }
    // Guard against a generator that only ever produces one answer.
    assert!(checked > 50_000, "{checked}");
    assert!(
        allowed_count > checked / 10 && allowed_count < checked * 9 / 10,
        "{allowed_count} of {checked} allowed"
    );
}
