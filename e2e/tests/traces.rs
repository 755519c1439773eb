//! Traces across processes: the real controller and two real enforcers
//! export to an OTLP/gRPC receiver served here (on a listener the lab binds
//! in its fabric namespace, which every process reaches), and one policy
//! change must come back as one trace: the controller's `policy change`,
//! a `plan version` and a `send plan` per node, each node's enforcer
//! `realize plan` as the child of its send, and the controller's `report
//! state` as the child of that realization. The service name on each span's
//! resource shows which process made it.
//!
//! And a collector that accepts connections but never answers must not
//! slow plan delivery nor the processes' exit.

mod common;
use common::require_root;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use palisade_e2e::{Lab, LabConfig};

const DEADLINE: Duration = Duration::from_secs(40);

/// Isolates every pod of namespace x, so both nodes' plans change.
const DENY_ALL: &str = r#"
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: x, labels: {ns: x}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: deny-all, namespace: x}
    spec: {podSelector: {}, policyTypes: [Ingress]}
"#;

/// One received span, flattened with its resource.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    node_resource: Option<String>,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: BTreeMap<String, String>,
}

impl Received {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn text(kv: &[KeyValue]) -> BTreeMap<String, String> {
    kv.iter()
        .filter_map(|kv| {
            let v = match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                other => format!("{other:?}"),
            };
            Some((kv.key.clone(), v))
        })
        .collect()
}

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource = text(rs.resource.as_ref().map_or(&[][..], |r| &r.attributes));
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Received {
                        service: resource.get("service.name").cloned().unwrap_or_default(),
                        node_resource: resource.get("k8s.node.name").cloned(),
                        name: s.name,
                        trace_id: s.trace_id,
                        span_id: s.span_id,
                        parent_span_id: s.parent_span_id,
                        attributes: text(&s.attributes),
                    });
                }
            }
        }
        self.spans.lock().unwrap().extend(got);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Serves the receiver on the lab's listener, on a runtime of its own.
fn serve_receiver(lab: &mut Lab) -> (tokio::runtime::Runtime, Receiver) {
    let listener = lab
        .take_otlp_listener()
        .expect("the lab bound an OTLP listener");
    listener.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let receiver = Receiver::default();
    let service = TraceServiceServer::new(receiver.clone());
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (rt, receiver)
}

/// One node's chain for plan `version`, once every link of it arrived.
struct Chain {
    change: Received,
    plan_version: Received,
    send: Received,
    realize: Received,
    report: Received,
}

fn find_chain(spans: &[Received], node: &str, version: &str) -> Result<Chain, String> {
    let one = |what: &str, f: &dyn Fn(&Received) -> bool| {
        spans
            .iter()
            .find(|s| f(s))
            .cloned()
            .ok_or_else(|| format!("no {what} yet"))
    };
    let of_node = |s: &Received| s.attr("palisade.node") == Some(node);
    let plan_version = one(&format!("plan version {version} of {node}"), &|s| {
        s.name == "plan version" && of_node(s) && s.attr("palisade.plan.version") == Some(version)
    })?;
    let change = one("its policy change", &|s| {
        s.name == "policy change" && s.span_id == plan_version.parent_span_id
    })?;
    let send = one(&format!("send plan of version {version} to {node}"), &|s| {
        s.name == "send plan" && s.parent_span_id == plan_version.span_id
    })?;
    let realize = one(
        &format!("realize plan of version {version} on {node}"),
        &|s| s.name == "realize plan" && s.parent_span_id == send.span_id,
    )?;
    let report = one(&format!("report state after {version} from {node}"), &|s| {
        s.name == "report state" && s.parent_span_id == realize.span_id
    })?;
    Ok(Chain {
        change,
        plan_version,
        send,
        realize,
        report,
    })
}

#[test]
#[ignore = "needs root"]
fn one_policy_change_is_one_trace_from_the_controller_through_every_enforcer_and_back() {
    require_root();
    let mut lab = Lab::start(LabConfig {
        nodes: 2,
        otlp_listener: true,
        ..LabConfig::default()
    })
    .expect("lab starts");
    let (rt, receiver) = serve_receiver(&mut lab);
    lab.apply(&objects(PODS)).expect("pods are created");
    lab.wait_realized().expect("pods are realized");
    lab.apply(&policies(DENY_ALL)).expect("policy applied");
    lab.wait_realized().expect("policy realized");

    let state = lab.controller_state().expect("controller state");
    let versions: Vec<(String, String)> = lab
        .node_names()
        .iter()
        .map(|n| {
            let v = state
                .nodes
                .iter()
                .find(|v| v.node_name == *n)
                .unwrap_or_else(|| panic!("the controller has no plan for {n}"));
            (n.to_string(), v.plan_version.to_string())
        })
        .collect();

    let deadline = Instant::now() + DEADLINE;
    let chains = loop {
        let spans = receiver.spans.lock().unwrap().clone();
        let found: Result<Vec<Chain>, String> = versions
            .iter()
            .map(|(node, version)| find_chain(&spans, node, version))
            .collect();
        match found {
            Ok(chains) => break chains,
            Err(missing) => assert!(
                Instant::now() < deadline,
                "{missing} after {DEADLINE:?}; received {} spans: {:#?}\n{}",
                spans.len(),
                spans
                    .iter()
                    .map(|s| format!("{} {} {:?}", s.service, s.name, s.attributes))
                    .collect::<Vec<_>>(),
                lab.log_tails(20)
            ),
        }
        std::thread::sleep(Duration::from_millis(100)); // poll: spans arrive in the exporters' batches
    };

    // One change, one trace, through both nodes.
    assert_eq!(chains[0].change.span_id, chains[1].change.span_id);
    let trace_id = &chains[0].change.trace_id;
    for (c, (node, version)) in chains.iter().zip(&versions) {
        for s in [&c.plan_version, &c.send, &c.realize, &c.report] {
            assert_eq!(&s.trace_id, trace_id, "{} of {node}", s.name);
        }
        for s in [&c.change, &c.plan_version, &c.send, &c.report] {
            assert_eq!(s.service, "palisade-controller", "{} of {node}", s.name);
            assert_eq!(s.node_resource, None);
        }
        // Made by that node's enforcer process, not the controller.
        assert_eq!(c.realize.service, "palisade-enforcer");
        assert_eq!(c.realize.node_resource.as_deref(), Some(node.as_str()));
        assert_eq!(c.realize.attr("palisade.node"), Some(node.as_str()));
        assert_eq!(
            c.realize.attr("palisade.plan.version"),
            Some(version.as_str())
        );
        assert_eq!(c.realize.attr("palisade.result"), Some("ok"));
        assert_eq!(c.send.attr("palisade.plan.kind"), Some("delta"));
        assert_eq!(c.send.attr("palisade.plan.version"), Some(version.as_str()));
        assert_eq!(
            c.report.attr("palisade.plan.realized_version"),
            Some(version.as_str())
        );
        assert_ne!(
            c.plan_version.attr("palisade.plan.pods_upserted"),
            Some("0"),
            "the policy isolated pods on {node}"
        );
    }
    drop(rt);
    finish(lab);
}

/// Accepts every connection on the lab's listener and never says a word;
/// counts them.
fn serve_silence(lab: &mut Lab) -> (tokio::runtime::Runtime, Arc<Mutex<usize>>) {
    let listener = lab
        .take_otlp_listener()
        .expect("the lab bound an OTLP listener");
    listener.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let accepted = Arc::new(Mutex::new(0));
    let count = accepted.clone();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
            *count.lock().unwrap() += 1;
        }
    });
    (rt, accepted)
}

#[test]
#[ignore = "needs root"]
fn a_collector_that_never_answers_slows_neither_plans_nor_exit() {
    require_root();
    let mut lab = Lab::start(LabConfig {
        otlp_listener: true,
        ..LabConfig::default()
    })
    .expect("lab starts");
    let (rt, accepted) = serve_silence(&mut lab);
    lab.apply(&objects(PODS)).expect("pods are created");
    lab.wait_realized().expect("pods are realized");
    // Both processes have spans to export by now; wait until both are
    // stuck on the silent collector before changing policy.
    let deadline = Instant::now() + DEADLINE;
    while *accepted.lock().unwrap() < 2 {
        assert!(
            Instant::now() < deadline,
            "the processes never tried to export: {} connections\n{}",
            accepted.lock().unwrap(),
            lab.log_tails(20)
        );
        std::thread::sleep(Duration::from_millis(100)); // poll: exports start on the exporters' schedule
    }
    for policy in [DENY_B, ALLOW_A_80] {
        let started = Instant::now();
        lab.apply(&policies(policy)).expect("policy applied");
        lab.wait_realized().expect("policy realized");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "realization took {:?} with a silent collector",
            started.elapsed()
        );
    }
    assert_verdicts(
        &lab,
        "after the last policy",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/c", "x/b", 80, Tcp, Deny),
        ],
    );
    // The processes flush at SIGTERM with a bounded wait: none is killed
    // for overstaying its grace period.
    finish(lab);
    drop(rt);
}
