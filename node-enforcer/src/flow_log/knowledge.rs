//! What the flow log knows about the node's pods: which pod each host
//! interface belongs to, each pod's addresses and plan. Built from the
//! reconciler's dump (interfaces, pods, node addresses) and its checkpoint
//! (the plan with its rules), both of which the enforcer already keeps.
//! `Source` refreshes it before annotating events when the checkpoint
//! changed (the reconciler rewrites it on every plan or pod change, so one
//! `stat` of its directory tells), when an event names an unknown
//! interface (at most a few times a second), or when it is old.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use palisade_proto::v1::{IpPrefix, PlanSnapshot, PodPolicy};

use palisade_ebpf::{FlowEvent, STAT_ALLOWED_LEARNED};

use crate::checkpoint::Checkpoint;
use crate::compile::Prefix;
use crate::desired::PodKey;
use crate::handle::Handle;
use crate::names::report::Report;
use crate::reconciler::Dump;

#[derive(Clone, Debug, Default)]
pub struct Knowledge {
    pub node: String,
    pub by_ifindex: HashMap<u32, PodKey>,
    pub by_ip: HashMap<IpAddr, PodKey>,
    pub plans: HashMap<PodKey, PodPolicy>,
    /// Peers every policy allows (the pod's own node).
    pub node_addresses: Vec<Prefix>,
    /// (host interface, peer) -> the names the pod learned the peer by.
    pub learned: HashMap<(u32, IpAddr), Vec<String>>,
}

impl Knowledge {
    pub fn from_dump(node: &str, dump: &Dump, plan: Option<&PlanSnapshot>) -> Self {
        let key = |r: &palisade_proto::v1::PodRef| (r.namespace.clone(), r.name.clone());
        let mut k = Knowledge {
            node: node.to_string(),
            node_addresses: dump.node_addresses.clone(),
            ..Default::default()
        };
        for i in &dump.interfaces {
            if let Some(pod) = &i.pod {
                k.by_ifindex.insert(i.ifindex, pod.clone());
            }
        }
        for p in &dump.state.pods {
            let Some(pod) = p.pod.as_ref() else { continue };
            for ip in p.pod_ips.iter().filter_map(IpPrefix::ip) {
                k.by_ip.insert(ip, key(pod));
            }
        }
        for p in plan.map(|p| p.pods.as_slice()).unwrap_or_default() {
            if let Some(pod) = p.pod.as_ref() {
                k.plans.insert(key(pod), p.clone());
            }
        }
        k
    }

    /// Indexes what the learner reports: each learned address of each pod
    /// with its names.
    pub fn learn(&mut self, report: &Report) {
        self.learned.clear();
        for pod in &report.pods {
            for (name, addrs) in &pod.names {
                for a in addrs {
                    self.learned
                        .entry((pod.ifindex, a.addr))
                        .or_default()
                        .push(name.clone());
                }
            }
        }
    }
}

/// Refreshes at most this often for events on interfaces it does not know.
const MIN_REFRESH: Duration = Duration::from_millis(200);
/// Asks the learner for names at most this often: its report is cheap, and
/// a learned allow is logged right after the answer that taught it.
const NAMES_MIN_REFRESH: Duration = Duration::from_millis(20);
/// Refreshes at least this often while events keep coming (the node's
/// addresses change without touching the checkpoint).
const MAX_AGE: Duration = Duration::from_secs(10);
/// Longest a refresh may hold up the reader (the reconciler may be busy).
const REFRESH_TIMEOUT: Duration = Duration::from_millis(500);

pub struct Source {
    handle: Handle,
    node: String,
    checkpoint: Option<Checkpoint>,
    plan: Option<PlanSnapshot>,
    knowledge: Knowledge,
    refreshed: Option<Instant>,
    /// When the learner was last asked for names.
    names_refreshed: Option<Instant>,
    /// The state directory's modification time at the last refresh.
    stamps: Stamps,
}

type Stamps = Option<std::time::SystemTime>;

impl Source {
    pub fn new(handle: Handle, node: String, state_dir: &Path) -> Self {
        let checkpoint = Checkpoint::open(state_dir)
            .map_err(|e| tracing::warn!("flow log: no plan rules for annotation: {e}"))
            .ok();
        Source {
            handle,
            knowledge: Knowledge {
                node: node.clone(),
                ..Default::default()
            },
            node,
            checkpoint,
            plan: None,
            refreshed: None,
            names_refreshed: None,
            stamps: None,
        }
    }

    pub fn knowledge(&self) -> &Knowledge {
        &self.knowledge
    }

    /// The state directory's modification time: the checkpoint replaces
    /// its files by rename, which moves it on every plan or pod change.
    fn stamps(&self) -> Stamps {
        self.checkpoint
            .as_ref()
            .and_then(|cp| std::fs::metadata(cp.dir()).and_then(|m| m.modified()).ok())
    }

    /// Whether events on these interfaces call for a refresh first.
    pub fn wants_refresh(&self, ifindexes: impl IntoIterator<Item = u32>, now: Instant) -> bool {
        let Some(at) = self.refreshed else {
            return true;
        };
        let age = now.saturating_duration_since(at);
        // A changed checkpoint always counts: the events may have been
        // judged by the new plan, and plans change far less often than
        // events arrive.
        age >= MAX_AGE
            || self.stamps() != self.stamps
            || (age >= MIN_REFRESH
                && ifindexes
                    .into_iter()
                    .any(|i| !self.knowledge.by_ifindex.contains_key(&i)))
    }

    /// Whether an event allowed by a learned address names a pair the
    /// learner had not reported when last asked (it learned since): then
    /// [`Source::refresh_names`] after the wait returned (zero, or what is
    /// left of [`NAMES_MIN_REFRESH`]: the lines wait for their names
    /// rather than go without). None: no need.
    pub fn names_wait(&self, events: &[FlowEvent], now: Instant) -> Option<Duration> {
        let unknown = self.handle.learning().is_some()
            && events.iter().any(|e| {
                u32::from(e.stat) == STAT_ALLOWED_LEARNED
                    && !self
                        .knowledge
                        .learned
                        .contains_key(&(e.ifindex, learned_peer(e)))
            });
        unknown.then(|| {
            self.names_refreshed.map_or(Duration::ZERO, |at| {
                NAMES_MIN_REFRESH.saturating_sub(now.saturating_duration_since(at))
            })
        })
    }

    /// Asks the learner what each pod learned; on failure or timeout the
    /// old names stay.
    pub async fn refresh_names(&mut self) {
        self.names_refreshed = Some(Instant::now());
        let Some(learning) = self.handle.learning() else {
            return;
        };
        match tokio::time::timeout(REFRESH_TIMEOUT, learning.report()).await {
            Ok(Ok(r)) => self.knowledge.learn(&r),
            Ok(Err(e)) => tracing::debug!("flow log: {e}"),
            Err(_) => tracing::debug!("flow log: the learner's report took too long"),
        }
    }

    /// Re-reads the dump, and the checkpointed plan when its version moved.
    /// On failure or timeout the old knowledge stays.
    pub async fn refresh(&mut self) {
        self.refreshed = Some(Instant::now());
        self.stamps = self.stamps();
        let dump = match tokio::time::timeout(REFRESH_TIMEOUT, self.handle.dump()).await {
            Ok(Ok(d)) => d,
            failed => {
                match failed {
                    Ok(Err(e)) => tracing::debug!("flow log: dump: {e}"),
                    _ => tracing::debug!("flow log: the dump took too long"),
                }
                // The names come from the learner, not the reconciler.
                return self.refresh_names().await;
            }
        };
        let held = self.plan.as_ref().map(|p| p.version);
        if held != Some(dump.plan_version) {
            if let Some(cp) = &self.checkpoint {
                let dir = cp.dir().to_path_buf();
                let loaded = tokio::task::spawn_blocking(move || {
                    Checkpoint::open(&dir).and_then(|c| c.load())
                })
                .await;
                match loaded {
                    Ok(Ok(saved)) => {
                        if let Some(plan) = saved.plan {
                            tracing::debug!(
                                version = plan.version,
                                pods = plan.pods.len(),
                                "flow log: plan rules loaded"
                            );
                            self.plan = Some(plan);
                        }
                    }
                    Ok(Err(e)) => tracing::warn!("flow log: reading the plan's rules: {e}"),
                    Err(e) => tracing::warn!("flow log: reading the plan's rules: {e}"),
                }
            }
        }
        self.knowledge = Knowledge::from_dump(&self.node, &dump, self.plan.as_ref());
        self.refresh_names().await;
    }
}

/// The peer a learned-address allow names: the destination (only egress
/// consults what was learned).
fn learned_peer(e: &FlowEvent) -> IpAddr {
    super::annotate::address(e.dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::InterfaceDump;
    use palisade_proto::v1::{NodeState, PodRef, PodState};

    fn pod_ref(name: &str) -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn interfaces_addresses_and_plans_are_indexed_by_pod() {
        let key = |n: &str| ("ns".to_string(), n.to_string());
        let dump = Dump {
            state: NodeState {
                pods: vec![PodState {
                    pod: Some(pod_ref("web")),
                    pod_ips: vec![
                        IpPrefix {
                            addr: vec![10, 244, 0, 5],
                            prefix_len: 32,
                        },
                        IpPrefix {
                            addr: "fd00::5"
                                .parse::<std::net::Ipv6Addr>()
                                .unwrap()
                                .octets()
                                .to_vec(),
                            prefix_len: 128,
                        },
                        IpPrefix {
                            addr: vec![1, 2, 3],
                            prefix_len: 24,
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            },
            interfaces: vec![
                InterfaceDump {
                    name: "veth-web".into(),
                    ifindex: 7,
                    pod: Some(key("web")),
                    ingress: String::new(),
                    egress: String::new(),
                    ..Default::default()
                },
                InterfaceDump {
                    name: "veth-lost".into(),
                    ifindex: 9,
                    pod: None,
                    ingress: String::new(),
                    egress: String::new(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let plan = PlanSnapshot {
            pods: vec![PodPolicy {
                pod: Some(pod_ref("web")),
                policies: vec!["ns/p".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let k = Knowledge::from_dump("node-1", &dump, Some(&plan));
        assert_eq!(k.node, "node-1");
        assert_eq!(k.by_ifindex.get(&7), Some(&key("web")));
        assert_eq!(k.by_ifindex.get(&9), None, "no pod explains it");
        assert_eq!(
            k.by_ip.get(&"10.244.0.5".parse().unwrap()),
            Some(&key("web"))
        );
        assert_eq!(k.by_ip.get(&"fd00::5".parse().unwrap()), Some(&key("web")));
        assert_eq!(k.by_ip.len(), 2, "a malformed address is skipped");
        assert_eq!(k.plans[&key("web")].policies, ["ns/p"]);
        assert!(Knowledge::from_dump("node-1", &dump, None).plans.is_empty());
    }

    #[tokio::test]
    async fn a_learned_allow_of_a_pair_not_yet_known_asks_the_learner_first() {
        use crate::names::report::{LearnedAddr, Learning, PodReport};
        use palisade_ebpf::{FLOW_ALLOWED, HOOK_FROM_POD, STAT_ALLOWED_POLICY};
        let (tx, _events) = tokio::sync::mpsc::channel(1);
        let (learner_tx, mut learner_rx) = tokio::sync::mpsc::channel(1);
        let handle = Handle::new(tx, Duration::from_secs(1))
            .with_learning(Learning::new(vec![], learner_tx));
        let dir = tempfile::tempdir().unwrap();
        let mut source = Source::new(handle, "n1".into(), dir.path());
        // The learner: api.example.com is 192.0.2.1 for interface 7.
        tokio::spawn(async move {
            while let Some(reply) = learner_rx.recv().await {
                let _ = reply.send(Report {
                    pods: vec![PodReport {
                        ifindex: 7,
                        names: vec![(
                            "api.example.com".into(),
                            vec![LearnedAddr {
                                addr: "192.0.2.1".parse().unwrap(),
                                expiry: 1,
                            }],
                        )],
                        adopted: vec![],
                    }],
                    ..Default::default()
                });
            }
        });
        let event = |stat: u32| FlowEvent {
            ifindex: 7,
            kind: FLOW_ALLOWED,
            hook: HOOK_FROM_POD,
            stat: stat as u8,
            dst: std::net::Ipv4Addr::new(192, 0, 2, 1)
                .to_ipv6_mapped()
                .octets(),
            ..Default::default()
        };
        let now = Instant::now();
        assert_eq!(
            source.names_wait(&[event(STAT_ALLOWED_POLICY)], now),
            None,
            "not learned"
        );
        assert_eq!(
            source.names_wait(&[event(STAT_ALLOWED_LEARNED)], now),
            Some(Duration::ZERO)
        );
        source.refresh_names().await;
        let key = (7, "192.0.2.1".parse().unwrap());
        assert_eq!(source.knowledge().learned[&key], ["api.example.com"]);
        // Known now: no need to ask again.
        let later = Instant::now() + NAMES_MIN_REFRESH;
        assert_eq!(
            source.names_wait(&[event(STAT_ALLOWED_LEARNED)], later),
            None
        );
        // An unknown pair right after asking waits its turn, never goes
        // without.
        let mut other = event(STAT_ALLOWED_LEARNED);
        other.dst = std::net::Ipv4Addr::new(192, 0, 2, 9)
            .to_ipv6_mapped()
            .octets();
        let wait = source
            .names_wait(&[other], Instant::now())
            .expect("asked for");
        assert!(
            wait > Duration::ZERO && wait <= NAMES_MIN_REFRESH,
            "{wait:?}"
        );
        assert_eq!(source.names_wait(&[other], later), Some(Duration::ZERO));
    }

    #[test]
    fn learned_addresses_are_indexed_by_interface_and_peer_with_their_names() {
        use crate::names::report::{LearnedAddr, PodReport};
        let at = |a: &str| LearnedAddr {
            addr: a.parse().unwrap(),
            expiry: 1,
        };
        let report = Report {
            pods: vec![
                PodReport {
                    ifindex: 7,
                    names: vec![
                        ("api.example.com".into(), vec![at("192.0.2.1")]),
                        (
                            "www.example.com".into(),
                            vec![at("192.0.2.1"), at("192.0.2.2")],
                        ),
                    ],
                    adopted: vec![at("192.0.2.9")],
                },
                PodReport {
                    ifindex: 8,
                    names: vec![("api.example.com".into(), vec![at("192.0.2.1")])],
                    adopted: vec![],
                },
            ],
            ..Default::default()
        };
        let mut k = Knowledge::default();
        k.learn(&report);
        let names = |i: u32, a: &str| k.learned.get(&(i, a.parse().unwrap())).cloned();
        assert_eq!(
            names(7, "192.0.2.1"),
            Some(vec!["api.example.com".into(), "www.example.com".into()])
        );
        assert_eq!(names(7, "192.0.2.2"), Some(vec!["www.example.com".into()]));
        assert_eq!(names(8, "192.0.2.1"), Some(vec!["api.example.com".into()]));
        assert_eq!(
            names(8, "192.0.2.2"),
            None,
            "what one pod learned is its own"
        );
        assert_eq!(names(7, "192.0.2.9"), None, "adopted: no name");
        k.learn(&Report::default());
        assert!(k.learned.is_empty(), "a new report replaces the old");
    }
}
