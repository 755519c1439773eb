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
use palisade_proto::exposition::{Exposition, Histogram};

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
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    move || {
        let (handle, pin_root) = (handle.clone(), pin_root.clone());
        Box::pin(async move {
            let dump = handle.dump().await;
            let datapath =
                tokio::task::spawn_blocking(move || crate::metrics_maps::read(&pin_root))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = &datapath {
                tracing::warn!(error = %e, "metrics: reading the datapath's maps");
            }
            render(dump.as_ref().ok(), datapath.as_ref().ok())
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
    for (owner, direction) in DIRECTION_LABELS {
        for (stat, verdict, reason) in STAT_LABELS {
            let slot = palisade_ebpf::stat_slot(owner, stat);
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
}
