//! Leader failover as nodes live it: two real `palisade-controller`
//! processes elect a leader through a Lease on the in-process API double,
//! and two real `palisade-enforcer` processes (one per node, each in a
//! network namespace of its own, `--controller a,b`) follow whoever leads.
//! The leader is killed (SIGKILL); the test measures how long until every
//! enforcer has realized a plan of the new leader, then changes policy and
//! waits for the enforcers to realize that too.
//!
//! A plan of the new leader is told apart by its version: each controller
//! numbers versions from its own start time, so the new leader's versions
//! for a node are its own, read from its debug service before the kill.
//!
//! Needs root (the enforcers load eBPF and pin maps) and the enforcer
//! binary next to the controller's (`cargo build --bins`).

// Each test binary uses part of the double.
#[allow(dead_code)]
mod api_double;

use palisade_test_support::require_root;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use api_double::{ApiDouble, Kind};
use palisade_proto::v1::{
    debug_service_client::DebugServiceClient, GetControllerStateRequest, GetEnforcerStateRequest,
    GetEnforcerStateResponse, GetRealizationRequest,
};
use palisade_runtime::transport::{connect, Address};
use serde_json::json;
use tokio::time::Instant;

const LEASE_MS: u64 = 2000;
const RENEW_MS: u64 = 1500;
const RETRY_MS: u64 = 250;
const NAMESPACE: &str = "palisade";
const LEASE: &str = "palisade-controller";
const NODES: [&str; 2] = ["node-a", "node-b"];

/// A child process killed (and reaped) when the test ends, however it ends.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Controller {
    identity: String,
    socket: PathBuf,
    proc: Proc,
}

struct Enforcer {
    node: &'static str,
    socket: PathBuf,
    proc: Proc,
}

/// Removes the enforcers' pinned maps: an enforcer keeps them on exit for
/// its successor, and there is none here.
struct Pins(PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn(name: &str, mut cmd: Command, logs: &Path) -> Proc {
    let log = logs.join(format!("{name}.log"));
    let child = cmd
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    Proc {
        name: name.into(),
        child,
        log,
    }
}

fn controller(identity: &str, kubeconfig: &Path, dir: &Path) -> Controller {
    let socket = dir.join(format!("{identity}.sock"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_palisade-controller"));
    // A unix socket reaches the enforcers across network namespaces.
    cmd.args(["--listen", &format!("unix:{}", socket.display())])
        .args(["--leader-elect", "--lease-namespace", NAMESPACE])
        .args(["--lease-name", LEASE, "--leader-identity", identity])
        .args(["--lease-duration-ms", &LEASE_MS.to_string()])
        .args(["--renew-deadline-ms", &RENEW_MS.to_string()])
        .args(["--retry-period-ms", &RETRY_MS.to_string()])
        .env("KUBECONFIG", kubeconfig);
    Controller {
        identity: identity.into(),
        proc: spawn(identity, cmd, dir),
        socket,
    }
}

/// The enforcer binary, built beside the controller's.
fn enforcer_bin() -> PathBuf {
    let bin =
        Path::new(env!("CARGO_BIN_EXE_palisade-controller")).with_file_name("palisade-enforcer");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --bins)",
        bin.display()
    );
    bin
}

fn enforcer(node: &'static str, controllers: &[Controller], dir: &Path, pins: &Path) -> Enforcer {
    let socket = dir.join(format!("{node}-enforcer.sock"));
    let list: Vec<String> = controllers
        .iter()
        .map(|c| format!("unix:{}", c.socket.display()))
        .collect();
    // Its own network namespace (unshare execs the enforcer, so the pid is
    // the enforcer's): it attaches to nothing of this machine's.
    let mut cmd = Command::new("unshare");
    cmd.arg("--net")
        .arg("--")
        .arg(enforcer_bin())
        .args(["--node-name", node])
        .args(["--controller", &list.join(",")])
        .arg("--cni-socket")
        .arg(&socket)
        .arg("--pin-root")
        .arg(pins.join(node))
        .arg("--state-dir")
        .arg(dir.join(format!("{node}-state")));
    Enforcer {
        node,
        proc: spawn(&format!("{node}-enforcer"), cmd, dir),
        socket,
    }
}

fn unix(path: &Path) -> Address {
    Address::Unix(path.to_path_buf())
}

async fn debug(socket: &Path) -> Option<DebugServiceClient<tonic::transport::Channel>> {
    connect(&unix(socket), Duration::from_millis(500))
        .await
        .ok()
        .map(DebugServiceClient::new)
}

async fn enforcer_state(e: &Enforcer) -> Option<GetEnforcerStateResponse> {
    let mut c = debug(&e.socket).await?;
    c.get_enforcer_state(GetEnforcerStateRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// Each node's current plan version at controller `c` (it computes plans
/// while standing by too).
async fn plan_versions(c: &Controller) -> Option<Vec<u64>> {
    let state = debug(&c.socket)
        .await?
        .get_controller_state(GetControllerStateRequest {})
        .await
        .ok()?
        .into_inner();
    if !state.source_synced {
        return None;
    }
    NODES
        .iter()
        .map(|n| {
            state
                .nodes
                .iter()
                .find(|v| v.node_name == *n)
                .map(|v| v.plan_version)
        })
        .collect()
}

/// Each node's plan version at `c` once every one is past `past`.
async fn plan_versions_past(c: &Controller, past: &[u64]) -> Option<Vec<u64>> {
    plan_versions(c)
        .await
        .filter(|v| v.iter().zip(past).all(|(now, was)| now > was))
}

/// Whether `e` has realized exactly plan `version` (the plan it holds and
/// the version it reports in the datapath).
async fn realized(e: &Enforcer, version: u64) -> Option<()> {
    let s = enforcer_state(e).await?;
    (s.plan_version == version && s.state.is_some_and(|n| n.realized_version == version))
        .then_some(())
}

/// Polls `check` until it answers; panics with the processes' logs after
/// `limit`.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, logs: &[&Proc], mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(t) = check().await {
            return t;
        }
        if Instant::now() >= deadline {
            for p in logs {
                eprintln!(
                    "--- {} ({})\n{}",
                    p.name,
                    p.log.display(),
                    std::fs::read_to_string(&p.log).unwrap_or_default()
                );
            }
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // poll
    }
}

fn holder(double: &ApiDouble) -> Option<(String, u64)> {
    let l = double.object(Kind::Lease, NAMESPACE, LEASE)?;
    let h = l["spec"]["holderIdentity"].as_str()?.to_string();
    let t = l["spec"]["leaseTransitions"].as_u64().unwrap_or(0) + 1;
    Some((h, t))
}

fn pod(name: &str, node: &str, ip: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root"]
async fn enforcers_follow_a_new_leader_after_the_old_one_is_killed() {
    require_root();
    let double = ApiDouble::start().await;
    double.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}}));
    double.apply(pod("web-1", "node-a", "10.1.0.11"));
    double.apply(pod("web-2", "node-b", "10.1.0.12"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: double, cluster: {{server: \"{}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: double, user: u}}}}]\ncurrent-context: c\n",
            double.url
        ),
    )
    .unwrap();
    let pins = Pins(PathBuf::from(format!(
        "/sys/fs/bpf/palisade-failover-{}",
        std::process::id()
    )));
    let mut controllers = vec![
        controller("c0", &kubeconfig, dir.path()),
        controller("c1", &kubeconfig, dir.path()),
    ];
    let enforcers: Vec<Enforcer> = NODES
        .iter()
        .map(|n| enforcer(n, &controllers, dir.path(), &pins.0))
        .collect();
    let limit = Duration::from_secs(30);

    // The first leader's plans, realized on both nodes.
    let (first, term1) = wait_for("a leader", limit, &[], || {
        std::future::ready(holder(&double))
    })
    .await;
    let leader = controllers
        .iter()
        .position(|c| c.identity == first)
        .unwrap();
    let standby = 1 - leader;
    let logs: Vec<&Proc> = controllers
        .iter()
        .map(|c| &c.proc)
        .chain(enforcers.iter().map(|e| &e.proc))
        .collect();
    let old_versions = wait_for("the leader's plans", limit, &logs, || {
        plan_versions(&controllers[leader])
    })
    .await;
    for (e, v) in enforcers.iter().zip(&old_versions) {
        wait_for(
            &format!("{} to realize the first leader's plan", e.node),
            limit,
            &logs,
            || realized(e, *v),
        )
        .await;
    }
    // The standby's own versions for the same plans: what marks a plan as
    // the next leader's.
    let new_versions = wait_for("the standby's plans", limit, &logs, || {
        plan_versions(&controllers[standby])
    })
    .await;
    for (old, new) in old_versions.iter().zip(&new_versions) {
        assert_ne!(old, new, "the two controllers' versions must differ");
    }
    drop(logs);

    // SIGKILL the leader: no lease release, the standby waits out the lease.
    let killed_at = Instant::now();
    let killed_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    controllers[leader].proc.child.kill().unwrap();
    controllers[leader].proc.child.wait().unwrap();
    let logs: Vec<&Proc> = controllers
        .iter()
        .map(|c| &c.proc)
        .chain(enforcers.iter().map(|e| &e.proc))
        .collect();
    let mut failover = Vec::new();
    for (e, v) in enforcers.iter().zip(&new_versions) {
        wait_for(
            &format!("{} to realize the new leader's plan", e.node),
            limit,
            &logs,
            || realized(e, *v),
        )
        .await;
        failover.push((e.node, killed_at.elapsed()));
    }
    let (second, term2) = holder(&double).unwrap();
    assert_eq!(second, controllers[standby].identity);
    assert!(term2 > term1, "term {term2} after {term1}");
    // Lease expiry after the last renewal, the standby's next retry, the
    // enforcers' reconnect backoff, and scheduling on a loaded machine.
    let bound = Duration::from_millis(LEASE_MS + RETRY_MS) + Duration::from_secs(5);
    for (node, took) in &failover {
        println!(
            "failover after SIGKILL: {node} realized term {term2}'s plan {} ms after the kill",
            took.as_millis()
        );
        assert!(
            *took <= bound,
            "{node}: failover took {took:?}, bound {bound:?}"
        );
    }

    // A policy change after the failover reaches both nodes from the new
    // leader: its plan versions advance and both enforcers realize them.
    let changed_at = Instant::now();
    double.apply(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}
    }));
    let new_leader = &controllers[standby];
    let changed = wait_for("the new leader to plan the policy", limit, &logs, || {
        plan_versions_past(new_leader, &new_versions)
    })
    .await;
    for (e, v) in enforcers.iter().zip(&changed) {
        wait_for(
            &format!("{} to realize the policy change", e.node),
            limit,
            &logs,
            || realized(e, *v),
        )
        .await;
    }
    println!(
        "policy change after failover realized on both nodes in {} ms",
        changed_at.elapsed().as_millis()
    );
    // The new leader agrees: the policy is realized on both nodes that
    // need it, every node connected to it.
    let r = debug(&new_leader.socket)
        .await
        .unwrap()
        .get_realization(GetRealizationRequest {
            policy: "prod/web".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.policies[0].expected_nodes, r.policies[0].realized_nodes),
        (2, 2),
        "{r:#?}"
    );
    assert!(r.nodes.iter().all(|n| n.connected && n.realized), "{r:#?}");
    // Each node's first stream to this controller began after the kill.
    for n in &r.nodes {
        assert!(
            n.connected_since_unix_ms >= killed_unix_ms && n.reconnects == 0,
            "{n:#?}, killed at {killed_unix_ms}"
        );
    }
    // Dropped in reverse order: processes first, then their pins.
}
