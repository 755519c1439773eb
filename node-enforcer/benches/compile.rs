//! A big policy from plan to datapath (issue 18), on the real datapath
//! (pinned maps, programs on a real veth in a namespace of its own) through
//! the real reconciler loop: its worker compiles off the reconciler's
//! thread and the table is written in slices between events. One pod is
//! up; a snapshot gives it an ingress policy of `rules` rules of `peers`
//! /32 peers each (in 172.16.0.0/12), TCP 80. Measured: wall time from the
//! plan's arrival to its realization (the reconciler reports the version
//! realized only once every table is complete), map writes and deletes,
//! and the process's peak resident memory.
//! Root. `cargo bench -p node-enforcer --bench compile [-- rules=N peers=N]`.
//! Prints `bench=compile rules=N peers=N ms=X map_ops=N peak_mb=X`.

mod support;
use support::sh;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use node_enforcer::compile::{PortSet, Prefix};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Adopted, Datapath, EndpointEntry, PolicyId, PortSetId, Result};
use node_enforcer::desired::PodRuntime;
use node_enforcer::reconciler::{Event, PlanMessage, PodUp, Reconciler, BACKGROUND_PEERS};
use palisade_proto::v1::{
    DirectionPolicy, IpPrefix, NodeState, PeerBlock, PlanSnapshot, PodPolicy, PodRef, PortRange,
    Rule,
};

/// The real datapath, counting the map writes and deletes it is asked for.
struct Counting {
    inner: BpfDatapath,
    ops: Arc<AtomicUsize>,
}

impl Datapath for Counting {
    fn adopt(&mut self) -> Result<Adopted> {
        self.inner.adopt()
    }
    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.ops.fetch_add(set.0.len(), Relaxed);
        self.inner.add_portset(id, set)
    }
    fn remove_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.ops.fetch_add(set.0.len(), Relaxed);
        self.inner.remove_portset(id, set)
    }
    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.ops.fetch_add(entries.len(), Relaxed);
        self.inner.add_policy(id, entries)
    }
    fn remove_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.ops.fetch_add(entries.len(), Relaxed);
        self.inner.remove_policy(id, entries)
    }
    fn update_policy(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()> {
        self.ops.fetch_add(upserts.len() + removals.len(), Relaxed);
        self.inner.update_policy(id, upserts, removals)
    }
    fn renew_epochs(&mut self, ifindex: u32, ingress: bool, egress: bool) -> Result<()> {
        self.ops.fetch_add(1, Relaxed);
        self.inner.renew_epochs(ifindex, ingress, egress)
    }
    fn ifindex(&mut self, ifname: &str) -> Result<u32> {
        self.inner.ifindex(ifname)
    }
    fn interfaces(&mut self) -> Result<BTreeMap<String, u32>> {
        self.inner.interfaces()
    }
    fn attach(&mut self, ifname: &str, ifindex: u32) -> Result<()> {
        self.inner.attach(ifname, ifindex)
    }
    fn detach(&mut self, ifname: &str, ifindex: u32) -> Result<()> {
        self.inner.detach(ifname, ifindex)
    }
    fn set_endpoint(&mut self, ifindex: u32, entry: &EndpointEntry) -> Result<()> {
        self.ops.fetch_add(1, Relaxed);
        self.inner.set_endpoint(ifindex, entry)
    }
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        self.ops.fetch_add(1, Relaxed);
        self.inner.remove_endpoint(ifindex)
    }
    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        self.inner.node_addresses()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// The k-th /32 of 172.16.0.0/12.
fn peer(k: usize) -> PeerBlock {
    PeerBlock {
        cidr: Some(IpPrefix {
            addr: vec![172, 16 + (k >> 16) as u8, (k >> 8) as u8, k as u8],
            prefix_len: 32,
        }),
        except: vec![],
    }
}

fn policy(rules: usize, peers: usize) -> DirectionPolicy {
    DirectionPolicy {
        rules: (0..rules)
            .map(|r| Rule {
                peers: (0..peers).map(|p| peer(r * peers + p)).collect(),
                ports: vec![PortRange {
                    protocol: 6,
                    port: 80,
                    end_port: 0,
                }],
                policy: "x/big".into(),
                rule_index: r as u32,
                domain_names: vec![],
            })
            .collect(),
        ..Default::default()
    }
}

fn pod(ingress: Option<DirectionPolicy>) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: "p".into(),
        }),
        pod_ips: vec![IpPrefix {
            addr: vec![10, 244, 0, 2],
            prefix_len: 32,
        }],
        ingress,
        ..Default::default()
    }
}

fn snapshot(version: u64, p: PodPolicy) -> PlanMessage {
    PlanMessage::Snapshot(PlanSnapshot {
        version,
        pods: vec![p],
        source_synced: true,
        ..Default::default()
    })
}

fn peak_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Sends an event and waits for its answer.
fn ask<T>(
    tx: &tokio::sync::mpsc::Sender<Event>,
    make: impl FnOnce(tokio::sync::oneshot::Sender<T>) -> Event,
) -> T {
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.blocking_send(make(reply)).expect("the reconciler runs");
    answer.blocking_recv().expect("answered")
}

fn run(rules: usize, peers: usize) -> (f64, usize) {
    let tag = format!("pcomp{}", std::process::id());
    support::in_scratch_node(&tag, move |pins| {
        sh(
            &[
                "ip", "link", "add", "pcomp0", "type", "veth", "peer", "name", "pcomp0p",
            ],
            None,
        );
        let ops = Arc::new(AtomicUsize::new(0));
        let dp = Counting {
            inner: BpfDatapath::load(&pins).unwrap(),
            ops: ops.clone(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let (state_tx, mut state) = tokio::sync::watch::channel(NodeState::default());
        let r = Reconciler::new("n".into(), "e".into(), dp)
            .with_background_compile(tx.clone(), BACKGROUND_PEERS)
            .unwrap();
        let reconciler = std::thread::spawn(move || r.run(rx, state_tx));
        ask(&tx, |reply| Event::Plan(snapshot(1, pod(None)), reply)).unwrap();
        let up = PodUp {
            pod: ("x".into(), "p".into()),
            runtime: PodRuntime {
                container_id: "c".into(),
                netns: String::new(),
                host_interfaces: vec!["pcomp0".into()],
                ips: vec![Prefix::from_ip("10.244.0.2".parse().unwrap(), 32)],
                ifindexes: Default::default(),
                mode: None,
            },
        };
        ask(&tx, |reply| Event::PodUp(up, reply)).expect("pod up");
        // Built before the clock starts: the plan as it arrives.
        let plan = snapshot(2, pod(Some(policy(rules, peers))));
        let before = ops.load(Relaxed);
        let t = Instant::now();
        ask(&tx, |reply| Event::Plan(plan, reply)).unwrap();
        let realized = |s: &NodeState| s.realized_version == 2;
        let deadline = Duration::from_secs(600);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(deadline, state.wait_for(realized))
                .await
                .expect("realized in time")
                .expect("the reconciler runs");
        });
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let map_ops = ops.load(Relaxed) - before;
        let errors = ask(&tx, Event::Dump).state.errors;
        assert!(errors.is_empty(), "{errors:?}");
        ask(&tx, |reply| Event::PodDown {
            pod: Some(("x".into(), "p".into())),
            container_id: "c".into(),
            reply,
        })
        .unwrap();
        drop(tx);
        reconciler.join().unwrap();
        (ms, map_ops)
    })
}

fn main() {
    let (mut rules, mut peers) = (100_000, 1);
    for a in std::env::args().skip(1) {
        let Some((k, v)) = a.split_once('=') else {
            continue;
        };
        let Ok(v) = v.parse::<usize>() else { continue };
        match k {
            "rules" => rules = v.max(1),
            "peers" => peers = v.max(1),
            _ => {}
        }
    }
    let (ms, map_ops) = run(rules, peers);
    println!(
        "bench=compile rules={rules} peers={peers} ms={ms:.0} map_ops={map_ops} peak_mb={:.0}",
        peak_mb()
    );
}
