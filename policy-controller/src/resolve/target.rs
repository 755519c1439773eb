//! One pod's policy: the NetworkPolicies of its namespace that select it,
//! their rules unioned per direction, and the ClusterNetworkPolicies that
//! select it, their rules in precedence order in their tiers (`tiers.rs`);
//! staged ones apart.
//!
//! This is where every kind of policy meets.

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use palisade_apis::application_network_policy::{domain_names, kind_and_name};
use palisade_proto::v1::{IpPrefix, PodPolicy, PodRef, Rule};

use super::objects::{namespace_of, PodInfo};
use super::peers::PeerSelection;
use super::rules::{Path, RuleContext, ServiceCoverage};
use super::selector_matches;
use super::selectors::EMPTY_SELECTOR;
use super::staging::{is_staged, DirectionRules};
use super::tiers::{placement, TierRules, TieredPolicy};

/// The policy of one pod, from the policies of its namespace (in any order
/// that is the same every time: their names are sorted in the output).
/// Problems found are appended to `errors`. Staged policies resolve exactly
/// like enforced ones (so removing the annotation enforces the same rules)
/// but land in `staged_policies` and the audit directions instead.
///
/// `tiered` are the ClusterNetworkPolicies that select the pod, in
/// precedence order ([`palisade_apis::ClusterNetworkPolicy::precedence`]),
/// each with its rules for the pod ([`TieredPolicy::rules_for`], which a
/// caller may have resolved once for many pods).
pub(crate) fn resolve_pod<'p, 't>(
    target: &PodInfo,
    policies: impl IntoIterator<Item = &'p NetworkPolicy>,
    tiered: impl IntoIterator<Item = (&'t TieredPolicy, TierRules)>,
    selection: &mut dyn PeerSelection,
    errors: &mut Vec<String>,
) -> PodPolicy {
    let mut ingress = DirectionRules::default();
    let mut egress = DirectionRules::default();
    let mut names = Vec::new();
    let mut staged_names = Vec::new();
    for policy in policies {
        let Some(spec) = policy.spec.as_ref() else {
            continue;
        };
        let policy_ns = namespace_of(&policy.metadata);
        let policy_name = format!(
            "{}/{}",
            policy_ns,
            policy.metadata.name.as_deref().unwrap_or_default()
        );
        match selector_matches(
            spec.pod_selector.as_ref().unwrap_or(&EMPTY_SELECTOR),
            &target.labels,
        ) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                errors.push(format!(
                    "{}: spec.podSelector: {e}",
                    PolicyLabel(&policy_name)
                ));
                continue;
            }
        }
        let (applies_ingress, applies_egress) = policy_types(spec);
        let staged = is_staged(policy, &policy_name, errors);
        if staged {
            staged_names.push(policy_name.clone());
        } else {
            names.push(policy_name.clone());
        }
        let over_limit = crate::limits::check_rules(
            &policy_name,
            spec.ingress.as_ref().map_or(0, Vec::len),
            spec.egress.as_ref().map_or(0, Vec::len),
            crate::limits::rules_per_policy(),
        );
        if let Some(e) = over_limit {
            // Fail closed: it still isolates the pods it selects, with none
            // of its rules, and is never resolved rule by rule.
            errors.push(e);
            if applies_ingress {
                ingress.add(staged, std::iter::empty());
            }
            if applies_egress {
                egress.add(staged, std::iter::empty());
            }
            continue;
        }
        let label = PolicyLabel(&policy_name);
        let mut ctx = RuleContext {
            selection: &mut *selection,
            policy_ns: &policy_ns,
            label: &label,
            errors: &mut *errors,
            services: ServiceCoverage::Every,
        };
        if applies_ingress {
            // A policy without rules still isolates: add() marks it.
            ingress.add(staged, std::iter::empty());
            for (i, r) in spec.ingress.iter().flatten().enumerate() {
                let field = Path {
                    parent: &"spec",
                    key: "ingress",
                    index: i,
                };
                let rules = ctx.ingress_rule(&field, r.from.as_deref(), r.ports.as_deref(), target);
                ingress.add(staged, with_origin(rules, &policy_name, i));
            }
        }
        if applies_egress {
            egress.add(staged, std::iter::empty());
            // An ApplicationNetworkPolicy's peers by name (see
            // `palisade_apis::application_network_policy`).
            let mut by_name = domain_names(policy);
            for (i, r) in spec.egress.iter().flatten().enumerate() {
                let field = Path {
                    parent: &"spec",
                    key: "egress",
                    index: i,
                };
                let mut rules = ctx.egress_rule(&field, r.to.as_deref(), r.ports.as_deref());
                if let Some(names) = by_name.remove(&i) {
                    rules.extend(ctx.name_rule(&field, &names, r.ports.as_deref()));
                }
                egress.add(staged, with_origin(rules, &policy_name, i));
            }
        }
    }
    names.sort();
    staged_names.sort();
    for (t, rules) in tiered {
        let place = placement(t, errors);
        if place.staged {
            staged_names.push(t.id.clone());
        } else {
            names.push(t.id.clone());
        }
        ingress.add_tier(place.tier, place.staged, rules.ingress);
        egress.add_tier(place.tier, place.staged, rules.egress);
    }
    let (ingress, audit_ingress) = ingress.finish();
    let (egress, audit_egress) = egress.finish();
    PodPolicy {
        pod: Some(PodRef {
            namespace: target.namespace.clone(),
            name: target.name.clone(),
        }),
        pod_ips: target.ips.iter().map(|ip| IpPrefix::host(*ip)).collect(),
        ingress,
        egress,
        policies: names,
        staged_policies: staged_names,
        audit_ingress,
        audit_egress,
    }
}

/// Stamps plan rules with the policy rule they come from, so a flow log or
/// an explanation can name it.
fn with_origin(rules: Vec<Rule>, policy: &str, index: usize) -> impl Iterator<Item = Rule> + '_ {
    rules.into_iter().map(move |mut rule| {
        rule.policy = policy.to_string();
        rule.rule_index = index as u32;
        rule
    })
}

/// policyTypes as upstream defaults them: Ingress always, Egress when the
/// policy has egress rules.
fn policy_types(spec: &NetworkPolicySpec) -> (bool, bool) {
    match &spec.policy_types {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.is_some()),
    }
}

/// How errors name a namespaced policy (`NetworkPolicy ns/name`,
/// `ApplicationNetworkPolicy ns/name`), written out only when one does.
pub(crate) struct PolicyLabel<'a>(pub &'a str);

impl std::fmt::Display for PolicyLabel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ns, name) = self.0.split_once('/').unwrap_or(("", self.0));
        let (kind, name) = kind_and_name(name);
        write!(f, "{kind} {ns}/{name}")
    }
}
