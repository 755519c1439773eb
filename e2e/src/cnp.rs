//! The `cnp:` topology of the ClusterNetworkPolicy conformance scenarios
//! (e2e/conformance/cnp/README.md): what the network-policy-api conformance
//! suite's base manifests build, as lab objects.
//!
//! - five namespaces `network-policy-conformance-<house>` (gryffindor,
//!   slytherin, hufflepuff, ravenclaw, forbidden-forrest, spelled as
//!   upstream spells it), labelled `conformance-house: <house>` and
//!   `kubernetes.io/metadata.name` as the API server labels them;
//! - two pods in each of the first four (`harry-potter`, `draco-malfoy`,
//!   `cedric-diggory`, `luna-lovegood`, `-0` and `-1`), labelled
//!   `conformance-house: <house>`, serving TCP 80 (named `web`) and 8080,
//!   UDP 53 (named `dns`) and 5353, SCTP 9003 and 9005; `-0` on node-1,
//!   `-1` on node-2;
//! - with `hostNetwork: true`, the two host-network pods of
//!   forbidden-forrest (`centaur-0` on node-2, `centaur-1` on node-1: the
//!   pair upstream probes, harry-potter-1 to centaur-1, crosses nodes), and
//!   every pod also serves upstream's host-network ports ([`HOST_PORTS`]),
//!   so that every pair of a matrix has a listener.
//!
//! Upstream's host-network ports are picked at random when its suite runs;
//! here they are fixed.

use anyhow::{bail, Result};
use serde::Deserialize;
use serde_json::{json, Value};

/// (house, pod name prefix); forbidden-forrest's pods are host-network.
pub const HOUSES: [(&str, &str); 5] = [
    ("gryffindor", "harry-potter"),
    ("slytherin", "draco-malfoy"),
    ("hufflepuff", "cedric-diggory"),
    ("ravenclaw", "luna-lovegood"),
    ("forbidden-forrest", "centaur"),
];

pub const NAMESPACE_PREFIX: &str = "network-policy-conformance-";

/// The ports every pod serves: (port, protocol, name).
pub const PORTS: [(u16, &str, Option<&str>); 6] = [
    (80, "TCP", Some("web")),
    (8080, "TCP", None),
    (53, "UDP", Some("dns")),
    (5353, "UDP", None),
    (9003, "SCTP", None),
    (9005, "SCTP", None),
];

/// Upstream's `HostNetworkPorts[0..8]` (3 and 5 are netexec's HTTP ports,
/// not probed): 0 and 1 TCP, 2 and 4 UDP, 6 and 7 SCTP.
pub const HOST_PORTS: [(u16, &str, Option<&str>); 6] = [
    (34340, "TCP", Some("web-34340")),
    (34341, "TCP", Some("web-34341")),
    (34342, "UDP", Some("dns-34342")),
    (34344, "UDP", Some("dns-34344")),
    (34346, "SCTP", None),
    (34347, "SCTP", None),
];

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawCnp {
    /// Also forbidden-forrest's host-network pods (the node-peer tests).
    #[serde(default)]
    pub host_network: bool,
}

/// The namespaces and pods (see the module comment), for a lab of `nodes`
/// nodes (2: upstream's pods are spread over two).
pub fn topology(raw: &RawCnp, nodes: u32) -> Result<Vec<Value>> {
    if nodes != 2 {
        bail!("the cnp topology places pods on node-1 and node-2: the scenario must say nodes: 2");
    }
    let mut objects = Vec::new();
    for (house, _) in HOUSES {
        let name = format!("{NAMESPACE_PREFIX}{house}");
        objects.push(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "conformance-house": house, "kubernetes.io/metadata.name": name}}}));
    }
    let ports: Vec<_> = if raw.host_network {
        PORTS.iter().chain(HOST_PORTS.iter()).collect()
    } else {
        PORTS.iter().collect()
    };
    for (house, prefix) in HOUSES {
        let host = house == "forbidden-forrest";
        if host && !raw.host_network {
            continue;
        }
        for i in 0..2 {
            let containers: Vec<Value> = ports
                .iter()
                .map(|(port, protocol, name)| {
                    let mut p = json!({"containerPort": port, "protocol": protocol});
                    if let Some(name) = name {
                        p["name"] = json!(name);
                    }
                    json!({"name": format!("{prefix}-{port}-{}", protocol.to_lowercase()),
                           "image": "none", "ports": [p]})
                })
                .collect();
            // Regular pods: -0 on node-1, -1 on node-2; host-network ones
            // the other way round (see the module comment).
            let node = if host { 2 - i } else { i + 1 };
            let mut spec = json!({"nodeName": format!("node-{node}"), "containers": containers});
            if host {
                spec["hostNetwork"] = json!(true);
            }
            objects.push(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{prefix}-{i}"),
                             "namespace": format!("{NAMESPACE_PREFIX}{house}"),
                             "labels": {"conformance-house": house}},
                "spec": spec}));
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topology_is_upstreams_base_manifests() {
        let objects = topology(&RawCnp::default(), 2).unwrap();
        assert_eq!(objects.len(), 5 + 8);
        let pod = &objects[5];
        assert_eq!(pod["metadata"]["name"], "harry-potter-0");
        assert_eq!(
            pod["metadata"]["namespace"],
            "network-policy-conformance-gryffindor"
        );
        assert_eq!(pod["spec"]["nodeName"], "node-1");
        assert_eq!(objects[6]["spec"]["nodeName"], "node-2");
        assert_eq!(pod["spec"]["containers"].as_array().unwrap().len(), 6);
        assert_eq!(pod["spec"]["containers"][0]["ports"][0]["name"], "web");
        let with_host = topology(&RawCnp { host_network: true }, 2).unwrap();
        assert_eq!(with_host.len(), 5 + 10);
        let centaur = &with_host[13];
        assert_eq!(centaur["metadata"]["name"], "centaur-0");
        assert_eq!(centaur["spec"]["hostNetwork"], true);
        assert_eq!(centaur["spec"]["nodeName"], "node-2");
        assert_eq!(centaur["spec"]["containers"].as_array().unwrap().len(), 12);
        assert!(topology(&RawCnp::default(), 1).is_err());
    }

    #[test]
    fn every_cnp_conformance_scenario_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/cnp");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let scenario =
                    crate::scenario::Scenario::from_file(&path).unwrap_or_else(|e| panic!("{e:#}"));
                assert!(!scenario.steps.is_empty());
                n += 1;
            }
        }
        assert_eq!(n, 24);
    }
}
