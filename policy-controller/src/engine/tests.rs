use super::*;
use crate::cluster::Object;
use crate::resolve::resolve_cluster;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

fn pod(ns: &str, name: &str, app: &str, node: &str, ip: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
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
    assert_eq!(engine.resolution(), resolve_cluster(&state));
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
    assert_eq!(engine.resolution(), resolve_cluster(&state));
}

#[test]
fn an_unchanged_view_recomputes_nothing() {
    let state = cluster();
    let (mut engine, _) = Engine::from_state(&state);
    let outcome = engine.sync(&state);
    assert_eq!(outcome.recomputed, 0);
    assert!(outcome.changed.is_empty());
}

fn service(ns: &str, name: &str, selector: Option<&str>, ip: &str) -> Service {
    let mut spec = serde_json::json!({"clusterIP": ip, "ports": [{"name": "p", "port": 80}]});
    if let Some(app) = selector {
        spec["selector"] = serde_json::json!({"app": app});
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns}, "spec": spec
    }))
    .unwrap()
}

fn slice(ns: &str, name: &str, service: &str, ip: &str) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}],
        "ports": [{"name": "p", "port": 80}]
    }))
    .unwrap()
}

/// The cluster above, and a client in "x" whose egress goes to `app=one`
/// pods of namespace "a".
fn cluster_with_client() -> ClusterState {
    let mut state = cluster();
    state
        .pods
        .push(pod("x", "client", "client", "n0", "10.0.9.1"));
    state.policies.push(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "out", "namespace": "x"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "a"}},
                    "podSelector": {"matchLabels": {"app": "one"}}
                }]}]
            }
        }))
        .unwrap(),
    );
    state
}

fn client_rules(engine: &Engine) -> usize {
    let plan = &engine.plans()["n0"];
    let client = plan.pods[&("x".to_string(), "client".to_string())].decode();
    client.egress.as_ref().unwrap().rules.len()
}

#[test]
fn service_changes_recompute_only_the_targets_that_read_them() {
    let mut state = cluster_with_client();
    let (mut engine, _) = Engine::from_state(&state);
    assert_eq!(client_rules(&engine), 1, "the pods alone");

    // A Service in "a" backed by the client's peers: only the client reads
    // the Services of "a".
    let svc = service("a", "one", Some("one"), "10.96.0.1");
    let outcome = engine.apply([Change::ApplyService(svc.clone())]);
    assert_eq!(outcome.recomputed, 1);
    assert_eq!(client_rules(&engine), 2, "the pods and the ClusterIP");
    state.services.push(svc);
    assert_eq!(engine.resolution(), resolve_cluster(&state));

    // A Service where no egress rule looks: nothing to recompute.
    let other = service("b", "one", Some("one"), "10.96.0.2");
    assert_eq!(engine.apply([Change::ApplyService(other)]).recomputed, 0);

    // A slice of a Service with a selector is not read.
    let mirrored = slice("a", "one-1", "one", "10.0.0.0");
    assert_eq!(
        engine
            .apply([Change::ApplyEndpointSlice(mirrored)])
            .recomputed,
        0
    );

    // A label no selector reads, on a backend: a0 itself only.
    let mut relabelled = pod("a", "p0", "one", "n0", "10.0.0.0");
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "x".into());
    let outcome = engine.apply([Change::ApplyPod(relabelled)]);
    assert_eq!(outcome.recomputed, 1);

    // A selectorless Service whose slice lists a peer's address: read by
    // every target with egress rules, i.e. the client.
    let ext = service("c", "ext", None, "10.96.0.3");
    assert_eq!(
        engine.apply([Change::ApplyService(ext.clone())]).recomputed,
        1
    );
    assert_eq!(client_rules(&engine), 2);
    let ext_slice = slice("c", "ext-1", "ext", "10.0.0.1");
    assert_eq!(
        engine
            .apply([Change::ApplyEndpointSlice(ext_slice.clone())])
            .recomputed,
        1
    );
    assert_eq!(client_rules(&engine), 3, "and the selectorless ClusterIP");
    state
        .services
        .push(service("b", "one", Some("one"), "10.96.0.2"));
    state.services.push(ext);
    state
        .endpoint_slices
        .push(slice("a", "one-1", "one", "10.0.0.0"));
    state.endpoint_slices.push(ext_slice);
    let i = state
        .pods
        .iter()
        .position(|p| {
            p.metadata.name.as_deref() == Some("p0") && p.metadata.namespace.as_deref() == Some("a")
        })
        .unwrap();
    state.pods[i]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "x".into());
    assert_eq!(engine.resolution(), resolve_cluster(&state));

    // A backend relabelled out of the client's peers and out of the
    // Services of "a": the client is recomputed; a/one keeps a0 alone,
    // still allowed; the slice address 10.0.0.1 is no peer's any more.
    let outcome = engine.apply([Change::ApplyPod(pod("a", "p1", "two", "n0", "10.0.0.1"))]);
    assert!(outcome.recomputed < 8, "{}", outcome.recomputed);
    assert_eq!(client_rules(&engine), 2);
    engine.apply([Change::DeleteService(("a".into(), "one".into()))]);
    assert_eq!(client_rules(&engine), 1);
}

fn staged(mut np: NetworkPolicy, value: Option<&str>) -> NetworkPolicy {
    np.metadata.annotations = value
        .map(|v| BTreeMap::from([(crate::resolve::AUDIT_ANNOTATION.to_string(), v.to_string())]));
    np
}

#[test]
fn only_the_audit_annotation_changing_moves_the_policy_between_staged_and_enforced() {
    let mut state = cluster();
    let (mut engine, _) = Engine::from_state(&state);
    let a_p0 =
        |engine: &Engine| engine.plans()["n0"].pods[&("a".to_string(), "p0".to_string())].decode();
    let enforced = a_p0(&engine);
    assert_eq!(enforced.policies, vec!["a/one"]);

    // Staging the policy: only its annotation changes, and the pods it
    // selects (a/p0, a/p1) are recomputed and reach their nodes.
    let np = staged(allow_from_same_app("a", "one", "one"), Some("true"));
    let outcome = engine.apply([Change::ApplyPolicy(np.clone())]);
    assert_eq!(outcome.recomputed, 2);
    let nodes: Vec<&String> = outcome.changed.keys().collect();
    assert_eq!(nodes, ["n0", "n1"]);
    let staged_p0 = a_p0(&engine);
    assert_eq!(staged_p0.ingress, None);
    assert_eq!(staged_p0.staged_policies, vec!["a/one"]);
    assert_eq!(staged_p0.audit_ingress, enforced.ingress);
    let i = state
        .policies
        .iter()
        .position(|p| {
            p.metadata.namespace.as_deref() == Some("a")
                && p.metadata.name.as_deref() == Some("one")
        })
        .unwrap();
    state.policies[i] = np;
    assert_eq!(engine.resolution(), resolve_cluster(&state));
    // sync sees the annotation as a change too, and nothing else.
    assert_eq!(engine.sync(&state).recomputed, 0);

    // Removing it enforces the same rules again.
    let np = staged(allow_from_same_app("a", "one", "one"), None);
    state.policies[i] = np;
    let outcome = engine.sync(&state);
    assert_eq!(outcome.recomputed, 2);
    assert_eq!(a_p0(&engine), enforced);
    assert_eq!(engine.resolution(), resolve_cluster(&state));

    // Other annotations are not kept and change nothing.
    let mut np = allow_from_same_app("a", "one", "one");
    np.metadata.annotations = Some(BTreeMap::from([("note".to_string(), "x".to_string())]));
    assert!(engine.apply([Change::ApplyPolicy(np)]).changed.is_empty());
}
