//! The lab's Services on their own, in baseline mode (plain ptp, no
//! Palisade process): the node's DNAT spreads a ClusterIP over its
//! backends, follows them as pods come and go, rejects a port without
//! endpoints, lets a pod reach itself through its own Service, and leaves
//! nothing behind. A failure here is the lab's, not the enforcer's.

mod common;
use common::require_root;

use std::collections::BTreeSet;

use common::*;
use palisade_e2e::scenario::{CniKind, Kind, ObjectKey};
use palisade_e2e::{Lab, LabConfig, Outcome, PodName, ProbeSpec};

const OBJECTS: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x}}
  - {apiVersion: v1, kind: Pod, metadata: {name: client, namespace: x, labels: {app: client}}, spec: {containers: [{name: c, image: none}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: web-1, namespace: x, labels: {app: web}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 8080, name: http}]}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: web-2, namespace: x, labels: {app: web}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 9090, name: http}]}]}}
  - apiVersion: v1
    kind: Service
    metadata: {name: web, namespace: x}
    spec: {clusterIP: 10.96.0.10, selector: {app: web}, ports: [{port: 80, targetPort: http}]}
  - apiVersion: v1
    kind: Service
    metadata: {name: empty, namespace: x}
    spec: {clusterIP: 10.96.0.11, selector: {app: nobody}, ports: [{port: 80}]}
"#;

fn baseline() -> Lab {
    Lab::start(LabConfig {
        with_palisade: false,
        ..LabConfig::default()
    })
    .expect("baseline lab starts")
}

/// The backends (address:port) the kernel's conntrack shows connections to
/// the ClusterIP were translated to.
fn backends_used(lab: &Lab) -> BTreeSet<String> {
    lab.kernel_conntrack()
        .unwrap()
        .iter()
        .filter(|l| l.contains("dst=10.96.0.10 "))
        .filter_map(|l| {
            // The reply tuple comes second: its source is the backend.
            let reply = l.match_indices("src=").nth(1)?.0;
            let rest = &l[reply..];
            let ip = rest.split_whitespace().next()?.strip_prefix("src=")?;
            let port = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("sport="))?;
            Some(format!("{ip}:{port}"))
        })
        .collect()
}

#[test]
#[ignore = "needs root"]
fn a_cluster_ip_spreads_over_its_backends_and_follows_them() {
    require_root();
    let mut lab = baseline();
    lab.apply(&objects(OBJECTS)).unwrap();
    let ip = |p: &str| lab.pod_ip(&PodName::parse(p).unwrap()).unwrap();
    let (web1, web2) = (ip("x/web-1"), ip("x/web-2"));
    let node = lab.node_netns().unwrap().to_string();
    assert!(
        palisade_e2e::lab::services_table_exists(Some(&format!("/run/netns/{node}"))).unwrap(),
        "the table is in the node"
    );
    // numgen random: 30 connections miss a backend with probability 2^-29.
    let many: Vec<Case> = (0..30)
        .map(|_| ("x/client", "svc/x/web", 80, Tcp, Allow))
        .collect();
    assert_verdicts(&lab, "through the ClusterIP", &many);
    let used = backends_used(&lab);
    // A named targetPort resolves per pod.
    let want: BTreeSet<String> = [format!("{web1}:8080"), format!("{web2}:9090")].into();
    assert_eq!(used, want, "{:#?}", lab.kernel_conntrack().unwrap());

    // The generated EndpointSlice lists both, as the EndpointSlice
    // controller's would.
    let slice = |lab: &Lab| -> serde_json::Value {
        let text = std::fs::read_to_string(lab.manifest_dir().join("endpointslice_x_web-lab.json"))
            .unwrap();
        serde_json::from_str(&text).unwrap()
    };
    assert_eq!(slice(&lab)["endpoints"].as_array().unwrap().len(), 2);

    lab.delete(&[ObjectKey::pod(&PodName::parse("x/web-1").unwrap())])
        .unwrap();
    let ruleset = lab.services_ruleset().unwrap();
    assert!(!ruleset.contains(&web1.to_string()), "{ruleset}");
    assert!(
        ruleset.contains(&format!("dnat to {web2}:9090")),
        "{ruleset}"
    );
    assert_eq!(slice(&lab)["endpoints"].as_array().unwrap().len(), 1);
    assert_verdicts(
        &lab,
        "one backend left",
        &[("x/client", "svc/x/web", 80, Tcp, Allow)],
    );
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn a_port_without_endpoints_is_rejected_and_a_pod_reaches_itself() {
    require_root();
    let mut lab = baseline();
    lab.apply(&objects(OBJECTS)).unwrap();
    let refused = lab
        .probe(&ProbeSpec::new("x/client", "svc/x/empty", 80, Tcp).unwrap())
        .unwrap();
    assert_eq!(
        refused,
        Outcome::Refused,
        "kube-proxy rejects: no endpoints"
    );
    // Hairpin: web-1 through its own Service, until the random pick lands
    // on itself at least once (masqueraded, or its reply would be martian).
    let many: Vec<Case> = (0..20)
        .map(|_| ("x/web-1", "svc/x/web", 80, Tcp, Allow))
        .collect();
    assert_verdicts(&lab, "hairpin", &many);
    let web1 = lab.pod_ip(&PodName::parse("x/web-1").unwrap()).unwrap();
    let lines = lab.kernel_conntrack().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("src={web1} dst=10.96.0.10 "))
                && l.contains(&format!("src={web1} dst=10.244.0.1 "))),
        "no hairpin connection masqueraded to the node: {lines:#?}"
    );
    // Deleting the Service takes its translation away.
    lab.delete(&[ObjectKey {
        kind: Kind::Service,
        namespace: Some("x".into()),
        name: "web".into(),
    }])
    .unwrap();
    assert!(!lab.services_ruleset().unwrap().contains("10.96.0.10 "));
    assert!(!lab
        .manifest_dir()
        .join("endpointslice_x_web-lab.json")
        .exists());
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn services_are_refused_with_the_bridge_chain() {
    require_root();
    let mut lab = Lab::start(LabConfig {
        with_palisade: false,
        cni: CniKind::Bridge,
        ..LabConfig::default()
    })
    .unwrap();
    let e = format!("{:#}", lab.apply(&objects(OBJECTS)).unwrap_err());
    assert!(e.contains("cni: ptp") && e.contains("br_netfilter"), "{e}");
    finish(lab);
}

/// Services without `clusterIP`, as users write them: the lab allocates one
/// from its Service range as the API server does, around the addresses
/// other Services name, and keeps it for the Service's life.
#[test]
#[ignore = "needs root"]
fn services_without_a_cluster_ip_get_one_that_stays() {
    require_root();
    const ALLOCATED: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x}}
  - {apiVersion: v1, kind: Pod, metadata: {name: client, namespace: x, labels: {app: client}}, spec: {containers: [{name: c, image: none}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: web-1, namespace: x, labels: {app: web}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 8080, name: http}]}]}}
  - {apiVersion: v1, kind: Service, metadata: {name: web, namespace: x}, spec: {selector: {app: web}, ports: [{port: 80, targetPort: http}]}}
  # The address the allocator would hand out first, named by hand.
  - {apiVersion: v1, kind: Service, metadata: {name: fixed, namespace: x}, spec: {clusterIP: 10.96.1.1, selector: {app: web}, ports: [{port: 80, targetPort: http}]}}
"#;
    let mut lab = baseline();
    let all = objects(ALLOCATED);
    lab.apply(&all).unwrap();
    let web = palisade_e2e::scenario::ServiceRef {
        namespace: "x".into(),
        name: "web".into(),
    };
    let ip = lab.cluster_ip(&web).unwrap();
    assert_eq!(
        ip.to_string(),
        "10.96.1.2",
        "the first free address above the static band"
    );
    let body = lab.object(&web.key()).unwrap().body().clone();
    assert_eq!(body["spec"]["clusterIPs"], serde_json::json!(["10.96.1.2"]));
    assert_verdicts(
        &lab,
        "through the allocated ClusterIP",
        &[("x/client", "svc/x/web", 80, Tcp, Allow)],
    );

    // Applied again as written (no clusterIP): the same address.
    let web_again: Vec<_> = all
        .iter()
        .filter(|o| o.key() == &web.key())
        .cloned()
        .collect();
    lab.apply(&web_again).unwrap();
    assert_eq!(lab.cluster_ip(&web).unwrap(), ip);
    // Another Service gets another address.
    let other = objects(&ALLOCATED.replace(
        "name: web, namespace: x}, spec: {selector",
        "name: other, namespace: x}, spec: {selector",
    ));
    lab.apply(&other[3..4]).unwrap();
    let other_ref = palisade_e2e::scenario::ServiceRef {
        namespace: "x".into(),
        name: "other".into(),
    };
    assert_eq!(lab.cluster_ip(&other_ref).unwrap().to_string(), "10.96.1.3");
    // Naming another address for web is refused, as is taking web's.
    let moved = objects(&ALLOCATED.replace(
        "spec: {selector: {app: web}, ports",
        "spec: {clusterIP: 10.96.0.50, selector: {app: web}, ports",
    ));
    let e = format!("{:#}", lab.apply(&moved[3..4]).unwrap_err());
    assert!(e.contains("spec.clusterIP: field is immutable"), "{e}");
    let taken = objects(&ALLOCATED.replace(
        "name: fixed, namespace: x}, spec: {clusterIP: 10.96.1.1",
        "name: thief, namespace: x}, spec: {clusterIP: 10.96.1.2",
    ));
    let e = format!("{:#}", lab.apply(&taken[4..5]).unwrap_err());
    assert!(e.contains("clusterIP 10.96.1.2 is already"), "{e}");
    assert_eq!(lab.cluster_ip(&web).unwrap(), ip);
    finish(lab);
}
