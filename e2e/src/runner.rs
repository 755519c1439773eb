//! Plays a scenario against a lab: initial objects, then each step's
//! faults and changes, a wait until they are realized, its probes and its
//! dump checks.
//!
//! Waits: a step waits for realization only when both processes are up and
//! the manifests readable. With the manifests broken (and both up) it waits
//! until the node has settled on whatever the controller serves; with a
//! process down it does not wait at all (nothing can be realized through a
//! missing process), so its probes show what the node does meanwhile. A
//! step whose change the controller must refuse (`sourceError`) waits for
//! that error, then as for broken manifests.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{anyhow, bail, Context, Result};

use crate::lab::Lab;
use crate::probe::Outcome;
use crate::report::{Report, Row, Table};
use crate::scenario::{Mode, Object, ObjectKey, Scenario, Step, Target, Verdict};

/// Prints the table as it goes. Errors (as opposed to failed expectations)
/// abort the run; the caller still owns and shuts down the lab.
pub fn run_scenario(lab: &mut Lab, scenario: &Scenario, out: &mut dyn Write) -> Result<Report> {
    if scenario.nodes as usize != lab.node_names().len() {
        bail!(
            "the scenario asks for {} node(s), the lab has {} (start it with LabConfig::for_scenario)",
            scenario.nodes,
            lab.node_names().len()
        );
    }
    if let Some(dns) = &scenario.dns {
        lab.set_dns(dns).context("dns")?;
    }
    if !scenario.objects.is_empty() {
        lab.apply(&scenario.objects)
            .context("applying the initial objects")?;
        lab.refresh_dns().context("dns, with the initial objects")?;
        lab.wait_realized()
            .context("realizing the initial objects")?;
        lab.trust_dns().context("dns.learn")?;
        lab.wait_realized()
            .context("realizing the initial objects, learning from the DNS")?;
    }
    let table = Table::for_scenario(scenario);
    // Every observed verdict is also checked against the reference model,
    // where the model can judge the scenario: the enforcer's mode and
    // injected faults are not the API's, so such scenarios are not compared.
    // Nor what the enforcers learned by name (`dns: {learn: true}`): a
    // pod's address may be allowed because a name resolved to it.
    let comparable = scenario.mode != Some(Mode::Strict)
        && !scenario.dns.as_ref().is_some_and(|d| d.learn)
        && scenario
            .steps
            .iter()
            .all(|s| s.faults.is_empty() && s.add_error.is_none() && s.source_error.is_none());
    writeln!(out, "{}", table.header())?;
    let mut rows = Vec::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let at = || format!("step {} ({:?})", i + 1, step.name);
        for fault in &step.faults {
            writeln!(out, "  ({}: {fault})", step.name)?;
            lab.inject(fault).with_context(at)?;
        }
        let started = std::time::Instant::now();
        if !step.labels.is_empty() {
            relabel(lab, &step.labels).with_context(at)?;
        }
        if let Some(records) = &step.dns {
            lab.set_dns_records(records).with_context(at)?;
        }
        if !step.apply.is_empty() {
            let step = with_pod_cidrs(lab, step).with_context(at)?;
            apply(lab, &step, &table, &mut rows, out).with_context(at)?;
            lab.refresh_dns().with_context(at)?;
        }
        if !step.delete.is_empty() {
            lab.delete(&step.delete).with_context(at)?;
        }
        let waited = if let Some(want) = &step.source_error {
            // The controller keeps what it last accepted: wait for its
            // error, then for the node to settle on that.
            let verdict = lab.wait_source_error(want).with_context(at)?;
            let passed = verdict.as_ref().map(|_| ()).map_err(Clone::clone);
            let row = Row::check(&step.name, "source", want, &passed);
            writeln!(out, "{}", table.row(&row))?;
            match &verdict {
                Ok(error) => writeln!(out, "    refused as expected: {error}")?,
                Err(reason) => writeln!(out, "    {reason}")?,
            }
            rows.push(row);
            lab.wait_settled().with_context(at)?;
            "settled, manifests refused"
        } else if lab.can_realize() {
            lab.wait_realized().with_context(at)?;
            "realized"
        } else if lab.processes_up() {
            lab.wait_settled().with_context(at)?;
            "settled, manifests broken"
        } else {
            "not waited for: a process is down"
        };
        // From the change (manifests written, pods wired) to the enforcer
        // reporting it realized: what an operator waits for.
        let realized_in = started.elapsed();
        let outcomes = lab.probe_all(&step.probes).with_context(at)?;
        for (spec, outcome) in step.probes.iter().zip(&outcomes) {
            let row = Row::new(&step.name, spec, outcome);
            writeln!(out, "{}", table.row(&row))?;
            rows.push(row);
        }
        if comparable {
            for (row, reason) in disagreements(lab, step, &outcomes).with_context(at)? {
                writeln!(out, "{}", table.row(&row))?;
                writeln!(out, "    {reason}")?;
                rows.push(row);
            }
        }
        for (check, result) in lab.check_dump(&step.dump).with_context(at)? {
            let row = Row::check(&step.name, "dump", &check.to_string(), &result);
            writeln!(out, "{}", table.row(&row))?;
            if let Err(reason) = &result {
                writeln!(out, "    {reason}")?;
            }
            rows.push(row);
        }
        writeln!(
            out,
            "  ({} {waited} in {} ms)",
            step.name,
            realized_in.as_millis()
        )?;
        out.flush()?;
    }
    Ok(Report { rows })
}

/// A row for each pod-to-pod probe whose observed verdict the reference
/// model does not share: a bug in Palisade or in the model, reported as
/// such, never as an expectation failure.
fn disagreements(lab: &Lab, step: &Step, outcomes: &[Outcome]) -> Result<Vec<(Row, String)>> {
    let ips = lab.pod_ips();
    let cluster = crate::model_engine::cluster_of(lab.objects(), &ips, &lab.node_objects())?;
    let mut rows = Vec::new();
    for (spec, outcome) in step.probes.iter().zip(outcomes) {
        let (Target::Pod(to), Some(seen)) = (&spec.to, outcome.verdict()) else {
            continue;
        };
        let model = crate::model_engine::verdict(
            &cluster,
            &ips,
            &spec.from,
            to,
            spec.protocol.as_str(),
            spec.port,
        )?;
        let model = if model { Verdict::Allow } else { Verdict::Deny };
        if model != seen {
            let what = format!("{} -> {to} {}/{}", spec.from, spec.port, spec.protocol);
            let reason = format!(
                "model disagrees: {what}: the datapath says {seen}, the model says {model} (a bug in Palisade or in the model)"
            );
            rows.push((
                Row::check(&step.name, "model", &what, &Err(reason.clone())),
                reason,
            ));
        }
    }
    Ok(rows)
}

/// Replaces the labels of existing pods and namespaces in place: the pods
/// keep their sandboxes and addresses, as after `kubectl label`.
fn relabel(lab: &mut Lab, labels: &[(ObjectKey, BTreeMap<String, String>)]) -> Result<()> {
    let mut changed = Vec::with_capacity(labels.len());
    for (key, new) in labels {
        let object = lab
            .object(key)
            .ok_or_else(|| anyhow!("label: {key} does not exist in the lab"))?;
        let mut body = object.body().clone();
        body["metadata"]["labels"] = serde_json::to_value(new)?;
        changed.push(Object::from_value(body).with_context(|| format!("label: {key}"))?);
    }
    lab.apply(&changed)?;
    Ok(())
}

/// The step with every `{pod: ns/name, prefix: N}` CIDR in its objects
/// replaced by that pod's address masked to N bits, as it is now.
fn with_pod_cidrs(lab: &Lab, step: &Step) -> Result<Step> {
    let ips = lab.pod_ips();
    let mut step = step.clone();
    for o in step.apply.iter_mut() {
        let mut body = o.body().clone();
        crate::netpol::resolve_cidrs(&mut body, &ips).with_context(|| format!("{}", o.key()))?;
        if &body != o.body() {
            *o = Object::from_value(body)?;
        }
    }
    Ok(step)
}

/// Applies the step's objects; with `addError`, the CNI ADD must fail.
fn apply(
    lab: &mut Lab,
    step: &Step,
    table: &Table,
    rows: &mut Vec<Row>,
    out: &mut dyn Write,
) -> Result<()> {
    let result = lab.apply(&step.apply);
    let Some(want) = &step.add_error else {
        return result.map(|_| ());
    };
    let pods: Vec<String> = step
        .apply
        .iter()
        .filter_map(|o| o.key().pod_name())
        .map(|p| p.to_string())
        .collect();
    let verdict = match result {
        Ok(_) => Err("the CNI ADD succeeded".to_string()),
        Err(e) if e.is::<crate::Interrupted>() => return Err(e),
        Err(e) => {
            let text = format!("{e:#}");
            if text.contains(want.as_str()) {
                writeln!(out, "    ADD failed as expected: {text}")?;
                Ok(())
            } else {
                Err(format!(
                    "the CNI ADD failed without naming {want:?}: {text}"
                ))
            }
        }
    };
    let row = Row::check(&step.name, "cni ADD", &pods.join(","), &verdict);
    writeln!(out, "{}", table.row(&row))?;
    if let Err(reason) = &verdict {
        writeln!(out, "    {reason}")?;
    }
    rows.push(row);
    Ok(())
}
