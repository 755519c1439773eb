//! The lab's DNS with real traffic: examples/dns.yaml plays (names resolve
//! from a pod through the kube-dns Service to the server pod, a CNAME is
//! followed, an answer changes between steps, and a ClusterNetworkPolicy
//! `domainNames` rule, with no learner running, fails closed while DNS,
//! allowed by its own rule, keeps working); what a pod's own resolver
//! reads after it. tests/dns_names.rs is the same with learning.

mod common;
use common::require_root;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use palisade_e2e::scenario::Target;
use palisade_e2e::{dns, run_scenario, Lab, LabConfig, PodName, Scenario};

const TIMEOUT: Duration = Duration::from_secs(2);

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/dns.yaml")
}

fn pod(name: &str) -> PodName {
    PodName::parse(name).unwrap()
}

#[test]
fn the_example_is_valid() {
    let s = Scenario::from_file(&example()).unwrap_or_else(|e| panic!("{e:#}"));
    let d = s.dns.expect("the example has a DNS");
    assert_eq!(d.server, pod("kube-system/coredns"));
    assert_eq!(d.records.len(), 3);
    assert!(s.steps.iter().any(|step| step.dns.is_some()));
}

#[test]
fn a_name_probe_needs_the_scenarios_dns() {
    let yaml = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x}}
  - {apiVersion: v1, kind: Pod, metadata: {name: a, namespace: x}, spec: {containers: [{name: c, image: none}]}}
steps:
  - probes: [{from: x/a, to: name:api.example.com, port: 443}]
"#;
    let err = format!("{:#}", Scenario::from_yaml(yaml).unwrap_err());
    assert!(
        err.contains("name:api.example.com needs the scenario's dns"),
        "{err}"
    );
    let bad = yaml.replace("name:api.example.com", "name:a..b");
    let err = format!("{:#}", Scenario::from_yaml(&bad).unwrap_err());
    assert!(err.contains("label 1 is empty"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn names_resolve_from_pods_and_domain_rules_fail_closed() {
    require_root();
    let scenario = Scenario::from_file(&example()).expect("the example is valid");
    let mut lab = Lab::start(LabConfig::default().for_scenario(&scenario)).expect("lab starts");
    let mut out = Vec::new();
    let result = run_scenario(&mut lab, &scenario, &mut out);
    let table = String::from_utf8_lossy(&out).into_owned();
    match result {
        Ok(report) if report.passed() => {}
        Ok(report) => panic!("{}\n{table}\n{}", report.summary(), lab.log_tails(40)),
        Err(e) => panic!("{e:#}\n{table}\n{}", lab.log_tails(40)),
    }

    // What the last step's answer says, read by the pod's own resolver:
    // api.example.com is web/other now, for the record's TTL.
    let client = pod_ns(&lab, "app/client");
    let resolver = lab.dns_resolver().expect("the lab has a DNS");
    let other = lab.pod_ip(&pod("web/other")).unwrap();
    let got = dns::resolve(&client, resolver, "api.example.com", TIMEOUT).expect("resolves");
    assert_eq!(got.addrs, vec![(other, 5)]);
    let err = format!(
        "{:#}",
        dns::resolve(&client, resolver, "nowhere.example.com", TIMEOUT).unwrap_err()
    );
    assert!(err.contains("NXDOMAIN"), "{err}");

    // The dump says what the plan alone does not: the names match nothing.
    let warned = |lab: &Lab| {
        lab.enforcer_state()
            .expect("the enforcer answers")
            .warnings
            .iter()
            .any(|w| {
                w.starts_with("1 pod(s) have egress rules by domain name")
                    && w.contains("app/client (*.example.com)")
            })
    };
    assert!(!warned(&lab), "no domain rule is left after the example");
    let cnp = scenario.steps[1].apply.clone();
    lab.apply(&cnp).expect("the policy applies");
    lab.wait_realized().expect("realized");
    assert!(warned(&lab), "{:?}", lab.enforcer_state().unwrap().warnings);

    // 100 addresses for one name: an answer of 1,634 bytes, more than a
    // veth's default MTU of 1,500 (so IP fragments), through the client's
    // policy (DNS allowed by its rule): every address arrives.
    let many: Vec<Target> = (1..=100)
        .map(|i| Target::Ip(IpAddr::V4(Ipv4Addr::new(198, 51, 100, i))))
        .collect();
    let mut records = scenario.steps.last().unwrap().dns.clone().unwrap();
    records.insert(
        dns::parse_name("many.example.com").unwrap(),
        (30, dns::Answer::Addrs(many.clone())),
    );
    lab.set_dns_records(&records).expect("records");
    let got = dns::resolve(&client, resolver, "many.example.com", TIMEOUT).expect("resolves");
    let want: Vec<(IpAddr, u32)> = many
        .iter()
        .map(|t| match t {
            Target::Ip(ip) => (*ip, 30),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(got.addrs, want, "all 100, in the answer's order");

    // Through the CNAME (TTL 60) to it: the least TTL along the chain.
    let got = dns::resolve(&client, resolver, "www.example.com", TIMEOUT).expect("resolves");
    assert_eq!(got.addrs, vec![(other, 5)]);
    finish(lab);
}
