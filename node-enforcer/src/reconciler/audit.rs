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
/// pending, held or unprotected pod has no plan to stage against).
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
