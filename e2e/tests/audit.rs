//! Staged (audit) policies in a real lab: a default-deny ingress policy on
//! x/b annotated `palisade.io/audit: "true"` is evaluated but not enforced —
//! traffic to x/b still flows, and the node counts every new flow to x/b it
//! would deny (scraped from the enforcer's /metrics,
//! `palisade_audit_flows_total`) and logs a would-deny line naming the
//! policy for each, and none for flows between other pods; removing the
//! annotation enforces it with no other change, and the same flows are
//! denied and no longer logged.

mod common;
use common::require_root;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::metrics::{get, metrics_addr, scrape};
use common::*;
use palisade_e2e::{LabConfig, Protocol};

const DEADLINE: Duration = Duration::from_secs(30);

const STAGED_DENY_B: &str = r#"
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: x, labels: {ns: x}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata:
      name: deny-b
      namespace: x
      annotations: {palisade.io/audit: "true"}
    spec: {podSelector: {matchLabels: {app: b}}, policyTypes: [Ingress]}
"#;

const WOULD_DENY_INGRESS: &str = "palisade_audit_flows_total{direction=\"ingress\",would=\"deny\"}";
const WOULD_DENY_EGRESS: &str = "palisade_audit_flows_total{direction=\"egress\",would=\"deny\"}";
const WOULD_ALLOW_INGRESS: &str =
    "palisade_audit_flows_total{direction=\"ingress\",would=\"allow\"}";
const WOULD_ALLOW_EGRESS: &str = "palisade_audit_flows_total{direction=\"egress\",would=\"allow\"}";

/// The enforcer's audit counters, scraped from inside its node's namespace.
struct Counters {
    ns: Option<String>,
    addr: String,
}

impl Counters {
    fn read(&self) -> BTreeMap<String, f64> {
        let all = scrape(self.ns.as_deref(), &self.addr);
        assert_eq!(
            all.get("palisade_audit_scrape_ok"),
            Some(&1.0),
            "the audit counters could not be read"
        );
        all.into_iter()
            .filter(|(k, _)| k.starts_with("palisade_audit_flows_total"))
            .collect()
    }

    /// Waits until the counters say `done` (they are read from the maps at
    /// scrape time, so this settles at once unless something is wrong).
    fn until(
        &self,
        what: &str,
        done: impl Fn(&BTreeMap<String, f64>) -> bool,
    ) -> BTreeMap<String, f64> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let m = self.read();
            if done(&m) {
                return m;
            }
            assert!(Instant::now() < deadline, "{what}: {m:#?}");
            std::thread::sleep(Duration::from_millis(100)); // poll: a scrape reads the counters as they are
        }
    }
}

/// The flow log lines between two pods' addresses.
fn pod_lines(lab: &palisade_e2e::Lab, lines: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let ips: Vec<String> = lab.pod_ips().values().map(|ip| ip.to_string()).collect();
    let is_pod = |v: &serde_json::Value| v.as_str().is_some_and(|a| ips.iter().any(|ip| ip == a));
    lines
        .iter()
        .filter(|l| is_pod(&l["src_ip"]) && is_pod(&l["dst_ip"]))
        .cloned()
        .collect()
}

/// The would-deny line of a flow from `src` to x/b on `port`, if logged.
fn would_deny_line<'l>(
    lab: &palisade_e2e::Lab,
    lines: &'l [serde_json::Value],
    src: &str,
    port: u16,
    proto: Protocol,
) -> Option<&'l serde_json::Value> {
    let pod = |n: &str| palisade_e2e::PodName::parse(n).unwrap();
    let src_ip = lab.pod_ip(&pod(src))?.to_string();
    let dst_ip = lab.pod_ip(&pod("x/b"))?.to_string();
    let protocol = match proto {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        _ => "sctp",
    };
    lines.iter().find(|l| {
        l["verdict"] == "would-deny"
            && l["src_ip"] == src_ip.as_str()
            && l["dst_ip"] == dst_ip.as_str()
            && l["dst_port"] == port
            && l["protocol"] == protocol
    })
}

#[test]
#[ignore = "needs root"]
fn a_staged_deny_is_counted_not_enforced_until_the_annotation_goes() {
    require_root();
    // The only test in this binary: the variable reaches the enforcer, and
    // port 0 lets it bind its own.
    std::env::set_var("PALISADE_METRICS_ADDR", "127.0.0.1:0");
    // Flow log mode off: staged verdicts are logged in every mode.
    let pod = |n: &str| palisade_e2e::PodName::parse(n).unwrap();
    let mut lab = lab_with_pods_in(LabConfig {
        flow_log: Some(palisade_e2e::scenario::FlowLogMode::Off),
        ..LabConfig::default()
    });
    let counters = Counters {
        ns: lab.node_netns().map(str::to_string),
        addr: metrics_addr(&lab.log_dir().join("enforcer.log")),
    };
    assert_verdicts(
        &lab,
        "no policy",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/c", "x/b", 81, Tcp, Allow),
        ],
    );
    let before = counters.read();
    assert_eq!(
        before.values().sum::<f64>(),
        0.0,
        "nothing staged yet: {before:#?}"
    );

    // Staged: traffic to x/b still flows, each new flow to it is counted.
    lab.apply(&policies(STAGED_DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "x/a and x/c to x/c: nothing staged there",
        &[
            ("x/a", "x/c", 80, Tcp, Allow),
            ("x/b", "x/a", 80, Tcp, Allow),
        ],
    );
    // Counted by the flow log, not the counters: the node's own IPv6
    // multicast listener reports to x/b (from ::, behind a hop-by-hop
    // header) are would-deny too, truly, and come when they please.
    let node = lab.node_of(&pod("x/b")).unwrap().to_string();
    let quiet = pod_lines(&lab, &lab.flow_log_lines(&node).unwrap());
    assert!(
        quiet.is_empty(),
        "flows to or from pods nothing stages are not logged: {quiet:#?}"
    );
    let cases = [
        ("x/a", "x/b", 80, Tcp, Allow),
        ("x/c", "x/b", 81, Tcp, Allow),
        ("x/a", "x/b", 53, Udp, Allow),
    ];
    assert_verdicts(&lab, "staged deny: still allowed", &cases);
    let staged = counters.until("a would-deny per new flow to x/b", |m| {
        m.get(WOULD_DENY_INGRESS)
            .is_some_and(|n| *n >= cases.len() as f64)
    });
    assert_eq!(
        get(&staged, WOULD_DENY_EGRESS),
        0.0,
        "x/b's egress is not staged"
    );
    assert_eq!(get(&staged, WOULD_ALLOW_INGRESS), 0.0);
    assert_eq!(get(&staged, WOULD_ALLOW_EGRESS), 0.0);
    // Each case has its would-deny line, naming the staged policy.
    let lines = lab
        .wait_flow_log(&node, "a would-deny line per case", DEADLINE, |lines| {
            cases.iter().all(|&(src, _, port, proto, _)| {
                would_deny_line(&lab, lines, src, port, proto).is_some()
            })
        })
        .unwrap();
    for line in &lines {
        assert_ne!(line["verdict"], "denied", "nothing is enforced: {line}");
        if line["verdict"] == "would-deny" {
            assert_eq!(line["pod"], "x/b", "{line}");
            assert_eq!(line["direction"], "ingress", "{line}");
            assert_eq!(line["reason"], "staged_policy", "{line}");
            assert_eq!(line["policies"], serde_json::json!(["x/deny-b"]), "{line}");
        }
    }
    // The baseline for "no longer audited", read once every case's line is
    // in: a probe's later packets may still have been logged after.
    let staged = pod_lines(&lab, &lab.flow_log_lines(&node).unwrap()).len();
    let state = lab.enforcer_state().unwrap();
    assert!(
        state.state.as_ref().is_none_or(|s| s.errors.is_empty()),
        "no audit error: {state:#?}"
    );
    // The dump names x/b's staged table, and nothing enforced on it.
    let b = state
        .interfaces
        .iter()
        .find(|i| i.pod == "x/b")
        .unwrap_or_else(|| panic!("x/b's interface in {state:#?}"));
    assert!(!b.audit_ingress_policy_set.is_empty(), "{b:#?}");
    assert!(b.ingress_policy_set.is_empty(), "{b:#?}");
    assert!(b.audit_egress_policy_set.is_empty(), "{b:#?}");

    // The annotation removed, nothing else: the same flows are denied, and
    // no longer audited.
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    assert_verdicts(
        &lab,
        "the same policy enforced",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/c", "x/b", 81, Tcp, Deny),
            ("x/a", "x/b", 53, Udp, Deny),
            ("x/b", "x/a", 80, Tcp, Allow),
        ],
    );
    let after = pod_lines(&lab, &lab.flow_log_lines(&node).unwrap());
    assert_eq!(
        after.len(),
        staged,
        "enforced, not audited any more: {after:#?}"
    );
    finish(lab);
}
