//! Fixed verdicts for the reference model, written down by hand from the
//! NetworkPolicy API's documentation rather than computed.
//!
//! The oracle tests compare the resolver (and the datapath) with the model,
//! so a misreading of the API made the same way in both passes them. These
//! cases pin the readings that are easiest to get wrong together: endPort
//! edges, a named port whose number differs between client and server, and
//! the policyTypes a policy gets when it does not say.

use std::net::IpAddr;

use policy_controller::cluster::ClusterState;
use policy_controller::model::{allowed, Endpoint};
use policy_controller::source::parse_objects;

/// Pods in namespaces `x` (labelled ns=x) and `y` (ns=y). `server` names its
/// port 80 "http"; `client` names its 8080 "http" too, so a named port
/// resolved on the wrong side gives a different number.
const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {ns: x}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {ns: y}}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: x, labels: {app: client}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: x, labels: {app: server}}
spec:
  nodeName: n2
  containers:
    - name: c
      image: i
      ports:
        - {name: http, containerPort: 80}
        - {name: dns, containerPort: 53, protocol: UDP}
status: {podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: y, labels: {app: client}}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
status: {podIP: 10.0.1.3}
"#;

struct Cluster(ClusterState);

impl Cluster {
    fn with(policies: &[&str]) -> Self {
        let text = std::iter::once(PODS)
            .chain(policies.iter().copied())
            .collect::<Vec<_>>()
            .join("\n---\n");
        let objects = parse_objects(&text).expect("manifests parse");
        Cluster(ClusterState::from_objects(objects, String::new()))
    }

    fn endpoint(&self, name: &str) -> Endpoint<'_> {
        let (ns, pod) = name.split_once('/').expect("namespace/name");
        let pod = self
            .0
            .pods
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(pod)
            })
            .unwrap_or_else(|| panic!("no pod {name}"));
        let ip: IpAddr = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .expect("pod has an IP")
            .parse()
            .unwrap();
        Endpoint { pod, ip }
    }

    fn allows(&self, from: &str, to: &str, protocol: &str, port: u16) -> bool {
        allowed(
            &self.0,
            self.endpoint(from),
            self.endpoint(to),
            protocol,
            port,
        )
    }

    /// Checks every (from, to, protocol, port, expected) row and reports all
    /// the rows that disagree at once.
    fn expect(&self, rows: &[(&str, &str, &str, u16, bool)]) {
        let wrong: Vec<String> = rows
            .iter()
            .filter(|(from, to, proto, port, want)| self.allows(from, to, proto, *port) != *want)
            .map(|(from, to, proto, port, want)| {
                let want = if *want { "allow" } else { "deny" };
                format!("{from} -> {to} {proto}/{port}: expected {want}")
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

fn ingress_to_server(rules: &str) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: server-ingress, namespace: x}}
spec:
  podSelector: {{matchLabels: {{app: server}}}}
  policyTypes: [Ingress]
  ingress: {rules}
"#
    )
}

#[test]
fn without_policies_everything_is_allowed() {
    let c = Cluster::with(&[]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        ("x/server", "x/client", "UDP", 9, true),
        ("y/other", "x/server", "SCTP", 1, true),
    ]);
}

#[test]
fn end_port_is_inclusive_at_both_edges() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{ports: [{protocol: TCP, port: 8000, endPort: 8002}]}]",
    )]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 7999, false),
        ("x/client", "x/server", "TCP", 8000, true),
        ("x/client", "x/server", "TCP", 8001, true),
        ("x/client", "x/server", "TCP", 8002, true),
        ("x/client", "x/server", "TCP", 8003, false),
        // The range is for TCP only.
        ("x/client", "x/server", "UDP", 8001, false),
    ]);
}

#[test]
fn end_port_equal_to_port_is_one_port() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{ports: [{protocol: UDP, port: 53, endPort: 53}]}]",
    )]);
    c.expect(&[
        ("x/client", "x/server", "UDP", 52, false),
        ("x/client", "x/server", "UDP", 53, true),
        ("x/client", "x/server", "UDP", 54, false),
    ]);
}

#[test]
fn a_range_to_the_top_port_includes_65535() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{ports: [{protocol: TCP, port: 65534, endPort: 65535}]}]",
    )]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 65533, false),
        ("x/client", "x/server", "TCP", 65534, true),
        ("x/client", "x/server", "TCP", 65535, true),
    ]);
}

#[test]
fn an_ingress_named_port_is_the_servers_number_not_the_clients() {
    let c = Cluster::with(&[&ingress_to_server("[{ports: [{port: http}]}]")]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        // 8080 is "http" on the client, which does not matter.
        ("x/client", "x/server", "TCP", 8080, false),
        // A named port names one protocol (TCP unless the rule says).
        ("x/client", "x/server", "UDP", 80, false),
    ]);
}

#[test]
fn an_egress_named_port_is_resolved_on_the_destination() {
    let c = Cluster::with(&[r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{ports: [{port: http}]}]
"#]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        ("x/client", "x/server", "TCP", 8080, false),
        // other has no port named http: nothing on it matches.
        ("x/client", "y/other", "TCP", 80, false),
        ("x/client", "y/other", "TCP", 8080, false),
    ]);
}

#[test]
fn a_named_udp_port_needs_the_protocol_in_the_rule() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{ports: [{port: dns}]}, {ports: [{protocol: UDP, port: http}]}]",
    )]);
    c.expect(&[
        // "dns" is UDP on the server, but the rule's protocol is TCP.
        ("x/client", "x/server", "UDP", 53, false),
        ("x/client", "x/server", "TCP", 53, false),
        // "http" is TCP on the server, the rule asks for UDP.
        ("x/client", "x/server", "UDP", 80, false),
        ("x/client", "x/server", "TCP", 80, false),
    ]);
}

#[test]
fn egress_rules_without_policy_types_also_isolate_ingress() {
    // policyTypes unset: Ingress always, Egress because there are egress
    // rules. The pod becomes ingress-isolated with no ingress rule.
    let c = Cluster::with(&[r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-only, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  egress: [{to: [{podSelector: {matchLabels: {app: server}}}]}]
"#]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        ("x/client", "y/other", "TCP", 80, false),
        // Ingress to the client is now denied from everyone.
        ("x/server", "x/client", "TCP", 8080, false),
        ("y/other", "x/client", "TCP", 8080, false),
    ]);
}

#[test]
fn an_explicit_egress_policy_type_leaves_ingress_open() {
    let c = Cluster::with(&[r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-only, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {matchLabels: {app: server}}}]}]
"#]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        ("x/client", "y/other", "TCP", 80, false),
        ("x/server", "x/client", "TCP", 8080, true),
        ("y/other", "x/client", "TCP", 8080, true),
    ]);
}

#[test]
fn a_policy_without_rules_or_types_denies_ingress_only() {
    let c = Cluster::with(&[r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
"#]);
    c.expect(&[
        ("x/server", "x/client", "TCP", 8080, false),
        ("x/client", "x/server", "TCP", 80, true),
    ]);
}

#[test]
fn pod_and_namespace_selectors_in_one_peer_are_anded() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {app: client}}}]}]",
    )]);
    c.expect(&[
        ("y/other", "x/server", "TCP", 80, true),
        // Right labels, wrong namespace.
        ("x/client", "x/server", "TCP", 80, false),
    ]);
}

#[test]
fn pod_and_namespace_selectors_in_two_peers_are_ored() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{from: [{namespaceSelector: {matchLabels: {ns: y}}}, {podSelector: {matchLabels: {app: client}}}]}]",
    )]);
    c.expect(&[
        ("y/other", "x/server", "TCP", 80, true),
        ("x/client", "x/server", "TCP", 80, true),
    ]);
}

#[test]
fn an_ip_block_except_removes_only_the_excepted_addresses() {
    let c = Cluster::with(&[&ingress_to_server(
        "[{from: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.0/24]}}]}]",
    )]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        ("y/other", "x/server", "TCP", 80, false),
    ]);
}

#[test]
fn policies_add_up_and_never_subtract() {
    let c = Cluster::with(&[
        &ingress_to_server("[{ports: [{port: 80}]}]"),
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: also, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{ports: [{protocol: UDP, port: 53}]}]
"#,
    ]);
    c.expect(&[
        ("x/client", "x/server", "TCP", 80, true),
        ("x/client", "x/server", "UDP", 53, true),
        ("x/client", "x/server", "TCP", 53, false),
        // The second policy selects client too: only UDP 53 reaches it.
        ("x/server", "x/client", "TCP", 8080, false),
        ("x/server", "x/client", "UDP", 53, true),
    ]);
}
