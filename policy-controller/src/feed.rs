//! Feeds a source's output into the hub: every complete view of the cluster
//! becomes plans, every list of source problems becomes the hub's errors.
//!
//! Resolution runs on a blocking thread: at cluster scale it takes long
//! enough that running it on the async runtime would stall the gRPC server.

use tokio::sync::watch;

use crate::cluster::ClusterState;
use crate::hub::Hub;

/// Runs until both channels close. A view that arrives while the previous
/// one is being resolved replaces any still waiting (the watch channel keeps
/// only the newest), so the hub never falls behind by more than one view.
pub async fn run(
    hub: Hub,
    mut states: watch::Receiver<Option<ClusterState>>,
    mut errors: watch::Receiver<Vec<String>>,
) {
    let hub_for_errors = hub.clone();
    let errors_task = tokio::spawn(async move {
        while errors.changed().await.is_ok() {
            let list = errors.borrow_and_update().clone();
            for e in &list {
                tracing::error!("{e}");
            }
            hub_for_errors.set_source_errors(list);
        }
    });
    // A source may have published before this task first looked.
    let mut pending = states.borrow_and_update().clone();
    loop {
        if let Some(state) = pending.take() {
            let hub = hub.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || hub.update(&state)).await {
                // A panic in resolution leaves the last plans in force.
                tracing::error!(error = %e, "resolution failed");
            }
        }
        if states.changed().await.is_err() {
            break;
        }
        pending = states.borrow_and_update().clone();
    }
    let _ = errors_task.await;
}
