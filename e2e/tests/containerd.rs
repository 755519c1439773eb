//! Pods started by a real container runtime (issue 19, item 4): every pod
//! of these labs is a CRI sandbox of the node's own containerd, which makes
//! the netns and runs the CNI chain (ptp or bridge, then palisade-cni) with
//! the kubelet's CNI_ARGS; probes run in containerd's sandbox netns. The
//! quickstart, the adversarial suite's pod-up cases, a sandbox recreated
//! under the same name, and the whole conformance suite.

mod common;
use common::require_root;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use palisade_e2e::dump::DumpCheck;
use palisade_e2e::runtime::PodRuntime;
use palisade_e2e::{run_scenario, Lab, LabConfig, PodName, Scenario};

fn example(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn containerd_config(scenario: &Scenario) -> LabConfig {
    let mut config = LabConfig::default().for_scenario(scenario);
    config.runtime = PodRuntime::Containerd;
    config
}

/// Plays a scenario with containerd starting its pods; Err(the table and
/// the logs) unless every expectation holds. Returns the expectations met.
fn play(path: &Path) -> Result<usize, String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let scenario = Scenario::from_file(path).map_err(|e| format!("{name}: {e:#}"))?;
    let mut lab = Lab::start(containerd_config(&scenario))
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

fn play_example(path: &str) -> String {
    let mut out = Vec::new();
    let scenario = Scenario::from_file(&example(path)).unwrap();
    let mut lab = Lab::start(containerd_config(&scenario))
        .unwrap_or_else(|e| panic!("{path}: the lab did not start: {e:#}"));
    let result = run_scenario(&mut lab, &scenario, &mut out);
    let table = String::from_utf8_lossy(&out).into_owned();
    match result {
        Ok(report) if report.passed() => {}
        Ok(report) => panic!(
            "{path}: {}\n{table}\n{}",
            report.summary(),
            lab.log_tails(40)
        ),
        Err(e) => panic!("{path}: {e:#}\n{table}\n{}", lab.log_tails(40)),
    }
    finish(lab);
    table
}

#[test]
#[ignore = "needs root"]
fn quickstart_passes_with_containerd_pods() {
    require_root();
    play_example("examples/quickstart.yaml");
}

/// Strict refusal: palisade-cni fails the ADD at the deadline, so
/// RunPodSandbox fails; containerd tears the sandbox down (DEL of the
/// chain) and keeps nothing of it, which the lab checks. The same pod
/// then starts under the same sandbox name once its policy can be known.
#[test]
#[ignore = "needs root"]
fn strict_refusal_fails_run_pod_sandbox() {
    require_root();
    let table = play_example("examples/adversarial/new-pod-controller-down-strict.yaml");
    assert!(
        table.contains(
            "ADD failed as expected: palisade-cni ADD failed (containerd RunPodSandbox of pod x/d)"
        ),
        "{table}"
    );
}

#[test]
#[ignore = "needs root"]
fn standard_pod_without_policy_starts_visibly_unprotected() {
    require_root();
    play_example("examples/adversarial/new-pod-controller-down-standard.yaml");
}

#[test]
#[ignore = "needs root"]
fn stop_pod_sandbox_with_the_enforcer_down_succeeds() {
    require_root();
    play_example("examples/adversarial/del-while-enforcer-down.yaml");
}

/// The kubelet recreates a sandbox under the same pod (name, namespace,
/// uid; the next attempt). Here the new one starts before the old one is
/// stopped, so the old sandbox's CNI DEL names the same pod after the new
/// one's ADD: the new sandbox must keep the pod's policy, and the old veth
/// must leave the enforcer.
#[test]
#[ignore = "needs root"]
fn a_recreated_sandbox_keeps_the_pods_policy() {
    require_root();
    let mut lab = lab_with_pods_in(LabConfig {
        runtime: PodRuntime::Containerd,
        ..LabConfig::default()
    });
    lab.apply(&policies(ALLOW_A_80)).unwrap();
    lab.wait_realized().unwrap();
    let b = PodName::parse("x/b").unwrap();
    let old_id = lab.sandbox_id(&b).unwrap().to_string();
    let old_ns = lab.pod_netns(&b).unwrap().to_string();
    let old_veth = lab.host_veth(&b).unwrap();

    lab.recreate_sandbox(&b).unwrap();
    lab.wait_realized().unwrap();
    assert_ne!(lab.sandbox_id(&b).unwrap(), old_id);
    assert!(
        !palisade_e2e::netns::NetNs::exists(&old_ns),
        "old netns left"
    );
    let new_veth = lab.host_veth(&b).unwrap();
    assert_ne!(new_veth, old_veth);
    assert_verdicts(
        &lab,
        "after the sandbox of x/b was recreated",
        &[
            ("x/a", "x/b", 80, Tcp, Allow),
            ("x/a", "x/b", 81, Tcp, Deny),
            ("x/c", "x/b", 80, Tcp, Deny),
            ("x/b", "x/a", 80, Tcp, Allow),
        ],
    );
    let checks = [
        DumpCheck::Realized {
            pod: b.clone(),
            realized: true,
        },
        DumpCheck::VethAttached(b.clone()),
    ];
    for (check, result) in lab.check_dump(&checks).unwrap() {
        assert!(result.is_ok(), "{check}: {result:?}\n{}", lab.log_tails(30));
    }
    // The old veth leaves the dump once the old sandbox's DEL is handled.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = lab.enforcer_state().unwrap();
        if !palisade_e2e::dump::dump_lists_interface(&state, &old_veth) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dump still lists {old_veth}, the old sandbox's veth"
        );
        std::thread::sleep(Duration::from_millis(50)); // poll: bounded by the deadline
    }
    finish(lab);
}

/// The conformance suite (e2e/conformance/) with containerd starting every
/// pod, on two nodes (a containerd each), four labs at once.
#[test]
#[ignore = "needs root"]
fn every_conformance_case_passes_with_containerd_pods() {
    require_root();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 40, "{} files", files.len());
    let started = Instant::now();
    let results: Vec<Result<usize, String>> = std::thread::scope(|s| {
        let chunks: Vec<&[PathBuf]> = files.chunks(files.len().div_ceil(4)).collect();
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
        "conformance with containerd: {} cases, {probes} expectations met, {} failed, in {:?}",
        files.len(),
        failures.len(),
        started.elapsed()
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
    assert!(probes > 8 * files.len(), "only {probes} expectations");
}

/// `palisade-lab clean` after a containerd lab was killed (SIGKILL, no
/// teardown): containerd, its shims and the pause processes, the sandbox
/// netns containerd made, its mounts, the lab's cgroups and libcni's
/// cache files all go.
#[test]
#[ignore = "needs root"]
fn clean_removes_what_a_killed_containerd_lab_left() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    require_root();
    const LAB: &str = env!("CARGO_BIN_EXE_palisade-lab");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.yaml");
    let steps: String = (0..5000)
        .map(|i| format!("  - name: s{i}\n    probes: [{{from: x/a, to: x/b, port: 80}}]\n"))
        .collect();
    std::fs::write(
        &path,
        format!("runtime: containerd\n{}\nsteps:\n{steps}", PODS.trim()),
    )
    .unwrap();
    let mut child = Command::new(LAB)
        .args(["run", path.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(lines.any(|l| l.unwrap().starts_with("s1 ")));
    let id = first
        .strip_prefix("lab ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    child.kill().unwrap();
    child.wait().unwrap();

    let run_dir = PathBuf::from(format!("/run/palisade-lab/{id}"));
    let sandboxes: Vec<(String, String)> = std::fs::read_to_string(run_dir.join("sandboxes"))
        .unwrap()
        .lines()
        .map(|l| {
            let (s, n) = l.split_once(' ').unwrap();
            (s.to_string(), n.to_string())
        })
        .collect();
    assert_eq!(sandboxes.len(), 3, "{sandboxes:?}");
    let cgroup = palisade_e2e::runtime::cgroups::lab_cgroup(&id);
    let pause = palisade_e2e::runtime::cgroups::pids(&cgroup);
    assert!(pause.len() >= 3, "pause processes in {cgroup}: {pause:?}");
    let pids: Vec<u32> = std::fs::read_to_string(run_dir.join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(!palisade_e2e::runtime::mounts::under(&run_dir).is_empty());
    for (_, ns) in &sandboxes {
        assert!(palisade_e2e::netns::NetNs::exists(ns), "{ns}");
    }

    let out = Command::new(LAB).arg("clean").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (sandbox, ns) in &sandboxes {
        assert!(
            !palisade_e2e::netns::NetNs::exists(ns),
            "{ns} left: {stdout}"
        );
        for f in palisade_e2e::runtime::sweep::cache_paths(sandbox) {
            assert!(!f.exists(), "{} left: {stdout}", f.display());
        }
    }
    assert!(
        palisade_e2e::runtime::cgroups::existing(&cgroup).is_empty(),
        "{stdout}"
    );
    assert!(
        palisade_e2e::runtime::mounts::under(&run_dir).is_empty(),
        "{stdout}"
    );
    // SIGKILL is asynchronous; the orphans are reaped by init.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids
        .iter()
        .chain(&pause)
        .any(|p| palisade_e2e::process::is_alive(*p))
    {
        assert!(
            Instant::now() < deadline,
            "{pids:?} {pause:?} survived: {stdout}"
        );
        std::thread::sleep(Duration::from_millis(20)); // poll: bounded by the deadline
    }
    // Its logs stay for the post-mortem; remove them so the run root is clean.
    let _ = std::fs::remove_dir_all(&run_dir);
}
