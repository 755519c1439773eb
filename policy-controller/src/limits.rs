//! Limits on what one policy may ask of the controller and the nodes
//! (issue 18): the one home of their values. A policy over a limit is not
//! resolved: the pods it selects are isolated in its directions with none
//! of its rules (denied what it would allow, never opened), and the error
//! names it; nothing else changes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Rules (`spec.ingress` plus `spec.egress`) one NetworkPolicy may have
/// (`--max-rules-per-policy`). Resolution and the plan grow with them.
pub const MAX_RULES_PER_POLICY: usize = 100_000;

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
            "NetworkPolicy {policy}: spec: {rules} rules ({ingress} ingress, {egress} egress), more than the {limit} one policy may have (--max-rules-per-policy); not enforced: the pods it selects are denied what it would allow"
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
}
