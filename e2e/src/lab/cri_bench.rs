//! The runtime pod-up benchmark: bursts of RunPodSandbox on containerd,
//! with palisade-cni in the chain and without it, in the same lab and the
//! same run, interleaved burst by burst so that load and drift fall on
//! both alike. Times are the CRI call's, request to reply: netns, the whole
//! CNI chain, the pause container.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::bench::BENCH_NAMESPACE;
use super::Lab;
use crate::bench::BurstTimes;
use crate::exec_trace::{ExecTrace, Runs};
use crate::runtime::containerd::{Containerd, Layout, Settings};
use crate::runtime::cri::CriClient;
use crate::runtime::sandbox::{self, SandboxRequest};
use crate::runtime::{cgroups, PodRuntime};
use crate::scenario::{Object, PodName};

impl Lab {
    /// For each burst size, `rounds` bursts on node 1's containerd (chain
    /// with palisade-cni) and as many on a second containerd in the same
    /// node whose chain stops before it, alternating which goes first;
    /// `uncontended` bursts of one first, the baseline the ADDs of the
    /// bursts are held to.
    /// Every pod of a "with" burst is known to the controller first
    /// (Pending, selected by a policy), as the API server knows a pod
    /// before its runtime starts it. Sandboxes are removed between bursts.
    pub fn bench_runtime_pod_up(
        &mut self,
        bursts: &[usize],
        rounds: usize,
        uncontended: usize,
    ) -> Result<Vec<BurstTimes>> {
        if self.config.runtime != PodRuntime::Containerd || !self.config.with_palisade {
            bail!("the runtime pod-up benchmark needs runtime: containerd with Palisade");
        }
        if bursts.contains(&0) || rounds == 0 {
            bail!("bursts and rounds must be at least 1");
        }
        let max = bursts.iter().copied().max().unwrap_or(1);
        self.publish_bench_pods(max)?;
        let first = self.first_chain_plugin()?;
        let trace = ExecTrace::new(
            &crate::exec_trace::lab_instance(&self.id),
            &[crate::preflight::CNI_BIN, &first],
        )
        .context("tracing the CNI plugins' runs")?;
        let mut bare = self.start_bare_containerd()?;
        let mut plan: Vec<(usize, usize)> = Vec::new();
        if uncontended > 0 {
            plan.push((1, uncontended));
        }
        plan.extend(bursts.iter().map(|&b| (b, rounds)));
        let result = self.run_bursts(&bare, &plan, (&trace, &first));
        let stopped = bare.stop(self.config.stop_grace);
        let times = result?;
        stopped?;
        Ok(times)
    }

    /// Each (burst size, rounds) in turn.
    fn run_bursts(
        &self,
        bare: &Containerd,
        plan: &[(usize, usize)],
        (trace, first): (&ExecTrace, &str),
    ) -> Result<Vec<BurstTimes>> {
        let with = self.nodes[0]
            .containerd
            .as_ref()
            .ok_or_else(|| anyhow!("node-1 has no containerd"))?;
        let mut out = Vec::new();
        for &(burst, rounds) in plan {
            let mut times = BurstTimes {
                burst,
                first_plugin: first.to_string(),
                ..Default::default()
            };
            for round in 0..rounds {
                for palisade in if round % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                } {
                    self.config.cancel.check()?;
                    let (c, traced) = match palisade {
                        true => (with, Some(trace)),
                        false => (bare, None),
                    };
                    let (took, mut runs) = self
                        .burst(c.client(), burst, traced)
                        .with_context(|| format!("burst of {burst} (palisade-cni: {palisade})"))?;
                    let mut take = |program: &str| runs.remove(program).unwrap_or_default();
                    times.adds.extend(take(crate::preflight::CNI_BIN));
                    times.first_adds.extend(take(first));
                    if palisade {
                        times.with.extend(took);
                    } else {
                        times.without.extend(took);
                    }
                }
            }
            out.push(times);
        }
        Ok(out)
    }

    /// `n` RunPodSandbox at once; returns each call's time, and with
    /// `trace` the traced plugins' runs during the calls by program (only
    /// ADDs: the sandboxes are stopped after it stops; each program ran
    /// once per sandbox), after removing every sandbox it made.
    fn burst(
        &self,
        client: &CriClient,
        n: usize,
        trace: Option<&ExecTrace>,
    ) -> Result<(Vec<Duration>, Runs)> {
        let configs = (0..n)
            .map(|i| {
                let pod = bench_pod(i);
                let body = pod_body(&pod);
                let uid = format!("bench-{}-{i}", self.id);
                sandbox::config(&SandboxRequest {
                    pod: &pod,
                    uid: &uid,
                    attempt: 0,
                    body: &body,
                    log_root: &self.run_dir.join("pods"),
                    cgroup_root: &cgroups::lab_cgroup(&self.id),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(t) = trace {
            t.start()?;
        }
        let runs = self.rt().block_on(async {
            let mut set = JoinSet::new();
            for config in configs {
                let c = client.clone();
                set.spawn(async move {
                    let started = Instant::now();
                    let id = c.run_sandbox(config).await;
                    (started.elapsed(), id)
                });
            }
            let mut done = Vec::new();
            while let Some(r) = set.join_next().await {
                done.push(r.map_err(|e| anyhow!("a RunPodSandbox task failed: {e}"))?);
            }
            Ok::<_, anyhow::Error>(done)
        })?;
        // Checked after the calls' own errors, which say more.
        let adds = trace.map(ExecTrace::stop).transpose();
        let ids: Vec<String> = runs
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().cloned())
            .collect();
        let removed = self.rt().block_on(async {
            let mut set = JoinSet::new();
            for id in ids {
                let c = client.clone();
                set.spawn(async move {
                    c.stop_sandbox(&id).await?;
                    c.remove_sandbox(&id).await
                });
            }
            let mut errors = Vec::new();
            while let Some(r) = set.join_next().await {
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => errors.push(format!("{e:#}")),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            errors
        });
        if let Some((_, Err(status))) = runs.iter().find(|(_, r)| r.is_err()) {
            bail!("RunPodSandbox failed: {}", status.message());
        }
        if !removed.is_empty() {
            bail!("removing the burst's sandboxes: {}", removed.join("; "));
        }
        let adds = adds?.unwrap_or_default();
        if let Some((program, runs)) = adds.iter().find(|(_, runs)| runs.len() != n) {
            bail!(
                "{n} sandboxes started, but {} runs of {program} were traced",
                runs.len()
            );
        }
        Ok((runs.into_iter().map(|(t, _)| t).collect(), adds))
    }

    /// The benchmark's namespace, policy and `max` Pending pods, realized.
    fn publish_bench_pods(&mut self, max: usize) -> Result<()> {
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
        for i in 0..max {
            objects.push(Object::from_value(pod_body(&bench_pod(i)))?);
        }
        for o in &objects {
            let mut body = o.body().clone();
            if o.key().pod_name().is_some() {
                body["spec"]["nodeName"] = self.nodes[0].name.clone().into();
                body["status"] = json!({"phase": "Pending"});
            }
            self.manifests.write(o.key(), &body)?;
        }
        self.manifests.publish()?;
        self.wait_realized()
            .context("realizing the benchmark's pods before they start")
    }

    /// The type of the chain's first plugin (which creates the pod's
    /// interface): the reference palisade-cni's ADD is seen beside.
    fn first_chain_plugin(&self) -> Result<String> {
        self.nodes[0]
            .cni
            .plugins
            .iter()
            .filter_map(|p| p["type"].as_str())
            .find(|t| *t != crate::preflight::CNI_BIN)
            .map(str::to_string)
            .ok_or_else(|| anyhow!("node-1's CNI chain has no plugin before palisade-cni"))
    }

    /// A containerd in node 1 whose chain is the same without palisade-cni.
    fn start_bare_containerd(&mut self) -> Result<Containerd> {
        let n = &self.nodes[0];
        let plugins: Vec<Value> = n
            .cni
            .plugins
            .iter()
            .filter(|p| p["type"] != crate::preflight::CNI_BIN)
            .cloned()
            .collect();
        let settings = Settings {
            layout: Layout {
                dir: self.run_dir.join("containerd-bare"),
            },
            plugins: &plugins,
            cni_bin_dir: &self.config.cni_bin_dir,
            palisade_cni: None,
            log: self.log_dir.join("containerd-bare.log"),
            start_timeout: self.config.start_timeout,
            call_timeout: self.config.cni_timeout + Duration::from_secs(30),
        };
        let c = Containerd::start(settings, n.ns(), self.rt().handle(), &self.config.cancel)
            .context("starting the second containerd (no palisade-cni)")?;
        self.record_pid(c.pid())?;
        Ok(c)
    }
}

fn bench_pod(i: usize) -> PodName {
    PodName {
        namespace: BENCH_NAMESPACE.into(),
        name: format!("p{i:05}"),
    }
}

fn pod_body(pod: &PodName) -> Value {
    json!({
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": {"bench": "pod"}},
        "spec": {"containers": [{"name": "c", "image": "none"}]},
    })
}
