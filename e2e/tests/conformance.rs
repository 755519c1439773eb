//! The conformance scenarios (e2e/conformance/, the upstream network policy
//! e2e suite as data, and e2e/conformance/cnp/, network-policy-api's
//! ClusterNetworkPolicy suite) on a real lab with real traffic, every
//! matrix probe checked, on 2 nodes with every namespace's pods spread over
//! both, so most pairs cross the fabric between two enforcers. SCTP is
//! probed with raw sockets (an INIT answered by an INIT-ACK), as this
//! kernel has no SCTP stack. The ClusterNetworkPolicy node-peer cases
//! (13-, 24-) have host-network pods, served from their node's namespace
//! on its address, and `nodes` peers resolved from the lab's Node objects.

mod common;
use common::require_root;

use std::path::{Path, PathBuf};

use common::*;
use palisade_e2e::{run_scenario, Lab, LabConfig, Scenario};

fn scenario_files() -> Vec<PathBuf> {
    files_in("conformance")
}

fn cnp_files() -> Vec<PathBuf> {
    files_in("conformance/cnp")
}

fn files_in(sub: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(sub);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Plays one file; Err(the table and logs) unless every probe matched.
fn play(path: &Path) -> Result<usize, String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let scenario = Scenario::from_file(path).map_err(|e| format!("{name}: {e:#}"))?;
    let mut lab = Lab::start(LabConfig::default().for_scenario(&scenario))
        .map_err(|e| format!("{name}: the lab did not start: {e:#}"))?;
    let mut out = Vec::new();
    let result = run_scenario(&mut lab, &scenario, &mut out);
    let table = String::from_utf8_lossy(&out).into_owned();
    let verdict = match result {
        Ok(report) if report.passed() => Ok(report.rows.len()),
        Ok(report) => Err(format!(
            "{name}: {}\n{table}\n{}",
            report.summary(),
            lab.log_tails(20)
        )),
        Err(e) => Err(format!("{name}: {e:#}\n{table}\n{}", lab.log_tails(20))),
    };
    finish(lab);
    verdict
}

#[test]
#[ignore = "needs root"]
fn every_conformance_case_passes_on_a_real_lab() {
    require_root();
    let files = scenario_files();
    assert!(files.len() >= 40, "{} files", files.len());
    for f in &files {
        Scenario::from_file(f).unwrap_or_else(|e| panic!("{e:#}"));
    }
    let cnp = cnp_files();
    assert_eq!(cnp.len(), 24, "every upstream ClusterNetworkPolicy test");
    let mut runnable = files;
    runnable.extend(cnp);
    // A few labs at once: each is its own set of namespaces and processes.
    let results: Vec<Result<usize, String>> = std::thread::scope(|s| {
        let chunks: Vec<&[PathBuf]> = runnable.chunks(runnable.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| s.spawn(move || chunk.iter().map(|f| play(f)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a conformance thread panicked"))
            .collect()
    });
    let probes: usize = results.iter().filter_map(|r| r.as_ref().ok()).sum();
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    eprintln!(
        "conformance: {} cases, {probes} expectations met, {} failed",
        runnable.len(),
        failures.len(),
    );
    assert!(
        failures.is_empty(),
        "{}",
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    // Every case's matrices hold several pairs; a silent skip shows here.
    assert!(probes > 8 * runnable.len(), "only {probes} expectations");
}

/// The same files through `palisade-lab run --engine model`: the reference
/// model alone, two nodes as written (the model has no nodes), no root.
#[test]
fn every_conformance_case_passes_in_the_model_engine() {
    let mut failures = Vec::new();
    let mut rows = 0;
    for f in scenario_files().into_iter().chain(cnp_files()) {
        let scenario = Scenario::from_file(&f).unwrap_or_else(|e| panic!("{e:#}"));
        let mut out = Vec::new();
        match palisade_e2e::model_engine::run(&scenario, &mut out) {
            Ok(report) if report.passed() => rows += report.rows.len(),
            Ok(report) => failures.push(format!(
                "{}: {}\n{}",
                f.display(),
                report.summary(),
                String::from_utf8_lossy(&out)
            )),
            Err(e) => failures.push(format!("{}: {e:#}", f.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rows > 500, "{rows} expectations");
}
