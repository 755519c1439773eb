//! A node's plan within its byte budget (issue 18): the plan of one node is
//! sent whole in a snapshot, so a few pods selected by one very large policy
//! could make it bigger than a plan message may be, and the stream of that
//! node would fail for every pod on it. Instead the policies that bring the
//! most bytes are left out of that node's plan, one by one, largest first,
//! until it fits: the pods they select there stay isolated in their
//! directions with none of their rules (denied what they would allow, never
//! opened), the error names each policy, and every other policy's rules and
//! every other pod's entry stay exactly as resolved.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_proto::v1::{DirectionPolicy, PodPolicy};
use prost::Message;

use crate::plan::{Entry, Plan};

/// What a snapshot adds to each pod entry: the field's tag and length.
const ENTRY_FRAMING: usize = 6;

/// A node's plan after the budget, and the errors that say what it left out.
pub struct Fitted {
    pub plan: Arc<Plan>,
    pub errors: Vec<String>,
}

/// The bytes `plan` takes in a snapshot, near enough to bound it (framing
/// counted at its largest).
pub fn plan_bytes(plan: &Plan) -> usize {
    plan.pods
        .values()
        .map(|e| e.encoded_len() + ENTRY_FRAMING)
        .sum()
}

/// `plan` itself when it fits in `budget` bytes; otherwise the plan with the
/// largest policies' rules left out until it does.
pub fn fit(node: &str, plan: Arc<Plan>, budget: usize) -> Fitted {
    let total = plan_bytes(&plan);
    if total <= budget {
        return Fitted {
            plan,
            errors: Vec::new(),
        };
    }
    let decoded: Vec<(_, PodPolicy)> = plan
        .pods
        .iter()
        .map(|(k, e)| (k.clone(), e.decode()))
        .collect();
    let mut weight: BTreeMap<&str, Weight> = BTreeMap::new();
    for (_, pod) in &decoded {
        let mut in_pod: BTreeMap<&str, usize> = BTreeMap::new();
        for direction in directions(pod) {
            for rule in &direction.rules {
                *in_pod.entry(rule.policy.as_str()).or_default() += framed(rule.encoded_len());
            }
        }
        for (policy, bytes) in in_pod {
            let w = weight.entry(policy).or_default();
            w.bytes += bytes;
            w.pods += 1;
        }
    }
    // Largest first; equal weights by name, so the choice is stable.
    let mut order: Vec<(&str, Weight)> = weight.into_iter().collect();
    order.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
    // The estimate only falls by the rules' own bytes; the messages around
    // them shrink too, so the real size is at most the estimate.
    let mut estimate = total;
    let mut dropped: Vec<(&str, Weight)> = Vec::new();
    for (policy, w) in order {
        if estimate <= budget {
            break;
        }
        estimate -= w.bytes.min(estimate);
        dropped.push((policy, w));
    }
    let errors = dropped
        .iter()
        .map(|(policy, w)| {
            format!(
                "node {node}: its plan would be {total} bytes, more than the {budget} one node's plan may have (--max-plan-bytes-per-node); NetworkPolicy {policy} ({} bytes of rules for {} pods) is not enforced on this node: the pods it selects there are denied what it would allow",
                w.bytes, w.pods
            )
        })
        .collect();
    let left_out: Vec<String> = dropped.iter().map(|(p, _)| p.to_string()).collect();
    let mut pods = plan.pods.clone();
    for (key, mut pod) in decoded {
        let mut touched = false;
        for direction in directions_mut(&mut pod) {
            let before = direction.rules.len();
            direction.rules.retain(|r| !left_out.contains(&r.policy));
            touched |= direction.rules.len() != before;
        }
        if touched {
            pods.insert(key, Entry::new(pod));
        }
    }
    Fitted {
        plan: Arc::new(Plan { pods }),
        errors,
    }
}

#[derive(Clone, Copy, Default)]
struct Weight {
    bytes: usize,
    pods: usize,
}

/// A rule's bytes with its field's tag and length.
fn framed(len: usize) -> usize {
    len + 1 + prost::length_delimiter_len(len)
}

fn directions(pod: &PodPolicy) -> impl Iterator<Item = &DirectionPolicy> {
    [
        &pod.ingress,
        &pod.egress,
        &pod.audit_ingress,
        &pod.audit_egress,
    ]
    .into_iter()
    .flatten()
}

fn directions_mut(pod: &mut PodPolicy) -> impl Iterator<Item = &mut DirectionPolicy> {
    [
        &mut pod.ingress,
        &mut pod.egress,
        &mut pod.audit_ingress,
        &mut pod.audit_egress,
    ]
    .into_iter()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::PodKey;
    use palisade_proto::v1::{IpPrefix, PeerBlock, PodRef, Rule};

    fn rule(policy: &str, i: u32) -> Rule {
        Rule {
            peers: vec![PeerBlock {
                cidr: Some(IpPrefix {
                    addr: vec![172, 16, (i >> 8) as u8, i as u8],
                    prefix_len: 32,
                }),
                except: vec![],
            }],
            ports: vec![],
            policy: policy.into(),
            rule_index: i,
            domain_names: vec![],
        }
    }

    /// Pod `name` with `rules` rules of each named policy on ingress.
    fn pod(name: &str, policies: &[(&str, u32)]) -> (Arc<PodKey>, Entry) {
        let rules = policies
            .iter()
            .flat_map(|(p, n)| (0..*n).map(move |i| rule(p, i)))
            .collect();
        let policy = PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            pod_ips: vec![],
            ingress: Some(DirectionPolicy {
                rules,
                ..Default::default()
            }),
            policies: policies.iter().map(|(p, _)| p.to_string()).collect(),
            ..Default::default()
        };
        let key: Arc<PodKey> = Arc::new(("x".into(), name.into()));
        (key, Entry::new(policy))
    }

    fn plan(pods: Vec<(Arc<PodKey>, Entry)>) -> Arc<Plan> {
        Arc::new(Plan {
            pods: pods.into_iter().collect(),
        })
    }

    fn rules_of(plan: &Plan, pod: &str) -> Vec<String> {
        let key: PodKey = ("x".into(), pod.into());
        let p = plan.pods.get(&key).unwrap().decode();
        p.ingress
            .unwrap()
            .rules
            .into_iter()
            .map(|r| r.policy)
            .collect()
    }

    #[test]
    fn a_plan_within_its_budget_is_itself() {
        let p = plan(vec![pod("a", &[("x/big", 100)])]);
        let fitted = fit("n1", p.clone(), plan_bytes(&p));
        assert!(Arc::ptr_eq(&fitted.plan, &p));
        assert!(fitted.errors.is_empty());
    }

    #[test]
    fn the_largest_policy_is_left_out_and_named_and_nothing_else_changes() {
        let p = plan(vec![
            pod("a", &[("x/small", 3), ("x/big", 500)]),
            pod("b", &[("x/big", 500)]),
            pod("c", &[("x/small", 3)]),
        ]);
        let budget = plan_bytes(&p) / 2;
        let fitted = fit("n1", p.clone(), budget);
        assert!(plan_bytes(&fitted.plan) <= budget);
        assert_eq!(fitted.errors.len(), 1, "{:?}", fitted.errors);
        let e = &fitted.errors[0];
        assert!(e.starts_with("node n1: its plan would be"), "{e}");
        assert!(e.contains("NetworkPolicy x/big"), "{e}");
        assert!(e.contains("for 2 pods"), "{e}");
        assert!(e.contains("--max-plan-bytes-per-node"), "{e}");
        // a keeps the small policy's rules, b is isolated with none: its
        // ingress is still present (denied), and both still list x/big.
        assert_eq!(rules_of(&fitted.plan, "a"), vec!["x/small"; 3]);
        assert!(rules_of(&fitted.plan, "b").is_empty());
        let b = fitted.plan.pods.values().nth(1).unwrap().decode();
        assert!(b.ingress.is_some(), "b stays isolated");
        assert_eq!(b.policies, vec!["x/big"]);
        // c's entry is the resolved one, untouched.
        let c: PodKey = ("x".into(), "c".into());
        assert_eq!(fitted.plan.pods.get(&c), p.pods.get(&c));
    }

    #[test]
    fn policies_are_left_out_largest_first_until_the_plan_fits() {
        let p = plan(vec![
            pod("a", &[("x/p1", 400), ("x/p2", 300), ("x/p3", 10)]),
            pod("b", &[("x/p2", 300)]),
        ]);
        // p2 (600 rules over two pods) goes first; then p1 if needed.
        let without_p2 = plan(vec![
            pod("a", &[("x/p1", 400), ("x/p3", 10)]),
            pod("b", &[]),
        ]);
        // A few bytes of slack: the fitted pods still list x/p2 (it still
        // selects them), and the estimate counts the messages around the
        // rules at their old lengths.
        let fitted = fit("n1", p.clone(), plan_bytes(&without_p2) + 32);
        assert_eq!(fitted.errors.len(), 1, "{:?}", fitted.errors);
        assert!(fitted.errors[0].contains("x/p2"));
        let fitted = fit("n1", p.clone(), plan_bytes(&without_p2) - 8);
        assert_eq!(fitted.errors.len(), 2, "{:?}", fitted.errors);
        assert!(fitted.errors[1].contains("x/p1"));
        assert_eq!(rules_of(&fitted.plan, "a"), vec!["x/p3"; 10]);
    }

    #[test]
    fn a_budget_nothing_fits_in_leaves_every_pod_isolated_with_no_rules() {
        let p = plan(vec![pod("a", &[("x/p1", 5), ("x/p2", 5)])]);
        let fitted = fit("n1", p, 0);
        assert_eq!(fitted.errors.len(), 2);
        assert!(rules_of(&fitted.plan, "a").is_empty());
    }
}
