//! Limits on what one policy may ask of the controller and the nodes
//! (issue 18): the one home of their values. A policy over a limit is not
//! resolved: the pods it selects are isolated in its directions with none
//! of its rules (denied what it would allow, never opened), and the error
//! names it; nothing else changes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Rules (`spec.ingress` plus `spec.egress`) one NetworkPolicy may have
/// (`--max-rules-per-policy`). Resolution and the plan grow with them.
pub const MAX_RULES_PER_POLICY: usize = 100_000;

/// Bytes one node's plan may take in a snapshot
/// (`--max-plan-bytes-per-node`): three quarters of what a plan message may
/// be, so the snapshot, its framing and trace context always fit. Over it,
/// the largest policies are left out of that node's plan ([`crate::budget`]).
pub const MAX_PLAN_BYTES_PER_NODE: usize = palisade_proto::MAX_PLAN_MESSAGE_BYTES / 4 * 3;

/// The most `--max-plan-bytes-per-node` may be: a plan message less the
/// room its framing needs.
pub const PLAN_BYTES_CEILING: usize = palisade_proto::MAX_PLAN_MESSAGE_BYTES - (1 << 20);

/// The error for a plan budget no message could carry, or None.
pub fn check_plan_budget(bytes: usize) -> Option<String> {
    (bytes > PLAN_BYTES_CEILING).then(|| {
        format!(
            "--max-plan-bytes-per-node: {bytes} is more than a plan message may carry ({PLAN_BYTES_CEILING} at most)"
        )
    })
}

static RULES_PER_POLICY: AtomicUsize = AtomicUsize::new(MAX_RULES_PER_POLICY);

/// The limit in force.
pub fn rules_per_policy() -> usize {
    RULES_PER_POLICY.load(Ordering::Relaxed)
}

/// Sets the limit for this process (the flag, at start).
pub fn set_rules_per_policy(n: usize) {
    RULES_PER_POLICY.store(n, Ordering::Relaxed);
}

/// The error for a policy over the rule limit, or None within it.
pub fn check_rules(policy: &str, ingress: usize, egress: usize, limit: usize) -> Option<String> {
    let rules = ingress + egress;
    (rules > limit).then(|| {
        format!(
            "{}: spec: {rules} rules ({ingress} ingress, {egress} egress), more than the {limit} one policy may have (--max-rules-per-policy); not enforced: the pods it selects are denied what it would allow",
            crate::resolve::PolicyLabel(policy)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_itself_passes_and_one_more_is_named() {
        assert_eq!(check_rules("x/p", 60_000, 40_000, 100_000), None);
        let e = check_rules("x/p", 60_000, 40_001, 100_000).unwrap();
        assert!(
            e.starts_with("NetworkPolicy x/p: spec: 100001 rules"),
            "{e}"
        );
        assert!(e.contains("--max-rules-per-policy"), "{e}");
        assert_eq!(check_rules("x/p", 0, 0, 0), None);
        assert!(check_rules("x/p", 1, 0, 0).is_some());
    }

    #[test]
    fn a_plan_budget_must_fit_in_a_message() {
        assert_eq!(check_plan_budget(MAX_PLAN_BYTES_PER_NODE), None);
        assert_eq!(check_plan_budget(PLAN_BYTES_CEILING), None);
        let e = check_plan_budget(PLAN_BYTES_CEILING + 1).unwrap();
        assert!(e.starts_with("--max-plan-bytes-per-node: "), "{e}");
    }
}
