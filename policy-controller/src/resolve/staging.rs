//! Staged (audit) policies: a NetworkPolicy annotated `palisade.io/audit:
//! "true"` is evaluated against real traffic and never enforced. It
//! resolves exactly like an enforced one, into the audit directions.

use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_proto::v1::{DirectionPolicy, Rule};

/// The annotation that stages a NetworkPolicy: evaluated against real
/// traffic, never enforced.
pub const AUDIT_ANNOTATION: &str = "palisade.io/audit";

/// Whether a policy is staged (annotated `palisade.io/audit: "true"`).
/// Only "true" stages it, and "false" is the explicit way to say it is not;
/// any other value (a `True` or a `yes`) is probably meant to stage it, but
/// guessing could leave a policy unenforced that its author expects to
/// enforce, so it is enforced and named as an error.
pub fn is_staged(policy: &NetworkPolicy, policy_name: &str, errors: &mut Vec<String>) -> bool {
    let value = policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(AUDIT_ANNOTATION));
    match value.map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            errors.push(format!(
                "NetworkPolicy {policy_name}: annotation {AUDIT_ANNOTATION}: {other:?} is neither \"true\" nor \"false\"; the policy is enforced"
            ));
            false
        }
    }
}

/// One direction's rules as they are collected: the enforced ones, and (when
/// some staged policy applies) all of them, enforced and staged, in the
/// order enforcement would see them once the staged policies are enforced.
#[derive(Default)]
pub(super) struct DirectionRules {
    enforced: Option<DirectionPolicy>,
    all: DirectionPolicy,
    staged: bool,
}

impl DirectionRules {
    pub(super) fn add(&mut self, staged: bool, rules: impl Iterator<Item = Rule>) {
        let rules: Vec<Rule> = rules.collect();
        if staged {
            self.staged = true;
        } else {
            self.enforced
                .get_or_insert_with(DirectionPolicy::default)
                .rules
                .extend(rules.iter().cloned());
        }
        self.all.rules.extend(rules);
    }

    /// (enforced, audit): the audit policy exists only where a staged policy
    /// applies; it is what removing every staged annotation would enforce.
    pub(super) fn finish(self) -> (Option<DirectionPolicy>, Option<DirectionPolicy>) {
        let audit = self.staged.then_some(self.all);
        (self.enforced, audit)
    }
}
