//! The chart as the real Helm library renders it (render.py), for the
//! default values and every values file under helm/palisade/ci/: Helm's lint
//! passes, every object is the Kubernetes type it claims to be, and the
//! objects say what the values asked. Bad values are refused at install,
//! naming the value.

use std::path::{Path, PathBuf};
use std::process::Command;

use palisade_chart_check::check_object;
use palisade_chart_check::pod_security::{violations, Level};
use serde_json::Value;

fn helm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs render.py; Ok(objects) or Err(Helm's message).
fn render(values: Option<&Path>) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new("python3");
    cmd.arg(helm_dir().join("check/render.py"))
        .arg(helm_dir().join("palisade"));
    if let Some(v) = values {
        cmd.arg("--values").arg(v);
    }
    let out = cmd
        .output()
        .expect("python3 runs (scripts/setup.sh installs helm-sdkpy)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("ModuleNotFoundError"),
        "render.py needs helm-sdkpy and PyYAML: run scripts/setup.sh\n{stderr}"
    );
    if !out.status.success() {
        return Err(stderr);
    }
    Ok(String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("render.py prints JSON lines"))
        .collect())
}

fn values_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(helm_dir().join("palisade/ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn env_of(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

fn init_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["initContainers"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no init container {name}: {pod}"))
}

/// Renders with `values` (YAML text) as the values file.
fn render_with(values: &str) -> Result<Vec<Value>, String> {
    let dir = tempfile_dir();
    let file = dir.join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let result = render(Some(&file));
    std::fs::remove_dir_all(&dir).unwrap();
    result
}

fn tempfile_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "palisade-chart-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn pod_spec<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    &find(objects, kind)["spec"]["template"]["spec"]
}

fn all_cases() -> Vec<(String, Vec<Value>)> {
    let mut cases = vec![("default values".to_string(), render(None).unwrap())];
    for f in values_files() {
        let objects = render(Some(&f)).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        cases.push((f.display().to_string(), objects));
    }
    cases
}

/// The controller meets the restricted Pod Security level; the enforcer
/// breaks baseline by exactly its host network, its host paths and its
/// three capabilities, so its namespace needs privileged (docs/helm.md).
#[test]
fn the_controller_is_restricted_and_the_enforcer_needs_privileged_for_its_host_access_only() {
    for (label, objects) in all_cases() {
        let controller = pod_spec(&objects, "Deployment");
        assert_eq!(
            violations(controller, Level::Restricted),
            Vec::<String>::new(),
            "{label}: the controller"
        );
        let enforcer = pod_spec(&objects, "DaemonSet");
        let found = violations(enforcer, Level::Baseline);
        let mut controls: Vec<String> = found
            .iter()
            .map(|v| v.split(':').next().unwrap().to_string())
            .collect();
        controls.dedup();
        assert_eq!(
            controls,
            ["host namespaces", "hostPath volumes", "capabilities"],
            "{label}: {found:#?}"
        );
        let added: Vec<&String> = found
            .iter()
            .filter(|v| v.starts_with("capabilities"))
            .collect();
        // NET_RAW only where it learns by domain name (dns.servers): the
        // packet socket that re-injects held answers.
        let learns = enforcer["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "PALISADE_DNS_SERVERS");
        assert_eq!(
            added.len(),
            3 + usize::from(learns),
            "{label}: only BPF, NET_ADMIN, PERFMON (and NET_RAW to learn names): {added:?}"
        );
        assert_eq!(
            added.iter().any(|v| v.contains("NET_RAW")),
            learns,
            "{label}: {added:?}"
        );
    }
}

/// A list of strings (a command), as `&str`s.
fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// The enforcer's readiness needs the file its own enforcer writes once
/// its programs load (`PALISADE_PROGRAMS_LOADED_FILE`), on a volume of this
/// pod alone: in a surge the socket answers for the old pod.
#[test]
fn readiness_waits_for_this_pods_enforcer_to_load_its_programs() {
    for (label, objects) in all_cases() {
        let pod = pod_spec(&objects, "DaemonSet");
        let enforcer = &pod["containers"][0];
        let file = enforcer["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "PALISADE_PROGRAMS_LOADED_FILE")
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{label}: no PALISADE_PROGRAMS_LOADED_FILE"));
        let probe = strings(&enforcer["readinessProbe"]["exec"]["command"]);
        let at = probe.iter().position(|a| *a == "--require-file");
        assert_eq!(at.map(|i| probe[i + 1]), Some(file), "{label}: {probe:?}");
        let live = strings(&enforcer["livenessProbe"]["exec"]["command"]);
        assert!(!live.contains(&"--require-file"), "{label}: {live:?}");
        let mount = enforcer["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| file.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
            .unwrap_or_else(|| panic!("{label}: {file} is on no volume"));
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(
            volume["emptyDir"],
            serde_json::json!({}),
            "{label}: {volume}"
        );
    }
}

/// The enforcer runs under the chart's own seccomp profile (Localhost),
/// named by the profile file's content, which the install-seccomp init
/// container copies from the chart's ConfigMap onto the node first; every
/// other container of both pods runs under the runtime's default. The
/// ConfigMap holds the file's exact bytes: install-seccomp refuses content
/// whose sha256 does not begin with the name's 16 hex digits.
#[test]
fn the_enforcer_runs_under_the_charts_seccomp_profile() {
    let profile =
        std::fs::read_to_string(helm_dir().join("palisade/files/enforcer-seccomp.json")).unwrap();
    let out = Command::new("sha256sum")
        .arg(helm_dir().join("palisade/files/enforcer-seccomp.json"))
        .output()
        .unwrap();
    let digest = String::from_utf8_lossy(&out.stdout)[..16].to_string();
    let name = format!("palisade/enforcer-{digest}.json");
    for (label, objects) in all_cases() {
        let pod = pod_spec(&objects, "DaemonSet");
        let enforcer = &pod["containers"][0];
        assert_eq!(
            enforcer["securityContext"]["seccompProfile"],
            serde_json::json!({"type": "Localhost", "localhostProfile": name}),
            "{label}"
        );
        let init = init_container(pod, "install-seccomp");
        let command = strings(&init["command"]);
        assert_eq!(command[1], "install-seccomp");
        assert_eq!(command.last(), Some(&name.as_str()), "{label}");
        let cm = objects
            .iter()
            .find(|o| {
                o["kind"] == "ConfigMap" && o["metadata"]["name"] == "palisade-enforcer-seccomp"
            })
            .unwrap_or_else(|| panic!("{label}: no seccomp ConfigMap"));
        assert_eq!(
            cm["data"]["enforcer.json"].as_str(),
            Some(profile.as_str()),
            "{label}"
        );
        let kubelet = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "kubelet-seccomp")
            .unwrap();
        assert_eq!(
            kubelet["hostPath"]["path"], "/var/lib/kubelet/seccomp",
            "{label}"
        );
        for c in pod["initContainers"].as_array().unwrap() {
            assert_eq!(
                c["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{label}: {}",
                c["name"]
            );
        }
    }
    let unconfined = render_with("enforcer: {seccompProfile: unconfined}\n").unwrap();
    let pod = pod_spec(&unconfined, "DaemonSet");
    assert_eq!(
        pod["containers"][0]["securityContext"]["seccompProfile"]["type"],
        "Unconfined"
    );
    assert!(pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["name"] != "install-seccomp"));
    assert!(!unconfined.iter().any(|o| o["kind"] == "ConfigMap"));
    let err = render_with("enforcer: {seccompProfile: localhost}\n").unwrap_err();
    assert!(err.contains("/enforcer/seccompProfile"), "{err}");
}

/// The shipped profile is an allow list (anything else: ENOSYS, so the C
/// library's fallbacks work), allows bpf(2), and none of the calls that
/// widen a compromised process's reach: new namespaces, mounts, tracing
/// other processes, keys, io_uring, userfaultfd, modules, kexec.
#[test]
fn the_enforcers_seccomp_profile_allows_bpf_and_no_escape_hatch() {
    let text =
        std::fs::read_to_string(helm_dir().join("palisade/files/enforcer-seccomp.json")).unwrap();
    let p: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
    assert_eq!(p["defaultErrnoRet"], 38, "ENOSYS");
    let rules = p["syscalls"].as_array().unwrap();
    let allowed = |name: &str| {
        rules
            .iter()
            .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == name))
            .collect::<Vec<_>>()
    };
    for r in rules {
        assert_eq!(r["action"], "SCMP_ACT_ALLOW", "{r}");
    }
    assert_eq!(allowed("bpf").len(), 1);
    assert!(
        allowed("bpf")[0]["args"].is_null(),
        "bpf(2) without conditions"
    );
    for name in [
        "unshare",
        "setns",
        "clone3",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "keyctl",
        "add_key",
        "request_key",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "perf_event_open",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "open_by_handle_at",
        "personality",
        "setuid",
        "setgid",
        "capset",
    ] {
        assert!(allowed(name).is_empty(), "{name} is allowed");
    }
    // clone only without CLONE_NEWNS|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWCGROUP.
    let clone = allowed("clone");
    assert_eq!(clone.len(), 1);
    assert_eq!(
        clone[0]["args"],
        serde_json::json!([{"index": 0, "value": 0x7e02_0000u64, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}])
    );
}

#[test]
fn helm_lint_passes() {
    let out = Command::new("python3")
        .arg(helm_dir().join("check/render.py"))
        .arg(helm_dir().join("palisade"))
        .arg("--lint")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_rendered_object_is_the_type_it_claims() {
    let mut cases = vec![None];
    cases.extend(values_files().into_iter().map(Some));
    assert!(
        cases.len() >= 3,
        "expected values files under helm/palisade/ci"
    );
    for values in cases {
        let label = values
            .as_ref()
            .map_or("default values".to_string(), |p| p.display().to_string());
        let objects = render(values.as_deref()).unwrap_or_else(|e| panic!("{label}: {e}"));
        let problems: Vec<String> = objects.iter().flat_map(check_object).collect();
        assert!(problems.is_empty(), "{label}:\n{}", problems.join("\n"));
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in [
            "Deployment",
            "DaemonSet",
            "Service",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
        ] {
            assert!(kinds.contains(&kind), "{label}: no {kind} in {kinds:?}");
        }
    }
}

#[test]
fn the_objects_carry_the_values() {
    let strict = helm_dir().join("palisade/ci/strict-values.yaml");
    let objects = render(Some(&strict)).unwrap();
    let ds = find(&objects, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let enforcer = &pod["containers"][0];
    assert_eq!(env_of(enforcer, "PALISADE_MODE").as_deref(), Some("strict"));
    assert_eq!(
        env_of(enforcer, "PALISADE_CONNTRACK_MAX_ENTRIES").as_deref(),
        Some("1048576")
    );
    assert_eq!(
        env_of(enforcer, "PALISADE_CONNTRACK_SHARE").as_deref(),
        Some("65536")
    );
    assert_eq!(
        env_of(enforcer, "PALISADE_POD_UP_DEADLINE_MS").as_deref(),
        Some("3000")
    );
    assert_eq!(
        env_of(enforcer, "PALISADE_CONNTRACK_ASK").as_deref(),
        Some("dump")
    );
    // cni.install: false leaves the node's CNI configuration alone; the
    // seccomp profile is still installed.
    let inits: Vec<&str> = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(inits, ["install-seccomp"], "{pod}");
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        enforcer["securityContext"]["capabilities"]["add"],
        serde_json::json!(["BPF", "NET_ADMIN", "PERFMON"])
    );
    assert_eq!(
        enforcer["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );

    let defaults = render(None).unwrap();
    let pod = &find(&defaults, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(
        env_of(&pod["containers"][0], "PALISADE_MODE").as_deref(),
        Some("standard")
    );
    let init = init_container(pod, "install-cni");
    let command: Vec<&str> = init["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(&command[..2], ["/usr/local/bin/palisade-cni", "install"]);
    // The controller only reads the API.
    let role = find(&defaults, "ClusterRole");
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(
            rule["verbs"],
            serde_json::json!(["list", "watch"]),
            "{rule}"
        );
    }
    let controller = &find(&defaults, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(controller["securityContext"]["runAsNonRoot"], true);
}

/// Wherever the chart chains palisade-cni (cni.install), the cni-watch
/// container keeps it chained: the install-cni init container's command
/// with --watch, its security context and mounts, small resources; and
/// nowhere else.
#[test]
fn cni_watch_runs_the_init_containers_install_with_watch() {
    for (label, objects) in all_cases() {
        let pod = pod_spec(&objects, "DaemonSet");
        let containers = pod["containers"].as_array().unwrap();
        let watch = containers.iter().find(|c| c["name"] == "cni-watch");
        let init = pod["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "install-cni");
        let (Some(init), Some(watch)) = (init, watch) else {
            assert!(init.is_none() && watch.is_none(), "{label}: {pod}");
            continue;
        };
        assert_eq!(containers[0]["name"], "enforcer", "{label}");
        let mut command = init["command"].as_array().unwrap().clone();
        command.insert(2, "--watch".into());
        assert_eq!(watch["command"], Value::Array(command), "{label}");
        for field in ["image", "securityContext", "volumeMounts"] {
            assert_eq!(watch[field], init[field], "{label}: {field}");
        }
        assert_eq!(
            watch["resources"],
            serde_json::json!({"requests": {"cpu": "5m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}),
            "{label}"
        );
    }
    let objects = render_with(
        "cni: {confFile: 10-x.conflist, watch: {resources: {limits: {memory: 32Mi}}}}\n",
    )
    .unwrap();
    let pod = pod_spec(&objects, "DaemonSet");
    let watch = &pod["containers"][1];
    // Helm merges a values file into the defaults, key by key.
    assert_eq!(
        watch["resources"],
        serde_json::json!({"requests": {"cpu": "5m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}})
    );
    let command = watch["command"].as_array().unwrap();
    assert_eq!(
        &command[command.len() - 2..],
        ["--conf-file", "10-x.conflist"]
    );
}

/// Flow logs (enforcer) and OTLP (both processes) reach the processes as
/// the env their flags read, and only when asked for: the defaults set none
/// of it, so the binaries' own defaults (off) apply.
#[test]
fn telemetry_values_become_env_only_when_set() {
    const TELEMETRY: [&str; 4] = [
        "PALISADE_FLOW_LOG",
        "PALISADE_FLOW_LOG_RATE",
        "PALISADE_FLOW_LOG_PATH",
        "PALISADE_OTLP_ENDPOINT",
    ];
    let containers = |objects: &[Value]| {
        (
            find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0].clone(),
            find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0].clone(),
        )
    };
    let (enforcer, controller) = containers(&render(None).unwrap());
    assert_eq!(
        env_of(&enforcer, "PALISADE_DNS_SERVERS"),
        None,
        "no learner by default"
    );
    for name in TELEMETRY {
        assert_eq!(env_of(&enforcer, name), None, "default values set {name}");
        assert_eq!(env_of(&controller, name), None, "default values set {name}");
    }

    let file = helm_dir().join("palisade/ci/telemetry-values.yaml");
    let (enforcer, controller) = containers(&render(Some(&file)).unwrap());
    assert_eq!(
        env_of(&enforcer, "PALISADE_FLOW_LOG").as_deref(),
        Some("deny")
    );
    assert_eq!(
        env_of(&enforcer, "PALISADE_FLOW_LOG_RATE").as_deref(),
        Some("200")
    );
    let endpoint = Some("http://otel-collector.observability.svc:4318");
    assert_eq!(
        env_of(&enforcer, "PALISADE_OTLP_ENDPOINT").as_deref(),
        endpoint
    );
    assert_eq!(
        env_of(&controller, "PALISADE_OTLP_ENDPOINT").as_deref(),
        endpoint
    );
    assert_eq!(
        env_of(&controller, "PALISADE_FLOW_LOG"),
        None,
        "the controller has no flow log"
    );
    assert_eq!(
        env_of(&enforcer, "PALISADE_DNS_SERVERS").as_deref(),
        Some("10.96.0.10,169.254.20.10")
    );
    assert_eq!(
        env_of(&enforcer, "PALISADE_DNS_MIN_TTL_SECS").as_deref(),
        Some("10")
    );
    assert_eq!(
        env_of(&enforcer, "PALISADE_DNS_ENTRIES_PER_POD").as_deref(),
        Some("8192"),
        "the defaults go with the servers"
    );

    let dir = std::env::temp_dir().join(format!("palisade-chart-telemetry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("values.yaml");
    // Unquoted, YAML 1.1 reads off as false: off all the same, not refused.
    std::fs::write(&file, "flowLogs: {mode: off}\n").unwrap();
    let (enforcer, _) = containers(&render(Some(&file)).unwrap());
    assert_eq!(env_of(&enforcer, "PALISADE_FLOW_LOG"), None);
    // Mode alone: the default rate goes with it.
    std::fs::write(&file, "flowLogs: {mode: all}\n").unwrap();
    let (enforcer, _) = containers(&render(Some(&file)).unwrap());
    assert_eq!(
        env_of(&enforcer, "PALISADE_FLOW_LOG").as_deref(),
        Some("all")
    );
    assert_eq!(
        env_of(&enforcer, "PALISADE_FLOW_LOG_RATE").as_deref(),
        Some("1000")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_values_are_refused_naming_the_value() {
    let dir = std::env::temp_dir().join(format!("palisade-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (text, named) in [
        ("mdoe: strict\n", "mdoe"),
        ("mode: lax\n", "/mode"),
        (
            "conntrack: {maxEntries: 10, cleanupSeconds: 60}\n",
            "/conntrack/maxEntries",
        ),
        (
            "controller: {replicas: 0, port: 7443}\n",
            "/controller/replicas",
        ),
        (
            "cni: {install: true, binDir: opt/cni/bin, confDir: /etc/cni/net.d}\n",
            "/cni/binDir",
        ),
        ("policySource: calico\n", "/policySource"),
        (
            "conntrack: {maxEntries: 65536, cleanupSeconds: 60, ask: events}\n",
            "/conntrack/ask",
        ),
        (
            "metrics: {enabled: true, controllerPort: 0, enforcerPort: 9091}\n",
            "/metrics/controllerPort",
        ),
        ("flowLogs: {mode: verbose}\n", "/flowLogs/mode"),
        ("flowLogs: {mode: true}\n", "/flowLogs/mode"),
        (
            "flowLogs: {mode: all, ratePerSecond: 0}\n",
            "/flowLogs/ratePerSecond",
        ),
        (
            "flowLogs: {mode: all, ratePerSecond: 1000001}\n",
            "/flowLogs/ratePerSecond",
        ),
        (
            "flowLogs: {mode: all, ratePerSecond: 2.5}\n",
            "/flowLogs/ratePerSecond",
        ),
        ("flowLogs: {mode: deny, rate: 10}\n", "rate"),
        ("cni: {watch: {resource: {}}}\n", "resource"),
        ("otlp: {endpoint: otel-collector:4317}\n", "/otlp/endpoint"),
        ("otlp: {endpoint: \"grpc://otel:4317\"}\n", "/otlp/endpoint"),
        (
            "otlp: {endpoint: \"http://otel :4317\"}\n",
            "/otlp/endpoint",
        ),
        ("dns: {heldBytes: 5000}\n", "/dns/heldBytes"),
        (
            "controller: {leaderElection: {enabled: true, leaseDurationSeconds: 10, renewDeadlineSeconds: 10, retryPeriodSeconds: 2}}\n",
            "renewDeadlineSeconds (10) must be less than leaseDurationSeconds (10)",
        ),
        (
            "controller: {leaderElection: {enabled: true, leaseDurationSeconds: 15, renewDeadlineSeconds: 10, retryPeriodSeconds: 10}}\n",
            "retryPeriodSeconds (10) must be less than renewDeadlineSeconds (10)",
        ),
        (
            "podUpDeadlineMs: 10000\n",
            "podUpDeadlineMs (10000) must be less than cni.timeoutSeconds (10 s)",
        ),
    ] {
        let file = dir.join("values.yaml");
        std::fs::write(&file, text).unwrap();
        let err = render(Some(&file)).expect_err(text);
        assert!(
            err.contains(named),
            "{text:?} refused without naming {named}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The ClusterRole grants list and watch on exactly what the controller's
/// kube source watches in each policy source, no more: (group, resource).
#[test]
fn controller_reads_exactly_what_its_source_watches() {
    let granted = |objects: &[Value]| {
        let mut pairs = std::collections::BTreeSet::new();
        for rule in find(objects, "ClusterRole")["rules"].as_array().unwrap() {
            assert_eq!(
                rule["verbs"],
                serde_json::json!(["list", "watch"]),
                "{rule}"
            );
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    pairs.insert(format!(
                        "{}/{}",
                        group.as_str().unwrap(),
                        resource.as_str().unwrap()
                    ));
                }
            }
        }
        pairs.into_iter().collect::<Vec<_>>()
    };
    assert_eq!(
        granted(&render(None).unwrap()),
        [
            "/namespaces",
            "/nodes",
            "/pods",
            "/services",
            "discovery.k8s.io/endpointslices",
            "networking.k8s.aws/applicationnetworkpolicies",
            "networking.k8s.aws/clusternetworkpolicies",
            "networking.k8s.io/networkpolicies",
            "policy.networking.k8s.io/clusternetworkpolicies",
        ]
    );
    assert_eq!(
        granted(&render_with("policySource: policyendpoint\n").unwrap()),
        [
            "/namespaces",
            "/pods",
            "networking.k8s.aws/clusterpolicyendpoints",
            "networking.k8s.aws/policyendpoints"
        ]
    );
}
