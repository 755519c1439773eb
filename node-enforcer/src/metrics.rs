//! Prometheus metrics of the enforcer, served on `--metrics-addr` at
//! `/metrics`: what the reconciler holds (plan versions, pods, conntrack
//! cleanups; read through its dump at scrape time), what the datapath
//! counted (verdicts per reason, map fill levels; read from the pinned
//! maps), and pod-up latency.
//!
//! A part that cannot be read is left out of that scrape and
//! `palisade_enforcer_scrape_ok{part=...}` says 0, so a broken reading is
//! visible instead of looking like zero traffic.

use std::path::PathBuf;
use std::time::Duration;

use crate::handle::Handle;
use crate::metrics_maps::{DatapathReading, DIRECTION_LABELS, STAT_LABELS};
use crate::reconciler::Dump;
use palisade_runtime::exposition::{Exposition, Histogram};

/// Pod up, from the CNI ADD call to the pod's policy in the datapath: well
/// under the AWS VPC CNI's 2 s budget when healthy.
static POD_UP_SECONDS: Histogram = Histogram::new(&[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 5.0,
]);

/// Records one pod up, from the request's arrival to its answer.
pub fn observe_pod_up(took: Duration) {
    POD_UP_SECONDS.observe(took);
}

/// What one scrape reads: the enforcer's handle and its pin root.
pub fn scraper(
    handle: Handle,
    pin_root: PathBuf,
) -> impl Fn() -> palisade_runtime::metrics_http::Rendering + Clone + Send + Sync + 'static {
    move || {
        let (handle, pin_root) = (handle.clone(), pin_root.clone());
        let audit_pins = pin_root.clone();
        Box::pin(async move {
            let dump = handle.dump().await;
            let datapath_pins = pin_root.clone();
            let datapath =
                tokio::task::spawn_blocking(move || crate::metrics_maps::read(&datapath_pins))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = &datapath {
                tracing::warn!(error = %e, "metrics: reading the datapath's maps");
            }
            let audit = tokio::task::spawn_blocking(move || audit::read(&audit_pins))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = &audit {
                tracing::warn!(error = %e, "metrics: reading the staged (audit) counters");
            }
            let dns_pins = pin_root.clone();
            let flow_log = flow_log_reading(pin_root).await;
            let dns =
                tokio::task::spawn_blocking(move || crate::metrics_names::read_datapath(&dns_pins))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = &dns {
                tracing::warn!(error = %e, "metrics: reading the DNS capture counters");
            }
            let learner = match handle.learning() {
                Some(l) => Some(l.report().await),
                None => None,
            };
            let mut text = render(dump.as_ref().ok(), datapath.as_ref().ok());
            text.push_str(&audit::render(audit.as_ref().ok()));
            text.push_str(&render_flow_log(flow_log.as_ref()));
            text.push_str(&crate::metrics_names::render(
                dns.as_deref().ok(),
                learner.as_ref(),
            ));
            text
        })
    }
}

pub fn render(dump: Option<&Dump>, datapath: Option<&DatapathReading>) -> String {
    let mut e = Exposition::default();
    e.family(
        "palisade_enforcer_scrape_ok",
        "gauge",
        "1 when this part could be read for this scrape: reconciler (its state) or datapath (the pinned maps).",
    );
    e.sample_u64(
        "palisade_enforcer_scrape_ok",
        &[("part", "reconciler")],
        u64::from(dump.is_some()),
    );
    e.sample_u64(
        "palisade_enforcer_scrape_ok",
        &[("part", "datapath")],
        u64::from(datapath.is_some()),
    );
    if let Some(d) = dump {
        reconciler_metrics(&mut e, d);
    }
    if let Some(r) = datapath {
        datapath_metrics(&mut e, r);
    }
    e.histogram(
        "palisade_enforcer_pod_up_duration_seconds",
        "Pod up, from the CNI ADD request to the pod's policy in the datapath (or the mode's decision at the deadline).",
        &POD_UP_SECONDS,
    );
    e.finish()
}

fn reconciler_metrics(e: &mut Exposition, d: &Dump) {
    e.single(
        "palisade_enforcer_plan_version",
        "gauge",
        "The version of the last plan received from the controller.",
        d.plan_version,
    );
    e.single(
        "palisade_enforcer_realized_version",
        "gauge",
        "The plan version whose policy is in the datapath for every known pod.",
        d.state.realized_version,
    );
    e.single(
        "palisade_enforcer_plan_connected",
        "gauge",
        "1 while the plan stream from the controller is up.",
        u64::from(d.plan_connected),
    );
    e.single(
        "palisade_enforcer_pods",
        "gauge",
        "Pods known on this node.",
        d.state.pods.len() as u64,
    );
    e.single(
        "palisade_enforcer_pods_with_errors",
        "gauge",
        "Pods whose policy is not in the datapath (GetEnforcerState says why).",
        d.state.pods.iter().filter(|p| !p.error.is_empty()).count() as u64,
    );
    e.single(
        "palisade_enforcer_warnings",
        "gauge",
        "Standing warnings (GetEnforcerState lists them).",
        d.warnings.len() as u64,
    );
    e.family(
        "palisade_enforcer_datapath_errors_total",
        "counter",
        "Datapath calls of the reconciler that failed (map writes, attach and detach, interface and address reads), by kind: interface_gone, full (a map or the endpoint slots), kernel (a refused or failed call), io (files under the pin root), invariant (the datapath's own).",
    );
    for (kind, n) in &d.datapath_errors {
        e.sample_u64(
            "palisade_enforcer_datapath_errors_total",
            &[("kind", kind)],
            *n,
        );
    }
    e.single(
        "palisade_enforcer_policy_sets",
        "gauge",
        "Compiled policy sets in the datapath.",
        d.policy_sets.len() as u64,
    );
    let c = &d.conntrack;
    e.single(
        "palisade_enforcer_conntrack_entries",
        "gauge",
        "eBPF conntrack entries at the last cleanup.",
        c.last.entries as u64,
    );
    e.single(
        "palisade_enforcer_conntrack_kernel_entries",
        "gauge",
        "Kernel conntrack entries at the last cleanup.",
        c.last.kernel_entries as u64,
    );
    e.single(
        "palisade_enforcer_conntrack_last_cleanup_kernel_dump",
        "gauge",
        "1 when the last cleanup read the kernel's whole conntrack table over netlink (--conntrack-ask=dump, a kernel without the lookup kfunc, or idle flows of protocols it does not take; GetEnforcerState's asked_by says which), 0 when it asked by lookups only.",
        u64::from(c.last.dumped),
    );
    e.single(
        "palisade_enforcer_conntrack_last_cleanup_kept",
        "gauge",
        "eBPF conntrack entries the last cleanup kept.",
        c.last.kept as u64,
    );
    e.single(
        "palisade_enforcer_conntrack_last_cleanup_removed",
        "gauge",
        "eBPF conntrack entries the last cleanup removed.",
        c.last.removed as u64,
    );
    e.family(
        "palisade_enforcer_conntrack_last_cleanup_duration_seconds",
        "gauge",
        "How long the last cleanup took.",
    );
    e.sample(
        "palisade_enforcer_conntrack_last_cleanup_duration_seconds",
        &[],
        c.last.took.as_secs_f64(),
    );
    e.single(
        "palisade_enforcer_conntrack_cleanups_total",
        "counter",
        "Conntrack cleanups completed.",
        c.cleanups,
    );
    e.single(
        "palisade_enforcer_conntrack_removed_total",
        "counter",
        "eBPF conntrack entries removed by cleanups.",
        c.removed_total,
    );
    e.single(
        "palisade_enforcer_conntrack_cleanup_failing",
        "gauge",
        "1 when the last cleanup failed.",
        u64::from(!c.error.is_empty()),
    );
}

fn datapath_metrics(e: &mut Exposition, r: &DatapathReading) {
    e.family(
        "palisade_enforcer_verdicts_total",
        "counter",
        "Packets judged by the datapath, by the pod's direction (egress: packets it sends; ingress: packets to it), verdict and reason, summed over every pod.",
    );
    for (hook, direction) in DIRECTION_LABELS {
        for (stat, verdict, reason) in STAT_LABELS {
            let slot = palisade_ebpf::stat_slot(hook, stat);
            if let Some(n) = r.verdicts.get(slot as usize) {
                e.sample_u64(
                    "palisade_enforcer_verdicts_total",
                    &[
                        ("direction", direction),
                        ("verdict", verdict),
                        ("reason", reason),
                    ],
                    *n,
                );
            }
        }
    }
    e.family(
        "palisade_enforcer_map_entries",
        "gauge",
        "Entries in each main eBPF map (counted by walking its keys).",
    );
    for m in &r.maps {
        e.sample_u64(
            "palisade_enforcer_map_entries",
            &[("map", m.name)],
            m.entries,
        );
    }
    e.family(
        "palisade_enforcer_map_capacity",
        "gauge",
        "max_entries of each main eBPF map.",
    );
    for m in &r.maps {
        e.sample_u64(
            "palisade_enforcer_map_capacity",
            &[("map", m.name)],
            u64::from(m.capacity),
        );
    }
    e.family(
        "palisade_enforcer_conntrack_share",
        "gauge",
        "Most eBPF conntrack entries one pod's egress or ingress may hold (--conntrack-share); its new flows past it are dropped, counted as reason=\"conntrack_share\".",
    );
    e.sample_u64(
        "palisade_enforcer_conntrack_share",
        &[],
        u64::from(r.conntrack_share),
    );
}

/// Staged (audit) policy counters, apart from the rest: the would-deny and
/// would-allow slots of `pal_flow_stats`, which count every flow a staged
/// policy would judge differently (the flow log's rate limit drops events,
/// never counts).
pub mod audit {
    use std::path::Path;

    use palisade_ebpf::{
        FLOW_STAT_WOULD_ALLOW_EGRESS, FLOW_STAT_WOULD_ALLOW_INGRESS, FLOW_STAT_WOULD_DENY_EGRESS,
        FLOW_STAT_WOULD_DENY_INGRESS,
    };
    use palisade_runtime::exposition::Exposition;

    /// Each counter slot as (direction, would) labels.
    pub const LABELS: [(u32, &str, &str); 4] = [
        (FLOW_STAT_WOULD_DENY_INGRESS, "ingress", "deny"),
        (FLOW_STAT_WOULD_DENY_EGRESS, "egress", "deny"),
        (FLOW_STAT_WOULD_ALLOW_INGRESS, "ingress", "allow"),
        (FLOW_STAT_WOULD_ALLOW_EGRESS, "egress", "allow"),
    ];

    /// The counters in [`LABELS`] order, summed over CPUs.
    pub type Reading = [u64; 4];

    pub fn read(pin_root: &Path) -> Result<Reading, String> {
        let stats = crate::flow_log::stats::read(pin_root).map_err(|e| e.to_string())?;
        Ok(LABELS.map(|(slot, _, _)| stats.slots[slot as usize]))
    }

    /// The counters, and whether they could be read (a reading that failed
    /// must not look like no flow at all).
    pub fn render(reading: Option<&Reading>) -> String {
        let mut e = Exposition::default();
        e.single(
            "palisade_audit_scrape_ok",
            "gauge",
            "1 when the staged (audit) policy counters could be read for this scrape.",
            u64::from(reading.is_some()),
        );
        if let Some(r) = reading {
            e.family(
                "palisade_audit_flows_total",
                "counter",
                "New flows a staged (audit) policy would judge differently: would=deny, allowed now but denied once the staged policies are enforced; would=allow, the reverse. By the pod's direction.",
            );
            for ((_, direction, would), n) in LABELS.iter().zip(r) {
                e.sample_u64(
                    "palisade_audit_flows_total",
                    &[("direction", direction), ("would", would)],
                    *n,
                );
            }
        }
        e.finish()
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn every_counter_is_labelled_by_direction_and_would() {
            let text = super::render(Some(&[1, 2, 3, 4]));
            for line in [
                "palisade_audit_scrape_ok 1",
                "palisade_audit_flows_total{direction=\"ingress\",would=\"deny\"} 1",
                "palisade_audit_flows_total{direction=\"egress\",would=\"deny\"} 2",
                "palisade_audit_flows_total{direction=\"ingress\",would=\"allow\"} 3",
                "palisade_audit_flows_total{direction=\"egress\",would=\"allow\"} 4",
            ] {
                assert!(text.lines().any(|l| l == line), "{line} in {text}");
            }
            let failed = super::render(None);
            assert!(failed.contains("palisade_audit_scrape_ok 0"));
            assert!(!failed.contains("palisade_audit_flows_total"));
        }
    }
}

// ---- flow log (kept apart from the verdict counters above) ----

async fn flow_log_reading(pin_root: PathBuf) -> Option<crate::flow_log::stats::FlowStats> {
    let read = tokio::task::spawn_blocking(move || crate::flow_log::stats::read(&pin_root))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    read.map_err(|e| tracing::warn!(error = %e, "metrics: reading the flow log counters"))
        .ok()
}

/// The flow log's counters: the datapath's (what it sent, what the rate
/// limit and a full ring buffer dropped; absent when its map cannot be
/// read, which `palisade_flow_log_datapath_ok` says) and the writer's. A
/// text of its own appended to the scrape, so it never touches the verdict
/// counters' part.
pub fn render_flow_log(stats: Option<&crate::flow_log::stats::FlowStats>) -> String {
    use crate::flow_log::counters;
    let mut e = Exposition::default();
    e.single(
        "palisade_flow_log_datapath_ok",
        "gauge",
        "1 when the datapath's flow event counters could be read for this scrape.",
        u64::from(stats.is_some()),
    );
    if let Some(s) = stats {
        e.single(
            "palisade_flow_log_events_total",
            "counter",
            "Flow events the datapath sent to the enforcer (new flows and drops the mode asks for, and staged policies' verdicts, which palisade_audit_flows_total counts).",
            s.emitted,
        );
        e.single(
            "palisade_flow_log_rate_limited_total",
            "counter",
            "Flow events the node's rate limit (--flow-log-rate) dropped in the datapath.",
            s.rate_limited,
        );
        e.single(
            "palisade_flow_log_overflow_total",
            "counter",
            "Flow events dropped because the ring buffer to the enforcer was full.",
            s.overflow,
        );
    }
    e.single(
        "palisade_flow_log_lines_total",
        "counter",
        "Flow log lines written.",
        counters::get(&counters::LINES_WRITTEN),
    );
    e.single(
        "palisade_flow_log_write_dropped_total",
        "counter",
        "Flow log lines dropped because the output could not keep up (or failed).",
        counters::get(&counters::WRITE_DROPPED),
    );
    e.single(
        "palisade_flow_log_malformed_total",
        "counter",
        "Ring buffer records that were not flow events (a datapath of another version); skipped.",
        counters::get(&counters::MALFORMED),
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_log::stats::FlowStats;

    #[test]
    fn datapath_errors_are_counted_by_kind() {
        let dump = Dump {
            datapath_errors: vec![("interface_gone", 3), ("kernel", 1), ("full", 0)],
            ..Default::default()
        };
        let text = render(Some(&dump), None);
        for line in [
            "# TYPE palisade_enforcer_datapath_errors_total counter",
            "palisade_enforcer_datapath_errors_total{kind=\"interface_gone\"} 3",
            "palisade_enforcer_datapath_errors_total{kind=\"kernel\"} 1",
            "palisade_enforcer_datapath_errors_total{kind=\"full\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        // Read from the reconciler: absent when it could not be read.
        assert!(!render(None, None).contains("palisade_enforcer_datapath_errors_total"));
    }

    #[test]
    fn flow_log_counters_are_exported_and_a_missing_reading_says_so() {
        let stats = FlowStats {
            emitted: 7,
            rate_limited: 4900,
            overflow: 2,
            slots: [0; palisade_ebpf::FLOW_STAT_COUNT as usize],
        };
        let text = render_flow_log(Some(&stats));
        for line in [
            "palisade_flow_log_datapath_ok 1",
            "palisade_flow_log_events_total 7",
            "palisade_flow_log_rate_limited_total 4900",
            "palisade_flow_log_overflow_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(text.contains("palisade_flow_log_write_dropped_total "));
        let text = render_flow_log(None);
        assert!(text.lines().any(|l| l == "palisade_flow_log_datapath_ok 0"));
        assert!(!text.contains("palisade_flow_log_rate_limited_total"));
        // Appended to the main scrape: no family of its own may repeat one there.
        let main = render(None, None);
        for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = family.split(' ').next().unwrap();
            assert!(!main.contains(&format!("# TYPE {name} ")), "{name} twice");
        }
    }
}
