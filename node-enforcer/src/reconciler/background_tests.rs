//! Big policies compiled off the reconciler's thread and written in slices
//! (issue 18): other pods start meanwhile, the big policy's pods stay held
//! or denied until the table is complete, and the enforcer's own table
//! limit denies a direction with an error naming the policy.

use super::*;
use crate::datapath::fake::FakeDatapath;
use crate::desired::PodRuntime;
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule};
use palisade_proto::v1::{PlanSnapshot, PodRef};

/// `n` rules, each one /32 peer in 172.16.0.0/16 on TCP 80, from x/big.
fn big(n: usize) -> DirectionPolicy {
    DirectionPolicy {
        rules: (0..n)
            .map(|i| Rule {
                peers: vec![PeerBlock {
                    cidr: Some(IpPrefix {
                        addr: vec![172, 16, (i >> 8) as u8, i as u8],
                        prefix_len: 32,
                    }),
                    except: vec![],
                }],
                ports: vec![PortRange {
                    protocol: Protocol::Tcp as i32,
                    port: 80,
                    end_port: 0,
                }],
                policy: "x/big".into(),
                rule_index: i as u32,
            })
            .collect(),
    }
}

fn pod(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: name.into(),
        }),
        ingress,
        policies: vec!["x/big".into()],
        ..Default::default()
    }
}

fn up(name: &str, iface: &str) -> PodUp {
    PodUp {
        pod: ("x".into(), name.into()),
        runtime: PodRuntime {
            container_id: format!("c-{name}"),
            netns: String::new(),
            host_interfaces: vec![iface.into()],
            ips: vec![],
            ifindexes: Default::default(),
            mode: None,
        },
    }
}

fn snapshot(version: u64, pods: Vec<PodPolicy>) -> PlanMessage {
    PlanMessage::Snapshot(PlanSnapshot {
        version,
        pods,
        source_synced: true,
        ..Default::default()
    })
}

/// The reconciler's queue, and the sender that keeps it open as the
/// enforcer's servers do (the worker's own is weak).
struct Events {
    rx: mpsc::Receiver<Event>,
    _tx: mpsc::Sender<Event>,
}

impl Events {
    fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

/// A reconciler whose policies of `threshold` peers or more go to the
/// worker thread.
fn reconciler(threshold: usize) -> (Reconciler<FakeDatapath>, Events) {
    let (tx, rx) = mpsc::channel(16);
    let r = Reconciler::new(
        "n1".into(),
        "e1".into(),
        FakeDatapath::with_interfaces(&["veth-a", "veth-b"]),
    )
    .with_background_compile(tx.clone(), threshold)
    .unwrap();
    (r, Events { rx, _tx: tx })
}

/// Hands the worker's result to the reconciler, then writes the table a
/// slice at a time as `run` does between events, checking `each` after
/// every slice; returns how many slices it took.
fn finish(
    r: &mut Reconciler<FakeDatapath>,
    rx: &mut Events,
    mut each: impl FnMut(&Reconciler<FakeDatapath>),
) -> usize {
    while r.background.compiling_count() > 0 {
        let event = rx.blocking_recv().expect("the worker answers");
        assert!(matches!(event, Event::Compiled { .. }));
        r.handle(event);
    }
    let mut slices = 0;
    while r.background.has_writes() {
        each(r);
        r.write_slice();
        slices += 1;
    }
    slices
}

#[test]
fn other_pods_start_while_a_big_policy_compiles_and_its_pod_waits_denied() {
    let (mut r, mut rx) = reconciler(1000);
    r.apply_plan(snapshot(1, vec![pod("a", Some(big(5000))), pod("b", None)]))
        .unwrap();

    let (tx_a, mut rx_a) = tokio::sync::oneshot::channel();
    r.pod_up(up("a", "veth-a"), tx_a);
    assert!(rx_a.try_recv().is_err(), "a's pod-up waits for its table");
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));

    // The unselected pod is answered at once, open.
    let (tx_b, mut rx_b) = tokio::sync::oneshot::channel();
    r.pod_up(up("b", "veth-b"), tx_b);
    let b = rx_b.try_recv().expect("answered at once").unwrap();
    assert!(b.realized && !b.ingress_isolated);
    assert_eq!(r.datapath.endpoint_of("veth-b"), Some((0, 0)));

    // The dump answers and says why a waits.
    let dump = r.dump();
    assert!(
        dump.state.errors.iter().any(|e| e.contains("x/a")
            && e.contains("5000 peers")
            && e.contains("not realized yet")),
        "{:?}",
        dump.state.errors
    );

    let slices = finish(&mut r, &mut rx, |r| {
        // Never half-open: denied until the table is complete.
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));
        r.datapath.assert_no_violations();
    });
    assert_eq!(slices, 5000usize.div_ceil(SLICE_ENTRIES));
    let a = rx_a.try_recv().expect("answered once complete").unwrap();
    assert!(a.realized && a.ingress_isolated);
    let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
    assert_ne!(id, DENY_ALL);
    assert!(r.datapath.policies[&id].len() >= 5000);
    assert_eq!(r.plan.realized_version, 1);
    assert!(
        r.node_state().errors.is_empty(),
        "{:?}",
        r.node_state().errors
    );
    r.datapath.assert_no_violations();
}

#[test]
fn a_pod_keeps_its_old_table_until_the_big_one_is_complete() {
    let (mut r, mut rx) = reconciler(1000);
    r.apply_plan(snapshot(1, vec![pod("a", Some(big(10)))]))
        .unwrap();
    let (tx, mut answer) = tokio::sync::oneshot::channel();
    r.pod_up(up("a", "veth-a"), tx);
    assert!(answer.try_recv().unwrap().is_ok());
    let (old, _) = r.datapath.endpoint_of("veth-a").unwrap();

    r.apply_plan(snapshot(2, vec![pod("a", Some(big(3000)))]))
        .unwrap();
    assert_eq!(
        r.plan.realized_version, 1,
        "not realized while a table is missing"
    );
    finish(&mut r, &mut rx, |r| {
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((old, 0)), "held");
        assert!(r.datapath.policies.contains_key(&old));
    });
    let (new, _) = r.datapath.endpoint_of("veth-a").unwrap();
    assert_ne!(new, old);
    assert!(
        !r.datapath.policies.contains_key(&old),
        "old table goes last"
    );
    assert_eq!(r.plan.realized_version, 2);
    r.datapath.assert_no_violations();
}

#[test]
fn a_pod_whose_table_is_not_complete_at_its_deadline_starts_denied_never_open() {
    let (mut r, mut rx) = reconciler(1000);
    r.apply_plan(snapshot(1, vec![pod("a", Some(big(2000)))]))
        .unwrap();
    let (tx, mut answer) = tokio::sync::oneshot::channel();
    r.pod_up(up("a", "veth-a"), tx);
    r.pod_up_deadline(&("x".into(), "a".into()), "c-a");
    let out = answer.try_recv().unwrap().unwrap();
    assert!(!out.realized);
    assert!(out.warning.contains("starts denied"), "{}", out.warning);
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));
    finish(&mut r, &mut rx, |_| {});
    let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
    assert_ne!(id, DENY_ALL, "realized once complete");
}

#[test]
fn a_table_over_the_limit_denies_its_pods_and_names_the_policy() {
    for threshold in [50, usize::MAX] {
        let (r, mut rx) = reconciler(threshold);
        let mut r = r.with_max_table_entries(100);
        r.apply_plan(snapshot(
            1,
            vec![pod("a", Some(big(101))), pod("b", Some(big(100)))],
        ))
        .unwrap();
        let (tx, mut answer_a) = tokio::sync::oneshot::channel();
        r.pod_up(up("a", "veth-a"), tx);
        let (tx, mut answer_b) = tokio::sync::oneshot::channel();
        r.pod_up(up("b", "veth-b"), tx);
        finish(&mut r, &mut rx, |_| {});
        answer_a.try_recv().unwrap().unwrap();
        answer_b.try_recv().unwrap().unwrap();
        // a: only the node (the deny table of a direction that cannot be
        // compiled); b, at the limit, has its policy.
        let (ia, _) = r.datapath.endpoint_of("veth-a").unwrap();
        let (ib, _) = r.datapath.endpoint_of("veth-b").unwrap();
        assert!(r.datapath.policies.get(&ia).is_none_or(|t| t.len() < 100));
        assert_eq!(r.datapath.policies[&ib].len(), 100);
        let errors = r.node_state().errors;
        assert!(
            errors.iter().any(|e| e.contains("x/a")
                && e.contains("101 entries")
                && e.contains("NetworkPolicy x/big")
                && e.contains("--max-table-entries")),
            "{errors:?}"
        );
        assert!(!errors.iter().any(|e| e.contains("of x/b ")), "{errors:?}");
        r.datapath.assert_no_violations();
    }
}

#[test]
fn the_reconciler_ends_when_its_last_sender_goes_though_the_worker_runs() {
    let (tx, rx) = mpsc::channel(16);
    let r = Reconciler::new(
        "n1".into(),
        "e1".into(),
        FakeDatapath::with_interfaces(&["veth-a"]),
    )
    .with_background_compile(tx.clone(), 1)
    .unwrap();
    let (state_tx, _state) = tokio::sync::watch::channel(NodeState::default());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        r.run(rx, state_tx);
        let _ = done_tx.send(());
    });
    drop(tx);
    done_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("run returns once every sender but the worker's is gone");
}
