use super::*;
use crate::checkpoint::Checkpoint;
use crate::datapath::fake::FakeDatapath;
use crate::datapath::EndpointEntry;
use crate::desired::PodRuntime;
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule};
use palisade_proto::v1::{PlanDelta, PlanSnapshot, PodRef};
use std::collections::BTreeSet;

fn ip4(a: [u8; 4], len: u32) -> IpPrefix {
    IpPrefix {
        addr: a.to_vec(),
        prefix_len: len,
    }
}

fn allow_from(peer: [u8; 4], port: u32) -> DirectionPolicy {
    DirectionPolicy {
        rules: vec![Rule {
            peers: vec![PeerBlock {
                cidr: Some(ip4(peer, 32)),
                except: vec![],
            }],
            ports: vec![PortRange {
                protocol: Protocol::Tcp as i32,
                port,
                end_port: 0,
            }],
            ..Default::default()
        }],
    }
}

fn pod_policy(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: name.into(),
        }),
        pod_ips: vec![],
        ingress,
        egress: None,
        policies: vec!["x/p".into()],
        ..Default::default()
    }
}

fn up(name: &str, iface: &str) -> PodUp {
    PodUp {
        pod: ("x".into(), name.into()),
        runtime: PodRuntime {
            container_id: format!("c-{name}"),
            netns: format!("/run/netns/{name}"),
            host_interfaces: vec![iface.into()],
            ips: vec![],
            ifindexes: Default::default(),
            mode: None,
        },
    }
}

fn snapshot(version: u64, pods: Vec<PodPolicy>) -> PlanMessage {
    PlanMessage::Snapshot(PlanSnapshot {
        term: 0,
        version,
        pods,
        source_synced: true,
        ..Default::default()
    })
}

/// Pod up that must be answered at once (its policy is known).
fn up_now(r: &mut Reconciler<FakeDatapath>, u: PodUp) -> Result<PodUpOutcome, String> {
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    r.pod_up(u, tx);
    rx.try_recv().expect("pod up answered at once")
}

/// A plan entry for a pod no policy selects.
fn unselected(name: &str) -> PodPolicy {
    PodPolicy {
        policies: vec![],
        ..pod_policy(name, None)
    }
}

fn reconciler() -> Reconciler<FakeDatapath> {
    Reconciler::new(
        "n1".into(),
        "e1".into(),
        FakeDatapath::with_interfaces(&["veth-a", "veth-b", "veth-c", "veth-d"]),
    )
}

#[test]
fn unselected_pod_is_attached_and_open() {
    let mut r = reconciler();
    r.apply_plan(snapshot(1, vec![unselected("a")])).unwrap();
    let out = up_now(&mut r, up("a", "veth-a")).unwrap();
    assert!(!out.ingress_isolated);
    assert!(r.datapath.attached.contains("veth-a"));
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
    r.datapath.assert_no_violations();
}

#[test]
fn replicas_with_equal_policy_share_one_table_until_the_last_goes() {
    let mut r = reconciler();
    r.apply_plan(snapshot(
        1,
        vec![
            pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
            pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
        ],
    ))
    .unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    up_now(&mut r, up("b", "veth-b")).unwrap();
    let (ia, _) = r.datapath.endpoint_of("veth-a").unwrap();
    let (ib, _) = r.datapath.endpoint_of("veth-b").unwrap();
    assert_eq!(ia, ib, "same content, same table");
    assert_eq!(r.datapath.policies.len(), 1);
    // Seed 000/001: deleting one replica must not take the table from the other.
    r.pod_down(Some(("x".into(), "a".into())), "c-a").unwrap();
    assert_eq!(r.datapath.policies.len(), 1);
    assert_eq!(r.datapath.endpoint_of("veth-b"), Some((ib, 0)));
    r.pod_down(None, "c-b").unwrap();
    r.datapath.assert_empty();
    r.datapath.assert_no_violations();
}

/// The new-id path (in-place edits, which would take these host-only
/// changes, are tested in `in_place`).
#[test]
fn policy_change_is_make_before_break() {
    let mut r = reconciler().with_in_place_edits(false);
    r.apply_plan(snapshot(0, vec![unselected("a")])).unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    for (v, port) in [(1, 80), (2, 81), (3, 82)] {
        r.apply_plan(snapshot(
            v,
            vec![pod_policy("a", Some(allow_from([10, 0, 0, 9], port)))],
        ))
        .unwrap();
    }
    assert_eq!(r.datapath.policies.len(), 1, "old tables removed");
    // Every step in the log was checked by the fake: no endpoint ever pointed
    // at a missing table, no program ran without its entry.
    r.datapath.assert_no_violations();
    let log = r.datapath.log.join("\n");
    let add = log.find("add_policy 3").unwrap();
    let switch = log.find("set_endpoint 10 3 0").unwrap();
    let remove = log.find("remove_policy 2").unwrap();
    assert!(add < switch && switch < remove, "{log}");
}

#[test]
fn delete_of_an_old_sandbox_keeps_the_new_one() {
    let mut r = reconciler();
    r.apply_plan(snapshot(1, vec![unselected("a")])).unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    let mut again = up("a", "veth-b");
    again.runtime.container_id = "c-a2".into();
    up_now(&mut r, again).unwrap();
    r.pod_down(Some(("x".into(), "a".into())), "c-a").unwrap();
    assert!(r.datapath.attached.contains("veth-b"));
    assert!(!r.datapath.attached.contains("veth-a"));
}

#[test]
fn an_interface_reused_by_a_new_pod_belongs_to_it() {
    let mut r = reconciler();
    r.apply_plan(snapshot(
        1,
        vec![pod_policy("a", Some(allow_from([10, 0, 0, 9], 80)))],
    ))
    .unwrap();
    r.apply_plan(snapshot(
        2,
        vec![
            pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
            unselected("b"),
        ],
    ))
    .unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    // x/a's DEL never came; its veth was deleted and a new one with the same
    // name (a new index) belongs to x/b, unselected.
    r.datapath.interfaces.insert("veth-a".into(), 20);
    up_now(&mut r, up("b", "veth-a")).unwrap();
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
    let pods: Vec<String> = r
        .node_state()
        .pods
        .iter()
        .map(|p| p.pod.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(pods, vec!["b"]);
    assert!(r.datapath.policies.is_empty());
    r.datapath.assert_no_violations();
}

#[test]
fn failed_attach_leaves_nothing_behind_and_names_the_interface() {
    let mut r = reconciler();
    r.datapath.fail_attach.insert("veth-a".into());
    let err = up_now(&mut r, up("a", "veth-a")).unwrap_err();
    assert!(err.contains("veth-a"), "{err}");
    assert!(r.datapath.endpoints.is_empty());
    assert!(r.node_state().pods.is_empty());
    let err = up_now(&mut r, up("b", "nope")).unwrap_err();
    assert!(err.contains("\"nope\" does not exist"), "{err}");
}

#[test]
fn invalid_requests_are_refused_before_touching_anything() {
    let mut r = reconciler();
    let mut bad = up("a", "veth-a");
    bad.runtime.host_interfaces = vec!["../../etc".into()];
    assert!(up_now(&mut r, bad)
        .unwrap_err()
        .contains("not a valid interface name"));
    let mut bad = up("a", "veth-a");
    bad.runtime.host_interfaces.clear();
    assert!(up_now(&mut r, bad)
        .unwrap_err()
        .contains("no host interface"));
    assert!(r.datapath.log.is_empty());
}

#[test]
fn uncompilable_policy_denies_instead_of_opening() {
    let mut r = reconciler();
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
    r.apply_plan(snapshot(1, vec![pod_policy("a", Some(broken))]))
        .unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    // Denied (only the node may reach it), never opened, and visibly so.
    let (ingress, egress) = r.datapath.endpoint_of("veth-a").unwrap();
    assert_ne!(ingress, 0);
    assert_eq!(egress, 0);
    assert!(r.datapath.policies[&ingress].is_empty(), "deny-all table");
    let err = &r.node_state().pods[0].error;
    assert!(err.contains("ingress policy of x/a"), "{err}");
}

#[test]
fn deltas_must_follow_the_version_held() {
    let mut r = reconciler();
    let d = PlanDelta {
        term: 0,
        base_version: 5,
        version: 6,
        upserted: vec![],
        removed: vec![],
        ..Default::default()
    };
    assert!(matches!(
        r.apply_plan(PlanMessage::Delta(d.clone())),
        Err(PlanError::OutOfSequence { .. })
    ));
    r.apply_plan(snapshot(5, vec![])).unwrap();
    assert_eq!(r.apply_plan(PlanMessage::Delta(d)).unwrap(), 6);
    assert_eq!(r.node_state().realized_version, 6);
}

/// Invariant 2: any order of the same inputs gives the same datapath.
#[test]
fn end_state_does_not_depend_on_event_order() {
    let plan = || {
        snapshot(
            1,
            vec![
                pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
                pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
                pod_policy("c", Some(allow_from([10, 0, 0, 8], 443))),
            ],
        )
    };
    #[derive(Clone, Copy, Debug)]
    enum E {
        Plan,
        Up(&'static str, &'static str),
        Down(&'static str),
    }
    let events = [
        E::Plan,
        E::Up("a", "veth-a"),
        E::Up("b", "veth-b"),
        E::Up("c", "veth-c"),
        E::Down("a"),
    ];
    let mut results = BTreeSet::new();
    // Every permutation where a pod's Down follows its Up.
    let mut idx: Vec<usize> = (0..events.len()).collect();
    permute(&mut idx, 0, &mut |order| {
        let pos = |i| order.iter().position(|x| *x == i).unwrap();
        if pos(4) < pos(1) {
            return;
        }
        let mut r = reconciler();
        for &i in order {
            match events[i] {
                E::Plan => {
                    r.apply_plan(plan()).unwrap();
                }
                E::Up(n, i) => {
                    // Before the plan, the answer waits; the end state may not.
                    let (tx, _rx) = tokio::sync::oneshot::channel();
                    r.pod_up(up(n, i), tx);
                }
                E::Down(n) => r
                    .pod_down(Some(("x".into(), n.into())), &format!("c-{n}"))
                    .unwrap(),
            }
        }
        assert!(
            r.datapath.violations.is_empty(),
            "{order:?}: {:?}",
            r.datapath.violations
        );
        let shape = (
            r.datapath.attached.clone(),
            r.datapath.policies.len(),
            r.datapath.portsets.len(),
            r.datapath.endpoint_of("veth-b").unwrap() == r.datapath.endpoint_of("veth-b").unwrap(),
            r.datapath.endpoint_of("veth-b").unwrap().0
                != r.datapath.endpoint_of("veth-c").unwrap().0,
        );
        results.insert(format!("{shape:?}"));
    });
    assert_eq!(results.len(), 1, "{results:?}");
}

fn permute(v: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
    if k == v.len() {
        f(v);
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permute(v, k + 1, f);
        v.swap(k, i);
    }
}

/// A restart: a new reconciler takes over the same datapath (the fake keeps
/// the "kernel" state) from the checkpointed inputs.
fn restart(old: &mut Reconciler<FakeDatapath>, dir: &std::path::Path) -> Reconciler<FakeDatapath> {
    old.flush();
    let datapath = std::mem::take(&mut old.datapath);
    let cp = Checkpoint::open(dir).unwrap();
    let saved = cp.load().unwrap();
    let mut r = Reconciler::new("n1".into(), "e2".into(), datapath).with_checkpoint(cp);
    r.datapath.log.clear();
    r.recover(saved).unwrap();
    r
}

#[test]
fn restart_takes_over_without_touching_a_correct_datapath() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
    r.apply_plan(snapshot(
        4,
        vec![
            pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
            pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
            unselected("c"),
        ],
    ))
    .unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    up_now(&mut r, up("b", "veth-b")).unwrap();
    up_now(&mut r, up("c", "veth-c")).unwrap();
    let before = (
        r.datapath.endpoints.clone(),
        r.datapath.policies.clone(),
        r.datapath.portsets.clone(),
        r.datapath.attached.clone(),
    );
    let state_before = r.node_state();

    let mut r2 = restart(&mut r, dir.path());
    // Only the isolated directions' epochs move (the predecessor may have
    // died before renewing them after an in-place edit): one write each.
    let (a, b) = (
        r2.datapath.interfaces["veth-a"],
        r2.datapath.interfaces["veth-b"],
    );
    assert_eq!(
        r2.datapath.log,
        vec![
            format!("renew_epochs {a} true false"),
            format!("renew_epochs {b} true false")
        ],
        "no other operation needed"
    );
    let after = (
        r2.datapath.endpoints.clone(),
        r2.datapath.policies.clone(),
        r2.datapath.portsets.clone(),
        r2.datapath.attached.clone(),
    );
    assert_eq!(before, after);
    let state_after = r2.node_state();
    assert_eq!(state_after.realized_version, 4);
    assert_eq!(state_after.pods, state_before.pods);

    // The recovered reconciler keeps working: a new plan, shared tables,
    // make-before-break, no reuse of a live id.
    r2.apply_plan(snapshot(
        5,
        vec![
            pod_policy("a", Some(allow_from([10, 0, 0, 9], 443))),
            pod_policy("b", Some(allow_from([10, 0, 0, 9], 80))),
            unselected("c"),
        ],
    ))
    .unwrap();
    let (ia, _) = r2.datapath.endpoint_of("veth-a").unwrap();
    let (ib, _) = r2.datapath.endpoint_of("veth-b").unwrap();
    assert_ne!(ia, ib);
    assert_eq!(r2.datapath.policies.len(), 2);
    r2.datapath.assert_no_violations();
}

#[test]
fn restart_removes_vanished_pods_and_keeps_what_it_cannot_explain() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
    r.apply_plan(snapshot(
        1,
        vec![
            pod_policy("a", Some(allow_from([10, 0, 0, 9], 80))),
            unselected("b"),
        ],
    ))
    .unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    up_now(&mut r, up("b", "veth-b")).unwrap();
    // While the enforcer is down: x/a's veth disappears; something left an
    // attachment no saved pod knows on a live interface (veth-d, index 13,
    // denied) and a stray table.
    r.datapath.interfaces.remove("veth-a");
    r.datapath.attached.insert("veth-d".into());
    r.datapath.endpoints.insert(
        13,
        EndpointEntry {
            ingress: DENY_ALL,
            egress: DENY_ALL,
            pod_addrs: vec![],
        },
    );
    r.datapath.policies.insert(77, vec![]);

    let mut r2 = restart(&mut r, dir.path());
    let names: Vec<String> = r2
        .node_state()
        .pods
        .iter()
        .map(|p| p.pod.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(names, vec!["b"]);
    // Detaching a live interface it cannot explain would open it: it keeps
    // its policy, and the state says why.
    assert_eq!(
        r2.datapath.attached,
        BTreeSet::from(["veth-b".to_string(), "veth-d".to_string()])
    );
    assert_eq!(
        r2.datapath.endpoint_of("veth-d"),
        Some((DENY_ALL, DENY_ALL))
    );
    assert!(r2
        .node_state()
        .errors
        .iter()
        .any(|e| e.contains("veth-d") && e.contains("no pod explains")));
    assert!(
        r2.datapath.policies.is_empty(),
        "{:?}",
        r2.datapath.policies
    );
    // Once it goes, it is cleaned up.
    r2.datapath.interfaces.remove("veth-d");
    r2.handle(Event::Links);
    assert_eq!(r2.datapath.attached, BTreeSet::from(["veth-b".to_string()]));
    assert_eq!(r2.datapath.endpoints.len(), 1);
    r2.datapath.assert_no_violations();
}

/// Seed of issue 5.7: a lost or damaged checkpoint never turns live links
/// into orphans; the kernel's endpoint entries and the plan's pod addresses
/// rebuild which pod owns which interface.
#[test]
fn a_lost_checkpoint_is_rebuilt_from_the_kernel_not_detached() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
    let mut a = pod_policy("a", Some(allow_from([10, 0, 0, 9], 80)));
    a.pod_ips = vec![ip4([10, 0, 1, 1], 32)];
    r.apply_plan(snapshot(1, vec![a.clone()])).unwrap();
    let mut u = up("a", "veth-a");
    u.runtime.ips = vec![Prefix::from_ip("10.0.1.1".parse().unwrap(), 32)];
    up_now(&mut r, u).unwrap();
    for damage in ["remove", "truncate"] {
        let before = r.datapath.endpoint_of("veth-a").unwrap();
        assert_ne!(before.0, 0);
        r.flush();
        for f in ["plan.pb", "pods.json"] {
            let p = dir.path().join(f);
            if damage == "remove" {
                std::fs::remove_file(&p).unwrap();
            } else {
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() / 2]).unwrap();
            }
        }
        let mut r2 = restart(&mut r, dir.path());
        // Nothing was detached or rewritten: the pod keeps its policy.
        assert_eq!(r2.datapath.endpoint_of("veth-a"), Some(before), "{damage}");
        assert!(r2.datapath.attached.contains("veth-a"));
        assert!(r2.dump().warnings.iter().any(|w| w.contains("damaged")) || damage == "remove");
        // The plan comes back; the pod is recognised by its address.
        r2.apply_plan(snapshot(2, vec![a.clone()])).unwrap();
        let state = r2.node_state();
        assert_eq!(state.pods.len(), 1, "{state:?}");
        assert_eq!(state.pods[0].error, "");
        assert_eq!(r2.datapath.endpoint_of("veth-a"), Some(before));
        r2.datapath.assert_no_violations();
        // A DEL cannot prove it is for this sandbox (the container id was
        // lost; it may be a late one for an older pod): enforced until the
        // veth goes, then forgotten.
        r2.pod_down(Some(("x".into(), "a".into())), "c-whatever")
            .unwrap();
        assert!(r2.datapath.attached.contains("veth-a"));
        assert_eq!(r2.datapath.endpoint_of("veth-a"), Some(before));
        r2.datapath.interfaces.remove("veth-a");
        r2.handle(Event::Links);
        assert!(!r2.datapath.attached.contains("veth-a"));
        assert!(r2.node_state().pods.is_empty());
        r2.datapath.interfaces.insert("veth-a".into(), 10);
        r = r2;
        up_now(&mut r, {
            let mut u = up("a", "veth-a");
            u.runtime.ips = vec![Prefix::from_ip("10.0.1.1".parse().unwrap(), 32)];
            u
        })
        .unwrap();
    }
}

#[test]
fn node_addresses_are_always_allowed_and_followed_on_tick() {
    let mut r = reconciler();
    r.datapath.node_addresses = vec!["10.1.0.1".parse().unwrap()];
    r.apply_plan(snapshot(
        1,
        vec![pod_policy("a", Some(DirectionPolicy { rules: vec![] }))],
    ))
    .unwrap();
    up_now(&mut r, up("a", "veth-a")).unwrap();
    let node = |s: &str| Prefix::from_ip(s.parse().unwrap(), 32);
    let entries = |r: &Reconciler<FakeDatapath>| {
        let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
        r.datapath.policies[&id]
            .iter()
            .map(|(p, _)| *p)
            .collect::<Vec<_>>()
    };
    assert_eq!(entries(&r), vec![node("10.1.0.1")]);

    // Nothing changed: a tick touches nothing.
    let ops = r.datapath.log.len();
    r.handle(Event::Tick);
    assert_eq!(r.datapath.log.len(), ops);

    // The node gains an address (a new gateway, say): the next tick
    // follows, make-before-break.
    r.datapath.node_addresses.push("10.1.0.2".parse().unwrap());
    r.handle(Event::Tick);
    assert_eq!(entries(&r), vec![node("10.1.0.1"), node("10.1.0.2")]);
    assert_eq!(r.datapath.policies.len(), 1);
    r.datapath.assert_no_violations();
}
