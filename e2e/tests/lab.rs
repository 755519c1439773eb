//! The lab's own plumbing, in baseline mode (plain ptp, no Palisade
//! process), so a failure here is the lab's and not the enforcer's.

mod common;
use common::require_root;

use common::*;
use palisade_e2e::scenario::{Kind, ObjectKey};
use palisade_e2e::{Lab, LabConfig, Outcome, PodName, ProbeSpec};

fn baseline() -> Lab {
    Lab::start(LabConfig {
        with_palisade: false,
        ..LabConfig::default()
    })
    .expect("baseline lab starts")
}

#[test]
#[ignore = "needs root"]
fn pods_come_and_go_and_nothing_is_left() {
    require_root();
    // Twice in a row: the second lab must not trip over the first.
    for _ in 0..2 {
        let mut lab = baseline();
        lab.apply(&objects(PODS)).unwrap();
        assert_verdicts(
            &lab,
            "plain networking",
            &[
                ("x/a", "x/b", 80, Tcp, Allow),
                ("x/b", "x/c", 53, Udp, Allow),
                ("x/c", "x/a", 81, Tcp, Allow),
            ],
        );
        // A port nobody serves is refused: the network let it through.
        let refused = lab
            .probe(&ProbeSpec::new("x/a", "x/b", 9, Tcp).unwrap())
            .unwrap();
        assert_eq!(refused, Outcome::Refused);

        let b = PodName::parse("x/b").unwrap();
        let b_ip = lab.pod_ip(&b).unwrap();
        let b_ns = lab.pod_netns(&b).unwrap().to_string();
        assert!(!lab.host_interfaces(&b).is_empty());
        lab.delete(&[ObjectKey::pod(&b)]).unwrap();
        assert!(!palisade_e2e::netns::NetNs::exists(&b_ns));
        let gone = lab
            .probe(&ProbeSpec::new("x/a", &b_ip.to_string(), 80, Tcp).unwrap())
            .unwrap();
        assert_ne!(gone.verdict(), Some(Allow), "{gone}");
        finish(lab);
    }
}

#[test]
#[ignore = "needs root"]
fn deleting_a_namespace_takes_its_pods() {
    require_root();
    let mut lab = baseline();
    lab.apply(&objects(PODS)).unwrap();
    let ns: Vec<String> = lab
        .pods()
        .map(|p| lab.pod_netns(p).unwrap().to_string())
        .collect();
    assert_eq!(ns.len(), 3);
    lab.delete(&[ObjectKey {
        kind: Kind::Namespace,
        namespace: None,
        name: "x".into(),
    }])
    .unwrap();
    assert_eq!(lab.pods().count(), 0);
    assert!(ns.iter().all(|n| !palisade_e2e::netns::NetNs::exists(n)));
    let files: Vec<_> = std::fs::read_dir(lab.manifest_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".revision")
        .collect();
    assert!(files.is_empty(), "{files:?}");
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn bad_requests_name_the_problem() {
    require_root();
    let mut lab = baseline();
    let e = lab.apply(&policies(DENY_B)).unwrap_err().to_string();
    assert!(e.contains("namespace x does not exist"), "{e}");
    let e = lab
        .delete(&[ObjectKey::pod(&PodName::parse("x/zz").unwrap())])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Pod x/zz") && e.contains("not in the lab"),
        "{e}"
    );
    let e = lab
        .probe(&ProbeSpec::new("x/zz", "x/a", 80, Tcp).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("x/zz"), "{e}");
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn pod_manifests_carry_node_and_addresses() {
    require_root();
    let mut lab = baseline();
    lab.apply(&objects(PODS)).unwrap();
    let a = PodName::parse("x/a").unwrap();
    let text = std::fs::read_to_string(lab.manifest_dir().join("pod_x_a.json")).unwrap();
    let pod: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(pod["spec"]["nodeName"], lab.node_name());
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["podIP"], lab.pod_ip(&a).unwrap().to_string());
    assert_eq!(
        pod["status"]["podIPs"][0]["ip"],
        lab.pod_ip(&a).unwrap().to_string()
    );
    assert_eq!(pod["metadata"]["labels"]["app"], "a");
    let rev = std::fs::read_to_string(lab.manifest_dir().join(".revision")).unwrap();
    assert_eq!(rev, lab.revision().to_string());
    finish(lab);
}

#[test]
#[ignore = "needs root"]
fn a_failing_plugin_is_reported_with_its_cni_error() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let plugins = tempfile::tempdir().unwrap();
    for (name, script) in [
        (
            "ptp",
            "#!/bin/sh\ncat >/dev/null\n[ \"$CNI_COMMAND\" = DEL ] && exit 0\necho '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"no address for you\"}'\nexit 1\n",
        ),
        ("host-local", "#!/bin/sh\nexit 0\n"),
    ] {
        let path = plugins.path().join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut lab = Lab::start(LabConfig {
        with_palisade: false,
        cni_bin_dir: plugins.path().to_path_buf(),
        ..LabConfig::default()
    })
    .unwrap();
    let e = format!("{:#}", lab.apply(&objects(PODS)).unwrap_err());
    assert!(e.contains("CNI ADD of pod x/a"), "{e}");
    assert!(
        e.contains(r#""code":11"#) && e.contains("no address for you"),
        "{e}"
    );
    assert_eq!(lab.pods().count(), 0, "no half-made pod stays");
    let pod_files = std::fs::read_dir(lab.manifest_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pod_"))
        .count();
    assert_eq!(pod_files, 0);
    finish(lab);
}

/// Pod a on node-1, host-network pod h on node-2 (TCP 8081, UDP 5353),
/// and a's policy admitting only pods labelled `app: h` on TCP 80.
const HOST_NETWORK: &str = r#"
nodes: 2
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x}}
  - {apiVersion: v1, kind: Pod, metadata: {name: a, namespace: x, labels: {app: a}}, spec: {nodeName: node-1, containers: [{name: c, image: none, ports: [{containerPort: 80}, {containerPort: 53, protocol: UDP}]}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: h, namespace: x, labels: {app: h}}, spec: {nodeName: node-2, hostNetwork: true, containers: [{name: c, image: none, ports: [{containerPort: 8081}, {containerPort: 5353, protocol: UDP}]}]}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: from-h, namespace: x}
    spec:
      podSelector: {matchLabels: {app: a}}
      ingress: [{from: [{podSelector: {matchLabels: {app: h}}}], ports: [{port: 80}]}]
"#;

#[test]
#[ignore = "needs root"]
fn a_host_network_pod_is_its_node() {
    require_root();
    let mut lab = Lab::start(LabConfig {
        nodes: 2,
        ..LabConfig::default()
    })
    .expect("lab starts");
    lab.apply(&objects(HOST_NETWORK)).unwrap();
    lab.wait_realized().unwrap();
    let h = PodName::parse("x/h").unwrap();
    let node2 = lab.node_netns_of("node-2").unwrap().to_string();
    assert_eq!(lab.pod_netns(&h), Some(node2.as_str()));
    assert!(lab.host_interfaces(&h).is_empty(), "no veth");
    // Its address and its host's: node-2's, as its Node object says.
    let node = &lab.node_objects()[1];
    let address = node["status"]["addresses"][0]["address"].clone();
    assert_eq!(node["metadata"]["labels"]["kubernetes.io/os"], "linux");
    assert_eq!(
        Some(lab.pod_ip(&h).unwrap().to_string()),
        address.as_str().map(String::from)
    );
    let text = std::fs::read_to_string(lab.manifest_dir().join("pod_x_h.json")).unwrap();
    let pod: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(pod["status"]["podIP"], address);
    assert_eq!(pod["status"]["hostIP"], address);
    let text = std::fs::read_to_string(lab.manifest_dir().join("node_node-2.json")).unwrap();
    assert_eq!(
        &serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        node
    );
    assert_verdicts(
        &lab,
        "a host-network pod",
        &[
            // It serves from the node's namespace, on every protocol.
            ("x/a", "x/h", 8081, Tcp, Allow),
            ("x/a", "x/h", 5353, Udp, Allow),
            // It is no pod of a's selector: its traffic is node-2's.
            ("x/h", "x/a", 80, Tcp, Deny),
            ("x/h", "x/a", 53, Udp, Deny),
        ],
    );
    // Deleting it leaves its node as it was.
    lab.delete(&[ObjectKey::pod(&h)]).unwrap();
    lab.wait_realized().unwrap();
    assert!(palisade_e2e::netns::NetNs::exists(&node2));
    assert_eq!(lab.pod_ip(&h), None);
    finish(lab);
}
