//! Policy resolution: a pure function from the cluster's objects to the plan
//! of every node. It follows NetworkPolicy v1 as upstream defines it: a pod is
//! isolated in a direction once any policy selects it for that direction, and
//! the rules of every such policy are unioned.
//!
//! A node's plan names every pod that lives on it, isolated or not (a pod
//! missing from a plan is one the controller does not know, which an enforcer
//! must not read as "not isolated"); peers appear as addresses, so a node
//! learns nothing else about the cluster. Host-network pods are left out:
//! they share the node's interfaces, so there is nothing per pod to enforce.
//!
//! The walk, by file:
//!
//! - `oracle.rs`: every node's plan by scanning, the oracle the engine is
//!   tested against;
//! - `target.rs`: one pod's policy from the policies that select it (where
//!   policy tiers meet);
//! - `tiers.rs`: ClusterNetworkPolicy (Admin and Baseline tiers): which
//!   apply to a pod, their rules as tier rules;
//! - `staging.rs`: staged (audit) policies;
//! - `rules.rs`: one policy rule as plan rules, with `peers.rs` (address
//!   blocks and selected pods), `ports.rs` (numbered and named ports) and
//!   `services.rs` (the ClusterIPs an egress rule allows);
//! - `objects.rs`: pods and namespaces as resolution reads them;
//! - `selectors.rs`: label selectors;
//! - `node_plan.rs`: what resolution produces.

mod node_plan;
mod objects;
mod oracle;
mod peers;
mod ports;
mod rules;
mod selectors;
mod services;
mod staging;
mod target;
mod tiers;

pub use node_plan::{NodePlan, Resolution};
pub use objects::UnknownProtocol;
pub(crate) use objects::{
    default_ns_labels, namespace_of, ns_labels, parse_protocol, pod_info, PodInfo,
};
pub use oracle::resolve_cluster;
pub(crate) use peers::{block, PeerSelection, Selected};
pub use peers::{parse_block, BlockError};
pub use selectors::{selector_matches, validate_selector, SelectorError, UnknownOperator};
pub(crate) use services::{is_selectorless, selector_of, service_info, slice_service, ServiceInfo};
pub use staging::{is_staged, AUDIT_ANNOTATION};
pub(crate) use target::{resolve_pod, PolicyLabel};
pub(crate) use tiers::{node_ips, TierRules, TieredPolicy};

#[cfg(test)]
mod tests {
    use super::ports::range;
    use super::*;
    use crate::cidr::prefix;
    use crate::cluster::{ClusterState, Object};
    use crate::keys::PodKey;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PodPolicy, Protocol, Rule};

    fn state(yaml: &str) -> ClusterState {
        let mut objects = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let v = serde_yaml::Value::deserialize(doc).unwrap();
            let kind = v["kind"].as_str().unwrap().to_string();
            objects.push(match kind.as_str() {
                "Namespace" => Object::Namespace(serde_yaml::from_value(v).unwrap()),
                "Pod" => Object::Pod(serde_yaml::from_value(v).unwrap()),
                "NetworkPolicy" => Object::NetworkPolicy(serde_yaml::from_value(v).unwrap()),
                "ClusterNetworkPolicy"
                    if v["apiVersion"].as_str() == Some(palisade_apis::wire::AWS_API_VERSION) =>
                {
                    Object::ClusterNetworkPolicy(palisade_apis::ClusterNetworkPolicy::from_aws(
                        &serde_yaml::from_value(v).unwrap(),
                    ))
                }
                "ClusterNetworkPolicy" => Object::ClusterNetworkPolicy(
                    palisade_apis::ClusterNetworkPolicy::from_upstream(
                        &serde_yaml::from_value(v).unwrap(),
                    ),
                ),
                "Node" => Object::Node(serde_yaml::from_value(v).unwrap()),
                "Service" => Object::Service(serde_yaml::from_value(v).unwrap()),
                "ApplicationNetworkPolicy" => {
                    Object::NetworkPolicy(palisade_apis::application_network_policy::lower(
                        &serde_yaml::from_value(v).unwrap(),
                    ))
                }
                k => panic!("kind {k}"),
            });
        }
        ClusterState::from_objects(objects, String::new())
    }
    use serde::Deserialize;

    const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: red}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {team: blue}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{containerPort: 80, name: http}]}]}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x, labels: {app: b}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{containerPort: 8080, name: http}, {containerPort: 53, name: dns, protocol: UDP}]}]}
status: {podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: x, labels: {app: c}}
spec: {nodeName: n2, containers: [{name: c, image: i}]}
status: {podIP: 10.0.0.3}
---
apiVersion: v1
kind: Pod
metadata: {name: d, namespace: y, labels: {app: a}}
spec: {nodeName: n2, containers: [{name: c, image: i}]}
status: {podIP: 10.0.1.4}
"#;

    fn with(policies: &str) -> Resolution {
        resolve_cluster(&state(&format!("{PODS}\n---\n{policies}")))
    }

    fn pod<'a>(r: &'a Resolution, node: &str, ns: &str, name: &str) -> Option<&'a PodPolicy> {
        r.plans
            .get(node)?
            .pods
            .get(&(ns.to_string(), name.to_string()))
            .map(|p| &**p)
    }

    fn v4(s: &str) -> IpPrefix {
        prefix(s.parse().unwrap())
    }

    fn peer_cidrs(rule: &Rule) -> Vec<IpPrefix> {
        rule.peers.iter().map(|p| p.cidr.clone().unwrap()).collect()
    }

    #[test]
    fn no_policy_lists_every_pod_unisolated() {
        let r = resolve_cluster(&state(PODS));
        assert!(r.errors.is_empty());
        let listed: Vec<(&str, &PodKey)> = r
            .plans
            .iter()
            .flat_map(|(node, plan)| plan.pods.keys().map(move |k| (node.as_str(), k)))
            .collect();
        let key = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        assert_eq!(
            listed,
            [
                ("n1", &key("x", "a")),
                ("n1", &key("x", "b")),
                ("n2", &key("x", "c")),
                ("n2", &key("y", "d"))
            ]
        );
        for p in r.plans.values().flat_map(|p| p.pods.values()) {
            assert_eq!((&p.ingress, &p.egress), (&None, &None));
            assert!(p.policies.is_empty());
            assert_eq!(p.pod_ips.len(), 1);
        }
    }

    #[test]
    fn pods_without_an_address_or_a_node() {
        let r = resolve_cluster(&state(
            r#"apiVersion: v1
kind: Pod
metadata: {name: starting, namespace: x}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
---
apiVersion: v1
kind: Pod
metadata: {name: unscheduled, namespace: x}
spec: {containers: [{name: c, image: i}]}"#,
        ));
        let starting = pod(&r, "n1", "x", "starting").expect("listed before it has an IP");
        assert!(starting.pod_ips.is_empty());
        assert_eq!(r.plans.values().map(|p| p.pods.len()).sum::<usize>(), 1);
    }

    #[test]
    fn default_deny_ingress_isolates_only_selected_pods_on_their_node() {
        let r = with(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {matchLabels: {app: b}}}",
    );
        let b = pod(&r, "n1", "x", "b").expect("b is in n1's plan");
        assert_eq!(b.ingress, Some(DirectionPolicy::default()));
        assert_eq!(b.egress, None, "policyTypes defaults to Ingress only");
        assert_eq!(b.policies, vec!["x/deny"]);
        assert_eq!(b.pod_ips, vec![v4("10.0.0.2/32")]);
        let a = pod(&r, "n1", "x", "a").expect("unselected pods are listed too");
        assert_eq!((&a.ingress, &a.egress), (&None, &None));
        assert!(a.policies.is_empty());
        let c = pod(&r, "n2", "x", "c").expect("n2's pods are listed");
        assert_eq!((&c.ingress, &c.egress), (&None, &None));
    }

    #[test]
    fn pod_selector_peer_is_same_namespace_only() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-a, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{from: [{podSelector: {matchLabels: {app: a}}}], ports: [{port: 80}]}]"#,
        );
        let b = pod(&r, "n1", "x", "b").unwrap();
        let rules = &b.ingress.as_ref().unwrap().rules;
        assert_eq!(rules.len(), 1);
        // y/d has app=a but lives in another namespace.
        assert_eq!(peer_cidrs(&rules[0]), vec![v4("10.0.0.1/32")]);
        assert_eq!(rules[0].ports, vec![range(Protocol::Tcp, 80, 0)]);
    }

    #[test]
    fn namespace_selector_alone_and_with_pod_selector() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: blue}}}]
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: a}}}]"#,
        );
        let rules = &pod(&r, "n1", "x", "b")
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()
            .rules;
        assert_eq!(peer_cidrs(&rules[0]), vec![v4("10.0.1.4/32")]);
        assert_eq!(
            peer_cidrs(&rules[1]),
            vec![v4("10.0.0.1/32"), v4("10.0.1.4/32")]
        );
    }

    #[test]
    fn implicit_namespace_name_label_matches() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]}]"#,
        );
        let rules = &pod(&r, "n1", "x", "a")
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()
            .rules;
        assert_eq!(peer_cidrs(&rules[0]), vec![v4("10.0.1.4/32")]);
    }

    #[test]
    fn empty_from_allows_every_address_of_both_families() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress: [{ports: [{port: 80, endPort: 90, protocol: UDP}]}]"#,
        );
        let rules = &pod(&r, "n1", "x", "a")
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()
            .rules;
        assert_eq!(
            peer_cidrs(&rules[0]),
            vec![v4("0.0.0.0/0"), prefix("::/0".parse().unwrap())]
        );
        assert_eq!(rules[0].ports, vec![range(Protocol::Udp, 80, 90)]);
    }

    #[test]
    fn ip_block_with_except_and_egress_policy_type() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.0/24]}}]}]"#,
        );
        let a = pod(&r, "n1", "x", "a").unwrap();
        assert_eq!(a.ingress, None);
        let rules = &a.egress.as_ref().unwrap().rules;
        assert_eq!(
            rules[0].peers,
            vec![PeerBlock {
                cidr: Some(v4("10.0.0.0/16")),
                except: vec![v4("10.0.1.0/24")]
            }]
        );
        assert!(rules[0].ports.is_empty());
    }

    #[test]
    fn named_ports_resolve_per_target_on_ingress_and_per_peer_on_egress() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: in, namespace: x}
spec:
  podSelector: {matchExpressions: [{key: app, operator: In, values: [a, b]}]}
  ingress: [{ports: [{port: http}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out, namespace: x}
spec:
  podSelector: {matchLabels: {app: c}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {}}], ports: [{port: http}, {port: dns, protocol: UDP}]}]"#,
        );
        let ports = |ns, n, node| {
            pod(&r, node, ns, n)
                .unwrap()
                .ingress
                .as_ref()
                .unwrap()
                .rules[0]
                .ports
                .clone()
        };
        assert_eq!(ports("x", "a", "n1"), vec![range(Protocol::Tcp, 80, 0)]);
        assert_eq!(ports("x", "b", "n1"), vec![range(Protocol::Tcp, 8080, 0)]);
        let egress = &pod(&r, "n2", "x", "c")
            .unwrap()
            .egress
            .as_ref()
            .unwrap()
            .rules;
        // Only named ports: no rule for all peers; one rule per pod that has them.
        assert_eq!(egress.len(), 2);
        assert_eq!(peer_cidrs(&egress[0]), vec![v4("10.0.0.1/32")]);
        assert_eq!(egress[0].ports, vec![range(Protocol::Tcp, 80, 0)]);
        assert_eq!(peer_cidrs(&egress[1]), vec![v4("10.0.0.2/32")]);
        assert_eq!(
            egress[1].ports,
            vec![range(Protocol::Tcp, 8080, 0), range(Protocol::Udp, 53, 0)]
        );
    }

    #[test]
    fn unresolvable_named_port_allows_nothing_rather_than_everything() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress: [{ports: [{port: metrics}]}]"#,
        );
        let a = pod(&r, "n1", "x", "a").unwrap();
        assert_eq!(a.ingress, Some(DirectionPolicy::default()));
    }

    #[test]
    fn bad_input_is_named_and_only_narrows() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress:
  - from: [{ipBlock: {cidr: 10.0.0.1/8}}, {ipBlock: {cidr: nonsense}}, {ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16]}}]
  - ports: [{port: 70000}]
  - ports: [{port: 80, endPort: 79}]
  - ports: [{port: 80, protocol: ICMP}]"#,
        );
        let a = pod(&r, "n1", "x", "a").unwrap();
        assert_eq!(
            a.ingress,
            Some(DirectionPolicy::default()),
            "the policy still isolates"
        );
        let all = r.errors.join("\n");
        for needle in [
        "NetworkPolicy x/bad: spec.ingress[0].from[0].ipBlock: \"10.0.0.1/8\" has host bits set",
        "spec.ingress[0].from[1].ipBlock: \"nonsense\" is not a CIDR",
        "spec.ingress[0].from[2].ipBlock: except \"192.168.0.0/16\" is not inside cidr",
        "spec.ingress[1].ports[0]: port 70000 is out of range",
        "spec.ingress[2].ports[0]: endPort 79 must be between port 80",
        "spec.ingress[3].ports[0]: unknown protocol \"ICMP\"",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
    }

    #[test]
    fn rules_of_several_policies_are_unioned() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: one, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{from: [{podSelector: {matchLabels: {app: a}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: two, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchLabels: {app: c}}}]}]"#,
        );
        let b = pod(&r, "n1", "x", "b").unwrap();
        assert_eq!(b.policies, vec!["x/one", "x/two"]);
        assert_eq!(b.ingress.as_ref().unwrap().rules.len(), 2);
    }

    #[test]
    fn finished_and_host_network_pods_are_not_peers() {
        let r = resolve_cluster(&state(&format!(
            "{PODS}\n---\n{}",
            r#"apiVersion: v1
kind: Pod
metadata: {name: done, namespace: x, labels: {app: a}}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
status: {podIP: 10.0.0.9, phase: Succeeded}
---
apiVersion: v1
kind: Pod
metadata: {name: host, namespace: x, labels: {app: a}}
spec: {nodeName: n1, hostNetwork: true, containers: [{name: c, image: i}]}
status: {podIP: 192.168.1.1}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchLabels: {app: a}}}]}]"#
        )));
        let rules = &pod(&r, "n1", "x", "b")
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()
            .rules;
        assert_eq!(peer_cidrs(&rules[0]), vec![v4("10.0.0.1/32")]);
        assert!(pod(&r, "n1", "x", "host").is_none());
    }

    #[test]
    fn resolution_does_not_depend_on_object_order() {
        let text = format!(
        "{PODS}\n---\n{}",
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\nspec: {podSelector: {}, ingress: [{from: [{podSelector: {}}]}]}"
    );
        let mut docs: Vec<&str> = text.split("\n---\n").collect();
        let forward = resolve_cluster(&state(&docs.join("\n---\n")));
        docs.reverse();
        let backward = resolve_cluster(&state(&docs.join("\n---\n")));
        assert_eq!(forward, backward);
    }

    #[test]
    fn named_egress_ports_to_any_destination_or_an_ip_block_resolve_per_covered_pod() {
        let r = with(
            r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out, namespace: y}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports: [{port: http}]
  - to: [{ipBlock: {cidr: 10.0.0.0/24, except: [10.0.0.2/32]}}]
    ports: [{port: dns, protocol: UDP}]"#,
        );
        let egress = &pod(&r, "n2", "y", "d")
            .unwrap()
            .egress
            .as_ref()
            .unwrap()
            .rules;
        // Rule 1 (no `to`): every pod in the cluster with an "http" port.
        assert_eq!(peer_cidrs(&egress[0]), vec![v4("10.0.0.1/32")]);
        assert_eq!(egress[0].ports, vec![range(Protocol::Tcp, 80, 0)]);
        assert_eq!(peer_cidrs(&egress[1]), vec![v4("10.0.0.2/32")]);
        assert_eq!(egress[1].ports, vec![range(Protocol::Tcp, 8080, 0)]);
        // Rule 2: x/b has "dns" but sits in the except; nothing else has it.
        assert_eq!(egress.len(), 2, "{egress:?}");
    }

    const STAGED_DENY: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x, annotations: {palisade.io/audit: "true"}}
spec: {podSelector: {matchLabels: {app: b}}}"#;

    const ALLOW_FROM_A: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-a, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{from: [{podSelector: {matchLabels: {app: a}}}]}]"#;

    const STAGED_ALLOW_FROM_C: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-c, namespace: x, annotations: {palisade.io/audit: "true"}}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{from: [{podSelector: {matchLabels: {app: c}}}]}]"#;

    #[test]
    fn a_staged_deny_on_an_unisolated_pod_isolates_only_its_audit_direction() {
        let r = with(STAGED_DENY);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let b = pod(&r, "n1", "x", "b").unwrap();
        assert_eq!((&b.ingress, &b.egress), (&None, &None), "nothing enforced");
        assert!(b.policies.is_empty());
        assert_eq!(b.staged_policies, vec!["x/deny"]);
        assert_eq!(b.audit_ingress, Some(DirectionPolicy::default()));
        assert_eq!(b.audit_egress, None, "no staged policy applies to egress");
        let a = pod(&r, "n1", "x", "a").unwrap();
        assert!(a.staged_policies.is_empty() && a.audit_ingress.is_none());
    }

    #[test]
    fn a_staged_allow_on_an_isolated_pod_audits_the_enforced_rules_plus_its_own() {
        let r = with(&format!("{ALLOW_FROM_A}\n---\n{STAGED_ALLOW_FROM_C}"));
        let b = pod(&r, "n1", "x", "b").unwrap();
        assert_eq!(b.policies, vec!["x/from-a"]);
        assert_eq!(b.staged_policies, vec!["x/from-c"]);
        let enforced = b.ingress.as_ref().unwrap();
        assert_eq!(enforced.rules.len(), 1);
        assert_eq!(peer_cidrs(&enforced.rules[0]), vec![v4("10.0.0.1/32")]);
        let audit = b.audit_ingress.as_ref().unwrap();
        let origins: Vec<(&str, Vec<IpPrefix>)> = audit
            .rules
            .iter()
            .map(|r| (r.policy.as_str(), peer_cidrs(r)))
            .collect();
        assert_eq!(
            origins,
            vec![
                ("x/from-a", vec![v4("10.0.0.1/32")]),
                ("x/from-c", vec![v4("10.0.0.3/32")]),
            ]
        );
        assert_eq!(b.audit_egress, None);
    }

    #[test]
    fn removing_the_annotation_enforces_exactly_what_was_audited() {
        let staged = with(&format!("{ALLOW_FROM_A}\n---\n{STAGED_ALLOW_FROM_C}"));
        let enforced = with(&format!(
            "{ALLOW_FROM_A}\n---\n{}",
            STAGED_ALLOW_FROM_C.replace(", annotations: {palisade.io/audit: \"true\"}", "")
        ));
        let before = pod(&staged, "n1", "x", "b").unwrap();
        let after = pod(&enforced, "n1", "x", "b").unwrap();
        assert_eq!(after.ingress, before.audit_ingress);
        assert_eq!(after.policies, vec!["x/from-a", "x/from-c"]);
        assert!(after.staged_policies.is_empty());
        assert_eq!((&after.audit_ingress, &after.audit_egress), (&None, &None));
    }

    #[test]
    fn an_audit_value_other_than_true_or_false_is_an_error_and_enforced() {
        for (value, error) in [("\"false\"", false), ("\"True\"", true), ("\"yes\"", true)] {
            let r = with(&STAGED_DENY.replace("\"true\"", value));
            let b = pod(&r, "n1", "x", "b").unwrap();
            assert_eq!(
                b.ingress,
                Some(DirectionPolicy::default()),
                "{value} enforces"
            );
            assert!(b.staged_policies.is_empty() && b.audit_ingress.is_none());
            assert_eq!(
                r.errors.len(),
                usize::from(error),
                "{value}: {:?}",
                r.errors
            );
            if error {
                assert!(
                    r.errors[0].contains("x/deny") && r.errors[0].contains("palisade.io/audit"),
                    "{:?}",
                    r.errors
                );
            }
        }
    }

    #[test]
    fn a_policy_over_the_rule_limit_isolates_its_pods_with_none_of_its_rules_and_is_named() {
        let mut s = state(&format!(
            "{PODS}\n---\n{}",
            r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: small, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress: [{from: [{ipBlock: {cidr: 192.168.0.0/16}}]}]
"#
        ));
        // One rule past the limit: every rule allows everything, so any of
        // them slipping through would open the pod.
        let mut huge: k8s_openapi::api::networking::v1::NetworkPolicy = serde_yaml::from_str(
            "{metadata: {name: huge, namespace: x}, spec: {podSelector: {matchLabels: {app: a}}}}",
        )
        .unwrap();
        huge.spec.as_mut().unwrap().ingress = Some(vec![
            Default::default();
            crate::limits::MAX_RULES_PER_POLICY + 1
        ]);
        s.policies.push(huge);
        let r = resolve_cluster(&s);
        let a = pod(&r, "n1", "x", "a").unwrap();
        let ingress = a.ingress.as_ref().expect("still isolated");
        assert_eq!(ingress.rules.len(), 1, "only the small policy's rule");
        assert_eq!(ingress.rules[0].policy, "x/small");
        assert_eq!(
            a.policies,
            vec!["x/huge".to_string(), "x/small".to_string()]
        );
        assert!(
            r.errors
                .iter()
                .any(|e| e.starts_with("NetworkPolicy x/huge: spec: 100001 rules")),
            "{:?}",
            r.errors
        );
        // Pods it does not select are untouched.
        assert!(pod(&r, "n1", "x", "b").unwrap().ingress.is_none());
    }

    #[test]
    fn an_application_network_policy_isolates_and_allows_by_name_beside_network_policies() {
        let anp = |name: &str, egress: &str| {
            format!("apiVersion: networking.k8s.aws/v1alpha1\nkind: ApplicationNetworkPolicy\nmetadata: {{name: {name}, namespace: x}}\nspec:\n  podSelector: {{matchLabels: {{app: a}}}}\n  policyTypes: [Egress]\n  egress:\n{egress}")
        };
        let r = with(&[
            anp("p", "  - {to: [{domainNames: [\"API.Example.com.\", \"*.example.org\"]}, {ipBlock: {cidr: 192.0.2.0/24}}], ports: [{port: 443}]}\n  - {to: [{domainNames: [example.net]}]}\n  - {to: [{domainNames: [a.example]}], ports: [{port: http}]}\n"),
            // Same name as the ApplicationNetworkPolicy: a second policy.
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\nspec:\n  podSelector: {matchLabels: {app: a}}\n  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 198.51.100.0/24}}]}]".to_string(),
        ].join("\n---\n"));
        let a = pod(&r, "n1", "x", "a").unwrap();
        assert_eq!(a.policies, ["x/ApplicationNetworkPolicy:p", "x/p"]);
        let rules: Vec<_> = a
            .egress
            .as_ref()
            .unwrap()
            .rules
            .iter()
            .map(|r| {
                (
                    r.policy.as_str(),
                    r.rule_index,
                    r.peers.len(),
                    r.ports.len(),
                    r.domain_names.clone(),
                )
            })
            .collect();
        let anp_name = "x/ApplicationNetworkPolicy:p";
        assert_eq!(
            rules,
            [
                (anp_name, 0, 1, 1, vec![]),
                // Lower-cased, no trailing dot, sorted; the rule's ports.
                (
                    anp_name,
                    0,
                    0,
                    1,
                    vec!["*.example.org".to_string(), "api.example.com".to_string()]
                ),
                // Names alone: nothing by address, every port by name.
                (anp_name, 1, 0, 0, vec!["example.net".to_string()]),
                ("x/p", 0, 1, 0, vec![]),
            ]
        );
        assert_eq!(
            r.errors,
            ["ApplicationNetworkPolicy x/p: spec.egress[2]: port \"http\" is named, which a peer by domain name cannot have; the names allow nothing"]
        );
        // Pods it does not select are not isolated by it.
        assert!(pod(&r, "n1", "x", "b").unwrap().egress.is_none());
    }

    mod tiers {
        use super::*;
        use palisade_proto::v1::{TierAction, TierRule};

        fn cnp(name: &str, tier: &str, priority: u32, body: &str) -> String {
            format!(
            "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {{name: {name}}}\nspec:\n  tier: {tier}\n  priority: {priority}\n{body}"
        )
        }

        fn actions(rules: &[TierRule]) -> Vec<(String, u32, i32)> {
            rules
                .iter()
                .map(|r| (r.policy.clone(), r.rule_index, r.action))
                .collect()
        }

        #[test]
        fn rules_land_in_their_tier_in_precedence_order_and_only_on_subjects() {
            let r = with(&[
            cnp("b-late", "Admin", 10, "  subject: {namespaces: {matchLabels: {team: red}}}\n  ingress:\n  - {action: Deny, from: [{namespaces: {}}]}\n"),
            cnp("a-early", "Admin", 10, "  subject: {namespaces: {}}\n  ingress:\n  - {action: Pass, from: [{namespaces: {matchLabels: {team: blue}}}]}\n  - {action: Accept, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: b}}}}]}\n"),
            cnp("base", "Baseline", 0, "  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: a}}}}\n  egress:\n  - {action: Deny, to: [{networks: [0.0.0.0/0]}]}\n"),
        ].join("\n---\n"));
            let a = pod(&r, "n1", "x", "a").unwrap();
            let ingress = a.ingress.as_ref().unwrap();
            assert!(ingress.not_isolated && ingress.rules.is_empty());
            let (accept, deny, pass) = (
                TierAction::Accept as i32,
                TierAction::Deny as i32,
                TierAction::Pass as i32,
            );
            assert_eq!(
                actions(&ingress.admin),
                vec![
                    ("ClusterNetworkPolicy/a-early".into(), 0, pass),
                    ("ClusterNetworkPolicy/a-early".into(), 1, accept),
                    ("ClusterNetworkPolicy/b-late".into(), 0, deny),
                ],
                "equal priorities: by name"
            );
            // The Pass covers y's pods, the Accept x/b's address.
            assert_eq!(
                peer_cidrs(&rule_of(&ingress.admin[0])),
                vec![v4("10.0.1.4/32")]
            );
            assert_eq!(
                peer_cidrs(&rule_of(&ingress.admin[1])),
                vec![v4("10.0.0.2/32")]
            );
            assert_eq!(ingress.admin[0].priority, 10);
            let egress = a.egress.as_ref().unwrap();
            assert_eq!(
                actions(&egress.baseline),
                vec![("ClusterNetworkPolicy/base".into(), 0, deny)]
            );
            assert_eq!(
                a.policies,
                vec![
                    "ClusterNetworkPolicy/a-early",
                    "ClusterNetworkPolicy/b-late",
                    "ClusterNetworkPolicy/base"
                ]
            );
            // y/d: only a-early selects it (b-late wants team red, base app a
            // is in x... and in y: d is app a too).
            let d = pod(&r, "n2", "y", "d").unwrap();
            assert_eq!(d.ingress.as_ref().unwrap().admin.len(), 2);
            assert_eq!(actions(&d.egress.as_ref().unwrap().baseline).len(), 1);
            // Host-network pods are never subjects; x/c has no rule but a-early's.
            let c = pod(&r, "n2", "x", "c").unwrap();
            assert!(c.egress.is_none(), "no egress rule selects it");
        }

        fn rule_of(t: &TierRule) -> Rule {
            Rule {
                peers: t.peers.clone(),
                ..Default::default()
            }
        }

        #[test]
        fn a_networkpolicy_and_tiers_together_keep_isolation_and_staged_ones_go_to_audit() {
            let r = with(&[
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np, namespace: x}\nspec: {podSelector: {matchLabels: {app: a}}, ingress: [{from: [{podSelector: {}}]}]}",
            &cnp("staged", "Admin", 1, "  subject: {namespaces: {}}\n  ingress:\n  - {action: Deny, from: [{namespaces: {}}]}\n").replace("metadata: {name: staged}", "metadata: {name: staged, annotations: {palisade.io/audit: \"true\"}}"),
        ].join("\n---\n"));
            let a = pod(&r, "n1", "x", "a").unwrap();
            let ingress = a.ingress.as_ref().unwrap();
            assert!(
                !ingress.not_isolated && ingress.admin.is_empty(),
                "{ingress:?}"
            );
            assert_eq!(a.staged_policies, vec!["ClusterNetworkPolicy/staged"]);
            let audit = a.audit_ingress.as_ref().unwrap();
            assert_eq!(audit.admin.len(), 1);
            assert_eq!(
                audit.rules, ingress.rules,
                "what enforcing the staged one would give"
            );
            // x/b: no NetworkPolicy; the staged Deny alone, in audit only.
            let b = pod(&r, "n1", "x", "b").unwrap();
            assert!(b.ingress.is_none());
            assert!(b.audit_ingress.as_ref().unwrap().not_isolated);
        }

        #[test]
        fn a_deny_covers_a_services_clusterip_on_any_backend_an_accept_on_every_one() {
            // s is backed by x/b and x/e; the rules cover x/e alone.
            let objects = "apiVersion: v1\nkind: Pod\nmetadata: {name: e, namespace: x, labels: {app: b, canary: \"yes\"}}\nspec: {nodeName: n1, containers: [{name: c, image: i, ports: [{containerPort: 8080, name: http}]}]}\nstatus: {podIP: 10.0.0.5}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\nspec: {clusterIP: 10.96.0.10, selector: {app: b}, ports: [{port: 80, targetPort: 8080}]}";
            let body = |action: &str| {
                format!("  subject: {{pods: {{namespaceSelector: {{}}, podSelector: {{matchLabels: {{app: c}}}}}}}}\n  egress:\n  - {{action: {action}, to: [{{pods: {{namespaceSelector: {{}}, podSelector: {{matchLabels: {{canary: \"yes\"}}}}}}}}]}}\n")
            };
            for (action, expect) in [("Deny", vec!["10.96.0.10/32"]), ("Accept", vec![])] {
                let r = with(
                    &[objects.to_string(), cnp("p", "Admin", 0, &body(action))].join("\n---\n"),
                );
                let c = pod(&r, "n2", "x", "c").unwrap();
                let vips: Vec<IpPrefix> = c
                    .egress
                    .as_ref()
                    .unwrap()
                    .admin
                    .iter()
                    .flat_map(|t| t.peers.iter())
                    .map(|p| p.cidr.clone().unwrap())
                    .filter(|p| p.addr[0] == 10 && p.addr[1] == 96)
                    .collect();
                assert_eq!(
                    vips,
                    expect.iter().map(|s| v4(s)).collect::<Vec<_>>(),
                    "{action}"
                );
            }
        }

        #[test]
        fn domain_names_go_to_the_plan_after_the_rules_other_peers() {
            let r = with(&cnp("p", "Admin", 3, "  subject: {namespaces: {}}\n  egress:\n  - {name: web, action: Accept, to: [{networks: [192.0.2.0/24]}, {domainNames: [\"*.Example.com.\", api.stripe.com]}], protocols: [{tcp: {destinationPort: {number: 443}}}]}\n  - {name: names-only, action: Accept, to: [{domainNames: [example.org]}]}\n  - {action: Deny, to: [{networks: [0.0.0.0/0]}]}\n"));
            let a = pod(&r, "n1", "x", "a").unwrap();
            let admin = &a.egress.as_ref().unwrap().admin;
            let accept = TierAction::Accept as i32;
            let shape: Vec<_> = admin
                .iter()
                .map(|t| {
                    (
                        t.rule_index,
                        t.action,
                        t.peers.len(),
                        t.domain_names.clone(),
                    )
                })
                .collect();
            assert_eq!(
                shape,
                vec![
                    (0, accept, 1, vec![]),
                    // Patterns lower-cased, trailing dots gone, sorted.
                    (
                        0,
                        accept,
                        0,
                        vec!["*.example.com".into(), "api.stripe.com".into()]
                    ),
                    (1, accept, 0, vec!["example.org".into()]),
                    (2, TierAction::Deny as i32, 1, vec![]),
                ]
            );
            // The names part keeps its rule's ports and origin.
            assert_eq!(admin[1].ports, vec![range(Protocol::Tcp, 443, 0)]);
            assert_eq!(admin[1].rule_name, "web");
            assert!(admin[2].ports.is_empty(), "every port");
            assert!(r.errors.is_empty(), "{:?}", r.errors);
        }

        #[test]
        fn nodes_peers_are_their_addresses_and_named_ports_any_protocol() {
            let r = with(&[
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: x}}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}, {type: Hostname, address: n1}]}",
            &cnp("p", "Admin", 0, "  subject: {namespaces: {}}\n  egress:\n  - {action: Deny, to: [{nodes: {matchLabels: {zone: x}}}]}\n  - {action: Accept, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: b}}}}], protocols: [{destinationNamedPort: dns}]}\n"),
        ].join("\n---\n"));
            let a = pod(&r, "n1", "x", "a").unwrap();
            let admin = &a.egress.as_ref().unwrap().admin;
            assert_eq!(admin[0].peers[0].cidr, Some(v4("192.168.0.1/32")));
            // x/b's dns port is UDP/53: the name, under every protocol, finds it.
            assert_eq!(admin[1].ports, vec![range(Protocol::Udp, 53, 0)]);
            assert_eq!(admin[1].peers[0].cidr, Some(v4("10.0.0.2/32")));
        }

        #[test]
        fn an_unreadable_deny_denies_everything_and_an_unreadable_accept_nothing() {
            let r = with(&cnp("p", "Admin", 0, "  subject: {namespaces: {}}\n  ingress:\n  - {action: Accept, from: [{}]}\n  - {action: Pass, from: [{}]}\n"));
            let a = pod(&r, "n1", "x", "a").unwrap();
            let admin = &a.ingress.as_ref().unwrap().admin;
            assert_eq!(admin.len(), 1, "the Accept matches nothing: {admin:?}");
            assert_eq!(admin[0].action, TierAction::Deny as i32);
            assert_eq!(admin[0].rule_index, 1);
            assert_eq!(
                admin[0]
                    .peers
                    .iter()
                    .map(|p| p.cidr.clone().unwrap())
                    .collect::<Vec<_>>(),
                vec![v4("0.0.0.0/0"), prefix("::/0".parse().unwrap())]
            );
            assert!(admin[0].ports.is_empty());
        }
    }
}
