//! The one owner of the node's datapath (DESIGN invariant 1). Every input —
//! plan snapshots and deltas, CNI pod up/down, debug dumps — arrives here as
//! an [`Event`] on one channel and is handled in order on one thread. Each
//! step recomputes the desired datapath from the inputs and applies the
//! difference (invariant 2), adding new tables before pointing interfaces at
//! them and removing tables only once nothing references them (invariants 4
//! and 5).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use palisade_proto::v1::{NodeState, PlanDelta, PlanSnapshot, PodPolicy, PodRef, PodState};
use tokio::sync::{mpsc, oneshot, watch};

use crate::checkpoint::{Checkpoint, Saved};
use crate::compile::{prefix_of, PolicySet, PortSet, Prefix};
use crate::datapath::{Datapath, EndpointEntry, PolicyId, PortSetId};
use crate::desired::{desired, PodKey, PodRuntime};

/// The policy id an endpoint gets when its policy could not be written: no
/// table entry ever has it, so every lookup misses and the pod is denied
/// rather than left open.
pub const DENY_ALL: PolicyId = u32::MAX;

/// A message from the controller's plan stream.
#[derive(Clone, Debug)]
pub enum PlanMessage {
    Snapshot(PlanSnapshot),
    Delta(PlanDelta),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error(
        "delta from version {base} does not apply to version {held}; resubscribe for a snapshot"
    )]
    OutOfSequence { base: u64, held: u64 },
}

#[derive(Clone, Debug)]
pub struct PodUp {
    pub pod: PodKey,
    pub runtime: PodRuntime,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodUpOutcome {
    pub plan_version: u64,
    pub ingress_isolated: bool,
    pub egress_isolated: bool,
}

/// Everything the debug service shows.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    pub state: NodeState,
    pub node_addresses: Vec<Prefix>,
    pub plan_version: u64,
    pub plan_connected: bool,
    pub datapath: String,
    pub policy_sets: Vec<PolicySetDump>,
    pub interfaces: Vec<InterfaceDump>,
}

#[derive(Clone, Debug)]
pub struct PolicySetDump {
    pub name: String,
    pub id: PolicyId,
    pub prefix_entries: usize,
    pub references: usize,
}

#[derive(Clone, Debug)]
pub struct InterfaceDump {
    pub name: String,
    pub ifindex: u32,
    pub pod: PodKey,
    pub ingress: Option<String>,
    pub egress: Option<String>,
}

pub enum Event {
    Plan(PlanMessage, oneshot::Sender<Result<u64, PlanError>>),
    PlanConnected(bool),
    PodUp(PodUp, oneshot::Sender<Result<PodUpOutcome, String>>),
    PodDown {
        /// None when the runtime could not tell (a DEL may carry only the
        /// container id); the pod is then found by its container.
        pod: Option<PodKey>,
        container_id: String,
        reply: oneshot::Sender<Result<(), String>>,
    },
    PodCheck {
        pod: PodKey,
        container_id: String,
        reply: oneshot::Sender<Result<PodState, String>>,
    },
    Dump(oneshot::Sender<Dump>),
    /// Periodic: re-reads inputs that change without telling us (the node's
    /// addresses) and converges if they did.
    Tick,
}

struct RealizedPolicy {
    id: PolicyId,
    entries: Vec<(Prefix, PortSetId)>,
}

#[derive(Clone)]
struct RealizedEndpoint {
    ifindex: u32,
    pod: PodKey,
    container_id: String,
    ingress: Option<Arc<PolicySet>>,
    egress: Option<Arc<PolicySet>>,
    ids: (PolicyId, PolicyId),
}

/// What is in the datapath now, as this process wrote it.
#[derive(Default)]
struct Realized {
    portsets: BTreeMap<PortSet, PortSetId>,
    policies: BTreeMap<Arc<PolicySet>, RealizedPolicy>,
    endpoints: BTreeMap<String, RealizedEndpoint>,
    next_portset: PortSetId,
    next_policy: PolicyId,
    /// Adopted tables whose content duplicates another's; removed once no
    /// endpoint points at them.
    garbage_policies: Vec<(PolicyId, Vec<(Prefix, PortSetId)>)>,
    garbage_portsets: Vec<(PortSetId, PortSet)>,
}

impl Realized {
    fn alloc_policy(&mut self) -> PolicyId {
        // Ids are never reused within a process, so a stale reference can
        // never name a newer table.
        self.next_policy += 1;
        self.next_policy
    }
    fn alloc_portset(&mut self) -> PortSetId {
        self.next_portset += 1;
        self.next_portset
    }
}

pub struct Reconciler<D: Datapath> {
    node: String,
    enforcer_id: String,
    plan: BTreeMap<PodKey, PodPolicy>,
    plan_version: u64,
    has_plan: bool,
    plan_connected: bool,
    pods: BTreeMap<PodKey, PodRuntime>,
    realized: Realized,
    pod_errors: BTreeMap<PodKey, String>,
    errors: Vec<String>,
    realized_version: u64,
    node_addresses: Vec<Prefix>,
    checkpoint: Option<Checkpoint>,
    pub datapath: D,
}

impl<D: Datapath> Reconciler<D> {
    pub fn new(node: String, enforcer_id: String, datapath: D) -> Self {
        Reconciler {
            node,
            enforcer_id,
            plan: BTreeMap::new(),
            plan_version: 0,
            has_plan: false,
            plan_connected: false,
            pods: BTreeMap::new(),
            realized: Realized::default(),
            pod_errors: BTreeMap::new(),
            errors: Vec::new(),
            realized_version: 0,
            node_addresses: Vec::new(),
            checkpoint: None,
            datapath,
        }
    }

    /// Saves the inputs after every change, so a restart can recover them.
    pub fn with_checkpoint(mut self, checkpoint: Checkpoint) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    /// Takes over what a previous process left: its saved inputs and the
    /// datapath's tables and links. The first convergence then changes only
    /// what differs, so enforcement never lapses (DESIGN invariant 6).
    /// Orphans (links of interfaces no pod claims, tables nothing references)
    /// are removed by that same convergence.
    pub fn recover(&mut self, saved: Saved) -> Result<(), String> {
        let adopted = self
            .datapath
            .adopt()
            .map_err(|e| format!("reading the datapath left by the previous enforcer: {e}"))?;
        if let Some(plan) = saved.plan {
            self.plan = plan
                .pods
                .into_iter()
                .filter_map(|p| Some((key(p.pod.as_ref())?, p)))
                .collect();
            self.plan_version = plan.version;
            self.realized_version = plan.version;
            self.has_plan = true;
        }
        // A pod whose interfaces are gone was deleted while we were down.
        self.pods = saved
            .pods
            .into_iter()
            .filter(|(_, rt)| {
                rt.host_interfaces
                    .iter()
                    .all(|i| self.datapath.ifindex(i).is_ok())
            })
            .collect();

        let r = &mut self.realized;
        for (id, set) in &adopted.portsets {
            if r.portsets.contains_key(set) {
                r.garbage_portsets.push((*id, set.clone()));
            } else {
                r.portsets.insert(set.clone(), *id);
            }
            r.next_portset = r.next_portset.max(*id);
        }
        let mut by_id: BTreeMap<PolicyId, Arc<PolicySet>> = BTreeMap::new();
        for (id, entries) in &adopted.policies {
            if *id == DENY_ALL {
                continue;
            }
            let set = Arc::new(PolicySet {
                entries: entries
                    .iter()
                    .map(|(p, ps)| (*p, adopted.portsets.get(ps).cloned().unwrap_or_default()))
                    .collect(),
            });
            if r.policies.contains_key(&set) {
                r.garbage_policies.push((*id, entries.clone()));
            } else {
                r.policies.insert(
                    set.clone(),
                    RealizedPolicy {
                        id: *id,
                        entries: entries.clone(),
                    },
                );
            }
            by_id.insert(*id, set);
            r.next_policy = r.next_policy.max(*id);
        }
        let content = |id: PolicyId| -> Option<Arc<PolicySet>> { by_id.get(&id).cloned() };
        let mut claimed = BTreeSet::new();
        for (pod, rt) in &self.pods {
            for ifname in &rt.host_interfaces {
                if !adopted.attached.contains(ifname) {
                    continue;
                }
                let Ok(ifindex) = self.datapath.ifindex(ifname) else {
                    continue;
                };
                let Some(ids) = adopted
                    .endpoints
                    .get(&ifindex)
                    .map(|e| (e.ingress, e.egress))
                else {
                    continue;
                };
                claimed.insert(ifindex);
                self.realized.endpoints.insert(
                    ifname.clone(),
                    RealizedEndpoint {
                        ifindex,
                        pod: pod.clone(),
                        container_id: rt.container_id.clone(),
                        ingress: content(ids.0),
                        egress: content(ids.1),
                        ids,
                    },
                );
            }
        }
        for ifname in &adopted.attached {
            if self.realized.endpoints.contains_key(ifname) {
                continue;
            }
            // Attached, but no saved pod owns it: an orphan to detach.
            let ifindex = self.datapath.ifindex(ifname).unwrap_or(0);
            claimed.insert(ifindex);
            self.realized.endpoints.insert(
                ifname.clone(),
                RealizedEndpoint {
                    ifindex,
                    pod: (String::new(), String::new()),
                    container_id: String::new(),
                    ingress: None,
                    egress: None,
                    ids: adopted
                        .endpoints
                        .get(&ifindex)
                        .map_or((0, 0), |e| (e.ingress, e.egress)),
                },
            );
        }
        for ifindex in adopted.endpoints.keys() {
            if !claimed.contains(ifindex) {
                // No program of ours runs there; the entry is dead weight.
                let _ = self.datapath.remove_endpoint(*ifindex);
            }
        }
        tracing::info!(
            pods = self.pods.len(),
            interfaces = self.realized.endpoints.len(),
            policy_sets = self.realized.policies.len(),
            plan_version = self.plan_version,
            "recovered the previous enforcer's state"
        );
        self.converge();
        Ok(())
    }

    fn save_plan(&mut self) {
        if let Some(cp) = &self.checkpoint {
            if let Err(e) = cp.save_plan(self.plan_version, &self.plan) {
                tracing::error!("{e}");
                self.errors.push(e);
            }
        }
    }

    fn save_pods(&mut self) {
        if let Some(cp) = &self.checkpoint {
            if let Err(e) = cp.save_pods(&self.pods) {
                tracing::error!("{e}");
                self.errors.push(e);
            }
        }
    }

    /// Handles events until every sender is gone, publishing the node's
    /// state after each one. Runs on its own thread: datapath operations are
    /// short syscalls and must not interleave.
    pub fn run(mut self, mut events: mpsc::Receiver<Event>, state: watch::Sender<NodeState>) {
        while let Some(event) = events.blocking_recv() {
            self.handle(event);
            let now = self.node_state();
            state.send_if_modified(|old| {
                if *old != now {
                    *old = now;
                    true
                } else {
                    false
                }
            });
        }
    }

    pub fn handle(&mut self, event: Event) {
        match event {
            Event::Plan(msg, reply) => {
                let r = self.apply_plan(msg);
                let _ = reply.send(r);
            }
            Event::PlanConnected(c) => self.plan_connected = c,
            Event::PodUp(up, reply) => {
                let _ = reply.send(self.pod_up(up));
            }
            Event::PodDown {
                pod,
                container_id,
                reply,
            } => {
                let _ = reply.send(self.pod_down(pod, &container_id));
            }
            Event::PodCheck {
                pod,
                container_id,
                reply,
            } => {
                let _ = reply.send(self.pod_check(&pod, &container_id));
            }
            Event::Dump(reply) => {
                let _ = reply.send(self.dump());
            }
            Event::Tick => {
                if self.refresh_node_addresses() {
                    self.converge();
                }
            }
        }
    }

    pub fn apply_plan(&mut self, msg: PlanMessage) -> Result<u64, PlanError> {
        match msg {
            PlanMessage::Snapshot(s) => {
                self.plan = s
                    .pods
                    .into_iter()
                    .filter_map(|p| Some((key(p.pod.as_ref())?, p)))
                    .collect();
                self.plan_version = s.version;
                self.has_plan = true;
            }
            PlanMessage::Delta(d) => {
                if !self.has_plan || d.base_version != self.plan_version {
                    return Err(PlanError::OutOfSequence {
                        base: d.base_version,
                        held: self.plan_version,
                    });
                }
                for r in &d.removed {
                    self.plan.remove(&key(Some(r)).unwrap_or_default());
                }
                for p in d.upserted {
                    if let Some(k) = key(p.pod.as_ref()) {
                        self.plan.insert(k, p);
                    }
                }
                self.plan_version = d.version;
            }
        }
        self.converge();
        self.save_plan();
        self.realized_version = self.plan_version;
        Ok(self.plan_version)
    }

    pub fn pod_up(&mut self, up: PodUp) -> Result<PodUpOutcome, String> {
        validate_pod(&up)?;
        // The kernel has one interface per name: another pod still holding
        // one of these names is a sandbox whose DEL never came, and its claim
        // is stale.
        let stale: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(k, rt)| {
                **k != up.pod
                    && rt
                        .host_interfaces
                        .iter()
                        .any(|i| up.runtime.host_interfaces.contains(i))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &stale {
            tracing::warn!(stale = %format!("{}/{}", k.0, k.1), pod = %format!("{}/{}", up.pod.0, up.pod.1),
                "interface reused by a new pod; forgetting the pod that held it");
            self.pods.remove(k);
        }
        let previous = self.pods.insert(up.pod.clone(), up.runtime.clone());
        self.converge();
        if let Some(err) = self.pod_errors.get(&up.pod).cloned() {
            // No partial datapath: put back what was there and report.
            match previous {
                Some(p) => self.pods.insert(up.pod.clone(), p),
                None => self.pods.remove(&up.pod),
            };
            self.converge();
            self.save_pods();
            return Err(err);
        }
        self.save_pods();
        let policy = self.plan.get(&up.pod);
        Ok(PodUpOutcome {
            plan_version: self.plan_version,
            ingress_isolated: policy.is_some_and(|p| p.ingress.is_some()),
            egress_isolated: policy.is_some_and(|p| p.egress.is_some()),
        })
    }

    pub fn pod_down(&mut self, pod: Option<PodKey>, container_id: &str) -> Result<(), String> {
        let pod = match pod {
            Some(p) => p,
            None if container_id.is_empty() => {
                return Err("pod down needs a pod or a container id".into())
            }
            None => match self
                .pods
                .iter()
                .find(|(_, rt)| rt.container_id == container_id)
            {
                Some((k, _)) => k.clone(),
                None => return Ok(()),
            },
        };
        match self.pods.get(&pod) {
            // A DEL for an older sandbox must not tear down the new one.
            Some(p) if !container_id.is_empty() && p.container_id != container_id => Ok(()),
            Some(_) => {
                self.pods.remove(&pod);
                self.converge();
                self.save_pods();
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn pod_check(&self, pod: &PodKey, container_id: &str) -> Result<PodState, String> {
        let Some(rt) = self.pods.get(pod) else {
            return Err(format!(
                "pod {}/{} is not known to this enforcer",
                pod.0, pod.1
            ));
        };
        if !container_id.is_empty() && rt.container_id != container_id {
            return Err(format!(
                "pod {}/{} is known with container {}, not {container_id}",
                pod.0, pod.1, rt.container_id
            ));
        }
        let state = self.pod_state(pod, rt);
        if !state.error.is_empty() {
            return Err(state.error);
        }
        Ok(state)
    }

    /// Reads the node's addresses; true when they changed.
    fn refresh_node_addresses(&mut self) -> bool {
        match self.datapath.node_addresses() {
            Ok(addrs) => {
                let mut prefixes: Vec<Prefix> = addrs
                    .into_iter()
                    .map(|ip| Prefix::from_ip(ip, if ip.is_ipv4() { 32 } else { 128 }))
                    .collect();
                prefixes.sort();
                prefixes.dedup();
                let changed = prefixes != self.node_addresses;
                self.node_addresses = prefixes;
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

    /// Makes the datapath match the inputs.
    fn converge(&mut self) {
        self.refresh_node_addresses();
        let want = desired(&self.plan, &self.pods, &self.node_addresses);
        self.pod_errors = want.errors.clone();
        self.errors.clear();

        // 1. Tables every desired endpoint needs, before anything points at
        //    them.
        let needed: BTreeSet<Arc<PolicySet>> = want
            .endpoints
            .values()
            .flat_map(|e| [e.ingress.clone(), e.egress.clone()])
            .flatten()
            .collect();
        let mut failed_sets: BTreeMap<Arc<PolicySet>, String> = BTreeMap::new();
        for set in &needed {
            if self.realized.policies.contains_key(set) {
                continue;
            }
            if let Err(e) = self.add_policy_set(set) {
                failed_sets.insert(set.clone(), e);
            }
        }

        // 2. Endpoints: point each interface at its tables, then attach.
        for (ifname, de) in &want.endpoints {
            let id_of = |s: &Option<Arc<PolicySet>>| -> PolicyId {
                match s {
                    None => 0,
                    Some(s) => self.realized.policies.get(s).map_or(DENY_ALL, |p| p.id),
                }
            };
            let ids = (id_of(&de.ingress), id_of(&de.egress));
            for s in [&de.ingress, &de.egress].into_iter().flatten() {
                if let Some(e) = failed_sets.get(s) {
                    self.pod_errors.entry(de.pod.clone()).or_insert_with(|| {
                        format!("policy of {}/{} not written: {e}", de.pod.0, de.pod.1)
                    });
                }
            }
            let container_id = self
                .pods
                .get(&de.pod)
                .map(|p| p.container_id.clone())
                .unwrap_or_default();
            if let Some(re) = self.realized.endpoints.get(ifname) {
                if re.pod == de.pod && re.container_id == container_id {
                    if re.ids != ids {
                        let ifindex = re.ifindex;
                        let entry = self.endpoint_entry(&de.pod, ids);
                        match self.datapath.set_endpoint(ifindex, &entry) {
                            Ok(()) => {
                                let re = self.realized.endpoints.get_mut(ifname).expect("present");
                                re.ids = ids;
                                re.ingress = de.ingress.clone();
                                re.egress = de.egress.clone();
                            }
                            Err(e) => {
                                self.pod_errors
                                    .insert(de.pod.clone(), format!("{ifname}: {e}"));
                            }
                        }
                    }
                    continue;
                }
                // Another pod (or a new sandbox) now owns this name: start over.
                self.remove_endpoint(ifname);
            }
            let entry = self.endpoint_entry(&de.pod, ids);
            match self.add_endpoint(ifname, &entry) {
                Ok(ifindex) => {
                    self.realized.endpoints.insert(
                        ifname.clone(),
                        RealizedEndpoint {
                            ifindex,
                            pod: de.pod.clone(),
                            container_id,
                            ingress: de.ingress.clone(),
                            egress: de.egress.clone(),
                            ids,
                        },
                    );
                }
                Err(e) => {
                    self.pod_errors.insert(de.pod.clone(), e);
                }
            }
        }

        // 3. Interfaces nothing wants any more.
        let stale: Vec<String> = self
            .realized
            .endpoints
            .keys()
            .filter(|k| !want.endpoints.contains_key(*k))
            .cloned()
            .collect();
        for ifname in stale {
            self.remove_endpoint(&ifname);
        }

        // 4. Tables no attached endpoint references: only now can they go.
        let referenced: BTreeSet<Arc<PolicySet>> = self
            .realized
            .endpoints
            .values()
            .flat_map(|e| [e.ingress.clone(), e.egress.clone()])
            .flatten()
            .collect();
        let unused: Vec<Arc<PolicySet>> = self
            .realized
            .policies
            .keys()
            .filter(|s| !referenced.contains(*s))
            .cloned()
            .collect();
        for set in unused {
            let p = &self.realized.policies[&set];
            match self.datapath.remove_policy(p.id, &p.entries) {
                Ok(()) => {
                    self.realized.policies.remove(&set);
                }
                Err(e) => self
                    .errors
                    .push(format!("removing policy set {}: {e}", set.id())),
            }
        }
        for (id, entries) in std::mem::take(&mut self.realized.garbage_policies) {
            if let Err(e) = self.datapath.remove_policy(id, &entries) {
                self.errors
                    .push(format!("removing duplicate policy table {id}: {e}"));
            }
        }
        for (id, set) in std::mem::take(&mut self.realized.garbage_portsets) {
            if let Err(e) = self.datapath.remove_portset(id, &set) {
                self.errors
                    .push(format!("removing duplicate port set {id}: {e}"));
            }
        }
        let used_portsets: BTreeSet<PortSetId> = self
            .realized
            .policies
            .values()
            .flat_map(|p| p.entries.iter().map(|(_, ps)| *ps))
            .collect();
        let unused: Vec<(PortSet, PortSetId)> = self
            .realized
            .portsets
            .iter()
            .filter(|(_, id)| !used_portsets.contains(id))
            .map(|(s, id)| (s.clone(), *id))
            .collect();
        for (set, id) in unused {
            match self.datapath.remove_portset(id, &set) {
                Ok(()) => {
                    self.realized.portsets.remove(&set);
                }
                Err(e) => self.errors.push(format!("removing port set {id}: {e}")),
            }
        }
    }

    fn add_policy_set(&mut self, set: &Arc<PolicySet>) -> Result<(), String> {
        let mut entries = Vec::with_capacity(set.entries.len());
        for (prefix, ports) in &set.entries {
            let ps = if ports.0.is_empty() {
                0
            } else if let Some(id) = self.realized.portsets.get(ports) {
                *id
            } else {
                let id = self.realized.alloc_portset();
                self.datapath
                    .add_portset(id, ports)
                    .map_err(|e| format!("port set: {e}"))?;
                self.realized.portsets.insert(ports.clone(), id);
                id
            };
            entries.push((*prefix, ps));
        }
        let id = self.realized.alloc_policy();
        if let Err(e) = self.datapath.add_policy(id, &entries) {
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

    fn endpoint_entry(&self, pod: &PodKey, ids: (PolicyId, PolicyId)) -> EndpointEntry {
        EndpointEntry {
            ingress: ids.0,
            egress: ids.1,
            pod_addrs: self
                .pods
                .get(pod)
                .map(|p| p.ips.iter().map(|ip| ip.addr).collect())
                .unwrap_or_default(),
        }
    }

    fn add_endpoint(&mut self, ifname: &str, entry: &EndpointEntry) -> Result<u32, String> {
        let ifindex = self.datapath.ifindex(ifname).map_err(|e| e.to_string())?;
        // The entry goes in before the programs: an attached program with no
        // entry would let everything through.
        self.datapath
            .set_endpoint(ifindex, entry)
            .map_err(|e| format!("{ifname}: {e}"))?;
        if let Err(e) = self.datapath.attach(ifname, ifindex) {
            let _ = self.datapath.remove_endpoint(ifindex);
            return Err(format!("{ifname}: {e}"));
        }
        Ok(ifindex)
    }

    fn remove_endpoint(&mut self, ifname: &str) {
        let Some(re) = self.realized.endpoints.remove(ifname) else {
            return;
        };
        // Programs first, then the entry, for the same reason as above.
        if let Err(e) = self.datapath.detach(ifname, re.ifindex) {
            self.errors.push(format!("detaching {ifname}: {e}"));
        }
        if let Err(e) = self.datapath.remove_endpoint(re.ifindex) {
            self.errors.push(format!("removing endpoint {ifname}: {e}"));
        }
    }

    fn pod_state(&self, key: &PodKey, rt: &PodRuntime) -> PodState {
        let policy = self.plan.get(key);
        let name = |s: &Option<Arc<PolicySet>>| s.as_ref().map(|s| s.id()).unwrap_or_default();
        let ep = rt
            .host_interfaces
            .iter()
            .find_map(|i| self.realized.endpoints.get(i));
        let mut error = self.pod_errors.get(key).cloned().unwrap_or_default();
        if error.is_empty() {
            if let Some(missing) = rt
                .host_interfaces
                .iter()
                .find(|i| !self.realized.endpoints.contains_key(*i))
            {
                error = format!("{missing} is not attached");
            }
        }
        PodState {
            pod: Some(PodRef {
                namespace: key.0.clone(),
                name: key.1.clone(),
            }),
            container_id: rt.container_id.clone(),
            host_interfaces: rt.host_interfaces.clone(),
            pod_ips: rt.ips.iter().map(to_ip_prefix).collect(),
            ingress_isolated: policy.is_some_and(|p| p.ingress.is_some()),
            egress_isolated: policy.is_some_and(|p| p.egress.is_some()),
            ingress_policy_set: ep.map(|e| name(&e.ingress)).unwrap_or_default(),
            egress_policy_set: ep.map(|e| name(&e.egress)).unwrap_or_default(),
            policies: policy.map(|p| p.policies.clone()).unwrap_or_default(),
            error,
        }
    }

    pub fn node_state(&self) -> NodeState {
        let mut errors = self.errors.clone();
        errors.extend(self.pod_errors.values().cloned());
        NodeState {
            node_name: self.node.clone(),
            enforcer_id: self.enforcer_id.clone(),
            realized_version: self.realized_version,
            pods: self
                .pods
                .iter()
                .map(|(k, rt)| self.pod_state(k, rt))
                .collect(),
            errors,
        }
    }

    pub fn dump(&self) -> Dump {
        let mut references: BTreeMap<PolicyId, usize> = BTreeMap::new();
        for e in self.realized.endpoints.values() {
            for id in [e.ids.0, e.ids.1] {
                *references.entry(id).or_default() += 1;
            }
        }
        Dump {
            state: self.node_state(),
            node_addresses: self.node_addresses.clone(),
            plan_version: self.plan_version,
            plan_connected: self.plan_connected,
            datapath: self.datapath.describe(),
            policy_sets: self
                .realized
                .policies
                .iter()
                .map(|(set, p)| PolicySetDump {
                    name: set.id(),
                    id: p.id,
                    prefix_entries: p.entries.len(),
                    references: references.get(&p.id).copied().unwrap_or(0),
                })
                .collect(),
            interfaces: self
                .realized
                .endpoints
                .iter()
                .map(|(name, e)| InterfaceDump {
                    name: name.clone(),
                    ifindex: e.ifindex,
                    pod: e.pod.clone(),
                    ingress: e.ingress.as_ref().map(|s| s.id()),
                    egress: e.egress.as_ref().map(|s| s.id()),
                })
                .collect(),
        }
    }
}

fn key(r: Option<&PodRef>) -> Option<PodKey> {
    let r = r?;
    Some((r.namespace.clone(), r.name.clone()))
}

pub fn to_ip_prefix(p: &Prefix) -> palisade_proto::v1::IpPrefix {
    let v6 = std::net::Ipv6Addr::from(p.addr);
    match v6.to_ipv4_mapped() {
        Some(v4) if p.len >= 96 => palisade_proto::v1::IpPrefix {
            addr: v4.octets().to_vec(),
            prefix_len: u32::from(p.len - 96),
        },
        _ => palisade_proto::v1::IpPrefix {
            addr: p.addr.to_vec(),
            prefix_len: u32::from(p.len),
        },
    }
}

/// Checks a pod-up request before it can touch anything.
fn validate_pod(up: &PodUp) -> Result<(), String> {
    let (ns, name) = &up.pod;
    if ns.is_empty() || name.is_empty() {
        return Err("pod namespace and name are required".into());
    }
    if up.runtime.host_interfaces.is_empty() {
        return Err(format!("pod {ns}/{name}: no host interface given"));
    }
    for i in &up.runtime.host_interfaces {
        if i.is_empty() || i.len() > 15 || i.contains(['/', ' ', '\0']) || i == "." || i == ".." {
            return Err(format!(
                "pod {ns}/{name}: {i:?} is not a valid interface name"
            ));
        }
    }
    Ok(())
}

/// Converts request prefixes, naming the bad one.
pub fn prefixes(list: &[palisade_proto::v1::IpPrefix]) -> Result<Vec<Prefix>, String> {
    list.iter()
        .map(|p| prefix_of(p).map_err(|e| format!("pod IP: {e}")))
        .collect()
}

#[cfg(test)]
mod tests;
