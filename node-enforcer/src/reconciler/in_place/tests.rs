//! In-place table edits: the diff and its write order (pure), and the
//! reconciler's choice between an in-place edit and a new table, epoch
//! renewals, failures, and random plan changes checked against a
//! from-scratch compile.

use std::collections::{BTreeMap, BTreeSet};

use super::super::*;
use super::host_only_diff;
use crate::compile::{compile, PortEntry, PortSet, Prefix};
use crate::datapath::fake::FakeDatapath;
use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PlanDelta, PortRange, Rule};
use palisade_proto::v1::{PlanSnapshot, PodRef};

// ---- helpers ----

fn v4(a: [u8; 4], len: u8) -> Prefix {
    Prefix::from_ip(std::net::IpAddr::from(a), len)
}

fn proto_prefix(p: &Prefix) -> IpPrefix {
    p.to_wire()
}

/// One rule allowing TCP `port` from each of `peers`.
fn rule(peers: &[Prefix], port: u32) -> Rule {
    Rule {
        peers: peers
            .iter()
            .map(|p| PeerBlock {
                cidr: Some(proto_prefix(p)),
                except: vec![],
            })
            .collect(),
        ports: vec![PortRange {
            protocol: 6,
            port,
            end_port: 0,
        }],
        ..Default::default()
    }
}

fn direction(rules: Vec<Rule>) -> Option<DirectionPolicy> {
    Some(DirectionPolicy { rules })
}

fn pod(name: &str, ingress: Option<DirectionPolicy>, egress: Option<DirectionPolicy>) -> PodPolicy {
    PodPolicy {
        pod: Some(PodRef {
            namespace: "x".into(),
            name: name.into(),
        }),
        ingress,
        egress,
        policies: vec!["x/p".into()],
        ..Default::default()
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

const IFACES: [&str; 6] = ["veth-a", "veth-b", "veth-c", "veth-d", "veth-e", "veth-f"];

fn reconciler() -> Reconciler<FakeDatapath> {
    Reconciler::new(
        "n1".into(),
        "e1".into(),
        FakeDatapath::with_interfaces(&IFACES),
    )
}

/// Brings up pod `name` on its interface (`veth-<name>`).
fn up(r: &mut Reconciler<FakeDatapath>, name: &str) {
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    r.pod_up(
        PodUp {
            pod: ("x".into(), name.into()),
            runtime: crate::desired::PodRuntime {
                container_id: format!("c-{name}"),
                netns: String::new(),
                host_interfaces: vec![format!("veth-{name}")],
                ips: vec![],
                ifindexes: Default::default(),
                mode: None,
            },
        },
        tx,
    );
    rx.try_recv().expect("answered").expect("up");
}

fn ifindex(r: &Reconciler<FakeDatapath>, name: &str) -> u32 {
    r.datapath.interfaces[&format!("veth-{name}")]
}

fn ingress_id(r: &Reconciler<FakeDatapath>, name: &str) -> PolicyId {
    r.datapath.endpoint_of(&format!("veth-{name}")).unwrap().0
}

/// A table of the fake as content.
fn table(dp: &FakeDatapath, id: PolicyId) -> PolicySet {
    PolicySet::new(
        dp.policies[&id]
            .iter()
            .map(|(p, ps)| {
                let ports = if *ps == 0 {
                    PortSet::default()
                } else {
                    dp.portsets[ps].clone()
                };
                (*p, ports)
            })
            .collect(),
    )
}

fn log_since(r: &Reconciler<FakeDatapath>, from: usize) -> Vec<String> {
    r.datapath.log[from..].to_vec()
}

fn hosts(range: std::ops::Range<u8>) -> Vec<Prefix> {
    range.map(|i| v4([10, 0, 0, i], 32)).collect()
}

// ---- the diff ----

fn ports(port: u16) -> PortSet {
    PortSet(BTreeSet::from([PortEntry::Block {
        proto: 6,
        port,
        bits: 16,
    }]))
}

fn set(entries: &[(Prefix, u16)]) -> PolicySet {
    PolicySet::new(
        entries
            .iter()
            .map(|(p, port)| {
                let ps = if *port == 0 {
                    PortSet::default()
                } else {
                    ports(*port)
                };
                (*p, ps)
            })
            .collect(),
    )
}

#[test]
fn host_additions_and_removals_are_diffed_and_anything_shorter_is_refused() {
    let a = v4([10, 0, 0, 1], 32);
    let b = v4([10, 0, 0, 2], 32);
    let net = v4([10, 0, 0, 0], 24);
    let old = set(&[(net, 80), (a, 80)]);

    let join = set(&[(net, 80), (a, 80), (b, 443)]);
    let d = host_only_diff(&old, &join).unwrap();
    assert_eq!(d.upserts, vec![(b, &ports(443))]);
    assert!(d.removals.is_empty());
    assert!(!d.narrows, "adding a host widens only");

    let leave = set(&[(net, 80)]);
    let d = host_only_diff(&old, &leave).unwrap();
    assert_eq!(d.removals, vec![a]);
    assert!(d.narrows);

    // A value change on a CIDR is one atomic write: in place, narrowing.
    let changed = set(&[(net, 81), (a, 80), (b, 80)]);
    let d = host_only_diff(&old, &changed).unwrap();
    assert_eq!(
        d.upserts,
        vec![(b, &ports(80)), (net, &ports(81))],
        "additions before value changes"
    );
    assert!(d.narrows);

    // Adding or removing anything shorter than a host moves other
    // addresses' longest match.
    assert!(host_only_diff(
        &old,
        &set(&[(net, 80), (a, 80), (v4([10, 1, 0, 0], 16), 80)])
    )
    .is_none());
    assert!(host_only_diff(&old, &set(&[(a, 80)])).is_none());
    // IPv6 hosts are hosts too.
    let v6 = Prefix::from_ip("fd00::1".parse().unwrap(), 128);
    assert!(host_only_diff(&old, &set(&[(net, 80), (a, 80), (v6, 80)])).is_some());
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random table over 10.0.0.0/29 and its sub-prefixes, values 0 (deny
/// entry), 80 or 81.
fn random_table(rng: &mut Rng) -> BTreeMap<Prefix, u16> {
    let mut t = BTreeMap::new();
    for _ in 0..rng.below(6) {
        let len = [29u8, 30, 31, 32, 32, 32][rng.below(6) as usize];
        let last = (rng.below(8) as u8) & !(((1u16 << (32 - len)) - 1) as u8);
        t.insert(
            v4([10, 0, 0, last], len),
            [0, 80, 81][rng.below(3) as usize],
        );
    }
    t
}

fn value(t: &BTreeMap<Prefix, u16>, addr: &Prefix) -> Option<u16> {
    t.iter()
        .filter(|(p, _)| p.contains(addr))
        .max_by_key(|(p, _)| p.len)
        .map(|(_, v)| *v)
}

/// Applies a diff's writes one at a time (upserts in the order given, then
/// removals) and returns the first address that saw neither its old nor
/// its new value, checking every address of the /29 and one outside it.
fn first_unsafe_step(
    old: &BTreeMap<Prefix, u16>,
    new: &BTreeMap<Prefix, u16>,
    upserts: &[(Prefix, u16)],
    removals: &[Prefix],
) -> Option<String> {
    let addrs: Vec<Prefix> = (0..9).map(|i| v4([10, 0, 0, i], 32)).collect();
    let mut now = old.clone();
    let writes = upserts
        .iter()
        .map(|(p, v)| (*p, Some(*v)))
        .chain(removals.iter().map(|p| (*p, None)));
    for (p, v) in writes {
        match v {
            Some(v) => now.insert(p, v),
            None => now.remove(&p),
        };
        for a in &addrs {
            let seen = value(&now, a);
            if seen != value(old, a) && seen != value(new, a) {
                return Some(format!("{} after writing {}", a.display(), p.display()));
            }
        }
    }
    None
}

fn port_of(ps: &PortSet) -> u16 {
    match ps.0.iter().next() {
        None => 0,
        Some(PortEntry::Block { port, .. }) => *port,
        Some(e) => panic!("{e:?}"),
    }
}

/// The safety rule, checked exhaustively on small random tables: every
/// intermediate table of an accepted diff, written in its order, gives
/// every address its old or new value. And the order is needed: writing
/// value changes before additions (or removals first) breaks it on some
/// table, so the check can fail.
#[test]
fn every_intermediate_table_of_an_accepted_diff_is_old_or_new_per_address() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut accepted, mut refused, mut wrong_order_caught) = (0, 0, 0);
    for _ in 0..20_000 {
        let (old, new) = (random_table(&mut rng), random_table(&mut rng));
        let as_set =
            |t: &BTreeMap<Prefix, u16>| set(&t.iter().map(|(p, v)| (*p, *v)).collect::<Vec<_>>());
        let (old_set, new_set) = (as_set(&old), as_set(&new));
        let Some(d) = host_only_diff(&old_set, &new_set) else {
            refused += 1;
            continue;
        };
        accepted += 1;
        let upserts: Vec<(Prefix, u16)> =
            d.upserts.iter().map(|(p, ps)| (*p, port_of(ps))).collect();
        if let Some(e) = first_unsafe_step(&old, &new, &upserts, &d.removals) {
            panic!("{old:?} -> {new:?}: {e}");
        }
        let mut reversed = upserts.clone();
        reversed.reverse();
        if first_unsafe_step(&old, &new, &reversed, &d.removals).is_some() {
            wrong_order_caught += 1;
        }
        assert_eq!(d.narrows, old.iter().any(|(p, v)| new.get(p) != Some(v)));
    }
    assert!(accepted > 1000 && refused > 1000, "{accepted} {refused}");
    assert!(wrong_order_caught > 0, "the order check never bit");
}

// ---- the reconciler ----

/// Three pods share a table naming a peer set; a fourth has its own.
fn shared_setup(r: &mut Reconciler<FakeDatapath>, peers: &[Prefix]) {
    let shared = direction(vec![rule(peers, 80)]);
    r.apply_plan(snapshot(
        1,
        vec![
            pod("a", shared.clone(), None),
            pod("b", shared.clone(), None),
            pod("c", None, shared),
            pod("d", direction(vec![rule(&hosts(50..52), 22)]), None),
        ],
    ))
    .unwrap();
    for p in ["a", "b", "c", "d"] {
        up(r, p);
    }
}

fn peer_change(version: u64, peers: &[Prefix]) -> PlanMessage {
    let shared = direction(vec![rule(peers, 80)]);
    PlanMessage::Delta(PlanDelta {
        term: 0,
        base_version: version - 1,
        version,
        upserted: vec![
            pod("a", shared.clone(), None),
            pod("b", shared.clone(), None),
            pod("c", None, shared),
        ],
        removed: vec![],
        ..Default::default()
    })
}

#[test]
fn a_peer_joining_is_one_write_in_place_and_renews_no_epoch() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let id = ingress_id(&r, "a");
    assert_eq!(r.datapath.endpoint_of("veth-c"), Some((0, id)));
    let epochs = r.datapath.epochs.clone();
    let from = r.datapath.log.len();

    r.apply_plan(peer_change(2, &hosts(1..12))).unwrap();

    assert_eq!(
        log_since(&r, from),
        vec![format!(
            "update_policy {id} upsert 10.0.0.11/32 {}",
            r.datapath.policies[&id][0].1
        )],
        "one write, nothing else"
    );
    assert_eq!(ingress_id(&r, "a"), id);
    assert_eq!(
        r.datapath.epochs, epochs,
        "widening keeps established flows"
    );
    let want = compile(&direction(vec![rule(&hosts(1..12), 80)]).unwrap(), &[]).unwrap();
    assert_eq!(table(&r.datapath, id), want);
    assert_eq!(r.datapath.policies.len(), 2);
    r.datapath.assert_no_violations();
    assert!(r.node_state().errors.is_empty());
}

#[test]
fn a_peer_leaving_is_one_delete_and_renews_exactly_the_users_directions() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let id = ingress_id(&r, "a");
    let epochs = r.datapath.epochs.clone();
    let from = r.datapath.log.len();

    r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();

    let (a, b, c, d) = (
        ifindex(&r, "a"),
        ifindex(&r, "b"),
        ifindex(&r, "c"),
        ifindex(&r, "d"),
    );
    let log = log_since(&r, from);
    assert_eq!(log[0], format!("update_policy {id} remove 10.0.0.1/32"));
    let mut renewals: Vec<&String> = log[1..].iter().collect();
    renewals.sort();
    assert_eq!(
        renewals,
        vec![
            &format!("renew_epochs {a} true false"),
            &format!("renew_epochs {b} true false"),
            &format!("renew_epochs {c} false true"),
        ]
    );
    let now = &r.datapath.epochs;
    assert_ne!(now[&a].0, epochs[&a].0);
    assert_eq!(
        now[&a].1, epochs[&a].1,
        "egress of a is not the table's user"
    );
    assert_ne!(now[&c].1, epochs[&c].1);
    assert_eq!(now[&c].0, epochs[&c].0);
    assert_eq!(now[&d], epochs[&d], "another table's user keeps its flows");
    assert_eq!(ingress_id(&r, "a"), id);
    r.datapath.assert_no_violations();
}

#[test]
fn a_cidr_change_or_a_user_left_behind_takes_a_new_table() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..4));
    let id = ingress_id(&r, "a");
    // A /24 joins: it would move the longest match of 253 other addresses.
    let mut peers = hosts(1..4);
    peers.push(v4([10, 0, 9, 0], 24));
    r.apply_plan(peer_change(2, &peers)).unwrap();
    let new = ingress_id(&r, "a");
    assert_ne!(new, id);
    assert!(!r.datapath.policies.contains_key(&id), "old table removed");
    assert!(!r
        .datapath
        .log
        .iter()
        .any(|l| l.starts_with("update_policy")));

    // Only a and b move: c keeps the table, so it is not edited.
    let shared = direction(vec![rule(&hosts(1..5), 80)]);
    r.apply_plan(PlanMessage::Delta(PlanDelta {
        term: 0,
        base_version: 2,
        version: 3,
        upserted: vec![pod("a", shared.clone(), None), pod("b", shared, None)],
        removed: vec![],
        ..Default::default()
    }))
    .unwrap();
    assert_ne!(ingress_id(&r, "a"), new);
    assert_eq!(r.datapath.endpoint_of("veth-c").unwrap().1, new);
    assert!(!r
        .datapath
        .log
        .iter()
        .any(|l| l.starts_with("update_policy")));

    // Switched off, a host change takes a new table as well.
    let mut r = reconciler().with_in_place_edits(false);
    shared_setup(&mut r, &hosts(1..4));
    let id = ingress_id(&r, "a");
    r.apply_plan(peer_change(2, &hosts(1..5))).unwrap();
    assert_ne!(ingress_id(&r, "a"), id);
    assert!(!r
        .datapath
        .log
        .iter()
        .any(|l| l.starts_with("update_policy")));
    r.datapath.assert_no_violations();
}

#[test]
fn a_new_pod_wanting_the_old_content_keeps_the_old_table() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..4));
    let id = ingress_id(&r, "a");
    let old = direction(vec![rule(&hosts(1..4), 80)]);
    let new = direction(vec![rule(&hosts(1..5), 80)]);
    // e is up (unselected) when the change makes it want the old content.
    let v2 = vec![
        pod("a", old.clone(), None),
        pod("b", old.clone(), None),
        pod("c", None, old.clone()),
        pod("d", direction(vec![rule(&hosts(50..52), 22)]), None),
        pod("e", None, None),
    ];
    r.apply_plan(snapshot(2, v2)).unwrap();
    up(&mut r, "e");
    r.apply_plan(snapshot(
        3,
        vec![
            pod("a", new.clone(), None),
            pod("b", new.clone(), None),
            pod("c", None, new),
            pod("d", direction(vec![rule(&hosts(50..52), 22)]), None),
            pod("e", old, None),
        ],
    ))
    .unwrap();
    assert_eq!(ingress_id(&r, "e"), id, "e gets the old content's table");
    assert_ne!(ingress_id(&r, "a"), id);
    assert_eq!(
        table(&r.datapath, id),
        compile(&direction(vec![rule(&hosts(1..4), 80)]).unwrap(), &[]).unwrap()
    );
    r.datapath.assert_no_violations();
}

#[test]
fn a_failed_edit_moves_the_users_to_a_complete_new_table() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let id = ingress_id(&r, "a");
    // Dies after the addition, before the removal: the table is neither.
    r.datapath
        .fail
        .insert(format!("update_policy {id} remove 10.0.0.1/32"));
    let mut peers = hosts(2..11);
    peers.push(v4([10, 0, 0, 99], 32));
    r.apply_plan(peer_change(2, &peers)).unwrap();

    let new = ingress_id(&r, "a");
    assert_ne!(new, id, "users moved to a new table");
    assert_eq!(r.datapath.endpoint_of("veth-c").unwrap().1, new);
    assert!(
        !r.datapath.policies.contains_key(&id),
        "half-edited table removed"
    );
    let want = compile(&direction(vec![rule(&peers, 80)]).unwrap(), &[]).unwrap();
    assert_eq!(table(&r.datapath, new), want);
    let errors = r.node_state().errors;
    assert!(
        errors.iter().any(|e| e.contains("in place failed")),
        "{errors:?}"
    );
    // The new id gave every user a fresh epoch: nothing owed.
    r.datapath.assert_no_violations();

    // Both the edit and the new table fail: the users are denied, visibly.
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let id = ingress_id(&r, "a");
    r.datapath.fail.insert(format!("update_policy {id} remove"));
    r.datapath.fail.insert("add_policy".into());
    r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();
    assert_eq!(ingress_id(&r, "a"), DENY_ALL);
    assert_eq!(r.datapath.endpoint_of("veth-c").unwrap().1, DENY_ALL);
    assert!(r.node_state().pods[0].error.contains("not written"));
    r.datapath.assert_no_violations();
    // Retried on the tick once writes work again.
    r.datapath.fail.clear();
    r.handle(Event::Tick);
    let new = ingress_id(&r, "a");
    assert_ne!(new, DENY_ALL);
    assert_eq!(
        table(&r.datapath, new),
        compile(&direction(vec![rule(&hosts(2..11), 80)]).unwrap(), &[]).unwrap()
    );
    assert_eq!(r.datapath.policies.len(), 2, "{:?}", r.datapath.policies);
    r.datapath.assert_no_violations();
}

#[test]
fn a_failed_epoch_renewal_is_visible_and_retried() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let b = ifindex(&r, "b");
    r.datapath.fail.insert(format!("renew_epochs {b}"));
    r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();
    assert_eq!(
        r.datapath.stale_flows,
        BTreeSet::from([(b, true)]),
        "only b's renewal failed"
    );
    let state = r.node_state();
    let pod_b = state
        .pods
        .iter()
        .find(|p| p.pod.as_ref().unwrap().name == "b")
        .unwrap();
    assert!(pod_b.error.contains("not re-judged"), "{pod_b:?}");

    // A change elsewhere does not forget it.
    r.datapath.fail.clear();
    r.handle(Event::Tick);
    assert!(r.datapath.stale_flows.is_empty());
    assert!(r.node_state().pods.iter().all(|p| p.error.is_empty()));
    r.datapath.assert_no_violations();
}

// ---- random plan changes against a from-scratch compile ----

/// A random direction policy over a small pool: mostly host peers (so
/// consecutive plans often differ by hosts only), sometimes a CIDR, an
/// except or another port.
fn random_direction(rng: &mut Rng) -> Option<DirectionPolicy> {
    if rng.below(6) == 0 {
        return None;
    }
    let rules = (0..rng.below(3))
        .map(|_| {
            let mut peers: Vec<PeerBlock> = (0..rng.below(5))
                .map(|_| PeerBlock {
                    cidr: Some(proto_prefix(&v4([10, 0, 0, rng.below(12) as u8], 32))),
                    except: vec![],
                })
                .collect();
            if rng.below(4) == 0 {
                peers.push(PeerBlock {
                    cidr: Some(proto_prefix(&v4([10, 0, 0, 0], 28))),
                    except: (rng.below(2) == 0)
                        .then(|| proto_prefix(&v4([10, 0, 0, rng.below(12) as u8], 32)))
                        .into_iter()
                        .collect(),
                });
            }
            Rule {
                peers,
                ports: vec![PortRange {
                    protocol: 6,
                    port: [80, 80, 80, 443][rng.below(4) as usize],
                    end_port: 0,
                }],
                ..Default::default()
            }
        })
        .collect();
    Some(DirectionPolicy { rules })
}

/// Every pod that is up points at tables equal to its policy compiled from
/// scratch, no table is left that nothing uses, and no flow is owed a
/// renewal.
fn check_against_scratch(
    r: &Reconciler<FakeDatapath>,
    plan: &BTreeMap<String, PodPolicy>,
    node: &[Prefix],
    what: &str,
) {
    r.datapath.assert_no_violations();
    let mut used = BTreeSet::new();
    for (name, p) in plan {
        let (ingress, egress) = r.datapath.endpoint_of(&format!("veth-{name}")).unwrap();
        for (id, d, dir) in [
            (ingress, &p.ingress, "ingress"),
            (egress, &p.egress, "egress"),
        ] {
            match d {
                None => assert_eq!(id, 0, "{what}: {name} {dir} should be open"),
                Some(d) => {
                    assert!(id != 0 && id != DENY_ALL, "{what}: {name} {dir} is {id}");
                    assert_eq!(
                        table(&r.datapath, id),
                        compile(d, node).unwrap(),
                        "{what}: {name} {dir} (table {id})"
                    );
                    used.insert(id);
                }
            }
        }
    }
    let tables: BTreeSet<PolicyId> = r.datapath.policies.keys().copied().collect();
    assert_eq!(tables, used, "{what}: tables nothing uses are left");
    // One table per content.
    let contents: BTreeSet<PolicySet> = used.iter().map(|id| table(&r.datapath, *id)).collect();
    assert_eq!(contents.len(), used.len(), "{what}: duplicate tables");
}

#[test]
fn random_plan_changes_leave_exactly_the_compiled_tables() {
    let names = ["a", "b", "c", "d", "e", "f"];
    let (mut in_place, mut narrowing) = (0, 0);
    for seed in 1..=60u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let mut r = reconciler();
        r.datapath.node_addresses = vec!["10.0.0.200".parse().unwrap()];
        let node = [v4([10, 0, 0, 200], 32)];
        // Replicas: pods share one of a few policies, so tables have users.
        let mut shapes: Vec<(Option<DirectionPolicy>, Option<DirectionPolicy>)> = (0..3)
            .map(|_| (random_direction(&mut rng), random_direction(&mut rng)))
            .collect();
        let assign: Vec<usize> = names.iter().map(|_| rng.below(3) as usize).collect();
        let plan_of = |shapes: &[(Option<DirectionPolicy>, Option<DirectionPolicy>)]| {
            names
                .iter()
                .zip(&assign)
                .map(|(n, s)| {
                    (
                        n.to_string(),
                        pod(n, shapes[*s].0.clone(), shapes[*s].1.clone()),
                    )
                })
                .collect::<BTreeMap<String, PodPolicy>>()
        };
        let mut overrides: BTreeMap<String, PodPolicy> = BTreeMap::new();
        let mut plan = plan_of(&shapes);
        let mut version = 1;
        r.apply_plan(snapshot(version, plan.values().cloned().collect()))
            .unwrap();
        for n in names {
            up(&mut r, n);
        }
        check_against_scratch(&r, &plan, &node, &format!("seed {seed} start"));
        for step in 0..25 {
            // Change one shape (all its replicas), or one pod's assignment.
            let s = rng.below(3) as usize;
            match rng.below(5) {
                // A peer joins or leaves one rule: the churn this is for.
                0..=2 => {
                    let d = if rng.below(2) == 0 {
                        &mut shapes[s].0
                    } else {
                        &mut shapes[s].1
                    };
                    if let Some(d) = d {
                        if let Some(rule) = d.rules.first_mut() {
                            let host = proto_prefix(&v4([10, 0, 0, rng.below(12) as u8], 32));
                            if let Some(i) =
                                rule.peers.iter().position(|p| p.cidr == Some(host.clone()))
                            {
                                rule.peers.remove(i);
                            } else {
                                rule.peers.push(PeerBlock {
                                    cidr: Some(host),
                                    except: vec![],
                                });
                            }
                        }
                    }
                }
                3 => shapes[s] = (random_direction(&mut rng), random_direction(&mut rng)),
                // One pod leaves its replicas' policy, or returns to it.
                _ => {
                    let p = names[rng.below(names.len() as u64) as usize].to_string();
                    if overrides.remove(&p).is_none() {
                        let d = random_direction(&mut rng);
                        overrides.insert(p.clone(), pod(&p, d, None));
                    }
                }
            }
            let mut next = plan_of(&shapes);
            next.extend(overrides.clone());
            let changed: Vec<PodPolicy> = next
                .iter()
                .filter(|(n, p)| plan.get(*n) != Some(p))
                .map(|(_, p)| p.clone())
                .collect();
            plan = next;
            let from = r.datapath.log.len();
            version += 1;
            let msg = if rng.below(3) == 0 {
                snapshot(version, plan.values().cloned().collect())
            } else {
                PlanMessage::Delta(PlanDelta {
                    term: 0,
                    base_version: version - 1,
                    version,
                    upserted: changed,
                    removed: vec![],
                    ..Default::default()
                })
            };
            // Sometimes a write fails part-way; the tick after retries.
            let fail = rng.below(6) == 0;
            if fail {
                r.datapath.fail.insert(
                    ["update_policy", "renew_epochs", "add_policy", "add_portset"]
                        [rng.below(4) as usize]
                        .into(),
                );
            }
            r.apply_plan(msg).unwrap();
            let log = log_since(&r, from);
            in_place += log
                .iter()
                .filter(|l| l.starts_with("update_policy"))
                .count();
            narrowing += log.iter().filter(|l| l.starts_with("renew_epochs")).count();
            assert!(
                r.datapath.violations.is_empty(),
                "seed {seed} step {step}: {:?}",
                r.datapath.violations
            );
            if fail {
                r.datapath.fail.clear();
                r.handle(Event::Tick);
            }
            check_against_scratch(&r, &plan, &node, &format!("seed {seed} step {step}"));
            assert!(
                r.node_state().errors.is_empty(),
                "seed {seed} step {step}: {:?}",
                r.node_state().errors
            );
        }
    }
    assert!(
        in_place > 100 && narrowing > 50,
        "{in_place} edits, {narrowing} renewals"
    );
}

/// The enforcer dies after narrowing a table in place, before renewing its
/// users' epochs: the table is final, so nothing is left to diff. The next
/// process renews every isolated direction on takeover.
#[test]
fn a_restart_renews_what_a_dead_predecessor_may_have_owed() {
    let dir = tempfile::tempdir().unwrap();
    let mut r =
        reconciler().with_checkpoint(crate::checkpoint::Checkpoint::open(dir.path()).unwrap());
    shared_setup(&mut r, &hosts(1..11));
    // Every renewal fails: as good as dead right after the edit.
    r.datapath.fail.insert("renew_epochs".into());
    r.apply_plan(peer_change(2, &hosts(2..11))).unwrap();
    assert_eq!(r.datapath.stale_flows.len(), 3);
    r.flush();

    let mut datapath = std::mem::take(&mut r.datapath);
    datapath.fail.clear();
    let cp = crate::checkpoint::Checkpoint::open(dir.path()).unwrap();
    let saved = cp.load().unwrap();
    let mut r2 = Reconciler::new("n1".into(), "e2".into(), datapath).with_checkpoint(cp);
    r2.recover(saved).unwrap();
    assert!(
        r2.datapath.stale_flows.is_empty(),
        "{:?}",
        r2.datapath.stale_flows
    );
    r2.datapath.assert_no_violations();
}

/// Every churn event compiles new tables; the memo must not keep the ones
/// nothing uses any more.
#[test]
fn compiled_tables_do_not_pile_up_under_churn() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let before = r.target.compiled.len();
    for v in 2..40u64 {
        let last = 11 + (v % 2) as u8;
        r.apply_plan(peer_change(v, &hosts(1..last))).unwrap();
    }
    assert!(
        r.target.compiled.len() <= before,
        "{} > {before}",
        r.target.compiled.len()
    );
    r.datapath.assert_no_violations();
}

/// A failed edit whose users cannot all be moved off the half-edited table:
/// it stays, with every port set any of its keys may point at.
#[test]
fn a_half_edited_table_still_in_use_keeps_its_port_sets() {
    let mut r = reconciler();
    shared_setup(&mut r, &hosts(1..11));
    let id = ingress_id(&r, "a");
    let b = ifindex(&r, "b");
    // Every key's value changes (port 80 -> 81); the edit dies half-way,
    // the new table cannot be written, and b cannot be moved to deny-all.
    r.datapath
        .fail
        .insert(format!("update_policy {id} upsert 10.0.0.5/32"));
    r.datapath.fail.insert("add_policy".into());
    r.datapath.fail.insert(format!("set_endpoint {b}"));
    let moved = direction(vec![rule(&hosts(1..11), 81)]);
    r.apply_plan(PlanMessage::Delta(PlanDelta {
        term: 0,
        base_version: 1,
        version: 2,
        upserted: vec![
            pod("a", moved.clone(), None),
            pod("b", moved.clone(), None),
            pod("c", None, moved),
        ],
        removed: vec![],
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(ingress_id(&r, "a"), DENY_ALL);
    assert_eq!(ingress_id(&r, "b"), id, "b stays on the half-edited table");
    assert!(
        r.datapath.violations.is_empty(),
        "{:?}",
        r.datapath.violations
    );
    assert!(!r.node_state().errors.is_empty());

    r.datapath.fail.clear();
    r.handle(Event::Tick);
    let new = ingress_id(&r, "b");
    assert!(new != id && new != DENY_ALL);
    assert_eq!(ingress_id(&r, "a"), new);
    assert!(!r.datapath.policies.contains_key(&id));
    r.datapath.assert_no_violations();
}
