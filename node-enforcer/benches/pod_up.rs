//! The reconciler's own cost of a pod-up on a node that already has N pods
//! (in-memory datapath, so only the enforcer's bookkeeping is measured; the
//! real attach is a few bpf syscalls on top). Prints a table and
//! `bench=reconciler_pod_up pods= p50_us= p99_us=` lines.
//! `cargo bench -p node-enforcer --bench pod_up [-- N ...]`.

use std::time::Instant;

use node_enforcer::datapath::fake::FakeDatapath;
use node_enforcer::desired::PodRuntime;
use node_enforcer::reconciler::{PlanMessage, PodUp, Reconciler};
use palisade_proto::v1::{
    DirectionPolicy, IpPrefix, PeerBlock, PlanSnapshot, PodPolicy, PodRef, PortRange, Rule,
};

fn policy(i: usize) -> PodPolicy {
    // Ten distinct policies, shared by content as replicas' are.
    let rule = Rule {
        peers: vec![PeerBlock {
            cidr: Some(IpPrefix {
                addr: vec![10, (i % 10) as u8, 0, 0],
                prefix_len: 16,
            }),
            except: vec![],
        }],
        ports: vec![PortRange {
            protocol: 6,
            port: 80,
            end_port: 0,
        }],
        ..Default::default()
    };
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: format!("p{i}"),
        }),
        pod_ips: vec![IpPrefix {
            addr: vec![10, 244, (i / 250) as u8, (i % 250) as u8 + 1],
            prefix_len: 32,
        }],
        ingress: Some(DirectionPolicy {
            rules: vec![rule],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn up(i: usize) -> PodUp {
    PodUp {
        pod: ("x".into(), format!("p{i}")),
        runtime: PodRuntime {
            container_id: format!("c{i}"),
            netns: String::new(),
            host_interfaces: vec![format!("veth{i}")],
            ips: vec![],
            ifindexes: Default::default(),
            mode: None,
        },
    }
}

fn run(n: usize) -> (f64, f64) {
    let names: Vec<String> = (0..n).map(|i| format!("veth{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut r = Reconciler::new("n".into(), "e".into(), FakeDatapath::with_interfaces(&refs));
    r.apply_plan(PlanMessage::Snapshot(PlanSnapshot {
        term: 0,
        version: 1,
        pods: (0..n).map(policy).collect(),
        source_synced: true,
        ..Default::default()
    }))
    .unwrap();
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let t = Instant::now();
        r.pod_up(up(i), tx);
        took.push(t.elapsed().as_secs_f64() * 1e6);
        rx.try_recv().expect("answered").expect("up");
    }
    // The last quarter: pod-ups on a node that is already full.
    let mut tail: Vec<f64> = took[n * 3 / 4..].to_vec();
    tail.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (tail[tail.len() / 2], tail[tail.len() * 99 / 100])
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100, 1000]
    } else {
        sizes
    };
    println!("{:>6} {:>10} {:>10}", "pods", "p50_us", "p99_us");
    let mut lines = Vec::new();
    for n in sizes {
        let (p50, p99) = run(n);
        println!("{n:>6} {p50:>10.1} {p99:>10.1}");
        lines.push(format!(
            "bench=reconciler_pod_up pods={n} p50_us={p50:.1} p99_us={p99:.1}"
        ));
    }
    for l in lines {
        println!("{l}");
    }
}
