//! The chart as the real Helm library renders it (render.py), for the
//! default values and every values file under helm/palisade/ci/: Helm's lint
//! passes, every object is the Kubernetes type it claims to be, and the
//! objects say what the values asked. Bad values are refused at install,
//! naming the value.

use std::path::{Path, PathBuf};
use std::process::Command;

use palisade_chart_check::check_object;
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
    // cni.install: false leaves the node's CNI configuration alone.
    assert!(pod["initContainers"].is_null(), "{pod}");
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
    let init = &pod["initContainers"][0];
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
        ("otlp: {endpoint: otel-collector:4317}\n", "/otlp/endpoint"),
        ("otlp: {endpoint: \"grpc://otel:4317\"}\n", "/otlp/endpoint"),
        (
            "otlp: {endpoint: \"http://otel :4317\"}\n",
            "/otlp/endpoint",
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
