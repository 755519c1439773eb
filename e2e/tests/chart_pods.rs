//! The chart's pods, run as rendered. For the default values and every
//! values file under helm/palisade/ci/, the real Helm library renders the
//! chart (with the image scripts/image.sh just built, and the node's host
//! paths under the lab's run dir: this machine's own CNI dirs belong to
//! podman), and the lab runs the enforcer DaemonSet's pod (its init
//! containers, then the enforcer) and the controller Deployment's pod (its
//! policy source and leader election against the stand-in API server) as a
//! kubelet would (`palisade_e2e::kubelet`), until both pass their
//! readiness probes and the enforcer's plan stream to the controller is up
//! (through the Service's name, with mutual TLS where the values ask).
//! Then what the kernel says about each process: its user, capabilities,
//! no_new_privs and seccomp mode, and what the init containers left on the
//! node; and that the enforcer pod's cni-watch container chains
//! palisade-cni again after a primary CNI's installer rewrote the conflist
//! without it, and exits 0 on SIGTERM.
//!
//! The enforcer's seccomp: the runtime's default profile stops it at its
//! first map (bpf(2) is refused without CAP_SYS_ADMIN); the chart's own
//! profile lets it run.

mod common;

#[path = "../../policy-controller/tests/api_double/mod.rs"]
#[allow(dead_code)]
mod api_double;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{finish, require_root};
use palisade_e2e::chart::default_chart;
use palisade_e2e::lab::{conflist_name, ApiServer, ImageRun};
use palisade_e2e::{Lab, LabConfig};
use serde_json::Value;

/// Capability numbers (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn image_run() -> ImageRun {
    let built = palisade_e2e::image::ensure().unwrap_or_else(|e| panic!("{e:#}"));
    ImageRun {
        image: built.reference.clone(),
        chart: default_chart(),
    }
}

/// The stand-in API server (policy-controller's tests'), empty, served on
/// its own thread for the rest of the test process.
fn api() -> ApiServer {
    ApiServer(Arc::new(|listener| {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let _double = api_double::ApiDouble::start_on(listener).await;
                std::future::pending::<()>().await;
            });
        });
        Ok(())
    }))
}

fn values_cases() -> Vec<(String, Value)> {
    let dir = default_chart().join("ci");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut cases = vec![("default values".to_string(), Value::Null)];
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let values: Value = serde_yaml::from_str(&text).unwrap();
        cases.push((
            f.file_name().unwrap().to_string_lossy().into_owned(),
            values,
        ));
    }
    cases
}

/// `/proc/PID/status` fields.
struct Status(String);

impl Status {
    fn of(pid: u32) -> Status {
        Status(std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap())
    }
    fn field(&self, name: &str) -> &str {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {}", self.0))
            .trim()
    }
    fn effective_caps(&self) -> u64 {
        u64::from_str_radix(self.field("CapEff"), 16).unwrap()
    }
}

fn caps(bits: &[u32]) -> u64 {
    bits.iter().map(|b| 1u64 << b).sum()
}

/// One values case on a one-node lab; Err(what went wrong) otherwise.
fn run_case(label: &str, values: &Value) -> Result<(), String> {
    let config = LabConfig {
        image: Some(image_run()),
        chart_values: values.clone(),
        api: Some(api()),
        ..LabConfig::default()
    };
    let mut lab = Lab::start(config).map_err(|e| format!("{label}: {e:#}"))?;
    let check = |lab: &mut Lab| -> Result<(), String> {
        let enforcer = Status::of(lab.enforcer_pid().ok_or("no enforcer")?);
        // NET_RAW too where it learns names (dns.servers): the packet
        // socket that re-injects held answers.
        let learns = values["dns"]["servers"]
            .as_array()
            .is_some_and(|s| !s.is_empty());
        let mut bits = vec![CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON];
        if learns {
            bits.push(CAP_NET_RAW);
        }
        let want = caps(&bits);
        if enforcer.effective_caps() != want {
            return Err(format!(
                "enforcer CapEff {:x}, want {want:x}",
                enforcer.effective_caps()
            ));
        }
        for (field, value) in [("Uid", "0\t0\t0\t0"), ("NoNewPrivs", "1"), ("Seccomp", "2")] {
            if enforcer.field(field) != value {
                return Err(format!(
                    "enforcer {field}: {:?}, want {value:?}",
                    enforcer.field(field)
                ));
            }
        }
        let controller = Status::of(lab.controller_pid().ok_or("no controller")?);
        for (field, value) in [
            ("Uid", "65532\t65532\t65532\t65532"),
            ("Gid", "65532\t65532\t65532\t65532"),
            ("NoNewPrivs", "1"),
            ("Seccomp", "2"),
        ] {
            if controller.field(field) != value {
                return Err(format!(
                    "controller {field}: {:?}, want {value:?}",
                    controller.field(field)
                ));
            }
        }
        if controller.effective_caps() != 0 {
            return Err(format!(
                "controller CapEff {:x}",
                controller.effective_caps()
            ));
        }
        // What the init containers left on the node.
        let root = lab.node_root_of(lab.node_name()).ok_or("no node root")?;
        let profiles = root.join("kubelet/seccomp/palisade");
        let installed: Vec<PathBuf> = std::fs::read_dir(&profiles)
            .map_err(|e| format!("{}: {e}", profiles.display()))?
            .map(|e| e.unwrap().path())
            .collect();
        let shipped = std::fs::read(default_chart().join("files/enforcer-seccomp.json")).unwrap();
        if installed.len() != 1 || std::fs::read(&installed[0]).unwrap() != shipped {
            return Err(format!("seccomp profiles installed: {installed:?}"));
        }
        let name = conflist_name(values);
        let path = root.join("cni/net.d").join(name);
        let conflist = conflist(&path)?;
        let installs = values["cni"]["install"] != false;
        if chained(&conflist) != installs || root.join("cni/bin/palisade-cni").exists() != installs
        {
            return Err(format!("cni.install {installs}, conflist {conflist}"));
        }
        if installs {
            rechained_after_a_rewrite(lab, label, &path, name)?;
        }
        Ok(())
    };
    let result = check(&mut lab).map_err(|e| format!("{label}: {e}\n{}", lab.log_tails(20)));
    finish(lab);
    result
}

/// The pod's cni-watch container, as a primary CNI's installer rewrites
/// the node's conflist without palisade-cni (a new file renamed over it, as
/// flannel's does on each restart of its pod): palisade-cni is chained
/// again within the deadline, the container says so, and SIGTERM stops it
/// with exit 0.
fn rechained_after_a_rewrite(
    lab: &mut Lab,
    label: &str,
    path: &Path,
    name: &str,
) -> Result<(), String> {
    const DEADLINE: Duration = Duration::from_secs(30);
    let node = lab.node_name().to_string();
    let log = lab
        .sidecar_log(&node, "cni-watch")
        .map_err(|e| format!("{e:#}"))?;
    let log_says = |line: &str| std::fs::read_to_string(&log).is_ok_and(|t| t.contains(line));
    let wait_until = |what: &str, done: &dyn Fn() -> bool| -> Result<Instant, String> {
        let deadline = Instant::now() + DEADLINE;
        while !done() {
            if Instant::now() > deadline {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "{what}: not within {DEADLINE:?}; conflist {:?}; cni-watch's log:\n{text}",
                    conflist(path)
                ));
            }
            std::thread::sleep(Duration::from_millis(10)); // poll: inside a loop bounded by a deadline
        }
        Ok(Instant::now())
    };
    wait_until("cni-watch watching", &|| log_says("for changes"))?;

    let mut theirs = conflist(path)?;
    theirs["plugins"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["type"] != "palisade-cni");
    let tmp = path.with_extension("vendor-tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&theirs).unwrap()).unwrap();
    let rewritten = Instant::now();
    std::fs::rename(&tmp, path).unwrap();
    let back = wait_until("chained again", &|| {
        conflist(path).is_ok_and(|c| chained(&c))
    })?;
    eprintln!(
        "{label}: palisade-cni chained again {:?} after the rewrite",
        back - rewritten
    );
    let said = format!("palisade-cni was missing from /host/cni/net.d/{name}: chained again");
    wait_until("cni-watch saying so", &|| log_says(&said))?;
    let stopping = Instant::now();
    match lab.stop_sidecar(&node, "cni-watch") {
        Ok(Some(0)) => {
            eprintln!(
                "{label}: cni-watch exited 0 {:?} after SIGTERM",
                stopping.elapsed()
            );
            Ok(())
        }
        other => Err(format!("cni-watch on SIGTERM: {other:?}")),
    }
}

fn chained(conflist: &Value) -> bool {
    conflist["plugins"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["type"] == "palisade-cni"))
}

fn conflist(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

#[test]
#[ignore = "needs root"]
fn every_values_file_runs_its_pods_as_rendered() {
    require_root();
    let cases = values_cases();
    assert!(cases.len() >= 4, "{cases:?}");
    // Two labs at a time: each is its own namespaces, pods and API.
    let failures: Vec<String> = std::thread::scope(|s| {
        cases
            .chunks(cases.len().div_ceil(2))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|(label, values)| run_case(label, values).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The runtime's default profile here (containers-common's, which CRI-O
/// and podman apply for RuntimeDefault) allows bpf(2) only to a process
/// with CAP_SYS_ADMIN and answers EPERM otherwise; the enforcer, with BPF,
/// NET_ADMIN and PERFMON only, exits at its first map. The chart's profile
/// (the default) lets the same pod run: every case above. (containerd's
/// default allows bpf with CAP_BPF since 1.6.9: docs/helm.md, Seccomp.)
#[test]
#[ignore = "needs root"]
fn under_the_runtimes_default_profile_the_enforcer_cannot_create_its_maps() {
    require_root();
    let profile: Value = serde_json::from_str(
        &std::fs::read_to_string("/usr/share/containers/seccomp.json").unwrap(),
    )
    .unwrap();
    let bpf_rules: Vec<&Value> = profile["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == "bpf"))
        .collect();
    assert!(
        bpf_rules.iter().all(
            |r| r["includes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"])
                || r["excludes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"])
                    && r["errnoRet"] == 1
        ),
        "the runtime's profile changed how it treats bpf: {bpf_rules:?}"
    );
    let config = LabConfig {
        image: Some(image_run()),
        chart_values: serde_json::json!({"enforcer": {"seccompProfile": "runtimeDefault"}}),
        api: Some(api()),
        ..LabConfig::default()
    };
    let err = match Lab::start(config) {
        Ok(lab) => {
            let tails = lab.log_tails(20);
            finish(lab);
            panic!("the enforcer ran under the runtime's default profile:\n{tails}");
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("palisade-enforcer exited"), "{err}");
    assert!(err.contains("failed to create map"), "{err}");
    assert!(err.contains("Operation not permitted"), "{err}");
}
