//! `palisade-cni`, a CNI (spec 1.0.0, also 0.4.0, 0.3.1 and 0.3.0) chained
//! plugin.
//!
//! It runs after an interface plugin such as ptp, reads the pod IPs from
//! `prevResult` and the pod's host veth from the kernel, and asks the
//! node-enforcer (over its unix socket) to enforce the pod's policy before
//! the runtime starts the pod. ADD returns only once the enforcer says the
//! policy is in the datapath, so a pod never runs unprotected.
//!
//! Network config (stdin):
//! ```json
//! {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "palisade-cni",
//!  "enforcerSocket": "/run/palisade/cni.sock", "timeoutSeconds": 10,
//!  "prevResult": {...}}
//! ```
//!
//! Everything except [`client`] is pure so it can be tested without a runtime.

pub mod client;
pub mod config;
pub mod error;
pub mod host_veth;
pub mod install;
pub mod seccomp_install;
#[cfg(test)]
pub(crate) mod test_fixtures;
pub mod watch;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;

    use palisade_proto::v1::cni_service_server::{CniService, CniServiceServer};
    use palisade_proto::v1::{
        IpPrefix, PodCheckRequest, PodCheckResponse, PodDownRequest, PodDownResponse, PodRef,
        PodState, PodUpRequest, PodUpResponse,
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
        conf_v("1.0.0", socket, prev_result)
    }

    fn conf_v(version: &str, socket: &Path, prev_result: Option<&str>) -> String {
        let mut out = format!(
            r#"{{"cniVersion":"{version}","name":"k8s-pod-network","type":"palisade-cni","enforcerSocket":"{}","timeoutSeconds":5"#,
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
        run_host(env, stdin, HOST_VETH)
    }

    /// [`run_with`] where the kernel says the container interface's peer is
    /// `veth`.
    fn run_host(
        env: &HashMap<String, String>,
        stdin: &str,
        veth: &str,
    ) -> Result<Output, CniError> {
        super::run_with(env, stdin.as_bytes(), &super::host_veth::Fixed(veth.into()))
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
        /// PodUpResponse.warning.
        warning: &'static str,
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
                warning: self.warning.into(),
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
        let stdin =
            r#"{"cniVersion":"0.4.0","name":"n","type":"palisade-cni","timeoutSeconds":"ten"}"#;
        let err = expect_err(run_with(&env("ADD"), stdin));
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
        let stdin = r#"{"cniVersion":"0.2.0","name":"n","type":"palisade-cni"}"#;
        let err = expect_err(run_with(&env("ADD"), stdin));
        assert_eq!(err.code, code::INCOMPATIBLE_VERSION);
        assert!(err.msg.contains("0.2.0"));
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
            &env("ADD"),
            r#"{"cniVersion":"1.0.0","enforcerSocket":"run/cni.sock"}"#,
        ));
        assert_eq!(err.code, code::INVALID_CONFIG);
        assert!(err.msg.contains("absolute"));

        let err = expect_err(run_with(
            &env("CHECK"),
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
        let raw =
            serde_json::value::RawValue::from_string(r#"{"interfaces":"veth0"}"#.into()).unwrap();
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
            r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}"#
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
        let stdin = conf(&socket, Some(PREV_RESULT))
            .replace(r#""timeoutSeconds":5"#, r#""timeoutSeconds":1"#);
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

    // ---- cniVersion 0.3.x ----

    /// A 0.3.1 result as flannel's chain hands it on: `version` in each ip.
    const PREV_RESULT_031: &str = r#"{"cniVersion":"0.3.1",
  "interfaces":[{"name":"veth9f8e7d6c","mac":"2a:1b:3c:4d:5e:6f"},
                {"name":"eth0","mac":"0a:58:0a:f4:01:05","sandbox":"/var/run/netns/cni-1234"}],
  "ips":[{"version":"4","interface":1,"address":"10.244.1.5/24","gateway":"10.244.1.1"}],
  "dns":{}}"#;

    #[test]
    fn cni_0_3_x_configs_are_served() {
        for version in ["0.3.0", "0.3.1"] {
            let server = TestServer::start(FakeEnforcer::default());
            let stdin = conf_v(version, &server.socket, Some(PREV_RESULT_031));
            let out = run_with(&env("ADD"), &stdin).unwrap();
            assert_eq!(out.stdout, PREV_RESULT_031, "{version}");
            run_with(&env("DEL"), &conf_v(version, &server.socket, None)).unwrap();
            let seen = server.seen();
            assert_eq!(seen.len(), 2, "{version}: {seen:?}");
            let Seen::Up(up) = &seen[0] else {
                panic!("{version}: {seen:?}")
            };
            assert_eq!(
                up.pod_ips,
                vec![ip_prefix(&"10.244.1.5/32".parse().unwrap())]
            );
            assert!(matches!(seen[1], Seen::Down(_)), "{version}: {seen:?}");
        }
        // Errors speak the config's version.
        let (_dir, socket) = missing_socket();
        let err = expect_err(run_with(&env("ADD"), &conf_v("0.3.1", &socket, None)));
        assert_eq!(err.code, code::INVALID_CONFIG);
        assert!(
            err.to_json().contains(r#""cniVersion":"0.3.1""#),
            "{}",
            err.to_json()
        );
    }

    #[test]
    fn check_under_0_3_x_is_an_incompatible_version_and_asks_nothing() {
        for version in ["0.3.0", "0.3.1"] {
            let server = TestServer::start(FakeEnforcer {
                check_state: Some(enforced_state()),
                ..Default::default()
            });
            let stdin = conf_v(version, &server.socket, Some(PREV_RESULT_031));
            let err = expect_err(run_with(&env("CHECK"), &stdin));
            assert_eq!(err.code, code::INCOMPATIBLE_VERSION, "{version}");
            assert!(
                err.msg.contains(version) && err.msg.contains("CHECK"),
                "{err}"
            );
            assert!(
                err.to_json()
                    .contains(&format!(r#""cniVersion":"{version}""#)),
                "{}",
                err.to_json()
            );
            assert_eq!(server.seen(), vec![], "{version}");
        }
    }

    // ---- DEL under a refused config ----

    #[test]
    fn del_under_a_refused_config_still_sends_pod_down_and_succeeds() {
        let server = TestServer::start(FakeEnforcer::default());
        let socket = server.socket.display().to_string();
        let cases = [
            format!(r#"{{"cniVersion":"0.2.0","enforcerSocket":"{socket}"}}"#),
            format!(r#"{{"cniVersion":"9.9.9","enforcerSocket":"{socket}","timeoutSeconds":3}}"#),
            format!(r#"{{"enforcerSocket":"{socket}"}}"#),
            format!(r#"{{"cniVersion":"1.0.0","enforcerSocket":"{socket}","timeoutSeconds":0}}"#),
            format!(
                r#"{{"cniVersion":"1.0.0","enforcerSocket":"{socket}","timeoutSeconds":"ten"}}"#
            ),
        ];
        for (i, stdin) in cases.iter().enumerate() {
            let out = run_with(&env("DEL"), stdin).unwrap_or_else(|e| panic!("{stdin}: {e}"));
            assert!(out.stdout.is_empty(), "{stdin}");
            assert!(
                out.stderr[0].contains("refused"),
                "{stdin}: {:?}",
                out.stderr
            );
            assert_eq!(out.stderr.len(), 1, "{stdin}: {:?}", out.stderr);
            assert_eq!(server.seen().len(), i + 1, "{stdin}");
            assert_eq!(
                server.seen()[i],
                Seen::Down(PodDownRequest {
                    pod: expected_pod(),
                    container_id: CONTAINER_ID.into(),
                }),
                "{stdin}"
            );
        }
    }

    #[test]
    fn del_under_a_refused_config_succeeds_whatever_the_enforcer_says() {
        let server = TestServer::start(FakeEnforcer {
            reject: Some((Code::Internal, "boom")),
            ..Default::default()
        });
        let stdin = format!(
            r#"{{"cniVersion":"0.2.0","enforcerSocket":"{}"}}"#,
            server.socket.display()
        );
        let out = run_with(&env("DEL"), &stdin).unwrap();
        assert!(out.stdout.is_empty());
        assert_eq!(server.seen().len(), 1);
        assert!(
            out.stderr.iter().any(|l| l.contains("boom")),
            "{:?}",
            out.stderr
        );

        // Nothing to decode, and nothing usable in it: still torn down.
        let (_dir, socket) = missing_socket();
        for stdin in [
            &b""[..],
            &[0xff, 0xfe][..],
            b"{oops",
            br#"{"enforcerSocket":"rel/x"}"#,
        ] {
            let out = super::run_with(
                &env("DEL"),
                stdin,
                &super::host_veth::Fixed(HOST_VETH.into()),
            )
            .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(stdin)));
            assert!(out.stdout.is_empty());
        }
        // The socket the refused config names is used when it is valid.
        let out = run_with(
            &env("DEL"),
            &format!(
                r#"{{"cniVersion":"0.2.0","enforcerSocket":"{}"}}"#,
                socket.display()
            ),
        )
        .unwrap();
        assert!(
            out.stderr
                .iter()
                .any(|l| l.contains(&socket.display().to_string())),
            "{:?}",
            out.stderr
        );
    }

    #[test]
    fn del_target_keeps_each_valid_option_and_defaults_the_rest() {
        let (socket, timeout) = config::del_target(
            r#"{"cniVersion":"0.2.0","enforcerSocket":"/x.sock","timeoutSeconds":0}"#,
        );
        assert_eq!(socket, PathBuf::from("/x.sock"));
        assert_eq!(timeout.as_secs(), DEFAULT_TIMEOUT_SECONDS);
        let (socket, timeout) =
            config::del_target(r#"{"enforcerSocket":"x.sock","timeoutSeconds":3}"#);
        assert_eq!(socket, PathBuf::from(DEFAULT_ENFORCER_SOCKET));
        assert_eq!(timeout.as_secs(), 3);
        assert_eq!(
            config::del_target("not json").0,
            PathBuf::from(DEFAULT_ENFORCER_SOCKET)
        );
    }

    // ---- CHECK finds the host veth as ADD does ----

    /// After `bridge`: the bridge and the veth, both without `sandbox`.
    const PREV_RESULT_BRIDGE: &str = r#"{"cniVersion":"1.0.0",
  "interfaces":[{"name":"cni0","mac":"aa:00:00:00:00:01"},
                {"name":"veth9f8e7d6c","mac":"2a:1b:3c:4d:5e:6f"},
                {"name":"eth0","mac":"0a:58:0a:f4:01:05","sandbox":"/var/run/netns/cni-1234"}],
  "ips":[{"address":"10.244.1.5/24","gateway":"10.244.1.1","interface":2}]}"#;

    #[test]
    fn check_after_bridge_compares_the_kernel_peer_not_prev_result() {
        let server = TestServer::start(FakeEnforcer {
            check_state: Some(enforced_state()),
            ..Default::default()
        });
        let stdin = conf(&server.socket, Some(PREV_RESULT_BRIDGE));
        run_with(&env("CHECK"), &stdin).expect("CHECK passes on a bridge chain");
        // And the peer, not prevResult, is what must match.
        let err = expect_err(run_host(&env("CHECK"), &stdin, "vethother0"));
        assert_eq!(err.code, code::CHECK_MISMATCH);
        assert!(err.details.contains("vethother0"), "{err}");
    }

    #[test]
    fn check_names_a_container_interface_it_cannot_find() {
        struct Gone;
        impl super::host_veth::HostVeth for Gone {
            fn host_interface(&self, _: &str, _: &str) -> Result<String, String> {
                Err("no such netns".into())
            }
        }
        let server = TestServer::start(FakeEnforcer {
            check_state: Some(enforced_state()),
            ..Default::default()
        });
        let stdin = conf(&server.socket, Some(PREV_RESULT));
        let err = expect_err(super::run_with(&env("CHECK"), stdin.as_bytes(), &Gone));
        assert_eq!(err.code, code::INTERNAL);
        assert!(err.msg.contains("eth0") && err.msg.contains(NETNS), "{err}");
        assert_eq!(err.details, "no such netns");
    }

    // ---- the enforcer's warning ----

    #[test]
    fn add_warning_goes_to_stderr_and_stdout_stays_the_result() {
        let warning = "pod shop/cart-7d4b9f-x2x8k starts UNPROTECTED: policy not known by the \
                       pod-up deadline (no plan)";
        let server = TestServer::start(FakeEnforcer {
            warning,
            ..Default::default()
        });
        let out = run_with(&env("ADD"), &conf(&server.socket, Some(PREV_RESULT))).unwrap();
        assert_eq!(out.stdout, PREV_RESULT);
        assert_eq!(out.stderr.len(), 1, "{:?}", out.stderr);
        assert!(out.stderr[0].contains(warning), "{:?}", out.stderr);
        assert!(
            out.stderr[0].contains("shop/cart-7d4b9f-x2x8k"),
            "{:?}",
            out.stderr
        );

        let quiet = TestServer::start(FakeEnforcer::default());
        let out = run_with(&env("ADD"), &conf(&quiet.socket, Some(PREV_RESULT))).unwrap();
        assert!(out.stderr.is_empty(), "{:?}", out.stderr);
    }
}

use std::collections::HashMap;
use std::io::Read;

use ipnet::IpNet;
use palisade_proto::v1::{
    IpPrefix, PodCheckRequest, PodCheckResponse, PodDownRequest, PodRef, PodUpRequest,
};

pub use client::EnforcerClient;
pub use config::{
    Command, Invocation, NetConf, PodName, PodNetwork, DEFAULT_ENFORCER_SOCKET,
    DEFAULT_TIMEOUT_SECONDS, SUPPORTED_VERSIONS,
};
pub use error::{code, CniError};

/// The network config is a few KiB; anything near this is not one.
const MAX_STDIN_BYTES: u64 = 4 << 20;

/// What the plugin prints on success.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// The CNI result, and nothing else: the runtime parses all of it.
    pub stdout: String,
    /// Lines for the runtime's log of the plugin's stderr.
    pub stderr: Vec<String>,
}

/// The whole plugin: the process environment and stdin in, stdout or a CNI
/// error out. `main` only prints and picks the exit code.
pub fn run(env: &HashMap<String, String>, stdin: impl Read) -> Result<Output, CniError> {
    run_with(env, stdin, &host_veth::Kernel)
}

/// [`run`] with the way the pod's host interface is found given.
pub fn run_with(
    env: &HashMap<String, String>,
    stdin: impl Read,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    let command = Command::from_env(env)?;
    if command == Command::Version {
        // VERSION may be invoked with no config at all; don't wait on stdin.
        return Ok(Output {
            stdout: version_json(),
            ..Output::default()
        });
    }
    let input = match read_input(stdin) {
        Ok(input) => input,
        // DEL must never be blocked by its config, even an unreadable one.
        Err(e) if command == Command::Del => return del_refused(env, "", e),
        Err(e) => return Err(e),
    };
    let version = config::sniff_version(&input);
    execute(command, env, &input, host).map_err(|mut e| {
        if e.cni_version.is_none() {
            e.cni_version = version;
        }
        e
    })
}

pub fn version_json() -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string()
}

fn read_input(stdin: impl Read) -> Result<String, CniError> {
    let mut bytes = Vec::new();
    stdin
        .take(MAX_STDIN_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            CniError::decode("failed to read the network configuration from stdin")
                .with_details(e.to_string())
        })?;
    if bytes.len() as u64 > MAX_STDIN_BYTES {
        return Err(CniError::decode(format!(
            "network configuration on stdin is larger than {MAX_STDIN_BYTES} bytes"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        CniError::decode("network configuration on stdin is not UTF-8").with_details(e.to_string())
    })
}

fn execute(
    command: Command,
    env: &HashMap<String, String>,
    input: &str,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    match command {
        Command::Add => add(env, input, host),
        Command::Del => del(env, input),
        Command::Check => check(env, input, host),
        // The enforcer reconciles its own state and reports readiness through
        // its health service, so there is nothing for these to do.
        Command::Status | Command::Gc | Command::Version => Ok(Output::default()),
    }
}

fn client_for(conf: &NetConf) -> EnforcerClient {
    EnforcerClient::new(&conf.enforcer_socket, conf.timeout)
}

fn add(
    env: &HashMap<String, String>,
    input: &str,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    let conf = config::parse_net_conf(input)?;
    let invocation = Invocation::from_env(Command::Add, env)?;
    let prev_result = conf.prev_result.as_deref().ok_or_else(|| {
        CniError::invalid_config(
            "prevResult is required for ADD: palisade-cni must be chained after an \
             interface plugin such as ptp",
        )
    })?;
    let mut network = config::pod_network(prev_result)?;
    network.host_interfaces = vec![host_veth_of(&invocation, host)?];
    let response = client_for(&conf).pod_up(pod_up_request(&invocation, &network)?)?;
    let mut stderr = Vec::new();
    // Standard mode lets a pod whose policy is unknown start open; the
    // runtime's log is where an operator looks for why.
    if !response.warning.is_empty() {
        stderr.push(format!(
            "ADD {}: {}",
            pod_label(&invocation),
            response.warning
        ));
    }
    Ok(Output {
        stdout: prev_result.get().to_string(),
        stderr,
    })
}

/// The kernel, not prevResult, says which host interface is the pod's
/// (see [`host_veth`]).
fn host_veth_of(
    invocation: &Invocation,
    host: &dyn host_veth::HostVeth,
) -> Result<String, CniError> {
    host.host_interface(&invocation.netns, &invocation.ifname)
        .map_err(|e| {
            CniError::new(
                code::INTERNAL,
                format!(
                    "cannot find the host side of {} in {}",
                    invocation.ifname, invocation.netns
                ),
            )
            .with_details(e)
        })
}

fn pod_label(invocation: &Invocation) -> String {
    match &invocation.pod {
        Some(pod) => format!("pod {}/{}", pod.namespace, pod.name),
        None => format!("container {}", invocation.container_id),
    }
}

fn del(env: &HashMap<String, String>, input: &str) -> Result<Output, CniError> {
    let conf = match config::parse_net_conf(input) {
        Ok(conf) => conf,
        Err(refused) => return del_refused(env, input, refused),
    };
    let invocation = Invocation::from_env(Command::Del, env)?;
    match client_for(&conf).pod_down(pod_down_request(&invocation)) {
        Ok(_) => Ok(Output::default()),
        // Nothing this DEL can do while the enforcer is down, and failing it
        // would block the sandbox's teardown: the next enforcer forgets pods
        // whose interfaces are gone.
        Err(e) if e.code == code::TRY_AGAIN_LATER => Ok(Output {
            stderr: vec![format!(
                "DEL: {}; the enforcer cleans up when it returns",
                e.msg
            )],
            ..Output::default()
        }),
        Err(e) => Err(e),
    }
}

/// DEL under a config ADD would refuse (an unknown cniVersion, a bad
/// option, stdin that does not decode): the sandbox must still be torn
/// down, so PodDown goes out best effort, keyed by CNI_CONTAINERID, and DEL
/// succeeds whatever the answer; the refusal goes to the runtime's log.
fn del_refused(
    env: &HashMap<String, String>,
    input: &str,
    refused: CniError,
) -> Result<Output, CniError> {
    let invocation = Invocation::from_env(Command::Del, env)?;
    let (socket, timeout) = config::del_target(input);
    let mut stderr = vec![format!(
        "DEL: the network config is refused ({refused}); sending PodDown for container {} \
         to {} anyway",
        invocation.container_id,
        socket.display()
    )];
    if let Err(e) = EnforcerClient::new(&socket, timeout).pod_down(pod_down_request(&invocation)) {
        stderr.push(format!("DEL: {e}; the enforcer cleans up when it returns"));
    }
    Ok(Output {
        stderr,
        ..Output::default()
    })
}

fn check(
    env: &HashMap<String, String>,
    input: &str,
    host: &dyn host_veth::HostVeth,
) -> Result<Output, CniError> {
    let conf = config::parse_net_conf(input)?;
    config::check_allows_check(&conf.cni_version)?;
    let invocation = Invocation::from_env(Command::Check, env)?;
    let prev_result = conf.prev_result.as_deref().ok_or_else(|| {
        CniError::invalid_config(
            "prevResult is required for CHECK: palisade-cni must be chained after an \
             interface plugin such as ptp",
        )
    })?;
    let mut network = config::pod_network(prev_result)?;
    let response = client_for(&conf).pod_check(pod_check_request(&invocation)?)?;
    // The interface ADD recorded, found the same way: prevResult also lists
    // the bridge after `bridge`. Asked after the enforcer, whose answer
    // settles most CHECKs without entering the pod's netns.
    network.host_interfaces = vec![host_veth_of(&invocation, host)?];
    verify_check(&invocation, &network, &response)?;
    Ok(Output::default())
}

fn pod_ref(pod: &PodName) -> PodRef {
    PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    }
}

fn required_pod(invocation: &Invocation) -> Result<PodRef, CniError> {
    invocation
        .pod
        .as_ref()
        .map(pod_ref)
        .ok_or_else(|| CniError::invalid_env("CNI_ARGS has no K8S_POD_NAMESPACE/K8S_POD_NAME"))
}

pub fn ip_prefix(net: &IpNet) -> IpPrefix {
    let addr = match net.addr() {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    IpPrefix {
        addr,
        prefix_len: u32::from(net.prefix_len()),
    }
}

pub fn pod_up_request(
    invocation: &Invocation,
    network: &PodNetwork,
) -> Result<PodUpRequest, CniError> {
    Ok(PodUpRequest {
        pod: Some(required_pod(invocation)?),
        container_id: invocation.container_id.clone(),
        netns: invocation.netns.clone(),
        host_interfaces: network.host_interfaces.clone(),
        pod_ips: network.pod_ips.iter().map(ip_prefix).collect(),
    })
}

/// `pod` is omitted when the runtime gave no Kubernetes names; the enforcer
/// then has only the container id to go on.
pub fn pod_down_request(invocation: &Invocation) -> PodDownRequest {
    PodDownRequest {
        pod: invocation.pod.as_ref().map(pod_ref),
        container_id: invocation.container_id.clone(),
    }
}

pub fn pod_check_request(invocation: &Invocation) -> Result<PodCheckRequest, CniError> {
    Ok(PodCheckRequest {
        pod: Some(required_pod(invocation)?),
        container_id: invocation.container_id.clone(),
    })
}

/// The enforcer answering PodCheck is not enough: its view must match what
/// the runtime believes the pod has, or policy is on the wrong veth.
pub fn verify_check(
    invocation: &Invocation,
    network: &PodNetwork,
    response: &PodCheckResponse,
) -> Result<(), CniError> {
    let Some(state) = response.state.as_ref() else {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            "the enforcer returned no state for the pod",
        ));
    };
    if !state.error.is_empty() {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            format!("the pod's policy is not enforced: {}", state.error),
        ));
    }
    if !state.container_id.is_empty() && state.container_id != invocation.container_id {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            "the enforcer knows the pod under a different container",
        )
        .with_details(format!(
            "enforcer: {:?}, runtime: {:?}",
            state.container_id, invocation.container_id
        )));
    }
    if !config::same_interfaces(&state.host_interfaces, &network.host_interfaces) {
        return Err(CniError::new(
            code::CHECK_MISMATCH,
            "the enforcer's host interfaces for the pod differ from the peer of the \
             container interface",
        )
        .with_details(format!(
            "enforcer: {:?}, kernel: {:?}",
            state.host_interfaces, network.host_interfaces
        )));
    }
    Ok(())
}
