//! Pods as the CNI plugin (or NPBackend) reports them: up, down, check, and
//! the pod-up contract.
//!
//! Pod up returns only once the pod's policy is in the datapath. When the
//! plan does not list the pod yet, the pod is attached denied, its plan is
//! fetched on demand, and the answer waits; at the deadline strict mode
//! refuses the pod and standard mode lets it start open, marked unprotected.
//! A refused request changes nothing: the inputs are restored and the
//! datapath converges back to what it was.

use std::collections::{BTreeMap, BTreeSet};

use palisade_proto::v1::PodState;
use tokio::sync::oneshot;

use super::dump::Counted;
use super::Reconciler;
use crate::datapath::Datapath;
use crate::desired::{Claim, Knowledge, Mode, PodKey, PodRuntime};

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
    /// False: the deadline passed before the policy was known (standard mode).
    pub realized: bool,
    pub warning: String,
}

pub type PodUpReply = oneshot::Sender<Result<PodUpOutcome, String>>;

/// The pods on this node as the CNI plugin (or NPBackend) reported them.
#[derive(Default)]
pub(super) struct Pods {
    /// Each pod's sandbox: its container, interfaces and addresses.
    pub runtime: BTreeMap<PodKey, PodRuntime>,
    /// Pod-ups whose answer waits for the pod's policy (or its deadline).
    pub waiting: BTreeMap<PodKey, WaitingUp>,
    /// Standard-mode pods whose deadline passed with their policy unknown.
    pub unprotected: BTreeSet<PodKey>,
    /// Pods an NPBackend DeletePodNp named while their interface still
    /// lives: forgotten when it goes (the request cannot tell an old pod
    /// from a new one of the same name).
    pub deleting: BTreeSet<PodKey>,
    /// The interfaces that exist and their indexes, as last read (link
    /// events and ticks refresh them; a pod-up reads its own). A renamed
    /// interface is listed under the name we know it by.
    pub live: BTreeMap<String, u32>,
    /// Interfaces renamed since we attached them: the name we know each
    /// by, with its index and the name it has now.
    pub renamed: BTreeMap<String, (u32, String)>,
    /// `runtime` is not checkpointed yet; written when the event queue is
    /// idle (a lost write is rebuilt from the kernel's endpoint entries).
    pub unsaved: bool,
}

/// A pod-up waiting for its answer.
pub(super) struct WaitingUp {
    pub container_id: String,
    pub reply: PodUpReply,
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
    if up.runtime.ips.len() > crate::datapath::MAX_POD_ADDRS {
        return Err(format!(
            "pod {ns}/{name}: {} addresses, more than the {} a pod may have",
            up.runtime.ips.len(),
            crate::datapath::MAX_POD_ADDRS
        ));
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

fn name(k: &PodKey) -> String {
    format!("{}/{}", k.0, k.1)
}

/// The pod inputs a request changed, to put back if it is refused: the
/// previous entry of every pod it touched.
struct Undo {
    pods: BTreeMap<PodKey, Option<PodRuntime>>,
    unprotected: bool,
    deleting: bool,
}

impl<D: Datapath> Reconciler<D> {
    pub fn pod_up(&mut self, mut up: PodUp, reply: PodUpReply) {
        if let Err(e) = validate_pod(&up) {
            let _ = reply.send(Err(e));
            return;
        }
        // The identity of each host interface is its index now: a name can
        // be reused by a recreated veth.
        let mut ifindexes = BTreeMap::new();
        for ifname in &up.runtime.host_interfaces {
            match self.datapath.ifindex(ifname).counted(&mut self.health) {
                Ok(i) => {
                    ifindexes.insert(ifname.clone(), i);
                }
                Err(e) => {
                    let _ = reply.send(Err(format!("pod {}: {e}", name(&up.pod))));
                    return;
                }
            }
        }
        up.runtime.ifindexes = ifindexes.clone();
        // A renamed interface stays enforced under the name it had (the one
        // its attachment is known by): a second record of its index would
        // detach it when either goes.
        for (ifname, &index) in &ifindexes {
            if let Some((was, _)) = self
                .realized
                .endpoints
                .iter()
                .find(|(n, e)| e.ifindex == index && *n != ifname)
            {
                let _ = reply.send(Err(format!(
                    "pod {}: interface {ifname} (index {index}) is enforced as {was}, its name before a rename; refusing rather than attaching it twice",
                    name(&up.pod)
                )));
                return;
            }
        }
        // Another pod claiming the same live interface is a request we
        // cannot honour without taking enforcement from that pod. A claim
        // on an older interface of the same name is stale: that interface
        // is gone, so only the name is freed.
        let mut freed: Vec<(PodKey, String)> = Vec::new();
        for (other, rt) in self.pods.runtime.iter() {
            if *other == up.pod {
                continue;
            }
            for (ifname, &index) in &ifindexes {
                if !rt.host_interfaces.contains(ifname) {
                    continue;
                }
                if rt.ifindexes.get(ifname) == Some(&index) {
                    let _ = reply.send(Err(format!(
                        "pod {}: interface {ifname} (index {index}) is the host interface of pod {}, whose DEL has not arrived; refusing rather than un-enforcing it",
                        name(&up.pod),
                        name(other)
                    )));
                    return;
                }
                freed.push((other.clone(), ifname.clone()));
            }
        }
        // An interface kept for a pod nobody knows (a lost checkpoint)
        // still says whose it is: the addresses in its entry.
        let wanted: std::collections::BTreeSet<[u8; 16]> =
            up.runtime.ips.iter().map(|p| p.addr).collect();
        for (ifname, &index) in &ifindexes {
            if let Some(e) = self.realized.endpoints.get(ifname) {
                let theirs: std::collections::BTreeSet<[u8; 16]> =
                    e.entry.pod_addrs.iter().copied().collect();
                if e.claim == Claim::Unexplained
                    && e.ifindex == index
                    && !theirs.is_empty()
                    && !wanted.is_empty()
                    && theirs != wanted
                {
                    let _ = reply.send(Err(format!(
                        "pod {}: interface {ifname} (index {index}) is enforced for other addresses (its pod is unknown since the checkpoint was lost); refusing",
                        name(&up.pod)
                    )));
                    return;
                }
            }
        }
        if let Some(old) = self.pods.waiting.remove(&up.pod) {
            let _ = old.reply.send(Err(format!(
                "pod {}: superseded by a newer pod-up for the same pod",
                name(&up.pod)
            )));
        }
        let mut undo = Undo {
            pods: BTreeMap::new(),
            unprotected: self.pods.unprotected.remove(&up.pod),
            deleting: self.pods.deleting.remove(&up.pod),
        };
        for (other, ifname) in freed {
            let before = self.pods.runtime.get(&other).cloned();
            undo.pods.entry(other.clone()).or_insert(before);
            let stale = self.pods.runtime.get_mut(&other).expect("listed");
            stale.host_interfaces.retain(|i| *i != ifname);
            stale.ifindexes.remove(&ifname);
            if stale.host_interfaces.is_empty() {
                self.pods.runtime.remove(&other);
            }
        }
        for (ifname, index) in &ifindexes {
            self.pods.live.insert(ifname.clone(), *index);
        }
        let key = up.pod.clone();
        let container_id = up.runtime.container_id.clone();
        let before = self.pods.runtime.insert(key.clone(), up.runtime);
        undo.pods.entry(key.clone()).or_insert(before);
        let touched: Vec<PodKey> = undo.pods.keys().cloned().collect();
        let known = matches!(self.knowledge(&key), Knowledge::Known(_));
        if !known {
            self.pods.waiting.insert(
                key.clone(),
                WaitingUp {
                    container_id,
                    reply,
                },
            );
            self.converge_pods(&touched);
            if let Some(e) = self.write_failure(&key) {
                let p = self.pods.waiting.remove(&key).expect("just inserted");
                self.undo(&key, undo);
                let _ = p.reply.send(Err(e));
                return;
            }
            self.save_pods();
            if let Some(fetch) = &self.ctx.fetch {
                let _ = fetch.send(key);
            }
            return;
        }
        self.converge_pods(&touched);
        if let Some(e) = self.write_failure(&key) {
            self.undo(&key, undo);
            let _ = reply.send(Err(e));
            return;
        }
        self.save_pods();
        if self.target.desired.awaiting_tables.contains(&key) {
            // A big table of its policy is being compiled or written: the
            // pod is attached held or denied, and the answer waits for it.
            self.pods.waiting.insert(
                key,
                WaitingUp {
                    container_id,
                    reply,
                },
            );
            return;
        }
        let _ = reply.send(Ok(self.outcome(&key, true, String::new())));
    }

    /// A datapath failure for the pod (as opposed to a policy that could not
    /// be compiled, which leaves the pod denied in that direction and is
    /// reported, not refused).
    fn write_failure(&self, key: &PodKey) -> Option<String> {
        let rt = self.pods.runtime.get(key)?;
        // Attached to the pod's own interface: a record of an older one of
        // the same name (one that could not be removed) is not it.
        let attached = rt.host_interfaces.iter().all(|i| {
            self.realized.endpoints.get(i).is_some_and(|e| {
                e.claim.pod() == Some(key) && rt.ifindexes.get(i).is_none_or(|w| *w == e.ifindex)
            })
        });
        if attached && !self.health.failures.contains_key(key) {
            return None;
        }
        Some(
            self.health
                .failures
                .get(key)
                .or_else(|| self.target.desired.errors.get(key))
                .cloned()
                .unwrap_or_else(|| format!("pod {}: an interface is not attached", name(key))),
        )
    }

    fn undo(&mut self, key: &PodKey, undo: Undo) {
        let touched: Vec<PodKey> = undo.pods.keys().cloned().collect();
        for (k, before) in undo.pods {
            match before {
                Some(rt) => self.pods.runtime.insert(k, rt),
                None => self.pods.runtime.remove(&k),
            };
        }
        if undo.unprotected {
            self.pods.unprotected.insert(key.clone());
        }
        if undo.deleting {
            self.pods.deleting.insert(key.clone());
        }
        self.converge_pods(&touched);
    }

    fn outcome(&self, key: &PodKey, realized: bool, warning: String) -> PodUpOutcome {
        let policy = self.plan.listed_or_fetched(key);
        PodUpOutcome {
            plan_version: self.plan.version,
            ingress_isolated: policy.is_some_and(|p| p.ingress.is_some()),
            egress_isolated: policy.is_some_and(|p| p.egress.is_some()),
            realized,
            warning,
        }
    }

    /// Answers every waiting pod-up whose policy is now known and realized.
    pub(super) fn answer_waiting_ups(&mut self) {
        let ready: Vec<PodKey> = self
            .pods
            .waiting
            .keys()
            .filter(|k| {
                matches!(self.knowledge(k), Knowledge::Known(_))
                    && !self.target.desired.awaiting_tables.contains(*k)
            })
            .cloned()
            .collect();
        for key in ready {
            let p = self.pods.waiting.remove(&key).expect("listed");
            let answer = match self.write_failure(&key) {
                Some(e) => Err(e),
                None => Ok(self.outcome(&key, true, String::new())),
            };
            let _ = p.reply.send(answer);
        }
    }

    fn unknown_reason(&self, key: &PodKey) -> String {
        if !self.plan.connected {
            "the plan stream from the controller is not connected".to_string()
        } else if !self.plan.received {
            "no plan has been received from the controller yet".to_string()
        } else {
            format!(
                "the controller's plan (version {}) does not list {}",
                self.plan.version,
                name(key)
            )
        }
    }

    pub(super) fn pod_up_deadline(&mut self, key: &PodKey, container_id: &str) {
        if self
            .pods
            .waiting
            .get(key)
            .is_none_or(|p| p.container_id != container_id)
        {
            return;
        }
        let p = self.pods.waiting.remove(key).expect("checked");
        let mode = self
            .pods
            .runtime
            .get(key)
            .and_then(|p| p.mode)
            .unwrap_or(self.ctx.mode);
        if self.target.desired.awaiting_tables.contains(key) {
            // Its policy is known, its table not complete: the pod stays
            // held or denied, never open, in either mode.
            let why = self
                .target
                .desired
                .errors
                .get(key)
                .cloned()
                .unwrap_or_default();
            if mode == Mode::Strict {
                self.pods.runtime.remove(key);
                self.converge_pods([key]);
                self.save_pods();
                let _ = p.reply.send(Err(format!(
                    "pod {}: policy not realized by the pod-up deadline ({why}); strict mode refuses the pod",
                    name(key)
                )));
                return;
            }
            let warning = format!(
                "pod {} starts denied: policy not realized by the pod-up deadline ({why})",
                name(key)
            );
            self.health.warn(warning.clone());
            let _ = p.reply.send(Ok(self.outcome(key, false, warning)));
            return;
        }
        let reason = self.unknown_reason(key);
        match mode {
            Mode::Strict => {
                // Refused: the runtime tears the sandbox down, and nothing
                // of it stays.
                self.pods.runtime.remove(key);
                self.converge_pods([key]);
                self.save_pods();
                let _ = p.reply.send(Err(format!(
                    "pod {}: policy not known by the pod-up deadline ({reason}); strict mode refuses the pod",
                    name(key)
                )));
            }
            Mode::Standard => {
                self.pods.unprotected.insert(key.clone());
                self.converge_pods([key]);
                let warning = format!(
                    "pod {} starts UNPROTECTED: policy not known by the pod-up deadline ({reason})",
                    name(key)
                );
                self.health.warn(warning.clone());
                let _ = p.reply.send(Ok(self.outcome(key, false, warning)));
            }
        }
    }

    pub fn pod_down(&mut self, pod: Option<PodKey>, container_id: &str) -> Result<(), String> {
        let pod = match pod {
            Some(p) => p,
            None if container_id.is_empty() => {
                return Err("pod down needs a pod or a container id".into())
            }
            None => match self
                .pods
                .runtime
                .iter()
                .find(|(_, rt)| rt.container_id == container_id)
            {
                Some((k, _)) => k.clone(),
                None => return Ok(()),
            },
        };
        let Some(rt) = self.pods.runtime.get(&pod).cloned() else {
            return Ok(());
        };
        // A DEL for an older sandbox must not tear down the new one.
        if !container_id.is_empty()
            && !rt.container_id.is_empty()
            && rt.container_id != container_id
        {
            return Ok(());
        }
        if container_id.is_empty() || rt.container_id.is_empty() {
            // A delete that cannot prove it is for this sandbox (NPBackend
            // names only the pod; a pod rebuilt from the kernel has no
            // container id) may be a late one for an older pod: forget the
            // pod only once its interface is really gone.
            let live = self.live_interfaces();
            let alive = rt.host_interfaces.iter().any(|i| {
                live.get(i)
                    .is_some_and(|idx| rt.ifindexes.get(i).is_none_or(|w| w == idx))
            });
            if alive {
                self.pods.deleting.insert(pod);
                return Ok(());
            }
        }
        self.forget(&pod);
        self.converge_pods([&pod]);
        self.save_pods();
        Ok(())
    }

    /// Marks the pods checkpoint behind (see [`Pods::unsaved`]).
    pub(super) fn save_pods(&mut self) {
        self.pods.unsaved = true;
    }

    fn forget(&mut self, pod: &PodKey) {
        self.pods.runtime.remove(pod);
        self.pods.unprotected.remove(pod);
        self.pods.deleting.remove(pod);
        self.plan.fetched.remove(pod);
        if let Some(p) = self.pods.waiting.remove(pod) {
            let _ = p.reply.send(Err(format!(
                "pod {} was deleted while coming up",
                name(pod)
            )));
        }
    }

    /// Interfaces came or went: pods whose every interface is gone (deleted
    /// without a DEL, or recreated under the same name) are forgotten.
    /// True when it converged.
    pub(super) fn links_changed(&mut self) -> bool {
        self.refresh_links();
        let live = self.live_interfaces().clone();
        let gone: Vec<PodKey> = self
            .pods
            .runtime
            .iter()
            .filter(|(_, rt)| {
                !rt.host_interfaces.iter().any(|i| {
                    live.get(i)
                        .is_some_and(|idx| rt.ifindexes.get(i).is_none_or(|w| w == idx))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        let vanished_unexplained = self
            .realized
            .endpoints
            .iter()
            .any(|(n, e)| live.get(n) != Some(&e.ifindex));
        if gone.is_empty() && !vanished_unexplained {
            return false;
        }
        for k in &gone {
            tracing::info!(pod = %name(k), "host interface gone; forgetting the pod");
            self.forget(k);
        }
        self.converge();
        if !gone.is_empty() {
            self.save_pods();
        }
        true
    }

    pub(super) fn pod_check(&self, pod: &PodKey, container_id: &str) -> Result<PodState, String> {
        let Some(rt) = self.pods.runtime.get(pod) else {
            return Err(format!("pod {} is not known to this enforcer", name(pod)));
        };
        if !container_id.is_empty()
            && !rt.container_id.is_empty()
            && rt.container_id != container_id
        {
            return Err(format!(
                "pod {} is known with container {}, not {container_id}",
                name(pod),
                rt.container_id
            ));
        }
        let state = self.pod_state(pod, rt);
        if !state.error.is_empty() {
            return Err(state.error);
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    //! Pod-ups and link events where an interface name outlives its
    //! interface: the identity is the index.

    use super::super::fixtures::{pod_up_as as up, snapshot, warnings_with};
    use super::super::*;
    use crate::datapath::fake::FakeDatapath;
    use palisade_proto::v1::{DirectionPolicy, PodRef};

    fn reconciler() -> Reconciler<FakeDatapath> {
        Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a", "veth-b"]),
        )
    }

    /// Isolated for ingress, nothing allowed: a table besides open and
    /// deny-all, so a wrong entry shows.
    fn isolated(name: &str) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            ingress: Some(DirectionPolicy::default()),
            ..Default::default()
        }
    }

    fn up_now(r: &mut Reconciler<FakeDatapath>, u: PodUp) -> Result<PodUpOutcome, String> {
        let (tx, mut rx) = oneshot::channel();
        r.pod_up(u, tx);
        rx.try_recv().expect("pod up answered at once")
    }

    /// Issue: the older interface of the name could not be detached, so the
    /// newer one was skipped (an error of the node's), and the pod-up was
    /// answered as enforced because a record of that name claimed the pod:
    /// the new veth ran without programs until a tick retried.
    #[test]
    fn a_pod_up_whose_older_interface_cannot_be_let_go_is_refused() {
        let mut r = reconciler();
        r.apply_plan(snapshot(1, vec![isolated("a")])).unwrap();
        up_now(&mut r, up("a", "veth-a", "c1")).unwrap();
        // Recreated on the same name (index 30), the DEL lost.
        r.datapath.interfaces.insert("veth-a".into(), 30);
        r.datapath.fail.insert("detach veth-a".into());
        let err = up_now(&mut r, up("a", "veth-a", "c2")).unwrap_err();
        assert!(
            err.contains("veth-a (index 30) is not enforced") && err.contains("injected failure"),
            "{err}"
        );
        assert!(!r.datapath.endpoints.contains_key(&30));

        // Once the older one can go (a tick retries), the pod comes up
        // enforced on its new interface.
        r.datapath.fail.clear();
        r.handle(Event::Tick);
        up_now(&mut r, up("a", "veth-a", "c3")).unwrap();
        let (ingress, _) = r.datapath.endpoint_of("veth-a").unwrap();
        assert!(ingress != 0 && ingress != DENY_ALL, "{ingress}");
        assert_eq!(r.datapath.attached_at["veth-a"], 30);
        r.datapath.assert_no_violations();
    }

    /// Issue: an interface no pod explains (the checkpoint lost) took its
    /// index from its name, so a new veth reusing the name got our
    /// programs with the old pod's addresses (dropping its egress) and its
    /// own pod's pod-up was refused as "enforced for other addresses".
    #[test]
    fn a_new_interface_reusing_an_unexplained_ones_name_is_not_given_its_entry() {
        let addr = |s: &str| Prefix::from_ip(s.parse().unwrap(), 32);
        let mut r = reconciler();
        r.apply_plan(snapshot(1, vec![isolated("a")])).unwrap();
        let mut a = up("a", "veth-a", "c1");
        a.runtime.ips = vec![addr("10.0.1.1")];
        up_now(&mut r, a).unwrap();
        // A restart that lost the checkpoint: veth-a is kept, unexplained.
        let datapath = std::mem::take(&mut r.datapath);
        let mut r = Reconciler::new("n1".into(), "e2".into(), datapath);
        r.recover(crate::checkpoint::Saved::default()).unwrap();
        assert_eq!(r.dump().interfaces[0].pod, None);

        // Its veth goes and a new one takes the name (index 30).
        r.datapath.interfaces.insert("veth-a".into(), 30);
        r.handle(Event::Links);
        assert!(
            !r.datapath.endpoints.contains_key(&30),
            "{:?}",
            r.datapath.endpoints
        );
        assert!(r.realized.endpoints.is_empty());

        // The new veth's pod comes up enforced with its own addresses.
        r.apply_plan(snapshot(2, vec![isolated("b")])).unwrap();
        let mut b = up("b", "veth-a", "c2");
        b.runtime.ips = vec![addr("10.0.2.2")];
        up_now(&mut r, b).unwrap();
        assert_eq!(
            r.datapath.endpoints[&30].pod_addrs,
            vec![addr("10.0.2.2").addr]
        );
        r.datapath.assert_no_violations();
    }

    /// Issue: liveness was decided by name, so `ip link set veth-a name
    /// veth-z` on a live pod's veth forgot the pod and detached its
    /// programs from the index, which still existed: its traffic went
    /// unenforced, with only an info log.
    #[test]
    fn a_renamed_interface_stays_enforced_and_is_named_in_the_dump() {
        let mut r = reconciler();
        r.apply_plan(snapshot(1, vec![isolated("a")])).unwrap();
        up_now(&mut r, up("a", "veth-a", "c1")).unwrap();
        let enforced = r.datapath.endpoints[&10].clone();
        r.datapath.interfaces.remove("veth-a");
        r.datapath.interfaces.insert("veth-z".into(), 10);
        r.handle(Event::Links);
        r.handle(Event::Tick);
        assert!(r.datapath.attached.contains("veth-a"));
        assert_eq!(r.datapath.endpoints.get(&10), Some(&enforced));
        assert_eq!(r.node_state().pods.len(), 1);
        let warned = warnings_with(&r, "veth-a (index 10) was renamed veth-z");
        assert_eq!(warned.len(), 1, "{warned:?}");

        // Still the pod's: its policy changes reach it.
        let open = PodPolicy {
            ingress: None,
            ..isolated("a")
        };
        r.apply_plan(snapshot(2, vec![open, isolated("b")]))
            .unwrap();
        assert_eq!(r.datapath.endpoints[&10].ingress, 0);
        // A pod-up naming it by its new name is refused, not attached twice.
        let err = up_now(&mut r, up("b", "veth-z", "c2")).unwrap_err();
        assert!(err.contains("enforced as veth-a"), "{err}");

        // Its DEL keeps it enforced while it lives; it goes with it.
        r.pod_down(Some(("x".into(), "a".into())), "c1").unwrap();
        assert!(r.datapath.attached.contains("veth-a"));
        assert!(r.datapath.endpoints.contains_key(&10));
        let errors = r.node_state().errors;
        assert!(
            errors.iter().any(|e| e.contains("lives on as veth-z")),
            "{errors:?}"
        );
        r.datapath.interfaces.remove("veth-z");
        r.handle(Event::Links);
        r.datapath.assert_empty();
        r.datapath.assert_no_violations();
    }
}
