//! Plays a scenario against a lab: initial objects, then each step's
//! changes, a wait until they are realized, and its probes.

use std::io::Write;

use anyhow::{Context, Result};

use crate::lab::Lab;
use crate::report::{Report, Row, Table};
use crate::scenario::Scenario;

/// Prints the table as it goes. Errors (as opposed to failed expectations)
/// abort the run; the caller still owns and shuts down the lab.
pub fn run_scenario(lab: &mut Lab, scenario: &Scenario, out: &mut dyn Write) -> Result<Report> {
    if !scenario.objects.is_empty() {
        lab.apply(&scenario.objects)
            .context("applying the initial objects")?;
    }
    let table = Table::for_scenario(scenario);
    writeln!(out, "{}", table.header())?;
    let mut rows = Vec::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let at = || format!("step {} ({:?})", i + 1, step.name);
        let started = std::time::Instant::now();
        if !step.apply.is_empty() {
            lab.apply(&step.apply).with_context(at)?;
        }
        if !step.delete.is_empty() {
            lab.delete(&step.delete).with_context(at)?;
        }
        lab.wait_realized().with_context(at)?;
        // From the change (manifests written, pods wired) to the enforcer
        // reporting it realized: what an operator waits for.
        let realized_in = started.elapsed();
        let outcomes = lab.probe_all(&step.probes).with_context(at)?;
        for (spec, outcome) in step.probes.iter().zip(&outcomes) {
            let row = Row::new(&step.name, spec, outcome);
            writeln!(out, "{}", table.row(&row))?;
            rows.push(row);
        }
        writeln!(
            out,
            "  ({} realized in {} ms)",
            step.name,
            realized_in.as_millis()
        )?;
        out.flush()?;
    }
    Ok(Report { rows })
}
