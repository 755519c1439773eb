//! Two real `palisade-controller` processes elect a leader through a Lease
//! on the in-process API double; plan subscribers (real gRPC clients that
//! follow the enforcer's rules: several addresses, keepalive, refuse a term
//! lower than the highest seen) must only ever get plans from the leader.
//! The leader is killed (-9), then the next one paused past its renew
//! deadline and resumed: failover is timed and bounded, and neither a
//! standby nor a deposed leader ever sends a plan.

// Each test binary uses part of the double.
#[allow(dead_code)]
mod api_double;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api_double::{ApiDouble, Kind};
use palisade_proto::v1::{
    plan_service_client::PlanServiceClient, subscribe_response::Update, SubscribeRequest,
};
use palisade_runtime::transport::{connect_with, Address, ClientOptions};
use serde_json::json;
use tokio::time::Instant;

const LEASE_MS: u64 = 2000;
const RENEW_MS: u64 = 1500;
const RETRY_MS: u64 = 250;
const NAMESPACE: &str = "palisade";
const LEASE: &str = "palisade-controller";

struct Controller {
    identity: String,
    addr: Address,
    child: Child,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(identity: &str, kubeconfig: &std::path::Path, logs: &std::path::Path) -> Controller {
    let port = free_port();
    let log = std::fs::File::create(logs.join(format!("{identity}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_palisade-controller"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--leader-elect",
            "--lease-namespace",
            NAMESPACE,
            "--lease-name",
            LEASE,
            "--leader-identity",
            identity,
            "--lease-duration-ms",
            &LEASE_MS.to_string(),
            "--renew-deadline-ms",
            &RENEW_MS.to_string(),
            "--retry-period-ms",
            &RETRY_MS.to_string(),
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Controller {
        identity: identity.into(),
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        child,
    }
}

fn signal(c: &Controller, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &c.child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

/// One plan message as a subscriber got it.
#[derive(Clone, Debug)]
struct Got {
    at: Instant,
    from: Address,
    term: u64,
    pods: Vec<String>,
}

#[derive(Default)]
struct Seen {
    got: Vec<Got>,
    /// Messages the enforcer's rule refused (a term below the highest).
    refused: Vec<Got>,
}

/// A subscriber that behaves as the enforcer's plan client does: tries the
/// addresses in turn, drops a connection whose peer stops answering pings,
/// and refuses a plan whose term is lower than the highest it applied.
fn subscriber(node: &'static str, addrs: Arc<Mutex<Vec<Address>>>) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = seen.clone();
    tokio::spawn(async move {
        let opts = ClientOptions {
            keepalive: Some(Duration::from_millis(300)),
            tls: None,
        };
        let mut highest = 0u64;
        let mut i = 0usize;
        loop {
            let list = addrs.lock().unwrap().clone();
            let addr = list[i % list.len()].clone();
            i += 1;
            let Ok(ch) = connect_with(&addr, Duration::from_millis(500), &opts).await else {
                tokio::time::sleep(Duration::from_millis(50)).await; // poll: next address
                continue;
            };
            let mut client = PlanServiceClient::new(ch);
            let stream = client
                .subscribe(SubscribeRequest {
                    node_name: node.into(),
                    enforcer_id: format!("test-{node}"),
                })
                .await;
            let mut stream = match stream {
                Ok(s) => s.into_inner(),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await; // poll: next address
                    continue;
                }
            };
            let mut pods: Vec<String> = Vec::new();
            while let Ok(Some(m)) = stream.message().await {
                let term = match &m.update {
                    Some(Update::Snapshot(s)) => {
                        pods = s
                            .pods
                            .iter()
                            .filter_map(|p| p.pod.as_ref().map(|r| r.name.clone()))
                            .collect();
                        s.term
                    }
                    Some(Update::Delta(d)) => {
                        for p in d.upserted.iter().filter_map(|p| p.pod.as_ref()) {
                            if !pods.contains(&p.name) {
                                pods.push(p.name.clone());
                            }
                        }
                        d.term
                    }
                    None => continue,
                };
                let got = Got {
                    at: Instant::now(),
                    from: addr.clone(),
                    term,
                    pods: pods.clone(),
                };
                let mut s = out.lock().unwrap();
                if term < highest {
                    s.refused.push(got);
                } else {
                    highest = term;
                    s.got.push(got);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await; // poll: next address
        }
    });
    seen
}

async fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await; // poll
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
async fn only_the_leader_serves_and_failover_is_bounded() {
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
    let mut controllers = vec![
        start("c0", &kubeconfig, dir.path()),
        start("c1", &kubeconfig, dir.path()),
    ];
    let addrs = Arc::new(Mutex::new(
        controllers
            .iter()
            .map(|c| c.addr.clone())
            .collect::<Vec<_>>(),
    ));
    let addr_of = |controllers: &[Controller], id: &str| {
        controllers
            .iter()
            .find(|c| c.identity == id)
            .map(|c| c.addr.clone())
            .unwrap()
    };
    let a = subscriber("node-a", addrs.clone());
    let b = subscriber("node-b", addrs.clone());
    let logs = dir.path().to_path_buf();
    let show_logs = move || {
        for f in std::fs::read_dir(&logs).unwrap().flatten() {
            if f.path().extension().is_some_and(|e| e == "log") {
                eprintln!(
                    "--- {}\n{}",
                    f.path().display(),
                    std::fs::read_to_string(f.path()).unwrap()
                );
            }
        }
    };

    // The first leader serves both nodes their own plans.
    let (first, term1) = wait_for("a leader", Duration::from_secs(20), || holder(&double)).await;
    for (s, pod) in [(&a, "web-1"), (&b, "web-2")] {
        wait_for("the first plan", Duration::from_secs(20), || {
            s.lock()
                .unwrap()
                .got
                .iter()
                .find(|g| g.term == term1 && g.pods.contains(&pod.to_string()))
                .cloned()
        })
        .await;
    }
    let first_addr = addr_of(&controllers, &first);
    // The standby refuses, naming the leader.
    let standby = controllers.iter().find(|c| c.identity != first).unwrap();
    // Its server may still be starting on a loaded machine: retry the
    // connection until a deadline rather than trusting one attempt.
    let connect_deadline = Instant::now() + Duration::from_secs(15);
    let channel = loop {
        match connect_with(
            &standby.addr,
            Duration::from_secs(1),
            &ClientOptions::default(),
        )
        .await
        {
            Ok(channel) => break channel,
            Err(e) if Instant::now() < connect_deadline => {
                eprintln!("standby not reachable yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await; // poll
            }
            Err(e) => panic!("standby {} unreachable: {e}", standby.addr),
        }
    };
    let mut direct = PlanServiceClient::new(channel);
    // The standby refuses, and names the leader once it has read the lease.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let refused = direct
            .subscribe(SubscribeRequest {
                node_name: "node-a".into(),
                enforcer_id: "probe".into(),
            })
            .await
            .map(|_| ())
            .expect_err("a standby refuses");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(
            palisade_proto::is_standby_refusal(&refused),
            "the enforcer must see a standby's refusal as one: {refused:?}"
        );
        assert!(
            refused.message().contains("not the leader"),
            "{}",
            refused.message()
        );
        if refused.message().contains(&first) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", refused.message());
        tokio::time::sleep(Duration::from_millis(20)).await; // poll
    }

    // Kill -9 the leader: the other takes over within the lease duration
    // plus a retry period (plus a margin for scheduling).
    let killed_at = Instant::now();
    let i = controllers
        .iter()
        .position(|c| c.identity == first)
        .unwrap();
    controllers[i].child.kill().unwrap();
    controllers[i].child.wait().unwrap();
    let bound = Duration::from_millis(LEASE_MS + RETRY_MS + 1000);
    let mut failover = Vec::new();
    for (name, s) in [("node-a", &a), ("node-b", &b)] {
        let got = wait_for("a plan from the new leader", bound * 3, || {
            s.lock()
                .unwrap()
                .got
                .iter()
                .find(|g| g.term > term1)
                .cloned()
        })
        .await;
        let took = got.at - killed_at;
        println!("failover after kill -9 ({name}): {} ms", took.as_millis());
        failover.push(took);
    }
    let (second, term2) = holder(&double).unwrap();
    assert_ne!(second, first);
    assert!(term2 > term1);
    for took in &failover {
        if *took > bound {
            show_logs();
        }
        assert!(*took <= bound, "failover took {took:?}, bound {bound:?}");
    }

    // A fresh standby takes the killed one's place; then the leader is
    // paused past its renew deadline, and resumed after the standby took
    // over: it must not serve again.
    let replacement = start("c2", &kubeconfig, dir.path());
    addrs.lock().unwrap()[i] = replacement.addr.clone();
    controllers[i] = replacement;
    let second_addr = addr_of(&controllers, &second);
    let paused = controllers.iter().find(|c| c.identity == second).unwrap();
    signal(paused, "-STOP");
    let stopped_at = Instant::now();
    let (third, term3) = wait_for("the standby to take over", Duration::from_secs(20), || {
        holder(&double).filter(|(h, _)| *h != second)
    })
    .await;
    assert_eq!(third, "c2");
    for (name, s) in [("node-a", &a), ("node-b", &b)] {
        let got = wait_for(
            "a plan from the third leader",
            Duration::from_secs(20),
            || {
                s.lock()
                    .unwrap()
                    .got
                    .iter()
                    .find(|g| g.term >= term3)
                    .cloned()
            },
        )
        .await;
        println!(
            "failover after SIGSTOP ({name}): {} ms",
            (got.at - stopped_at).as_millis()
        );
    }
    let paused = controllers.iter().find(|c| c.identity == second).unwrap();
    signal(paused, "-CONT");
    let resumed_at = Instant::now();
    // A change after the resume reaches the nodes from the new leader only.
    double.apply(pod("web-3", "node-a", "10.1.0.13"));
    wait_for(
        "the change from the new leader",
        Duration::from_secs(20),
        || {
            a.lock()
                .unwrap()
                .got
                .iter()
                .find(|g| g.term == term3 && g.pods.contains(&"web-3".to_string()))
                .cloned()
        },
    )
    .await;
    let third_addr = addr_of(&controllers, &third);
    // Asked directly, the resumed one refuses.
    let paused = controllers.iter().find(|c| c.identity == second).unwrap();
    let mut direct = PlanServiceClient::new(
        connect_with(
            &paused.addr,
            Duration::from_secs(1),
            &ClientOptions::default(),
        )
        .await
        .unwrap(),
    );
    let refused = direct
        .subscribe(SubscribeRequest {
            node_name: "node-a".into(),
            enforcer_id: "probe".into(),
        })
        .await
        .map(|_| ())
        .expect_err("a deposed leader refuses");
    assert_eq!(
        refused.code(),
        tonic::Code::Unavailable,
        "{}",
        refused.message()
    );

    // A leader that is stopped (SIGTERM) releases the lease: the resumed
    // one, now a plain standby, takes over within a retry period or so.
    let leader3 = controllers.iter().find(|c| c.identity == third).unwrap();
    let terminated_at = Instant::now();
    signal(leader3, "-TERM");
    let bound = Duration::from_millis(RETRY_MS + 1000);
    for (name, s) in [("node-a", &a), ("node-b", &b)] {
        let got = wait_for("a plan after the release", bound * 5, || {
            s.lock()
                .unwrap()
                .got
                .iter()
                .find(|g| g.term > term3)
                .cloned()
        })
        .await;
        let took = got.at - terminated_at;
        println!(
            "failover after SIGTERM (lease released) ({name}): {} ms",
            took.as_millis()
        );
        assert!(
            took <= bound,
            "failover after a release took {took:?}, bound {bound:?}"
        );
    }
    let (fourth, term4) = holder(&double).unwrap();
    assert_eq!(
        fourth, second,
        "the resumed controller, a standby by now, took over"
    );

    // Every plan any subscriber got came from the holder of its term, and
    // nothing came from the paused one, in its old term, after it resumed.
    for s in [&a, &b] {
        let s = s.lock().unwrap();
        assert!(
            s.refused.is_empty(),
            "stale terms reached a node: {:?}",
            s.refused
        );
        for g in &s.got {
            let expected = match g.term {
                t if t == term1 => &first_addr,
                t if t == term2 => &second_addr,
                t if t == term3 => &third_addr,
                t if t == term4 => &second_addr,
                t => panic!("a plan of term {t}, which no leader held"),
            };
            assert_eq!(
                &g.from, expected,
                "a plan of term {} from a non-leader",
                g.term
            );
            if g.term == term2 {
                assert!(
                    g.at < resumed_at,
                    "the deposed leader served {} ms after resuming: {g:?}",
                    (g.at - resumed_at).as_millis()
                );
            }
        }
    }
}
