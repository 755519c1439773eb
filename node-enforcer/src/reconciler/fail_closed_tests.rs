//! One test per fail-open path the enforcer once had: each drives the
//! reconciler the way the bug was reproduced and checks the verdict the
//! datapath would give (the endpoint entry), not just an error string.

use super::realized::Realized;
use super::*;
use crate::datapath::fake::FakeDatapath;
use crate::desired::PodRuntime;
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, Rule};
use palisade_proto::v1::{PlanSnapshot, PodRef};
use tokio::sync::oneshot;

fn pod_policy(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: name.into(),
        }),
        ingress,
        ..Default::default()
    }
}

fn deny_all() -> Option<DirectionPolicy> {
    Some(DirectionPolicy { rules: vec![] })
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

fn snapshot(version: u64, synced: bool, pods: Vec<PodPolicy>) -> PlanMessage {
    PlanMessage::Snapshot(PlanSnapshot {
        term: 0,
        version,
        pods,
        source_synced: synced,
        ..Default::default()
    })
}

fn reconciler(mode: Mode) -> Reconciler<FakeDatapath> {
    Reconciler::new(
        "n1".into(),
        "e1".into(),
        FakeDatapath::with_interfaces(&["veth-a", "veth-b", "br0"]),
    )
    .with_mode(mode)
}

type Answer = oneshot::Receiver<Result<PodUpOutcome, String>>;

fn start_up(r: &mut Reconciler<FakeDatapath>, u: PodUp) -> Answer {
    let (tx, rx) = oneshot::channel();
    r.pod_up(u, tx);
    rx
}

fn now(rx: &mut Answer) -> Result<PodUpOutcome, String> {
    rx.try_recv().expect("answered")
}

/// 5.1: an ADD naming another pod's live interface (the bridge itself, say)
/// is refused and changes nothing; the other pod stays enforced.
#[test]
fn an_add_claiming_another_pods_interface_changes_nothing() {
    let mut r = reconciler(Mode::Standard);
    r.apply_plan(snapshot(
        1,
        true,
        vec![pod_policy("a", deny_all()), pod_policy("b", None)],
    ))
    .unwrap();
    now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
    let before = (r.datapath.endpoints.clone(), r.datapath.attached.clone());
    let mut bad = up("b", "veth-b");
    bad.runtime.host_interfaces.push("veth-a".into());
    let err = now(&mut start_up(&mut r, bad)).unwrap_err();
    assert!(err.contains("veth-a") && err.contains("x/a"), "{err}");
    assert_eq!(
        before,
        (r.datapath.endpoints.clone(), r.datapath.attached.clone())
    );
    assert_eq!(r.node_state().pods.len(), 1);
    // A refused ADD for a pod that failed to attach also restores the rest.
    r.datapath.fail.insert("attach veth-b".into());
    assert!(now(&mut start_up(&mut r, up("b", "veth-b"))).is_err());
    assert_eq!(
        before,
        (r.datapath.endpoints.clone(), r.datapath.attached.clone())
    );
    r.datapath.assert_no_violations();
}

/// 5.3: a snapshot from a controller that has not synced is refused; the
/// node keeps its policy; a snapshot dropping every policy is loud.
#[test]
fn an_unsynced_snapshot_is_refused_and_a_wipe_is_loud() {
    let mut r = reconciler(Mode::Standard);
    r.apply_plan(snapshot(1, true, vec![pod_policy("a", deny_all())]))
        .unwrap();
    now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
    let enforced = r.datapath.endpoint_of("veth-a").unwrap();
    assert_ne!(enforced.0, 0);
    assert_eq!(
        r.apply_plan(snapshot(9, false, vec![pod_policy("a", None)])),
        Err(PlanError::NotSynced(9))
    );
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some(enforced));
    assert!(r.dump().warnings.iter().any(|w| w.contains("not synced")));
    r.apply_plan(snapshot(10, true, vec![pod_policy("a", None)]))
        .unwrap();
    assert!(r
        .dump()
        .warnings
        .iter()
        .any(|w| w.contains("drops every policy")));
}

/// 5.4: a pod the plan does not know yet is attached denied and its ADD
/// waits; the plan's arrival answers it. At the deadline strict refuses
/// (and leaves nothing), standard starts it open but visibly unprotected.
#[test]
fn a_new_pod_waits_denied_and_the_deadline_depends_on_the_mode() {
    for mode in [Mode::Standard, Mode::Strict] {
        let mut r = reconciler(mode);
        let (fetch_tx, mut fetch_rx) = tokio::sync::mpsc::unbounded_channel();
        r = r.with_fetcher(fetch_tx);
        r.handle(Event::PlanConnected(true));
        r.apply_plan(snapshot(1, true, vec![])).unwrap();
        let mut answer = start_up(&mut r, up("a", "veth-a"));
        assert!(answer.try_recv().is_err(), "{mode}: must wait");
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, DENY_ALL)));
        assert_eq!(
            fetch_rx.try_recv().unwrap(),
            ("x".to_string(), "a".to_string())
        );
        // The plan delivers it: answered, enforced.
        r.apply_plan(snapshot(2, true, vec![pod_policy("a", None)]))
            .unwrap();
        let out = now(&mut answer).unwrap();
        assert!(out.realized);
        let expect_open = mode == Mode::Standard;
        assert_eq!(
            r.datapath.endpoint_of("veth-a").unwrap().0 == 0,
            expect_open,
            "{mode}"
        );

        // Another pod whose policy never comes.
        let mut answer = start_up(&mut r, up("b", "veth-b"));
        r.handle(Event::PodUpDeadline {
            pod: ("x".into(), "b".into()),
            container_id: "c-b".into(),
        });
        match mode {
            Mode::Strict => {
                let e = now(&mut answer).unwrap_err();
                assert!(
                    e.contains("strict") && e.contains("does not list x/b"),
                    "{e}"
                );
                assert!(!r.datapath.attached.contains("veth-b"));
                assert_eq!(r.node_state().pods.len(), 1);
            }
            Mode::Standard => {
                let out = now(&mut answer).unwrap();
                assert!(!out.realized && out.warning.contains("UNPROTECTED"));
                assert_eq!(r.datapath.endpoint_of("veth-b"), Some((0, 0)));
                let state = r.node_state();
                let b = state
                    .pods
                    .iter()
                    .find(|p| p.pod.as_ref().unwrap().name == "b")
                    .unwrap();
                assert!(b.error.contains("UNPROTECTED"), "{}", b.error);
            }
        }
        r.datapath.assert_no_violations();
    }
}

/// 5.4: the on-demand fetch answers a waiting pod before the stream does.
#[test]
fn a_fetched_pod_plan_answers_the_wait() {
    let mut r = reconciler(Mode::Strict);
    r.apply_plan(snapshot(1, true, vec![])).unwrap();
    let mut answer = start_up(&mut r, up("a", "veth-a"));
    r.handle(Event::PodPlanFetched {
        pod: ("x".into(), "a".into()),
        policy: Some(pod_policy("a", deny_all())),
    });
    assert!(now(&mut answer).unwrap().ingress_isolated);
    // The stream catching up replaces it, without a window.
    r.apply_plan(snapshot(2, true, vec![pod_policy("a", deny_all())]))
        .unwrap();
    assert!(r.plan.fetched.is_empty());
    r.datapath.assert_no_violations();
}

/// 5.5: a pod recreated with the same interface name (a new index) is
/// attached to the new interface; a late name-only delete of the old pod
/// does not tear the new one down.
#[test]
fn a_recreated_interface_is_attached_and_a_late_delete_spares_it() {
    let mut r = reconciler(Mode::Standard);
    r.apply_plan(snapshot(1, true, vec![pod_policy("a", deny_all())]))
        .unwrap();
    let mut first = up("a", "veth-a");
    first.runtime.container_id = String::new();
    now(&mut start_up(&mut r, first.clone())).unwrap();
    let attaches = r
        .datapath
        .log
        .iter()
        .filter(|l| l.starts_with("attach veth-a"))
        .count();
    // The StatefulSet pod is recreated: same name, new veth (new index).
    r.datapath.interfaces.insert("veth-a".into(), 30);
    now(&mut start_up(&mut r, first)).unwrap();
    let attaches_after = r
        .datapath
        .log
        .iter()
        .filter(|l| l.starts_with("attach veth-a"))
        .count();
    assert_eq!(
        attaches_after,
        attaches + 1,
        "the new interface got programs"
    );
    assert!(r.datapath.endpoints.contains_key(&30));
    assert!(!r.datapath.endpoints.contains_key(&10));
    // The old pod's DeletePodNp arrives late.
    r.pod_down(Some(("x".into(), "a".into())), "").unwrap();
    assert!(r.datapath.attached.contains("veth-a"));
    assert_ne!(r.datapath.endpoints[&30].ingress, 0);
    // Once the interface really goes, the pod goes.
    r.datapath.interfaces.remove("veth-a");
    r.handle(Event::Links);
    assert!(r.node_state().pods.is_empty());
    r.datapath.assert_no_violations();
}

/// 5.8: a failed detach keeps the endpoint entry (a program without one
/// passes everything) and says so.
#[test]
fn a_failed_detach_keeps_the_entry() {
    let mut r = reconciler(Mode::Standard);
    r.apply_plan(snapshot(1, true, vec![pod_policy("a", deny_all())]))
        .unwrap();
    now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
    r.datapath.fail.insert("detach veth-a".into());
    r.pod_down(Some(("x".into(), "a".into())), "c-a").unwrap();
    assert!(r.datapath.attached.contains("veth-a"));
    assert!(r.datapath.endpoint_of("veth-a").is_some());
    assert!(r
        .node_state()
        .errors
        .iter()
        .any(|e| e.contains("detaching veth-a")));
    r.datapath.assert_no_violations();
    r.datapath.fail.clear();
    r.handle(Event::Tick);
    r.datapath.assert_empty();
}

/// 5.8: table ids never wrap into 0 (not isolated) or DENY_ALL.
#[test]
fn policy_ids_skip_zero_and_deny_all_when_they_wrap() {
    let mut realized = Realized {
        next_policy: DENY_ALL - 2,
        ..Realized::default()
    };
    let ids: Vec<PolicyId> = (0..3).map(|_| realized.alloc_policy().unwrap()).collect();
    assert_eq!(ids, vec![DENY_ALL - 1, 1, 2]);
}

/// 5.9: a policy that cannot be compiled, and a table that cannot be
/// written, each leave the pod denied (checked on the entry; the eBPF tests
/// check what such an entry does to a real packet).
#[test]
fn an_uncompilable_or_unwritable_policy_denies() {
    let broken = DirectionPolicy {
        rules: vec![Rule {
            peers: vec![PeerBlock {
                cidr: Some(IpPrefix {
                    addr: vec![1, 2, 3],
                    prefix_len: 8,
                }),
                except: vec![],
            }],
            ports: vec![],
            ..Default::default()
        }],
    };
    let mut r = reconciler(Mode::Standard);
    r.apply_plan(snapshot(1, true, vec![pod_policy("a", None)]))
        .unwrap();
    now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
    r.apply_plan(snapshot(2, true, vec![pod_policy("a", Some(broken))]))
        .unwrap();
    let (ingress, _) = r.datapath.endpoint_of("veth-a").unwrap();
    assert_ne!(ingress, 0, "a broken policy must not leave the pod open");
    assert!(r.datapath.policies[&ingress].is_empty(), "deny-all table");

    let mut r = reconciler(Mode::Standard);
    r.apply_plan(snapshot(1, true, vec![pod_policy("a", None)]))
        .unwrap();
    now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
    r.datapath.fail.insert("add_policy".into());
    r.apply_plan(snapshot(2, true, vec![pod_policy("a", deny_all())]))
        .unwrap();
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));
    assert!(r.node_state().pods[0].error.contains("not written"));
    r.datapath.assert_no_violations();
}

/// 5.8: the plan is saved before the datapath changes.
#[test]
fn the_plan_is_saved_before_the_datapath_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(Mode::Standard)
        .with_checkpoint(crate::checkpoint::Checkpoint::open(dir.path()).unwrap());
    r.apply_plan(snapshot(1, true, vec![pod_policy("a", None)]))
        .unwrap();
    now(&mut start_up(&mut r, up("a", "veth-a"))).unwrap();
    // Every datapath write fails: the plan must still be on disk.
    r.datapath.fail.insert("".into());
    r.apply_plan(snapshot(2, true, vec![pod_policy("a", deny_all())]))
        .unwrap();
    let saved = crate::checkpoint::Checkpoint::open(dir.path())
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(saved.plan.unwrap().version, 2);
}
