//! Pods that learn addresses by domain name: the flag of their endpoint
//! (their egress consults the learned overlay) and what the learner is
//! told of them (their egress policy as compiled, the node's addresses).
//!
//! Computed after the endpoints are written, from what is realized: an
//! interface learns only while its egress table is the one compiled from
//! a policy with rules by name. Without a learner nothing is flagged, and
//! the dump says names match nothing.

use std::collections::BTreeMap;

use tokio::sync::mpsc;

use super::Reconciler;
use crate::compile::Prefix;
use crate::datapath::Datapath;
use crate::desired::Desired;
use crate::names::Egress;

/// What the learner is told of one interface: `egress` None when it no
/// longer learns (or is gone).
#[derive(Clone, Debug, PartialEq)]
pub struct PodUpdate {
    pub ifindex: u32,
    pub egress: Option<Egress>,
    pub node: Vec<Prefix>,
}

#[derive(Default)]
pub(super) struct Names {
    /// Where the learner hears of pods; None: this enforcer has none.
    pub tx: Option<mpsc::UnboundedSender<PodUpdate>>,
    /// What each learning interface was last told, and the node's
    /// addresses then.
    pub sent: BTreeMap<u32, Egress>,
    pub node: Vec<Prefix>,
}

impl<D: Datapath> Reconciler<D> {
    /// Step 3c of `apply`: flags the interfaces that learn, unflags those
    /// that stopped, and tells the learner.
    pub(super) fn sync_names(&mut self, want: &Desired) {
        let Some(tx) = self.names.tx.clone() else {
            return;
        };
        let mut now: BTreeMap<u32, Egress> = BTreeMap::new();
        for (ifname, re) in &self.realized.endpoints {
            if let Some(d) = want.endpoints.get(ifname) {
                if let (Some(e), true) = (&d.names, d.ifindex == re.ifindex) {
                    now.insert(re.ifindex, e.clone());
                }
            }
        }
        let node = self.target.node_addresses.clone();
        let node_moved = self.names.node != node;
        let live: std::collections::BTreeSet<u32> = self
            .realized
            .endpoints
            .values()
            .map(|e| e.ifindex)
            .collect();
        let sent = std::mem::take(&mut self.names.sent);
        for ifindex in sent.keys().filter(|i| !now.contains_key(i)) {
            if live.contains(ifindex) {
                if let Err(e) = self.datapath.set_learns(*ifindex, false) {
                    tracing::warn!(ifindex, error = %e, "clearing the learning flag");
                }
            }
            let _ = tx.send(PodUpdate {
                ifindex: *ifindex,
                egress: None,
                node: node.clone(),
            });
        }
        for (ifindex, egress) in &now {
            let before = sent.get(ifindex);
            if before.is_none() {
                if let Err(e) = self.datapath.set_learns(*ifindex, true) {
                    tracing::warn!(ifindex, error = %e, "setting the learning flag");
                }
            }
            if before != Some(egress) || node_moved {
                let _ = tx.send(PodUpdate {
                    ifindex: *ifindex,
                    egress: Some(egress.clone()),
                    node: node.clone(),
                });
            }
        }
        self.names.sent = now;
        self.names.node = node;
    }
}

#[cfg(test)]
mod tests {
    use palisade_proto::v1::{DirectionPolicy, PlanSnapshot, PodPolicy, PodRef, Rule};

    use super::*;
    use crate::datapath::fake::FakeDatapath;
    use crate::desired::PodRuntime;
    use crate::reconciler::{PlanMessage, PodUp};

    fn egress(names: &[&str]) -> DirectionPolicy {
        DirectionPolicy {
            rules: vec![Rule {
                domain_names: names.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn plan(version: u64, egress: Option<DirectionPolicy>) -> PlanMessage {
        PlanMessage::Snapshot(PlanSnapshot {
            version,
            source_synced: true,
            pods: vec![PodPolicy {
                pod: Some(PodRef {
                    namespace: "x".into(),
                    name: "a".into(),
                }),
                egress,
                policies: vec!["x/p".into()],
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<PodUpdate>) -> Vec<PodUpdate> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn a_pod_with_rules_by_name_is_flagged_and_the_learner_told_until_it_has_none() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut r = Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a"]),
        )
        .with_learner(tx);
        r.apply_plan(plan(1, Some(egress(&["*.example.com"]))))
            .unwrap();
        let (reply, mut answered) = tokio::sync::oneshot::channel();
        r.pod_up(
            PodUp {
                pod: ("x".into(), "a".into()),
                runtime: PodRuntime {
                    container_id: "c".into(),
                    netns: "/run/netns/a".into(),
                    host_interfaces: vec!["veth-a".into()],
                    ips: vec![],
                    ifindexes: Default::default(),
                    mode: None,
                },
            },
            reply,
        );
        answered.try_recv().unwrap().unwrap();
        let ifindex = r.realized.endpoints["veth-a"].ifindex;
        assert!(r.datapath.learns.contains(&ifindex));
        let told = drain(&mut rx);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].ifindex, ifindex);
        assert_eq!(
            told[0].egress.as_ref().unwrap().enforced.rules[0].domain_names,
            ["*.example.com"]
        );

        // Another pattern: told again, still flagged.
        r.apply_plan(plan(2, Some(egress(&["api.example.com"]))))
            .unwrap();
        let told = drain(&mut rx);
        assert_eq!(told.len(), 1);
        assert!(r.datapath.learns.contains(&ifindex));
        // Nothing changed: nothing told.
        r.apply_plan(plan(3, Some(egress(&["api.example.com"]))))
            .unwrap();
        assert!(drain(&mut rx).is_empty());

        // No rule by name any more: unflagged, and told so.
        r.apply_plan(plan(4, Some(egress(&[])))).unwrap();
        let told = drain(&mut rx);
        assert_eq!(told.len(), 1);
        assert!(told[0].egress.is_none());
        assert!(!r.datapath.learns.contains(&ifindex));
        r.datapath.assert_no_violations();
    }

    #[test]
    fn without_a_learner_nothing_is_flagged_and_the_dump_warns() {
        let mut r = Reconciler::new(
            "n1".into(),
            "e1".into(),
            FakeDatapath::with_interfaces(&["veth-a"]),
        );
        r.apply_plan(plan(1, Some(egress(&["*.example.com"]))))
            .unwrap();
        assert!(r.datapath.learns.is_empty());
        let dump = r.dump();
        assert!(
            dump.warnings.iter().any(|e| e.contains("runs no learner")),
            "{:?}",
            dump.warnings
        );
    }
}
