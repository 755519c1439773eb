//! A pod's egress rules by name, numbered: a rule's number (its *slot*)
//! is how the learner and `palisade_dns` name it.
//!
//! Only rules that allow by name can be learned (tier rules that Accept,
//! NetworkPolicy rules): the controller sends no other, and a Deny or Pass
//! by name could not be enforced before its name was resolved. A pod's
//! staged (audit) egress rules by name are numbered after its enforced
//! ones: what they learn gives the staged table's port set for a host,
//! which only reports.

use std::fmt;

use palisade_dns::learned::Slot;
use palisade_dns::Pattern;
use palisade_proto::v1::{DirectionPolicy, TierAction, TierRule};

use crate::compile::Named;

/// Where a rule by name sits in its direction's lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleRef {
    Admin(usize),
    NetworkPolicy(usize),
    Baseline(usize),
    /// The same in the pod's staged (audit) egress.
    StagedAdmin(usize),
    StagedNetworkPolicy(usize),
    StagedBaseline(usize),
}

impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleRef::Admin(i) => write!(f, "admin[{i}]"),
            RuleRef::NetworkPolicy(i) => write!(f, "rules[{i}]"),
            RuleRef::Baseline(i) => write!(f, "baseline[{i}]"),
            RuleRef::StagedAdmin(i) => write!(f, "staged admin[{i}]"),
            RuleRef::StagedNetworkPolicy(i) => write!(f, "staged rules[{i}]"),
            RuleRef::StagedBaseline(i) => write!(f, "staged baseline[{i}]"),
        }
    }
}

/// Whether `egress` has a rule to learn for (cheap: patterns unread).
pub fn learns(egress: &DirectionPolicy) -> bool {
    egress
        .admin
        .iter()
        .chain(&egress.baseline)
        .any(|r| accepts(r) && !r.domain_names.is_empty())
        || egress.rules.iter().any(|r| !r.domain_names.is_empty())
}

/// A pattern the plan holds that this enforcer cannot read; the rest of
/// its rule is still learned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("egress {rule}: domain name {pattern:?} cannot be read ({reason}); it matches nothing")]
pub struct PatternError {
    pub rule: RuleRef,
    pub pattern: String,
    pub reason: String,
}

/// A pod's egress rules by name; slot = position in `rules`.
#[derive(Clone, Default)]
pub struct DomainRules {
    rules: Vec<(RuleRef, Vec<Pattern>)>,
}

impl PartialEq for DomainRules {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules
    }
}

fn accepts(r: &TierRule) -> bool {
    TierAction::try_from(r.action) == Ok(TierAction::Accept)
}

impl DomainRules {
    /// The learnable rules of `egress` and then of `staged` (the pod's
    /// staged egress), with the patterns that cannot be read. More rules
    /// than slots can number are not learned (an error each).
    pub fn of(
        egress: &DirectionPolicy,
        staged: Option<&DirectionPolicy>,
    ) -> (DomainRules, Vec<PatternError>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        fn tier(list: &[TierRule], at: fn(usize) -> RuleRef) -> Vec<(RuleRef, &Vec<String>)> {
            list.iter()
                .enumerate()
                .filter(|(_, r)| accepts(r) && !r.domain_names.is_empty())
                .map(|(i, r)| (at(i), &r.domain_names))
                .collect()
        }
        type At = fn(usize) -> RuleRef;
        let enforced: [At; 3] = [RuleRef::Admin, RuleRef::NetworkPolicy, RuleRef::Baseline];
        let staged_at: [At; 3] = [
            RuleRef::StagedAdmin,
            RuleRef::StagedNetworkPolicy,
            RuleRef::StagedBaseline,
        ];
        let mut named = Vec::new();
        for (d, [admin, np, baseline]) in [(Some(egress), enforced), (staged, staged_at)] {
            let Some(d) = d else { continue };
            named.extend(tier(&d.admin, admin));
            named.extend(
                d.rules
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| !r.domain_names.is_empty())
                    .map(|(i, r)| (np(i), &r.domain_names)),
            );
            named.extend(tier(&d.baseline, baseline));
        }
        for (rule, names) in named {
            if rules.len() > usize::from(Slot::MAX) {
                errors.push(PatternError {
                    rule,
                    pattern: names.join(","),
                    reason: format!("more than {} rules by name", usize::from(Slot::MAX) + 1),
                });
                continue;
            }
            let mut patterns = Vec::with_capacity(names.len());
            for text in names {
                match text.parse::<Pattern>() {
                    Ok(p) => patterns.push(p),
                    Err(e) => errors.push(PatternError {
                        rule,
                        pattern: text.clone(),
                        reason: e.to_string(),
                    }),
                }
            }
            rules.push((rule, patterns));
        }
        (DomainRules { rules }, errors)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Patterns by slot, as `palisade_dns` takes them.
    pub fn patterns(&self) -> Vec<Vec<Pattern>> {
        self.rules.iter().map(|(_, p)| p.clone()).collect()
    }

    /// The rule of a slot.
    pub fn rule(&self, slot: Slot) -> Option<RuleRef> {
        self.rules.get(usize::from(slot)).map(|(r, _)| *r)
    }

    /// The enforced rules of `slots`, as the compiler takes them.
    pub fn named(&self, slots: impl IntoIterator<Item = Slot>) -> Named {
        self.named_of(slots, false)
    }

    /// The staged rules of `slots`, as the compiler takes them (for the
    /// staged egress).
    pub fn named_staged(&self, slots: impl IntoIterator<Item = Slot>) -> Named {
        self.named_of(slots, true)
    }

    fn named_of(&self, slots: impl IntoIterator<Item = Slot>, staged: bool) -> Named {
        let mut named = Named::default();
        for slot in slots {
            let Some(rule) = self.rule(slot) else {
                continue;
            };
            let (is_staged, list, i) = match rule {
                RuleRef::Admin(i) => (false, &mut named.admin, i),
                RuleRef::NetworkPolicy(i) => (false, &mut named.network_policy, i),
                RuleRef::Baseline(i) => (false, &mut named.baseline, i),
                RuleRef::StagedAdmin(i) => (true, &mut named.admin, i),
                RuleRef::StagedNetworkPolicy(i) => (true, &mut named.network_policy, i),
                RuleRef::StagedBaseline(i) => (true, &mut named.baseline, i),
            };
            if is_staged == staged {
                list.insert(i);
            }
        }
        named
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Every rule with its patterns as written, for the state dump.
    pub fn describe(&self) -> Vec<(RuleRef, Vec<String>)> {
        self.rules
            .iter()
            .map(|(r, p)| (*r, p.iter().map(ToString::to_string).collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_proto::v1::Rule;

    fn tier(action: TierAction, names: &[&str]) -> TierRule {
        TierRule {
            action: action as i32,
            domain_names: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn slots_number_the_learnable_rules_in_tier_order() {
        let egress = DirectionPolicy {
            admin: vec![
                tier(TierAction::Deny, &[]),
                tier(TierAction::Accept, &["a.example"]),
                tier(TierAction::Deny, &["refused.example"]),
                tier(TierAction::Pass, &["passed.example"]),
            ],
            rules: vec![
                Rule::default(),
                Rule {
                    domain_names: vec!["*.np.example".into(), "bad..name".into()],
                    ..Default::default()
                },
            ],
            baseline: vec![tier(TierAction::Accept, &["b.example"])],
            not_isolated: false,
        };
        let (rules, errors) = DomainRules::of(&egress, None);
        assert_eq!(
            rules.describe(),
            [
                (RuleRef::Admin(1), vec!["a.example".to_string()]),
                (RuleRef::NetworkPolicy(1), vec!["*.np.example".to_string()]),
                (RuleRef::Baseline(0), vec!["b.example".to_string()]),
            ]
        );
        assert_eq!(errors.len(), 1);
        let text = errors[0].to_string();
        assert!(
            text.contains("rules[1]") && text.contains("bad..name"),
            "{text}"
        );
        let named = rules.named([0, 2, 9]);
        assert_eq!(named.admin, [1].into());
        assert_eq!(named.baseline, [0].into());
        assert!(named.network_policy.is_empty());
        assert_eq!(rules.rule(1), Some(RuleRef::NetworkPolicy(1)));
        assert!(DomainRules::of(&DirectionPolicy::default(), None)
            .0
            .is_empty());
        // Staged rules come after, and are named apart.
        let staged = DirectionPolicy {
            admin: vec![tier(TierAction::Accept, &["s.example"])],
            ..Default::default()
        };
        let (both, _) = DomainRules::of(&egress, Some(&staged));
        assert_eq!(both.rule(3), Some(RuleRef::StagedAdmin(0)));
        assert_eq!(both.named_staged([0, 3]).admin, [0].into());
        assert_eq!(both.named([0, 3]).admin, [1].into());
        assert_eq!(RuleRef::StagedAdmin(0).to_string(), "staged admin[0]");
    }
}
