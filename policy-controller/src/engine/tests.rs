use super::*;
use crate::cluster::Object;
use crate::resolve::resolve_with_errors;

fn pod(ns: &str, name: &str, app: &str, node: &str, ip: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"podIP": ip}
    }))
    .unwrap()
}

fn allow_from_same_app(ns: &str, name: &str, app: &str) -> NetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "podSelector": {"matchLabels": {"app": app}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": app}}}]}]
        }
    }))
    .unwrap()
}

fn cluster() -> ClusterState {
    let mut objects = Vec::new();
    for (i, ns) in ["a", "b", "c"].iter().enumerate() {
        for j in 0..4 {
            let app = if j < 2 { "one" } else { "two" };
            objects.push(Object::Pod(pod(
                ns,
                &format!("p{j}"),
                app,
                &format!("n{}", (i * 4 + j) % 5),
                &format!("10.0.{i}.{j}"),
            )));
        }
        objects.push(Object::NetworkPolicy(allow_from_same_app(ns, "one", "one")));
        objects.push(Object::NetworkPolicy(allow_from_same_app(ns, "two", "two")));
    }
    ClusterState::from_objects(objects, String::new())
}

#[test]
fn full_build_equals_the_oracle_and_shares_selections() {
    let state = cluster();
    let (engine, outcome) = Engine::from_state(&state);
    assert_eq!(engine.resolution(), resolve_with_errors(&state));
    assert_eq!(outcome.recomputed, 12);
    // One selection per (namespace, app), used by two targets each.
    assert_eq!(engine.stats().selections, 6);
}

#[test]
fn a_relabel_recomputes_only_its_namespace_peers_and_reaches_their_nodes() {
    let mut state = cluster();
    let (mut engine, _) = Engine::from_state(&state);
    let moved = pod("b", "p0", "two", "n4", "10.0.1.0");
    let outcome = engine.apply([Change::ApplyPod(moved.clone())]);
    // b/p0 itself, b/p1 (lost a peer) and b/p2, b/p3 (gained one).
    assert_eq!(outcome.recomputed, 4);
    let nodes: Vec<&String> = outcome.changed.keys().collect();
    assert_eq!(nodes, ["n0", "n1", "n2", "n4"]);
    let i = state
        .pods
        .iter()
        .position(|p| {
            p.metadata.namespace.as_deref() == Some("b") && p.metadata.name.as_deref() == Some("p0")
        })
        .unwrap();
    state.pods[i] = moved;
    assert_eq!(engine.resolution(), resolve_with_errors(&state));
}

#[test]
fn an_unchanged_view_recomputes_nothing() {
    let state = cluster();
    let (mut engine, _) = Engine::from_state(&state);
    let outcome = engine.sync(&state);
    assert_eq!(outcome.recomputed, 0);
    assert!(outcome.changed.is_empty());
}
