//! Values the reconciler's test modules share: a pod-up and a snapshot as
//! the CNI server and the plan stream hand them over.

use palisade_proto::v1::{PlanSnapshot, PodPolicy};

use super::{PlanMessage, PodUp, Reconciler};
use crate::datapath::fake::FakeDatapath;
use crate::desired::PodRuntime;

/// Pod `x/name`'s pod-up on `iface`, container `c-name`, in its netns.
pub fn pod_up(name: &str, iface: &str) -> PodUp {
    let mut up = pod_up_as(name, iface, &format!("c-{name}"));
    up.runtime.netns = format!("/run/netns/{name}");
    up
}

/// Pod `x/name`'s pod-up on `iface` from sandbox `container`, no netns.
pub fn pod_up_as(name: &str, iface: &str, container: &str) -> PodUp {
    PodUp {
        pod: ("x".into(), name.into()),
        runtime: PodRuntime {
            container_id: container.into(),
            netns: String::new(),
            host_interfaces: vec![iface.into()],
            ips: vec![],
            ifindexes: Default::default(),
            mode: None,
        },
    }
}

/// A snapshot of a controller that has read its whole source.
pub fn snapshot(version: u64, pods: Vec<PodPolicy>) -> PlanMessage {
    snapshot_of(version, true, pods)
}

pub fn snapshot_of(version: u64, synced: bool, pods: Vec<PodPolicy>) -> PlanMessage {
    PlanMessage::Snapshot(PlanSnapshot {
        version,
        pods,
        source_synced: synced,
        ..Default::default()
    })
}

/// The dump's warnings that contain `text`.
pub fn warnings_with(r: &Reconciler<FakeDatapath>, text: &str) -> Vec<String> {
    r.dump()
        .warnings
        .into_iter()
        .filter(|w| w.contains(text))
        .collect()
}
