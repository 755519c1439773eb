//! Staged (audit) policies: a NetworkPolicy annotated `palisade.io/audit:
//! "true"` is evaluated against real traffic and never enforced. It
//! resolves exactly like an enforced one, into the audit directions.

use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_apis::Tier;
use palisade_proto::v1::{DirectionPolicy, Rule, TierRule};

/// The annotation that stages a NetworkPolicy: evaluated against real
/// traffic, never enforced.
pub const AUDIT_ANNOTATION: &str = "palisade.io/audit";

/// Whether a policy is staged (annotated `palisade.io/audit: "true"`).
/// Only "true" stages it, and "false" is the explicit way to say it is not;
/// any other value (a `True` or a `yes`) is probably meant to stage it, but
/// guessing could leave a policy unenforced that its author expects to
/// enforce, so it is enforced and named as an error.
pub fn is_staged(policy: &NetworkPolicy, policy_name: &str, errors: &mut Vec<String>) -> bool {
    staged_by(
        policy.metadata.annotations.as_ref(),
        &super::target::PolicyLabel(policy_name).to_string(),
        errors,
    )
}

/// [`is_staged`] for any policy's annotations; `label` names it in the
/// error (`NetworkPolicy ns/name`, `ClusterNetworkPolicy/name`).
pub(super) fn staged_by(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    label: &str,
    errors: &mut Vec<String>,
) -> bool {
    match annotations
        .and_then(|a| a.get(AUDIT_ANNOTATION))
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            errors.push(format!(
                "{label}: annotation {AUDIT_ANNOTATION}: {other:?} is neither \"true\" nor \"false\"; the policy is enforced"
            ));
            false
        }
    }
}

/// One direction's rules as they are collected, in the order they come:
/// what enforcement sees (the enforced policies' rules) and, when some
/// staged policy applies, what it would see once they are enforced (all of
/// them, in the same order). The parts are kept until `finish` so that the
/// common case, nothing staged, moves every rule once instead of copying it
/// into both.
#[derive(Default)]
pub(super) struct DirectionRules {
    parts: Vec<Part>,
    staged: bool,
}

#[derive(Clone)]
enum Part {
    /// A NetworkPolicy that applies in this direction (isolating it, even
    /// without rules) and its rules.
    Rules { staged: bool, rules: Vec<Rule> },
    /// A ClusterNetworkPolicy's rules, in order.
    Tier {
        tier: Tier,
        staged: bool,
        rules: Vec<TierRule>,
    },
}

/// A direction's NetworkPolicy rules (and whether one isolates it) and
/// tier rules.
#[derive(Default)]
struct Collected {
    isolated: bool,
    policy: DirectionPolicy,
}

impl Collected {
    fn add(&mut self, part: Part) {
        match part {
            Part::Rules { rules, .. } => {
                self.isolated = true;
                self.policy.rules.extend(rules);
            }
            Part::Tier {
                tier: Tier::Admin,
                rules,
                ..
            } => self.policy.admin.extend(rules),
            Part::Tier {
                tier: Tier::Baseline,
                rules,
                ..
            } => self.policy.baseline.extend(rules),
        }
    }

    /// None: nothing decides this direction (not isolated, no tier rule).
    fn finish(mut self) -> Option<DirectionPolicy> {
        let tiers = !self.policy.admin.is_empty() || !self.policy.baseline.is_empty();
        if !self.isolated && !tiers {
            return None;
        }
        self.policy.not_isolated = !self.isolated;
        Some(self.policy)
    }
}

impl Part {
    fn staged(&self) -> bool {
        match self {
            Part::Rules { staged, .. } | Part::Tier { staged, .. } => *staged,
        }
    }
}

impl DirectionRules {
    /// A NetworkPolicy that applies in this direction (isolating it, even
    /// without rules) and its rules.
    pub(super) fn add(&mut self, staged: bool, rules: impl Iterator<Item = Rule>) {
        self.staged |= staged;
        self.parts.push(Part::Rules {
            staged,
            rules: rules.collect(),
        });
    }

    /// A ClusterNetworkPolicy's rules for this direction, in order (called
    /// in precedence order).
    pub(super) fn add_tier(&mut self, tier: Tier, staged: bool, rules: Vec<TierRule>) {
        self.staged |= staged;
        self.parts.push(Part::Tier {
            tier,
            staged,
            rules,
        });
    }

    /// (enforced, audit): the audit policy exists only where a staged policy
    /// applies; it is what removing every staged annotation would enforce.
    pub(super) fn finish(self) -> (Option<DirectionPolicy>, Option<DirectionPolicy>) {
        let mut enforced = Collected::default();
        if !self.staged {
            for part in self.parts {
                enforced.add(part);
            }
            return (enforced.finish(), None);
        }
        let mut all = Collected::default();
        for part in self.parts {
            if !part.staged() {
                enforced.add(part.clone());
            }
            all.add(part);
        }
        // A staged policy applies, so the audit direction is always there
        // (deciding nothing, when that is what it would do).
        let audit = all.finish().unwrap_or_else(|| DirectionPolicy {
            not_isolated: true,
            ..Default::default()
        });
        (enforced.finish(), Some(audit))
    }
}
