//! Flow logs on a real lab: pods a, b, c; b isolated for ingress
//! (x/deny-b) and open to a on TCP 80 (x/allow-a-80). Real traffic, the
//! enforcer's real flow log file, and its metrics scraped over HTTP
//! (PALISADE_METRICS_ADDR with port 0, read back from its log):
//!
//! - mode deny: denied flows appear as `denied` lines naming the pod,
//!   addresses, ports, protocol, direction and policies; allowed ones never;
//! - restarted with mode all: an allowed new flow appears once per hook
//!   that judged it, with the deciding policy and rule index, and its
//!   established packets never;
//! - a flood of denied UDP datagrams yields at most burst + rate x elapsed
//!   lines and the rate-limited counter rises by the rest.

mod common;
use common::require_root;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::metrics::{get, metrics_addr, scrape};
use common::*;
use palisade_e2e::scenario::{FlowLogMode, Target};
use palisade_e2e::{Lab, LabConfig, PodName};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);
/// Events per second (and burst) for the node: low, so a flood shows it.
const RATE: u32 = 100;
const FLOOD: u32 = 5000;

fn pod(name: &str) -> PodName {
    PodName::parse(name).unwrap()
}

fn ip_of(lab: &Lab, name: &str) -> String {
    lab.pod_ip(&pod(name)).unwrap().to_string()
}

/// Does line `l` have every (field, value) of `want`?
fn matches(l: &Value, want: &[(&str, Value)]) -> bool {
    want.iter().all(|(k, v)| l.get(*k) == Some(v))
}

fn count(lines: &[Value], want: &[(&str, Value)]) -> usize {
    lines.iter().filter(|l| matches(l, want)).count()
}

fn denied_to_b(src: &str, port: u16) -> Vec<(&'static str, Value)> {
    vec![
        ("verdict", "denied".into()),
        ("pod", "x/b".into()),
        ("direction", "ingress".into()),
        ("src_ip", src.into()),
        ("dst_port", port.into()),
    ]
}

#[test]
#[ignore = "needs root"]
fn flow_logs_name_denied_and_allowed_flows_and_a_flood_is_rate_limited() {
    require_root();
    // The only test in this binary: every enforcer it starts serves metrics.
    std::env::set_var("PALISADE_METRICS_ADDR", "127.0.0.1:0");
    let mut lab = Lab::start(LabConfig {
        flow_log: Some(FlowLogMode::Deny),
        flow_log_rate: Some(RATE),
        ..LabConfig::default()
    })
    .expect("lab starts");
    lab.apply(&objects(PODS)).unwrap();
    lab.apply(&policies(DENY_B)).unwrap();
    lab.apply(&policies(ALLOW_A_80)).unwrap();
    lab.wait_realized().unwrap();
    let node = lab.node_name().to_string();
    let (a, b, c) = (ip_of(&lab, "x/a"), ip_of(&lab, "x/b"), ip_of(&lab, "x/c"));

    // ---- mode deny
    assert_verdicts(
        &lab,
        "b takes TCP 80 from a only",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/a", "x/b", 81, Tcp, Deny),
            ("x/c", "x/b", 80, Tcp, Deny),
        ],
    );
    let lines = lab
        .wait_flow_log(&node, "a -> b:81 and c -> b:80 denied", DEADLINE, |l| {
            count(l, &denied_to_b(&a, 81)) > 0 && count(l, &denied_to_b(&c, 80)) > 0
        })
        .unwrap();
    let line = lines
        .iter()
        .find(|l| matches(l, &denied_to_b(&a, 81)))
        .unwrap();
    eprintln!("denied line: {line}");
    for (k, v) in [
        ("node", Value::from(node.as_str())),
        ("reason", "policy".into()),
        ("dst_ip", b.as_str().into()),
        ("protocol", "tcp".into()),
        ("peer_pod", "x/a".into()),
    ] {
        assert_eq!(line.get(k), Some(&v), "{k} of {line}");
    }
    let policies: Vec<&str> = line["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("policies listed: {line}\n{}", lab.log_tails(30)))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        policies.contains(&"x/deny-b") && policies.contains(&"x/allow-a-80"),
        "{line}"
    );
    assert!(line["src_port"].as_u64().is_some_and(|p| p > 0), "{line}");
    assert!(
        line["time"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && t.len() == 27),
        "{line}"
    );
    assert!(line["dst_ip"]
        .as_str()
        .unwrap()
        .parse::<IpAddr>()
        .unwrap()
        .is_ipv4());
    assert_eq!(
        count(&lines, &[("verdict", "allowed".into())]),
        0,
        "mode deny logs no allowed flow: {lines:#?}"
    );

    // ---- restarted in mode all
    lab.restart_enforcer_with_flow_log(FlowLogMode::All)
        .unwrap();
    lab.wait_realized().unwrap();
    let sport = 23000 + (std::process::id() % 1000) as u16;
    let mut stream = lab
        .connect_from_port(&pod("x/a"), sport, &Target::Pod(pod("x/b")), 80, DEADLINE)
        .unwrap();
    for _ in 0..3 {
        assert!(
            palisade_e2e::probe::echo(&mut stream, DEADLINE).verdict()
                == Some(palisade_e2e::Verdict::Allow),
            "the established flow echoes"
        );
    }
    // A later denied flow: once its line is written, every line before it is.
    assert_verdicts(&lab, "marker", &[("x/c", "x/b", 81, Tcp, Deny)]);
    let lines = lab
        .wait_flow_log(&node, "the marker c -> b:81", DEADLINE, |l| {
            count(l, &denied_to_b(&c, 81)) > 0
        })
        .unwrap();
    let ingress = [
        ("verdict", Value::from("allowed")),
        ("pod", "x/b".into()),
        ("direction", "ingress".into()),
        ("src_ip", a.as_str().into()),
        ("src_port", sport.into()),
        ("dst_port", 80.into()),
    ];
    assert_eq!(
        count(&lines, &ingress),
        1,
        "one line for b's ingress: {lines:#?}"
    );
    let line = lines.iter().find(|l| matches(l, &ingress)).unwrap();
    let raw = std::fs::read_to_string(lab.flow_log_path_of(&node).unwrap()).unwrap();
    let written = raw
        .lines()
        .find(|l| l.contains(&format!("\"src_port\":{sport},")) && l.contains("\"pod\":\"x/b\""))
        .unwrap();
    eprintln!("allowed line as written: {written}");
    assert_eq!(line["reason"], "policy");
    assert_eq!(line["policy"], "x/allow-a-80");
    assert_eq!(line["rule_index"], 0);
    let egress = [
        ("verdict", Value::from("allowed")),
        ("pod", "x/a".into()),
        ("direction", "egress".into()),
        ("src_port", sport.into()),
    ];
    assert_eq!(
        count(&lines, &egress),
        1,
        "one line for a's egress: {lines:#?}"
    );
    let line = lines.iter().find(|l| matches(l, &egress)).unwrap();
    assert_eq!(line["reason"], "not_isolated");
    assert_eq!(line.get("policy"), None, "{line}");
    let _ = palisade_e2e::probe::abort(stream);

    // ---- a flood of denied datagrams
    let ns = lab.node_netns().unwrap().to_string();
    let addr = metrics_addr(&lab.log_dir().join("enforcer.log"));
    let before = scrape(Some(&ns), &addr);
    let sock = lab
        .connect_udp(&pod("x/c"), &Target::Pod(pod("x/b")), 53)
        .unwrap();
    let flood_port = sock.local_addr().unwrap().port();
    let start = Instant::now();
    let sent = (0..FLOOD).filter(|_| sock.send(b"flood").is_ok()).count() as u64;
    let elapsed = start.elapsed();
    let flood = [
        ("verdict", Value::from("denied")),
        ("src_ip", c.as_str().into()),
        ("src_port", flood_port.into()),
        ("dst_port", 53.into()),
        ("protocol", "udp".into()),
    ];
    let emitted = "palisade_flow_log_events_total";
    let limited = "palisade_flow_log_rate_limited_total";
    // Settled: every event the datapath sent since is a line in the file.
    let deadline = Instant::now() + DEADLINE;
    let (after, lines) = loop {
        let m = scrape(Some(&ns), &addr);
        let lines = lab.flow_log_lines(&node).unwrap();
        let new_events = get(&m, emitted) - get(&before, emitted);
        if get(&m, limited) > get(&before, limited)
            && count(&lines, &flood) as f64 >= new_events - 1.0
        {
            break (m, lines);
        }
        assert!(Instant::now() < deadline, "flood never settled: {m:#?}");
        std::thread::sleep(Duration::from_millis(100)); // poll: the reader and writer run on their own
    };
    let logged = count(&lines, &flood) as u64;
    let rate_limited = (get(&after, limited) - get(&before, limited)) as u64;
    let bound = u64::from(RATE) + (f64::from(RATE) * elapsed.as_secs_f64()).ceil() as u64 + 1;
    eprintln!(
        "flood: {sent} datagrams in {elapsed:?}: {logged} lines, {rate_limited} rate limited (bound {bound}); overflow {}, write dropped {}",
        get(&after, "palisade_flow_log_overflow_total"),
        get(&after, "palisade_flow_log_write_dropped_total"),
    );
    assert!(logged >= 1, "the flood's first datagrams are logged");
    assert!(
        logged <= bound,
        "{logged} lines > burst + rate x elapsed = {bound}"
    );
    assert!(
        rate_limited + logged <= sent + 2,
        "no more judged than sent: {rate_limited} + {logged} > {sent}"
    );
    assert!(
        rate_limited >= sent / 2,
        "most of the flood is rate limited: {rate_limited} of {sent}"
    );
    assert_eq!(get(&after, "palisade_flow_log_datapath_ok"), 1.0);
    finish(lab);
}
