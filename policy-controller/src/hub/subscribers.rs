//! Who watches a node's plan. A subscription is a receiver of the node's
//! plan watch; the node's first subscriber arriving and its last one leaving
//! are its connection history ([`ConnectionHistory`](crate::debug::connection::ConnectionHistory)).

use std::sync::Arc;

use tokio::sync::watch;

use super::versions::VersionedPlan;
use super::{Hub, NodeEntry, NotSynced};

/// A node's live subscription; dropping it marks the node disconnected.
pub struct Subscription {
    pub rx: watch::Receiver<Arc<VersionedPlan>>,
    hub: Hub,
    node: String,
}

impl Hub {
    /// Subscribes to a node's plan; the receiver's current value is the
    /// snapshot to send first. Refused until the source has synced.
    pub fn subscribe(&self, node: &str) -> Result<Subscription, NotSynced> {
        let mut st = self.lock();
        st.check_synced()?;
        let revision = st.source_revision;
        let first = self.first_version;
        let entry = st
            .nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeEntry::new(first, revision));
        if entry.subscribers == 0 {
            entry.connection.connected(std::time::SystemTime::now());
        }
        entry.subscribers += 1;
        Ok(Subscription {
            rx: entry.plan.subscribe(),
            hub: self.clone(),
            node: node.to_string(),
        })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let first = self.hub.first_version;
        let mut st = self.hub.lock();
        let unplanned = match st.nodes.get_mut(&self.node) {
            Some(e) => {
                e.subscribers = e.subscribers.saturating_sub(1);
                if e.subscribers == 0 {
                    e.connection.disconnected(std::time::SystemTime::now());
                }
                e.subscribers == 0 && e.plan.borrow().version == first
            }
            None => false,
        };
        // A node the source never gave a plan holds an entry only while
        // connected: names nobody runs cannot grow the table.
        if unplanned {
            st.nodes.remove(&self.node);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::ClusterState;
    use crate::debug::connection::ConnectionHistory;
    use crate::hub::{tests::cluster, Hub};

    #[tokio::test]
    async fn close_ends_subscriptions() {
        let hub = Hub::new(1);
        hub.update(&ClusterState::default());
        let mut sub = hub.subscribe("n1").unwrap();
        hub.close();
        assert!(sub.rx.changed().await.is_err());
    }

    #[test]
    fn connection_history_follows_the_first_and_last_subscriber() {
        let hub = Hub::new(1);
        hub.update(&cluster(true, "1"));
        let node = |hub: &Hub| hub.view().nodes[0].connection;
        assert_eq!(node(&hub), ConnectionHistory::default(), "never connected");
        let before = std::time::SystemTime::now();
        let a = hub.subscribe("n1").unwrap();
        let first = node(&hub);
        let since = first.connected_since.expect("connected");
        assert!(since >= before);
        assert_eq!((first.changed_at, first.reconnects), (Some(since), 0));
        let b = hub.subscribe("n1").unwrap();
        drop(a);
        assert_eq!(node(&hub), first, "a second stream is not a new connection");
        drop(b);
        let gone = node(&hub);
        assert_eq!(gone.connected_since, None);
        assert!(gone.changed_at.unwrap() >= since);
        let _c = hub.subscribe("n1").unwrap();
        let back = node(&hub);
        assert_eq!(back.reconnects, 1);
        assert!(back.connected_since.unwrap() >= gone.changed_at.unwrap());
    }

    #[test]
    fn unplanned_nodes_are_dropped_when_their_last_subscriber_leaves() {
        let hub = Hub::new(1);
        hub.update(&cluster(true, "1"));
        for i in 0..1000 {
            let a = hub.subscribe(&format!("random-{i}")).unwrap();
            let b = hub.subscribe(&format!("random-{i}")).unwrap();
            drop(a);
            assert_eq!(hub.view().nodes.len(), 2, "still connected");
            drop(b);
        }
        let planned = hub.subscribe("n1").unwrap();
        drop(planned);
        let view = hub.view();
        assert_eq!(
            view.nodes
                .iter()
                .map(|n| n.node_name.as_str())
                .collect::<Vec<_>>(),
            vec!["n1"],
            "a planned node keeps its entry"
        );
    }
}
