//! The upstream network policy e2e suite's vocabulary in lab scenarios
//! (e2e/conformance/README.md): the `netpol:` topology, `reachability:`
//! matrices and CIDRs written as `{pod: ns/name, prefix: N}`. Pure: the
//! runner supplies pod addresses where they are needed.

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{anyhow, bail, Context, Result};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::scenario::{PodName, Protocol, Verdict};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PORTS: [u16; 2] = [80, 81];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetpol {
    pub pods: Vec<String>,
}

/// What upstream's `initializeResources` creates: namespaces x, y and z
/// labelled with their names as the API server labels them, and the pods,
/// each labelled `pod: <name>`, serving 80 and 81 on TCP, UDP and SCTP under
/// upstream's port names (`serve-80-tcp`, ...).
pub fn topology(raw: &RawNetpol) -> Result<Vec<Value>> {
    let mut objects: Vec<Value> = NAMESPACES
        .iter()
        .map(|ns| {
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}})
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in raw.pods.iter().enumerate() {
        let pod = PodName::parse(name).with_context(|| format!("netpol.pods[{i}]"))?;
        if !NAMESPACES.contains(&pod.namespace.as_str()) {
            bail!("netpol.pods[{i}]: {name}: the namespace must be x, y or z");
        }
        if !seen.insert(pod.clone()) {
            bail!("netpol.pods[{i}]: {name} is listed twice");
        }
        let containers: Vec<Value> = PORTS
            .iter()
            .flat_map(|port| {
                PROTOCOLS.iter().map(move |proto| {
                    let lower = proto.to_lowercase();
                    json!({"name": format!("cont-{port}-{lower}"), "image": "none",
                           "ports": [{"name": format!("serve-{port}-{lower}"),
                                      "containerPort": port, "protocol": proto}]})
                })
            })
            .collect();
        objects.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace,
                         "labels": {"pod": pod.name}},
            "spec": {"containers": containers},
        }));
    }
    Ok(objects)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatrix {
    pub protocol: String,
    pub port: i64,
    pub default: Option<String>,
    #[serde(default)]
    pub expect: Vec<RawExpect>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExpect {
    pub from: String,
    pub to: String,
    pub is: String,
}

/// One probe of a matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixProbe {
    pub from: PodName,
    pub to: PodName,
    pub port: u16,
    pub protocol: Protocol,
    pub expect: Verdict,
}

fn verdict(word: &str) -> Result<Verdict> {
    match word {
        "allow" => Ok(Verdict::Allow),
        "deny" => Ok(Verdict::Deny),
        other => bail!("expected allow or deny, got {other:?}"),
    }
}

/// Does `pattern` (`*`, `ns/*` or `ns/name`) name `pod`?
fn matches(pattern: &str, pod: &PodName) -> bool {
    pattern == "*"
        || pattern.strip_suffix("/*") == Some(pod.namespace.as_str())
        || pattern == pod.to_string()
}

fn check_pattern(pattern: &str) -> Result<()> {
    if pattern == "*"
        || pattern
            .strip_suffix("/*")
            .is_some_and(|ns| !ns.contains('/'))
    {
        return Ok(());
    }
    PodName::parse(pattern).map(|_| ())
}

/// Every ordered pair of `pods` but a pod to itself (upstream ignores
/// loopback), with the verdict the matrix gives it: its default, then each
/// `expect` entry in order, the last match winning.
pub fn expand(matrix: &RawMatrix, pods: &[PodName]) -> Result<Vec<MatrixProbe>> {
    let protocol = Protocol::parse(&matrix.protocol).ok_or_else(|| {
        anyhow!(
            "protocol: expected TCP, UDP or SCTP, got {:?}",
            matrix.protocol
        )
    })?;
    let port = u16::try_from(matrix.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| anyhow!("port: {} is not a port", matrix.port))?;
    let default = verdict(matrix.default.as_deref().unwrap_or("allow")).context("default")?;
    let mut rules = Vec::with_capacity(matrix.expect.len());
    for (i, e) in matrix.expect.iter().enumerate() {
        check_pattern(&e.from).with_context(|| format!("expect[{i}].from"))?;
        check_pattern(&e.to).with_context(|| format!("expect[{i}].to"))?;
        rules.push((
            &e.from,
            &e.to,
            verdict(&e.is).with_context(|| format!("expect[{i}].is"))?,
        ));
    }
    let mut out = Vec::new();
    for from in pods {
        for to in pods {
            if from == to {
                continue;
            }
            let mut expect = default;
            for (f, t, v) in &rules {
                if matches(f, from) && matches(t, to) {
                    expect = *v;
                }
            }
            out.push(MatrixProbe {
                from: from.clone(),
                to: to.clone(),
                port,
                protocol,
                expect,
            });
        }
    }
    Ok(out)
}

/// Replaces each `{pod: ns/name, prefix: N}` standing for an `ipBlock`'s
/// `cidr`, an `except` entry or an entry of a ClusterNetworkPolicy's
/// `networks` with that pod's address masked to N bits.
pub fn resolve_cidrs(value: &mut Value, ips: &BTreeMap<PodName, IpAddr>) -> Result<()> {
    resolve_cidrs_with(value, &|pod| ips.get(pod).copied())
}

/// The address every pod stands in with when a scenario is checked before
/// any pod has one: inside the lab's pod range, as real ones are.
pub const STAND_IN_POD_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, 2));

/// As [`resolve_cidrs`], with `ip` telling each pod's address.
pub fn resolve_cidrs_with(
    value: &mut Value,
    ip: &dyn Fn(&PodName) -> Option<IpAddr>,
) -> Result<()> {
    match value {
        Value::Object(map) => {
            // A ClusterNetworkPolicy's `networks` peer: a list of CIDRs.
            if let Some(Value::Array(networks)) = map.get_mut("networks") {
                for (i, n) in networks.iter_mut().enumerate() {
                    resolve_one(n, ip).with_context(|| format!("networks[{i}]"))?;
                }
            }
            if let Some(Value::Object(block)) = map.get_mut("ipBlock") {
                if let Some(cidr) = block.get_mut("cidr") {
                    resolve_one(cidr, ip).context("ipBlock.cidr")?;
                }
                if let Some(Value::Array(except)) = block.get_mut("except") {
                    for (i, e) in except.iter_mut().enumerate() {
                        resolve_one(e, ip).with_context(|| format!("ipBlock.except[{i}]"))?;
                    }
                }
            }
            for v in map.values_mut() {
                resolve_cidrs_with(v, ip)?;
            }
        }
        Value::Array(items) => {
            for v in items {
                resolve_cidrs_with(v, ip)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn resolve_one(v: &mut Value, ip_of: &dyn Fn(&PodName) -> Option<IpAddr>) -> Result<()> {
    let Some(map) = v.as_object() else {
        return Ok(());
    };
    let pod = map
        .get("pod")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("expected a CIDR or {{pod: ns/name, prefix: N}}"))?;
    let pod = PodName::parse(pod)?;
    let prefix = map
        .get("prefix")
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("{{pod: {pod}}}: prefix missing or not a number"))?;
    let ip = ip_of(&pod)
        .ok_or_else(|| anyhow!("{{pod: {pod}}}: no such pod with an address in the lab"))?;
    let net = u8::try_from(prefix)
        .ok()
        .and_then(|p| IpNet::new(ip, p).ok())
        .ok_or_else(|| anyhow!("{{pod: {pod}}}: prefix {prefix} is too long for {ip}"))?
        .trunc();
    *v = Value::String(net.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(names: &[&str]) -> Vec<PodName> {
        names.iter().map(|n| PodName::parse(n).unwrap()).collect()
    }

    #[test]
    fn a_matrix_applies_its_entries_in_order_and_skips_loopback() {
        let m: RawMatrix = serde_yaml::from_str(
            r#"{protocol: TCP, port: 80, expect: [{from: "*", to: "x/a", is: deny}, {from: x/b, to: x/a, is: allow}]}"#,
        )
        .unwrap();
        let probes = expand(&m, &pods(&["x/a", "x/b", "y/a"])).unwrap();
        assert_eq!(probes.len(), 6);
        let verdict_of = |f: &str, t: &str| {
            probes
                .iter()
                .find(|p| p.from.to_string() == f && p.to.to_string() == t)
                .unwrap()
                .expect
        };
        assert_eq!(verdict_of("x/b", "x/a"), Verdict::Allow);
        assert_eq!(verdict_of("y/a", "x/a"), Verdict::Deny);
        assert_eq!(verdict_of("x/a", "y/a"), Verdict::Allow);
        let bad: RawMatrix = serde_yaml::from_str(
            r#"{protocol: TCP, port: 80, expect: [{from: "x//", to: "*", is: deny}]}"#,
        )
        .unwrap();
        assert!(expand(&bad, &pods(&["x/a"])).is_err());
    }

    #[test]
    fn pod_cidrs_are_resolved_and_masked() {
        let mut ips = BTreeMap::new();
        ips.insert(
            PodName::parse("x/b").unwrap(),
            "10.244.0.3".parse().unwrap(),
        );
        let mut v = json!({"egress": [{"to": [{"ipBlock": {
            "cidr": {"pod": "x/b", "prefix": 4}, "except": [{"pod": "x/b", "prefix": 32}, "10.0.0.0/8"]}}]}]});
        resolve_cidrs(&mut v, &ips).unwrap();
        let block = &v["egress"][0]["to"][0]["ipBlock"];
        assert_eq!(block["cidr"], "0.0.0.0/4");
        let mut cnp = json!({"to": [{"networks": [{"pod": "x/b", "prefix": 32}, "::/0"]}]});
        resolve_cidrs(&mut cnp, &ips).unwrap();
        assert_eq!(cnp["to"][0]["networks"], json!(["10.244.0.3/32", "::/0"]));
        assert_eq!(block["except"][0], "10.244.0.3/32");
        assert_eq!(block["except"][1], "10.0.0.0/8");
        let mut missing = json!({"ipBlock": {"cidr": {"pod": "y/q", "prefix": 32}}});
        let err = resolve_cidrs(&mut missing, &ips).unwrap_err();
        assert!(format!("{err:#}").contains("y/q"), "{err:#}");
    }

    #[test]
    fn the_topology_is_upstreams() {
        let objects = topology(&RawNetpol {
            pods: vec!["x/a".into(), "y/b".into()],
        })
        .unwrap();
        assert_eq!(objects.len(), 5);
        assert_eq!(objects[4]["metadata"]["labels"]["pod"], "b");
        let ports = objects[3]["spec"]["containers"].as_array().unwrap();
        assert_eq!(ports.len(), 6);
        assert!(topology(&RawNetpol {
            pods: vec!["w/a".into()]
        })
        .is_err());
        assert!(topology(&RawNetpol {
            pods: vec!["x/a".into(), "x/a".into()]
        })
        .is_err());
    }
}
