//! Metrics of egress by domain name: what the datapath did with DNS
//! frames (`pal_dns_stats`: copied, held, passed and why), what the
//! learner learned and ignored, what the caps evicted, and how long
//! answers were held. A text of its own appended to the scrape.

use std::path::Path;
use std::time::Duration;

use aya::maps::{Map, MapData, PerCpuArray};
use palisade_ebpf::{
    DNS_STAT_ANSWER_HELD, DNS_STAT_COUNT, DNS_STAT_FRAGMENT_HELD, DNS_STAT_FRAGMENT_PASSED,
    DNS_STAT_PASSED_NO_LEARNER, DNS_STAT_PASSED_RING_FULL, DNS_STAT_PASSED_TOO_BIG,
    DNS_STAT_QUERY_COPIED, MAP_DNS_STATS,
};
use palisade_runtime::exposition::{Exposition, Histogram};

use crate::names::report::{LearnerGone, Report};

/// A held answer, from the datapath's copy to its re-injection: what
/// learning adds to a pod's DNS latency.
static ANSWER_HOLD_SECONDS: Histogram = Histogram::new(&[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
]);

/// Records one held frame's re-injection, `held` after its copy.
pub fn observe_answer_hold(held: Duration) {
    ANSWER_HOLD_SECONDS.observe(held);
}

/// Each `DNS_STAT_*` slot as its `event` label.
pub const DNS_STAT_LABELS: [(u32, &str); DNS_STAT_COUNT as usize] = [
    (DNS_STAT_QUERY_COPIED, "query_copied"),
    (DNS_STAT_ANSWER_HELD, "answer_held"),
    (DNS_STAT_PASSED_NO_LEARNER, "passed_no_learner"),
    (DNS_STAT_PASSED_RING_FULL, "passed_ring_full"),
    (DNS_STAT_PASSED_TOO_BIG, "passed_too_big"),
    (DNS_STAT_FRAGMENT_HELD, "fragment_held"),
    (DNS_STAT_FRAGMENT_PASSED, "fragment_passed"),
];

/// `pal_dns_stats`, summed over CPUs, in `DNS_STAT_*` order.
pub fn read_datapath(pin_root: &Path) -> Result<Vec<u64>, String> {
    let path = pin_root.join(MAP_DNS_STATS);
    let data = MapData::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let map = Map::from_map_data(data).map_err(|e| format!("{}: {e}", path.display()))?;
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(map).map_err(|e| format!("{MAP_DNS_STATS}: {e}"))?;
    (0..DNS_STAT_COUNT)
        .map(|i| {
            let per_cpu = stats
                .get(&i, 0)
                .map_err(|e| format!("{MAP_DNS_STATS}[{i}]: {e}"))?;
            Ok(per_cpu.iter().copied().fold(0u64, u64::wrapping_add))
        })
        .collect()
}

/// `learner`: None when no learner runs here (no --dns-server), the
/// learner families then absent; Err when it stopped.
pub fn render(datapath: Option<&[u64]>, learner: Option<&Result<Report, LearnerGone>>) -> String {
    let mut e = Exposition::default();
    e.single(
        "palisade_dns_datapath_ok",
        "gauge",
        "1 when the datapath's DNS capture counters could be read for this scrape.",
        u64::from(datapath.is_some()),
    );
    if let Some(counts) = datapath {
        e.family(
            "palisade_dns_datapath_frames_total",
            "counter",
            "DNS frames of pods with rules by domain name, by what the datapath did: query_copied, answer_held (copied and dropped until the learner re-injects it), passed_no_learner (no live learner: passed unheld), passed_ring_full and passed_too_big (passed unheld, nothing learned), fragment_held, fragment_passed.",
        );
        for (slot, event) in DNS_STAT_LABELS {
            if let Some(n) = counts.get(slot as usize) {
                e.sample_u64(
                    "palisade_dns_datapath_frames_total",
                    &[("event", event)],
                    *n,
                );
            }
        }
    }
    let Some(learner) = learner else {
        return e.finish();
    };
    e.single(
        "palisade_dns_learner_up",
        "gauge",
        "1 while the DNS learner answers; 0 when it stopped (answers then pass unheld and rules by name allow no new address) or did not answer within 2 s.",
        u64::from(learner.is_ok()),
    );
    if let Ok(r) = learner {
        learner_metrics(&mut e, r);
    }
    e.histogram(
        "palisade_dns_answer_hold_seconds",
        "How long the datapath held an answer (or fragment) before the learner re-injected it.",
        &ANSWER_HOLD_SECONDS,
    );
    e.finish()
}

fn learner_metrics(e: &mut Exposition, r: &Report) {
    e.single(
        "palisade_dns_learned_names",
        "gauge",
        "Names learned and not yet expired, over every pod.",
        r.names() as u64,
    );
    e.single(
        "palisade_dns_learned_addresses",
        "gauge",
        "Entries in the datapath's learned overlay (one per pod and address), adopted ones included.",
        r.overlay_entries as u64,
    );
    e.single(
        "palisade_dns_adopted_addresses",
        "gauge",
        "Addresses a previous enforcer process learned, kept until they expire.",
        r.adopted() as u64,
    );
    e.single(
        "palisade_dns_pending_queries",
        "gauge",
        "Queries waiting for their answer.",
        r.pending_queries as u64,
    );
    e.single(
        "palisade_dns_queries_total",
        "counter",
        "Queries the learner read.",
        r.counters.queries,
    );
    e.single(
        "palisade_dns_answers_total",
        "counter",
        "Answers the learner read.",
        r.counters.answers,
    );
    e.single(
        "palisade_dns_answers_learned_total",
        "counter",
        "Answers that changed what a pod may reach.",
        r.counters.learned,
    );
    e.family(
        "palisade_dns_ignored_total",
        "counter",
        "Queries and answers that taught nothing, by reason (untrusted_server, no_query, question, late, unlearnable, ...).",
    );
    for (reason, n) in &r.counters.ignored {
        e.sample_u64("palisade_dns_ignored_total", &[("reason", reason)], *n);
    }
    e.family(
        "palisade_dns_evictions_total",
        "counter",
        "What the caps pushed out: name (names per pod), address (addresses per name), entry (entries per pod), query (pending queries), fragment (unfinished fragmented answers).",
    );
    for (what, n) in [
        ("name", r.evicted.names),
        ("address", r.evicted.addrs),
        ("entry", r.evicted.entries),
        ("query", r.evicted.queries),
        ("fragment", r.evicted.fragments),
    ] {
        e.sample_u64("palisade_dns_evictions_total", &[("what", what)], n);
    }
    e.single(
        "palisade_dns_released_total",
        "counter",
        "Held answers and fragments re-injected.",
        r.released,
    );
    e.single(
        "palisade_dns_reinject_errors_total",
        "counter",
        "Re-injections that failed (the answer is lost; the client asks again).",
        r.reinject_errors,
    );
    e.single(
        "palisade_dns_write_errors_total",
        "counter",
        "Learned addresses the datapath refused (they stay unlearned: connections to them are refused).",
        r.write_errors,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::report::Evictions;

    #[test]
    fn every_dns_stat_has_its_own_label() {
        let mut slots: Vec<u32> = DNS_STAT_LABELS.iter().map(|(s, _)| *s).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..DNS_STAT_COUNT).collect::<Vec<_>>());
    }

    #[test]
    fn a_stopped_learner_is_down_not_absent() {
        let text = render(
            Some(&[0; DNS_STAT_COUNT as usize]),
            Some(&Err(LearnerGone::Stopped)),
        );
        assert!(text.contains("palisade_dns_learner_up 0"), "{text}");
        assert!(!text.contains("palisade_dns_learned_names"), "{text}");
    }

    #[test]
    fn no_learner_renders_only_the_datapath() {
        let text = render(None, None);
        assert!(text.contains("palisade_dns_datapath_ok 0"), "{text}");
        assert!(!text.contains("palisade_dns_learner_up"), "{text}");
    }

    #[test]
    fn the_report_is_rendered() {
        let mut r = Report {
            overlay_entries: 3,
            evicted: Evictions {
                addrs: 7,
                ..Default::default()
            },
            ..Default::default()
        };
        r.counters.ignored.insert("no_query", 2);
        let text = render(None, Some(&Ok(r)));
        for line in [
            "palisade_dns_learner_up 1",
            "palisade_dns_learned_addresses 3",
            "palisade_dns_evictions_total{what=\"address\"} 7",
            "palisade_dns_ignored_total{reason=\"no_query\"} 2",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
