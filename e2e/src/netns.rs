//! Named network namespaces (`/run/netns/NAME`), the node's and every pod's.
//!
//! Creation and deletion go through `ip netns`, which handles the bind mount
//! and its propagation. Code that must run inside a namespace runs on a
//! short-lived thread that joined it with `setns`: only that thread moves, and
//! sockets it creates stay in that namespace for their whole life.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use nix::sched::{setns, CloneFlags};

pub const NETNS_DIR: &str = "/run/netns";

#[derive(Debug)]
pub struct NetNs {
    name: String,
    path: PathBuf,
}

impl NetNs {
    /// Creates the namespace with `lo` up.
    pub fn create(name: &str) -> Result<Self> {
        if Self::exists(name) {
            bail!("network namespace {name} already exists");
        }
        run_ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_string(),
            path: Path::new(NETNS_DIR).join(name),
        };
        // The caller only gets the handle on success, so undo here.
        if let Err(e) = run_ip(&["-n", name, "link", "set", "lo", "up"]) {
            let _ = ns.delete();
            return Err(e);
        }
        Ok(ns)
    }

    /// A handle on a namespace made earlier (possibly by another process).
    pub fn from_existing(name: &str) -> Self {
        Self {
            name: name.to_string(),
            path: Path::new(NETNS_DIR).join(name),
        }
    }

    pub fn exists(name: &str) -> bool {
        Path::new(NETNS_DIR).join(name).exists()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn open(&self) -> Result<File> {
        File::open(&self.path)
            .with_context(|| format!("opening network namespace {}", self.path.display()))
    }

    /// Runs `f` on a thread inside this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        run_in(&self.path, f)
    }

    /// Writes a sysctl under /proc/sys/net as seen from inside the namespace.
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        self.run(|| std::fs::write(&path, value))?
            .with_context(|| format!("setting {key}={value} in netns {}", self.name))
    }

    /// Deletes the namespace. It is only freed once no process or socket
    /// holds it, so callers stop those first.
    pub fn delete(&self) -> Result<()> {
        if !self.path.exists() {
            return Ok(());
        }
        run_ip(&["netns", "del", &self.name])
    }
}

/// Runs `f` on a thread inside the network namespace at `path`.
pub fn run_in<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = File::open(path)
        .with_context(|| format!("opening network namespace {}", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering network namespace {}", path.display()))?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow!("thread in network namespace {} panicked", path.display()))?
    })
}

/// A TCP connection made from inside the network namespace at `path` (it
/// stays there).
pub fn connect_in(
    path: &Path,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> std::io::Result<std::net::TcpStream> {
    run_in(path, || {
        std::net::TcpStream::connect_timeout(&addr, timeout)
    })
    .map_err(|e| std::io::Error::other(format!("{e:#}")))?
}

fn run_ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Names of the links in a namespace (`None` = the caller's namespace).
pub fn link_names(ns: Option<&str>) -> Result<Vec<String>> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd
        .args(["-o", "link", "show"])
        .output()
        .context("running ip link show")?;
    if !out.status.success() {
        bail!(
            "ip link show failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect())
}

/// `ip -j link show` of a namespace, as JSON (one object per link).
pub fn links_json(ns: &str) -> Result<Vec<serde_json::Value>> {
    let out = Command::new("ip")
        .args(["-n", ns, "-j", "link", "show"])
        .output()
        .context("running ip -j link show")?;
    if !out.status.success() {
        bail!(
            "ip -n {ns} -j link show failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing ip -j link show")
}

/// The name of the interface in `host_ns` that is the veth peer of
/// `ifname` in `pod_ns`: the pod's host veth, whatever the CNI named it.
pub fn veth_peer(pod_ns: &str, ifname: &str, host_ns: &str) -> Result<String> {
    let pod_links = links_json(pod_ns)?;
    let peer_index = pod_links
        .iter()
        .find(|l| l["ifname"] == ifname)
        .and_then(|l| l["link_index"].as_u64())
        .ok_or_else(|| anyhow!("{ifname} in netns {pod_ns} is not a veth with a peer"))?;
    links_json(host_ns)?
        .iter()
        .find(|l| l["ifindex"].as_u64() == Some(peer_index))
        .and_then(|l| l["ifname"].as_str().map(str::to_string))
        .ok_or_else(|| anyhow!("no interface {peer_index} in netns {host_ns}"))
}

/// Deletes a link in a namespace.
pub fn delete_link(ns: &str, name: &str) -> Result<()> {
    run_ip(&["-n", ns, "link", "del", name])
}
