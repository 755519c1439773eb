//! When is a published manifest revision in the datapath?
//!
//! The controller must have read exactly that revision, the node's plan must
//! be computed from the controller's current view, and the enforcer must
//! report that plan version as realized.

use palisade_proto::v1::{GetControllerStateResponse, NodeView};

/// What the lab expects to be realized.
pub struct Expected<'a> {
    pub node: &'a str,
    /// The manifest revision the lab published last.
    pub revision: u64,
    /// The running enforcer, when it reports an id: a report from an earlier
    /// one (before a restart) says nothing about the datapath now.
    pub enforcer_id: Option<&'a str>,
    /// Pods the lab wired on the node (`namespace/name`): a plan is not
    /// realized while the enforcer does not know one of them.
    pub pods: &'a [String],
    /// Pods whose errors are expected (their host veth was deleted by a
    /// fault): an error there is the enforcer being honest, not unrealized.
    pub tolerated: &'a [String],
}

/// `Ok` once the expectation holds; otherwise what is missing.
pub fn check(state: &GetControllerStateResponse, want: &Expected) -> Result<(), String> {
    let node = want.node;
    let marker = want.revision.to_string();
    if state.source_marker != marker {
        return Err(format!(
            "the controller has read manifest revision {:?}, waiting for {marker:?}",
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
    if let Some(id) = want.enforcer_id {
        if reported.enforcer_id != id {
            return Err(format!(
                "node {node}'s last report is from enforcer {:?}, waiting for the running one {id:?}",
                reported.enforcer_id
            ));
        }
    }
    if reported.realized_version != view.plan_version {
        return Err(format!(
            "node {node} realized plan version {}, the plan is at {}",
            reported.realized_version, view.plan_version
        ));
    }
    let known: Vec<String> = reported
        .pods
        .iter()
        .filter_map(|p| p.pod.as_ref())
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let unknown: Vec<&str> = want
        .pods
        .iter()
        .filter(|p| !known.contains(p))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "node {node} reports plan version {} realized but does not list pods {unknown:?}",
            view.plan_version
        ));
    }
    let failing: Vec<String> = reported
        .pods
        .iter()
        .filter(|p| !p.error.is_empty())
        .map(|p| {
            let name = p
                .pod
                .as_ref()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .unwrap_or_default();
            (name, &p.error)
        })
        .filter(|(name, _)| !want.tolerated.contains(name))
        .map(|(name, error)| format!("{name}: {error}"))
        .collect();
    if !failing.is_empty() {
        return Err(format!(
            "node {node} reports pod errors: {}",
            failing.join("; ")
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
                    out += &format!(
                        " realized_version={} enforcer_id={:?}",
                        r.realized_version, r.enforcer_id
                    );
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
    use palisade_proto::v1::{NodeState, PodRef, PodState};

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
            source_synced: true,
            nodes: vec![NodeView {
                node_name: "n".into(),
                plan_version: plan,
                plan_source_revision: plan_src,
                connected: true,
                reported: realized.map(|r| NodeState {
                    realized_version: r,
                    enforcer_id: "e1".into(),
                    ..Default::default()
                }),
                plan: None,
            }],
            errors: vec![],
            refusals: None,
        }
    }

    fn want<'a>(revision: u64, enforcer_id: Option<&'a str>, pods: &'a [String]) -> Expected<'a> {
        Expected {
            node: "n",
            revision,
            enforcer_id,
            pods,
            tolerated: &[],
        }
    }

    #[test]
    fn realized_only_when_every_part_caught_up() {
        let none: &[String] = &[];
        assert!(check(&state("3", 7, 7, 4, Some(4)), &want(3, None, none)).is_ok());
        assert!(check(&state("3", 7, 7, 4, Some(4)), &want(3, Some("e1"), none)).is_ok());
        assert!(check(&state("3", 7, 7, 4, Some(4)), &want(3, Some("e2"), none)).is_err());
        assert!(check(&state("2", 7, 7, 4, Some(4)), &want(3, None, none)).is_err());
        assert!(check(&state("3", 7, 6, 4, Some(4)), &want(3, None, none)).is_err());
        assert!(check(&state("3", 7, 7, 4, Some(3)), &want(3, None, none)).is_err());
        assert!(check(&state("3", 7, 7, 4, None), &want(3, None, none)).is_err());
        let mut other = want(3, None, none);
        other.node = "other";
        let e = check(&state("3", 7, 7, 4, Some(4)), &other).unwrap_err();
        assert!(e.contains("no view of node other"), "{e}");
    }

    #[test]
    fn every_wired_pod_must_be_known_and_healthy() {
        let pods = ["x/a".to_string()];
        let mut s = state("3", 7, 7, 4, Some(4));
        let e = check(&s, &want(3, None, &pods)).unwrap_err();
        assert!(e.contains("x/a"), "{e}");
        let reported = s.nodes[0].reported.as_mut().unwrap();
        reported.pods.push(PodState {
            pod: Some(PodRef {
                namespace: "x".into(),
                name: "a".into(),
            }),
            ..Default::default()
        });
        assert!(check(&s, &want(3, None, &pods)).is_ok());
        s.nodes[0].reported.as_mut().unwrap().pods[0].error = "attach failed".into();
        let e = check(&s, &want(3, None, &pods)).unwrap_err();
        assert!(e.contains("attach failed"), "{e}");
        let mut unplugged = want(3, None, &[]);
        unplugged.tolerated = &pods;
        assert!(check(&s, &unplugged).is_ok());
    }
}
