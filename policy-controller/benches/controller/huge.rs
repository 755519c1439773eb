//! One NetworkPolicy of 100,000 ingress rules (one /32 peer each in
//! 172.16.0.0/16, TCP 80) selecting one pod, beside a small cluster: from
//! the policy's arrival at the hub to every node's plan computed and
//! encoded (issue 18).

use std::time::Instant;

use policy_controller::engine::Change;
use prost::Message;
use serde_json::json;

use crate::shapes::{self, Shape};

/// The rules of the policy.
pub const RULES: usize = 100_000;

/// The policy: rule `i` allows 172.16.(i/256).(i%256)/32 on TCP 80.
pub fn policy(ns: &str, rules: usize) -> k8s_openapi::api::networking::v1::NetworkPolicy {
    let ingress: Vec<serde_json::Value> = (0..rules)
        .map(|i| {
            json!({
                "from": [{"ipBlock": {"cidr": format!("172.16.{}.{}/32", (i >> 8) & 0xff, i & 0xff)}}],
                "ports": [{"protocol": "TCP", "port": 80}],
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "huge", "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app-1": "scale-1"}}, "ingress": ingress},
    }))
    .unwrap()
}

pub fn run(rules: usize) {
    let scale = shapes::Scale {
        name: "huge",
        namespaces: 10,
        nodes: 4,
    };
    let hub = policy_controller::hub::Hub::new(1);
    let objects: Vec<Change> = (0..scale.namespaces)
        .flat_map(|i| shapes::namespace_objects(Shape::Antrea, scale, i, false))
        .map(Change::from)
        .collect();
    hub.stage(objects);
    hub.apply(Vec::new(), "bench".into());
    let p = policy(&shapes::ns_name(0), rules);
    let (start, cpu) = (Instant::now(), crate::cpu_ms());
    let published = hub.apply(vec![Change::ApplyPolicy(p)], "huge".into());
    let bytes: usize = published
        .iter()
        .map(|c| c.after.snapshot().encoded_len())
        .sum();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let cpu = crate::cpu_ms() - cpu;
    crate::line(
        scale.name,
        Shape::Antrea,
        "huge_policy",
        &[
            ("ms", format!("{ms:.0}")),
            ("peak_mb", format!("{:.0}", crate::peak_mb())),
            ("nodes_reached", published.len().to_string()),
            ("delta_bytes", bytes.to_string()),
            ("cpu_ms", format!("{cpu:.0}")),
            ("rules", rules.to_string()),
        ],
    );
}
