//! The Prometheus text format (0.0.4), written by hand: families with HELP
//! and TYPE, label values escaped, and a cumulative histogram.

use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// One scrape's text.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a metric family; its samples follow.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(
            self.out,
            "# HELP {name} {}",
            help.replace('\\', "\\\\").replace('\n', "\\n")
        );
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// An integer sample (versions, counts), written exactly.
    pub fn sample_u64(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.out, " {value}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.labels(name, labels);
        let _ = writeln!(self.out, " {}", number(value));
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: u64) {
        self.family(name, kind, help);
        self.sample_u64(name, &[], value);
    }

    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.family(name, "histogram", help);
        let state = h.snapshot();
        let mut cumulative = 0u64;
        for (bound, count) in h.bounds.iter().zip(&state.counts) {
            cumulative += count;
            self.sample_u64(
                &format!("{name}_bucket"),
                &[("le", &number(*bound))],
                cumulative,
            );
        }
        self.sample_u64(&format!("{name}_bucket"), &[("le", "+Inf")], state.count);
        self.sample(&format!("{name}_sum"), &[], state.sum);
        self.sample_u64(&format!("{name}_count"), &[], state.count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v.is_nan() {
        return "NaN".into();
    }
    // Rust prints 1.0 as "1" and never uses an exponent Prometheus cannot
    // read.
    format!("{v}")
}

/// A histogram of durations in seconds, with fixed upper bounds.
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Clone, Default)]
struct HistogramState {
    /// Per bound, not cumulative; observations above the last bound count
    /// only in `count`.
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub const fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Mutex::new(HistogramState {
                counts: Vec::new(),
                count: 0,
                sum: 0.0,
            }),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.counts.len() != self.bounds.len() {
            st.counts = vec![0; self.bounds.len()];
        }
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            st.counts[i] += 1;
        }
        st.count += 1;
        st.sum += secs;
    }

    fn snapshot(&self) -> HistogramState {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        st.counts.resize(self.bounds.len(), 0);
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static H: Histogram = Histogram::new(&[0.01, 0.1, 1.0]);

    #[test]
    fn histogram_buckets_are_cumulative_and_labels_escaped() {
        H.observe(Duration::from_millis(5));
        H.observe(Duration::from_millis(50));
        H.observe(Duration::from_secs(5));
        let mut e = Exposition::default();
        e.histogram("t_seconds", "A test.", &H);
        e.family("t_version", "gauge", "Versions.");
        e.sample_u64("t_version", &[("node", "a\"b\\c")], 1_764_547_200_000_001);
        let text = e.finish();
        for line in [
            "# TYPE t_seconds histogram",
            "t_seconds_bucket{le=\"0.01\"} 1",
            "t_seconds_bucket{le=\"0.1\"} 2",
            "t_seconds_bucket{le=\"1\"} 2",
            "t_seconds_bucket{le=\"+Inf\"} 3",
            "t_seconds_sum 5.055",
            "t_seconds_count 3",
            "t_version{node=\"a\\\"b\\\\c\"} 1764547200000001",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }
}
