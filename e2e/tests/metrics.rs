//! Both live processes serve /metrics (`--metrics-addr`, here through its
//! PALISADE_METRICS_ADDR variable with port 0, read back from each log),
//! scraped with a real HTTP client while real traffic runs: the enforcer's
//! realized version equals the controller's plan version for the node, the
//! policy is realized on its one node, every pod up was timed, and denied
//! and allowed probes move the verdict counters.

mod common;
use common::require_root;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::metrics::{get, metrics_addr, scrape};
use common::*;

const DEADLINE: Duration = Duration::from_secs(30);

fn scrape_until(
    ns: Option<&str>,
    addr: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let m = scrape(ns, addr);
        if done(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "{what}: {m:#?}");
        std::thread::sleep(Duration::from_millis(100)); // poll: reports and scans run on their own schedule
    }
}

#[test]
#[ignore = "needs root"]
fn both_processes_serve_metrics_that_follow_plans_and_traffic() {
    require_root();
    // The only test in this binary: the variable reaches both processes,
    // and port 0 lets each bind its own.
    std::env::set_var("PALISADE_METRICS_ADDR", "127.0.0.1:0");
    let mut lab = lab_with_pods();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.wait_realized().unwrap();
    let controller = metrics_addr(&lab.log_dir().join("controller.log"));
    let enforcer = metrics_addr(&lab.log_dir().join("enforcer.log"));
    let node = lab.node_name().to_string();
    let node_ns = lab.node_netns().map(str::to_string);
    let ns = node_ns.as_deref();
    let fabric_ns = lab.fabric_netns().map(str::to_string);

    let plan_key = format!("palisade_controller_node_plan_version{{node=\"{node}\"}}");
    let c = scrape_until(
        fabric_ns.as_deref(),
        &controller,
        "the node realized its plan",
        |m| {
            m.get(&format!(
                "palisade_controller_node_realized{{node=\"{node}\"}}"
            )) == Some(&1.0)
        },
    );
    assert_eq!(
        get(
            &c,
            "palisade_controller_policy_realized_nodes{policy=\"x/deny-b\"}"
        ),
        1.0
    );
    assert_eq!(get(&c, "palisade_controller_nodes_connected"), 1.0);
    let e = scrape_until(
        ns,
        &enforcer,
        "the enforcer realized the plan version",
        |m| m.get("palisade_enforcer_realized_version") == Some(&get(&c, &plan_key)),
    );
    assert_eq!(
        get(&e, "palisade_enforcer_scrape_ok{part=\"datapath\"}"),
        1.0
    );
    assert!(get(&e, "palisade_enforcer_pod_up_duration_seconds_count") >= 3.0);
    assert!(get(&e, "palisade_enforcer_map_entries{map=\"pal_ep_index\"}") >= 3.0);

    let verdicts = |direction: &str, verdict: &str, reason: &str| {
        format!(
            "palisade_enforcer_verdicts_total{{direction=\"{direction}\",verdict=\"{verdict}\",reason=\"{reason}\"}}"
        )
    };
    // b's ingress denies a; a's egress and c's ingress are open.
    let denied = verdicts("ingress", "denied", "policy");
    let allowed_in = verdicts("ingress", "allowed", "not_isolated");
    let allowed_out = verdicts("egress", "allowed", "not_isolated");
    let denied_out = verdicts("egress", "denied", "policy");
    let before = (
        get(&e, &denied),
        get(&e, &allowed_in),
        get(&e, &allowed_out),
        get(&e, &denied_out),
    );
    assert_verdicts(
        &lab,
        "b denies ingress, c is open",
        &[
            ("x/a", "x/b", 80, Tcp, Deny),
            ("x/a", "x/c", 80, Tcp, Allow),
        ],
    );
    let after = scrape(ns, &enforcer);
    assert!(
        get(&after, &denied) > before.0,
        "denied SYNs are counted on b's ingress"
    );
    assert!(
        get(&after, &allowed_in) > before.1,
        "packets to c are counted on its ingress"
    );
    assert!(
        get(&after, &allowed_out) > before.2,
        "a's packets are counted on its egress"
    );
    assert_eq!(
        get(&after, &denied_out),
        before.3,
        "no pod is isolated for egress"
    );
    lab.shutdown().unwrap();
}
