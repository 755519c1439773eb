//! Staged (audit) policies on the node: the plan's audit directions are
//! compiled into policy tables exactly like enforced ones (the same
//! compiler, the same tables shared by content, the same refcounting and
//! in-place edits) and each interface's audit table ids go into the staged
//! word of its endpoint slot, where the programs judge new flows by them
//! only to report would-deny and would-allow.
//!
//! Audit can never weaken enforcement: it is computed after the enforced
//! endpoints, only for interfaces whose endpoint is written, and a failure
//! anywhere here (compile, table, map write) skips audit for that pod and
//! is reported in the node's errors, nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::dump::Counted;
use super::realized::RealizedPolicy;
use super::Reconciler;
use crate::compile::PolicySet;
use crate::datapath::{AuditEntry, Datapath, PolicyId};
use crate::desired::{Claim, Compiler, Desired, Knowledge, PodKey};

/// Staged (audit) policies as this node realizes them, apart from the
/// realized tables and entries (`Realized::audit`).
#[derive(Default)]
pub(super) struct Audit {
    /// The staged (audit) tables each interface wants, recomputed on every
    /// convergence (few pods have any).
    pub want: BTreeMap<String, AuditWant>,
    /// Why a pod (or an interface) is not audited as its plan says, by
    /// "namespace/name" (or interface name); never affects enforcement.
    pub errors: BTreeMap<String, String>,
    /// A staged (audit) entry could not be written or removed: retried on
    /// ticks like failed enforcement writes (compile errors are not).
    pub retry: bool,
}

/// The audit tables an interface wants, per direction; None: no staged
/// policy applies there.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct AuditWant {
    pub ingress: Option<Arc<PolicySet>>,
    pub egress: Option<Arc<PolicySet>>,
}

/// An interface's audit as written: the tables its endpoint slot's staged
/// word names.
#[derive(Clone, Debug)]
pub(super) struct RealizedAudit {
    pub ifindex: u32,
    pub ingress: Option<Arc<PolicySet>>,
    pub egress: Option<Arc<PolicySet>>,
    pub entry: AuditEntry,
}

impl RealizedAudit {
    /// (table id, content) of each direction with a table.
    pub fn tables(&self) -> impl Iterator<Item = (PolicyId, &Arc<PolicySet>)> {
        [
            (self.entry.ingress, self.ingress.as_ref()),
            (self.entry.egress, self.egress.as_ref()),
        ]
        .into_iter()
        .filter_map(|(id, s)| Some((id, s?)))
    }
}

/// What each wanted interface must audit, and why a pod is not audited as
/// its plan says. Pure: only pods whose policy is known are audited (a
/// waiting, held or unprotected pod has no plan to stage against).
pub(super) fn desired_audit<'a>(
    want: &Desired,
    knowledge: &dyn Fn(&PodKey) -> Knowledge<'a>,
    compile_set: &mut Compiler<'_>,
) -> (BTreeMap<String, AuditWant>, BTreeMap<String, String>) {
    let mut out = BTreeMap::new();
    let mut errors = BTreeMap::new();
    for (ifname, de) in &want.endpoints {
        let Claim::Pod(key) = &de.claim else { continue };
        let Knowledge::Known(policy) = knowledge(key) else {
            continue;
        };
        if policy.audit_ingress.is_none() && policy.audit_egress.is_none() {
            continue;
        }
        let mut failed = None;
        let mut direction = |d: Option<&palisade_proto::v1::DirectionPolicy>, name: &str| {
            let d = d?;
            match compile_set(d) {
                Ok(set) => Some(set),
                Err(e) => {
                    failed = Some(format!(
                        "{}/{}: staged (audit) {name} policy cannot be compiled, so it is not audited (enforcement is unaffected): {e}",
                        key.0, key.1
                    ));
                    None
                }
            }
        };
        let audit = AuditWant {
            ingress: direction(policy.audit_ingress.as_ref(), "ingress"),
            egress: direction(policy.audit_egress.as_ref(), "egress"),
        };
        if let Some(e) = failed {
            // Half an audit would report half the truth: none at all.
            errors.insert(format!("{}/{}", key.0, key.1), e);
            continue;
        }
        out.insert(ifname.clone(), audit);
    }
    (out, errors)
}

impl<D: Datapath> Reconciler<D> {
    /// Step 2b of `apply`, after the enforced endpoints are written: makes
    /// every attached interface's staged word name the tables it
    /// wants (tables first), and removes the entries nothing wants.
    pub(super) fn apply_audit(&mut self) {
        let wants = std::mem::take(&mut self.audit.want);
        self.audit.retry = false;
        // Stale entries go first: an interface gone may have left its index
        // to a new one, whose entry is written below.
        let stale: Vec<String> = self
            .realized
            .audit
            .iter()
            .filter(|(n, ra)| {
                !wants.contains_key(*n)
                    || self
                        .realized
                        .endpoints
                        .get(*n)
                        .is_none_or(|re| re.ifindex != ra.ifindex)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for ifname in stale {
            self.unrealize_audit(&ifname);
        }
        for (ifname, aw) in &wants {
            let Some(re) = self.realized.endpoints.get(ifname) else {
                // Its endpoint could not be written: nothing to audit.
                continue;
            };
            let (ifindex, pod) = (re.ifindex, re.claim.pod().cloned());
            if let Err(e) = self.realize_audit(ifname, ifindex, aw) {
                self.audit.retry = true;
                let who = pod.map_or_else(|| ifname.clone(), |p| format!("{}/{}", p.0, p.1));
                self.audit.errors.insert(
                    who.clone(),
                    format!("{who}: staged (audit) policies not audited on {ifname} (enforcement is unaffected): {e}"),
                );
            }
        }
        self.audit.want = wants;
    }

    fn realize_audit(&mut self, ifname: &str, ifindex: u32, aw: &AuditWant) -> Result<(), String> {
        let mut id_of = |s: &Option<Arc<PolicySet>>| -> Result<PolicyId, String> {
            let Some(set) = s else { return Ok(0) };
            if let Some(RealizedPolicy { id, .. }) = self.realized.policies.get(set) {
                return Ok(*id);
            }
            self.add_policy_set(set)?;
            Ok(self.realized.policies[set].id)
        };
        let entry = AuditEntry {
            ingress: id_of(&aw.ingress)?,
            egress: id_of(&aw.egress)?,
        };
        if let Some(ra) = self.realized.audit.get_mut(ifname) {
            if ra.ifindex != ifindex {
                // Its old interface's entry could not be removed (stale
                // entries went first): try again next time.
                return Err("the previous interface's entry is still there".into());
            }
            if ra.entry == entry {
                ra.ingress = aw.ingress.clone();
                ra.egress = aw.egress.clone();
                return Ok(());
            }
        }
        self.datapath
            .set_audit(ifindex, &entry)
            .counted(&mut self.health)
            .map_err(|e| e.to_string())?;
        self.realized.audit.insert(
            ifname.to_string(),
            RealizedAudit {
                ifindex,
                ingress: aw.ingress.clone(),
                egress: aw.egress.clone(),
                entry,
            },
        );
        Ok(())
    }

    /// Removes an interface's audit entry. A failed removal keeps the record
    /// (and so the tables it names) and is retried on the next convergence.
    pub(super) fn unrealize_audit(&mut self, ifname: &str) -> bool {
        let Some(ra) = self.realized.audit.get(ifname) else {
            return true;
        };
        match self
            .datapath
            .remove_audit(ra.ifindex)
            .counted(&mut self.health)
        {
            Ok(()) => {
                self.realized.audit.remove(ifname);
                true
            }
            Err(e) => {
                self.audit.retry = true;
                self.audit.errors.insert(
                    ifname.to_string(),
                    format!("{ifname}: removing its staged (audit) entry: {e}; retrying"),
                );
                false
            }
        }
    }

    /// A previous process's audit entries name tables this one may remove
    /// or renumber: they go before anything else is done, and the first
    /// convergence writes what the plan stages. Only reporting pauses.
    pub(super) fn forget_adopted_audit(&mut self) {
        let entries = match self.datapath.audit_entries().counted(&mut self.health) {
            Ok(e) => e,
            Err(e) => {
                self.health.warn(format!(
                    "reading the staged (audit) entries left behind: {e}"
                ));
                return;
            }
        };
        for ifindex in entries.keys() {
            if let Err(e) = self
                .datapath
                .remove_audit(*ifindex)
                .counted(&mut self.health)
            {
                self.health.warn(format!(
                    "removing the staged (audit) entry of ifindex {ifindex} left behind: {e}"
                ));
            }
        }
    }

    /// Errors of staged policies, one per pod (or interface), for the state.
    pub(super) fn audit_error_lines(&self) -> impl Iterator<Item = &String> {
        self.audit.errors.values()
    }
}

#[cfg(test)]
mod tests {
    //! Staged (audit) policies in the reconciler, on the fake datapath (which
    //! checks after every operation that no audit entry names a missing table).

    use super::super::fixtures::{pod_up as up, snapshot};
    use super::super::*;
    use crate::checkpoint::Checkpoint;
    use crate::datapath::fake::FakeDatapath;
    use crate::datapath::AuditEntry;
    use palisade_proto::v1::PodRef;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PortRange, Protocol, Rule};
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
            ..Default::default()
        }
    }

    fn union(a: DirectionPolicy, b: DirectionPolicy) -> DirectionPolicy {
        DirectionPolicy {
            rules: a.rules.into_iter().chain(b.rules).collect(),
            ..Default::default()
        }
    }

    fn deny() -> DirectionPolicy {
        DirectionPolicy::default()
    }

    /// Pod x/`name` enforcing `ingress`, with `audit` as its audit ingress.
    fn pod(
        name: &str,
        ingress: Option<DirectionPolicy>,
        audit: Option<DirectionPolicy>,
    ) -> PodPolicy {
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
            ..Default::default()
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
}
