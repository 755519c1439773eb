//! Makes the datapath match the inputs: computes the desired endpoints and
//! applies the difference, make before break, with tables shared by content
//! and removed only when nothing attached references them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::dump::Counted;
use super::realized::{RealizedEndpoint, RealizedPolicy};
use super::{Reconciler, DENY_ALL};
use crate::compile::{compile_limited, PolicySet, PortSet, Prefix};
use crate::datapath::{Datapath, EndpointEntry, PolicyId, PortSetId};
use crate::desired::{
    desired_pod, desired_unexplained, desired_with, Claim, Desired, Held, Inputs, Knowledge,
    NoTable, PodKey, Verdict,
};
use palisade_proto::v1::DirectionPolicy;
use prost::Message;

/// What `converge` aims at: the desired datapath as last computed, and the
/// inputs it is computed from besides the plan and the pods.
#[derive(Default)]
pub(super) struct Target {
    /// The desired datapath as last computed; pods are recomputed when
    /// their inputs change, everything when shared inputs do.
    pub desired: Desired,
    /// Compiled policies by the encoded direction policy; cleared when the
    /// node's addresses change (they are part of every compiled table).
    pub compiled: std::collections::HashMap<Vec<u8>, Result<Arc<PolicySet>, String>>,
    pub node_addresses: Vec<Prefix>,
}

impl<D: Datapath> Reconciler<D> {
    /// Reads the node's addresses; true when they changed.
    pub(super) fn refresh_node_addresses(&mut self) -> bool {
        match self.datapath.node_addresses().counted(&mut self.health) {
            Ok(addrs) => {
                let mut prefixes: Vec<Prefix> = addrs
                    .into_iter()
                    .map(|ip| Prefix::from_ip(ip, if ip.is_ipv4() { 32 } else { 128 }))
                    .collect();
                prefixes.sort();
                prefixes.dedup();
                let changed = prefixes != self.target.node_addresses;
                self.target.node_addresses = prefixes;
                changed
            }
            Err(e) => {
                // Keep the last known addresses: forgetting them would cut
                // the node off from its pods.
                tracing::warn!("{e}");
                false
            }
        }
    }

    /// Forgets every compiled table (the node's addresses are in each).
    pub(super) fn forget_compiled(&mut self) {
        self.target.compiled.clear();
        self.background.forget();
    }

    /// What the enforcer knows about a pod's policy (see [`Knowledge`]).
    pub(super) fn knowledge(&self, key: &PodKey) -> Knowledge<'_> {
        if let Some(p) = self.plan.entries.get(key).filter(|_| self.plan.received) {
            return Knowledge::Known(p);
        }
        if let Some(p) = self.plan.fetched.get(key) {
            return Knowledge::Known(p);
        }
        if self.pods.waiting.contains_key(key) {
            return Knowledge::Waiting;
        }
        if self.pods.unprotected.contains(key) {
            return Knowledge::Unprotected;
        }
        Knowledge::Hold
    }

    /// Re-reads the index of every interface any pod or realized endpoint
    /// names (after link events and on ticks; pod-up looks its own up).
    /// An interface whose name no longer finds it but whose index lives
    /// was renamed: it stays live under the name we know it by.
    pub(super) fn refresh_links(&mut self) {
        let names: BTreeSet<&str> = self
            .pods
            .runtime
            .values()
            .flat_map(|p| p.host_interfaces.iter())
            .chain(self.realized.endpoints.keys())
            .map(String::as_str)
            .collect();
        let names: Vec<&str> = names.into_iter().collect();
        // Keep what was known when a reading fails: forgetting interfaces
        // would detach pods.
        let mut live = match self
            .datapath
            .interfaces_named(&names)
            .counted(&mut self.health)
        {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        // The interfaces we know whose name no longer finds them.
        let lost: BTreeSet<(String, u32)> = self
            .pods
            .runtime
            .values()
            .flat_map(|p| p.ifindexes.iter().map(|(n, i)| (n.clone(), *i)))
            .chain(
                self.realized
                    .endpoints
                    .iter()
                    .map(|(n, e)| (n.clone(), e.ifindex)),
            )
            .filter(|(n, i)| live.get(n) != Some(i))
            .collect();
        let mut renamed = BTreeMap::new();
        if !lost.is_empty() {
            let indexes: Vec<u32> = lost.iter().map(|(_, i)| *i).collect();
            let now = match self
                .datapath
                .interfaces_indexed(&indexes)
                .counted(&mut self.health)
            {
                Ok(now) => now,
                Err(e) => {
                    tracing::warn!("{e}");
                    return;
                }
            };
            for (name, index) in lost {
                let Some(now) = now.get(&index).filter(|now| **now != name) else {
                    continue;
                };
                // Renamed: its programs are on the interface, and its links
                // are known by the old name, so it is followed by index.
                // Unless a newer interface has the name now, which a pod-up
                // of that name then waits for (the old one is never
                // detached while it lives).
                live.entry(name.clone()).or_insert(index);
                renamed.insert(name, (index, now.clone()));
            }
        }
        for (was, (index, now)) in &renamed {
            if self.pods.renamed.get(was) != Some(&(*index, now.clone())) {
                self.health.warn(renamed_warning(was, *index, now));
            }
        }
        self.pods.renamed = renamed;
        self.pods.live = live;
    }

    /// The interfaces that exist, as last read.
    pub(super) fn live_interfaces(&self) -> &BTreeMap<String, u32> {
        &self.pods.live
    }

    /// What each interface no pod explains enforces now.
    fn unexplained(&self) -> Held {
        self.realized
            .endpoints
            .iter()
            .filter(|(_, e)| e.claim == Claim::Unexplained)
            .map(|(n, e)| (n.clone(), (e.ifindex, e.enforced())))
            .collect()
    }

    /// Recomputes everything and applies the difference.
    pub(super) fn converge(&mut self) {
        // Shared inputs are re-read when everything is recomputed anyway.
        if self.refresh_node_addresses() {
            self.forget_compiled();
        }
        self.converge_scope(None);
    }

    /// Recomputes only these pods' endpoints (and the unexplained ones),
    /// then applies the difference: a pod coming or going costs in
    /// proportion to that pod, not to the node.
    pub(super) fn converge_pods<'k>(&mut self, pods: impl IntoIterator<Item = &'k PodKey>) {
        let set: BTreeSet<PodKey> = pods.into_iter().cloned().collect();
        self.converge_scope(Some(set));
    }

    fn converge_scope(&mut self, scope: Option<BTreeSet<PodKey>>) {
        let unexplained = self.unexplained();
        let mut compiled = std::mem::take(&mut self.target.compiled);
        let mut background = std::mem::take(&mut self.background);
        let mut want = std::mem::take(&mut self.target.desired);
        // The interfaces a scoped change can touch; None: all of them.
        let mut affected: Option<BTreeSet<String>> = None;
        let audit;
        {
            let node_addresses = &self.target.node_addresses;
            let mut compile_set = |d: &DirectionPolicy| -> Result<Arc<PolicySet>, NoTable> {
                let key = d.encode_to_vec();
                if let Some(r) = compiled.get(&key) {
                    return r.clone().map_err(NoTable::Failed);
                }
                // A big policy compiles off this thread; its pods wait.
                if let Some(in_flight) = background.defer(&key, d, node_addresses) {
                    return Err(in_flight);
                }
                let r = compile_limited(d, node_addresses, background.max_entries)
                    .map(Arc::new)
                    .map_err(|e| e.to_string());
                compiled.insert(key, r.clone());
                r.map_err(NoTable::Failed)
            };
            let realized = &self.realized.endpoints;
            let held = |n: &str| realized.get(n).map(|e| (e.ifindex, e.enforced()));
            let knowledge = |k: &PodKey| self.knowledge(k);
            let inputs = Inputs {
                mode: self.ctx.mode,
                pods: &self.pods.runtime,
                knowledge: &knowledge,
                live: &self.pods.live,
                unexplained: &unexplained,
                held: &held,
                node_addresses,
            };
            match &scope {
                None => want = desired_with(&inputs, &mut compile_set),
                Some(pods) => {
                    let mut names = BTreeSet::new();
                    want.endpoints.retain(|n, e| {
                        let keep = match &e.claim {
                            Claim::Pod(k) => !pods.contains(k),
                            Claim::Unexplained => false,
                        };
                        if !keep {
                            names.insert(n.clone());
                        }
                        keep
                    });
                    for (n, e) in &self.realized.endpoints {
                        if e.claim.pod().is_none_or(|k| pods.contains(k)) {
                            names.insert(n.clone());
                        }
                    }
                    for k in pods {
                        if let Some(rt) = self.pods.runtime.get(k) {
                            names.extend(rt.host_interfaces.iter().cloned());
                        }
                    }
                    affected = Some(names);
                    for k in pods {
                        want.errors.remove(k);
                        want.awaiting_tables.remove(k);
                        let Some(rt) = self.pods.runtime.get(k) else {
                            continue;
                        };
                        let d = desired_pod(&inputs, k, rt, &mut compile_set);
                        want.endpoints.extend(d.endpoints);
                        if let Some(e) = d.error {
                            want.errors.insert(k.clone(), e);
                        }
                        if d.awaiting_table {
                            want.awaiting_tables.insert(k.clone());
                        }
                    }
                    for ifname in unexplained.keys() {
                        if want.endpoints.contains_key(ifname) {
                            continue;
                        }
                        if let Some(e) = desired_unexplained(&inputs, ifname) {
                            want.endpoints.insert(ifname.clone(), e);
                        }
                    }
                }
            }
            // Audit is computed from the finished enforced state, and only
            // read by `apply_audit`.
            audit = super::audit::desired_audit(&want, &knowledge, &mut compile_set);
        }
        self.background = background;
        (self.audit.want, self.audit.errors) = audit;
        self.apply(&want, affected.as_ref());
        self.target.desired = want;
        // Forget compiled tables nothing wants or holds any more: under peer
        // churn every change compiles new ones, which would pile up.
        compiled.retain(|_, r| r.as_ref().map_or(true, |s| Arc::strong_count(s) > 1));
        self.target.compiled = compiled;
    }

    /// Where the incrementally kept desired state differs from a full
    /// recomputation (None: nowhere). Tests call it after every step.
    pub fn desired_drift(&self) -> Option<String> {
        let kept = self.target.desired.clone();
        let unexplained = self.unexplained();
        let realized = &self.realized.endpoints;
        let held = |n: &str| realized.get(n).map(|e| (e.ifindex, e.enforced()));
        let knowledge = |k: &PodKey| self.knowledge(k);
        let full = crate::desired::desired(&Inputs {
            mode: self.ctx.mode,
            pods: &self.pods.runtime,
            knowledge: &knowledge,
            live: &self.pods.live,
            unexplained: &unexplained,
            held: &held,
            node_addresses: &self.target.node_addresses,
        });
        (full != kept).then(|| format!("incremental {kept:?}\nfull {full:?}"))
    }

    /// Makes the datapath hold `want`: tables first, then endpoints, then
    /// whatever nothing references any more.
    /// `affected`: the only interfaces that can differ from what is
    /// realized (a scoped change); None: look at every one.
    fn apply(&mut self, want: &Desired, affected: Option<&BTreeSet<String>>) {
        let in_scope = |n: &str| affected.is_none_or(|a| a.contains(n));
        match affected {
            None => {
                self.health.failures.clear();
                self.health.errors.clear();
                // Not a datapath operation, and failed until a save works.
                self.health.errors.extend(self.plan.save_error.clone());
            }
            Some(_) => {
                let claimed_pod = |e: &Claim| e.pod().cloned();
                let pods: BTreeSet<PodKey> = want
                    .endpoints
                    .iter()
                    .filter(|(n, _)| in_scope(n))
                    .filter_map(|(_, e)| claimed_pod(&e.claim))
                    .chain(
                        self.realized
                            .endpoints
                            .iter()
                            .filter(|(n, _)| in_scope(n))
                            .filter_map(|(_, e)| claimed_pod(&e.claim)),
                    )
                    .collect();
                self.health.failures.retain(|k, _| !pods.contains(k));
            }
        }
        let endpoints: Vec<(&String, &crate::desired::DesiredEndpoint)> = match affected {
            None => want.endpoints.iter().collect(),
            Some(a) => a
                .iter()
                .filter_map(|n| want.endpoints.get_key_value(n))
                .collect(),
        };

        // 0. Tables whose users all move to one new content are edited in
        //    place where that is safe, instead of being written anew.
        self.edit_tables_in_place(want, &in_scope);

        // 1. Tables every desired endpoint needs, before anything points at
        //    them. Equal policies share one Arc (compilation is memoized),
        //    so most duplicates are dropped by address before any content
        //    is compared.
        let mut seen: std::collections::HashSet<*const PolicySet> = Default::default();
        let mut needed: Vec<Arc<PolicySet>> = Vec::new();
        for (_, e) in &endpoints {
            for v in [&e.ingress, &e.egress] {
                if let Verdict::Policy(s) = v {
                    if seen.insert(Arc::as_ptr(s)) {
                        needed.push(s.clone());
                    }
                }
            }
        }
        let mut failed_sets: BTreeMap<Arc<PolicySet>, String> = BTreeMap::new();
        for set in &needed {
            if self.realized.policies.contains_key(set) {
                continue;
            }
            if let Err(e) = self.add_policy_set(set) {
                failed_sets.insert(set.clone(), e);
            }
        }

        // 2. Endpoints: point each interface at its tables, then attach. An
        //    interface that keeps its index is updated in place with one map
        //    write, never detached, so no packet sees it unenforced.
        //    Tables are found by the Arc first: a lookup by content compares
        //    whole tables when it finds one.
        let by_ptr: std::collections::HashMap<*const PolicySet, PolicyId> = self
            .realized
            .policies
            .iter()
            .map(|(s, p)| (Arc::as_ptr(s), p.id))
            .collect();
        for (ifname, de) in endpoints {
            let id_of = |v: &Verdict| -> PolicyId {
                match v {
                    Verdict::Open => 0,
                    Verdict::Deny => DENY_ALL,
                    // A table that could not be written denies everything.
                    Verdict::Policy(s) => {
                        by_ptr.get(&Arc::as_ptr(s)).copied().unwrap_or_else(|| {
                            self.realized.policies.get(s).map_or(DENY_ALL, |p| p.id)
                        })
                    }
                }
            };
            let entry = EndpointEntry {
                ingress: id_of(&de.ingress),
                egress: id_of(&de.egress),
                pod_addrs: de.pod_addrs.clone(),
            };
            let pod = de.claim.pod().cloned();
            for v in [&de.ingress, &de.egress] {
                if let Verdict::Policy(s) = v {
                    if let (Some(e), Some(p)) = (failed_sets.get(s), &pod) {
                        self.fail(
                            Some(p),
                            format!(
                                "policy of {}/{} not written, so it is denied: {e}",
                                p.0, p.1
                            ),
                        );
                    }
                }
            }
            let realized = RealizedEndpoint {
                ifindex: de.ifindex,
                claim: de.claim.clone(),
                ingress: de.ingress.clone(),
                egress: de.egress.clone(),
                entry: entry.clone(),
            };
            if let Some(re) = self.realized.endpoints.get(ifname) {
                if re.ifindex == de.ifindex {
                    if re.entry != entry {
                        if let Err(e) = self
                            .datapath
                            .set_endpoint(de.ifindex, &entry)
                            .counted(&mut self.health)
                        {
                            // The old entry stays: the pod keeps its last
                            // policy, and the error says so.
                            self.fail(
                                pod.as_ref(),
                                format!("{ifname}: {e}; keeping its previous policy"),
                            );
                            continue;
                        }
                    }
                    self.realized.endpoints.insert(ifname.clone(), realized);
                    continue;
                }
                // The name now belongs to a new interface: the old one's
                // link went with it.
                if let Err(e) = self.remove_endpoint(ifname) {
                    // The new interface is left without programs: its
                    // pod's failure, so a pod-up waiting on it is refused
                    // rather than answered as enforced.
                    self.fail(
                        pod.as_ref(),
                        format!(
                            "{ifname} (index {}) is not enforced: the older interface of that name could not be let go ({e})",
                            de.ifindex
                        ),
                    );
                    continue;
                }
            }
            match self.add_endpoint(ifname, de.ifindex, &entry) {
                Ok(()) => {
                    self.realized.endpoints.insert(ifname.clone(), realized);
                }
                Err(e) => self.fail(pod.as_ref(), e),
            }
        }

        // 3. Interfaces nothing wants any more.
        let stale: Vec<String> = self
            .realized
            .endpoints
            .keys()
            .filter(|k| in_scope(k) && !want.endpoints.contains_key(*k))
            .cloned()
            .collect();
        for ifname in stale {
            if let Err(e) = self.remove_endpoint(&ifname) {
                self.health.errors.push(e);
            }
        }

        // 3b. Staged (audit) entries, once the endpoints they judge for are
        //     written; their tables are made like the enforced ones.
        self.apply_audit();

        // 3c. Pods that learn by domain name: flagged, and the learner told.
        self.sync_names(want);

        // 4. Tables no attached endpoint references: only now can they go.
        self.collect_tables();
    }

    pub(super) fn fail(&mut self, pod: Option<&PodKey>, e: String) {
        match pod {
            Some(p) => {
                self.health.failures.insert(p.clone(), e);
            }
            None => self.health.errors.push(e),
        }
    }

    fn collect_tables(&mut self) {
        let mut seen: std::collections::HashSet<*const PolicySet> = Default::default();
        let mut referenced: BTreeSet<Arc<PolicySet>> = BTreeSet::new();
        for e in self.realized.endpoints.values() {
            for v in [&e.ingress, &e.egress] {
                if let Verdict::Policy(s) = v {
                    if seen.insert(Arc::as_ptr(s)) {
                        referenced.insert(s.clone());
                    }
                }
            }
        }
        for a in self.realized.audit.values() {
            for (_, s) in a.tables() {
                if seen.insert(Arc::as_ptr(s)) {
                    referenced.insert(s.clone());
                }
            }
        }
        let unused: Vec<Arc<PolicySet>> = self
            .realized
            .policies
            .keys()
            .filter(|s| !referenced.contains(*s))
            .cloned()
            .collect();
        for set in unused {
            let p = &self.realized.policies[&set];
            match self
                .datapath
                .remove_policy(p.id, &p.entries)
                .counted(&mut self.health)
            {
                Ok(()) => {
                    self.realized.policies.remove(&set);
                }
                Err(e) => self
                    .health
                    .errors
                    .push(format!("removing policy set {}: {e}", set.id())),
            }
        }
        let referenced_ids: BTreeSet<PolicyId> = self
            .realized
            .endpoints
            .values()
            .flat_map(|e| [e.entry.ingress, e.entry.egress])
            .chain(
                self.realized
                    .audit
                    .values()
                    .flat_map(|a| [a.entry.ingress, a.entry.egress]),
            )
            .collect();
        let garbage = std::mem::take(&mut self.realized.garbage_policies);
        for (id, entries) in garbage {
            if referenced_ids.contains(&id) {
                self.realized.garbage_policies.push((id, entries));
                continue;
            }
            if let Err(e) = self
                .datapath
                .remove_policy(id, &entries)
                .counted(&mut self.health)
            {
                self.health
                    .errors
                    .push(format!("removing duplicate policy table {id}: {e}"));
                self.realized.garbage_policies.push((id, entries));
            }
        }
        let used_portsets: BTreeSet<PortSetId> = self
            .realized
            .policies
            .values()
            .flat_map(|p| p.entries.iter().map(|(_, ps)| *ps))
            .chain(self.background.portsets())
            .chain(
                self.realized
                    .garbage_policies
                    .iter()
                    .flat_map(|(_, e)| e.iter().map(|(_, ps)| *ps)),
            )
            .collect();
        for (id, set) in std::mem::take(&mut self.realized.garbage_portsets) {
            if used_portsets.contains(&id) {
                self.realized.garbage_portsets.push((id, set));
                continue;
            }
            if let Err(e) = self
                .datapath
                .remove_portset(id, &set)
                .counted(&mut self.health)
            {
                self.health
                    .errors
                    .push(format!("removing duplicate port set {id}: {e}"));
                self.realized.garbage_portsets.push((id, set));
            }
        }
        let unused: Vec<(PortSet, PortSetId)> = self
            .realized
            .portsets
            .iter()
            .filter(|(_, id)| !used_portsets.contains(id))
            .map(|(s, id)| (s.clone(), *id))
            .collect();
        for (set, id) in unused {
            match self
                .datapath
                .remove_portset(id, &set)
                .counted(&mut self.health)
            {
                Ok(()) => {
                    self.realized.portsets.remove(&set);
                }
                Err(e) => self
                    .health
                    .errors
                    .push(format!("removing port set {id}: {e}")),
            }
        }
    }

    pub(super) fn add_policy_set(&mut self, set: &Arc<PolicySet>) -> Result<(), String> {
        let mut entries = Vec::with_capacity(set.entries.len());
        for (prefix, ports) in &set.entries {
            let ps = if ports.0.is_empty() {
                0
            } else if let Some(id) = self.realized.portsets.get(ports) {
                *id
            } else {
                let id = self.realized.alloc_portset()?;
                self.datapath
                    .add_portset(id, ports)
                    .counted(&mut self.health)
                    .map_err(|e| format!("port set: {e}"))?;
                self.realized.portsets.insert(ports.clone(), id);
                id
            };
            entries.push((*prefix, ps));
        }
        let id = self.alloc_policy()?;
        if let Err(e) = self
            .datapath
            .add_policy(id, &entries)
            .counted(&mut self.health)
        {
            // Leave no half-written table behind; unused port sets go at the
            // end of this step.
            let _ = self.datapath.remove_policy(id, &entries);
            return Err(format!("policy set {}: {e}", set.id()));
        }
        self.realized
            .policies
            .insert(set.clone(), RealizedPolicy { id, entries });
        Ok(())
    }

    fn add_endpoint(
        &mut self,
        ifname: &str,
        ifindex: u32,
        entry: &EndpointEntry,
    ) -> Result<(), String> {
        // The entry goes in before the programs: an attached program with no
        // entry would let everything through.
        self.datapath
            .set_endpoint(ifindex, entry)
            .counted(&mut self.health)
            .map_err(|e| format!("{ifname}: {e}"))?;
        if let Err(e) = self
            .datapath
            .attach(ifname, ifindex)
            .counted(&mut self.health)
        {
            let _ = self.datapath.remove_endpoint(ifindex);
            return Err(format!("{ifname}: {e}"));
        }
        Ok(())
    }

    /// Detaches, then removes the entry. A detach that fails keeps both the
    /// entry and the record: a program with no entry would pass everything.
    /// Ok when the interface is gone from the datapath; Err says why not
    /// (its policy stays in force), for the caller to report.
    pub(super) fn remove_endpoint(&mut self, ifname: &str) -> Result<(), String> {
        let Some(re) = self.realized.endpoints.get(ifname).cloned() else {
            return Ok(());
        };
        // Never while the interface lives under another name: its programs
        // are on it, and removing them leaves it unenforced.
        match self
            .datapath
            .interfaces_indexed(&[re.ifindex])
            .counted(&mut self.health)
        {
            Ok(now) => {
                if let Some(now) = now.get(&re.ifindex).filter(|now| *now != ifname) {
                    return Err(format!(
                        "{ifname} (index {}) lives on as {now}: kept attached with its policy until it goes",
                        re.ifindex
                    ));
                }
            }
            Err(e) => {
                return Err(format!(
                    "{ifname} (index {}): kept attached, as whether it lives on under another name cannot be read: {e}",
                    re.ifindex
                ))
            }
        }
        if let Err(e) = self
            .datapath
            .detach(ifname, re.ifindex)
            .counted(&mut self.health)
        {
            return Err(format!(
                "detaching {ifname} (index {}): {e}; its policy stays in force",
                re.ifindex
            ));
        }
        self.realized.endpoints.remove(ifname);
        if let Err(e) = self
            .datapath
            .remove_endpoint(re.ifindex)
            .counted(&mut self.health)
        {
            self.health
                .errors
                .push(format!("removing endpoint {ifname}: {e}"));
        }
        Ok(())
    }
}

/// The dump's warning for an interface renamed after it was attached.
pub(super) fn renamed_warning(was: &str, index: u32, now: &str) -> String {
    format!("interface {was} (index {index}) was renamed {now}: it stays enforced with its policy, shown as {was}")
}

#[cfg(test)]
mod tests {
    //! Interfaces are identified by index: what a name's older interface
    //! enforced is not the newer one's.

    use super::super::fixtures::{pod_up_as as up, snapshot};
    use super::super::*;
    use crate::datapath::fake::FakeDatapath;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, PodRef, Rule};

    /// `n` rules of one /32 peer each: big enough to compile off the thread.
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
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn pod(name: &str, ingress: Option<DirectionPolicy>) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            ingress,
            ..Default::default()
        }
    }

    /// Issue: a direction whose table was still compiling took what the
    /// realized record of its interface's name enforced, whatever its
    /// index. A pod recreated on the same name (its DEL lost, the link
    /// event queued behind the pod-up) got its old interface's verdict,
    /// here open, while its answer at the deadline said "starts denied".
    #[test]
    fn a_recreated_interface_never_takes_the_old_ones_verdicts_while_its_table_compiles() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let mut r = Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a"]),
        )
        .with_background_compile(tx.clone(), 1000)
        .unwrap();
        r.apply_plan(snapshot(1, vec![pod("a", None)])).unwrap();
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        r.pod_up(up("a", "veth-a", "c1"), reply);
        assert!(answer.try_recv().unwrap().is_ok());
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));
        // Its new policy compiles off the thread: the old interface keeps
        // what it enforces meanwhile (open), as it should.
        r.apply_plan(snapshot(2, vec![pod("a", Some(big(2000)))]))
            .unwrap();
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((0, 0)));

        // The pod is recreated: same name, new interface (index 30).
        r.datapath.interfaces.insert("veth-a".into(), 30);
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        r.pod_up(up("a", "veth-a", "c2"), reply);
        assert!(answer.try_recv().is_err(), "waits for its table");
        assert_eq!(
            r.datapath.endpoint_of("veth-a"),
            Some((DENY_ALL, 0)),
            "the new interface is denied, not given the old one's open verdict"
        );
        r.pod_up_deadline(&("x".into(), "a".into()), "c2");
        let out = answer.try_recv().unwrap().unwrap();
        assert!(out.warning.contains("starts denied"), "{}", out.warning);
        assert_eq!(r.datapath.endpoint_of("veth-a"), Some((DENY_ALL, 0)));

        // Once complete, the table is enforced on the new interface.
        while r.background.compiling_count() > 0 {
            let event = rx.blocking_recv().expect("the worker answers");
            r.handle(event);
        }
        while r.background.has_writes() {
            r.write_slice();
        }
        let (id, _) = r.datapath.endpoint_of("veth-a").unwrap();
        assert!(id != 0 && id != DENY_ALL, "{id}");
        r.datapath.assert_no_violations();
        drop(tx);
    }
}
