//! A CRI client over a runtime's unix socket, with the calls a kubelet makes
//! to start and stop pod sandboxes, and the reading of what containerd
//! reports about a sandbox (its netns, its CNI result).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint};

/// The generated CRI messages and clients (`proto/runtime/v1/cri.proto`).
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("runtime.v1");
}

use pb::image_service_client::ImageServiceClient;
use pb::runtime_service_client::RuntimeServiceClient;

/// The CRI version the lab speaks (containerd 1.6 serves v1 and v1alpha2).
pub const CRI_VERSION: &str = "v1";

#[derive(Clone)]
pub struct CriClient {
    socket: PathBuf,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

/// What a runtime reports about one ready sandbox.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub id: String,
    pub ips: Vec<std::net::IpAddr>,
    /// The sandbox's network namespace, as the runtime made it.
    pub netns_path: PathBuf,
    /// containerd's view of the CNI result (its `cniResult`).
    pub cni_result: Value,
    /// Interfaces of the result without a sandbox: the host side.
    pub host_interfaces: Vec<String>,
    /// The pid of the sandbox's init (the pause process).
    pub pid: Option<u32>,
}

impl CriClient {
    /// A client whose every call is bounded by `timeout` (a RunPodSandbox
    /// includes the whole CNI ADD, so it must exceed the chain's own bound).
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self> {
        let path = socket.to_path_buf();
        // The URI is required by the API but unused: the connector dials the socket.
        let channel = Endpoint::try_from("http://[::]:50051")?
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(3))
            .connect_with_connector(tower::service_fn(move |_| {
                let p = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
                }
            }))
            .await
            .with_context(|| format!("connecting to the CRI socket {}", socket.display()))?;
        Ok(Self {
            socket: socket.to_path_buf(),
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    pub async fn version(&self) -> Result<pb::VersionResponse> {
        Ok(self
            .runtime
            .clone()
            .version(pb::VersionRequest {
                version: CRI_VERSION.into(),
            })
            .await
            .with_context(|| format!("CRI Version on {}", self.socket.display()))?
            .into_inner())
    }

    /// Whether the runtime's image store holds `reference`.
    pub async fn has_image(&self, reference: &str) -> Result<bool> {
        let resp = self
            .images
            .clone()
            .image_status(pb::ImageStatusRequest {
                image: Some(pb::ImageSpec {
                    image: reference.into(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .with_context(|| format!("CRI ImageStatus of {reference}"))?
            .into_inner();
        Ok(resp.image.is_some())
    }

    /// RunPodSandbox: the runtime makes the netns, runs the CNI chain and
    /// starts the pause container. The error is the runtime's status, so
    /// the caller can tell a CNI failure from anything else.
    pub async fn run_sandbox(&self, config: pb::PodSandboxConfig) -> Result<String, tonic::Status> {
        Ok(self
            .runtime
            .clone()
            .run_pod_sandbox(pb::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id)
    }

    /// PodSandboxStatus (verbose), read into what the lab needs.
    pub async fn sandbox_info(&self, id: &str) -> Result<SandboxInfo> {
        let resp = self
            .runtime
            .clone()
            .pod_sandbox_status(pb::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            })
            .await
            .with_context(|| format!("CRI PodSandboxStatus of sandbox {id}"))?
            .into_inner();
        let status = resp
            .status
            .ok_or_else(|| anyhow!("PodSandboxStatus of {id}: no status"))?;
        let info = resp.info.get("info").ok_or_else(|| {
            anyhow!("PodSandboxStatus of {id}: no verbose info (is this containerd?)")
        })?;
        read_info(id, status.network.as_ref(), info)
    }

    /// StopPodSandbox: the runtime runs CNI DEL and stops the pause
    /// container. Idempotent, as the CRI requires.
    pub async fn stop_sandbox(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .stop_pod_sandbox(pb::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .with_context(|| format!("CRI StopPodSandbox of sandbox {id}"))?;
        Ok(())
    }

    /// RemovePodSandbox (after a stop, as the kubelet does).
    pub async fn remove_sandbox(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .remove_pod_sandbox(pb::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .with_context(|| format!("CRI RemovePodSandbox of sandbox {id}"))?;
        Ok(())
    }

    /// The sandboxes whose labels include all of `labels`.
    pub async fn list_sandboxes(&self, labels: &[(&str, &str)]) -> Result<Vec<pb::PodSandbox>> {
        let filter = pb::PodSandboxFilter {
            label_selector: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        Ok(self
            .runtime
            .clone()
            .list_pod_sandbox(pb::ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await
            .context("CRI ListPodSandbox")?
            .into_inner()
            .items)
    }
}

/// Reads containerd's verbose sandbox info (a JSON document: `pid`,
/// `runtimeSpec`, `cniResult`...).
fn read_info(
    id: &str,
    network: Option<&pb::PodSandboxNetworkStatus>,
    info: &str,
) -> Result<SandboxInfo> {
    let info: Value = serde_json::from_str(info)
        .with_context(|| format!("sandbox {id}: the runtime's info is not JSON"))?;
    let netns_path = info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .and_then(|list| list.iter().find(|n| n["type"] == "network"))
        .and_then(|n| n["path"].as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("sandbox {id}: its runtime spec names no network namespace path"))?;
    let mut ips = Vec::new();
    if let Some(net) = network {
        for ip in std::iter::once(net.ip.as_str())
            .chain(net.additional_ips.iter().map(|p| p.ip.as_str()))
            .filter(|ip| !ip.is_empty())
        {
            ips.push(
                ip.parse()
                    .with_context(|| format!("sandbox {id}: address {ip:?}"))?,
            );
        }
    }
    if ips.is_empty() {
        bail!("sandbox {id}: the runtime reports no pod address");
    }
    let cni_result = info["cniResult"].clone();
    let mut host_interfaces: Vec<String> = cni_result["Interfaces"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, i)| i["Sandbox"].as_str().unwrap_or("").is_empty())
                .map(|(name, _)| name.clone())
                .collect()
        })
        .unwrap_or_default();
    host_interfaces.sort();
    Ok(SandboxInfo {
        id: id.to_string(),
        ips,
        netns_path,
        cni_result,
        host_interfaces,
        pid: info["pid"].as_u64().map(|p| p as u32),
    })
}

/// The CNI plugin and command a runtime's error names, from libcni's
/// wording (`plugin type="palisade-cni" name="..." failed (add): ...`):
/// tells a refusal by palisade-cni from a failure of the chain before it.
pub fn failed_plugin(message: &str) -> Option<(String, String)> {
    let rest = &message[message.find("plugin type=\"")? + "plugin type=\"".len()..];
    let (kind, rest) = rest.split_once('"')?;
    let rest = &rest[rest.find("failed (")? + "failed (".len()..];
    let (command, _) = rest.split_once(')')?;
    Some((kind.to_string(), command.to_uppercase()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_plugin_a_runtime_error_blames() {
        let msg = r#"failed to setup network for sandbox "0f3a": plugin type="palisade-cni" name="palisade-lab" failed (add): palisade-cni: the enforcer refused pod x/d: policy not known by the deadline"#;
        assert_eq!(
            failed_plugin(msg),
            Some(("palisade-cni".to_string(), "ADD".to_string()))
        );
        let msg = r#"failed to destroy network for sandbox "0f3a": plugin type="ptp" name="palisade-lab" failed (delete): boom"#;
        assert_eq!(
            failed_plugin(msg),
            Some(("ptp".to_string(), "DELETE".to_string()))
        );
        assert_eq!(failed_plugin("failed to create containerd task: EOF"), None);
        assert_eq!(failed_plugin(r#"plugin type="ptp"#), None);
    }

    fn info(path: &str) -> String {
        json!({
            "pid": 4242,
            "runtimeSpec": {"linux": {"namespaces": [
                {"type": "pid"},
                {"type": "network", "path": path},
            ]}},
            "cniResult": {"Interfaces": {
                "eth0": {"IPConfigs": [{"IP": "10.244.0.5"}], "Sandbox": path},
                "lo": {"IPConfigs": [{"IP": "127.0.0.1"}], "Sandbox": path},
                "veth1234": {"IPConfigs": null, "Sandbox": ""},
            }},
        })
        .to_string()
    }

    #[test]
    fn reads_containerds_sandbox_info() {
        let net = pb::PodSandboxNetworkStatus {
            ip: "10.244.0.5".into(),
            additional_ips: vec![pb::PodIp {
                ip: "fd00::5".into(),
            }],
        };
        let got = read_info("s1", Some(&net), &info("/var/run/netns/cni-1")).unwrap();
        assert_eq!(got.netns_path, PathBuf::from("/var/run/netns/cni-1"));
        assert_eq!(
            got.ips,
            [
                "10.244.0.5".parse::<std::net::IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(got.host_interfaces, ["veth1234"]);
        assert_eq!(got.pid, Some(4242));
    }

    #[test]
    fn refuses_sandbox_info_without_netns_or_address() {
        let net = pb::PodSandboxNetworkStatus {
            ip: "10.244.0.5".into(),
            additional_ips: vec![],
        };
        let e = read_info("s1", Some(&net), &info("")).unwrap_err();
        assert!(format!("{e:#}").contains("no network namespace"), "{e:#}");
        let e = read_info("s1", None, &info("/var/run/netns/cni-1")).unwrap_err();
        assert!(format!("{e:#}").contains("no pod address"), "{e:#}");
        assert!(read_info("s1", Some(&net), "not json").is_err());
    }
}
