//! The real palisade-controller binary with `--metrics-addr`, scraped with
//! a real HTTP client: the exposition parses, and its values follow what
//! happens — a node's plan version appears when the manifests put a pod
//! there, its realized version and the policy's realized count once the
//! node reports, the lag when the plan moves on, and resolution passes are
//! counted.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use palisade_proto::v1::{
    plan_service_client::PlanServiceClient, subscribe_response::Update, NodeState,
    ReportStateRequest, SubscribeRequest,
};
use palisade_runtime::transport::{connect, Address};
use palisade_test_support::metrics::scrape;
use tokio::io::{AsyncBufReadExt, BufReader};

const DEADLINE: Duration = Duration::from_secs(30);

fn manifests(cidr: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: prod, labels: {{app: web}}}}
spec: {{nodeName: n1, containers: [{{name: c, image: i}}]}}
status: {{podIP: 10.1.0.1}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: deny, namespace: prod}}
spec:
  podSelector: {{matchLabels: {{app: web}}}}
  ingress: [{{from: [{{ipBlock: {{cidr: {cidr}}}}}]}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {{name: platform}}
spec:
  tier: Admin
  priority: 1
  subject: {{namespaces: {{}}}}
  egress: [{{action: Deny, to: [{{networks: [169.254.169.254/32]}}]}}]
"#
    )
}

fn write(dir: &Path, text: &str) {
    let tmp = dir.join(".all.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join("all.yaml")).unwrap();
}

/// Kills the controller however the test ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Drops terminal colour sequences, which the log may hold.
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

async fn scrape_until(
    addr: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let m = scrape(addr).await;
        if done(&m) {
            return m;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {m:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await; // poll: the source scans on its own schedule
    }
}

#[tokio::test]
async fn metrics_follow_plans_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &manifests("192.0.2.0/24"));
    let sock = dir.path().join("controller.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-controller"))
        .arg("--manifests")
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _process = Process(child);
    // The bound port is in the log line that says metrics are served; the
    // plan service is reachable once the line that says it serves is out
    // (it is bound before that line).
    let mut lines = BufReader::new(tokio::process::ChildStderr::from_std(stderr).unwrap()).lines();
    let addr = tokio::time::timeout(DEADLINE, async {
        let mut metrics = None;
        while let Some(line) = lines.next_line().await.unwrap() {
            let line = strip_ansi(&line);
            if let Some(rest) = line.split("metrics_addr=").nth(1) {
                metrics = Some(rest.split_whitespace().next().unwrap().to_string());
            }
            if line.contains("serving") && line.contains("listen=unix:") {
                return metrics.expect("metrics are served before plans");
            }
        }
        panic!("the controller exited without serving metrics and plans");
    })
    .await
    .expect("metrics and plans served in time");
    // Keep draining the log so the controller never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let m = scrape_until(&addr, "synced with n1's plan", |m| {
        m.get("palisade_controller_source_synced") == Some(&1.0)
            && m.contains_key("palisade_controller_node_plan_version{node=\"n1\"}")
    })
    .await;
    let version = m["palisade_controller_node_plan_version{node=\"n1\"}"];
    assert!(version > 0.0);
    assert_eq!(
        m["palisade_controller_node_realized_version{node=\"n1\"}"],
        0.0
    );
    assert_eq!(
        m["palisade_controller_policy_expected_nodes{policy=\"prod/deny\"}"],
        1.0
    );
    assert_eq!(
        m["palisade_controller_policy_realized_nodes{policy=\"prod/deny\"}"],
        0.0
    );
    assert_eq!(m["palisade_controller_nodes_connected"], 0.0);
    let tiered = |tier: &str, group: &str| {
        m[&format!(
            "palisade_controller_cluster_network_policies{{tier=\"{tier}\",group=\"{group}\"}}"
        )]
    };
    assert_eq!(tiered("Admin", "policy.networking.k8s.io"), 1.0);
    assert_eq!(tiered("Baseline", "policy.networking.k8s.io"), 0.0);
    assert_eq!(tiered("Admin", "networking.k8s.aws"), 0.0);
    assert_eq!(
        m["palisade_controller_policy_expected_nodes{policy=\"ClusterNetworkPolicy/platform\"}"],
        1.0
    );
    // No mutual TLS here, so nothing is refused; the counting itself is
    // tests/mtls.rs's, through the same counters.
    for reason in ["unauthenticated", "wrong_node", "not_permitted"] {
        assert_eq!(
            m[&format!("palisade_controller_refused_calls_total{{reason=\"{reason}\"}}")],
            0.0
        );
    }
    assert!(m["palisade_controller_resolve_duration_seconds_count"] >= 1.0);
    assert_eq!(
        m["palisade_controller_resolve_duration_seconds_bucket{le=\"+Inf\"}"],
        m["palisade_controller_resolve_duration_seconds_count"]
    );

    // n1 subscribes and reports its plan realized.
    let address = Address::Unix(sock.clone());
    let channel = connect(&address, Duration::from_secs(5)).await.unwrap();
    let mut plans = PlanServiceClient::new(channel);
    let mut stream = plans
        .subscribe(SubscribeRequest {
            node_name: "n1".into(),
            enforcer_id: "n1-e".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let Some(Update::Snapshot(snapshot)) = stream.message().await.unwrap().unwrap().update else {
        panic!("no snapshot first");
    };
    assert_eq!(snapshot.version as f64, version);
    plans
        .report_state(ReportStateRequest {
            state: Some(NodeState {
                node_name: "n1".into(),
                enforcer_id: "n1-e".into(),
                realized_version: snapshot.version,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let m = scrape_until(&addr, "n1 realized", |m| {
        m.get("palisade_controller_node_realized_version{node=\"n1\"}") == Some(&version)
    })
    .await;
    assert_eq!(m["palisade_controller_nodes_connected"], 1.0);
    assert_eq!(m["palisade_controller_node_connected{node=\"n1\"}"], 1.0);
    assert_eq!(
        m["palisade_controller_node_realization_lag_versions{node=\"n1\"}"],
        0.0
    );
    assert_eq!(
        m["palisade_controller_policy_realized_nodes{policy=\"prod/deny\"}"],
        1.0
    );
    // prod/deny and the ClusterNetworkPolicy, both on n1.
    assert_eq!(m["palisade_controller_policies_realized"], 2.0);
    let passes = m["palisade_controller_resolve_duration_seconds_count"];

    // A policy edit moves n1's plan on: one version behind until it reports.
    write(dir.path(), &manifests("198.51.100.0/24"));
    let m = scrape_until(&addr, "n1's plan moved on", |m| {
        m.get("palisade_controller_node_plan_version{node=\"n1\"}") == Some(&(version + 1.0))
    })
    .await;
    assert_eq!(
        m["palisade_controller_node_realization_lag_versions{node=\"n1\"}"],
        1.0
    );
    assert_eq!(m["palisade_controller_node_realized{node=\"n1\"}"], 0.0);
    assert_eq!(
        m["palisade_controller_policy_realized_nodes{policy=\"prod/deny\"}"],
        0.0
    );
    assert!(m["palisade_controller_resolve_duration_seconds_count"] > passes);
    assert_eq!(m["palisade_controller_errors"], 0.0);
    // Counted by kind, every kind shown (at zero while there is none).
    let kinds = |m: &BTreeMap<String, f64>| -> Vec<(String, f64)> {
        m.iter()
            .filter_map(|(k, v)| {
                let kind = k.strip_prefix("palisade_controller_source_errors{kind=\"")?;
                Some((kind.strip_suffix("\"}")?.to_string(), *v))
            })
            .collect()
    };
    let all = kinds(&m);
    assert_eq!(all.len(), 7, "{all:?}");
    assert!(all.iter().all(|(_, n)| *n == 0.0), "{all:?}");

    // Issue 18: an edit with a misspelt field ("fromm") is refused, named,
    // counted, and the previous policy stays: the plan does not move.
    let typo = manifests("198.51.100.0/24").replace("ingress: [{from:", "ingress: [{fromm:");
    assert_ne!(typo, manifests("198.51.100.0/24"));
    write(dir.path(), &typo);
    let m = scrape_until(&addr, "the typo is counted", |m| {
        m.get("palisade_controller_source_errors{kind=\"invalid\"}") == Some(&1.0)
    })
    .await;
    assert_eq!(m["palisade_controller_errors"], 1.0);
    assert_eq!(
        m["palisade_controller_node_plan_version{node=\"n1\"}"],
        version + 1.0,
        "the previous plan stays"
    );
    let state = palisade_proto::v1::debug_service_client::DebugServiceClient::new(
        connect(&address, Duration::from_secs(5)).await.unwrap(),
    )
    .get_controller_state(palisade_proto::v1::GetControllerStateRequest {})
    .await
    .unwrap()
    .into_inner();
    assert_eq!(state.errors.len(), 1, "{:?}", state.errors);
    assert!(
        state.errors[0].ends_with(
            "all.yaml: document 2: NetworkPolicy prod/deny: spec.ingress[0].fromm: unknown field"
        ),
        "{:?}",
        state.errors
    );
    // Fixed: accepted again, the error withdrawn.
    write(dir.path(), &manifests("203.0.113.0/24"));
    let m = scrape_until(&addr, "the fix is accepted", |m| {
        m.get("palisade_controller_node_plan_version{node=\"n1\"}") == Some(&(version + 2.0))
    })
    .await;
    assert!(kinds(&m).iter().all(|(_, n)| *n == 0.0), "{m:?}");
}
