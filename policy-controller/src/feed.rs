//! Feeds a source's output into the hub: whole views (the manifest source)
//! are diffed against what the engine holds, changes to single objects (the
//! kube source) go to the engine as they are; every list of source problems
//! becomes the hub's errors.
//!
//! Resolution runs on a blocking thread: at cluster scale it takes long
//! enough that running it on the async runtime would stall the gRPC server.

use tokio::sync::{mpsc, watch};

use crate::cluster::ClusterState;
use crate::engine::Change;
use crate::hub::Hub;
use crate::source::SourceProblem;

/// Changes from a source that watches events.
#[derive(Debug)]
pub struct Update {
    /// In the order the source saw them.
    pub changes: Vec<Change>,
    /// The source's marker once these changes are in.
    pub marker: String,
    /// Whether the source has listed everything once. Before that the
    /// changes are only staged: nothing is resolved and the hub stays
    /// unsynced, so no node gets a plan from half a cluster.
    pub synced: bool,
}

/// Runs until both channels close. A view that arrives while the previous
/// one is being resolved replaces any still waiting (the watch channel keeps
/// only the newest), so the hub never falls behind by more than one view.
pub async fn run(
    hub: Hub,
    mut states: watch::Receiver<Option<ClusterState>>,
    errors: watch::Receiver<Vec<SourceProblem>>,
) {
    let errors_task = tokio::spawn(forward_errors(hub.clone(), errors));
    // A source may have published before this task first looked.
    let mut pending = states.borrow_and_update().clone();
    loop {
        if let Some(state) = pending.take() {
            let hub = hub.clone();
            let started = std::time::Instant::now();
            let work = tokio::task::spawn_blocking(move || hub.update(&state)).await;
            crate::metrics::controller::observe_pass(started.elapsed());
            if let Err(e) = work {
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

/// Runs until both channels close. Updates that arrive while the engine
/// works are taken together as one batch, so the engine never falls behind
/// by more than one batch and a burst of changes is resolved once.
pub async fn run_changes(
    hub: Hub,
    mut updates: mpsc::UnboundedReceiver<Update>,
    errors: watch::Receiver<Vec<SourceProblem>>,
) {
    let errors_task = tokio::spawn(forward_errors(hub.clone(), errors));
    while let Some(first) = updates.recv().await {
        let mut marker = first.marker;
        let mut synced = first.synced;
        let mut changes = first.changes;
        while let Ok(next) = updates.try_recv() {
            changes.extend(next.changes);
            marker = next.marker;
            synced = next.synced;
        }
        let hub = hub.clone();
        let started = std::time::Instant::now();
        let work = tokio::task::spawn_blocking(move || {
            if synced {
                hub.apply(changes, marker);
            } else {
                hub.stage(changes);
            }
        });
        let work = work.await;
        if synced {
            crate::metrics::controller::observe_pass(started.elapsed());
        }
        if let Err(e) = work {
            // A panic in resolution leaves the last plans in force.
            tracing::error!(error = %e, "resolution failed");
        }
    }
    let _ = errors_task.await;
}

async fn forward_errors(hub: Hub, mut errors: watch::Receiver<Vec<SourceProblem>>) {
    while errors.changed().await.is_ok() {
        let list = errors.borrow_and_update().clone();
        for e in &list {
            tracing::error!("{e}");
        }
        hub.set_source_errors(list);
    }
}
