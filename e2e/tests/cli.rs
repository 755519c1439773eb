//! The `palisade-lab` binary: exit codes, the table, and no leftovers.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LAB: &str = env!("CARGO_BIN_EXE_palisade-lab");

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

fn run(args: &[&str]) -> (Output, String, String) {
    let out = Command::new(LAB)
        .args(args)
        .output()
        .expect("palisade-lab runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// The run id from the "lab <id> (...)" line; everything is named after it.
fn assert_run_left_nothing(stdout: &str) {
    let id = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("lab ")
                .and_then(|r| r.split_whitespace().next())
        })
        .expect("the lab prints its id");
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let prefix = format!("pl{id}-");
    assert!(
        !netns.iter().any(|n| n.starts_with(&prefix)),
        "namespaces left: {netns:?}"
    );
    assert!(!Path::new(&format!("/sys/fs/bpf/palisade-lab-{id}")).exists());
    assert!(!Path::new(&format!("/run/palisade-lab/{id}")).exists());
}

#[test]
fn quickstart_example_passes_and_prints_the_table() {
    if !common::is_root() {
        return;
    }
    let path = example("quickstart.yaml");
    let (out, stdout, stderr) = run(&["run", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("STEP") && stdout.contains("RESULT"),
        "{stdout}"
    );
    assert!(stdout.contains("default deny ingress x/b"), "{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_run_left_nothing(&stdout);
}

#[test]
fn a_wrong_expectation_exits_1() {
    if !common::is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wrong.yaml");
    std::fs::write(
        &path,
        format!(
            "{}\nsteps:\n  - name: wrong on purpose\n    probes:\n      - {{from: x/a, to: x/b, port: 80, expect: deny}}\n      - {{from: x/a, to: x/b, port: 53, protocol: UDP, expect: allow}}\n",
            common::PODS.trim()
        ),
    )
    .unwrap();
    let (out, stdout, stderr) = run(&["run", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let fail_line = stdout
        .lines()
        .find(|l| l.contains("80/TCP"))
        .expect("the probe row is printed");
    assert!(fail_line.ends_with("FAIL"), "{fail_line}");
    assert!(stdout.contains("FAIL: 1 of 2"), "{stdout}");
    assert_run_left_nothing(&stdout);
}

#[test]
fn a_bad_scenario_is_refused_before_anything_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "objects: [{kind: Namespace, metadata: {name: x}}]\nsteps:\n  - probes: [{from: x/a, to: x/b, port: 99999}]\n",
    )
    .unwrap();
    let (out, _, stderr) = run(&["validate", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("steps[0]") && stderr.contains("port: 99999"),
        "{stderr}"
    );
    if common::is_root() {
        let (out, _, stderr) = run(&["run", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("port: 99999"), "{stderr}");
    }
}

#[test]
fn every_example_is_valid() {
    for entry in std::fs::read_dir(example("")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let (out, _, stderr) = run(&["validate", path.to_str().unwrap()]);
            assert!(out.status.success(), "{}: {stderr}", path.display());
        }
    }
}
