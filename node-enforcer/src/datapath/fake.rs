//! An in-memory datapath that checks, after every operation, the invariant a
//! packet could observe: every endpoint refers only to complete tables; and
//! during an in-place edit of a table, after every single-key write, that
//! every address sees its old or its new value. It also keeps each
//! endpoint's epochs as the real datapath does, and which directions still
//! owe a renewal after their table was narrowed in place.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Adopted, AuditEntry, Datapath, DatapathError, DatapathErrorKind, EndpointEntry, PolicyId,
    PortSetId, Result,
};
use crate::compile::{PortSet, Prefix};

#[derive(Debug, Default)]
pub struct FakeDatapath {
    pub interfaces: BTreeMap<String, u32>,
    pub attached: BTreeSet<String>,
    /// The index each attachment was made on: the kernel's programs are on
    /// an interface, not a name, and go with it.
    pub attached_at: BTreeMap<String, u32>,
    pub endpoints: BTreeMap<u32, EndpointEntry>,
    pub policies: BTreeMap<PolicyId, Vec<(Prefix, PortSetId)>>,
    pub portsets: BTreeMap<PortSetId, PortSet>,
    pub log: Vec<String>,
    /// Interfaces whose attach fails, to test error paths.
    pub fail_attach: BTreeSet<String>,
    /// Operations that fail, by the start of their log line
    /// (`"add_policy"`, `"set_endpoint 10"`, `"detach veth-a"`, ...).
    pub fail: BTreeSet<String>,
    pub node_addresses: Vec<std::net::IpAddr>,
    /// Set when an operation left a window a packet could see.
    pub violations: Vec<String>,
    /// Each endpoint's (ingress, egress) epochs, as the real datapath keeps
    /// them: fresh when a direction's policy id changes or is renewed.
    pub epochs: BTreeMap<u32, (u32, u32)>,
    pub next_epoch: u32,
    /// Endpoint directions (ifindex, ingress?) whose table was narrowed in
    /// place since their epoch last moved: their established flows would
    /// still pass on what the table no longer allows.
    pub stale_flows: BTreeSet<(u32, bool)>,
    /// The audit table (each endpoint slot's staged word), by ifindex.
    pub audit: BTreeMap<u32, AuditEntry>,
    /// Endpoints whose pod learns by domain name (EP_FLAG_LEARNS).
    pub learns: std::collections::BTreeSet<u32>,
    /// Attach fast, as the real datapath's `AttachMode::Fast`: attached
    /// interfaces are listed unpromoted until `promote`.
    pub fast_attach: bool,
    /// Attached fast and not promoted yet, by name: (ifindex, since).
    pub unpromoted: BTreeMap<String, (u32, std::time::Instant)>,
    /// Attached interfaces whose links a restart cannot read: `adopt`
    /// lists them as unlocated, as the real datapath does.
    pub unreadable: BTreeSet<String>,
}

impl FakeDatapath {
    pub fn with_interfaces(names: &[&str]) -> Self {
        let mut f = FakeDatapath::default();
        for (i, n) in names.iter().enumerate() {
            f.interfaces.insert(n.to_string(), 10 + i as u32);
        }
        f
    }

    /// Fails `op` if a test asked for it, before it changes anything.
    fn injected(&self, op: &str) -> Result<()> {
        match self.fail.iter().find(|f| op.starts_with(f.as_str())) {
            // Stands in for a kernel that refuses.
            Some(f) => Err(DatapathError::new(
                DatapathErrorKind::Kernel,
                format!("{op}: injected failure ({f})"),
            )),
            None => Ok(()),
        }
    }

    fn check(&mut self, op: &str) {
        self.log.push(op.to_string());
        for (ifindex, e) in &self.endpoints {
            for id in [&e.ingress, &e.egress] {
                // 0: not isolated; u32::MAX: the reconciler's deny-all, which
                // no table ever has, on purpose.
                if *id == 0 || *id == u32::MAX {
                    continue;
                }
                match self.policies.get(id) {
                    None => self.violations.push(format!(
                        "after {op}: endpoint {ifindex} refers to missing policy {id}"
                    )),
                    Some(entries) => {
                        for (_, ps) in entries {
                            if *ps != 0 && !self.portsets.contains_key(ps) {
                                self.violations.push(format!(
                                    "after {op}: policy {id} refers to missing portset {ps}"
                                ));
                            }
                        }
                    }
                }
            }
        }
        // An audit entry naming a missing table would judge new flows by
        // whatever table gets that id next.
        for (ifindex, a) in &self.audit {
            for id in [a.ingress, a.egress] {
                if id != 0 && !self.policies.contains_key(&id) {
                    self.violations.push(format!(
                        "after {op}: audit entry {ifindex} refers to missing policy {id}"
                    ));
                }
            }
        }
        for name in &self.attached {
            let idx = match self.attached_at.get(name) {
                // Gone with its interface: nothing of it runs.
                Some(i) if !self.interfaces.values().any(|l| l == i) => continue,
                Some(i) => *i,
                // Attached by a test, not by `attach`.
                None => self.interfaces.get(name).copied().unwrap_or(0),
            };
            if !self.endpoints.contains_key(&idx) {
                self.violations.push(format!(
                    "after {op}: {name} is attached without an endpoint entry (fails open)"
                ));
            }
        }
    }

    /// Panics naming every moment a packet could have seen a half-made
    /// datapath, and every established flow a narrowed table left
    /// un-judged.
    pub fn assert_no_violations(&self) {
        assert!(self.violations.is_empty(), "{:?}", self.violations);
        assert!(
            self.stale_flows.is_empty(),
            "narrowed in place without an epoch renewal: {:?}",
            self.stale_flows
        );
    }

    fn fresh_epoch(&mut self) -> u32 {
        self.next_epoch = self.next_epoch.wrapping_add(1).max(1);
        self.next_epoch
    }

    /// Checks one intermediate table of an in-place edit of `id` from
    /// `before` to `after`, just after a write to `written`: each address
    /// must see its old or new value. Only addresses inside `written` can
    /// have changed, so only they are tried (every earlier state was
    /// checked the same way).
    fn check_intermediate(
        &mut self,
        op: &str,
        id: PolicyId,
        written: &Prefix,
        before: &[(Prefix, PortSetId)],
        after: &[(Prefix, PortSetId)],
    ) {
        let now = self.policies.get(&id).cloned().unwrap_or_default();
        let inside = before
            .iter()
            .chain(after)
            .map(|(p, _)| p)
            .filter(|p| written.contains(p))
            .chain([written]);
        for addr in witnesses(inside) {
            let (old, new, seen) = (
                lookup(before, &addr),
                lookup(after, &addr),
                lookup(&now, &addr),
            );
            if seen != old && seen != new {
                self.violations.push(format!(
                    "after {op}: {} sees {seen:?}, neither its old {old:?} nor its new {new:?}",
                    addr.display()
                ));
            }
        }
    }

    fn in_use(&self, id: PolicyId) -> Vec<(u32, bool)> {
        self.endpoints
            .iter()
            .flat_map(|(i, e)| {
                [
                    (e.ingress == id).then_some((*i, true)),
                    (e.egress == id).then_some((*i, false)),
                ]
            })
            .flatten()
            .collect()
    }

    /// Nothing attached and no table left.
    pub fn assert_empty(&self) {
        assert!(self.attached.is_empty(), "attached: {:?}", self.attached);
        assert!(self.endpoints.is_empty(), "endpoints: {:?}", self.endpoints);
        assert!(self.policies.is_empty(), "policies: {:?}", self.policies);
        assert!(self.portsets.is_empty(), "portsets: {:?}", self.portsets);
        assert!(self.audit.is_empty(), "audit: {:?}", self.audit);
    }

    /// The endpoint entry of an interface, by name.
    pub fn endpoint_of(&self, ifname: &str) -> Option<(PolicyId, PolicyId)> {
        let idx = self.interfaces.get(ifname)?;
        self.endpoints.get(idx).map(|e| (e.ingress, e.egress))
    }
}

impl Datapath for FakeDatapath {
    fn adopt(&mut self) -> Result<Adopted> {
        Ok(Adopted {
            endpoints: self.endpoints.clone(),
            policies: self.policies.clone(),
            portsets: self.portsets.clone(),
            attached: self
                .attached
                .iter()
                .filter(|n| !self.unreadable.contains(*n))
                .map(|n| {
                    let at = self.attached_at.get(n).or(self.interfaces.get(n));
                    (n.clone(), at.copied().unwrap_or(0))
                })
                .collect(),
            unlocated: self.unreadable.clone(),
            ..Adopted::default()
        })
    }
    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()> {
        self.injected(&format!("add_portset {id}"))?;
        self.portsets.insert(id, set.clone());
        self.check(&format!("add_portset {id}"));
        Ok(())
    }
    fn remove_portset(&mut self, id: PortSetId, _: &PortSet) -> Result<()> {
        self.injected(&format!("remove_portset {id}"))?;
        self.portsets.remove(&id);
        self.check(&format!("remove_portset {id}"));
        Ok(())
    }
    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()> {
        self.injected(&format!("add_policy {id}"))?;
        // Adds to the table, as the maps do: a big table comes in slices.
        self.policies
            .entry(id)
            .or_default()
            .extend_from_slice(entries);
        self.check(&format!("add_policy {id}"));
        Ok(())
    }
    fn remove_policy(&mut self, id: PolicyId, _: &[(Prefix, PortSetId)]) -> Result<()> {
        self.injected(&format!("remove_policy {id}"))?;
        self.policies.remove(&id);
        self.check(&format!("remove_policy {id}"));
        Ok(())
    }
    fn update_policy(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()> {
        self.injected(&format!("update_policy {id}"))?;
        let before = self.policies.get(&id).cloned().ok_or_else(|| {
            DatapathError::invariant(format!("update_policy {id}: no such table"))
        })?;
        let mut after: BTreeMap<Prefix, PortSetId> = before.iter().copied().collect();
        after.extend(upserts.iter().copied());
        for p in removals {
            after.remove(p);
        }
        let after: Vec<(Prefix, PortSetId)> = after.into_iter().collect();
        let users = self.in_use(id);
        let writes = upserts
            .iter()
            .map(|(p, ps)| (*p, Some(*ps)))
            .chain(removals.iter().map(|p| (*p, None)));
        let mut narrowed = false;
        let mut result = Ok(());
        for (prefix, value) in writes {
            let op = match value {
                Some(ps) => format!("update_policy {id} upsert {} {ps}", prefix.display()),
                None => format!("update_policy {id} remove {}", prefix.display()),
            };
            if let Err(e) = self.injected(&op) {
                result = Err(e);
                break;
            }
            let table = self.policies.entry(id).or_default();
            let old = table.iter().position(|(p, _)| *p == prefix);
            if prefix.len != 128 && (old.is_none() || value.is_none()) && !users.is_empty() {
                self.violations.push(format!(
                    "{op}: adds or removes a non-host prefix of a table in use"
                ));
            }
            match (old, value) {
                (Some(i), Some(ps)) => {
                    narrowed |= table[i].1 != ps;
                    table[i].1 = ps;
                }
                (None, Some(ps)) => {
                    table.push((prefix, ps));
                    table.sort();
                }
                (Some(i), None) => {
                    narrowed = true;
                    table.remove(i);
                }
                (None, None) => {}
            }
            self.check(&op);
            self.check_intermediate(&op, id, &prefix, &before, &after);
        }
        if narrowed {
            self.stale_flows.extend(users);
        }
        result
    }
    fn renew_epochs(&mut self, ifindex: u32, ingress: bool, egress: bool) -> Result<()> {
        self.injected(&format!("renew_epochs {ifindex}"))?;
        if !self.endpoints.contains_key(&ifindex) {
            return Err(DatapathError::invariant(format!(
                "renew_epochs {ifindex}: no such endpoint"
            )));
        }
        let fresh = self.fresh_epoch();
        let e = self.epochs.entry(ifindex).or_default();
        if ingress {
            e.0 = fresh;
            self.stale_flows.remove(&(ifindex, true));
        }
        if egress {
            e.1 = fresh;
            self.stale_flows.remove(&(ifindex, false));
        }
        self.check(&format!("renew_epochs {ifindex} {ingress} {egress}"));
        Ok(())
    }
    fn ifindex(&mut self, ifname: &str) -> Result<u32> {
        self.interfaces.get(ifname).copied().ok_or_else(|| {
            DatapathError::new(
                DatapathErrorKind::InterfaceGone,
                format!("interface {ifname:?} does not exist"),
            )
        })
    }
    fn interfaces(&mut self) -> Result<BTreeMap<String, u32>> {
        // A reading that failed (no socket, say), which is not "gone".
        self.injected("interfaces")?;
        Ok(self.interfaces.clone())
    }
    fn interfaces_indexed(&mut self, indexes: &[u32]) -> Result<BTreeMap<u32, String>> {
        self.injected("interfaces_indexed")?;
        Ok(self
            .interfaces
            .iter()
            .filter(|(_, i)| indexes.contains(i))
            .map(|(n, i)| (*i, n.clone()))
            .collect())
    }
    fn attach(&mut self, ifname: &str, ifindex: u32) -> Result<()> {
        if self.fail_attach.contains(ifname) {
            return Err(DatapathError::new(
                DatapathErrorKind::Kernel,
                format!("attach to {ifname}: injected failure"),
            ));
        }
        self.injected(&format!("attach {ifname}"))?;
        if self.fast_attach && !self.attached.contains(ifname) {
            let index = self.interfaces.get(ifname).copied().unwrap_or(0);
            self.unpromoted
                .insert(ifname.to_string(), (index, std::time::Instant::now()));
        }
        self.attached.insert(ifname.to_string());
        self.attached_at.insert(ifname.to_string(), ifindex);
        self.check(&format!("attach {ifname}"));
        Ok(())
    }
    fn detach(&mut self, ifname: &str, _: u32) -> Result<()> {
        self.injected(&format!("detach {ifname}"))?;
        self.attached.remove(ifname);
        self.attached_at.remove(ifname);
        self.unpromoted.remove(ifname);
        self.check(&format!("detach {ifname}"));
        Ok(())
    }
    fn unpromoted(&self) -> Vec<(String, u32, std::time::Instant)> {
        let mut out: Vec<_> = self
            .unpromoted
            .iter()
            .map(|(n, (i, t))| (n.clone(), *i, *t))
            .collect();
        out.sort_by_key(|(_, _, t)| *t);
        out
    }
    fn promote(&mut self, ifname: &str) -> Result<()> {
        self.injected(&format!("promote {ifname}"))?;
        self.unpromoted.remove(ifname);
        self.check(&format!("promote {ifname}"));
        Ok(())
    }
    fn set_endpoint(&mut self, ifindex: u32, entry: &EndpointEntry) -> Result<()> {
        self.injected(&format!("set_endpoint {ifindex}"))?;
        // As the real datapath: a direction whose policy id changes (or a
        // new endpoint) gets a fresh epoch; one that keeps it keeps its own.
        let old = self.endpoints.insert(ifindex, entry.clone());
        let (mut ingress, mut egress) = self.epochs.get(&ifindex).copied().unwrap_or_default();
        let fresh = self.fresh_epoch();
        if old.as_ref().is_none_or(|o| o.ingress != entry.ingress) {
            ingress = fresh;
            self.stale_flows.remove(&(ifindex, true));
        }
        if old.as_ref().is_none_or(|o| o.egress != entry.egress) {
            egress = fresh;
            self.stale_flows.remove(&(ifindex, false));
        }
        self.epochs.insert(ifindex, (ingress, egress));
        self.check(&format!(
            "set_endpoint {ifindex} {} {}",
            entry.ingress, entry.egress
        ));
        Ok(())
    }
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        self.injected(&format!("remove_endpoint {ifindex}"))?;
        self.endpoints.remove(&ifindex);
        self.epochs.remove(&ifindex);
        self.learns.remove(&ifindex);
        self.stale_flows.retain(|(i, _)| *i != ifindex);
        self.check(&format!("remove_endpoint {ifindex}"));
        Ok(())
    }
    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        Ok(self.node_addresses.clone())
    }
    fn describe(&self) -> String {
        "fake".into()
    }
    fn set_learns(&mut self, ifindex: u32, learns: bool) -> Result<()> {
        self.injected(&format!("set_learns {ifindex}"))?;
        if !self.endpoints.contains_key(&ifindex) {
            return Err(crate::datapath::DatapathError::invariant(format!(
                "flags for ifindex {ifindex}: it has no endpoint entry"
            )));
        }
        if learns {
            self.learns.insert(ifindex);
        } else {
            self.learns.remove(&ifindex);
        }
        Ok(())
    }

    fn set_audit(&mut self, ifindex: u32, entry: &AuditEntry) -> Result<()> {
        self.injected(&format!("set_audit {ifindex}"))?;
        self.audit.insert(ifindex, *entry);
        self.check(&format!(
            "set_audit {ifindex} {} {}",
            entry.ingress, entry.egress
        ));
        Ok(())
    }
    fn remove_audit(&mut self, ifindex: u32) -> Result<()> {
        self.injected(&format!("remove_audit {ifindex}"))?;
        self.audit.remove(&ifindex);
        self.check(&format!("remove_audit {ifindex}"));
        Ok(())
    }
    fn audit_entries(&mut self) -> Result<BTreeMap<u32, AuditEntry>> {
        self.injected("audit_entries")?;
        Ok(self.audit.clone())
    }
}

/// The value a table gives an address: its longest matching prefix's port
/// set, None on a miss.
fn lookup(table: &[(Prefix, PortSetId)], addr: &Prefix) -> Option<PortSetId> {
    table
        .iter()
        .filter(|(p, _)| p.contains(addr))
        .max_by_key(|(p, _)| p.len)
        .map(|(_, ps)| *ps)
}

/// Host addresses that between them fall in every region the given prefixes
/// cut the address space into (near enough for the tables tests make): each
/// prefix's first and last address and the first one's neighbour.
fn witnesses<'a>(prefixes: impl Iterator<Item = &'a Prefix>) -> BTreeSet<Prefix> {
    let mut out = BTreeSet::new();
    for p in prefixes {
        let first = u128::from_be_bytes(p.addr);
        let host_bits = 128 - u32::from(p.len);
        let last = if host_bits == 0 {
            first
        } else {
            first | (u128::MAX >> (128 - host_bits))
        };
        for a in [first, last, first ^ 1] {
            if p.contains(&Prefix::new(a.to_be_bytes(), 128)) {
                out.insert(Prefix::new(a.to_be_bytes(), 128));
            }
        }
    }
    out
}
