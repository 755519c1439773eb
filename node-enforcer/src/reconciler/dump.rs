//! What operators see: the node state reported to the controller and the
//! debug dump. Whatever is not enforced as desired shows here (invariant 9):
//! a pod's `error` is set whenever it is denied for lack of knowledge, held,
//! unprotected, or its policy could not be written.

use std::collections::{BTreeMap, VecDeque};

use palisade_proto::v1::{DirectionPolicy, NodeState, PodPolicy, PodRef, PodState};

use super::Reconciler;
use crate::compile::Prefix;
use crate::datapath::{Datapath, DatapathError, DatapathErrorKind, PolicyId};
use crate::desired::{Claim, Mode, PodKey, PodRuntime, Verdict};

/// How many warnings the dump keeps (oldest dropped first).
const MAX_WARNINGS: usize = 32;

/// What went wrong, as operators see it in the node state and the dump.
#[derive(Default)]
pub(super) struct Health {
    /// Operations that failed in the last convergence.
    pub errors: Vec<String>,
    /// Pods whose datapath writes failed in the last convergence (a refused
    /// pod-up), as opposed to pods merely denied or held.
    pub failures: BTreeMap<PodKey, String>,
    /// Things an operator must see that outlive one convergence.
    pub warnings: VecDeque<String>,
    pub conntrack: ConntrackDump,
    /// Datapath calls that failed, by [`DatapathError::metric_label`].
    pub datapath_errors: BTreeMap<&'static str, u64>,
}

/// A datapath call's result, its failure counted in [`Health`] on the way
/// through: every failure the reconciler reports (as an error, a failed
/// pod, a warning, a refused request or a log line) is counted once, where
/// the call returns. Failures of best-effort cleanups it ignores are not.
pub(super) trait Counted {
    fn counted(self, health: &mut Health) -> Self;
}

impl<T> Counted for crate::datapath::Result<T> {
    fn counted(self, health: &mut Health) -> Self {
        if let Err(e) = &self {
            health.count(e);
        }
        self
    }
}

impl Health {
    pub fn warn(&mut self, w: String) {
        tracing::warn!("{w}");
        if self.warnings.len() == MAX_WARNINGS {
            self.warnings.pop_front();
        }
        self.warnings.push_back(w);
    }

    /// Counts a failed datapath call by its kind.
    pub fn count(&mut self, e: &DatapathError) {
        *self.datapath_errors.entry(e.metric_label()).or_default() += 1;
    }

    /// Whether the last convergence left failed operations (retried on
    /// ticks until they succeed).
    pub fn has_failures(&self) -> bool {
        !self.errors.is_empty() || !self.failures.is_empty()
    }
}

/// Everything the debug service shows.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    pub state: NodeState,
    pub node_addresses: Vec<Prefix>,
    pub plan_version: u64,
    pub plan_connected: bool,
    pub plan_stream_error: String,
    pub datapath: String,
    pub mode: Mode,
    pub warnings: Vec<String>,
    pub policy_sets: Vec<PolicySetDump>,
    pub interfaces: Vec<InterfaceDump>,
    pub conntrack: ConntrackDump,
    /// Failed datapath calls since start, by kind's metric label (every
    /// kind listed, zeros included).
    pub datapath_errors: Vec<(&'static str, u64)>,
}

/// The conntrack cleanups so far. `last.listed` holds the first
/// [`crate::conntrack::listing::LISTED`] eBPF conntrack entries of the last
/// cleanup in a stable order, `last.entries` how many there were in all.
#[derive(Clone, Debug, Default)]
pub struct ConntrackDump {
    pub last: crate::conntrack::sweep::Report,
    pub cleanups: u64,
    pub removed_total: u64,
    pub error: String,
}

impl ConntrackDump {
    /// The listed entries of the last cleanup, one line each, and how many
    /// entries it found in all (the list stops at
    /// [`crate::conntrack::listing::LISTED`]).
    pub fn entry_lines(&self) -> (Vec<String>, usize) {
        let lines = self.last.listed.iter().map(|e| e.to_string()).collect();
        (lines, self.last.entries)
    }

    pub fn record(&mut self, r: Result<crate::conntrack::sweep::Report, String>) {
        match r {
            Ok(report) => {
                self.cleanups += 1;
                self.removed_total += report.removed as u64;
                self.last = report;
                self.error.clear();
            }
            Err(e) => {
                tracing::warn!("conntrack cleanup: {e}");
                self.error = e;
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct PolicySetDump {
    pub name: String,
    pub id: PolicyId,
    pub prefix_entries: usize,
    pub references: usize,
}

#[derive(Clone, Debug, Default)]
pub struct InterfaceDump {
    pub name: String,
    pub ifindex: u32,
    /// None: an interface with our programs that no pod explains.
    pub pod: Option<PodKey>,
    pub ingress: String,
    pub egress: String,
    /// The staged (audit) policy set of each direction, empty where no
    /// staged policy applies (or audit failed: see the node's errors).
    pub audit_ingress: String,
    pub audit_egress: String,
    /// How the programs are attached: "links" (TCX, the head of the
    /// chains), or "filters" until promoted (see `promote`).
    pub attachment: &'static str,
}

/// Names of policy sets, each computed once per report: a name reads the
/// whole table, and replicas share one (100 pods naming a 10,000-address
/// peer set would otherwise read it 100 times after every event).
#[derive(Default)]
struct Names(std::collections::HashMap<*const crate::compile::PolicySet, String>);

impl Names {
    /// An audit direction: empty without a table.
    fn describe_audit(&mut self, s: Option<&std::sync::Arc<crate::compile::PolicySet>>) -> String {
        s.map(|s| self.describe(&Verdict::Policy(s.clone())))
            .unwrap_or_default()
    }

    fn describe(&mut self, v: &Verdict) -> String {
        match v {
            Verdict::Open => String::new(),
            Verdict::Deny => "deny-all".into(),
            Verdict::Policy(s) => self
                .0
                .entry(std::sync::Arc::as_ptr(s))
                .or_insert_with(|| s.id())
                .clone(),
        }
    }
}

impl<D: Datapath> Reconciler<D> {
    pub(super) fn pod_state(&self, key: &PodKey, rt: &PodRuntime) -> PodState {
        self.pod_state_named(key, rt, &mut Names::default())
    }

    fn pod_state_named(&self, key: &PodKey, rt: &PodRuntime, names: &mut Names) -> PodState {
        let policy = self.plan.listed_or_fetched(key);
        let ep = rt.host_interfaces.iter().find_map(|i| {
            self.realized
                .endpoints
                .get(i)
                .filter(|e| e.claim.pod() == Some(key))
        });
        let mut error = self
            .health
            .failures
            .get(key)
            .or_else(|| self.target.desired.errors.get(key))
            .cloned()
            .unwrap_or_default();
        if error.is_empty() {
            if let Some(missing) = rt.host_interfaces.iter().find(|i| {
                self.realized
                    .endpoints
                    .get(*i)
                    .is_none_or(|e| e.claim.pod() != Some(key))
            }) {
                error = format!("{missing} is not attached");
            }
        }
        if error.is_empty() && self.pods.deleting.contains(key) {
            error = "deleted; enforced until its interface goes away".into();
        }
        PodState {
            pod: Some(PodRef {
                namespace: key.0.clone(),
                name: key.1.clone(),
            }),
            container_id: rt.container_id.clone(),
            host_interfaces: rt.host_interfaces.clone(),
            pod_ips: rt.ips.iter().map(Prefix::to_wire).collect(),
            ingress_isolated: policy.is_some_and(|p| p.ingress.is_some()),
            egress_isolated: policy.is_some_and(|p| p.egress.is_some()),
            ingress_policy_set: ep.map(|e| names.describe(&e.ingress)).unwrap_or_default(),
            egress_policy_set: ep.map(|e| names.describe(&e.egress)).unwrap_or_default(),
            policies: policy.map(|p| p.policies.clone()).unwrap_or_default(),
            error,
        }
    }

    pub fn node_state(&self) -> NodeState {
        let mut errors = self.health.errors.clone();
        for (k, e) in &self.target.desired.errors {
            if !self.health.failures.contains_key(k) {
                errors.push(e.clone());
            }
        }
        errors.extend(self.health.failures.values().cloned());
        errors.extend(self.audit_error_lines().cloned());
        for (name, e) in &self.realized.endpoints {
            if e.claim == Claim::Unexplained {
                errors.push(format!(
                    "{name} (index {}) is enforced with the policy it had, but no pod explains it",
                    e.ifindex
                ));
            }
        }
        let mut names = Names::default();
        NodeState {
            node_name: self.ctx.node.clone(),
            enforcer_id: self.ctx.enforcer_id.clone(),
            realized_version: self.plan.realized_version,
            pods: self
                .pods
                .runtime
                .iter()
                .map(|(k, rt)| self.pod_state_named(k, rt, &mut names))
                .collect(),
            errors,
        }
    }

    pub fn dump(&self) -> Dump {
        let mut names = Names::default();
        let on_filters: std::collections::BTreeSet<String> = self
            .datapath
            .unpromoted()
            .into_iter()
            .map(|(name, _, _)| name)
            .collect();
        let mut references: BTreeMap<PolicyId, usize> = BTreeMap::new();
        for e in self.realized.endpoints.values() {
            for id in [e.entry.ingress, e.entry.egress] {
                *references.entry(id).or_default() += 1;
            }
        }
        for a in self.realized.audit.values() {
            for (id, _) in a.tables() {
                *references.entry(id).or_default() += 1;
            }
        }
        Dump {
            state: self.node_state(),
            node_addresses: self.target.node_addresses.clone(),
            plan_version: self.plan.version,
            plan_connected: self.plan.connected,
            plan_stream_error: self.plan.stream_error.clone(),
            datapath: self.datapath.describe(),
            mode: self.ctx.mode,
            // Big tables in flight are shown beside the warnings: the pods
            // waiting for them name them in their errors.
            warnings: self
                .health
                .warnings
                .iter()
                .cloned()
                .chain(self.background.describe())
                .chain(self.promotion.error.clone())
                .chain(
                    self.names
                        .tx
                        .is_none()
                        .then(|| unlearned_names(&self.plan.entries))
                        .flatten(),
                )
                .collect(),
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
                .map(|(name, e)| {
                    let attachment = if on_filters.contains(name) {
                        "filters"
                    } else {
                        "links"
                    };
                    let audit = self.realized.audit.get(name);
                    let audit_ingress =
                        names.describe_audit(audit.and_then(|a| a.ingress.as_ref()));
                    let audit_egress = names.describe_audit(audit.and_then(|a| a.egress.as_ref()));
                    InterfaceDump {
                        name: name.clone(),
                        ifindex: e.ifindex,
                        pod: e.claim.pod().cloned(),
                        ingress: names.describe(&e.ingress),
                        egress: names.describe(&e.egress),
                        audit_ingress,
                        audit_egress,
                        attachment,
                    }
                })
                .collect(),
            conntrack: self.health.conntrack.clone(),
            datapath_errors: DatapathErrorKind::ALL
                .iter()
                .map(|k| {
                    let label = k.metric_label();
                    (
                        label,
                        self.health.datapath_errors.get(label).copied().unwrap_or(0),
                    )
                })
                .collect(),
        }
    }
}

/// How many pods the domain-name warning names by way of example.
const NAMED_EXAMPLES: usize = 3;

/// The warning for the plan's domain-name rules when this enforcer runs
/// no learner: they match nothing (the Accept opens nothing), which the
/// plan alone does not make visible. None when no pod has one.
fn unlearned_names(plan: &BTreeMap<PodKey, PodPolicy>) -> Option<String> {
    let (pods, examples) = pods_with_names(plan, |p| [p.egress.as_ref(), p.audit_egress.as_ref()])?;
    Some(format!(
        "{pods} pod(s) have egress rules by domain name, which match nothing: this enforcer \
         runs no learner (no --dns-server given), so such an Accept opens nothing (e.g. {examples})"
    ))
}

/// How many pods have rules by name in the directions `of` picks, and up
/// to [`NAMED_EXAMPLES`] of them with their names; None when none has.
fn pods_with_names<'a>(
    plan: &'a BTreeMap<PodKey, PodPolicy>,
    of: impl Fn(&'a PodPolicy) -> [Option<&'a DirectionPolicy>; 2],
) -> Option<(usize, String)> {
    let mut pods = 0;
    let mut examples = Vec::new();
    for (pod, p) in plan {
        let mut names: Vec<&str> = of(p)
            .into_iter()
            .flatten()
            .flat_map(|d| {
                let tiers = d.admin.iter().chain(&d.baseline);
                tiers
                    .map(|r| &r.domain_names)
                    .chain(d.rules.iter().map(|r| &r.domain_names))
            })
            .flatten()
            .map(String::as_str)
            .collect();
        if names.is_empty() {
            continue;
        }
        pods += 1;
        if examples.len() < NAMED_EXAMPLES {
            names.sort_unstable();
            names.dedup();
            examples.push(format!("{}/{} ({})", pod.0, pod.1, names.join(", ")));
        }
    }
    (pods > 0).then(|| (pods, examples.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::listing::EntryView;
    use crate::conntrack::Tuple;

    #[test]
    fn failed_datapath_calls_are_counted_by_kind() {
        use crate::datapath::fake::FakeDatapath;
        use crate::reconciler::{PlanMessage, PodUp};
        use palisade_proto::v1::PlanSnapshot;

        let mut r = super::Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a"]),
        );
        r.apply_plan(PlanMessage::Snapshot(PlanSnapshot {
            version: 1,
            source_synced: true,
            ..Default::default()
        }))
        .unwrap();
        let up = |r: &mut super::Reconciler<FakeDatapath>, name: &str, iface: &str| {
            let (tx, mut rx) = tokio::sync::oneshot::channel();
            r.pod_up(
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
                },
                tx,
            );
            rx.try_recv().expect("answered at once")
        };
        // The kernel refuses the attach; the other pod's interface is gone.
        r.datapath.fail.insert("attach veth-a".into());
        assert!(up(&mut r, "a", "veth-a").is_err());
        assert!(up(&mut r, "b", "veth-gone").is_err());
        assert_eq!(
            r.dump().datapath_errors,
            [
                ("interface_gone", 1),
                ("full", 0),
                ("kernel", 1),
                ("io", 0),
                ("invariant", 0)
            ]
        );
    }

    #[test]
    fn domain_name_rules_are_named_as_matching_nothing() {
        use palisade_proto::v1::{DirectionPolicy, TierRule};
        let names = |n: &[&str]| DirectionPolicy {
            admin: vec![TierRule {
                domain_names: n.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut plan = BTreeMap::new();
        plan.insert(("x".into(), "plain".into()), PodPolicy::default());
        assert_eq!(unlearned_names(&plan), None);
        for i in 0..5 {
            plan.insert(
                ("x".into(), format!("p{i}")),
                PodPolicy {
                    egress: Some(names(&["b.example.com", "*.example.com"])),
                    ..Default::default()
                },
            );
        }
        plan.insert(
            ("y".into(), "staged".into()),
            PodPolicy {
                audit_egress: Some(names(&["a.example.org"])),
                ..Default::default()
            },
        );
        // A NetworkPolicy-tier rule by name (a PolicyEndpoint's).
        plan.insert(
            ("z".into(), "endpoint".into()),
            PodPolicy {
                egress: Some(DirectionPolicy {
                    rules: vec![palisade_proto::v1::Rule {
                        domain_names: vec!["c.example.net".into()],
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let w = unlearned_names(&plan).unwrap();
        assert!(
            w.starts_with("7 pod(s) have egress rules by domain name"),
            "{w}"
        );
        assert!(
            w.ends_with("(e.g. x/p0 (*.example.com, b.example.com); x/p1 (*.example.com, b.example.com); x/p2 (*.example.com, b.example.com))"),
            "{w}"
        );
    }

    #[test]
    fn the_dump_lists_the_last_cleanups_entries_with_the_total() {
        let mut d = ConntrackDump::default();
        let mut addr = [0u8; 16];
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12] = 10;
        addr[15] = 2;
        let entry = EntryView {
            ifindex: 7,
            hook: "from_pod",
            tuple: Tuple {
                src: addr,
                dst: addr,
                sport: 40000,
                dport: 80,
                proto: 6,
            },
            epoch: 3,
            idle_ms: 1200,
            removed: false,
        };
        d.record(Ok(crate::conntrack::sweep::Report {
            entries: 300,
            kept: 300,
            listed: vec![entry],
            ..Default::default()
        }));
        let (lines, total) = d.entry_lines();
        assert_eq!(total, 300);
        assert_eq!(
            lines,
            ["ifindex=7 hook=from_pod proto=6 10.0.0.2:40000 -> 10.0.0.2:80 epoch=3 idle_ms=1200"]
        );
        // A failed cleanup keeps the last good list and says why.
        d.record(Err("no netlink".into()));
        assert_eq!(d.entry_lines().0.len(), 1);
        assert_eq!(d.error, "no netlink");
    }
}
