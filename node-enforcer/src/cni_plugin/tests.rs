use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use palisade_proto::v1::cni_service_server::{CniService, CniServiceServer};
use palisade_proto::v1::{
    IpPrefix, PodCheckRequest, PodCheckResponse, PodDownRequest, PodDownResponse, PodRef, PodState,
    PodUpRequest, PodUpResponse,
};
use tonic::{Code, Request, Response, Status};

use super::config::{parse_cni_args, Command, Invocation};
use super::*;

const CONTAINER_ID: &str = "3f2a9c1e";
const NETNS: &str = "/var/run/netns/cni-1234";
const HOST_VETH: &str = "veth9f8e7d6c";

/// Shaped like ptp's result: host veth first (no sandbox), then the pod's
/// eth0; odd spacing and key order prove ADD echoes it byte-for-byte.
const PREV_RESULT: &str = r#"{"cniVersion": "1.0.0",
  "interfaces": [{"name": "veth9f8e7d6c", "mac": "2a:1b:3c:4d:5e:6f"},
                 {"sandbox": "/var/run/netns/cni-1234", "name": "eth0", "mac": "0a:58:0a:f4:01:05"}],
  "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 1},
          {"interface": 1, "address": "fd00:10:244:1::5/64"}],
  "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}"#;

fn env(command: &str) -> HashMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", CONTAINER_ID),
        ("CNI_NETNS", NETNS),
        ("CNI_IFNAME", "eth0"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-7d4b9f-x2x8k;\
             K8S_POD_INFRA_CONTAINER_ID=3f2a9c1e",
        ),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn conf(socket: &Path, prev_result: Option<&str>) -> String {
    let mut out = format!(
        r#"{{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"palisade-cni","enforcerSocket":"{}","timeoutSeconds":5"#,
        socket.display()
    );
    if let Some(prev) = prev_result {
        out.push_str(r#","prevResult":"#);
        out.push_str(prev);
    }
    out.push('}');
    out
}

fn run_with(env: &HashMap<String, String>, stdin: &str) -> Result<Output, CniError> {
    super::run_with(
        env,
        stdin.as_bytes(),
        &super::host_veth::Fixed(HOST_VETH.into()),
    )
}

fn expect_err(result: Result<Output, CniError>) -> CniError {
    match result {
        Ok(out) => panic!(
            "expected a CNI error, got success with stdout {:?}",
            out.stdout
        ),
        Err(e) => e,
    }
}

fn missing_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    (dir, path)
}

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Up(PodUpRequest),
    Down(PodDownRequest),
    Check(PodCheckRequest),
}

#[derive(Clone, Default)]
struct FakeEnforcer {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Every call fails with this, when set.
    reject: Option<(Code, &'static str)>,
    check_state: Option<PodState>,
}

impl FakeEnforcer {
    fn record(&self, seen: Seen) -> Result<(), Status> {
        self.seen.lock().unwrap().push(seen);
        match self.reject {
            Some((code, msg)) => Err(Status::new(code, msg)),
            None => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl CniService for FakeEnforcer {
    async fn pod_up(
        &self,
        request: Request<PodUpRequest>,
    ) -> Result<Response<PodUpResponse>, Status> {
        self.record(Seen::Up(request.into_inner()))?;
        Ok(Response::new(PodUpResponse {
            plan_version: 7,
            ingress_isolated: true,
            egress_isolated: false,
            policy_realized: true,
            warning: String::new(),
        }))
    }

    async fn pod_down(
        &self,
        request: Request<PodDownRequest>,
    ) -> Result<Response<PodDownResponse>, Status> {
        self.record(Seen::Down(request.into_inner()))?;
        Ok(Response::new(PodDownResponse {}))
    }

    async fn pod_check(
        &self,
        request: Request<PodCheckRequest>,
    ) -> Result<Response<PodCheckResponse>, Status> {
        self.record(Seen::Check(request.into_inner()))?;
        Ok(Response::new(PodCheckResponse {
            state: self.check_state.clone(),
        }))
    }
}

/// A CniService on a temp unix socket, served from its own thread because
/// `run` blocks on a runtime of its own.
struct TestServer {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(fake: FakeEnforcer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cni.sock");
        // Bound before returning so the plugin never races the server.
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let seen = fake.seen.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                tonic::transport::Server::builder()
                    .add_service(CniServiceServer::new(fake))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = rx.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        Self {
            _dir: dir,
            socket,
            seen,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn expected_pod() -> Option<PodRef> {
    Some(PodRef {
        namespace: "shop".into(),
        name: "cart-7d4b9f-x2x8k".into(),
    })
}

fn enforced_state() -> PodState {
    PodState {
        pod: expected_pod(),
        container_id: CONTAINER_ID.into(),
        host_interfaces: vec![HOST_VETH.into()],
        ..Default::default()
    }
}

// ---- input decoding ----

#[test]
fn malformed_json_stdin_is_a_decode_error() {
    let err = expect_err(run_with(&env("ADD"), r#"{"cniVersion": "1.0.0", "name": "#));
    assert_eq!(err.code, code::DECODE);
    assert!(err.msg.contains("failed to decode"), "{err}");
    assert!(!err.details.is_empty());
    let json: serde_json::Value = serde_json::from_str(&err.to_json()).unwrap();
    assert_eq!(json["cniVersion"], "1.0.0");
    assert_eq!(json["code"], 6);
}

#[test]
fn wrong_field_type_is_a_decode_error_in_the_config_version() {
    let stdin = r#"{"cniVersion":"0.4.0","name":"n","type":"palisade-cni","timeoutSeconds":"ten"}"#;
    let err = expect_err(run_with(&env("DEL"), stdin));
    assert_eq!(err.code, code::DECODE);
    assert!(err.details.contains("timeoutSeconds") || err.details.contains("invalid type"));
    assert_eq!(err.cni_version.as_deref(), Some("0.4.0"));
    assert!(err.to_json().contains(r#""cniVersion":"0.4.0""#));
}

#[test]
fn empty_and_non_utf8_stdin_are_decode_errors() {
    assert_eq!(expect_err(run_with(&env("ADD"), "  \n")).code, code::DECODE);
    let err = expect_err(run(&env("ADD"), &[0xff, 0xfe, b'{'][..]));
    assert_eq!(err.code, code::DECODE);
    assert!(err.msg.contains("UTF-8"));
}

#[test]
fn unsupported_cni_version_is_incompatible() {
    let stdin = r#"{"cniVersion":"0.3.1","name":"n","type":"palisade-cni"}"#;
    let err = expect_err(run_with(&env("ADD"), stdin));
    assert_eq!(err.code, code::INCOMPATIBLE_VERSION);
    assert!(err.msg.contains("0.3.1"));
    // Reported in a version the plugin speaks.
    assert!(err.to_json().contains(r#""cniVersion":"1.0.0""#));
}

#[test]
fn missing_cni_version_and_bad_options_are_invalid_config() {
    let err = expect_err(run_with(
        &env("ADD"),
        r#"{"name":"n","type":"palisade-cni"}"#,
    ));
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(err.msg.contains("cniVersion"));

    let err = expect_err(run_with(
        &env("DEL"),
        r#"{"cniVersion":"1.0.0","enforcerSocket":"run/cni.sock"}"#,
    ));
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(err.msg.contains("absolute"));

    let err = expect_err(run_with(
        &env("DEL"),
        r#"{"cniVersion":"1.0.0","timeoutSeconds":0}"#,
    ));
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(err.msg.contains("timeoutSeconds"));
}

#[test]
fn defaults_apply_when_options_are_absent() {
    let conf = config::parse_net_conf(r#"{"cniVersion":"1.0.0","name":"n"}"#).unwrap();
    assert_eq!(
        conf.enforcer_socket,
        PathBuf::from("/run/palisade/cni.sock")
    );
    assert_eq!(conf.timeout.as_secs(), 10);
    assert!(conf.prev_result.is_none());
}

#[test]
fn missing_prev_result_on_add_names_the_chaining_requirement() {
    let (_dir, socket) = missing_socket();
    for stdin in [conf(&socket, None), conf(&socket, Some("null"))] {
        let err = expect_err(run_with(&env("ADD"), &stdin));
        assert_eq!(err.code, code::INVALID_CONFIG);
        assert_eq!(
            err.msg,
            "prevResult is required for ADD: palisade-cni must be chained after an interface \
             plugin such as ptp"
        );
    }
}

#[test]
fn prev_result_without_host_interface_is_invalid_config() {
    let (_dir, socket) = missing_socket();
    let prev = r#"{"cniVersion":"1.0.0",
        "interfaces":[{"name":"eth0","sandbox":"/var/run/netns/cni-1234"}],
        "ips":[{"address":"10.244.1.5/24","interface":0}]}"#;
    let err = expect_err(run_with(&env("ADD"), &conf(&socket, Some(prev))));
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(err.msg.contains("no host-side interface"), "{err}");

    let err = expect_err(run_with(
        &env("ADD"),
        &conf(&socket, Some(r#"{"cniVersion":"1.0.0"}"#)),
    ));
    assert_eq!(err.code, code::INVALID_CONFIG);
}

#[test]
fn bad_pod_addresses_are_invalid_config() {
    let cases = [
        (
            r#"[{"address":"10.244.1.300/24","interface":1}]"#,
            "not an address",
        ),
        (r#"[{"address":"10.244.1.5","interface":1}]"#, "CIDR"),
        (r#"[{"address":"0.0.0.0/0","interface":1}]"#, "unspecified"),
        (
            r#"[{"address":"10.244.1.5/24","interface":9}]"#,
            "interface 9",
        ),
        ("[]", "no pod IP"),
    ];
    for (ips, expect) in cases {
        let prev = format!(
            r#"{{"interfaces":[{{"name":"{HOST_VETH}"}},{{"name":"eth0","sandbox":"{NETNS}"}}],"ips":{ips}}}"#
        );
        let raw = serde_json::value::RawValue::from_string(prev).unwrap();
        let err = config::pod_network(&raw).unwrap_err();
        assert_eq!(err.code, code::INVALID_CONFIG, "{ips}");
        assert!(err.msg.contains(expect), "{ips}: {err}");
    }
}

#[test]
fn wrong_types_inside_prev_result_are_decode_errors() {
    let raw = serde_json::value::RawValue::from_string(r#"{"interfaces":"veth0"}"#.into()).unwrap();
    assert_eq!(config::pod_network(&raw).unwrap_err().code, code::DECODE);
}

#[test]
fn pod_network_takes_host_ifaces_and_pod_addresses_only() {
    // A gateway address on the host veth must not be attributed to the pod.
    let prev = format!(
        r#"{{"interfaces":[{{"name":"{HOST_VETH}"}},{{"name":"eth0","sandbox":"{NETNS}"}}],
            "ips":[{{"address":"10.244.1.1/24","interface":0}},
                   {{"address":"10.244.1.5/24","interface":1}},
                   {{"address":"10.244.1.5/24","interface":1}},
                   {{"address":"fd00::5/64"}}]}}"#
    );
    let raw = serde_json::value::RawValue::from_string(prev).unwrap();
    let net = config::pod_network(&raw).unwrap();
    assert_eq!(net.host_interfaces, vec![HOST_VETH.to_string()]);
    assert_eq!(
        net.pod_ips,
        vec![
            "10.244.1.5/32".parse::<IpNet>().unwrap(),
            "fd00::5/128".parse().unwrap()
        ]
    );
}

// ---- environment ----

#[test]
fn cni_args_parse() {
    let args = parse_cni_args(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart;K8S_POD_INFRA_CONTAINER_ID=abc;",
    )
    .unwrap();
    assert_eq!(args["K8S_POD_NAMESPACE"], "shop");
    assert_eq!(args["K8S_POD_NAME"], "cart");
    assert_eq!(args["K8S_POD_INFRA_CONTAINER_ID"], "abc");
    assert_eq!(args["IgnoreUnknown"], "1");
    assert!(parse_cni_args("").unwrap().is_empty());
    assert_eq!(parse_cni_args("K=a=b").unwrap()["K"], "a=b");
    assert_eq!(
        parse_cni_args("K8S_POD_NAME").unwrap_err().code,
        code::INVALID_ENV
    );
    assert_eq!(parse_cni_args("=x").unwrap_err().code, code::INVALID_ENV);
}

#[test]
fn invocation_requires_pod_names_for_add_but_not_del() {
    let mut e = env("ADD");
    e.insert(
        "CNI_ARGS".into(),
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop".into(),
    );
    let err = Invocation::from_env(Command::Add, &e).unwrap_err();
    assert_eq!(err.code, code::INVALID_ENV);
    assert!(err.msg.contains("K8S_POD_NAME"), "{err}");

    let inv = Invocation::from_env(Command::Del, &e).unwrap();
    assert_eq!(inv.pod, None);
    assert_eq!(inv.container_id, CONTAINER_ID);

    let inv = Invocation::from_env(Command::Add, &env("ADD")).unwrap();
    assert_eq!(
        inv.pod,
        Some(PodName {
            namespace: "shop".into(),
            name: "cart-7d4b9f-x2x8k".into()
        })
    );
}

#[test]
fn missing_env_vars_are_invalid_env() {
    let (_dir, socket) = missing_socket();
    let stdin = conf(&socket, Some(PREV_RESULT));

    let mut e = env("ADD");
    e.remove("CNI_COMMAND");
    let err = expect_err(run_with(&e, &stdin));
    assert_eq!(err.code, code::INVALID_ENV);
    assert!(err.msg.contains("CNI_COMMAND"));

    for var in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        let mut e = env("ADD");
        e.remove(var);
        let err = expect_err(run_with(&e, &stdin));
        assert_eq!(err.code, code::INVALID_ENV, "{var}");
        assert!(err.msg.contains(var), "{err}");
    }
}

#[test]
fn unknown_command_is_error_4() {
    let err = expect_err(run_with(&env("FROB"), "{}"));
    assert_eq!(err.code, 4);
    assert!(err.msg.contains("unknown command"));
}

// ---- commands without the enforcer ----

#[test]
fn version_output() {
    // No stdin is read for VERSION: this reader would fail if it were.
    struct Unreadable;
    impl std::io::Read for Unreadable {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("stdin must not be read"))
        }
    }
    let out = run(&env("VERSION"), Unreadable).unwrap();
    assert_eq!(
        out.stdout,
        r#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#
    );
}

#[test]
fn status_succeeds_quietly() {
    let out = run_with(&env("STATUS"), r#"{"cniVersion":"1.0.0","name":"n"}"#).unwrap();
    assert!(out.stdout.is_empty());
}

#[test]
fn error_json_shape() {
    let err = CniError::new(11, "cannot reach").with_details("ENOENT");
    let json: serde_json::Value = serde_json::from_str(&err.to_json()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"cniVersion":"1.0.0","code":11,"msg":"cannot reach","details":"ENOENT"})
    );
    let bare = CniError::new(7, "x").to_json();
    assert!(!bare.contains("details"), "{bare}");
}

// ---- unreachable enforcer ----

/// The config of `conf` with a one-second deadline.
fn conf_1s(socket: &Path, prev_result: Option<&str>) -> String {
    conf(socket, prev_result).replace(r#""timeoutSeconds":5"#, r#""timeoutSeconds":1"#)
}

#[test]
fn unreachable_enforcer_missing_socket_is_try_again_later() {
    let (_dir, socket) = missing_socket();
    let started = std::time::Instant::now();
    let err = expect_err(run_with(&env("ADD"), &conf_1s(&socket, Some(PREV_RESULT))));
    assert_eq!(err.code, code::TRY_AGAIN_LATER);
    assert!(err.msg.contains(&socket.display().to_string()), "{err}");
    assert!(err.msg.contains("waited for one"), "{err}");
    assert!(err.details.contains("No such file"), "{err}");
    // ADD waited for an enforcer to come back, up to its deadline.
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    // CHECK and DEL do not wait.
    let started = std::time::Instant::now();
    let err = expect_err(run_with(&env("CHECK"), &conf(&socket, Some(PREV_RESULT))));
    assert_eq!(err.code, code::TRY_AGAIN_LATER);
    run_with(&env("DEL"), &conf(&socket, None)).expect("DEL succeeds");
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
}

/// A pod-up that finds no enforcer (one restarting, or handing the node
/// over to a new one in a rollout) connects once one listens, within its
/// deadline. Time is tokio's paused clock: the enforcer appears at 300 ms
/// of it, after several attempts, whatever the machine's load.
#[test]
fn pod_up_connects_to_an_enforcer_that_comes_back_within_the_deadline() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cni.sock");
    // Left by an enforcer that is gone: connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    runtime.block_on(async {
        let started = tokio::time::Instant::now();
        let deadline = started + std::time::Duration::from_secs(10);
        let client = tokio::spawn({
            let socket = socket.clone();
            async move { super::client::connect_before(&socket, deadline).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        std::fs::remove_file(&socket).unwrap();
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CniServiceServer::new(FakeEnforcer::default()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let connected = client.await.unwrap();
        assert!(
            connected.is_ok(),
            "the enforcer came back but no connection"
        );
        let took = started.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(300)
                && took < std::time::Duration::from_secs(1),
            "connected after {took:?}"
        );
    });
}

#[test]
fn unreachable_enforcer_dropped_listener_is_try_again_later() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cni.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(
        socket.exists(),
        "the stale socket file is the point of this test"
    );

    run_with(&env("DEL"), &conf(&socket, Some(PREV_RESULT))).expect("DEL succeeds");
    for command in ["ADD", "CHECK"] {
        let err = expect_err(run_with(
            &env(command),
            &conf_1s(&socket, Some(PREV_RESULT)),
        ));
        assert_eq!(err.code, code::TRY_AGAIN_LATER, "{command}");
        assert!(err.msg.contains(&socket.display().to_string()), "{err}");
        assert!(err.details.contains("refused"), "{err}");
    }
}

#[test]
fn silent_enforcer_hits_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cni.sock");
    // Bound but never accepted: connect lands in the backlog, nothing answers.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let stdin =
        conf(&socket, Some(PREV_RESULT)).replace(r#""timeoutSeconds":5"#, r#""timeoutSeconds":1"#);
    let started = std::time::Instant::now();
    let err = expect_err(run_with(&env("ADD"), &stdin));
    assert_eq!(err.code, code::TRY_AGAIN_LATER);
    assert!(err.msg.contains("within 1s"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

// ---- against a fake enforcer ----

#[test]
fn add_sends_pod_up_and_echoes_prev_result() {
    let server = TestServer::start(FakeEnforcer::default());
    let out = run_with(&env("ADD"), &conf(&server.socket, Some(PREV_RESULT))).unwrap();
    assert_eq!(out.stdout, PREV_RESULT);

    let seen = server.seen();
    assert_eq!(
        seen,
        vec![Seen::Up(PodUpRequest {
            pod: expected_pod(),
            container_id: CONTAINER_ID.into(),
            netns: NETNS.into(),
            host_interfaces: vec![HOST_VETH.into()],
            pod_ips: vec![
                IpPrefix {
                    addr: vec![10, 244, 1, 5],
                    prefix_len: 32
                },
                IpPrefix {
                    addr: "fd00:10:244:1::5"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets()
                        .to_vec(),
                    prefix_len: 128
                },
            ],
        })]
    );
}

#[test]
fn add_rejected_by_enforcer_passes_its_message_through() {
    let server = TestServer::start(FakeEnforcer {
        reject: Some((
            Code::FailedPrecondition,
            "no plan received from the controller yet",
        )),
        ..Default::default()
    });
    let err = expect_err(run_with(
        &env("ADD"),
        &conf(&server.socket, Some(PREV_RESULT)),
    ));
    assert_eq!(err.code, code::ENFORCER_REJECTED);
    assert!(
        err.msg.contains("no plan received from the controller yet"),
        "{err}"
    );
    assert!(err.details.contains("FailedPrecondition"), "{err}");
}

#[test]
fn enforcer_unavailable_status_is_try_again_later() {
    let server = TestServer::start(FakeEnforcer {
        reject: Some((Code::Unavailable, "restarting")),
        ..Default::default()
    });
    let err = expect_err(run_with(
        &env("ADD"),
        &conf(&server.socket, Some(PREV_RESULT)),
    ));
    assert_eq!(err.code, code::TRY_AGAIN_LATER);
    assert!(err.details.contains("restarting"), "{err}");
}

#[test]
fn del_without_prev_result_sends_pod_down() {
    let server = TestServer::start(FakeEnforcer::default());
    let out = run_with(&env("DEL"), &conf(&server.socket, None)).unwrap();
    assert!(out.stdout.is_empty());
    assert_eq!(
        server.seen(),
        vec![Seen::Down(PodDownRequest {
            pod: expected_pod(),
            container_id: CONTAINER_ID.into(),
        })]
    );
}

#[test]
fn del_is_best_effort_on_missing_names_and_unknown_pods() {
    let server = TestServer::start(FakeEnforcer {
        reject: Some((Code::NotFound, "unknown pod")),
        ..Default::default()
    });
    let mut e = env("DEL");
    e.remove("CNI_ARGS");
    e.remove("CNI_NETNS");
    let out = run_with(&e, &conf(&server.socket, None)).unwrap();
    assert!(out.stdout.is_empty());
    assert_eq!(
        server.seen(),
        vec![Seen::Down(PodDownRequest {
            pod: None,
            container_id: CONTAINER_ID.into(),
        })]
    );
}

#[test]
/// Failing it would block the sandbox's teardown for as long as the
/// enforcer is down; the next enforcer forgets pods whose veth is gone.
fn del_with_unreachable_enforcer_succeeds() {
    let (_dir, socket) = missing_socket();
    let out = run_with(&env("DEL"), &conf(&socket, None)).unwrap();
    assert!(out.stdout.is_empty());
}

#[test]
fn check_passes_when_enforced_on_the_same_interfaces() {
    let server = TestServer::start(FakeEnforcer {
        check_state: Some(enforced_state()),
        ..Default::default()
    });
    let out = run_with(&env("CHECK"), &conf(&server.socket, Some(PREV_RESULT))).unwrap();
    assert!(out.stdout.is_empty());
    assert_eq!(
        server.seen(),
        vec![Seen::Check(PodCheckRequest {
            pod: expected_pod(),
            container_id: CONTAINER_ID.into(),
        })]
    );
}

#[test]
fn check_fails_when_not_enforced_or_interfaces_differ() {
    let not_enforced = PodState {
        error: "policy set abc123 failed to load".into(),
        ..enforced_state()
    };
    let other_iface = PodState {
        host_interfaces: vec!["vethdeadbeef".into()],
        ..enforced_state()
    };
    for (state, expect) in [
        (Some(not_enforced), "not enforced"),
        (Some(other_iface), "host interfaces"),
        (None, "no state"),
    ] {
        let server = TestServer::start(FakeEnforcer {
            check_state: state,
            ..Default::default()
        });
        let err = expect_err(run_with(
            &env("CHECK"),
            &conf(&server.socket, Some(PREV_RESULT)),
        ));
        assert_eq!(err.code, code::CHECK_MISMATCH);
        assert!(err.msg.contains(expect), "{err}");
    }
}

#[test]
fn check_of_unknown_pod_is_an_enforcer_rejection() {
    let server = TestServer::start(FakeEnforcer {
        reject: Some((Code::NotFound, "pod shop/cart-7d4b9f-x2x8k is not known")),
        ..Default::default()
    });
    let err = expect_err(run_with(
        &env("CHECK"),
        &conf(&server.socket, Some(PREV_RESULT)),
    ));
    assert_eq!(err.code, code::ENFORCER_REJECTED);
    assert!(err.msg.contains("is not known"), "{err}");
}

#[test]
fn check_requires_prev_result() {
    let (_dir, socket) = missing_socket();
    let err = expect_err(run_with(&env("CHECK"), &conf(&socket, None)));
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(err.msg.contains("prevResult is required for CHECK"));
}
