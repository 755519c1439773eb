//! What each node reports it has realized, kept beside its plan for the
//! debug service and the metrics.

use palisade_proto::v1::NodeState;

use super::Hub;

impl Hub {
    pub fn report(&self, state: NodeState) {
        let mut st = self.lock();
        if let Some(entry) = st.nodes.get_mut(&state.node_name) {
            entry.reported = Some(state);
        } else {
            // Only nodes with a plan or a live subscription hold an entry,
            // so reports under random names cannot grow the table.
            tracing::debug!(node = %state.node_name, "report from a node neither planned nor subscribed; dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use palisade_proto::v1::NodeState;

    use crate::cluster::ClusterState;
    use crate::hub::Hub;

    #[test]
    fn reports_are_kept_per_known_node() {
        let hub = Hub::new(1);
        hub.update(&ClusterState::default());
        let sub = hub.subscribe("n9").unwrap();
        hub.report(NodeState {
            node_name: "n9".into(),
            realized_version: 7,
            ..Default::default()
        });
        let view = hub.view();
        assert_eq!(view.nodes[0].reported.as_ref().unwrap().realized_version, 7);
        drop(sub);
        hub.report(NodeState {
            node_name: "nobody".into(),
            ..Default::default()
        });
        assert!(hub.view().nodes.is_empty());
    }
}
