//! Peer churn (issue 6, benchmark 3): 100 local pods whose ingress policies
//! name a peer set of 10,000 addresses (in `groups` distinct policies, so
//! `groups` tables of 10,000 entries), on the real datapath (pinned maps,
//! programs attached to real veths in a namespace of its own). One pod joins
//! the peer set, then leaves it: the controller's delta upserts every local
//! pod whose policy names the set. Measured per change: map writes and
//! deletes (a counting decorator around the real datapath) and wall time
//! from the plan's arrival to its realization (`apply_plan` returns once the
//! datapath holds it), for the in-place path and the new-id rewrite.
//! Columns: `ms` wall time, `cpu_ms` the reconciler thread's CPU time
//! (kernel included), `dp_ms` the part spent in datapath calls.
//! Root. `cargo bench -p node-enforcer --bench churn [-- peers=N pods=N
//! groups=N reps=N]`. Prints a table and
//! `bench=churn change=join|leave path=in_place|rewrite map_ops=N ms=X`.

mod support;
use support::sh;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use node_enforcer::compile::{PortSet, Prefix};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{Adopted, Datapath, EndpointEntry, PolicyId, PortSetId, Result};
use node_enforcer::desired::PodRuntime;
use node_enforcer::reconciler::{PlanMessage, PodUp, Reconciler};
use palisade_proto::v1::{
    DirectionPolicy, IpPrefix, PeerBlock, PlanDelta, PlanSnapshot, PodPolicy, PodRef, PortRange,
    Rule,
};

/// The real datapath, counting every map write and delete it is asked for
/// and the time spent in it.
struct Counting {
    inner: BpfDatapath,
    writes: usize,
    deletes: usize,
    spent: Duration,
}

impl Counting {
    fn timed<T>(&mut self, f: impl FnOnce(&mut BpfDatapath) -> T) -> T {
        let t = Instant::now();
        let r = f(&mut self.inner);
        self.spent += t.elapsed();
        r
    }
}

impl Datapath for Counting {
    fn adopt(&mut self) -> Result<Adopted> {
        self.inner.adopt()
    }
    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.writes += set.0.len();
        self.timed(|d| d.add_portset(id, set))
    }
    fn remove_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.deletes += set.0.len();
        self.timed(|d| d.remove_portset(id, set))
    }
    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.writes += entries.len();
        self.timed(|d| d.add_policy(id, entries))
    }
    fn remove_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.deletes += entries.len();
        self.timed(|d| d.remove_policy(id, entries))
    }
    fn update_policy(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()> {
        self.writes += upserts.len();
        self.deletes += removals.len();
        self.timed(|d| d.update_policy(id, upserts, removals))
    }
    fn renew_epochs(&mut self, ifindex: u32, ingress: bool, egress: bool) -> Result<()> {
        self.writes += 1;
        self.timed(|d| d.renew_epochs(ifindex, ingress, egress))
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
        self.writes += 1;
        self.timed(|d| d.set_endpoint(ifindex, entry))
    }
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        self.deletes += 1;
        self.timed(|d| d.remove_endpoint(ifindex))
    }
    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        self.inner.node_addresses()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[derive(Clone, Copy)]
struct Shape {
    peers: usize,
    pods: usize,
    groups: usize,
    reps: usize,
}

fn v4(a: [u8; 4]) -> IpPrefix {
    IpPrefix {
        addr: a.to_vec(),
        prefix_len: 32,
    }
}

/// The k-th address of the peer set: 10.100.0.1 onwards, 250 per /24.
fn peer(k: usize) -> IpPrefix {
    v4([
        10,
        100 + (k / 62_500) as u8,
        (k / 250 % 250) as u8,
        (k % 250) as u8 + 1,
    ])
}

/// The pod that joins and leaves: not one of the set's addresses.
fn joiner() -> IpPrefix {
    v4([10, 99, 0, 1])
}

fn pod_policy(i: usize, s: Shape, peers: &[PeerBlock]) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: format!("p{i}"),
        }),
        pod_ips: vec![v4([10, 244, (i / 250) as u8, (i % 250) as u8 + 1])],
        // Groups differ by port: one table each, all naming the set.
        ingress: Some(DirectionPolicy {
            rules: vec![Rule {
                peers: peers.to_vec(),
                ports: vec![PortRange {
                    protocol: 6,
                    port: 8000 + (i % s.groups) as u32,
                    end_port: 0,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        policies: vec![format!("x/np{}", i % s.groups)],
        ..Default::default()
    }
}

fn peer_blocks(s: Shape, with_joiner: bool) -> Vec<PeerBlock> {
    (0..s.peers)
        .map(peer)
        .chain(with_joiner.then(joiner))
        .map(|p| PeerBlock {
            cidr: Some(p),
            except: vec![],
        })
        .collect()
}

struct Measurement {
    change: &'static str,
    path: &'static str,
    map_ops: usize,
    writes: usize,
    deletes: usize,
    ms: f64,
    cpu_ms: f64,
    dp_ms: f64,
}

/// CPU time of this thread (the reconciler's, syscalls included): the
/// machine may be shared, wall time alone is noisy.
fn thread_cpu_ms() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 * 1e3 + v.tv_usec as f64 / 1e3;
    t(u.ru_utime) + t(u.ru_stime)
}

/// One node (namespace, pin root, reconciler), set up with every pod up;
/// then `reps` join/leave pairs.
fn run(s: Shape, in_place: bool) -> Vec<Measurement> {
    let tag = format!("pchurn{}{}", std::process::id(), u8::from(in_place));
    support::in_scratch_node(&tag, move |pins| {
        let batch: String = (0..s.pods)
            .map(|i| format!("link add pch{i} type veth peer name pch{i}p\n"))
            .collect();
        sh(&["ip", "-batch", "-"], Some(&batch));
        let dp = Counting {
            inner: BpfDatapath::load(&pins).unwrap(),
            writes: 0,
            deletes: 0,
            spent: Duration::ZERO,
        };
        let mut r = Reconciler::new("n".into(), "e".into(), dp).with_in_place_edits(in_place);
        let peers = peer_blocks(s, false);
        let plan: Vec<PodPolicy> = (0..s.pods).map(|i| pod_policy(i, s, &peers)).collect();
        r.apply_plan(PlanMessage::Snapshot(PlanSnapshot {
            term: 0,
            version: 1,
            pods: plan,
            source_synced: true,
            trace_context: Default::default(),
        }))
        .unwrap();
        for i in 0..s.pods {
            let (tx, mut rx) = tokio::sync::oneshot::channel();
            r.pod_up(
                PodUp {
                    pod: ("x".into(), format!("p{i}")),
                    runtime: PodRuntime {
                        container_id: format!("c{i}"),
                        netns: String::new(),
                        host_interfaces: vec![format!("pch{i}")],
                        ips: vec![Prefix::from_ip(
                            format!("10.244.{}.{}", i / 250, i % 250 + 1)
                                .parse()
                                .unwrap(),
                            32,
                        )],
                        ifindexes: Default::default(),
                        mode: None,
                    },
                },
                tx,
            );
            rx.try_recv().expect("answered").expect("pod up");
        }
        assert!(
            r.node_state().errors.is_empty(),
            "{:?}",
            r.node_state().errors
        );
        let path = if in_place { "in_place" } else { "rewrite" };
        let mut version = 1;
        let mut out = Vec::new();
        for rep in 0..s.reps {
            for (change, joined) in [("join", true), ("leave", false)] {
                // Built before the clock starts: the delta as it arrives.
                let peers = peer_blocks(s, joined);
                let upserted: Vec<PodPolicy> =
                    (0..s.pods).map(|i| pod_policy(i, s, &peers)).collect();
                drop(peers);
                let delta = PlanMessage::Delta(PlanDelta {
                    term: 0,
                    base_version: version,
                    version: version + 1,
                    upserted,
                    removed: vec![],
                    trace_context: Default::default(),
                });
                version += 1;
                let (w0, d0) = (r.datapath.writes, r.datapath.deletes);
                r.datapath.spent = Duration::ZERO;
                let (cpu0, t) = (thread_cpu_ms(), Instant::now());
                r.apply_plan(delta).unwrap();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let cpu_ms = thread_cpu_ms() - cpu0;
                let (writes, deletes) = (r.datapath.writes - w0, r.datapath.deletes - d0);
                // The first round warms caches (compiled policies, maps).
                if rep > 0 || s.reps == 1 {
                    out.push(Measurement {
                        change,
                        path,
                        map_ops: writes + deletes,
                        writes,
                        deletes,
                        ms,
                        cpu_ms,
                        dp_ms: r.datapath.spent.as_secs_f64() * 1e3,
                    });
                }
            }
        }
        // Every change was realized without an error (checked once:
        // the state report names every pod's tables, which is not free).
        let t = Instant::now();
        let state = r.node_state();
        let state_ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(state.errors.is_empty(), "{:?}", state.errors);
        assert_eq!(state.realized_version, version);
        println!("({path}: the state report after an event takes {state_ms:.1} ms)");
        // Every table is gone with the pods.
        for i in 0..s.pods {
            r.pod_down(Some(("x".into(), format!("p{i}"))), &format!("c{i}"))
                .unwrap();
        }
        out
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let mut s = Shape {
        peers: 10_000,
        pods: 100,
        groups: 10,
        reps: 4,
    };
    for a in std::env::args().skip(1) {
        let Some((k, v)) = a.split_once('=') else {
            continue;
        };
        let Ok(v) = v.parse::<usize>() else { continue };
        match k {
            "peers" => s.peers = v,
            "pods" => s.pods = v,
            "groups" => s.groups = v.max(1),
            "reps" => s.reps = v.max(1),
            _ => {}
        }
    }
    println!(
        "peer churn: {} pods, {} policies (tables) naming a set of {} peers; one pod joins, then leaves; median of {} rounds",
        s.pods,
        s.groups,
        s.peers,
        s.reps.saturating_sub(1).max(1)
    );
    println!(
        "{:>6} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "change", "path", "map_ops", "writes", "deletes", "ms", "cpu_ms", "dp_ms"
    );
    let mut lines = Vec::new();
    for in_place in [false, true] {
        let all = run(s, in_place);
        for change in ["join", "leave"] {
            let m: Vec<&Measurement> = all.iter().filter(|m| m.change == change).collect();
            let ms = median(m.iter().map(|m| m.ms).collect());
            let dp_ms = median(m.iter().map(|m| m.dp_ms).collect());
            let cpu_ms = median(m.iter().map(|m| m.cpu_ms).collect());
            let first = m[0];
            // The same change costs the same operations every round.
            assert!(m.iter().all(|x| x.map_ops == first.map_ops));
            println!(
                "{:>6} {:>9} {:>8} {:>8} {:>8} {:>9.2} {:>9.2} {:>9.2}",
                change, first.path, first.map_ops, first.writes, first.deletes, ms, cpu_ms, dp_ms
            );
            lines.push(format!(
                "bench=churn change={change} path={} map_ops={} ms={ms:.2}",
                first.path, first.map_ops
            ));
        }
    }
    for l in lines {
        println!("{l}");
    }
}
