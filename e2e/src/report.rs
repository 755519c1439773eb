//! The result table: one row per probe, printed as each step finishes.

use std::fmt::Write as _;

use crate::probe::Outcome;
use crate::scenario::{ProbeSpec, Scenario};

pub struct Row {
    pub step: String,
    pub from: String,
    pub to: String,
    pub port: String,
    pub expect: String,
    pub result: String,
    /// `None` when the probe has no expectation.
    pub ok: Option<bool>,
}

impl Row {
    pub fn new(step: &str, spec: &ProbeSpec, outcome: &Outcome) -> Self {
        Self {
            step: step.to_string(),
            from: spec.from.to_string(),
            to: spec.to.to_string(),
            port: format!("{}/{}", spec.port, spec.protocol),
            expect: spec
                .expect
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            result: outcome.to_string(),
            ok: spec.expect.map(|e| outcome.verdict() == Some(e)),
        }
    }

    /// A row for a check that is not a probe (a dump check, an expected
    /// CNI failure): what was checked and whether it held.
    pub fn check(step: &str, kind: &str, what: &str, result: &Result<(), String>) -> Self {
        Self {
            step: step.to_string(),
            from: kind.to_string(),
            to: what.to_string(),
            port: "-".into(),
            expect: "holds".into(),
            result: if result.is_ok() { "holds" } else { "fails" }.into(),
            ok: Some(result.is_ok()),
        }
    }

    fn cells(&self) -> [&str; 7] {
        let ok = match self.ok {
            Some(true) => "OK",
            Some(false) => "FAIL",
            None => "-",
        };
        [
            &self.step,
            &self.from,
            &self.to,
            &self.port,
            &self.expect,
            &self.result,
            ok,
        ]
    }
}

const HEADERS: [&str; 7] = ["STEP", "FROM", "TO", "PORT", "EXPECT", "RESULT", "OK"];

/// Column widths are fixed from the scenario up front, so rows can be
/// printed step by step and still line up.
pub struct Table {
    widths: [usize; 6],
}

impl Table {
    pub fn for_scenario(scenario: &Scenario) -> Self {
        let mut widths = [0; 6];
        for (w, h) in widths.iter_mut().zip(HEADERS) {
            *w = h.len();
        }
        for step in &scenario.steps {
            widths[0] = widths[0].max(step.name.len().min(40));
            for p in &step.probes {
                widths[1] = widths[1].max(p.from.to_string().len());
                widths[2] = widths[2].max(p.to.to_string().len());
                widths[3] = widths[3].max(format!("{}/{}", p.port, p.protocol).len());
            }
            if !step.dump.is_empty() {
                widths[1] = widths[1].max("dump".len());
            }
            for check in &step.dump {
                widths[2] = widths[2].max(check.to_string().len());
            }
            if let Some(want) = &step.source_error {
                widths[1] = widths[1].max("source".len());
                widths[2] = widths[2].max(want.len());
            }
            if step.add_error.is_some() {
                widths[1] = widths[1].max("cni ADD".len());
                let pods = step.apply.iter().filter(|o| o.key().pod_name().is_some());
                let names: Vec<String> = pods.map(|o| o.key().name.clone()).collect();
                widths[2] = widths[2].max(names.join(",").len() + 2 * names.len());
            }
        }
        widths[4] = widths[4].max("allow".len());
        widths[5] = widths[5].max("allow (refused)".len());
        Self { widths }
    }

    pub fn header(&self) -> String {
        self.line(HEADERS)
    }

    pub fn row(&self, row: &Row) -> String {
        self.line(row.cells())
    }

    fn line(&self, cells: [&str; 7]) -> String {
        let mut out = String::new();
        for (cell, w) in cells.iter().zip(self.widths) {
            let _ = write!(out, "{:<w$}  ", truncate(cell, w));
        }
        out.push_str(cells[6]);
        out
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let cut: String = s.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn failures(&self) -> usize {
        self.rows.iter().filter(|r| r.ok == Some(false)).count()
    }

    pub fn passed(&self) -> bool {
        self.failures() == 0
    }

    pub fn summary(&self) -> String {
        let checked = self.rows.iter().filter(|r| r.ok.is_some()).count();
        if self.passed() {
            format!(
                "PASS: {checked} of {checked} expectations met ({} probes)",
                self.rows.len()
            )
        } else {
            format!(
                "FAIL: {} of {checked} expectations not met ({} probes)",
                self.failures(),
                self.rows.len()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Protocol, Step, Verdict};

    #[test]
    fn rows_line_up_and_judge_expectations() {
        let spec = ProbeSpec::new("x/a", "x/b", 80, Protocol::Tcp)
            .unwrap()
            .expect(Verdict::Deny);
        let scenario = Scenario {
            steps: vec![Step {
                name: "s1".into(),
                probes: vec![spec.clone()],
                ..Step::default()
            }],
            ..Scenario::default()
        };
        let table = Table::for_scenario(&scenario);
        let ok = Row::new("s1", &spec, &Outcome::Timeout);
        let bad = Row::new("s1", &spec, &Outcome::Refused);
        assert_eq!(ok.ok, Some(true));
        assert_eq!(bad.ok, Some(false));
        assert_eq!(table.header().find("RESULT"), table.row(&ok).rfind("deny"));
        assert!(table.row(&bad).ends_with("FAIL"));
        let report = Report {
            rows: vec![ok, bad],
        };
        assert!(!report.passed());
        assert!(report.summary().starts_with("FAIL: 1 of 2"));
    }
}
