//! The `palisade-lab` binary: exit codes, the table, and no leftovers.

mod common;
use common::require_root;

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
#[ignore = "needs root"]
fn quickstart_example_passes_and_prints_the_table() {
    require_root();
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
#[ignore = "needs root"]
fn a_wrong_expectation_exits_1() {
    require_root();
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

/// A scenario with an out-of-range port.
fn bad_scenario(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "objects: [{kind: Namespace, metadata: {name: x}}]\nsteps:\n  - probes: [{from: x/a, to: x/b, port: 99999}]\n",
    )
    .unwrap();
    path
}

#[test]
fn a_bad_scenario_is_refused_before_anything_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let path = bad_scenario(dir.path());
    let (out, _, stderr) = run(&["validate", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("steps[0]") && stderr.contains("port: 99999"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs root"]
fn run_refuses_a_bad_scenario_before_anything_is_built() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = bad_scenario(dir.path());
    let (out, _, stderr) = run(&["run", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("port: 99999"), "{stderr}");
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

/// Starts a lab on a scenario too long to finish, and returns once probe
/// rows show that its pods, processes and pins all exist: the child, its
/// remaining output, and its first line (which names the lab).
fn start_long_lab(
    nodes: u32,
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    String,
    tempfile::TempDir,
) {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.yaml");
    let steps: String = (0..5000)
        .map(|i| format!("  - name: s{i}\n    probes: [{{from: x/a, to: x/b, port: 80}}]\n"))
        .collect();
    std::fs::write(
        &path,
        format!("nodes: {nodes}\n{}\nsteps:\n{steps}", common::PODS.trim()),
    )
    .unwrap();
    let mut child = Command::new(LAB)
        .args(["run", path.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(lines.any(|l| l.unwrap().starts_with("s1 ")));
    (child, lines, first, dir)
}

#[test]
#[ignore = "needs root"]
fn clean_removes_what_a_killed_lab_left() {
    require_root();
    // Two nodes: everything per node (namespace, pin root, enforcer) and the
    // fabric must be found and swept too.
    let (mut child, _lines, first, _dir) = start_long_lab(2);
    let id = first
        .strip_prefix("lab ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    child.kill().unwrap();
    child.wait().unwrap();
    for ns in ["node", "node2", "fabric"] {
        assert!(
            Path::new(&format!("/run/netns/pl{id}-{ns}")).exists(),
            "{ns}"
        );
    }
    assert!(Path::new(&format!("/sys/fs/bpf/palisade-lab-{id}-node-2")).exists());

    let pids: Vec<u32> = std::fs::read_to_string(format!("/run/palisade-lab/{id}/pids"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3, "controller and two enforcers");
    // What a benchmark killed mid-burst leaves: its tracefs instance.
    let instance = Path::new(palisade_e2e::exec_trace::INSTANCES)
        .join(palisade_e2e::exec_trace::lab_instance(&id));
    std::fs::create_dir(&instance).unwrap();

    let (out, stdout, stderr) = run(&["clean"]);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(&format!("pl{id}-node")), "{stdout}");
    for ns in ["node", "node2", "fabric"] {
        assert!(
            !Path::new(&format!("/run/netns/pl{id}-{ns}")).exists(),
            "{ns}"
        );
    }
    assert!(!Path::new(&format!("/sys/fs/bpf/palisade-lab-{id}")).exists());
    assert!(!Path::new(&format!("/sys/fs/bpf/palisade-lab-{id}-node-2")).exists());
    assert!(!instance.exists(), "{stdout}");
    assert!(stdout.contains("tracefs instance"), "{stdout}");
    // SIGKILL is asynchronous; the orphans are reaped by init.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while pids.iter().any(|p| palisade_e2e::process::is_alive(*p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{pids:?} survived: {stdout}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20)); // poll: inside a loop bounded by a deadline
    }
    // Its logs stay for the post-mortem; remove them so the run root is clean.
    let _ = std::fs::remove_dir_all(format!("/run/palisade-lab/{id}"));
}

#[test]
#[ignore = "needs root"]
fn the_other_examples_pass() {
    require_root();
    for name in [
        "egress-ipblock.yaml",
        "namespaces.yaml",
        "services.yaml",
        "fixed/named-ports-endport-policytypes.yaml",
        "cross-node.yaml",
    ] {
        let path = example(name);
        let (out, stdout, stderr) = run(&["run", path.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert_run_left_nothing(&stdout);
    }
}

#[test]
#[ignore = "needs root"]
fn refuses_to_run_without_root() {
    // Needs root to drop to nobody, and setpriv (util-linux) to do it.
    require_root();
    assert!(
        Path::new("/usr/bin/setpriv").exists(),
        "setpriv (util-linux) is needed to drop privileges"
    );
    let out = Command::new("/usr/bin/setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            LAB,
            "run",
        ])
        .arg(example("quickstart.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("must run as root"), "{stderr}");
}

#[test]
#[ignore = "needs root"]
fn ctrl_c_mid_run_cleans_up_and_exits_130() {
    require_root();
    let (mut child, lines, first, _dir) = start_long_lab(1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert_run_left_nothing(&first);
}

/// `up` plays the scenario, prints how to reach every process and pod,
/// keeps the lab running (its enforcer answers grpcurl) until SIGINT, then
/// removes everything, as `run` does.
#[test]
#[ignore = "needs root"]
fn up_keeps_the_lab_until_interrupted_then_cleans_up() {
    use std::io::{BufRead, BufReader};
    require_root();
    let mut child = Command::new(LAB)
        .args(["up", example("quickstart.yaml").to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdout = String::new();
    // Reading blocks until `up` prints; its own deadlines bound the wait.
    for line in lines.by_ref() {
        let line = line.unwrap();
        stdout.push_str(&line);
        stdout.push('\n');
        if line.trim_start().starts_with("logs:") {
            break;
        }
    }
    assert!(stdout.contains("is up"), "{stdout}");
    // Each node's line: `node-K  grpcurl ... -unix SOCKET ...GetEnforcerState`.
    let socket = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("node-1") && l.contains("GetEnforcerState"))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "-unix")?;
            words.get(at + 1).map(|s| s.to_string())
        })
        .unwrap_or_else(|| panic!("no enforcer socket in {stdout}"));
    let state = Command::new("grpcurl")
        .args(["-plaintext", "-authority", "localhost", "-unix", &socket])
        .arg("palisade.v1.DebugService/GetEnforcerState")
        .output()
        .expect("grpcurl runs");
    assert!(
        state.status.success(),
        "{}",
        String::from_utf8_lossy(&state.stderr)
    );
    assert!(stdout.contains("nsenter --net=/run/netns/"), "{stdout}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    for line in lines {
        stdout.push_str(&line.unwrap());
        stdout.push('\n');
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert_run_left_nothing(&stdout);
}

/// `--engine model` judges a scenario with the reference model alone and
/// prints the same table; what it cannot judge it refuses by name.
#[test]
fn the_model_engine_runs_without_a_lab() {
    let (out, stdout, stderr) = run(&[
        "run",
        "--engine",
        "model",
        example("fixed/named-ports-endport-policytypes.yaml")
            .to_str()
            .unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("PASS") && stdout.contains("(model)"),
        "{stdout}"
    );
    let (out, _, stderr) = run(&[
        "run",
        "--engine",
        "model",
        example("adversarial/new-pod-controller-down-strict.yaml")
            .to_str()
            .unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot play"), "{stderr}");
}

/// A datapath verdict the reference model does not share is reported as a
/// disagreement of its own: here the lab runs without Palisade, so every
/// denial the model expects is a disagreement.
#[test]
#[ignore = "needs root"]
fn a_datapath_verdict_the_model_does_not_share_is_reported_as_such() {
    require_root();
    let path = example("quickstart.yaml");
    let (out, stdout, stderr) = run(&["run", "--baseline", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "model disagrees: x/a -> x/b 81/TCP: the datapath says allow, the model says deny"
        ),
        "{stdout}"
    );
    assert_run_left_nothing(&stdout);
}
