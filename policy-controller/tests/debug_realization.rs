//! GetRealization over a real socket, with the manifest source and real
//! plan streams and state reports: per node the plan sent against the plan
//! realized, per policy how many of the nodes that need it have realized it
//! and which lag; a pod error or a newer plan makes a node lag again.

use std::path::Path;
use std::time::Duration;

use palisade_proto::v1::{
    debug_service_client::DebugServiceClient, plan_service_client::PlanServiceClient,
    GetRealizationRequest, GetRealizationResponse, NodeState, PodRef, PodState, ReportStateRequest,
    SubscribeRequest,
};
use palisade_runtime::transport::{connect, serve, Address};
use policy_controller::{feed, hub::Hub, server, source::manifest};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(20);

fn manifests(extra_selects_db: bool) -> String {
    let db_policy = if extra_selects_db {
        "{matchLabels: {app: db}}"
    } else {
        "{matchLabels: {app: nothing}}"
    };
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web1, namespace: prod, labels: {{app: web}}}}
spec: {{nodeName: n1, containers: [{{name: c, image: i}}]}}
status: {{podIP: 10.1.0.1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web2, namespace: prod, labels: {{app: web}}}}
spec: {{nodeName: n2, containers: [{{name: c, image: i}}]}}
status: {{podIP: 10.1.0.2}}
---
apiVersion: v1
kind: Pod
metadata: {{name: db, namespace: prod, labels: {{app: db}}}}
spec: {{nodeName: n1, containers: [{{name: c, image: i}}]}}
status: {{podIP: 10.1.0.3}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: web, namespace: prod}}
spec: {{podSelector: {{matchLabels: {{app: web}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: db, namespace: prod}}
spec: {{podSelector: {db_policy}}}
"#
    )
}

fn write(dir: &Path, text: &str) {
    let tmp = dir.join(".all.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join("all.yaml")).unwrap();
}

async fn start(dir: &Path, socket: &Address) -> Channel {
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
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match connect(socket, Duration::from_secs(1)).await {
            Ok(c) => return c,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await, // poll: the server binds asynchronously
        }
    }
}

/// Asks until `done` accepts the answer (sources and streams move on their
/// own schedule).
async fn realization_until(
    client: &mut DebugServiceClient<Channel>,
    policy: &str,
    done: impl Fn(&GetRealizationResponse) -> bool,
) -> GetRealizationResponse {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let r = client
            .get_realization(GetRealizationRequest {
                policy: policy.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if done(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never accepted: {r:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // poll: the source scans every 10 ms
    }
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn report(
    plans: &mut PlanServiceClient<Channel>,
    node: &str,
    version: u64,
    error_pod: Option<&str>,
) {
    let pods = error_pod
        .map(|name| PodState {
            pod: Some(PodRef {
                namespace: "prod".into(),
                name: name.into(),
            }),
            error: "attaching: no such interface".into(),
            ..Default::default()
        })
        .into_iter()
        .collect();
    plans
        .report_state(ReportStateRequest {
            state: Some(NodeState {
                node_name: node.into(),
                enforcer_id: format!("{node}-e"),
                realized_version: version,
                pods,
                errors: vec![],
            }),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn policies_are_realized_on_the_nodes_that_need_them() {
    let dir = tempfile::tempdir().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(sock_dir.path().join("controller.sock"));
    write(dir.path(), &manifests(false));
    let channel = start(dir.path(), &socket).await;
    let mut debug = DebugServiceClient::new(channel.clone());
    let mut plans = PlanServiceClient::new(channel);

    let r = realization_until(&mut debug, "", |r| r.source_synced && r.nodes.len() == 2).await;
    let web = &r.policies.iter().find(|p| p.policy == "prod/web").unwrap();
    assert_eq!((web.expected_nodes, web.realized_nodes), (2, 0));
    assert_eq!(web.lagging_nodes, ["n1", "n2"]);
    assert!(
        r.policies.iter().all(|p| p.policy != "prod/db"),
        "a policy that selects no pod is needed nowhere"
    );
    let n1 = &r.nodes[0];
    assert_eq!(n1.node_name, "n1");
    assert!(!n1.connected && !n1.reported && !n1.realized);
    assert_eq!(n1.lag_versions, 0, "no report, nothing to count from");
    assert_eq!(
        (
            n1.connected_since_unix_ms,
            n1.connected_secs,
            n1.state_changed_unix_ms,
            n1.reconnects
        ),
        (0, 0, 0, 0),
        "never connected"
    );
    let web1 = n1
        .pods
        .iter()
        .find(|p| p.pod.as_ref().unwrap().name == "web1")
        .unwrap();
    assert_eq!(web1.policies, ["prod/web"]);

    // n1 subscribes (connected) and realizes its plan.
    let subscribed_at = unix_ms_now();
    let mut stream = plans
        .subscribe(SubscribeRequest {
            node_name: "n1".into(),
            enforcer_id: "n1-e".into(),
        })
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().expect("a snapshot");
    let n1_version = n1.plan_version;
    report(&mut plans, "n1", n1_version - 1, None).await;
    let r = realization_until(&mut debug, "prod/web", |r| r.nodes[0].reported).await;
    assert!(r.nodes[0].connected);
    let since = r.nodes[0].connected_since_unix_ms;
    assert!(
        (subscribed_at..=unix_ms_now()).contains(&since),
        "connected since {since}, subscribed at {subscribed_at}"
    );
    assert_eq!(r.nodes[0].state_changed_unix_ms, since);
    assert_eq!(r.nodes[0].reconnects, 0, "a first connection");
    assert!(
        r.nodes[0].connected_secs <= (unix_ms_now() - since) / 1000,
        "{:?}",
        r.nodes[0]
    );
    assert_eq!(r.nodes[1].connected_since_unix_ms, 0, "n2 never connected");
    assert_eq!((r.nodes[0].realized, r.nodes[0].lag_versions), (false, 1));
    report(&mut plans, "n1", n1_version, None).await;
    let r = realization_until(&mut debug, "prod/web", |r| r.nodes[0].realized).await;
    assert_eq!(r.nodes[0].realized_version, n1_version);
    assert_eq!(r.policies.len(), 1, "narrowed to the policy asked for");
    assert_eq!(
        (r.policies[0].realized_nodes, r.policies[0].expected_nodes),
        (1, 2)
    );
    assert_eq!(r.policies[0].lagging_nodes, ["n2"]);

    // n2 reports its version, but an error for web2: web still lags there.
    let n2_version = r.nodes[1].plan_version;
    report(&mut plans, "n2", n2_version, Some("web2")).await;
    let r = realization_until(&mut debug, "prod/web", |r| r.nodes[1].realized).await;
    assert_eq!(r.policies[0].lagging_nodes, ["n2"]);
    let web2 = &r.nodes[1].pods[0];
    assert_eq!(web2.error, "attaching: no such interface");
    report(&mut plans, "n2", n2_version, None).await;
    let r = realization_until(&mut debug, "prod/web", |r| {
        r.policies[0].lagging_nodes.is_empty()
    })
    .await;
    assert_eq!(
        (r.policies[0].realized_nodes, r.policies[0].expected_nodes),
        (2, 2)
    );

    // A policy that now selects db changes n1's plan only: n1 lags again,
    // for both policies it needs, by one version.
    write(dir.path(), &manifests(true));
    let r = realization_until(&mut debug, "", |r| {
        r.policies.iter().any(|p| p.policy == "prod/db")
    })
    .await;
    assert_eq!((r.nodes[0].lag_versions, r.nodes[0].realized), (1, false));
    assert!(r.nodes[1].realized, "n2's plan did not change");
    for p in &r.policies {
        assert_eq!(p.lagging_nodes, ["n1"], "{p:?}");
    }
    let db = r.policies.iter().find(|p| p.policy == "prod/db").unwrap();
    assert_eq!((db.expected_nodes, db.realized_nodes), (1, 0));

    // A policy asked for by a name that selects nothing: listed, needed nowhere.
    // The enforcer goes away: its node shows disconnected without waiting
    // for a plan change.
    drop(stream);
    let r = realization_until(&mut debug, "", |r| !r.nodes[0].connected).await;
    assert_eq!(r.nodes[0].connected_since_unix_ms, 0);
    assert_eq!(r.nodes[0].connected_secs, 0);
    let left = r.nodes[0].state_changed_unix_ms;
    assert!(left >= since, "left at {left}, connected at {since}");
    assert_eq!(r.nodes[0].reconnects, 0);

    // It comes back: a reconnect, counted from the new stream.
    let mut stream = plans
        .subscribe(SubscribeRequest {
            node_name: "n1".into(),
            enforcer_id: "n1-e".into(),
        })
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().expect("a snapshot");
    let r = realization_until(&mut debug, "", |r| r.nodes[0].connected).await;
    assert_eq!(r.nodes[0].reconnects, 1);
    assert!(r.nodes[0].connected_since_unix_ms >= left);
    assert_eq!(
        r.nodes[0].state_changed_unix_ms,
        r.nodes[0].connected_since_unix_ms
    );
    drop(stream);

    let r = realization_until(&mut debug, "prod/none", |_| true).await;
    assert_eq!(r.policies.len(), 1);
    assert_eq!(
        (r.policies[0].expected_nodes, r.policies[0].realized_nodes),
        (0, 0)
    );
    let status = debug
        .get_realization(GetRealizationRequest {
            policy: "web".into(),
        })
        .await
        .expect_err("not namespace/name");
    assert_eq!(status.code(), Code::InvalidArgument);
}
