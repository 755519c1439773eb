//! Egress by domain name, enforced, with real DNS traffic and the real
//! datapath: examples/dns-names.yaml plays (the enforcers learn from the
//! lab's DNS: an address is allowed to the pod that resolved a name its
//! policy allows, on the rule's ports, from the moment the answer reaches
//! it; nothing else is).

mod common;
use common::require_root;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::pod_ns;
use palisade_e2e::scenario::{ProbeSpec, Protocol, Verdict};
use palisade_e2e::{dns, run_scenario, Lab, LabConfig, Scenario};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/dns-names.yaml")
}

#[test]
fn the_example_is_valid_and_learns() {
    let s = Scenario::from_file(&example()).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(s.dns.expect("the example has a DNS").learn);
}

#[test]
#[ignore = "needs root"]
fn a_resolved_name_opens_its_addresses_to_the_pod_that_resolved_it_only() {
    require_root();
    let scenario = Scenario::from_file(&example()).expect("the example is valid");
    let mut lab = Lab::start(LabConfig::default().for_scenario(&scenario)).expect("lab starts");
    let mut out = Vec::new();
    let result = run_scenario(&mut lab, &scenario, &mut out);
    let table = String::from_utf8_lossy(&out).into_owned();
    match result {
        Ok(report) if report.passed() => {}
        Ok(report) => panic!("{}\n{table}\n{}", report.summary(), lab.log_tails(60)),
        Err(e) => panic!("{e:#}\n{table}\n{}", lab.log_tails(60)),
    }
    // The enforcer learns: no warning that names match nothing.
    let warnings = lab.enforcer_state().expect("the enforcer answers").warnings;
    assert!(
        !warnings.iter().any(|w| w.contains("match nothing")),
        "{warnings:?}"
    );

    // A name the rule matches, for an address the client never learned.
    let mut records = scenario.dns.clone().unwrap().records;
    records.insert(
        dns::parse_name("late.example.com").unwrap(),
        (
            30,
            dns::Answer::Addrs(vec![
                palisade_e2e::scenario::Target::parse("web/other").unwrap()
            ]),
        ),
    );
    lab.set_dns_records(&records).unwrap();
    let probe = |lab: &Lab, to: &str| {
        let spec = ProbeSpec::new("app/client", to, 443, Protocol::Tcp).unwrap();
        lab.probe(&spec).unwrap().verdict()
    };

    // The enforcer killed (no clean exit): once its lease lapses, answers
    // pass unheld, so resolution works; what was learned keeps working;
    // a new name is not learned, so its address stays denied.
    let pid = lab.enforcer_pid().expect("the enforcer runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let client = pod_ns(&lab, "app/client");
    let resolver = lab.dns_resolver().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while dns::resolve(
        &client,
        resolver,
        "late.example.com",
        Duration::from_millis(500),
    )
    .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "resolution never came back without an enforcer"
        );
    }
    assert_eq!(
        probe(&lab, "name:late.example.com"),
        Some(Verdict::Deny),
        "not learned: fails closed"
    );
    assert_eq!(
        probe(&lab, "name:api.example.com"),
        Some(Verdict::Allow),
        "learned before: kept"
    );

    // A new enforcer adopts what was learned, and learns again.
    lab.restart_enforcer().expect("the enforcer restarts");
    lab.wait_realized().expect("realized");
    assert_eq!(
        probe(&lab, "name:api.example.com"),
        Some(Verdict::Allow),
        "adopted"
    );
    assert_eq!(
        probe(&lab, "name:late.example.com"),
        Some(Verdict::Allow),
        "learned by the new enforcer"
    );
}
