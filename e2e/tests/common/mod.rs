//! Helpers shared by the end-to-end tests: they need root and the workspace
//! binaries (`cargo build --bins`) next to the test executable's directory.

#![allow(dead_code, unused_imports)]

pub mod metrics;

use palisade_e2e::{Lab, LabConfig, Object, ProbeSpec, Protocol, Scenario, Verdict};

pub use palisade_e2e::Protocol::{Tcp, Udp};
pub use palisade_e2e::Verdict::{Allow, Deny};

/// Namespace x with pods a, b and c, each serving TCP 80 and 81 and UDP 53.
pub const PODS: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - {apiVersion: v1, kind: Pod, metadata: {name: a, namespace: x, labels: {app: a}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 80}, {containerPort: 81}, {containerPort: 53, protocol: UDP}]}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: b, namespace: x, labels: {app: b}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 80}, {containerPort: 81}, {containerPort: 53, protocol: UDP}]}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: c, namespace: x, labels: {app: c}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 80}, {containerPort: 81}, {containerPort: 53, protocol: UDP}]}]}}
"#;

pub const DENY_B: &str = r#"
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: x, labels: {ns: x}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: deny-b, namespace: x}
    spec: {podSelector: {matchLabels: {app: b}}, policyTypes: [Ingress]}
"#;

pub const ALLOW_A_80: &str = r#"
objects:
  - apiVersion: v1
    kind: Namespace
    metadata: {name: x, labels: {ns: x}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: allow-a-80, namespace: x}
    spec:
      podSelector: {matchLabels: {app: b}}
      policyTypes: [Ingress]
      ingress:
        - from: [{podSelector: {matchLabels: {app: a}}}]
          ports: [{protocol: TCP, port: 80}]
"#;

/// The objects of a `objects:` YAML document, minus the Namespace x that
/// the policy snippets declare only so that they validate on their own.
pub fn objects(yaml: &str) -> Vec<Object> {
    Scenario::from_yaml(yaml)
        .expect("test YAML is valid")
        .objects
}

pub fn policies(yaml: &str) -> Vec<Object> {
    objects(yaml)
        .into_iter()
        .filter(|o| o.key().kind != palisade_e2e::scenario::Kind::Namespace)
        .collect()
}

/// Every lab test starts with this and is marked `#[ignore = "needs root"]`
/// (the workspace's one convention: `palisade-test-support`).
pub use palisade_test_support::require_root;

/// A lab with pods a, b, c in namespace x, realized.
pub fn lab_with_pods() -> Lab {
    lab_with_pods_in(LabConfig::default())
}

/// [`lab_with_pods`] with a lab configured otherwise.
#[allow(dead_code)] // not every test binary configures its lab
pub fn lab_with_pods_in(config: LabConfig) -> Lab {
    let mut lab = Lab::start(config).expect("lab starts");
    lab.apply(&objects(PODS)).expect("pods are created");
    lab.wait_realized().expect("pods are realized");
    lab
}

pub type Case = (&'static str, &'static str, u16, Protocol, Verdict);

/// Probes every case concurrently and fails with the full list of mismatches.
pub fn assert_verdicts(lab: &Lab, what: &str, cases: &[Case]) {
    let specs: Vec<ProbeSpec> = cases
        .iter()
        .map(|(from, to, port, proto, want)| {
            ProbeSpec::new(from, to, *port, *proto)
                .unwrap()
                .expect(*want)
        })
        .collect();
    let outcomes = lab.probe_all(&specs).expect("probes run");
    let wrong: Vec<String> = specs
        .iter()
        .zip(&outcomes)
        .filter(|(s, o)| o.verdict() != s.expect)
        .map(|(s, o)| {
            format!(
                "{} -> {} {}/{}: expected {}, got {o}",
                s.from,
                s.to,
                s.port,
                s.protocol,
                s.expect.unwrap()
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}:\n  {}\n{}",
        wrong.join("\n  "),
        lab.log_tails(30)
    );
}

/// Shuts the lab down and checks that nothing it made is left.
pub fn finish(lab: Lab) {
    let footprint = lab.footprint();
    assert!(!footprint.netns.is_empty());
    lab.shutdown().expect("clean shutdown");
    let left = footprint.remaining();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The network namespace of lab pod `name` (`ns/pod`).
#[allow(dead_code)] // not every test binary opens sockets in pods
pub fn pod_ns(lab: &Lab, name: &str) -> palisade_e2e::netns::NetNs {
    let pod = palisade_e2e::PodName::parse(name).unwrap();
    palisade_e2e::netns::NetNs::from_existing(lab.pod_netns(&pod).unwrap())
}

/// The IPv4 address of lab pod `name`.
#[allow(dead_code)] // not every test binary opens sockets in pods
pub fn pod_ipv4(lab: &Lab, name: &str) -> std::net::Ipv4Addr {
    match lab.pod_ip(&palisade_e2e::PodName::parse(name).unwrap()) {
        Some(std::net::IpAddr::V4(ip)) => ip,
        other => panic!("{name} has no IPv4 address: {other:?}"),
    }
}
