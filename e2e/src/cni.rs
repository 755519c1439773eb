//! Runs a CNI plugin chain the way a container runtime (libcni) does: each
//! plugin is executed with the CNI_* environment and its config on stdin,
//! ADD in order with the previous plugin's result as `prevResult`, DEL in
//! reverse order with the cached final result.
//!
//! Plugins run inside the node's network namespace: that is the "host" side
//! where ptp leaves the host end of each pod's veth.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::cancel::Cancel;
use crate::netns::NetNs;
use crate::process::run_with_input;
use crate::scenario::{CniKind, PodName};

pub const NETWORK_NAME: &str = "palisade-lab";
pub const CNI_VERSION: &str = "1.0.0";
pub const IFNAME: &str = "eth0";

/// The lab's chain: ptp (or bridge, on device `bridge`) with host-local
/// IPAM, then (unless `enforcer_socket` is `None`) palisade-cni. With
/// `subnet6` every pod also gets an IPv6 address from it (dual stack, IPv4
/// first).
pub fn lab_chain(
    ipam_dir: &Path,
    subnet: &str,
    subnet6: Option<&str>,
    kind: CniKind,
    bridge: &str,
    enforcer_socket: Option<&Path>,
) -> Vec<Value> {
    let ipam = match subnet6 {
        None => json!({
            "type": "host-local",
            "subnet": subnet,
            "dataDir": ipam_dir,
            // A default route lets probes reach addresses outside the pod
            // subnet (ipBlock scenarios) through the node.
            "routes": [{"dst": "0.0.0.0/0"}],
        }),
        Some(subnet6) => json!({
            "type": "host-local",
            "ranges": [[{"subnet": subnet}], [{"subnet": subnet6}]],
            "dataDir": ipam_dir,
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        }),
    };
    let mut chain = vec![match kind {
        CniKind::Ptp => json!({"type": "ptp", "ipMasq": false, "ipam": ipam}),
        // The bridge's result lists the bridge and the host veth, both
        // without a sandbox: the case that tells whether palisade-cni finds
        // the pod's own veth.
        CniKind::Bridge => json!({
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "ipam": ipam,
        }),
    }];
    if let Some(sock) = enforcer_socket {
        chain.push(json!({"type": "palisade-cni", "enforcerSocket": sock}));
    }
    chain
}

pub struct CniChain {
    /// Directories searched for plugin binaries, also passed as CNI_PATH.
    pub plugin_dirs: Vec<PathBuf>,
    pub plugins: Vec<Value>,
    pub timeout: Duration,
    /// Every invocation, with its stdin, stdout and stderr, is appended here.
    pub log: PathBuf,
}

/// What the runtime knows about one pod sandbox.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub pod: PodName,
    pub container_id: String,
    pub netns: PathBuf,
}

/// How long one ADD took: the last plugin, and those before it together.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddTimes {
    pub last: Duration,
    pub before_last: Duration,
}

/// The outcome of a successful ADD.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The final result of the chain, kept for DEL like libcni's cache.
    pub result: Value,
    pub ips: Vec<IpAddr>,
    pub host_interfaces: Vec<String>,
}

impl CniChain {
    pub fn add(&self, node: &NetNs, sandbox: &Sandbox, cancel: &Cancel) -> Result<Attachment> {
        self.add_timed(node, sandbox, cancel).map(|(a, _)| a)
    }

    /// ADD, also returning how long the last plugin (palisade-cni in the
    /// lab) took from exec to its reply, and the plugins before it (ptp with
    /// its IPAM, say) together: the chain's own cost beside Palisade's.
    pub fn add_timed(
        &self,
        node: &NetNs,
        sandbox: &Sandbox,
        cancel: &Cancel,
    ) -> Result<(Attachment, AddTimes)> {
        let mut prev: Option<Value> = None;
        let mut times = AddTimes::default();
        for (i, plugin) in self.plugins.iter().enumerate() {
            let started = Instant::now();
            let outcome = self.invoke("ADD", plugin, prev.as_ref(), node, sandbox, cancel);
            times.before_last += std::mem::replace(&mut times.last, started.elapsed());
            match outcome {
                Ok(result) => prev = Some(result),
                Err(e) => {
                    // A runtime answers a failed ADD with a DEL of the whole
                    // chain, so nothing the earlier plugins made is left.
                    for p in self.plugins[..=i].iter().rev() {
                        let _ = self.invoke("DEL", p, prev.as_ref(), node, sandbox, &Cancel::new());
                    }
                    return Err(e).with_context(|| format!("CNI ADD of pod {}", sandbox.pod));
                }
            }
        }
        let result = prev.ok_or_else(|| anyhow!("the CNI chain is empty"))?;
        let ips = result_ips(&result).with_context(|| format!("CNI ADD of pod {}", sandbox.pod))?;
        let host_interfaces = result_host_interfaces(&result);
        Ok((
            Attachment {
                result,
                ips,
                host_interfaces,
            },
            times,
        ))
    }

    /// Runs DEL through the whole chain even when a plugin fails, so one
    /// broken plugin cannot leak what the others own; reports every failure.
    pub fn del(&self, node: &NetNs, sandbox: &Sandbox, cached: Option<&Value>) -> Result<()> {
        let errors: Vec<String> = self
            .plugins
            .iter()
            .rev()
            .filter_map(|p| {
                self.invoke("DEL", p, cached, node, sandbox, &Cancel::new())
                    .err()
                    .map(|e| format!("{e:#}"))
            })
            .collect();
        if !errors.is_empty() {
            bail!("CNI DEL of pod {}: {}", sandbox.pod, errors.join("; "));
        }
        Ok(())
    }

    fn invoke(
        &self,
        command: &str,
        plugin: &Value,
        prev: Option<&Value>,
        node: &NetNs,
        sandbox: &Sandbox,
        cancel: &Cancel,
    ) -> Result<Value> {
        let kind = plugin
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("CNI plugin config without a type: {plugin}"))?;
        let binary = self.find(kind)?;
        let mut conf = plugin.clone();
        conf["name"] = NETWORK_NAME.into();
        conf["cniVersion"] = CNI_VERSION.into();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        let stdin = serde_json::to_vec(&conf)?;
        let cni_path = std::env::join_paths(&self.plugin_dirs)?;
        let mut cmd = Command::new(&binary);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &sandbox.container_id)
            .env("CNI_NETNS", &sandbox.netns)
            .env("CNI_IFNAME", IFNAME)
            .env("CNI_PATH", cni_path)
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
                    sandbox.pod.namespace, sandbox.pod.name, sandbox.container_id
                ),
            );
        if let Some(level) = std::env::var_os("RUST_LOG") {
            cmd.env("RUST_LOG", level);
        }
        let done = run_with_input(cmd, Some(node), &stdin, self.timeout, cancel)
            .with_context(|| format!("{kind} {command}"))?;
        let stdout = String::from_utf8_lossy(&done.stdout);
        let stderr = String::from_utf8_lossy(&done.stderr);
        self.record(
            command,
            kind,
            sandbox,
            &stdin,
            &done.status,
            &stdout,
            &stderr,
        );
        if !done.status.success() {
            bail!(
                "{kind} {command} failed ({}): {}{}",
                done.status,
                cni_error(&stdout),
                if stderr.trim().is_empty() {
                    String::new()
                } else {
                    format!("; stderr: {}", stderr.trim())
                }
            );
        }
        if command == "DEL" {
            return Ok(Value::Null);
        }
        serde_json::from_str(&stdout)
            .with_context(|| format!("{kind} {command} printed no JSON result: {stdout:?}"))
    }

    fn find(&self, kind: &str) -> Result<PathBuf> {
        // The type is a file name, never a path, as in libcni.
        if kind.contains('/') {
            bail!("CNI plugin type {kind:?} must be a plain name");
        }
        self.plugin_dirs
            .iter()
            .map(|d| d.join(kind))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                anyhow!(
                    "CNI plugin {kind} not found in {}",
                    self.plugin_dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                )
            })
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        command: &str,
        kind: &str,
        sandbox: &Sandbox,
        stdin: &[u8],
        status: &std::process::ExitStatus,
        stdout: &str,
        stderr: &str,
    ) {
        let Ok(mut f) = OpenOptions::new().create(true).append(true).open(&self.log) else {
            return;
        };
        // One line per stream keeps the log's tail readable in reports.
        let compact = |s: &str| match serde_json::from_str::<Value>(s) {
            Ok(v) => v.to_string(),
            Err(_) => s.trim_end().replace('\n', "\n    "),
        };
        let _ = writeln!(
            f,
            "{command} {kind} pod={} container={} ({status})\n  stdin:  {}\n  stdout: {}",
            sandbox.pod,
            sandbox.container_id,
            String::from_utf8_lossy(stdin),
            compact(stdout),
        );
        if !stderr.trim().is_empty() {
            let _ = writeln!(f, "  stderr: {}", compact(stderr));
        }
    }
}

/// The CNI error object a plugin prints on failure, or the raw output.
fn cni_error(stdout: &str) -> String {
    match serde_json::from_str::<Value>(stdout) {
        Ok(v) if v.get("code").is_some() || v.get("msg").is_some() => v.to_string(),
        _ if stdout.trim().is_empty() => "no output".to_string(),
        _ => format!("output {:?}", stdout.trim()),
    }
}

fn result_ips(result: &Value) -> Result<Vec<IpAddr>> {
    let ips = result
        .get("ips")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("the CNI result has no ips: {result}"))?;
    ips.iter()
        .map(|ip| {
            let cidr = ip
                .get("address")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("CNI result ip without address: {ip}"))?;
            let addr = cidr.split('/').next().unwrap_or(cidr);
            addr.parse()
                .with_context(|| format!("CNI result address {cidr:?}"))
        })
        .collect::<Result<Vec<_>>>()
        .and_then(|v| {
            if v.is_empty() {
                bail!("the CNI result has no ips: {result}")
            }
            Ok(v)
        })
}

/// Host-side interfaces are the ones without a sandbox.
fn result_host_interfaces(result: &Value) -> Vec<String> {
    result
        .get("interfaces")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter(|i| {
                    i.get("sandbox")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .is_empty()
                })
                .filter_map(|i| i.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_ptp_result() {
        let r = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:00", "sandbox": "/run/netns/x"}
            ],
            "ips": [{"interface": 1, "address": "10.244.0.5/24", "gateway": "10.244.0.1"}]
        });
        assert_eq!(
            result_ips(&r).unwrap(),
            ["10.244.0.5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(result_host_interfaces(&r), ["veth1234"]);
        assert!(result_ips(&json!({"ips": []})).is_err());
    }

    #[test]
    fn shows_the_cni_error_object() {
        assert_eq!(
            cni_error(r#"{"code":7,"msg":"boom"}"#),
            r#"{"code":7,"msg":"boom"}"#
        );
        assert_eq!(cni_error(""), "no output");
    }
}
