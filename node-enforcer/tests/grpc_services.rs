//! The enforcer's gRPC services over a real unix socket, in front of the real
//! reconciler with an in-memory datapath: the wire paths of CniService,
//! NPBackend (as the AWS VPC CNI calls it) and DebugService.

use std::time::Duration;

use node_enforcer::datapath::fake::FakeDatapath;
use node_enforcer::handle::Handle;
use node_enforcer::reconciler::{PlanMessage, Reconciler};
use node_enforcer::server::{self, npbackend::aws_host_interface};
use palisade_proto::rpc::{np_backend_client::NpBackendClient, DeleteNpRequest, EnforceNpRequest};
use palisade_proto::v1::{
    cni_service_client::CniServiceClient, debug_service_client::DebugServiceClient,
    DirectionPolicy, GetEnforcerStateRequest, IpPrefix, NodeState, PlanSnapshot, PodDownRequest,
    PodPolicy, PodRef, PodUpRequest,
};
use palisade_runtime::transport::{connect, serve, Address};
use tokio::sync::{mpsc, watch};

struct Enforcer {
    handle: Handle,
    socket: Address,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

async fn start(interfaces: &[&str]) -> Enforcer {
    let dir = tempfile::tempdir().unwrap();
    let socket = Address::Unix(dir.path().join("cni.sock"));
    let (tx, rx) = mpsc::channel(16);
    let (state_tx, _state_rx) = watch::channel(NodeState::default());
    let reconciler = Reconciler::new(
        "n1".into(),
        "test".into(),
        FakeDatapath::with_interfaces(interfaces),
    );
    std::thread::spawn(move || reconciler.run(rx, state_tx));
    let handle = Handle::new(tx, std::time::Duration::from_secs(5));
    let (router, _health) = server::router(handle.clone(), "eni".into()).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let addr = socket.clone();
    tokio::spawn(async move {
        serve(router, &addr, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Enforcer {
        handle,
        socket,
        _dir: dir,
        stop: Some(stop),
    }
}

impl Enforcer {
    async fn channel(&self) -> tonic::transport::Channel {
        // The server task binds asynchronously; retry until it accepts.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match connect(&self.socket, Duration::from_secs(1)).await {
                Ok(c) => return c,
                Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
                Err(_) => tokio::task::yield_now().await,
            }
        }
    }
}

impl Drop for Enforcer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn isolate(ns: &str, name: &str) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: ns.into(),
            name: name.into(),
        }),
        pod_ips: vec![],
        ingress: Some(DirectionPolicy::default()),
        egress: None,
        policies: vec![format!("{ns}/deny")],
        ..Default::default()
    }
}

#[tokio::test]
async fn npbackend_enforces_on_the_vpc_cni_interface_and_deletes() {
    let iface = aws_host_interface("eni", "default", "nginx");
    let e = start(&[&iface]).await;
    e.handle
        .plan(PlanMessage::Snapshot(PlanSnapshot {
            term: 0,
            trace_context: Default::default(),
            version: 7,
            pods: vec![isolate("default", "nginx")],
            source_synced: true,
        }))
        .await
        .unwrap();
    let channel = e.channel().await;
    let mut np = NpBackendClient::new(channel.clone());
    let reply = np
        .enforce_np_to_pod(EnforceNpRequest {
            k8s_pod_name: "nginx".into(),
            k8s_pod_namespace: "default".into(),
            network_policy_mode: "standard".into(),
            interface_count: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success);

    let mut debug = DebugServiceClient::new(channel.clone());
    let state = debug
        .get_enforcer_state(GetEnforcerStateRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.plan_version, 7);
    assert_eq!(state.interfaces.len(), 1);
    assert_eq!(state.interfaces[0].name, iface);
    assert_eq!(state.interfaces[0].pod, "default/nginx");
    assert!(!state.interfaces[0].ingress_policy_set.is_empty());
    assert_eq!(state.policy_sets.len(), 1);
    assert_eq!(state.policy_sets[0].references, 1);

    np.delete_pod_np(DeleteNpRequest {
        k8s_pod_name: "nginx".into(),
        k8s_pod_namespace: "default".into(),
    })
    .await
    .unwrap();
    let state = debug
        .get_enforcer_state(GetEnforcerStateRequest {})
        .await
        .unwrap()
        .into_inner();
    // NPBackend names only the pod, so a late delete of an old pod cannot
    // be told from this one's: it stays enforced until its veth goes.
    assert_eq!(state.interfaces.len(), 1);
    let pod = &state.state.unwrap().pods[0];
    assert!(
        pod.error.contains("until its interface goes away"),
        "{}",
        pod.error
    );
}

#[tokio::test]
async fn npbackend_for_a_pod_without_its_interface_is_refused_by_name() {
    let e = start(&[]).await;
    let mut np = NpBackendClient::new(e.channel().await);
    let err = np
        .enforce_np_to_pod(EnforceNpRequest {
            k8s_pod_name: "nginx".into(),
            k8s_pod_namespace: "default".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message()
            .contains(&aws_host_interface("eni", "default", "nginx")),
        "{}",
        err.message()
    );
    let err = np
        .enforce_np_to_pod(EnforceNpRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn cni_service_validates_and_reports_per_pod_state() {
    let e = start(&["veth1"]).await;
    let known = PodPolicy {
        ingress: None,
        ..isolate("x", "a")
    };
    e.handle
        .plan(PlanMessage::Snapshot(PlanSnapshot {
            term: 0,
            trace_context: Default::default(),
            version: 3,
            pods: vec![known],
            source_synced: true,
        }))
        .await
        .unwrap();
    let mut cni = CniServiceClient::new(e.channel().await);
    let pod = Some(PodRef {
        namespace: "x".into(),
        name: "a".into(),
    });
    let bad_ip = cni
        .pod_up(PodUpRequest {
            pod: pod.clone(),
            container_id: "c1".into(),
            netns: "/run/netns/a".into(),
            host_interfaces: vec!["veth1".into()],
            pod_ips: vec![IpPrefix {
                addr: vec![10, 0, 0],
                prefix_len: 32,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(bad_ip.code(), tonic::Code::InvalidArgument);
    assert!(
        bad_ip.message().contains("neither 4"),
        "{}",
        bad_ip.message()
    );

    let up = cni
        .pod_up(PodUpRequest {
            pod: pod.clone(),
            container_id: "c1".into(),
            netns: "/run/netns/a".into(),
            host_interfaces: vec!["veth1".into()],
            pod_ips: vec![IpPrefix {
                addr: vec![10, 0, 0, 5],
                prefix_len: 32,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!up.ingress_isolated);

    let check = cni
        .pod_check(palisade_proto::v1::PodCheckRequest {
            pod: pod.clone(),
            container_id: "c1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let state = check.state.unwrap();
    assert_eq!(state.host_interfaces, vec!["veth1"]);
    assert_eq!(state.pod_ips[0].addr, vec![10, 0, 0, 5]);

    // A DEL that carries only the container id still finds the pod.
    cni.pod_down(PodDownRequest {
        pod: None,
        container_id: "c1".into(),
    })
    .await
    .unwrap();
    let err = cni
        .pod_check(palisade_proto::v1::PodCheckRequest {
            pod,
            container_id: "c1".into(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("not known"), "{}", err.message());
}
