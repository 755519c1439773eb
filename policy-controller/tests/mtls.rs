//! Mutual TLS on the plan channel, over real TCP on loopback, with
//! certificates made at run time: a node's certificate gets that node's
//! plan and nothing else; no certificate, or one from another CA, gets
//! nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_proto::v1::debug_service_client::DebugServiceClient;
use palisade_proto::v1::plan_service_client::PlanServiceClient;
use palisade_proto::v1::{
    subscribe_response::Update, GetControllerStateRequest, GetPodPlanRequest, NodeState, PodRef,
    ReportStateRequest, SubscribeRequest,
};
use palisade_runtime::transport::{client_tls, connect_with, serve, Address, ClientOptions};
use policy_controller::cluster::ClusterState;
use policy_controller::hub::Hub;
use policy_controller::server::{router_with, ServeOptions};
use policy_controller::source::parse_objects;
use policy_controller::tls::{server_config, Authz};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

const OBJECTS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: prod, labels: {app: web}}
spec: {nodeName: node-a, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.11}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, namespace: prod, labels: {app: web}}
spec: {nodeName: node-b, containers: [{name: c, image: i}]}
status: {podIP: 10.1.0.12}
"#;

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A certificate signed by `ca`, written as `name.crt` / `name.key`.
fn issue(dir: &Path, ca: &Ca, name: &str, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

struct Setup {
    addr: Address,
    dir: tempfile::TempDir,
    ca: PathBuf,
    authz: Authz,
}

async fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ca_ = ca("palisade-test-ca");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, &ca_.pem).unwrap();
    let (server_cert, server_key) = issue(
        dir.path(),
        &ca_,
        "server",
        "palisade-controller",
        &["localhost", "127.0.0.1"],
    );
    issue(dir.path(), &ca_, "node-a", "node:node-a", &[]);
    issue(dir.path(), &ca_, "operator", "palisade-operator", &[]);
    let other = ca("someone-else");
    issue(dir.path(), &other, "forged-node-a", "node:node-a", &[]);

    let hub = Hub::new(1);
    let objects = parse_objects(OBJECTS).unwrap();
    hub.update(&ClusterState::from_objects(objects, "1".into()));
    let authz = Authz {
        mutual: true,
        ..Default::default()
    };
    let options = ServeOptions {
        tls: Some(server_config(&server_cert, &server_key, Some(&ca_path)).unwrap()),
        authz: authz.clone(),
        ..Default::default()
    };
    let (router, _health) = router_with(hub, options).await.unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let addr: Address = format!("127.0.0.1:{port}").parse().unwrap();
    let serve_addr = addr.clone();
    tokio::spawn(async move {
        serve(router, &serve_addr, std::future::pending())
            .await
            .unwrap()
    });
    Setup {
        addr,
        dir,
        ca: ca_path,
        authz,
    }
}

impl Setup {
    /// A client as the enforcer makes it, with `name`'s certificate (None:
    /// none).
    async fn client(&self, name: Option<&str>) -> Result<tonic::transport::Channel, String> {
        let identity = name.map(|n| {
            (
                self.dir.path().join(format!("{n}.crt")),
                self.dir.path().join(format!("{n}.key")),
            )
        });
        let tls = client_tls(
            &self.ca,
            identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
            Some("localhost"),
        )
        .unwrap();
        let opts = ClientOptions {
            keepalive: None,
            tls: Some(tls),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match connect_with(&self.addr, Duration::from_secs(2), &opts).await {
                Ok(c) => return Ok(c),
                // The server binds asynchronously; refused connections are
                // retried, anything else is the answer.
                Err(e) if e.contains("refused") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await; // poll
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The refusals GetControllerState reports: (unauthenticated, wrong node,
/// not permitted).
async fn refusals(op: &mut DebugServiceClient<tonic::transport::Channel>) -> (u64, u64, u64) {
    let r = op
        .get_controller_state(GetControllerStateRequest::default())
        .await
        .unwrap()
        .into_inner()
        .refusals
        .expect("the controller reports refusals");
    (r.unauthenticated, r.wrong_node, r.not_permitted)
}

fn subscribe(node: &str) -> SubscribeRequest {
    SubscribeRequest {
        node_name: node.into(),
        enforcer_id: "test".into(),
    }
}

#[tokio::test]
async fn a_node_certificate_gets_its_own_plan_only() {
    let s = start().await;
    let mut a = PlanServiceClient::new(s.client(Some("node-a")).await.unwrap());
    let mut stream = a.subscribe(subscribe("node-a")).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let Some(Update::Snapshot(snap)) = first.update else {
        panic!("a snapshot first")
    };
    let pods: Vec<_> = snap
        .pods
        .iter()
        .map(|p| p.pod.clone().unwrap().name)
        .collect();
    assert_eq!(pods, vec!["web-1"]);

    // Another node's plan, pod or state: refused, naming both nodes.
    let e = a.subscribe(subscribe("node-b")).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("\"node-a\"") && e.message().contains("\"node-b\""),
        "{}",
        e.message()
    );
    let e = a
        .get_pod_plan(GetPodPlanRequest {
            node_name: "node-b".into(),
            pod: Some(PodRef {
                namespace: "prod".into(),
                name: "web-2".into(),
            }),
        })
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let e = a
        .report_state(ReportStateRequest {
            state: Some(NodeState {
                node_name: "node-b".into(),
                ..Default::default()
            }),
        })
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    // Its own pod and report are fine.
    let own = a
        .get_pod_plan(GetPodPlanRequest {
            node_name: "node-a".into(),
            pod: Some(PodRef {
                namespace: "prod".into(),
                name: "web-1".into(),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(own.known);

    // The debug service shows every node's plan: not for a node.
    let mut debug = DebugServiceClient::new(s.client(Some("node-a")).await.unwrap());
    let e = debug
        .get_controller_state(GetControllerStateRequest::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    // An operator's certificate reads it, with the refusals so far: the
    // other node's plan, pod and report, and the node on the debug service.
    let mut op = DebugServiceClient::new(s.client(Some("operator")).await.unwrap());
    assert_eq!(refusals(&mut op).await, (0, 3, 1));
    let mut op_plan = PlanServiceClient::new(s.client(Some("operator")).await.unwrap());
    let e = op_plan.subscribe(subscribe("node-a")).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);

    // wrong node x3, not permitted x2 (node on debug, operator on plans).
    assert_eq!(s.authz.refusals.snapshot(), [0, 3, 2]);
    assert_eq!(
        refusals(&mut op).await,
        (0, 3, 2),
        "as the debug service says"
    );
}

#[tokio::test]
async fn callers_without_a_certificate_of_the_ca_get_nothing() {
    let s = start().await;
    // No client certificate: the handshake passes, every call is refused.
    let mut anon = PlanServiceClient::new(s.client(None).await.unwrap());
    let e = anon.subscribe(subscribe("node-a")).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{}", e.message());
    let mut anon_debug = DebugServiceClient::new(s.client(None).await.unwrap());
    let e = anon_debug
        .get_controller_state(GetControllerStateRequest::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert_eq!(s.authz.refusals.snapshot(), [2, 0, 0]);
    let mut op = DebugServiceClient::new(s.client(Some("operator")).await.unwrap());
    assert_eq!(refusals(&mut op).await, (2, 0, 0));

    // A certificate from another CA naming node-a: the handshake fails.
    let forged = match s.client(Some("forged-node-a")).await {
        Err(e) => Err(e),
        Ok(ch) => PlanServiceClient::new(ch)
            .subscribe(subscribe("node-a"))
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}")),
    };
    assert!(forged.is_err(), "a certificate of another CA was accepted");
}
