//! ClusterNetworkPolicy tiers against live traffic, on a 2-node lab (x/a
//! and x/c on node-1, x/b on node-2, so every flow crosses the fabric and
//! x/b's ingress is judged by node-2's enforcer):
//!
//! - an Admin Deny added under an established, allowed TCP connection cuts
//!   it on its next packet (the changed tier moves x/b's epochs, so its
//!   conntrack entry is judged again) and refuses new connections, while a
//!   connection the Deny does not cover carries on;
//! - the same Deny staged (`palisade.io/audit: "true"`) lets the traffic
//!   through, and node-2's flow log records a would-deny naming the tier,
//!   the policy's priority and the rule; without the annotation it is
//!   enforced.

mod common;
use common::require_root;

use std::net::TcpStream;
use std::time::Duration;

use common::*;
use palisade_e2e::probe::echo;
use palisade_e2e::scenario::{FlowLogMode, Kind, ObjectKey, Target};
use palisade_e2e::{Lab, LabConfig, Outcome, PodName};

const TIMEOUT: Duration = Duration::from_millis(1000);
/// For a flow log line to reach the file (the writer flushes on its own
/// schedule).
const LOG_DEADLINE: Duration = Duration::from_secs(30);

/// [`PODS`] placed: x/a and x/c on node-1, x/b on node-2.
fn placed_pods() -> String {
    let placed = PODS
        .replace(
            "labels: {app: a}}, spec: {",
            "labels: {app: a}}, spec: {nodeName: node-1, ",
        )
        .replace(
            "labels: {app: b}}, spec: {",
            "labels: {app: b}}, spec: {nodeName: node-2, ",
        )
        .replace(
            "labels: {app: c}}, spec: {",
            "labels: {app: c}}, spec: {nodeName: node-1, ",
        );
    assert_eq!(placed.matches("nodeName").count(), 3, "every pod is placed");
    format!("nodes: 2\n{placed}")
}

fn lab(flow_log: Option<FlowLogMode>) -> Lab {
    let mut lab = Lab::start(LabConfig {
        nodes: 2,
        flow_log,
        ..LabConfig::default()
    })
    .expect("lab starts");
    lab.apply(&objects(&placed_pods()))
        .expect("pods are created");
    lab.wait_realized().expect("pods are realized");
    assert_eq!(lab.node_of(&pod("x/a")), Some("node-1"));
    assert_eq!(lab.node_of(&pod("x/b")), Some("node-2"));
    assert_eq!(lab.node_of(&pod("x/c")), Some("node-1"));
    lab
}

fn pod(name: &str) -> PodName {
    PodName::parse(name).unwrap()
}

/// x/b accepts x/a and x/c on every port: the flows are allowed by a rule.
const ALLOW_A_AND_C: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: allow-a-and-c, namespace: x}
    spec:
      podSelector: {matchLabels: {app: b}}
      policyTypes: [Ingress]
      ingress:
        - from: [{podSelector: {matchExpressions: [{key: app, operator: In, values: [a, c]}]}}]
"#;

const CNP_NAME: &str = "deny-a-to-b";
const PRIORITY: u64 = 7;
const RULE: &str = "deny-from-a";

/// The Admin tier denies x/b's ingress from x/a (rule 1; rule 0 matches
/// nothing here), staged or not.
fn admin_deny(staged: bool) -> String {
    let annotations = if staged {
        "\n      annotations: {palisade.io/audit: \"true\"}"
    } else {
        ""
    };
    format!(
        r#"
objects:
  - apiVersion: policy.networking.k8s.io/v1alpha2
    kind: ClusterNetworkPolicy
    metadata:
      name: {CNP_NAME}{annotations}
    spec:
      tier: Admin
      priority: {PRIORITY}
      subject: {{pods: {{namespaceSelector: {{matchLabels: {{ns: x}}}}, podSelector: {{matchLabels: {{app: b}}}}}}}}
      ingress:
        - {{name: deny-from-nowhere, action: Deny, from: [{{pods: {{namespaceSelector: {{matchLabels: {{ns: nowhere}}}}, podSelector: {{}}}}}}]}}
        - {{name: {RULE}, action: Deny, from: [{{pods: {{namespaceSelector: {{matchLabels: {{ns: x}}}}, podSelector: {{matchLabels: {{app: a}}}}}}}}]}}
"#
    )
}

fn connect(lab: &Lab, from: &str, to: &str, port: u16) -> TcpStream {
    lab.connect(&pod(from), &Target::parse(to).unwrap(), port, TIMEOUT)
        .unwrap_or_else(|e| panic!("{from} -> {to}:{port}: {e:#}\n{}", lab.log_tails(20)))
}

/// A flow log line of x/b's ingress from `src` on TCP `port` with `verdict`.
fn line_of<'l>(
    lab: &Lab,
    lines: &'l [serde_json::Value],
    verdict: &str,
    src: &str,
    port: u16,
) -> Option<&'l serde_json::Value> {
    let src_ip = lab.pod_ip(&pod(src))?.to_string();
    let dst_ip = lab.pod_ip(&pod("x/b"))?.to_string();
    lines.iter().find(|l| {
        l["verdict"] == verdict
            && l["direction"] == "ingress"
            && l["src_ip"] == src_ip.as_str()
            && l["dst_ip"] == dst_ip.as_str()
            && l["dst_port"] == port
            && l["protocol"] == "tcp"
    })
}

/// The line names the Admin Deny's rule: tier, priority, rule, policy.
fn assert_names_the_rule(line: &serde_json::Value) {
    assert_eq!(line["pod"], "x/b", "{line}");
    assert_eq!(line["tier"], "Admin", "{line}");
    assert_eq!(line["priority"], PRIORITY, "{line}");
    assert_eq!(line["rule_name"], RULE, "{line}");
    assert_eq!(line["rule_index"], 1, "{line}");
    let policy = line["policy"].as_str().unwrap_or_default();
    assert!(policy.contains(CNP_NAME), "{line}");
}

#[test]
#[ignore = "needs root"]
fn an_admin_deny_cuts_an_established_flow_and_refuses_new_ones() {
    require_root();
    let mut lab = lab(Some(FlowLogMode::Deny));
    lab.apply(&policies(ALLOW_A_AND_C)).unwrap();
    lab.wait_realized().unwrap();
    let mut cut = connect(&lab, "x/a", "x/b", 80);
    let mut kept = connect(&lab, "x/c", "x/b", 80);
    for c in [&mut cut, &mut kept] {
        assert_eq!(echo(c, TIMEOUT), Outcome::Echo, "established and allowed");
    }

    lab.apply(&policies(&admin_deny(false))).unwrap();
    lab.wait_realized().unwrap();
    assert_eq!(
        echo(&mut kept, TIMEOUT),
        Outcome::Echo,
        "the flow the Deny does not cover dropped\n{}",
        lab.log_tails(20)
    );
    assert_eq!(
        echo(&mut cut, TIMEOUT),
        Outcome::NoEcho,
        "the established flow the Admin Deny covers still echoes\n{}",
        lab.log_tails(20)
    );
    assert_verdicts(
        &lab,
        "new connections under the Admin Deny",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/a", "x/b", 81, Tcp, Deny),
            ("x/a", "x/b", 53, Udp, Deny),
            ("x/c", "x/b", 80, Tcp, Allow),
            // x/a's other peers: the Deny is x/b's only.
            ("x/a", "x/c", 80, Tcp, Allow),
        ],
    );
    // Still established after the probes, and cut for good.
    assert_eq!(echo(&mut kept, TIMEOUT), Outcome::Echo);
    assert_eq!(echo(&mut cut, TIMEOUT), Outcome::NoEcho);
    // Node-2 (x/b's) logs the denials as the Admin rule's.
    let lines = lab
        .wait_flow_log(
            "node-2",
            "a denied line of x/a to x/b on 81",
            LOG_DEADLINE,
            |lines| line_of(&lab, lines, "denied", "x/a", 81).is_some(),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_names_the_rule(line_of(&lab, &lines, "denied", "x/a", 81).unwrap());

    // Deleting the Deny lets new connections from x/a in again.
    lab.delete(&[ObjectKey {
        kind: Kind::ClusterNetworkPolicy,
        namespace: None,
        name: CNP_NAME.into(),
    }])
    .unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "the Deny deleted",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/c", "x/b", 80, Tcp, Allow),
        ],
    );
    assert_eq!(echo(&mut kept, TIMEOUT), Outcome::Echo);
    drop((cut, kept));
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn a_staged_admin_deny_lets_traffic_through_and_logs_would_deny() {
    require_root();
    // Flow log mode off: staged verdicts are logged in every mode.
    let mut lab = lab(Some(FlowLogMode::Off));
    lab.apply(&policies(ALLOW_A_AND_C)).unwrap();
    lab.apply(&policies(&admin_deny(true))).unwrap();
    lab.wait_realized().unwrap();
    let cases = [
        ("x/a", "x/b", 80, Tcp, Allow),
        ("x/a", "x/b", 81, Tcp, Allow),
        ("x/c", "x/b", 80, Tcp, Allow),
    ];
    assert_verdicts(&lab, "staged Admin Deny: still allowed", &cases);
    let lines = lab
        .wait_flow_log(
            "node-2",
            "a would-deny line of x/a to x/b on 80 and 81",
            LOG_DEADLINE,
            |lines| {
                [80, 81]
                    .iter()
                    .all(|&p| line_of(&lab, lines, "would-deny", "x/a", p).is_some())
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    for port in [80, 81] {
        let line = line_of(&lab, &lines, "would-deny", "x/a", port).unwrap();
        assert_eq!(line["reason"], "staged_policy", "{line}");
        assert_names_the_rule(line);
    }
    for line in &lines {
        assert_ne!(line["verdict"], "denied", "nothing is enforced: {line}");
    }
    assert!(
        line_of(&lab, &lines, "would-deny", "x/c", 80).is_none(),
        "the staged Deny does not cover x/c: {lines:#?}"
    );
    // The dump names x/b's staged table beside its enforced one.
    let state = lab
        .enforcer_state_on("node-2")
        .unwrap_or_else(|e| panic!("{e:#}"));
    let b = state
        .interfaces
        .iter()
        .find(|i| i.pod == "x/b")
        .unwrap_or_else(|| panic!("x/b's interface in {state:#?}"));
    assert!(!b.audit_ingress_policy_set.is_empty(), "{b:#?}");
    assert!(!b.ingress_policy_set.is_empty(), "{b:#?}");

    // The annotation removed, nothing else: the same flows are denied.
    lab.apply(&policies(&admin_deny(false))).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "the same Admin Deny enforced",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/a", "x/b", 81, Tcp, Deny),
            ("x/c", "x/b", 80, Tcp, Allow),
        ],
    );
    finish(lab);
}
