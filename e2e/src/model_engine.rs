//! `palisade-lab run --engine model`: a scenario judged by the reference
//! model alone (the `palisade-model` crate), with no root, no namespaces and
//! no processes, in milliseconds, printing the same table as a real run.
//!
//! Pods get addresses as the lab's host-local range hands them out (in
//! creation order from 10.244.0.2), so CIDRs written from pod addresses
//! resolve as they would on the lab; a host-network pod's address is its
//! node's, and the model is given the Node objects the lab serves (their
//! fabric addresses), so `nodes` peers and traffic with a pod's own node
//! are judged as on the lab. What the model cannot judge is refused
//! by name rather than guessed: faults, strict mode (a property of the
//! enforcer, not of the API), expected CNI failures, dump checks, probes to
//! bare IPs and to Services.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};

use anyhow::{anyhow, bail, Context, Result};
use palisade_model::cluster::{ClusterState, Object as ModelObject};
use palisade_model::verdict::{allowed, Endpoint};
use serde_json::json;

use crate::probe::Outcome;
use crate::report::{Report, Row, Table};
use crate::scenario::{Kind, Mode, Object, ObjectKey, PodName, Scenario, Target};

/// The first address host-local gives in the lab's default 10.244.0.0/24.
const FIRST_POD_ADDRESS: u32 = u32::from_be_bytes([10, 244, 0, 2]);

/// Why the model cannot play `scenario`, if it cannot.
fn unsupported(scenario: &Scenario) -> Option<String> {
    if scenario.mode == Some(Mode::Strict) {
        return Some(
            "mode: strict is the enforcer's, not the API's; the model knows only standard".into(),
        );
    }
    for step in &scenario.steps {
        let at = format!("step {:?}", step.name);
        if !step.faults.is_empty() {
            return Some(format!("{at}: faults are not modelled"));
        }
        if step.add_error.is_some() {
            return Some(format!("{at}: addError (a CNI failure) is not modelled"));
        }
        if step.source_error.is_some() {
            return Some(format!(
                "{at}: sourceError (manifests the controller refuses) is not modelled"
            ));
        }
        if !step.dump.is_empty() {
            return Some(format!("{at}: dump checks need a lab"));
        }
        for p in &step.probes {
            match &p.to {
                Target::Pod(_) => {}
                other => {
                    return Some(format!(
                        "{at}: a probe to {other} (only pod to pod is modelled)"
                    ))
                }
            }
        }
    }
    None
}

/// The lab's state as the model sees it.
struct World {
    objects: BTreeMap<ObjectKey, Object>,
    ips: BTreeMap<PodName, IpAddr>,
    next_ip: u32,
    /// The Node objects, as the lab serves them ([`crate::lab::node_manifest`]).
    nodes: Vec<serde_json::Value>,
}

impl World {
    fn new(nodes: u32) -> Self {
        World {
            objects: BTreeMap::new(),
            ips: BTreeMap::new(),
            next_ip: 0,
            nodes: (0..nodes as usize)
                .map(|i| crate::lab::node_manifest(i, false))
                .collect(),
        }
    }

    fn apply(&mut self, objects: &[Object]) -> Result<()> {
        for o in objects {
            let key = o.key().clone();
            if let Some(pod) = key.pod_name() {
                if !self.ips.contains_key(&pod) {
                    // A host-network pod's address is its node's; others
                    // take the next of the pod range, as host-local gives.
                    let ip = if o.body()["spec"]["hostNetwork"] == true {
                        let node = o.body()["spec"]["nodeName"].as_str().unwrap_or("node-1");
                        node_address(&self.nodes, node).ok_or_else(|| {
                            anyhow!(
                                "{key}: no node {node:?} (the scenario has {})",
                                self.nodes.len()
                            )
                        })?
                    } else {
                        self.next_ip += 1;
                        IpAddr::V4(Ipv4Addr::from(FIRST_POD_ADDRESS + self.next_ip - 1))
                    };
                    self.ips.insert(pod, ip);
                }
            }
            let mut body = o.body().clone();
            crate::netpol::resolve_cidrs(&mut body, &self.ips).with_context(|| key.to_string())?;
            self.objects.insert(key, Object::from_value(body)?);
        }
        Ok(())
    }

    fn delete(&mut self, keys: &[ObjectKey]) {
        for key in keys {
            self.objects.remove(key);
            if let Some(pod) = key.pod_name() {
                self.ips.remove(&pod);
            }
            if key.kind == Kind::Namespace {
                self.objects
                    .retain(|k, _| k.namespace.as_deref() != Some(&key.name));
                self.ips.retain(|p, _| p.namespace != key.name);
            }
        }
    }

    fn relabel(&mut self, labels: &[(ObjectKey, BTreeMap<String, String>)]) -> Result<()> {
        for (key, new) in labels {
            let o = self
                .objects
                .get(key)
                .ok_or_else(|| anyhow!("label: {key} does not exist"))?;
            let mut body = o.body().clone();
            body["metadata"]["labels"] = serde_json::to_value(new)?;
            self.objects.insert(key.clone(), Object::from_value(body)?);
        }
        Ok(())
    }

    fn cluster(&self) -> Result<ClusterState> {
        cluster_of(self.objects.values(), &self.ips, &self.nodes)
    }
}

/// The first InternalIP of node `name` among `nodes` (Node objects).
fn node_address(nodes: &[serde_json::Value], name: &str) -> Option<IpAddr> {
    let node = nodes.iter().find(|n| n["metadata"]["name"] == name)?;
    node["status"]["addresses"]
        .as_array()?
        .iter()
        .filter(|a| a["type"] == "InternalIP")
        .find_map(|a| a["address"].as_str()?.parse().ok())
}

/// The objects as the model reads them, pods on the node they name (else
/// node-1) with the given addresses (a pod without one is Pending) and
/// their node's address as `hostIP`, and `nodes` (Node objects).
pub fn cluster_of<'a>(
    objects: impl Iterator<Item = &'a Object>,
    ips: &BTreeMap<PodName, IpAddr>,
    nodes: &[serde_json::Value],
) -> Result<ClusterState> {
    {
        let mut out = Vec::new();
        for node in nodes {
            out.push(ModelObject::Node(serde_json::from_value(node.clone())?));
        }
        for o in objects {
            let key = o.key();
            let mut body = o.body().clone();
            let typed = match key.kind {
                Kind::Namespace => ModelObject::Namespace(serde_json::from_value(body)?),
                Kind::Pod => {
                    let pod = key.pod_name().expect("a pod key names a pod");
                    if body["spec"]["nodeName"].is_null() {
                        body["spec"]["nodeName"] = "node-1".into();
                    }
                    let host_ip = body["spec"]["nodeName"]
                        .as_str()
                        .and_then(|n| node_address(nodes, n));
                    body["status"] = json!({"phase": "Running",
                                            "podIP": ips.get(&pod).map(ToString::to_string),
                                            "hostIP": host_ip.map(|ip| ip.to_string())});
                    ModelObject::Pod(serde_json::from_value(body)?)
                }
                Kind::NetworkPolicy => ModelObject::NetworkPolicy(serde_json::from_value(body)?),
                Kind::Service => ModelObject::Service(serde_json::from_value(body)?),
                Kind::EndpointSlice => ModelObject::EndpointSlice(serde_json::from_value(body)?),
                Kind::ClusterNetworkPolicy => {
                    ModelObject::ClusterNetworkPolicy(cluster_policy(body)?)
                }
                // As the controller reads it: the NetworkPolicy it is.
                Kind::ApplicationNetworkPolicy => {
                    ModelObject::NetworkPolicy(palisade_apis::application_network_policy::lower(
                        &serde_json::from_value(body)?,
                    ))
                }
            };
            out.push(typed);
        }
        Ok(ClusterState::from_objects(out, String::new()))
    }
}

/// A ClusterNetworkPolicy of either API group, read as the model reads it.
fn cluster_policy(body: serde_json::Value) -> Result<palisade_apis::ClusterNetworkPolicy> {
    use palisade_apis::{wire, ClusterNetworkPolicy};
    Ok(if body["apiVersion"] == wire::AWS_API_VERSION {
        ClusterNetworkPolicy::from_aws(&serde_json::from_value(body)?)
    } else {
        ClusterNetworkPolicy::from_upstream(&serde_json::from_value(body)?)
    })
}

pub fn verdict(
    cluster: &ClusterState,
    ips: &BTreeMap<PodName, IpAddr>,
    from: &PodName,
    to: &PodName,
    protocol: &str,
    port: u16,
) -> Result<bool> {
    let endpoint = |p: &PodName| -> Result<Endpoint<'_>> {
        let pod = cluster
            .pods
            .iter()
            .find(|x| {
                x.metadata.namespace.as_deref() == Some(p.namespace.as_str())
                    && x.metadata.name.as_deref() == Some(p.name.as_str())
            })
            .ok_or_else(|| anyhow!("pod {p} does not exist at this step"))?;
        Ok(Endpoint {
            pod,
            ip: *ips
                .get(p)
                .ok_or_else(|| anyhow!("pod {p} has no address"))?,
        })
    };
    Ok(allowed(
        cluster,
        endpoint(from)?,
        endpoint(to)?,
        protocol,
        port,
    ))
}

/// Plays `scenario` against the model, writing the table to `out`.
pub fn run(scenario: &Scenario, out: &mut dyn Write) -> Result<Report> {
    if let Some(why) = unsupported(scenario) {
        bail!("the model engine cannot play this scenario: {why}");
    }
    let mut world = World::new(scenario.nodes);
    world.apply(&scenario.objects).context("objects")?;
    let table = Table::for_scenario(scenario);
    writeln!(out, "{}", table.header())?;
    let mut rows = Vec::new();
    for step in &scenario.steps {
        world.relabel(&step.labels)?;
        world
            .apply(&step.apply)
            .with_context(|| format!("step {:?}", step.name))?;
        world.delete(&step.delete);
        let cluster = world.cluster()?;
        for p in &step.probes {
            let Target::Pod(to) = &p.to else {
                unreachable!("checked by unsupported()")
            };
            let outcome = match verdict(
                &cluster,
                &world.ips,
                &p.from,
                to,
                p.protocol.as_str(),
                p.port,
            ) {
                Ok(true) => Outcome::Echo,
                Ok(false) => Outcome::Timeout,
                Err(e) => Outcome::Error(format!("{e:#}")),
            };
            let row = Row::new(&step.name, p, &outcome);
            writeln!(out, "{}", table.row(&row))?;
            rows.push(row);
        }
    }
    Ok(Report { rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quickstart_is_judged_by_the_model_alone() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart.yaml");
        let scenario = Scenario::from_file(&path).unwrap();
        let mut out = Vec::new();
        let report = run(&scenario, &mut out).unwrap();
        assert!(report.passed(), "{}", String::from_utf8_lossy(&out));
        assert!(report.rows.len() > 10);
    }

    #[test]
    fn a_wrong_expectation_fails_and_unmodelled_steps_are_refused() {
        let yaml = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x}}
  - {kind: Pod, metadata: {name: a, namespace: x, labels: {app: a}}, spec: {containers: [{name: c, image: i, ports: [{containerPort: 80}]}]}}
  - {kind: Pod, metadata: {name: b, namespace: x, labels: {app: b}}, spec: {containers: [{name: c, image: i, ports: [{containerPort: 80}]}]}}
steps:
  - name: deny b
    apply:
      - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: d, namespace: x}, spec: {podSelector: {matchLabels: {app: b}}, policyTypes: [Ingress]}}
    probes:
      - {from: x/a, to: x/b, port: 80, expect: allow}
"#;
        let scenario = Scenario::from_yaml(yaml).unwrap();
        let report = run(&scenario, &mut Vec::new()).unwrap();
        assert_eq!(report.failures(), 1);
        let strict = Scenario::from_yaml(&format!("mode: strict\n{yaml}")).unwrap();
        let Err(err) = run(&strict, &mut Vec::new()) else {
            panic!("strict mode was played by the model");
        };
        assert!(err.to_string().contains("strict"), "{err}");
    }
}
