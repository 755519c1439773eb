//! The pod-up benchmark: many pods started through the real CNI chain, a
//! batch at a time, timing the palisade-cni ADD of each from exec to reply.

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::pods::LabPod;
use super::Lab;
use crate::cni::Sandbox;
use crate::listener::Listeners;
use crate::netns::NetNs;
use crate::scenario::{Object, ObjectKey, PodName};

pub const BENCH_NAMESPACE: &str = "bench";

impl Lab {
    /// Starts `count` pods in namespace `bench`, `parallel` at a time, each
    /// selected by one ingress policy. Their manifests are published (and
    /// realized) first, as the API server knows a pod before its runtime
    /// starts it. Returns each pod's ADD times: palisade-cni's, and the plugins'
    /// before it.
    pub fn bench_pod_up(
        &mut self,
        count: usize,
        parallel: usize,
    ) -> Result<Vec<crate::cni::AddTimes>> {
        if parallel == 0 {
            bail!("parallel must be at least 1");
        }
        let mut objects = vec![
            Object::from_value(json!({
                "kind": "Namespace",
                "metadata": {"name": BENCH_NAMESPACE, "labels": {"ns": BENCH_NAMESPACE}},
            }))?,
            Object::from_value(json!({
                "kind": "NetworkPolicy",
                "metadata": {"name": "same-namespace", "namespace": BENCH_NAMESPACE},
                "spec": {
                    "podSelector": {"matchLabels": {"bench": "pod"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 80}]}],
                },
            }))?,
        ];
        let names: Vec<PodName> = (0..count)
            .map(|i| PodName {
                namespace: BENCH_NAMESPACE.into(),
                name: format!("p{i:05}"),
            })
            .collect();
        for name in &names {
            objects.push(Object::from_value(json!({
                "kind": "Pod",
                "metadata": {"name": name.name, "namespace": BENCH_NAMESPACE, "labels": {"bench": "pod"}},
                "spec": {"containers": [{"name": "c", "image": "none"}]},
            }))?);
        }
        // Manifests only (Pending pods): the runtime starts them below.
        for o in &objects {
            let body = match o.key().pod_name() {
                Some(_) => {
                    let mut b = o.body().clone();
                    // The benchmark measures one node's enforcer.
                    b["spec"]["nodeName"] = self.nodes[0].name.clone().into();
                    if let Some(pod) = o.key().pod_name() {
                        self.placement.insert(pod, 0);
                    }
                    b["status"] = json!({"phase": "Pending"});
                    b
                }
                None => o.body().clone(),
            };
            self.manifests.write(o.key(), &body)?;
            self.objects.insert(o.key().clone(), o.clone());
        }
        self.manifests.publish()?;
        self.wait_realized()
            .context("realizing the benchmark's pods before they start")?;

        let mut times = Vec::with_capacity(count);
        for batch in names.chunks(parallel) {
            self.config.cancel.check()?;
            let mut made = Vec::with_capacity(batch.len());
            for pod in batch {
                let index = self.next_pod;
                self.next_pod += 1;
                let ns_name = format!("pl{}-p{index}", self.id);
                self.made_netns.push(ns_name.clone());
                let netns = NetNs::create(&ns_name).with_context(|| format!("pod {pod}"))?;
                let sandbox = Sandbox {
                    pod: pod.clone(),
                    container_id: format!("pl{}p{index}", self.id),
                    netns: netns.path().to_path_buf(),
                };
                made.push((netns, sandbox));
            }
            let (node, cni, cancel) = (self.nodes[0].ns(), &self.nodes[0].cni, &self.config.cancel);
            let results: Vec<_> = std::thread::scope(|scope| {
                let handles: Vec<_> = made
                    .iter()
                    .map(|(_, sandbox)| scope.spawn(move || cni.add_timed(node, sandbox, cancel)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| bail!("CNI ADD thread panicked"))
                    })
                    .collect()
            });
            let mut first_error = None;
            for ((netns, sandbox), result) in made.into_iter().zip(results) {
                match result {
                    Ok((attachment, took)) => {
                        times.push(took);
                        self.made_interfaces
                            .extend(attachment.host_interfaces.iter().cloned());
                        self.pods.insert(
                            sandbox.pod.clone(),
                            LabPod {
                                netns,
                                sandbox,
                                attachment: Some(attachment),
                                ports: Vec::new(),
                                listeners: Listeners::default(),
                                cri: None,
                                host_ips: None,
                            },
                        );
                    }
                    Err(e) => {
                        let _ = netns.delete();
                        self.objects.remove(&ObjectKey::pod(&sandbox.pod));
                        self.placement.remove(&sandbox.pod);
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(times)
    }
}
