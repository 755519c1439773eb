//! The Pod Security Standards' controls (the rules the pod-security
//! admission plugin enforces per namespace), checked on a rendered pod
//! spec: which controls of a level a pod breaks, each named with the field
//! that breaks it. Baseline forbids known privilege escalations; restricted
//! adds the hardening rules; privileged forbids nothing.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Baseline,
    Restricted,
}

/// Capabilities baseline lets a container add (the runtime's defaults).
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
/// Volume sources restricted allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
/// Sysctls baseline allows.
const SAFE_SYSCTLS: [&str; 8] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
];
const SELINUX_TYPES: [&str; 5] = [
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Every container of the pod with its path.
fn containers(spec: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            out.push((format!("spec.{list}[{i}]"), c));
        }
    }
    out
}

fn upper(v: &Value) -> String {
    v.as_str()
        .unwrap_or("")
        .trim_start_matches("CAP_")
        .to_ascii_uppercase()
}

/// The controls of `level` that the pod spec `spec` breaks, as
/// "control: field" lines.
pub fn violations(spec: &Value, level: Level) -> Vec<String> {
    let mut v = Vec::new();
    let sc = &spec["securityContext"];
    // Baseline.
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[ns] == true {
            v.push(format!("host namespaces: spec.{ns} is true"));
        }
    }
    if sc["windowsOptions"]["hostProcess"] == true {
        v.push("host process: spec.securityContext.windowsOptions.hostProcess".into());
    }
    for (i, vol) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        if !vol["hostPath"].is_null() {
            v.push(format!(
                "hostPath volumes: spec.volumes[{i}] ({})",
                vol["name"]
            ));
        }
    }
    for (i, s) in sc["sysctls"].as_array().into_iter().flatten().enumerate() {
        let name = s["name"].as_str().unwrap_or("");
        if !SAFE_SYSCTLS.contains(&name) {
            v.push(format!("sysctls: spec.securityContext.sysctls[{i}] {name}"));
        }
    }
    let seccomp_unconfined = |sc: &Value| sc["seccompProfile"]["type"] == "Unconfined";
    let apparmor_unconfined = |sc: &Value| sc["appArmorProfile"]["type"] == "Unconfined";
    let selinux_bad = |sc: &Value| {
        let o = &sc["seLinuxOptions"];
        !o.is_null()
            && (!SELINUX_TYPES.contains(&o["type"].as_str().unwrap_or(""))
                || o["user"].as_str().is_some_and(|s| !s.is_empty())
                || o["role"].as_str().is_some_and(|s| !s.is_empty()))
    };
    if seccomp_unconfined(sc) {
        v.push("seccomp: spec.securityContext.seccompProfile is Unconfined".into());
    }
    if apparmor_unconfined(sc) {
        v.push("AppArmor: spec.securityContext.appArmorProfile is Unconfined".into());
    }
    if selinux_bad(sc) {
        v.push("SELinux: spec.securityContext.seLinuxOptions".into());
    }
    for (path, c) in containers(spec) {
        let csc = &c["securityContext"];
        if csc["privileged"] == true {
            v.push(format!("privileged: {path}.securityContext.privileged"));
        }
        if csc["windowsOptions"]["hostProcess"] == true {
            v.push(format!("host process: {path}"));
        }
        for add in csc["capabilities"]["add"].as_array().into_iter().flatten() {
            if !BASELINE_CAPABILITIES.contains(&upper(add).as_str()) {
                v.push(format!("capabilities: {path} adds {}", upper(add)));
            }
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["hostPort"].as_u64().unwrap_or(0) != 0 {
                v.push(format!("host ports: {path} hostPort {}", p["hostPort"]));
            }
        }
        if csc["procMount"].as_str().is_some_and(|m| m != "Default") {
            v.push(format!("/proc mount: {path}.securityContext.procMount"));
        }
        if seccomp_unconfined(csc) {
            v.push(format!(
                "seccomp: {path}.securityContext.seccompProfile is Unconfined"
            ));
        }
        if apparmor_unconfined(csc) {
            v.push(format!(
                "AppArmor: {path}.securityContext.appArmorProfile is Unconfined"
            ));
        }
        if selinux_bad(csc) {
            v.push(format!("SELinux: {path}.securityContext.seLinuxOptions"));
        }
    }
    if level == Level::Baseline {
        return v;
    }
    // Restricted.
    for (i, vol) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let kinds: Vec<&String> = vol
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys())
            .filter(|k| *k != "name")
            .collect();
        for k in kinds {
            if k != "hostPath" && !RESTRICTED_VOLUMES.contains(&k.as_str()) {
                v.push(format!("volume types: spec.volumes[{i}] is {k}"));
            }
        }
    }
    let pod_non_root = sc["runAsNonRoot"] == true;
    let pod_seccomp_ok = matches!(
        sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault" | "Localhost")
    );
    if sc["runAsUser"] == 0 {
        v.push("running as non-root user: spec.securityContext.runAsUser is 0".into());
    }
    for (path, c) in containers(spec) {
        let csc = &c["securityContext"];
        if csc["allowPrivilegeEscalation"] != false {
            v.push(format!(
                "privilege escalation: {path}.securityContext.allowPrivilegeEscalation is not false"
            ));
        }
        let non_root = match &csc["runAsNonRoot"] {
            Value::Bool(b) => *b,
            _ => pod_non_root,
        };
        if !non_root {
            v.push(format!(
                "running as non-root: {path} may run as root (runAsNonRoot not true)"
            ));
        }
        if csc["runAsUser"] == 0 {
            v.push(format!(
                "running as non-root user: {path}.securityContext.runAsUser is 0"
            ));
        }
        let seccomp_ok = match csc["seccompProfile"]["type"].as_str() {
            Some(t) => t == "RuntimeDefault" || t == "Localhost",
            None => pod_seccomp_ok,
        };
        if !seccomp_ok {
            v.push(format!(
                "seccomp: {path} has no RuntimeDefault or Localhost profile"
            ));
        }
        let caps = &csc["capabilities"];
        let drops_all = caps["drop"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| upper(d) == "ALL");
        if !drops_all {
            v.push(format!("capabilities: {path} does not drop ALL"));
        }
        for add in caps["add"].as_array().into_iter().flatten() {
            if upper(add) != "NET_BIND_SERVICE" {
                v.push(format!(
                    "capabilities: {path} adds {} (restricted allows NET_BIND_SERVICE only)",
                    upper(add)
                ));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hardened() -> Value {
        json!({
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
            "volumes": [{"name": "tls", "secret": {"secretName": "s"}}]
        })
    }

    #[test]
    fn a_hardened_pod_meets_restricted() {
        assert_eq!(
            violations(&hardened(), Level::Restricted),
            Vec::<String>::new()
        );
    }

    /// A change to a pod spec.
    type Edit = Box<dyn Fn(&mut Value)>;

    /// Each change breaks exactly the control that forbids it.
    #[test]
    fn each_control_names_its_field() {
        let cases: Vec<(&str, Level, Edit)> = vec![
            (
                "host namespaces: spec.hostNetwork",
                Level::Baseline,
                Box::new(|p| p["hostNetwork"] = true.into()),
            ),
            (
                "hostPath volumes: spec.volumes[1]",
                Level::Baseline,
                Box::new(|p| {
                    p["volumes"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "h", "hostPath": {"path": "/"}}))
                }),
            ),
            (
                "capabilities: spec.containers[0] adds BPF",
                Level::Baseline,
                Box::new(|p| {
                    p["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["BPF"])
                }),
            ),
            (
                "privileged: spec.containers[0]",
                Level::Baseline,
                Box::new(|p| p["containers"][0]["securityContext"]["privileged"] = true.into()),
            ),
            (
                "seccomp: spec.securityContext.seccompProfile is Unconfined",
                Level::Baseline,
                Box::new(|p| p["securityContext"]["seccompProfile"]["type"] = "Unconfined".into()),
            ),
            (
                "host ports: spec.containers[0]",
                Level::Baseline,
                Box::new(|p| {
                    p["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}])
                }),
            ),
            (
                "sysctls: spec.securityContext.sysctls[0] net.ipv4.ip_forward",
                Level::Baseline,
                Box::new(|p| {
                    p["securityContext"]["sysctls"] =
                        json!([{"name": "net.ipv4.ip_forward", "value": "1"}])
                }),
            ),
            (
                "privilege escalation: spec.containers[0]",
                Level::Restricted,
                Box::new(|p| {
                    p["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = Value::Null
                }),
            ),
            (
                "running as non-root: spec.containers[0]",
                Level::Restricted,
                Box::new(|p| p["securityContext"]["runAsNonRoot"] = Value::Null),
            ),
            (
                "running as non-root user: spec.containers[0]",
                Level::Restricted,
                Box::new(|p| p["containers"][0]["securityContext"]["runAsUser"] = 0.into()),
            ),
            (
                "seccomp: spec.containers[0] has no",
                Level::Restricted,
                Box::new(|p| p["securityContext"]["seccompProfile"] = Value::Null),
            ),
            (
                "capabilities: spec.containers[0] does not drop ALL",
                Level::Restricted,
                Box::new(|p| {
                    p["containers"][0]["securityContext"]["capabilities"]["drop"] = json!([])
                }),
            ),
            (
                "capabilities: spec.containers[0] adds CHOWN",
                Level::Restricted,
                Box::new(|p| {
                    p["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["CHOWN"])
                }),
            ),
            (
                "volume types: spec.volumes[1] is nfs",
                Level::Restricted,
                Box::new(|p| {
                    p["volumes"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "n", "nfs": {}}))
                }),
            ),
            (
                "running as non-root: spec.initContainers[0]",
                Level::Restricted,
                Box::new(
                    |p| p["initContainers"] = json!([{"name": "i", "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": false, "capabilities": {"drop": ["ALL"]}}}]),
                ),
            ),
        ];
        for (want, level, change) in cases {
            let mut pod = hardened();
            change(&mut pod);
            let found = violations(&pod, level);
            assert!(
                found.len() == 1 && found[0].starts_with(want),
                "{want}: {found:?}"
            );
            if level == Level::Restricted {
                assert!(
                    violations(&pod, Level::Baseline).is_empty(),
                    "{want} is restricted only"
                );
            }
        }
    }

    #[test]
    fn container_settings_override_the_pods() {
        let mut pod = hardened();
        pod["securityContext"] = json!({});
        pod["containers"][0]["securityContext"]["runAsNonRoot"] = true.into();
        pod["containers"][0]["securityContext"]["seccompProfile"] =
            json!({"type": "Localhost", "localhostProfile": "p.json"});
        assert_eq!(violations(&pod, Level::Restricted), Vec::<String>::new());
    }
}
