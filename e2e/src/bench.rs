//! Pod-up benchmark numbers: percentiles and the result line that
//! scripts/bench-podup.sh reads.

use std::time::Duration;

/// The nearest-rank percentile (`p` in 0..=100) of `samples`.
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One burst size's samples.
#[derive(Debug, Default)]
pub struct BurstTimes {
    pub burst: usize,
    pub with: Vec<Duration>,
    pub without: Vec<Duration>,
    /// palisade-cni's ADDs in the bursts with it, exec to exit, as the
    /// kernel saw containerd run them (`crate::exec_trace`).
    pub adds: Vec<Duration>,
    /// The chain's first plugin (ptp), whose ADDs in the same bursts are
    /// the reference: how any plugin of the chain fares in them.
    pub first_plugin: String,
    pub first_adds: Vec<Duration>,
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// `mode=<m> pods=<n> p50_ms=<x> p99_ms=<y>`, plus max for context.
pub fn result_line(mode: &str, samples: &[Duration]) -> String {
    let p = |q| percentile(samples, q).map(ms).unwrap_or_else(|| "-".into());
    format!(
        "mode={mode} pods={} p50_ms={} p99_ms={} max_ms={}",
        samples.len(),
        p(50.0),
        p(99.0),
        p(100.0)
    )
}

/// The plugins before palisade-cni in the same ADDs (ptp with its IPAM),
/// `chain_p50_ms= chain_p99_ms=`: how the chain itself fares in the burst,
/// beside palisade-cni's own line.
pub fn chain_fields(samples: &[Duration]) -> String {
    let p = |q| percentile(samples, q).map(ms).unwrap_or_else(|| "-".into());
    format!("chain_p50_ms={} chain_p99_ms={}", p(50.0), p(99.0))
}

/// The runtime pod-up line: RunPodSandbox times of one burst size with
/// palisade-cni in the chain and without it; then palisade-cni's ADD
/// (exec to exit) in the bursts with it, and its p99 over `baseline`'s
/// (the burst of one's); then the same for the chain's first plugin,
/// `runtime=<r> burst=<n> with_p50_ms= with_p99_ms= without_p50_ms=
/// without_p99_ms= add_p50_ms= add_p99_ms= add_p99_ratio= <first>_add_p50_ms=
/// <first>_add_p99_ms= <first>_add_p99_ratio=`.
pub fn runtime_line(runtime: &str, b: &BurstTimes, baseline: Option<&BurstTimes>) -> String {
    let p = |s: &[Duration], q| percentile(s, q).map(ms).unwrap_or_else(|| "-".into());
    let ratio = |s: &[Duration], base: Option<&[Duration]>| {
        base.and_then(|base| percentile(base, 99.0))
            .zip(percentile(s, 99.0))
            .filter(|(base, _)| !base.is_zero())
            .map(|(base, add)| format!("{:.2}", add.as_secs_f64() / base.as_secs_f64()))
            .unwrap_or_else(|| "-".into())
    };
    let f = &b.first_plugin;
    format!(
        "runtime={runtime} burst={} with_p50_ms={} with_p99_ms={} without_p50_ms={} without_p99_ms={} add_p50_ms={} add_p99_ms={} add_p99_ratio={} {f}_add_p50_ms={} {f}_add_p99_ms={} {f}_add_p99_ratio={}",
        b.burst,
        p(&b.with, 50.0),
        p(&b.with, 99.0),
        p(&b.without, 50.0),
        p(&b.without, 99.0),
        p(&b.adds, 50.0),
        p(&b.adds, 99.0),
        ratio(&b.adds, baseline.map(|x| &x.adds[..])),
        p(&b.first_adds, 50.0),
        p(&b.first_adds, 99.0),
        ratio(&b.first_adds, baseline.map(|x| &x.first_adds[..])),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&s, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&s, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 50.0), None);
        let one = [Duration::from_micros(1500)];
        assert_eq!(
            result_line("strict", &one),
            "mode=strict pods=1 p50_ms=1.50 p99_ms=1.50 max_ms=1.50"
        );
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        let burst = BurstTimes {
            burst: 20,
            with: one.to_vec(),
            without: vec![],
            adds: ms(&[9, 12]),
            first_plugin: "ptp".into(),
            first_adds: ms(&[50, 60]),
        };
        let base = BurstTimes {
            burst: 1,
            adds: ms(&[2, 4]),
            first_adds: ms(&[10, 12]),
            ..BurstTimes::default()
        };
        assert_eq!(
            runtime_line("containerd", &burst, Some(&base)),
            "runtime=containerd burst=20 with_p50_ms=1.50 with_p99_ms=1.50 without_p50_ms=- without_p99_ms=- add_p50_ms=9.00 add_p99_ms=12.00 add_p99_ratio=3.00 ptp_add_p50_ms=50.00 ptp_add_p99_ms=60.00 ptp_add_p99_ratio=5.00"
        );
        assert!(runtime_line("containerd", &burst, None).ends_with("ptp_add_p99_ratio=-"));
    }
}
