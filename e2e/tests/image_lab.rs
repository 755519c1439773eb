//! The lab with its node processes run from the image, as the chart's pods
//! (`palisade-lab run --node-processes image`): the quickstart, every
//! fail-closed scenario of examples/adversarial (crashes are `podman kill`,
//! restarts new containers of the same pod, a second enforcer a second pod
//! of the DaemonSet) and every conformance case pass as they do with the
//! workspace binaries.

mod common;

use std::path::{Path, PathBuf};

use common::{finish, require_root};
use palisade_e2e::chart::default_chart;
use palisade_e2e::lab::ImageRun;
use palisade_e2e::{run_scenario, Lab, LabConfig, Scenario};

fn config(scenario: &Scenario) -> LabConfig {
    let built = palisade_e2e::image::ensure().unwrap_or_else(|e| panic!("{e:#}"));
    LabConfig {
        image: Some(ImageRun {
            image: built.reference.clone(),
            chart: default_chart(),
        }),
        // The enforcer's container runs with its chart request's CPU
        // shares (50m): with other labs loading the two cores, its eBPF
        // load (the verifier) took 29 s, where the lab's default bound is
        // 30 s. A kubelet keeps probing; the lab waits longer likewise.
        start_timeout: std::time::Duration::from_secs(180),
        ..LabConfig::default()
    }
    .for_scenario(scenario)
}

/// Plays one scenario on its own image-mode lab; Err(table and logs)
/// unless every expectation holds. Ok(rows checked).
fn play(path: &Path) -> Result<usize, String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let scenario = Scenario::from_file(path).map_err(|e| format!("{name}: {e:#}"))?;
    let mut lab = Lab::start(config(&scenario))
        .map_err(|e| format!("{name}: the lab did not start: {e:#}"))?;
    let mut out = Vec::new();
    let result = run_scenario(&mut lab, &scenario, &mut out);
    let table = String::from_utf8_lossy(&out).into_owned();
    let verdict = match result {
        Ok(report) if report.passed() => Ok(report.rows.len()),
        Ok(report) => Err(format!(
            "{name}: {}\n{table}\n{}",
            report.summary(),
            lab.log_tails(30)
        )),
        Err(e) => Err(format!("{name}: {e:#}\n{table}\n{}", lab.log_tails(30))),
    };
    finish(lab);
    verdict
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Plays `files` on `threads` labs at a time and fails with every failure.
fn play_all(files: &[PathBuf], threads: usize) -> usize {
    let results: Vec<Result<usize, String>> = std::thread::scope(|s| {
        files
            .chunks(files.len().div_ceil(threads))
            .map(|chunk| s.spawn(move || chunk.iter().map(|f| play(f)).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().expect("a scenario thread panicked"))
            .collect()
    });
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{}",
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    results.iter().filter_map(|r| r.as_ref().ok()).sum()
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
#[ignore = "needs root"]
fn the_quickstart_passes_with_the_image() {
    require_root();
    let rows = play_all(&[examples().join("quickstart.yaml")], 1);
    assert!(rows > 3, "{rows} rows");
}

#[test]
#[ignore = "needs root"]
fn every_fail_closed_scenario_passes_with_the_image() {
    require_root();
    let files = yaml_files(&examples().join("adversarial"));
    assert_eq!(files.len(), 11, "{files:?}");
    play_all(&files, 2);
}

#[test]
#[ignore = "needs root"]
fn every_conformance_case_passes_with_the_image() {
    require_root();
    let files = yaml_files(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance"));
    assert!(files.len() >= 40, "{} files", files.len());
    let rows = play_all(&files, 2);
    assert!(rows > 8 * files.len(), "only {rows} expectations");
}
