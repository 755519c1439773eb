//! The controller's metrics, read off the hub at scrape time (plans,
//! reports, connections, realization), plus the duration of resolution
//! passes, recorded as they happen.

use std::time::Duration;

use crate::debug::realization::realization;
use crate::hub::HubView;
use crate::source::SourceError;
use crate::tls::Refusals;
use palisade_runtime::exposition::{Exposition, Histogram};

/// Resolution passes from 1 ms to 1 min: a small cluster's pass takes
/// microseconds, a large cluster's first full pass seconds.
static PASS_SECONDS: Histogram = Histogram::new(&[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
]);

/// Records one resolution pass (a view diffed, or a batch of changes
/// applied), from taking its input to publishing its plans.
pub fn observe_pass(took: Duration) {
    PASS_SECONDS.observe(took);
}

/// The exposition of the hub's view and of the callers refused so far.
pub fn render(view: &HubView, refusals: &Refusals) -> String {
    let status = realization(view, None);
    let mut e = Exposition::default();
    e.single(
        "palisade_controller_source_synced",
        "gauge",
        "1 once the source has produced one complete view of the cluster; no plan is served before.",
        u64::from(view.source_synced),
    );
    e.single(
        "palisade_controller_source_revision",
        "gauge",
        "Views of the cluster resolved and published since the controller started.",
        view.source_revision,
    );
    e.single(
        "palisade_controller_errors",
        "gauge",
        "Problems in the objects or in reading the source (GetControllerState lists them).",
        view.errors.len() as u64,
    );
    let name = "palisade_controller_source_errors";
    e.family(
        name,
        "gauge",
        "Of those, problems reading the source, by kind: parse, malformed, unknown_kind and invalid (manifests refused; the last accepted view stays in force), io and reader (the manifest directory unread), watch (failing watches).",
    );
    for kind in SourceError::METRIC_LABELS {
        let count = view.source_errors_by_kind.get(kind).copied().unwrap_or(0);
        e.sample_u64(name, &[("kind", kind)], count as u64);
    }
    e.single(
        "palisade_controller_nodes",
        "gauge",
        "Nodes the controller holds a plan or a report for.",
        status.nodes.len() as u64,
    );
    e.single(
        "palisade_controller_nodes_connected",
        "gauge",
        "Nodes whose enforcer holds a plan stream.",
        status.nodes.iter().filter(|n| n.connected).count() as u64,
    );
    e.single(
        "palisade_controller_nodes_realized",
        "gauge",
        "Nodes that reported realizing their current plan.",
        status.nodes.iter().filter(|n| n.realized).count() as u64,
    );
    type NodeValue = fn(&palisade_proto::v1::NodeRealization) -> u64;
    let per_node: [(&str, &str, NodeValue); 5] = [
        (
            "palisade_controller_node_plan_version",
            "The version of the node's current plan (what a connected enforcer was sent).",
            |n| n.plan_version,
        ),
        (
            "palisade_controller_node_realized_version",
            "The plan version the node last reported realized; 0 before its first report.",
            |n| n.realized_version,
        ),
        (
            "palisade_controller_node_realization_lag_versions",
            "Plan versions the node is behind its current plan (0 before its first report).",
            |n| n.lag_versions,
        ),
        (
            "palisade_controller_node_realized",
            "1 when the node reported realizing its current plan.",
            |n| u64::from(n.realized),
        ),
        (
            "palisade_controller_node_connected",
            "1 when the node's enforcer holds a plan stream.",
            |n| u64::from(n.connected),
        ),
    ];
    for (name, help, value) in per_node {
        e.family(name, "gauge", help);
        for n in &status.nodes {
            e.sample_u64(name, &[("node", &n.node_name)], value(n));
        }
    }
    e.family(
        "palisade_controller_policy_expected_nodes",
        "gauge",
        "Nodes whose plan needs the policy (a pod there is selected by it).",
    );
    for p in &status.policies {
        e.sample_u64(
            "palisade_controller_policy_expected_nodes",
            &[("policy", &p.policy)],
            u64::from(p.expected_nodes),
        );
    }
    e.family(
        "palisade_controller_policy_realized_nodes",
        "gauge",
        "Nodes that need the policy and realized it (GetRealization names the others).",
    );
    for p in &status.policies {
        e.sample_u64(
            "palisade_controller_policy_realized_nodes",
            &[("policy", &p.policy)],
            u64::from(p.realized_nodes),
        );
    }
    let name = "palisade_controller_cluster_network_policies";
    e.family(
        name,
        "gauge",
        "ClusterNetworkPolicies in the controller's view (staged ones included), by tier and API group.",
    );
    for tier in ["Admin", "Baseline"] {
        for group in ["policy.networking.k8s.io", "networking.k8s.aws"] {
            let n = view
                .cluster_policies
                .get(&(tier, group))
                .copied()
                .unwrap_or(0);
            e.sample_u64(name, &[("tier", tier), ("group", group)], n as u64);
        }
    }
    e.single(
        "palisade_controller_policies_expected",
        "gauge",
        "Policies some node needs.",
        status.policies.len() as u64,
    );
    e.single(
        "palisade_controller_policies_realized",
        "gauge",
        "Policies realized on every node that needs them.",
        status
            .policies
            .iter()
            .filter(|p| p.realized_nodes == p.expected_nodes)
            .count() as u64,
    );
    let name = "palisade_controller_refused_calls_total";
    e.family(
        name,
        "counter",
        "Calls refused under mutual TLS, by reason: unauthenticated (no client certificate), wrong_node (a node certificate asking for another node), not_permitted (a certificate asking for what its kind may not have).",
    );
    let [unauthenticated, wrong_node, not_permitted] = refusals.snapshot();
    for (reason, count) in [
        ("unauthenticated", unauthenticated),
        ("wrong_node", wrong_node),
        ("not_permitted", not_permitted),
    ] {
        e.sample_u64(name, &[("reason", reason)], count);
    }
    e.histogram(
        "palisade_controller_resolve_duration_seconds",
        "Duration of a resolution pass: a view or a batch of changes, resolved and published.",
        &PASS_SECONDS,
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::hub::Hub;

    #[test]
    fn refused_calls_are_counted_by_reason() {
        let refusals = Refusals::default();
        refusals.wrong_node.fetch_add(3, Ordering::Relaxed);
        refusals.not_permitted.fetch_add(1, Ordering::Relaxed);
        let text = render(&Hub::new(1).view(), &refusals);
        assert!(text.contains("# TYPE palisade_controller_refused_calls_total counter"));
        for line in [
            "palisade_controller_refused_calls_total{reason=\"unauthenticated\"} 0",
            "palisade_controller_refused_calls_total{reason=\"wrong_node\"} 3",
            "palisade_controller_refused_calls_total{reason=\"not_permitted\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
    }
}
