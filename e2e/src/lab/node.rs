//! The lab's nodes and the fabric between them.
//!
//! Each node is a network namespace with its own enforcer process, pin root,
//! state dir, CNI socket, CNI chain and host-local pod range. The fabric is
//! one more namespace holding a bridge that every node joins with a veth;
//! each node has a route to every other node's pod range through that
//! node's fabric address, so a packet between pods on two nodes is routed by
//! the kernel through both nodes (and both nodes' programs). The controller
//! runs in the fabric namespace and serves the enforcers over TCP there, as
//! a controller Service does in a cluster.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cni::{lab_chain, CniChain};
use crate::netns::NetNs;
use crate::preflight::BPFFS;
use crate::process::Daemon;
use crate::runtime::containerd::Containerd;

use super::LabConfig;

/// The fabric's addresses: node K (1-based) is `10.250.0.K`, the controller
/// is `.254`. Outside the pod ranges and the usual Service ranges.
const FABRIC_PREFIX: [u8; 3] = [10, 250, 0];
const FABRIC_LEN: u8 = 24;
/// The same for a dual-stack lab: node K is `fd00:250::K`, on a /64.
const FABRIC6_PREFIX: u128 = 0xfd00_0250_0000_0000 << 64;
const CONTROLLER_HOST: u8 = 254;
pub(super) const CONTROLLER_PORT: u16 = 7443;
/// The fabric side of node K's link is `n{K}`; the node side is this.
const NODE_LINK: &str = "fab0";
const BRIDGE: &str = "fabric";

/// Most nodes a lab has (the scenario parser enforces the same bound).
pub const MAX_NODES: usize = 16;

pub(super) struct LabNode {
    /// `node-K`, K from 1: what pods name in `spec.nodeName`.
    pub(super) name: String,
    /// The node's addresses on the fabric (its Node's InternalIPs, the
    /// `podIP` of its host-network pods): IPv4, and IPv6 in a dual-stack lab.
    pub(super) addresses: Vec<IpAddr>,
    pub(super) netns_name: String,
    pub(super) ns: Option<NetNs>,
    pub(super) pin_root: PathBuf,
    pub(super) enforcer_socket: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) enforcer_log: PathBuf,
    pub(super) second_log: PathBuf,
    pub(super) pod_subnet: String,
    /// The node's IPv6 pod range, in a dual-stack lab.
    pub(super) pod_subnet6: Option<String>,
    pub(super) bridge: String,
    pub(super) cni: CniChain,
    pub(super) enforcer: Option<Daemon>,
    /// The enforcer pod's other containers (image mode: the chart's
    /// cni-watch), by container name; they live as long as the pod,
    /// across enforcer restarts.
    pub(super) sidecars: Vec<(String, Daemon)>,
    /// Started by a `start: second-enforcer` fault; never waited on.
    pub(super) second_enforcer: Option<Daemon>,
    /// The second pod's other containers.
    pub(super) second_sidecars: Vec<(String, Daemon)>,
    /// The running enforcer's id, when it reports one.
    pub(super) enforcer_id: Option<String>,
    /// The nft script in force in the node (None: the lab made no table).
    pub(super) nat_script: Option<String>,
    /// The node's containerd, with `runtime: containerd`.
    pub(super) containerd: Option<Containerd>,
    pub(super) containerd_dir: PathBuf,
    pub(super) containerd_log: PathBuf,
    /// With `--node-processes image`: the node's host paths (its own bpffs, run
    /// dir, state dir, CNI dirs, kubelet dir).
    pub(super) root: Option<super::image::NodeRoot>,
    pub(super) bpffs_mounted: bool,
    /// The enforcer's pod (image mode); restarts are new containers in it.
    pub(super) pod: Option<crate::kubelet::Pod>,
    /// A second DaemonSet pod on this node (image mode, surge).
    pub(super) second_pod: Option<crate::kubelet::Pod>,
    /// Rollouts started on this node: each surge pod's name is new.
    pub(super) rollouts: u32,
    /// Why pods cannot be wired on this node with Palisade (image mode with
    /// `cni.install: false`: the operator chains the plugin, not the chart).
    pub(super) unenforced: Option<String>,
}

impl LabNode {
    /// Node `index` (from 0) of lab `id`. Node 1 keeps the names a
    /// single-node lab always had (`pl<id>-node`, `enforcer.sock`, ...), so
    /// tools and people that know them still find them.
    pub(super) fn new(config: &LabConfig, id: &str, run_dir: &Path, index: usize) -> Result<Self> {
        let k = index + 1;
        let sfx = if index == 0 {
            String::new()
        } else {
            format!("-node-{k}")
        };
        let log_dir = run_dir.join("logs");
        let enforcer_socket = run_dir.join(format!("enforcer{sfx}.sock"));
        let pod_subnet = node_subnet(&config.pod_subnet, index)?;
        let pod_subnet6 = config
            .pod_subnet6
            .as_deref()
            .map(|base| node_subnet6(base, index))
            .transpose()?;
        // Interface names are at most 15 bytes; the id keeps labs apart.
        let bridge = format!(
            "plbr{id}{}",
            if index == 0 {
                String::new()
            } else {
                k.to_string()
            }
        );
        // Image mode: the node's own directories; palisade-cni is chained
        // in by the chart's init container, not by the lab.
        let root = config
            .image
            .as_ref()
            .filter(|_| config.with_palisade)
            .map(|_| super::image::NodeRoot {
                root: run_dir.join(format!("node-{k}")),
            });
        let (pin_root, enforcer_socket, state_dir) = match &root {
            Some(r) => (
                r.bpffs().join("palisade"),
                r.run_dir().join("cni.sock"),
                r.state_dir(),
            ),
            None => (
                Path::new(BPFFS).join(format!("palisade-lab-{id}{sfx}")),
                enforcer_socket,
                run_dir.join(format!("enforcer-state{sfx}")),
            ),
        };
        let mut plugin_dirs = vec![config.cni_bin_dir.clone()];
        if config.with_palisade && root.is_none() {
            plugin_dirs.push(config.bin_dir.clone());
        }
        let cni = CniChain {
            plugin_dirs,
            plugins: lab_chain(
                &run_dir.join(format!("ipam{sfx}")),
                &pod_subnet,
                pod_subnet6.as_deref(),
                config.cni,
                &bridge,
                (config.with_palisade && root.is_none()).then_some(enforcer_socket.as_path()),
            ),
            timeout: config.cni_timeout,
            log: log_dir.join(format!("cni{sfx}.log")),
        };
        let mut addresses = vec![IpAddr::V4(fabric_ip(index))];
        if pod_subnet6.is_some() {
            addresses.push(IpAddr::V6(fabric_ip6(index)));
        }
        Ok(Self {
            name: format!("node-{k}"),
            addresses,
            netns_name: if index == 0 {
                format!("pl{id}-node")
            } else {
                format!("pl{id}-node{k}")
            },
            ns: None,
            pin_root,
            enforcer_socket,
            state_dir,
            enforcer_log: log_dir.join(format!("enforcer{sfx}.log")),
            second_log: log_dir.join(format!("enforcer-2{sfx}.log")),
            pod_subnet,
            pod_subnet6,
            bridge,
            cni,
            enforcer: None,
            sidecars: Vec::new(),
            second_enforcer: None,
            second_sidecars: Vec::new(),
            enforcer_id: None,
            nat_script: None,
            containerd: None,
            containerd_dir: run_dir.join(format!("containerd{sfx}")),
            containerd_log: log_dir.join(format!("containerd{sfx}.log")),
            root,
            bpffs_mounted: false,
            pod: None,
            second_pod: None,
            rollouts: 0,
            unenforced: None,
        })
    }

    pub(super) fn ns(&self) -> &NetNs {
        self.ns
            .as_ref()
            .expect("the node namespace exists once booted")
    }
}

/// Node `index`'s pod range: the configured range shifted by `index` times
/// its own size (10.244.0.0/24, 10.244.1.0/24, ...).
pub(super) fn node_subnet(base: &str, index: usize) -> Result<String> {
    let (addr, len) = base
        .split_once('/')
        .with_context(|| format!("pod subnet {base:?} is not ADDRESS/PREFIX"))?;
    let addr: Ipv4Addr = addr
        .parse()
        .with_context(|| format!("pod subnet {base:?}: the lab's pods are IPv4"))?;
    let len: u32 = len
        .parse()
        .ok()
        .filter(|l| (8..=30).contains(l))
        .with_context(|| format!("pod subnet {base:?}: prefix must be 8-30"))?;
    let size = 1u64 << (32 - len);
    let start = u64::from(u32::from(addr)) & !(size - 1);
    let shifted = start + size * index as u64;
    if shifted + size > 1 << 32 {
        bail!("pod subnet {base:?} has no room for node {}", index + 1);
    }
    Ok(format!("{}/{len}", Ipv4Addr::from(shifted as u32)))
}

/// Node `index`'s IPv6 pod range: the configured /64 with `index` added to
/// its network part (fd00:10:244::/64, fd00:10:244:1::/64, ...).
pub(super) fn node_subnet6(base: &str, index: usize) -> Result<String> {
    let (addr, len) = base
        .split_once('/')
        .with_context(|| format!("IPv6 pod subnet {base:?} is not ADDRESS/PREFIX"))?;
    let addr: Ipv6Addr = addr
        .parse()
        .with_context(|| format!("IPv6 pod subnet {base:?}: not an IPv6 address"))?;
    if len != "64" {
        bail!("IPv6 pod subnet {base:?}: the prefix must be 64 (one /64 per node)");
    }
    let network = (u128::from(addr) >> 64)
        .checked_add(index as u128)
        .filter(|n| *n <= u128::from(u64::MAX))
        .with_context(|| {
            format!(
                "IPv6 pod subnet {base:?} has no room for node {}",
                index + 1
            )
        })?;
    Ok(format!("{}/64", Ipv6Addr::from(network << 64)))
}

/// The Node object of node `index` (from 0) as the API server would show
/// it: named `node-K`, labelled as a kubelet labels a Linux node, its
/// fabric addresses as InternalIPs (`dual_stack`: the IPv6 one too). The
/// lab serves it to the controller (ClusterNetworkPolicy `nodes` peers);
/// the model engine gives the model the same.
pub fn node_manifest(index: usize, dual_stack: bool) -> serde_json::Value {
    let name = format!("node-{}", index + 1);
    let mut addresses =
        vec![serde_json::json!({"type": "InternalIP", "address": fabric_ip(index).to_string()})];
    if dual_stack {
        addresses.push(
            serde_json::json!({"type": "InternalIP", "address": fabric_ip6(index).to_string()}),
        );
    }
    addresses.push(serde_json::json!({"type": "Hostname", "address": name}));
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
        }},
        "status": {"addresses": addresses},
    })
}

pub(super) fn fabric_ip6(node_index: usize) -> Ipv6Addr {
    Ipv6Addr::from(FABRIC6_PREFIX | (node_index as u128 + 1))
}

pub(super) fn fabric_ip(node_index: usize) -> Ipv4Addr {
    let [a, b, c] = FABRIC_PREFIX;
    Ipv4Addr::new(a, b, c, node_index as u8 + 1)
}

pub(super) fn controller_ip() -> Ipv4Addr {
    let [a, b, c] = FABRIC_PREFIX;
    Ipv4Addr::new(a, b, c, CONTROLLER_HOST)
}

/// The fabric's bridge and its controller address, in `fabric`.
pub(super) fn make_fabric(fabric: &NetNs) -> Result<()> {
    let f = fabric.name();
    ip(&["-n", f, "link", "add", BRIDGE, "type", "bridge"])?;
    ip(&[
        "-n",
        f,
        "addr",
        "add",
        &format!("{}/{FABRIC_LEN}", controller_ip()),
        "dev",
        BRIDGE,
    ])?;
    ip(&["-n", f, "link", "set", BRIDGE, "up"])
}

/// Joins node `index` to the fabric: a veth with the node's fabric address.
pub(super) fn join_fabric(fabric: &NetNs, node: &NetNs, index: usize) -> Result<()> {
    let (f, n) = (fabric.name(), node.name());
    let port = format!("n{}", index + 1);
    ip(&[
        "-n", n, "link", "add", NODE_LINK, "type", "veth", "peer", "name", &port, "netns", f,
    ])?;
    ip(&[
        "-n",
        n,
        "addr",
        "add",
        &format!("{}/{FABRIC_LEN}", fabric_ip(index)),
        "dev",
        NODE_LINK,
    ])?;
    ip(&["-n", n, "link", "set", NODE_LINK, "up"])?;
    ip(&["-n", f, "link", "set", &port, "master", BRIDGE, "up"])
}

/// Gives node `index`'s fabric link its IPv6 address too (dual-stack labs);
/// `nodad`, so that routes through it work at once.
pub(super) fn join_fabric6(node: &NetNs, index: usize) -> Result<()> {
    ip(&[
        "-n",
        node.name(),
        "addr",
        "add",
        &format!("{}/64", fabric_ip6(index)),
        "dev",
        NODE_LINK,
        "nodad",
    ])
}

/// "The internet": addresses outside the pod, Service and fabric ranges
/// (RFC 2544's benchmarking range) that the fabric namespace answers for
/// itself, every one of them (a local route), reached from every node
/// through the fabric: as many distinct external hosts as a test needs
/// (egress by domain name), without an interface per address.
pub const INTERNET: &str = "198.18.0.0/15";

/// The same for IPv6 (RFC 5180's benchmarking range), in dual-stack labs.
pub const INTERNET6: &str = "2001:2::/48";

/// The fabric bridge's IPv6 address, where nodes route [`INTERNET6`].
fn internet_gateway6() -> Ipv6Addr {
    Ipv6Addr::from(FABRIC6_PREFIX | u128::from(CONTROLLER_HOST))
}

/// Makes the fabric answer for [`INTERNET`], and for [`INTERNET6`] when
/// the lab is dual-stack.
pub(super) fn make_internet(fabric: &NetNs, dual_stack: bool) -> Result<()> {
    let f = fabric.name();
    ip(&["-n", f, "route", "add", "local", INTERNET, "dev", "lo"])?;
    if dual_stack {
        let gw = format!("{}/64", internet_gateway6());
        ip(&["-n", f, "addr", "add", &gw, "dev", BRIDGE, "nodad"])?;
        ip(&[
            "-n", f, "-6", "route", "add", "local", INTERNET6, "dev", "lo",
        ])?;
    }
    Ok(())
}

/// Routes node `node`'s traffic to [`INTERNET`] (and [`INTERNET6`]) through
/// the fabric, and the fabric's answers to the node's pod ranges
/// (`subnet`, `subnet6`) back through node `index`.
pub(super) fn join_internet(
    fabric: &NetNs,
    node: &NetNs,
    index: usize,
    subnet: &str,
    subnet6: Option<&str>,
) -> Result<()> {
    let (f, n) = (fabric.name(), node.name());
    let gw = controller_ip().to_string();
    ip(&[
        "-n", n, "route", "add", INTERNET, "via", &gw, "dev", NODE_LINK,
    ])?;
    let back = fabric_ip(index).to_string();
    ip(&["-n", f, "route", "add", subnet, "via", &back, "dev", BRIDGE])?;
    if let Some(subnet6) = subnet6 {
        let gw6 = internet_gateway6().to_string();
        ip(&[
            "-n", n, "-6", "route", "add", INTERNET6, "via", &gw6, "dev", NODE_LINK,
        ])?;
        let back6 = fabric_ip6(index).to_string();
        ip(&[
            "-n", f, "-6", "route", "add", subnet6, "via", &back6, "dev", BRIDGE,
        ])?;
    }
    Ok(())
}

/// A route in `node` to another node's pod range through its fabric address.
pub(super) fn route_to(node: &NetNs, subnet: &str, via_index: usize) -> Result<()> {
    ip(&[
        "-n",
        node.name(),
        "route",
        "add",
        subnet,
        "via",
        &fabric_ip(via_index).to_string(),
        "dev",
        NODE_LINK,
    ])
}

/// The same for another node's IPv6 pod range.
pub(super) fn route6_to(node: &NetNs, subnet6: &str, via_index: usize) -> Result<()> {
    ip(&[
        "-n",
        node.name(),
        "-6",
        "route",
        "add",
        subnet6,
        "via",
        &fabric_ip6(via_index).to_string(),
        "dev",
        NODE_LINK,
    ])
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ranges_follow_each_other() {
        assert_eq!(node_subnet("10.244.0.0/24", 0).unwrap(), "10.244.0.0/24");
        assert_eq!(node_subnet("10.244.0.0/24", 1).unwrap(), "10.244.1.0/24");
        assert_eq!(node_subnet("10.244.0.0/22", 2).unwrap(), "10.244.8.0/22");
        assert_eq!(node_subnet("10.244.0.7/24", 1).unwrap(), "10.244.1.0/24");
        assert!(node_subnet("255.255.255.0/24", 1).is_err());
        assert!(node_subnet("fd00::/64", 0).is_err());
        assert!(node_subnet("10.244.0.0", 0).is_err());
    }

    #[test]
    fn ipv6_node_ranges_are_consecutive_64s() {
        assert_eq!(
            node_subnet6("fd00:10:244::/64", 0).unwrap(),
            "fd00:10:244::/64"
        );
        assert_eq!(
            node_subnet6("fd00:10:244::/64", 1).unwrap(),
            "fd00:10:244:1::/64"
        );
        assert_eq!(
            node_subnet6("fd00:10:244:ff::/64", 2).unwrap(),
            "fd00:10:244:101::/64"
        );
        assert!(node_subnet6("fd00:10:244::/56", 0).is_err());
        assert!(node_subnet6("10.244.0.0/24", 0).is_err());
        assert!(node_subnet6("ffff:ffff:ffff:ffff::/64", 1).is_err());
        assert_eq!(fabric_ip6(0), "fd00:250::1".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn node_objects_name_the_fabric_addresses() {
        let node = node_manifest(1, true);
        assert_eq!(node["metadata"]["name"], "node-2");
        assert_eq!(node["metadata"]["labels"]["kubernetes.io/os"], "linux");
        let addresses: Vec<&str> = node["status"]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["address"].as_str().unwrap())
            .collect();
        assert_eq!(addresses, ["10.250.0.2", "fd00:250::2", "node-2"]);
        assert_eq!(
            node_manifest(0, false)["status"]["addresses"][0]["address"],
            "10.250.0.1"
        );
    }

    #[test]
    fn fabric_addresses_are_outside_pod_ranges() {
        assert_eq!(fabric_ip(0), Ipv4Addr::new(10, 250, 0, 1));
        assert_eq!(fabric_ip(MAX_NODES - 1), Ipv4Addr::new(10, 250, 0, 16));
        assert_eq!(controller_ip(), Ipv4Addr::new(10, 250, 0, 254));
    }
}
