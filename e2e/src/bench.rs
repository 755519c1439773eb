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
/// palisade-cni in the chain and without it,
/// `runtime=<r> burst=<n> with_p50_ms= with_p99_ms= without_p50_ms= without_p99_ms=`.
pub fn runtime_line(
    runtime: &str,
    burst: usize,
    with: &[Duration],
    without: &[Duration],
) -> String {
    let p = |s: &[Duration], q| percentile(s, q).map(ms).unwrap_or_else(|| "-".into());
    format!(
        "runtime={runtime} burst={burst} with_p50_ms={} with_p99_ms={} without_p50_ms={} without_p99_ms={}",
        p(with, 50.0),
        p(with, 99.0),
        p(without, 50.0),
        p(without, 99.0)
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
        assert_eq!(
            runtime_line("containerd", 20, &one, &[]),
            "runtime=containerd burst=20 with_p50_ms=1.50 with_p99_ms=1.50 without_p50_ms=- without_p99_ms=-"
        );
    }
}
