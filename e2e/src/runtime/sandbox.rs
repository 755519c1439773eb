//! The PodSandboxConfig of a pod, filled in the way the kubelet fills it
//! (pkg/kubelet/kuberuntime: metadata, hostname, log directory, DNS, port
//! mappings, labels and annotations, cgroup parent, namespaces, sysctls).
//! Pure: the pod's body in, the CRI message out.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use super::cri::pb;
use crate::scenario::PodName;

/// The labels the kubelet adds to every sandbox, by which it (and the lab)
/// finds a pod's sandboxes again.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// The lab's cluster domain, for the DNS search path.
const CLUSTER_DOMAIN: &str = "cluster.local";
/// Longest hostname the kubelet gives a pod.
const HOSTNAME_MAX: usize = 63;

/// One pod's sandbox request.
pub struct SandboxRequest<'a> {
    pub pod: &'a PodName,
    pub uid: &'a str,
    /// 0 for a pod's first sandbox, one more for each recreation.
    pub attempt: u32,
    /// The Pod object as the lab holds it.
    pub body: &'a Value,
    /// Where pod log directories go (the kubelet's /var/log/pods).
    pub log_root: &'a Path,
    /// The cgroup every pod of the lab sits under (the kubelet's /kubepods).
    pub cgroup_root: &'a str,
}

/// The directory the kubelet gives a pod's logs: `<root>/<ns>_<name>_<uid>`.
pub fn log_directory(log_root: &Path, pod: &PodName, uid: &str) -> std::path::PathBuf {
    log_root.join(format!("{}_{}_{uid}", pod.namespace, pod.name))
}

/// The pod's cgroup (cgroupfs driver): `<root>/pod<uid>`.
pub fn cgroup_parent(cgroup_root: &str, uid: &str) -> String {
    format!("{cgroup_root}/pod{uid}")
}

pub fn config(r: &SandboxRequest) -> Result<pb::PodSandboxConfig> {
    let meta = &r.body["metadata"];
    let spec = &r.body["spec"];
    let mut labels = string_map(&meta["labels"], "metadata.labels")?;
    labels.insert(POD_NAME_LABEL.into(), r.pod.name.clone());
    labels.insert(POD_NAMESPACE_LABEL.into(), r.pod.namespace.clone());
    labels.insert(POD_UID_LABEL.into(), r.uid.into());
    let mut annotations = string_map(&meta["annotations"], "metadata.annotations")?;
    // The kubelet marks pods it got from the API server so.
    annotations
        .entry("kubernetes.io/config.source".into())
        .or_insert_with(|| "api".into());
    let hostname = match spec.get("hostname") {
        None => r.pod.name.clone(),
        Some(Value::String(h)) => h.clone(),
        Some(other) => bail!(
            "pod {}: spec.hostname: expected a string, got {other}",
            r.pod
        ),
    };
    let share_pid = spec["shareProcessNamespace"].as_bool().unwrap_or(false);
    Ok(pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: r.pod.name.clone(),
            uid: r.uid.into(),
            namespace: r.pod.namespace.clone(),
            attempt: r.attempt,
        }),
        hostname: truncate_hostname(&hostname),
        log_directory: log_directory(r.log_root, r.pod, r.uid)
            .display()
            .to_string(),
        // ClusterFirst without a cluster DNS Service in the lab: the search
        // path and ndots the kubelet writes, no name server.
        dns_config: Some(pb::DnsConfig {
            servers: Vec::new(),
            searches: vec![
                format!("{}.svc.{CLUSTER_DOMAIN}", r.pod.namespace),
                format!("svc.{CLUSTER_DOMAIN}"),
                CLUSTER_DOMAIN.into(),
            ],
            options: vec!["ndots:5".into()],
        }),
        port_mappings: port_mappings(spec).map_err(|e| anyhow!("pod {}: {e}", r.pod))?,
        labels,
        annotations,
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(r.cgroup_root, r.uid),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    network: pb::NamespaceMode::Pod as i32,
                    pid: if share_pid {
                        pb::NamespaceMode::Pod
                    } else {
                        pb::NamespaceMode::Container
                    } as i32,
                    ipc: pb::NamespaceMode::Pod as i32,
                }),
                readonly_rootfs: false,
                privileged: false,
                // The kubelet's default without SeccompDefault.
                seccomp: Some(pb::SecurityProfile {
                    profile_type: pb::security_profile::ProfileType::Unconfined as i32,
                    localhost_ref: String::new(),
                }),
            }),
            sysctls: sysctls(spec).map_err(|e| anyhow!("pod {}: {e}", r.pod))?,
        }),
    })
}

fn string_map(v: &Value, field: &str) -> Result<HashMap<String, String>> {
    match v {
        Value::Null => Ok(HashMap::new()),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => bail!("{field}.{k}: expected a string, got {other}"),
            })
            .collect(),
        other => bail!("{field}: expected a mapping, got {other}"),
    }
}

/// At most 63 bytes, not ending in '-' or '.' (the kubelet's rule).
fn truncate_hostname(name: &str) -> String {
    let mut h: String = name.chars().take(HOSTNAME_MAX).collect();
    while h.ends_with('-') || h.ends_with('.') {
        h.pop();
    }
    h
}

/// A mapping for every container port with a `hostPort`, as the kubelet
/// passes them (the runtime's portmap plugin would install them).
fn port_mappings(spec: &Value) -> Result<Vec<pb::PortMapping>> {
    let mut out = Vec::new();
    for (ci, c) in spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (pi, p) in c["ports"].as_array().into_iter().flatten().enumerate() {
            let Some(host_port) = p.get("hostPort") else {
                continue;
            };
            let at = format!("spec.containers[{ci}].ports[{pi}]");
            let host_port = host_port
                .as_i64()
                .filter(|n| (1..=65535).contains(n))
                .ok_or_else(|| anyhow!("{at}.hostPort: {host_port} is not a port (1-65535)"))?;
            let protocol = match p["protocol"].as_str().unwrap_or("TCP") {
                "TCP" => pb::Protocol::Tcp,
                "UDP" => pb::Protocol::Udp,
                "SCTP" => pb::Protocol::Sctp,
                other => bail!("{at}.protocol: expected TCP, UDP or SCTP, got {other:?}"),
            };
            out.push(pb::PortMapping {
                protocol: protocol as i32,
                container_port: p["containerPort"].as_i64().unwrap_or(0) as i32,
                host_port: host_port as i32,
                host_ip: p["hostIP"].as_str().unwrap_or("").into(),
            });
        }
    }
    Ok(out)
}

/// `spec.securityContext.sysctls` ([{name, value}]).
fn sysctls(spec: &Value) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    let list = &spec["securityContext"]["sysctls"];
    if list.is_null() {
        return Ok(out);
    }
    let list = list
        .as_array()
        .ok_or_else(|| anyhow!("spec.securityContext.sysctls: expected a list"))?;
    for (i, s) in list.iter().enumerate() {
        let at = format!("spec.securityContext.sysctls[{i}]");
        let name = s["name"]
            .as_str()
            .ok_or_else(|| anyhow!("{at}.name: missing or not a string"))?;
        let value = s["value"]
            .as_str()
            .ok_or_else(|| anyhow!("{at}.value: missing or not a string"))?;
        out.insert(name.to_string(), value.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request<'a>(pod: &'a PodName, body: &'a Value) -> SandboxRequest<'a> {
        SandboxRequest {
            pod,
            uid: "0c1d",
            attempt: 2,
            body,
            log_root: Path::new("/run/lab/pods"),
            cgroup_root: "/palisade-lab-abc123",
        }
    }

    #[test]
    fn fills_the_sandbox_as_the_kubelet_does() {
        let pod = PodName::parse("x/a").unwrap();
        let body = json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"},
                         "annotations": {"note": "n"}},
            "spec": {"containers": [{"name": "c", "ports": [
                {"containerPort": 80},
                {"containerPort": 53, "protocol": "UDP", "hostPort": 5353},
            ]}], "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]}},
        });
        let c = config(&request(&pod, &body)).unwrap();
        let m = c.metadata.as_ref().unwrap();
        assert_eq!(
            (
                m.name.as_str(),
                m.namespace.as_str(),
                m.uid.as_str(),
                m.attempt
            ),
            ("a", "x", "0c1d", 2)
        );
        assert_eq!(c.hostname, "a");
        assert_eq!(c.log_directory, "/run/lab/pods/x_a_0c1d");
        assert_eq!(c.labels["app"], "a");
        assert_eq!(c.labels[POD_NAME_LABEL], "a");
        assert_eq!(c.labels[POD_NAMESPACE_LABEL], "x");
        assert_eq!(c.labels[POD_UID_LABEL], "0c1d");
        assert_eq!(c.annotations["note"], "n");
        assert_eq!(c.annotations["kubernetes.io/config.source"], "api");
        assert_eq!(
            c.dns_config.as_ref().unwrap().searches[0],
            "x.svc.cluster.local"
        );
        assert_eq!(c.port_mappings.len(), 1);
        assert_eq!(c.port_mappings[0].host_port, 5353);
        assert_eq!(c.port_mappings[0].protocol, pb::Protocol::Udp as i32);
        let linux = c.linux.as_ref().unwrap();
        assert_eq!(linux.cgroup_parent, "/palisade-lab-abc123/pod0c1d");
        assert_eq!(linux.sysctls["net.ipv4.ip_unprivileged_port_start"], "0");
        let ns = linux
            .security_context
            .as_ref()
            .unwrap()
            .namespace_options
            .as_ref()
            .unwrap();
        assert_eq!(ns.network, pb::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, pb::NamespaceMode::Container as i32);
    }

    #[test]
    fn names_the_field_of_bad_input() {
        let pod = PodName::parse("x/a").unwrap();
        let body = json!({"metadata": {"labels": {"n": 1}}, "spec": {}});
        let e = config(&request(&pod, &body)).unwrap_err();
        assert!(format!("{e:#}").contains("metadata.labels.n"), "{e:#}");
        let body = json!({"metadata": {}, "spec": {"containers": [{"ports": [{"containerPort": 80, "hostPort": 0}]}]}});
        let e = config(&request(&pod, &body)).unwrap_err();
        assert!(
            format!("{e:#}").contains("pod x/a: spec.containers[0].ports[0].hostPort"),
            "{e:#}"
        );
    }

    #[test]
    fn hostnames_are_cut_as_the_kubelet_cuts_them() {
        let long = format!("{}-x", "a".repeat(62));
        assert_eq!(truncate_hostname(&long), "a".repeat(62));
        assert_eq!(truncate_hostname("web"), "web");
    }
}
