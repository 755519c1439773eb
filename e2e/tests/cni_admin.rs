//! The CNI plugin binary's operator commands, run as the DaemonSet runs
//! them: `health` against a live enforcer's socket (the probes), and
//! `install` / `uninstall` on a CNI conf dir (the init container).

mod common;
use common::require_root;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use palisade_e2e::lab::default_bin_dir;

fn cni_binary() -> PathBuf {
    default_bin_dir().join("palisade-cni")
}

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(cni_binary())
        .args(args)
        .output()
        .expect("palisade-cni runs (cargo build --bins)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
#[ignore = "needs root"]
fn health_reports_a_live_enforcer_and_names_a_missing_one() {
    require_root();
    let lab = lab_with_pods();
    let socket = lab.enforcer_socket().to_str().unwrap().to_string();
    let (code, text) = run(&["health", "--enforcer-socket", &socket]);
    assert_eq!(code, Some(0), "{text}");

    let gone = format!("{socket}.gone");
    let (code, text) = run(&["health", "--enforcer-socket", &gone]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cannot reach") && text.contains(&gone),
        "{text}"
    );

    // The readiness probe's form: a serving socket is not enough without
    // the file this pod's enforcer writes once its programs load.
    let dir = tempfile::tempdir().unwrap();
    let loaded = dir.path().join("programs-loaded");
    let loaded = loaded.to_str().unwrap();
    let probe = [
        "health",
        "--enforcer-socket",
        &socket,
        "--require-file",
        loaded,
    ];
    let (code, text) = run(&probe);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(loaded) && text.contains("has not loaded its programs"),
        "{text}"
    );
    std::fs::write(loaded, b"").unwrap();
    let (code, text) = run(&probe);
    assert_eq!(code, Some(0), "{text}");
    finish(lab);
}

#[test]
fn install_and_uninstall_edit_only_our_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (conf, bin) = (dir.path().join("net.d"), dir.path().join("bin"));
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    let original = r#"{"cniVersion": "1.0.0", "name": "k8s", "plugins": [{"type": "ptp", "ipam": {"type": "host-local"}}]}"#;
    let file = conf.join("10-k8s.conflist");
    std::fs::write(&file, original).unwrap();
    let args = |cmd: &'static str| {
        vec![
            cmd.to_string(),
            "--conf-dir".into(),
            conf.to_str().unwrap().into(),
            "--bin-dir".into(),
            bin.to_str().unwrap().into(),
        ]
    };
    let as_strs = |v: &Vec<String>| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");

    let (code, text) = run(&args("install")
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert_eq!(code, Some(0), "{} -> {text}", as_strs(&args("install")));
    let chained: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(chained["plugins"][1]["type"], "palisade-cni");
    assert_eq!(chained["plugins"][0]["type"], "ptp");
    assert!(bin.join("palisade-cni").exists());

    let (code, text) = run(&args("install")
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert_eq!(code, Some(0));
    assert!(text.lines().all(|l| l.ends_with("unchanged")), "{text}");

    let (code, text) = run(&args("uninstall")
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    assert_eq!(code, Some(0), "{text}");
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let want: serde_json::Value = serde_json::from_str(original).unwrap();
    assert_eq!(back, want);
    assert!(!bin.join("palisade-cni").exists());

    let (code, text) = run(&["frobnicate"]);
    assert_eq!(code, Some(2));
    assert!(text.contains("frobnicate"), "{text}");
}

/// `install --watch`, the DaemonSet's cni-watch container: a primary CNI's
/// installer rewriting its list without our entry gets it back, said on
/// stderr, and SIGTERM ends it with exit 0.
#[test]
fn install_watch_chains_again_after_a_rewrite_and_stops_on_sigterm() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let (conf, bin) = (dir.path().join("net.d"), dir.path().join("bin"));
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    let original = r#"{"cniVersion": "1.0.0", "name": "k8s", "plugins": [{"type": "ptp"}]}"#;
    let file = conf.join("10-k8s.conflist");
    std::fs::write(&file, original).unwrap();
    let log = dir.path().join("stderr");
    let mut child = Command::new(cni_binary())
        .args(["install", "--watch", "--conf-dir"])
        .arg(&conf)
        .arg("--bin-dir")
        .arg(&bin)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("palisade-cni runs (cargo build --bins)");
    let chained = || {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|c| c["plugins"][1]["type"] == "palisade-cni")
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(Instant::now() < deadline, "{what}: not within 20s\n{text}");
            std::thread::sleep(Duration::from_millis(20)); // poll: inside a loop bounded by a deadline
        }
    };
    let said = |line: &str| std::fs::read_to_string(&log).unwrap().contains(line);
    wait_for("the first install", &|| said("for changes"));
    assert!(chained());
    // As flannel's installer does on its pod's restart.
    let tmp = conf.join("10-k8s.tmp");
    std::fs::write(&tmp, original).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let line = format!(
        "palisade-cni was missing from {}: chained again",
        file.display()
    );
    wait_for("the re-chain", &|| said(&line));
    assert!(chained());

    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("still running 20s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20)); // poll: inside a loop bounded by a deadline
    };
    assert_eq!(status.code(), Some(0), "{status}");
}
