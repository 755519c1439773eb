//! The model's reading of ClusterNetworkPolicy tiers, rule by rule: the
//! verdict (`allowed`, `egress_to_service_allowed`) and explain's answer
//! for each, on small clusters built here.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_apis::{wire, Action, ClusterNetworkPolicy, Tier};
use palisade_model::cluster::{ClusterState, Object};
use palisade_model::explain::{
    explain, staged_tier_change, Decided, Decision, Peer, Query, TierRule,
};
use palisade_model::tiers::Mode;
use palisade_model::verdict::{
    allowed, allowed_in, egress_to_service_allowed, egress_to_service_allowed_in, Direction,
    Endpoint,
};
use serde_json::{json, Value};

fn ns(name: &str, house: &str) -> Object {
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"house": house}}
    }))
    .unwrap();
    Object::Namespace(ns)
}

/// A pod on `node` serving TCP 80 as "web" and UDP 53 as "dns".
fn pod(ns: &str, name: &str, node: &str, ip: &str) -> Object {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "ports": [
            {"name": "web", "containerPort": 80},
            {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
        "status": {"podIP": ip}
    }))
    .unwrap();
    Object::Pod(pod)
}

/// A host-network pod: its address is its node's.
fn host_pod(ns: &str, name: &str, node: &str, ip: &str) -> Object {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node, "hostNetwork": true, "containers": [{"name": "c", "image": "i",
            "ports": [{"name": "web", "containerPort": 8443}]}]},
        "status": {"podIP": ip, "hostIP": ip}
    }))
    .unwrap();
    Object::Pod(pod)
}

fn node(name: &str, ip: &str, os: &str) -> Object {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/os": os}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                 {"type": "Hostname", "address": name}]}
    }))
    .unwrap();
    Object::Node(node)
}

fn cnp(name: &str, spec: Value) -> Object {
    cnp_with(name, json!({}), spec)
}

fn cnp_with(name: &str, annotations: Value, spec: Value) -> Object {
    let o: wire::UpstreamClusterNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": wire::UPSTREAM_API_VERSION, "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap();
    Object::ClusterNetworkPolicy(ClusterNetworkPolicy::from_upstream(&o))
}

fn np(ns: &str, name: &str, spec: Value) -> Object {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns}, "spec": spec
    }))
    .unwrap();
    Object::NetworkPolicy(np)
}

fn ns_sel(house: &str) -> Value {
    json!({"matchLabels": {"house": house}})
}

/// Namespaces red (pods r1 on n1, r2 on n2) and blue (b1 on n1, b2 on n2),
/// nodes n1 and n2, and a host-network pod h2 on n2.
fn base() -> Vec<Object> {
    vec![
        ns("red", "red"),
        ns("blue", "blue"),
        ns("infra", "infra"),
        pod("red", "r1", "n1", "10.0.1.1"),
        pod("red", "r2", "n2", "10.0.2.1"),
        pod("blue", "b1", "n1", "10.0.1.2"),
        pod("blue", "b2", "n2", "10.0.2.2"),
        host_pod("infra", "h2", "n2", "192.168.0.2"),
        node("n1", "192.168.0.1", "linux"),
        node("n2", "192.168.0.2", "linux"),
    ]
}

fn cluster(extra: Vec<Object>) -> ClusterState {
    let mut objects = base();
    objects.extend(extra);
    ClusterState::from_objects(objects, "t".into())
}

fn find<'a>(c: &'a ClusterState, name: &str) -> Endpoint<'a> {
    let pod = c
        .pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no pod {name}"));
    let ip: IpAddr = pod
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    Endpoint { pod, ip }
}

/// Whether `from` may reach `to` on protocol/port, checked against
/// explain's two directions on the way.
fn ok(c: &ClusterState, from: &str, to: &str, protocol: &str, port: u16) -> bool {
    ok_in(c, Mode::Standard, from, to, protocol, port)
}

fn ok_in(c: &ClusterState, mode: Mode, from: &str, to: &str, protocol: &str, port: u16) -> bool {
    let (s, d) = (find(c, from), find(c, to));
    let verdict = allowed_in(c, mode, s, d, protocol, port);
    let egress = ask(c, mode, from, to, protocol, port, Direction::Egress);
    let ingress = ask(c, mode, from, to, protocol, port, Direction::Ingress);
    assert_eq!(
        verdict,
        egress.allowed() && ingress.allowed(),
        "{from} -> {to} {protocol}/{port}: egress {egress:?}, ingress {ingress:?}"
    );
    verdict
}

fn ask(
    c: &ClusterState,
    mode: Mode,
    from: &str,
    to: &str,
    protocol: &str,
    port: u16,
    dir: Direction,
) -> palisade_model::explain::Explanation {
    let (s, d) = (find(c, from), find(c, to));
    let (subject, peer) = match dir {
        Direction::Egress => (s.pod, Peer::Pod(d)),
        Direction::Ingress => (d.pod, Peer::Pod(s)),
    };
    explain(
        c,
        mode,
        &Query {
            subject,
            peer,
            server: Some(d.pod),
            protocol,
            port,
            dir,
        },
    )
}

fn rule_of(e: &palisade_model::explain::Explanation) -> &TierRule {
    match &e.decided {
        Decided::Rule(r) => r,
        other => panic!("decided by {other:?}, not a tier rule"),
    }
}

#[test]
fn admin_decides_before_network_policy_and_baseline_after() {
    // NetworkPolicy in red allows ingress from red only.
    let np_red = np(
        "red",
        "red-only",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
    );
    let admin = |action: &str| {
        cnp(
            "admin",
            json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
                   "ingress": [{"action": action, "from": [{"namespaces": ns_sel("blue")}]}]}),
        )
    };
    let baseline = cnp(
        "baseline",
        json!({"tier": "Baseline", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
    );
    // Admin Accept overrides the NetworkPolicy's isolation.
    let c = cluster(vec![np_red.clone(), admin("Accept")]);
    assert!(ok(&c, "b1", "r2", "TCP", 80));
    // Admin Deny overrides what the NetworkPolicy allows.
    let c = cluster(vec![
        np("red", "all", json!({"podSelector": {}, "ingress": [{}]})),
        admin("Deny"),
    ]);
    assert!(!ok(&c, "b1", "r2", "TCP", 80));
    assert!(ok(&c, "r1", "r2", "TCP", 80), "red is not blue");
    // Admin Pass: the NetworkPolicy decides; the Baseline is never reached.
    let c = cluster(vec![np_red.clone(), admin("Pass"), baseline.clone()]);
    assert!(!ok(&c, "b1", "r2", "TCP", 80));
    assert!(ok(&c, "r1", "r2", "TCP", 80), "NetworkPolicy allows red");
    let e = ask(
        &c,
        Mode::Standard,
        "b1",
        "r2",
        "TCP",
        80,
        Direction::Ingress,
    );
    assert_eq!(e.passed.len(), 1);
    assert_eq!(e.passed[0].policy, "ClusterNetworkPolicy/admin");
    assert_eq!(
        e.decided,
        Decided::NetworkPolicy(Decision::Denied {
            isolated_by: vec!["red/red-only".into()]
        })
    );
    // Admin Pass, no NetworkPolicy: the Baseline decides.
    let c = cluster(vec![admin("Pass"), baseline.clone()]);
    assert!(!ok(&c, "b1", "r2", "TCP", 80));
    let e = ask(
        &c,
        Mode::Standard,
        "b1",
        "r2",
        "TCP",
        80,
        Direction::Ingress,
    );
    assert_eq!(e.passed[0].tier, Tier::Admin);
    let r = rule_of(&e);
    assert_eq!(
        (r.tier, r.policy.as_str(), r.action),
        (
            Tier::Baseline,
            "ClusterNetworkPolicy/baseline",
            Action::Deny
        )
    );
    // A NetworkPolicy that isolates the pod hides the Baseline entirely.
    let c = cluster(vec![
        np("red", "all", json!({"podSelector": {}, "ingress": [{}]})),
        baseline,
    ]);
    assert!(ok(&c, "b1", "r2", "TCP", 80));
}

#[test]
fn baseline_pass_and_no_match_fall_to_the_default_which_strict_mode_denies() {
    let c = cluster(vec![cnp(
        "b",
        json!({"tier": "Baseline", "priority": 5, "subject": {"namespaces": ns_sel("red")},
               "egress": [{"action": "Pass", "to": [{"namespaces": ns_sel("blue")}]},
                          {"action": "Deny", "to": [{"namespaces": {}}]}]}),
    )]);
    assert!(ok(&c, "r1", "b2", "TCP", 80), "Pass: the default allows");
    let e = ask(&c, Mode::Standard, "r1", "b2", "TCP", 80, Direction::Egress);
    assert_eq!(e.passed.len(), 1);
    assert_eq!(e.decided, Decided::Default { allowed: true });
    assert!(!ok(&c, "r1", "r2", "TCP", 80), "the Deny after it");
    // Strict mode: what no tier decides is denied, in both directions.
    assert!(!ok_in(&c, Mode::Strict, "r1", "b2", "TCP", 80));
    assert!(!ok_in(&c, Mode::Strict, "b1", "b2", "TCP", 80));
    let e = ask(&c, Mode::Strict, "b1", "b2", "TCP", 80, Direction::Egress);
    assert_eq!(e.decided, Decided::Default { allowed: false });
    // An Accept in strict mode allows; the other side must allow too.
    let c = cluster(vec![cnp(
        "a",
        json!({"tier": "Admin", "priority": 5, "subject": {"namespaces": {}},
                   "egress": [{"action": "Accept", "to": [{"namespaces": ns_sel("blue")}]}],
                   "ingress": [{"action": "Accept", "from": [{"namespaces": ns_sel("red")}]}]}),
    )]);
    assert!(ok_in(&c, Mode::Strict, "r1", "b2", "TCP", 80));
    assert!(!ok_in(&c, Mode::Strict, "b1", "r2", "TCP", 80));
}

#[test]
fn rules_decide_in_order_and_policies_by_priority_then_name() {
    let two_rules = |first: &str, second: &str| {
        cnp(
            "p",
            json!({"tier": "Admin", "priority": 10, "subject": {"namespaces": ns_sel("red")},
                   "ingress": [{"name": "one", "action": first, "from": [{"namespaces": ns_sel("blue")}]},
                               {"name": "two", "action": second, "from": [{"namespaces": ns_sel("blue")}]}]}),
        )
    };
    let c = cluster(vec![two_rules("Accept", "Deny")]);
    assert!(ok(&c, "b1", "r1", "TCP", 80));
    let c = cluster(vec![two_rules("Deny", "Accept")]);
    assert!(!ok(&c, "b1", "r1", "TCP", 80));
    let e = ask(
        &c,
        Mode::Standard,
        "b1",
        "r1",
        "TCP",
        80,
        Direction::Ingress,
    );
    let r = rule_of(&e);
    assert_eq!(
        (r.rule, r.name.as_str(), r.priority),
        (0, "one", 10),
        "{r:?}"
    );
    assert_eq!(
        r.description,
        "ingress[0] \"one\": Deny from namespaces{house=blue} on any port"
    );
    // A lower priority value first, whatever the names.
    let deny = |name: &str, priority: u32, action: &str| {
        cnp(
            name,
            json!({"tier": "Admin", "priority": priority, "subject": {"namespaces": ns_sel("red")},
                   "ingress": [{"action": action, "from": [{"namespaces": {}}]}]}),
        )
    };
    let c = cluster(vec![deny("a", 20, "Deny"), deny("z", 10, "Accept")]);
    assert!(ok(&c, "b1", "r1", "TCP", 80));
    // Equal priorities: by name.
    let c = cluster(vec![deny("a", 10, "Deny"), deny("z", 10, "Accept")]);
    assert!(!ok(&c, "b1", "r1", "TCP", 80));
    // A Pass ends the tier, even before a higher-priority-value Deny.
    let c = cluster(vec![deny("a", 10, "Pass"), deny("b", 20, "Deny")]);
    assert!(ok(&c, "b1", "r1", "TCP", 80));
}

#[test]
fn an_egress_accept_does_not_override_the_destinations_ingress() {
    let c = cluster(vec![
        cnp(
            "out",
            json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
                   "egress": [{"action": "Accept", "to": [{"namespaces": ns_sel("blue")}]}]}),
        ),
        cnp(
            "in",
            json!({"tier": "Admin", "priority": 2, "subject": {"namespaces": ns_sel("blue")},
                   "ingress": [{"action": "Deny", "from": [{"namespaces": ns_sel("red")}]}]}),
        ),
    ]);
    assert!(!ok(&c, "r1", "b1", "TCP", 80));
    assert!(
        ask(&c, Mode::Standard, "r1", "b1", "TCP", 80, Direction::Egress).allowed(),
        "the egress side allows"
    );
}

#[test]
fn subjects_select_by_namespace_or_by_namespace_and_pod_never_host_network_pods() {
    let pods_subject = cnp(
        "p",
        json!({"tier": "Admin", "priority": 1,
               "subject": {"pods": {"namespaceSelector": ns_sel("red"), "podSelector": {"matchLabels": {"app": "r1"}}}},
               "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
    );
    let c = cluster(vec![pods_subject]);
    assert!(!ok(&c, "b1", "r1", "TCP", 80));
    assert!(ok(&c, "b1", "r2", "TCP", 80), "r2 is not selected");
    // Every namespace, host-network pods left out: h2 (on n2) takes what
    // it is sent, and its traffic is judged by the address only.
    let all = cnp(
        "all",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
               "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}],
               "egress": [{"action": "Deny", "to": [{"namespaces": ns_sel("infra")}]}]}),
    );
    let c = cluster(vec![all]);
    assert!(!ok(&c, "b1", "r1", "TCP", 80));
    assert!(
        ok(&c, "r1", "h2", "TCP", 8443),
        "h2 is no subject, and no pod of the egress peer"
    );
    assert!(
        ok(&c, "h2", "r1", "TCP", 80),
        "h2 is no pod of the ingress peer"
    );
    let e = ask(
        &c,
        Mode::Standard,
        "r1",
        "h2",
        "TCP",
        8443,
        Direction::Ingress,
    );
    assert_eq!(e.decided, Decided::HostNetwork);
}

#[test]
fn networks_match_pod_and_node_addresses_and_nodes_match_their_addresses() {
    let c = cluster(vec![cnp(
        "n",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "egress": [{"action": "Accept", "to": [{"networks": ["10.0.2.2/32"]}]},
                          {"action": "Deny", "to": [{"networks": ["10.0.0.0/16", "::/0"]}]},
                          {"action": "Deny", "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}}]}]}),
    )]);
    assert!(ok(&c, "r1", "b2", "TCP", 80), "the /32 first");
    assert!(!ok(&c, "r1", "b1", "TCP", 80), "a pod in 10.0.0.0/16");
    assert!(!ok(&c, "r1", "r2", "TCP", 80));
    // h2's address is n2's: denied by the nodes peer from r1 (on n1).
    assert!(!ok(&c, "r1", "h2", "TCP", 8443));
    let e = ask(
        &c,
        Mode::Standard,
        "r1",
        "h2",
        "TCP",
        8443,
        Direction::Egress,
    );
    assert_eq!(rule_of(&e).rule, 2);
    // A nodes peer selects by the Node's labels.
    let c = cluster(vec![cnp(
        "n",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "egress": [{"action": "Deny", "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "windows"}}}]}]}),
    )]);
    assert!(ok(&c, "r1", "h2", "TCP", 8443));
}

#[test]
fn traffic_with_the_pods_own_node_is_always_allowed() {
    // Deny everything everywhere, both tiers, strict mode.
    let c = cluster(vec![cnp(
        "lock",
        json!({"tier": "Admin", "priority": 0, "subject": {"namespaces": {}},
               "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}],
               "egress": [{"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}]}),
    )]);
    // h2 is on n2: r2 (on n2) reaches it and is reached by it.
    assert!(ok_in(&c, Mode::Strict, "r2", "h2", "TCP", 8443));
    assert!(ok_in(&c, Mode::Strict, "h2", "r2", "TCP", 80));
    let e = ask(&c, Mode::Strict, "r2", "h2", "TCP", 8443, Direction::Egress);
    assert_eq!(e.decided, Decided::OwnNode);
    // r1 (on n1) does not.
    assert!(!ok(&c, "r1", "h2", "TCP", 8443));
    // h2 has no hook, and is no pod of r1's `namespaces` ingress peer.
    assert!(ok(&c, "h2", "r1", "TCP", 80));
}

#[test]
fn ports_numbers_ranges_named_ports_and_no_protocols() {
    let rule = |protocols: Value| {
        cnp(
            "p",
            json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
                   "ingress": [{"action": "Deny", "from": [{"namespaces": ns_sel("blue")}], "protocols": protocols}]}),
        )
    };
    let c = cluster(vec![rule(
        json!([{"tcp": {"destinationPort": {"number": 80}}}]),
    )]);
    assert!(!ok(&c, "b1", "r1", "TCP", 80));
    assert!(ok(&c, "b1", "r1", "TCP", 81));
    assert!(ok(&c, "b1", "r1", "UDP", 80), "UDP is not TCP");
    let c = cluster(vec![rule(
        json!([{"udp": {"destinationPort": {"range": {"start": 50, "end": 60}}}}, {"sctp": {"destinationPort": {"number": 9003}}}]),
    )]);
    assert!(!ok(&c, "b1", "r1", "UDP", 53));
    assert!(!ok(&c, "b1", "r1", "UDP", 60));
    assert!(ok(&c, "b1", "r1", "UDP", 61));
    assert!(!ok(&c, "b1", "r1", "SCTP", 9003));
    // A named port: the destination's container port of that name, with
    // its own protocol.
    let c = cluster(vec![rule(json!([{"destinationNamedPort": "dns"}]))]);
    assert!(!ok(&c, "b1", "r1", "UDP", 53));
    assert!(ok(&c, "b1", "r1", "TCP", 53), "dns is UDP on r1");
    assert!(ok(&c, "b1", "r1", "UDP", 80));
    // No protocols: every protocol and port.
    let c = cluster(vec![cnp(
        "p",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "ingress": [{"action": "Deny", "from": [{"namespaces": ns_sel("blue")}]}]}),
    )]);
    for (protocol, port) in [("TCP", 1), ("UDP", 53), ("SCTP", 9005)] {
        assert!(!ok(&c, "b1", "r1", protocol, port));
    }
}

#[test]
fn a_named_port_never_matches_a_destination_that_is_no_pod() {
    let c = cluster(vec![cnp(
        "p",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "egress": [{"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"destinationNamedPort": "web"}]},
                          {"action": "Deny", "to": [{"nodes": {}}], "protocols": [{"destinationNamedPort": "web"}]}]}),
    )]);
    assert!(!ok(&c, "r1", "b1", "TCP", 80));
    // h2 names 8443 "web", but it is on the host network: no pod to name it.
    assert!(ok(&c, "r1", "h2", "TCP", 8443));
    let r1 = find(&c, "r1");
    let e = explain(
        &c,
        Mode::Standard,
        &Query {
            subject: r1.pod,
            peer: Peer::External("203.0.113.1".parse().unwrap()),
            server: None,
            protocol: "TCP",
            port: 80,
            dir: Direction::Egress,
        },
    );
    assert_eq!(e.decided, Decided::Default { allowed: true });
}

#[test]
fn rules_that_cannot_be_read_fail_closed_by_action() {
    let c = |action: &str| {
        cluster(vec![cnp(
            "p",
            json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
                   "egress": [{"action": action, "to": [{"domainNames": ["example.com"]}]}]}),
        )])
    };
    // Accept: matches nothing, so the default allows.
    assert!(ok(&c("Accept"), "r1", "b1", "TCP", 80));
    // Deny, Pass: deny everything.
    for action in ["Deny", "Pass"] {
        let c = c(action);
        assert!(!ok(&c, "r1", "b1", "UDP", 5353), "{action}");
        let e = ask(
            &c,
            Mode::Standard,
            "r1",
            "b1",
            "UDP",
            5353,
            Direction::Egress,
        );
        assert_eq!(rule_of(&e).action, Action::Deny);
        assert!(rule_of(&e).description.ends_with("denies everything)"));
    }
}

#[test]
fn an_accepts_domain_names_match_nothing_yet_its_other_peers_do() {
    let c = cluster(vec![cnp(
        "p",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "egress": [{"action": "Accept", "to": [{"networks": ["10.0.1.2/32"]},
                                                      {"domainNames": ["*.example.com"]}]},
                          {"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}]}),
    )]);
    assert!(ok(&c, "r1", "b1", "TCP", 80), "the networks peer");
    assert!(!ok(&c, "r1", "b2", "TCP", 80), "no name was resolved");
}

#[test]
fn staged_policies_are_judged_but_not_enforced() {
    let c = cluster(vec![cnp_with(
        "lock",
        json!({"palisade.io/audit": "true"}),
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
               "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
    )]);
    assert!(ok(&c, "b1", "r1", "TCP", 80));
    let (b1, r1) = (find(&c, "b1"), find(&c, "r1"));
    let q = Query {
        subject: r1.pod,
        peer: Peer::Pod(b1),
        server: Some(r1.pod),
        protocol: "TCP",
        port: 80,
        dir: Direction::Ingress,
    };
    let staged = staged_tier_change(&c, Mode::Standard, &q).expect("would deny");
    assert_eq!(rule_of(&staged).policy, "ClusterNetworkPolicy/lock");
    // Nothing staged for b1's ingress.
    let q = Query {
        subject: b1.pod,
        peer: Peer::Pod(r1),
        server: Some(b1.pod),
        ..q
    };
    assert_eq!(staged_tier_change(&c, Mode::Standard, &q), None);
}

/// A Service `svc` in blue with ClusterIP 10.96.0.1 port 80 -> 80, backed
/// by b1 and b2.
fn service() -> Object {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "svc", "namespace": "blue"},
        "spec": {"clusterIP": "10.96.0.1", "selector": {"svc": "yes"}, "ports": [{"port": 80, "targetPort": 80}]}
    }))
    .unwrap();
    Object::Service(svc)
}

fn with_service_labels(mut objects: Vec<Object>) -> ClusterState {
    let mut all = base();
    for o in &mut all {
        if let Object::Pod(p) = o {
            if p.metadata.namespace.as_deref() == Some("blue") {
                p.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert("svc".into(), "yes".into());
            }
        }
    }
    all.push(service());
    all.append(&mut objects);
    ClusterState::from_objects(all, "t".into())
}

#[test]
fn a_clusterip_is_accepted_when_every_backend_is_and_denied_when_one_is() {
    let vip: IpAddr = "10.96.0.1".parse().unwrap();
    let egress = |rules: Value| {
        cnp(
            "p",
            json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")}, "egress": rules}),
        )
    };
    let b1_only =
        json!({"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "b1"}}}});
    let deny_rest = json!({"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]});
    // Accept covering both backends, then a Deny of everything.
    let c = with_service_labels(vec![egress(json!([
        {"action": "Accept", "to": [{"namespaces": ns_sel("blue")}]}, deny_rest.clone()]))]);
    let r1 = find(&c, "r1");
    assert!(egress_to_service_allowed(&c, r1, vip, "TCP", 80));
    // Accept covering b1 only: the ClusterIP falls to the Deny.
    let c = with_service_labels(vec![egress(json!([
        {"action": "Accept", "to": [b1_only.clone()]}, deny_rest]))]);
    let r1 = find(&c, "r1");
    assert!(!egress_to_service_allowed(&c, r1, vip, "TCP", 80));
    // A Deny of one backend denies the ClusterIP.
    let c = with_service_labels(vec![egress(
        json!([{"action": "Deny", "to": [b1_only.clone()]}]),
    )]);
    let r1 = find(&c, "r1");
    assert!(!egress_to_service_allowed(&c, r1, vip, "TCP", 80));
    assert!(
        egress_to_service_allowed(&c, r1, vip, "TCP", 81),
        "no such service port"
    );
    // A Pass covering one backend only does not match the ClusterIP: the
    // Baseline's Deny of b1 decides.
    let c = with_service_labels(vec![
        egress(json!([{"action": "Pass", "to": [b1_only.clone()]}])),
        cnp(
            "base",
            json!({"tier": "Baseline", "priority": 1, "subject": {"namespaces": ns_sel("red")},
                   "egress": [{"action": "Deny", "to": [b1_only]}]}),
        ),
    ]);
    let r1 = find(&c, "r1");
    assert!(!egress_to_service_allowed(&c, r1, vip, "TCP", 80));
    // The ClusterIP in a `networks` peer: matched as an address.
    let c = with_service_labels(vec![egress(json!([
        {"action": "Deny", "to": [{"networks": ["10.96.0.0/16"]}]}]))]);
    let r1 = find(&c, "r1");
    assert!(!egress_to_service_allowed(&c, r1, vip, "TCP", 80));
    assert!(egress_to_service_allowed_in(
        &c,
        Mode::Standard,
        find(&c, "b1"),
        vip,
        "TCP",
        80
    ));
    assert!(!egress_to_service_allowed_in(
        &c,
        Mode::Strict,
        find(&c, "b1"),
        vip,
        "TCP",
        80
    ));
}

#[test]
fn host_network_pods_are_no_pods_of_network_policy_selectors_either() {
    let c = cluster(vec![np(
        "red",
        "from-infra",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
    )]);
    assert!(ok(&c, "b1", "r1", "TCP", 80));
    assert!(!ok(&c, "h2", "r1", "TCP", 80), "h2 only by its address");
    assert!(ok(&c, "h2", "r2", "TCP", 80), "r2 is on h2's node");
    assert!(allowed(&c, find(&c, "r1"), find(&c, "h2"), "TCP", 8443));
}

/// AWS's group follows the documented semantics too: its rules decide in
/// the order written. The AWS agent instead ranks a policy's rules by
/// action (Deny, then Accept, then Pass) at one priority, so there the
/// second rule's Deny would win; see docs/migrating-from-aws.md.
#[test]
fn an_aws_policy_is_judged_in_rule_order() {
    let aws = |first: &str, second: &str| {
        let o: wire::AwsClusterNetworkPolicy = serde_json::from_value(json!({
            "apiVersion": wire::AWS_API_VERSION, "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "p"},
            "spec": {"tier": "Admin", "priority": 10, "subject": {"namespaces": ns_sel("red")},
                     "ingress": [{"name": "one", "action": first, "from": [{"namespaces": ns_sel("blue")}],
                                  "ports": [{"portNumber": {"port": 80}}]},
                                 {"name": "two", "action": second, "from": [{"namespaces": ns_sel("blue")}]}]},
        }))
        .unwrap();
        Object::ClusterNetworkPolicy(ClusterNetworkPolicy::from_aws(&o))
    };
    let c = cluster(vec![aws("Accept", "Deny")]);
    assert!(ok(&c, "b1", "r1", "TCP", 80), "the first rule accepts");
    assert!(!ok(&c, "b1", "r1", "TCP", 81), "the second denies the rest");
    let c = cluster(vec![aws("Pass", "Deny")]);
    assert!(ok(&c, "b1", "r1", "TCP", 80), "the Pass skips the Deny");
    let e = ask(
        &c,
        Mode::Standard,
        "b1",
        "r1",
        "TCP",
        81,
        Direction::Ingress,
    );
    assert_eq!(
        rule_of(&e).policy,
        "ClusterNetworkPolicy.networking.k8s.aws/p"
    );
}

#[test]
fn explain_lists_the_accepts_by_name_above_the_decision_that_take_the_connection() {
    let c = cluster(vec![cnp(
        "names",
        json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": ns_sel("red")},
                   "egress": [
                       {"name": "web-by-name", "action": "Accept", "to": [{"domainNames": ["*.example.com"]}],
                        "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]},
                       {"name": "dns-by-name", "action": "Accept", "to": [{"domainNames": ["ns.example.org"]}],
                        "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                       {"name": "rest", "action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]},
                       {"name": "below", "action": "Accept", "to": [{"domainNames": ["late.example.com"]}]}]}),
    )]);
    let r1 = find(&c, "r1");
    let ask_external = |port: u16, dir: Direction| {
        explain(
            &c,
            Mode::Standard,
            &Query {
                subject: r1.pod,
                peer: Peer::External("203.0.113.1".parse().unwrap()),
                server: None,
                protocol: "TCP",
                port,
                dir,
            },
        )
    };
    let e = ask_external(443, Direction::Egress);
    assert_eq!(
        rule_of(&e).name,
        "rest",
        "the Deny decides what Explain can see"
    );
    let names: Vec<&str> = e.by_name.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["web-by-name"],
        "only an Accept by name above the Deny, on the connection's protocol and port"
    );
    assert!(
        e.by_name[0].description.contains("*.example.com"),
        "{:?}",
        e.by_name
    );
    assert!(
        ask_external(80, Direction::Egress).by_name.is_empty(),
        "another port"
    );
    assert!(
        ask_external(443, Direction::Ingress).by_name.is_empty(),
        "names are egress-only"
    );
}

#[test]
fn explain_lists_an_application_network_policy_s_rules_by_name_when_its_tier_denies() {
    use palisade_apis::application_network_policy::{lower, ApplicationNetworkPolicy};
    let anp: ApplicationNetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "by-name", "namespace": "red"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [
            {"to": [{"domainNames": ["api.example.com", "*.example.org"]}], "ports": [{"port": 443}]},
            {"to": [{"domainNames": ["dns.example.net"]}], "ports": [{"port": 53, "protocol": "UDP"}]},
            {"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]},
        ]},
    }))
    .unwrap();
    let c = cluster(vec![Object::NetworkPolicy(lower(&anp))]);
    let r1 = find(&c, "r1");
    let ask = |ip: &str, port: u16| {
        explain(
            &c,
            Mode::Standard,
            &Query {
                subject: r1.pod,
                peer: Peer::External(ip.parse().unwrap()),
                server: None,
                protocol: "TCP",
                port,
                dir: Direction::Egress,
            },
        )
    };
    // Denied by address; the rule by name on 443 could allow it.
    let e = ask("203.0.113.1", 443);
    assert!(!e.allowed(), "names match nothing in the model");
    let listed: Vec<(String, usize)> = e
        .by_name_network_policy
        .iter()
        .map(|r| (r.policy.clone(), r.rule))
        .collect();
    assert_eq!(
        listed,
        [("red/ApplicationNetworkPolicy:by-name".to_string(), 0)]
    );
    assert_eq!(
        e.by_name_network_policy[0].description,
        "egress[0]: to domainNames api.example.com, *.example.org on TCP/443"
    );
    // Another port: no rule by name takes it.
    assert!(ask("203.0.113.1", 80).by_name_network_policy.is_empty());
    // Allowed by its address rule: nothing to list.
    let e = ask("198.51.100.7", 443);
    assert!(e.allowed() && e.by_name_network_policy.is_empty(), "{e:?}");
}
