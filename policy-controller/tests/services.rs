//! Egress to Services: fixed expectations for the ClusterIP rules an egress
//! rule adds, read from manifests as the lab writes them.

use std::net::IpAddr;

use palisade_proto::v1::{IpPrefix, PortRange, Protocol, Rule};
use policy_controller::cidr::prefix;
use policy_controller::cluster::ClusterState;
use policy_controller::resolve::{resolve_cluster, Resolution};
use policy_controller::source::parse_objects;

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: app, labels: {app: client}}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
status: {podIP: 10.0.0.10}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: app, labels: {app: db, tier: primary}}
spec: {nodeName: n1, containers: [{name: pg, image: i, ports: [{name: pg, containerPort: 5432}]}]}
status: {podIP: 10.0.0.21}
---
apiVersion: v1
kind: Pod
metadata: {name: db-2, namespace: app, labels: {app: db}}
spec: {nodeName: n2, containers: [{name: pg, image: i, ports: [{name: pg, containerPort: 6432}]}]}
status: {podIP: 10.0.0.22}
---
apiVersion: v1
kind: Pod
metadata: {name: cache, namespace: app, labels: {app: cache}}
spec: {nodeName: n2, containers: [{name: c, image: i, ports: [{name: redis, containerPort: 6379}]}]}
status: {podIP: 10.0.0.30}
"#;

/// `client`'s egress: to pods `app=db` on `ports` (a YAML flow list, or
/// empty for none).
fn egress_to(peers: &str, ports: &str) -> String {
    let ports = if ports.is_empty() {
        String::new()
    } else {
        format!(", ports: {ports}")
    };
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: client-egress, namespace: app}}
spec:
  podSelector: {{matchLabels: {{app: client}}}}
  policyTypes: [Egress]
  egress: [{{to: {peers}{ports}}}]
"#
    )
}

const TO_DB: &str = "[{podSelector: {matchLabels: {app: db}}}]";

fn resolve(docs: &[&str]) -> Resolution {
    let text = std::iter::once(PODS)
        .chain(docs.iter().copied())
        .collect::<Vec<_>>()
        .join("\n---\n");
    let objects = parse_objects(&text).expect("manifests parse");
    let r = resolve_cluster(&ClusterState::from_objects(objects, String::new()));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    r
}

fn client_egress(r: &Resolution) -> Vec<Rule> {
    let pod = &r.plans["n1"].pods[&("app".to_string(), "client".to_string())];
    pod.egress
        .as_ref()
        .expect("client is egress-isolated")
        .rules
        .clone()
}

fn host(ip: &str) -> IpPrefix {
    let ip: IpAddr = ip.parse().unwrap();
    prefix(ip.into())
}

/// The rules of the client's egress whose peers include `vip`, each checked
/// to name the policy rule it comes from, then compared without it.
fn vip_rules(r: &Resolution, vip: &str) -> Vec<Rule> {
    let vip = host(vip);
    client_egress(r)
        .into_iter()
        .filter(|rule| rule.peers.iter().any(|p| p.cidr.as_ref() == Some(&vip)))
        .map(|mut rule| {
            assert!(
                !rule.policy.is_empty(),
                "a ClusterIP rule names no policy: {rule:?}"
            );
            rule.policy.clear();
            rule.rule_index = 0;
            rule
        })
        .collect()
}

fn tcp(port: u32) -> PortRange {
    PortRange {
        protocol: Protocol::Tcp as i32,
        port,
        end_port: 0,
    }
}

fn vip_rule(vips: &[&str], ports: Vec<PortRange>) -> Rule {
    Rule {
        peers: vips
            .iter()
            .map(|v| palisade_proto::v1::PeerBlock {
                cidr: Some(host(v)),
                except: vec![],
            })
            .collect(),
        ports,
        ..Default::default()
    }
}

fn service(name: &str, selector: &str, cluster_ip: &str, ports: &str) -> String {
    let selector = if selector.is_empty() {
        String::new()
    } else {
        format!("\n  selector: {selector}")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: app}}\nspec:{selector}\n  clusterIP: {cluster_ip}\n  ports: {ports}\n"
    )
}

#[test]
fn egress_to_db_pods_allows_the_db_service_on_its_port() {
    // db-2 listens on 6432 under the name pg; a numeric targetPort 5432
    // would send some connections to a port db-2 does not serve, so the
    // Service here backs only db-1 by selecting tier=primary.
    let svc = service(
        "db",
        "{app: db, tier: primary}",
        "10.96.0.10",
        "[{port: 5432, targetPort: 5432}]",
    );
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: 5432}]")]);
    let rules = client_egress(&r);
    assert_eq!(rules.len(), 2, "{rules:?}");
    // The pods themselves, then the ClusterIP on the service port.
    assert_eq!(
        rules[0]
            .peers
            .iter()
            .map(|p| p.cidr.clone().unwrap())
            .collect::<Vec<_>>(),
        [host("10.0.0.21"), host("10.0.0.22")]
    );
    assert_eq!(rules[1].policy, "app/client-egress");
    assert_eq!(
        vip_rules(&r, "10.96.0.10"),
        [vip_rule(&["10.96.0.10"], vec![tcp(5432)])]
    );
}

#[test]
fn the_service_port_is_what_the_clusterip_rule_names() {
    let svc = service(
        "db",
        "{app: db, tier: primary}",
        "10.96.0.10",
        "[{port: 80, targetPort: 5432}]",
    );
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: 5432}]")]);
    assert_eq!(
        vip_rules(&r, "10.96.0.10"),
        [vip_rule(&["10.96.0.10"], vec![tcp(80)])]
    );
}

#[test]
fn named_target_port_is_resolved_per_backend_pod() {
    // db-1 serves pg on 5432, db-2 on 6432.
    let svc = service(
        "db",
        "{app: db}",
        "10.96.0.10",
        "[{port: 5432, targetPort: pg}]",
    );
    // A named rule port resolves on each backend: both covered.
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: pg}]")]);
    assert_eq!(
        vip_rules(&r, "10.96.0.10"),
        [vip_rule(&["10.96.0.10"], vec![tcp(5432)])]
    );
    // Both numbers: both covered.
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: 5432}, {port: 6432}]")]);
    assert_eq!(vip_rules(&r, "10.96.0.10").len(), 1);
    // 5432 alone allows db-1 but not db-2, where the ClusterIP may also
    // lead: not allowed (see resolve::services on partial coverage).
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: 5432}]")]);
    assert_eq!(vip_rules(&r, "10.96.0.10"), []);
}

#[test]
fn a_rule_on_another_port_does_not_allow_the_clusterip() {
    let svc = service(
        "db",
        "{app: db, tier: primary}",
        "10.96.0.10",
        "[{port: 5432, targetPort: 5432}]",
    );
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: 5433}]")]);
    assert_eq!(vip_rules(&r, "10.96.0.10"), []);
    // Nor another protocol.
    let r = resolve(&[&svc, &egress_to(TO_DB, "[{port: 5432, protocol: UDP}]")]);
    assert_eq!(vip_rules(&r, "10.96.0.10"), []);
}

#[test]
fn headless_service_adds_nothing() {
    let svc = service("db", "{app: db}", "None", "[{port: 5432, targetPort: pg}]");
    let r = resolve(&[&svc, &egress_to(TO_DB, "")]);
    assert_eq!(client_egress(&r).len(), 1, "only the pods themselves");
}

#[test]
fn selectorless_service_with_a_slice_listing_a_selected_pod_allows_its_clusterip() {
    let svc = service("ext-db", "", "10.96.0.20", "[{name: sql, port: 5432}]");
    let slice = r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-db-1, namespace: app, labels: {kubernetes.io/service-name: ext-db}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.21]}]
ports: [{name: sql, port: 5432, protocol: TCP}]
"#;
    let r = resolve(&[&svc, slice, &egress_to(TO_DB, "[{port: 5432}]")]);
    assert_eq!(
        vip_rules(&r, "10.96.0.20"),
        [vip_rule(&["10.96.0.20"], vec![tcp(5432)])]
    );
    // The slice's port, not the Service's, is where connections go.
    let other = slice.replace("port: 5432, protocol", "port: 7000, protocol");
    let r = resolve(&[&svc, &other, &egress_to(TO_DB, "[{port: 5432}]")]);
    assert_eq!(vip_rules(&r, "10.96.0.20"), []);
    // A slice address no rule peer covers: not allowed.
    let cache = slice.replace("10.0.0.21", "10.0.0.30");
    let r = resolve(&[&svc, &cache, &egress_to(TO_DB, "")]);
    assert_eq!(vip_rules(&r, "10.96.0.20"), []);
}

#[test]
fn selectorless_service_behind_an_ipblock_allows_its_clusterip() {
    let svc = service("ext", "", "10.96.0.30", "[{port: 443}]");
    let slice = r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-1, namespace: app, labels: {kubernetes.io/service-name: ext}}
addressType: IPv4
endpoints: [{addresses: [192.0.2.7]}, {addresses: [192.0.2.8]}]
ports: [{port: 8443}]
"#;
    let r = resolve(&[
        &svc,
        slice,
        &egress_to("[{ipBlock: {cidr: 192.0.2.0/24}}]", "[{port: 8443}]"),
    ]);
    assert_eq!(
        vip_rules(&r, "10.96.0.30"),
        [vip_rule(&["10.96.0.30"], vec![tcp(443)])]
    );
    // One address excepted: the ClusterIP may lead there, so no.
    let r = resolve(&[
        &svc,
        slice,
        &egress_to(
            "[{ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.8/32]}}]",
            "[{port: 8443}]",
        ),
    ]);
    assert_eq!(vip_rules(&r, "10.96.0.30"), []);
}

#[test]
fn a_service_whose_backends_are_not_selected_adds_nothing() {
    let svc = service("cache", "{app: cache}", "10.96.0.40", "[{port: 6379}]");
    let r = resolve(&[&svc, &egress_to(TO_DB, "")]);
    assert_eq!(vip_rules(&r, "10.96.0.40"), []);
}

#[test]
fn a_service_whose_backends_are_partly_selected_adds_nothing() {
    // The Service leads to db-1 and db-2; the rule allows only db-1.
    let svc = service(
        "db",
        "{app: db}",
        "10.96.0.10",
        "[{port: 5432, targetPort: pg}]",
    );
    let primary = "[{podSelector: {matchLabels: {app: db, tier: primary}}}]";
    let r = resolve(&[&svc, &egress_to(primary, "")]);
    assert_eq!(vip_rules(&r, "10.96.0.10"), []);
}

#[test]
fn a_rule_without_ports_allows_every_service_port_in_both_families() {
    let svc = r#"apiVersion: v1
kind: Service
metadata: {name: db, namespace: app}
spec:
  selector: {app: db}
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ports: [{name: pg, port: 5432, targetPort: pg}, {name: metrics, port: 9187, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
"#;
    let r = resolve(&[svc, &egress_to(TO_DB, "")]);
    let udp53 = PortRange {
        protocol: Protocol::Udp as i32,
        port: 53,
        end_port: 0,
    };
    let mut want = vec![tcp(5432), tcp(9187), udp53];
    want.sort_by_key(|p| (p.protocol, p.port));
    assert_eq!(
        vip_rules(&r, "10.96.0.10"),
        [vip_rule(&["10.96.0.10", "fd00:96::10"], want)]
    );
}

#[test]
fn a_service_in_another_namespace_is_allowed_through_a_namespace_selector() {
    let pods = r#"apiVersion: v1
kind: Pod
metadata: {name: api-1, namespace: backend, labels: {app: api}}
spec: {nodeName: n2, containers: [{name: c, image: i, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.0.1.5}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: backend}
spec: {selector: {app: api}, clusterIP: 10.96.1.1, ports: [{port: 80, targetPort: http}]}
"#;
    let peers = "[{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: backend}}, podSelector: {matchLabels: {app: api}}}]";
    let r = resolve(&[pods, &egress_to(peers, "[{port: 8080}]")]);
    assert_eq!(
        vip_rules(&r, "10.96.1.1"),
        [vip_rule(&["10.96.1.1"], vec![tcp(80)])]
    );
}
