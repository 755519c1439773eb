//! When is a published manifest revision in the datapath?
//!
//! The controller must have read exactly that revision, the node's plan must
//! be computed from the controller's current view, and the enforcer must
//! report that plan version as realized.

use palisade_proto::v1::{GetControllerStateResponse, NodeView};

/// `Ok` once `revision` is realized on `node`; otherwise what is missing.
pub fn check(state: &GetControllerStateResponse, node: &str, revision: u64) -> Result<(), String> {
    let want = revision.to_string();
    if state.source_marker != want {
        return Err(format!(
            "the controller has read manifest revision {:?}, waiting for {want:?}",
            state.source_marker
        ));
    }
    let view = node_view(state, node)
        .ok_or_else(|| format!("the controller has no view of node {node}"))?;
    if view.plan_source_revision != state.source_revision {
        return Err(format!(
            "the plan of node {node} is from source revision {}, the controller is at {}",
            view.plan_source_revision, state.source_revision
        ));
    }
    let reported = view.reported.as_ref().ok_or_else(|| {
        format!(
            "node {node} has not reported its state yet (connected: {})",
            view.connected
        )
    })?;
    if reported.realized_version != view.plan_version {
        return Err(format!(
            "node {node} realized plan version {}, the plan is at {}",
            reported.realized_version, view.plan_version
        ));
    }
    Ok(())
}

pub fn node_view<'a>(state: &'a GetControllerStateResponse, node: &str) -> Option<&'a NodeView> {
    state.nodes.iter().find(|n| n.node_name == node)
}

/// A compact account of the state, for timeout messages.
pub fn describe(state: &GetControllerStateResponse, node: &str) -> String {
    let mut out = format!(
        "source_revision={} source_marker={:?}",
        state.source_revision, state.source_marker
    );
    if !state.errors.is_empty() {
        out += &format!(" controller errors={:?}", state.errors);
    }
    match node_view(state, node) {
        None => {
            let names: Vec<&str> = state.nodes.iter().map(|n| n.node_name.as_str()).collect();
            out += &format!("; no view of {node} (nodes: {names:?})");
        }
        Some(v) => {
            out += &format!(
                "; node {node}: connected={} plan_version={} plan_source_revision={}",
                v.connected, v.plan_version, v.plan_source_revision
            );
            match &v.reported {
                None => out += " reported=none",
                Some(r) => {
                    out += &format!(" realized_version={}", r.realized_version);
                    if !r.errors.is_empty() {
                        out += &format!(" node errors={:?}", r.errors);
                    }
                    for p in &r.pods {
                        let name = p
                            .pod
                            .as_ref()
                            .map(|p| format!("{}/{}", p.namespace, p.name))
                            .unwrap_or_default();
                        if !p.error.is_empty() {
                            out += &format!(" pod {name} error={:?}", p.error);
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_proto::v1::NodeState;

    fn state(
        marker: &str,
        src: u64,
        plan_src: u64,
        plan: u64,
        realized: Option<u64>,
    ) -> GetControllerStateResponse {
        GetControllerStateResponse {
            source_revision: src,
            source_marker: marker.into(),
            nodes: vec![NodeView {
                node_name: "n".into(),
                plan_version: plan,
                plan_source_revision: plan_src,
                connected: true,
                reported: realized.map(|r| NodeState {
                    realized_version: r,
                    ..Default::default()
                }),
                plan: None,
            }],
            errors: vec![],
        }
    }

    #[test]
    fn realized_only_when_every_part_caught_up() {
        assert!(check(&state("3", 7, 7, 4, Some(4)), "n", 3).is_ok());
        assert!(check(&state("2", 7, 7, 4, Some(4)), "n", 3).is_err());
        assert!(check(&state("3", 7, 6, 4, Some(4)), "n", 3).is_err());
        assert!(check(&state("3", 7, 7, 4, Some(3)), "n", 3).is_err());
        assert!(check(&state("3", 7, 7, 4, None), "n", 3).is_err());
        let e = check(&state("3", 7, 7, 4, Some(4)), "other", 3).unwrap_err();
        assert!(e.contains("no view of node other"), "{e}");
    }
}
