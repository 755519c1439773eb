//! Staged (audit) policies in the reconciler, on the fake datapath (which
//! checks after every operation that no audit entry names a missing table).

use super::*;
use crate::checkpoint::Checkpoint;
use crate::datapath::fake::FakeDatapath;
use crate::datapath::AuditEntry;
use crate::desired::PodRuntime;
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule};
use palisade_proto::v1::{PlanSnapshot, PodRef};
use std::collections::BTreeMap;

fn allow_from(peer: [u8; 4], port: u32) -> DirectionPolicy {
    DirectionPolicy {
        rules: vec![Rule {
            peers: vec![PeerBlock {
                cidr: Some(IpPrefix {
                    addr: peer.to_vec(),
                    prefix_len: 32,
                }),
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

fn union(a: DirectionPolicy, b: DirectionPolicy) -> DirectionPolicy {
    DirectionPolicy {
        rules: a.rules.into_iter().chain(b.rules).collect(),
    }
}

fn deny() -> DirectionPolicy {
    DirectionPolicy::default()
}

/// Pod x/`name` enforcing `ingress`, with `audit` as its audit ingress.
fn pod(name: &str, ingress: Option<DirectionPolicy>, audit: Option<DirectionPolicy>) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: name.into(),
        }),
        policies: ingress.iter().map(|_| "x/enforced".to_string()).collect(),
        staged_policies: audit.iter().map(|_| "x/staged".to_string()).collect(),
        ingress,
        audit_ingress: audit,
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
        version,
        pods,
        source_synced: true,
        ..Default::default()
    })
}

fn reconciler() -> Reconciler<FakeDatapath> {
    Reconciler::new(
        "n1".into(),
        "e1".into(),
        FakeDatapath::with_interfaces(&["veth-a", "veth-b"]),
    )
}

fn start(r: &mut Reconciler<FakeDatapath>, plan: Vec<PodPolicy>, pods: &[(&str, &str)]) {
    r.apply_plan(snapshot(1, plan)).unwrap();
    for (name, iface) in pods {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        r.pod_up(up(name, iface), tx);
        rx.try_recv().expect("answered at once").unwrap();
    }
}

fn audit_of(r: &Reconciler<FakeDatapath>, iface: &str) -> Option<AuditEntry> {
    r.datapath.audit.get(&r.datapath.interfaces[iface]).copied()
}

/// The enforced datapath alone: endpoints and the tables they use.
fn enforced(r: &Reconciler<FakeDatapath>) -> Vec<(u32, Vec<(crate::compile::Prefix, u32)>)> {
    r.datapath
        .endpoints
        .values()
        .flat_map(|e| [e.ingress, e.egress])
        .map(|id| {
            (
                id,
                r.datapath.policies.get(&id).cloned().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn a_staged_deny_on_an_open_pod_writes_an_audit_table_and_leaves_it_open() {
    let mut r = reconciler();
    start(
        &mut r,
        vec![pod("a", None, Some(deny()))],
        &[("a", "veth-a")],
    );
    assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)), "still open");
    let audit = audit_of(&r, "veth-a").expect("an audit entry");
    assert_ne!(audit.ingress, 0);
    assert_eq!(audit.egress, 0);
    assert!(r.datapath.policies.contains_key(&audit.ingress));
    let dump = r.dump();
    let i = &dump.interfaces[0];
    assert_eq!((i.ingress.as_str(), i.audit_egress.as_str()), ("", ""));
    assert!(
        !i.audit_ingress.is_empty(),
        "the dump names the audit table"
    );
    assert!(dump.state.errors.is_empty(), "{:?}", dump.state.errors);
    r.datapath.assert_no_violations();

    // The pod goes: its entry and table with it.
    r.pod_down(None, "c-a").unwrap();
    r.datapath.assert_empty();
    r.datapath.assert_no_violations();
}

#[test]
fn a_staged_allow_on_an_isolated_pod_audits_the_union_in_its_own_table() {
    let mut r = reconciler();
    let enforced_rules = allow_from([10, 0, 0, 9], 80);
    let audit_rules = union(enforced_rules.clone(), allow_from([10, 0, 0, 7], 80));
    start(
        &mut r,
        vec![
            pod("a", Some(enforced_rules.clone()), Some(audit_rules.clone())),
            // Another pod enforcing what x/a audits: one table for both.
            pod("b", Some(audit_rules), None),
        ],
        &[("a", "veth-a"), ("b", "veth-b")],
    );
    let (ingress_a, _) = r.datapath.endpoint_of("veth-a").unwrap();
    let (ingress_b, _) = r.datapath.endpoint_of("veth-b").unwrap();
    let audit = audit_of(&r, "veth-a").unwrap();
    assert_ne!(audit.ingress, ingress_a, "staged rules are not enforced");
    assert_eq!(audit.ingress, ingress_b, "tables are shared by content");
    assert_eq!(audit_of(&r, "veth-b"), None);
    assert_eq!(r.datapath.policies.len(), 2);
    let refs: BTreeMap<u32, usize> = r
        .dump()
        .policy_sets
        .iter()
        .map(|p| (p.id, p.references))
        .collect();
    assert_eq!(refs[&ingress_b], 2, "x/b's ingress and x/a's audit");
    r.datapath.assert_no_violations();

    // x/b goes: the table stays for x/a's audit.
    r.pod_down(None, "c-b").unwrap();
    assert!(r.datapath.policies.contains_key(&audit.ingress));
    r.datapath.assert_no_violations();
}

#[test]
fn removing_the_annotation_enforces_the_audited_table_and_drops_the_entry() {
    let mut r = reconciler();
    start(
        &mut r,
        vec![pod("a", None, Some(deny()))],
        &[("a", "veth-a")],
    );
    let audit = audit_of(&r, "veth-a").unwrap();
    // The plan after the annotation is removed: the staged policy enforced.
    r.apply_plan(snapshot(2, vec![pod("a", Some(deny()), None)]))
        .unwrap();
    assert_eq!(
        r.datapath.endpoint_of("veth-a"),
        Some((audit.ingress, 0)),
        "the very table that was audited is enforced"
    );
    assert_eq!(audit_of(&r, "veth-a"), None);
    assert_eq!(r.datapath.policies.len(), 1);
    r.datapath.assert_no_violations();
}

#[test]
fn the_audit_entry_follows_plan_changes_make_before_break() {
    let mut r = reconciler().with_in_place_edits(false);
    start(
        &mut r,
        vec![pod("a", None, Some(allow_from([10, 0, 0, 9], 80)))],
        &[("a", "veth-a")],
    );
    let first = audit_of(&r, "veth-a").unwrap();
    r.apply_plan(snapshot(
        2,
        vec![pod("a", None, Some(allow_from([10, 0, 0, 9], 81)))],
    ))
    .unwrap();
    let second = audit_of(&r, "veth-a").unwrap();
    assert_ne!(first.ingress, second.ingress);
    assert!(
        !r.datapath.policies.contains_key(&first.ingress),
        "collected"
    );
    // The fake checks after every write that the entry names a table.
    r.datapath.assert_no_violations();
    let log = r.datapath.log.join("\n");
    let added = log.find(&format!("add_policy {}", second.ingress)).unwrap();
    let pointed = log
        .find(&format!(
            "set_audit {} {} 0",
            r.datapath.interfaces["veth-a"], second.ingress
        ))
        .unwrap();
    let removed = log
        .find(&format!("remove_policy {}", first.ingress))
        .unwrap();
    assert!(added < pointed && pointed < removed, "{log}");
}

#[test]
fn an_in_place_edit_never_changes_a_table_an_audit_entry_still_wants() {
    let mut r = reconciler();
    let v1 = allow_from([10, 0, 0, 9], 80);
    // x/a enforces v1 and x/b audits v1: one table. Then x/a's policy gains
    // a host (an in-place candidate), while x/b's audit stays v1.
    start(
        &mut r,
        vec![
            pod("a", Some(v1.clone()), None),
            pod("b", None, Some(v1.clone())),
        ],
        &[("a", "veth-a"), ("b", "veth-b")],
    );
    let (shared, _) = r.datapath.endpoint_of("veth-a").unwrap();
    assert_eq!(audit_of(&r, "veth-b").unwrap().ingress, shared);
    let before = r.datapath.policies[&shared].clone();
    let v2 = union(v1.clone(), allow_from([10, 0, 0, 8], 80));
    r.apply_plan(snapshot(
        2,
        vec![pod("a", Some(v2), None), pod("b", None, Some(v1))],
    ))
    .unwrap();
    assert_eq!(audit_of(&r, "veth-b").unwrap().ingress, shared);
    assert_eq!(
        r.datapath.policies[&shared], before,
        "x/b's audit table unchanged"
    );
    assert_ne!(r.datapath.endpoint_of("veth-a").unwrap().0, shared);
    r.datapath.assert_no_violations();
}

#[test]
fn audit_failures_are_reported_and_never_touch_enforcement() {
    // The same plan without audit, for comparison.
    let plan = |audit: bool| {
        vec![pod(
            "a",
            Some(allow_from([10, 0, 0, 9], 80)),
            audit.then(|| union(allow_from([10, 0, 0, 9], 80), allow_from([10, 0, 0, 7], 80))),
        )]
    };
    let mut plain = reconciler();
    start(&mut plain, plan(false), &[("a", "veth-a")]);

    for fail in ["set_audit", "add_policy 2"] {
        let mut r = reconciler();
        r.datapath.fail.insert(fail.to_string());
        start(&mut r, plan(true), &[("a", "veth-a")]);
        assert_eq!(enforced(&r), enforced(&plain), "{fail}");
        assert_eq!(audit_of(&r, "veth-a"), None, "{fail}");
        let state = r.node_state();
        assert_eq!(
            state.pods[0].error, "",
            "{fail}: the pod is enforced as planned"
        );
        assert!(
            state
                .errors
                .iter()
                .any(|e| e.contains("x/a") && e.contains("audit")),
            "{fail}: {:?}",
            state.errors
        );
        r.datapath.assert_no_violations();
        // Retried on a tick once the datapath works.
        r.datapath.fail.clear();
        r.handle(Event::Tick);
        assert!(audit_of(&r, "veth-a").is_some(), "{fail}");
        assert!(r.node_state().errors.is_empty(), "{fail}");
    }
}

#[test]
fn an_audit_policy_that_does_not_compile_is_skipped_and_named() {
    let mut r = reconciler();
    let bad = DirectionPolicy {
        rules: vec![Rule {
            peers: vec![PeerBlock {
                cidr: Some(IpPrefix {
                    addr: vec![10, 0, 0],
                    prefix_len: 24,
                }),
                except: vec![],
            }],
            ..Default::default()
        }],
    };
    start(
        &mut r,
        vec![pod("a", Some(allow_from([10, 0, 0, 9], 80)), Some(bad))],
        &[("a", "veth-a")],
    );
    assert_eq!(audit_of(&r, "veth-a"), None);
    let state = r.node_state();
    assert_eq!(state.pods[0].error, "");
    assert!(
        state
            .errors
            .iter()
            .any(|e| e.contains("cannot be compiled")),
        "{:?}",
        state.errors
    );
    r.datapath.assert_no_violations();
}

#[test]
fn a_restart_rewrites_audit_entries_from_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler().with_checkpoint(Checkpoint::open(dir.path()).unwrap());
    start(
        &mut r,
        vec![pod("a", None, Some(deny())), pod("b", None, None)],
        &[("a", "veth-a"), ("b", "veth-b")],
    );
    let entry = audit_of(&r, "veth-a").unwrap();
    // A stray entry the old process left on x/b's interface.
    let b = r.datapath.interfaces["veth-b"];
    r.datapath.audit.insert(b, entry);
    r.flush();
    let datapath = std::mem::take(&mut r.datapath);
    let cp = Checkpoint::open(dir.path()).unwrap();
    let saved = cp.load().unwrap();
    let mut r2 = Reconciler::new("n1".into(), "e2".into(), datapath).with_checkpoint(cp);
    r2.recover(saved).unwrap();
    assert_eq!(audit_of(&r2, "veth-a"), Some(entry), "same table, adopted");
    assert_eq!(audit_of(&r2, "veth-b"), None, "the stray entry is gone");
    assert_eq!(r2.datapath.policies.len(), 1);
    r2.datapath.assert_no_violations();
}
