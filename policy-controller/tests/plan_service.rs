//! The controller's PlanService over a real unix socket, fed by the real
//! manifest source: sync gating (no plan leaves before the source has read a
//! complete view) and GetPodPlan.

use std::path::Path;
use std::time::Duration;

use palisade_proto::v1::{
    debug_service_client::DebugServiceClient, plan_service_client::PlanServiceClient,
    subscribe_response::Update, GetControllerStateRequest, GetPodPlanRequest, PlanSnapshot, PodRef,
    SubscribeRequest,
};
use palisade_runtime::transport::{connect, serve, Address};
use policy_controller::{feed, hub::Hub, server, source::manifest};
use tokio::sync::watch;
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(20);

const GOOD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: prod, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: open, namespace: prod, labels: {app: other}}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: pending, namespace: prod, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-web, namespace: prod}
spec: {podSelector: {matchLabels: {app: web}}}
"#;

const BROKEN: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: q, namespace: prod}\nspec: 5\n";

fn write(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

struct Controller {
    socket: Address,
    manifests: tempfile::TempDir,
    _sock_dir: tempfile::TempDir,
}

/// The controller as main.rs wires it, on a manifest directory that holds
/// `files` when it starts.
async fn start(files: &[(&str, &str)]) -> Controller {
    let manifests = tempfile::tempdir().unwrap();
    for (name, text) in files {
        write(manifests.path(), name, text);
    }
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(sock_dir.path().join("controller.sock"));
    let hub = Hub::new(1000);
    let (tx, rx) = watch::channel(None);
    let (etx, erx) = watch::channel(Vec::new());
    tokio::spawn(manifest::run_with_interval(
        manifests.path().to_path_buf(),
        Duration::from_millis(10),
        tx,
        etx,
    ));
    tokio::spawn(feed::run(hub.clone(), rx, erx));
    let router = server::router(hub).await.unwrap();
    let addr = socket.clone();
    tokio::spawn(async move { serve(router, &addr, std::future::pending()).await.unwrap() });
    Controller {
        socket,
        manifests,
        _sock_dir: sock_dir,
    }
}

impl Controller {
    async fn channel(&self) -> tonic::transport::Channel {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            match connect(&self.socket, Duration::from_secs(1)).await {
                Ok(c) => return c,
                Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await, // poll: the server binds asynchronously
            }
        }
    }

    /// Subscribes until `done` accepts the outcome (the source scans on its
    /// own schedule); returns the last outcome.
    async fn subscribe_until(
        &self,
        done: impl Fn(&Result<PlanSnapshot, tonic::Status>) -> bool,
    ) -> Result<PlanSnapshot, tonic::Status> {
        let mut client = PlanServiceClient::new(self.channel().await);
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let outcome = match client
                .subscribe(SubscribeRequest {
                    node_name: "n1".into(),
                    enforcer_id: "e1".into(),
                })
                .await
            {
                Err(status) => Err(status),
                Ok(response) => {
                    let first = response.into_inner().message().await.unwrap().unwrap();
                    match first.update {
                        Some(Update::Snapshot(s)) => Ok(s),
                        other => panic!("first message is not a snapshot: {other:?}"),
                    }
                }
            };
            if done(&outcome) {
                return outcome;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no acceptable Subscribe outcome; last: {outcome:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // poll: the source scans every 10 ms
        }
    }
}

fn names(snapshot: &PlanSnapshot) -> Vec<String> {
    snapshot
        .pods
        .iter()
        .map(|p| p.pod.as_ref().unwrap().name.clone())
        .collect()
}

#[tokio::test]
async fn an_unsynced_controller_refuses_to_stream_until_its_source_reads_cleanly() {
    let c = start(&[("good.yaml", GOOD), ("broken.yaml", BROKEN)]).await;

    // Refused, and the refusal names the file once the source has scanned.
    let refused = c
        .subscribe_until(|o| {
            o.as_ref()
                .is_err_and(|s| s.message().contains("broken.yaml"))
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(
        refused
            .message()
            .starts_with("the controller has not synced its source yet: "),
        "{}",
        refused.message()
    );
    let mut plans = PlanServiceClient::new(c.channel().await);
    let lookup = plans
        .get_pod_plan(GetPodPlanRequest {
            node_name: "n1".into(),
            pod: Some(PodRef {
                namespace: "prod".into(),
                name: "web".into(),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(lookup.code(), Code::Unavailable);
    let mut debug = DebugServiceClient::new(c.channel().await);
    let state = debug
        .get_controller_state(GetControllerStateRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!state.source_synced);
    assert!(
        state.errors.iter().any(|e| e.contains("broken.yaml")),
        "{state:?}"
    );

    // Fixed: the first snapshot is synced and lists every pod of the node.
    std::fs::remove_file(c.manifests.path().join("broken.yaml")).unwrap();
    let snapshot = c.subscribe_until(Result::is_ok).await.unwrap();
    assert!(snapshot.source_synced);
    assert_eq!(names(&snapshot), ["open", "pending", "web"]);
    let state = debug
        .get_controller_state(GetControllerStateRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(state.source_synced);

    // A later bad file keeps the last good plan in force.
    write(c.manifests.path(), "broken.yaml", BROKEN);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let state = debug
            .get_controller_state(GetControllerStateRequest {})
            .await
            .unwrap()
            .into_inner();
        if state.errors.iter().any(|e| e.contains("broken.yaml")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "bad file not reported"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // poll: the source scans every 10 ms
    }
    let again = c.subscribe_until(|_| true).await.expect("still serving");
    assert_eq!(again.pods, snapshot.pods);
}

#[tokio::test]
async fn get_pod_plan_answers_from_the_nodes_current_plan() {
    let c = start(&[("good.yaml", GOOD)]).await;
    let snapshot = c.subscribe_until(Result::is_ok).await.unwrap();
    let mut plans = PlanServiceClient::new(c.channel().await);
    let ask = |node: &str, ns: &str, name: &str| GetPodPlanRequest {
        node_name: node.into(),
        pod: Some(PodRef {
            namespace: ns.into(),
            name: name.into(),
        }),
    };

    let web = plans
        .get_pod_plan(ask("n1", "prod", "web"))
        .await
        .unwrap()
        .into_inner();
    assert!(web.known);
    assert_eq!(web.plan_version, snapshot.version);
    let entry = web.pod.unwrap();
    assert_eq!(entry.policies, ["prod/deny-web"]);
    assert!(
        entry.ingress.is_some_and(|d| d.rules.is_empty()),
        "isolated, deny all"
    );

    let open = plans
        .get_pod_plan(ask("n1", "prod", "open"))
        .await
        .unwrap()
        .into_inner();
    assert!(open.known, "a pod no policy selects is known, not isolated");
    let entry = open.pod.unwrap();
    assert_eq!((entry.ingress, entry.egress), (None, None));
    assert_eq!(entry.pod_ips.len(), 1);

    let pending = plans
        .get_pod_plan(ask("n1", "prod", "pending"))
        .await
        .unwrap()
        .into_inner();
    assert!(pending.known);
    assert!(
        pending.pod.unwrap().pod_ips.is_empty(),
        "no address yet, still listed"
    );

    for (node, ns, name) in [
        ("n1", "prod", "nope"),
        ("n2", "prod", "web"),
        ("n1", "dev", "web"),
    ] {
        let r = plans
            .get_pod_plan(ask(node, ns, name))
            .await
            .unwrap()
            .into_inner();
        assert!(!r.known && r.pod.is_none(), "{node} {ns}/{name}: {r:?}");
    }

    for bad in [
        GetPodPlanRequest {
            node_name: String::new(),
            ..ask("n1", "prod", "web")
        },
        GetPodPlanRequest {
            pod: None,
            ..ask("n1", "prod", "web")
        },
        ask("n1", "", "web"),
    ] {
        let e = plans.get_pod_plan(bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
}
