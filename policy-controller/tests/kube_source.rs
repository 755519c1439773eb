//! The kube-rs source, run against an in-process API server double over
//! HTTP, brings the hub to the same plans as the manifest source's objects
//! give, one change at a time: the cluster path is the real watcher code,
//! the real feed and the real engine, not a stub.

mod api_double;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use api_double::{yaml_documents, ApiDouble, Kind};
use policy_controller::cluster::ClusterState;
use policy_controller::feed;
use policy_controller::hub::Hub;
use policy_controller::resolve::{resolve_cluster, NodePlan, Resolution};
use policy_controller::source::{kube as kube_source, manifest};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels: {team: a, env: prod}
---
apiVersion: v1
kind: Namespace
metadata:
  name: dev
  labels: {team: b}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: prod, labels: {app: web}}
spec:
  nodeName: node-a
  containers:
  - {name: web, image: nginx, ports: [{name: http, containerPort: 80, protocol: TCP}]}
status: {phase: Running, podIP: 10.1.0.11, podIPs: [{ip: 10.1.0.11}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, namespace: prod, labels: {app: web}}
spec:
  nodeName: node-b
  containers:
  - {name: web, image: nginx, ports: [{name: http, containerPort: 80, protocol: TCP}]}
status: {phase: Running, podIP: 10.1.0.12, podIPs: [{ip: 10.1.0.12}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: prod, labels: {app: db}}
spec:
  nodeName: node-a
  containers:
  - {name: pg, image: postgres, ports: [{name: pg, containerPort: 5432}]}
status: {phase: Running, podIP: 10.1.0.13, podIPs: [{ip: 10.1.0.13}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-1, namespace: dev, labels: {app: client}}
spec:
  nodeName: node-b
  containers: [{name: c, image: curl}]
status: {phase: Running, podIP: 10.1.0.21, podIPs: [{ip: 10.1.0.21}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-2, namespace: dev, labels: {app: client}}
spec:
  nodeName: node-a
  containers: [{name: c, image: curl}]
status: {phase: Running, podIP: 10.1.0.22, podIPs: [{ip: 10.1.0.22}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: prod}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-web, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: db}}
    - namespaceSelector: {matchLabels: {team: b}}
      podSelector: {matchLabels: {app: client}}
    ports:
    - {protocol: TCP, port: 80}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-out, namespace: dev}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/24]}
    ports:
    - {protocol: TCP, port: 443}
    - {protocol: UDP, port: 53}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: dev}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: https, port: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-1, namespace: dev, labels: {kubernetes.io/service-name: ext}}
addressType: IPv4
endpoints: [{addresses: [10.2.0.5]}]
ports: [{name: https, port: 443}]
"#;

const ALLOW_DB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-db, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: pg}]
"#;

const DEADLINE: Duration = Duration::from_secs(30);

fn key(object: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    (
        s(&object["kind"]),
        s(&object["metadata"]["namespace"]),
        s(&object["metadata"]["name"]),
    )
}

/// The manifest source's view of `objects`: written as YAML files (one per
/// kind, as a lab would) with a revision, then loaded from the directory.
fn manifest_state(dir: &Path, objects: &[Value], revision: &str) -> ClusterState {
    for entry in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for object in objects {
        let file = files
            .entry(format!(
                "{}.yaml",
                object["kind"].as_str().unwrap().to_lowercase()
            ))
            .or_default();
        file.push_str("---\n");
        file.push_str(&serde_yaml::to_string(object).unwrap());
    }
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    std::fs::write(dir.join(manifest::REVISION_FILE), format!("{revision}\n")).unwrap();
    let state = manifest::load_dir(dir).unwrap();
    assert_eq!(state.marker, revision);
    state
}

fn counts(state: &ClusterState) -> (usize, usize, usize, usize, usize) {
    (
        state.namespaces.len(),
        state.pods.len(),
        state.policies.len(),
        state.services.len(),
        state.endpoint_slices.len(),
    )
}

/// Whether `client-1`'s egress names the `ext` Service's ClusterIP on 8443.
fn client_reaches_ext_service(plans: &BTreeMap<String, NodePlan>) -> bool {
    let vip = policy_controller::cidr::prefix("10.96.0.20/32".parse().unwrap());
    let pod = &plans["node-b"].pods[&("dev".to_string(), "client-1".to_string())];
    pod.egress.as_ref().is_some_and(|e| {
        e.rules.iter().any(|r| {
            r.peers.iter().any(|p| p.cidr.as_ref() == Some(&vip))
                && r.ports.iter().any(|p| p.port == 8443)
        })
    })
}

/// The controller's kube path as main.rs wires it: the kube source sending
/// changes, the feed taking them into the hub.
fn start_controller(url: &str) -> (Hub, tokio::task::JoinHandle<()>) {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let hub = Hub::new(1);
    let (tx, rx) = mpsc::unbounded_channel();
    let (etx, erx) = watch::channel(Vec::new());
    let source = tokio::spawn(kube_source::run(client, tx, etx));
    tokio::spawn(feed::run_changes(hub.clone(), rx, erx));
    (hub, source)
}

/// Waits until the hub's engine holds exactly what a full computation of
/// `want` gives, and returns that.
async fn wait_for_plans(hub: &Hub, want: &ClusterState, what: &str) -> Resolution {
    let want = resolve_cluster(want);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let synced = hub.view().source_synced;
        let held = hub.with_engine(|e| e.map(|e| e.resolution()));
        if synced && held.as_ref() == Some(&want) {
            return want;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{what}: the hub does not hold the plans within {DEADLINE:?}; \
                 synced={synced} counters={:?}\nheld: {held:?}\nwant: {want:?}",
                hub.counters()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await; // poll: the hub has no change signal for the whole engine
    }
}

/// How many changes have reached the engine one by one (staged during the
/// first list, or applied after it).
fn changes_taken(hub: &Hub) -> u64 {
    let c = hub.counters();
    c.staged + c.changes
}

fn pod_policies(
    plans: &BTreeMap<String, NodePlan>,
    node: &str,
    ns: &str,
    pod: &str,
) -> Vec<String> {
    plans[node].pods[&(ns.to_string(), pod.to_string())]
        .policies
        .clone()
}

fn lists_of(double: &ApiDouble, kind: Kind) -> usize {
    double
        .requests()
        .iter()
        .filter(|r| r.kind == kind && !r.is_watch())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_source_delivers_changes_that_yield_the_manifest_sources_plans() {
    let dir = tempfile::tempdir().unwrap();
    let mut objects = yaml_documents(OBJECTS);

    let double = ApiDouble::start().await;
    for object in &objects {
        double.apply(object.clone());
    }
    let (hub, source) = start_controller(&double.url);

    // (a) The initial lists: every object once, as a change; no view.
    let from_manifest = manifest_state(dir.path(), &objects, "r1");
    assert_eq!(counts(&from_manifest), (2, 5, 3, 1, 1));
    let plans = wait_for_plans(&hub, &from_manifest, "the initial lists")
        .await
        .plans;
    assert_eq!(
        hub.view().source_marker,
        "k8s namespaces=3 pods=8 networkpolicies=11 services=12 endpointslices=13 \
         nodes= clusternetworkpolicies= clusternetworkpolicies.networking.k8s.aws= \
         applicationnetworkpolicies.networking.k8s.aws="
    );
    assert_eq!(hub.counters().views, 0);
    assert_eq!(changes_taken(&hub), 12, "{:?}", hub.counters());
    // The selectorless Service's slice address lies in client-1's ipBlock:
    // its ClusterIP is allowed on the service port.
    assert!(client_reaches_ext_service(&plans));
    // Non-trivial: both nodes have isolated pods, with the policies that
    // select them.
    assert_eq!(
        pod_policies(&plans, "node-a", "prod", "web-1"),
        ["prod/allow-web", "prod/default-deny"]
    );
    assert!(plans["node-a"].pods[&("prod".into(), "web-1".into())]
        .ingress
        .is_some());
    assert_eq!(
        pod_policies(&plans, "node-b", "dev", "client-1"),
        ["dev/egress-out"]
    );
    assert!(plans["node-b"].pods[&("dev".into(), "client-1".into())]
        .egress
        .is_some());

    // (b) Changes through the watch: a policy ADDED, a pod's labels MODIFIED,
    // a pod DELETED, a slice MODIFIED. Each reaches the engine as one
    // change, never as a view of the cluster.
    let allow_db = yaml_documents(ALLOW_DB).remove(0);
    double.apply(allow_db.clone());
    objects.push(allow_db);
    let client_2 = objects
        .iter_mut()
        .find(|o| key(o) == ("Pod".into(), "dev".into(), "client-2".into()))
        .unwrap();
    client_2["metadata"]["labels"] = json!({"app": "batch"});
    double.apply(client_2.clone());
    double.delete(Kind::Pod, Some("prod"), "web-2");
    objects.retain(|o| key(o) != ("Pod".into(), "prod".into(), "web-2".into()));
    // The slice now lists an address outside the ipBlock's: no ClusterIP.
    let slice = objects
        .iter_mut()
        .find(|o| key(o) == ("EndpointSlice".into(), "dev".into(), "ext-1".into()))
        .unwrap();
    slice["endpoints"] = json!([{"addresses": ["192.0.2.1"]}]);
    double.apply(slice.clone());

    let from_manifest = manifest_state(dir.path(), &objects, "r2");
    let plans = wait_for_plans(&hub, &from_manifest, "the mutations")
        .await
        .plans;
    assert!(!client_reaches_ext_service(&plans));
    assert_eq!(
        pod_policies(&plans, "node-a", "prod", "db-1"),
        ["prod/allow-db", "prod/default-deny"]
    );
    // Relabelled out of its policy: still listed, no longer isolated.
    let client_2 = &plans["node-a"].pods[&("dev".into(), "client-2".into())];
    assert!(client_2.policies.is_empty() && client_2.egress.is_none());
    assert!(!plans
        .get("node-b")
        .is_some_and(|p| p.pods.contains_key(&("prod".into(), "web-2".into()))));
    let counters = hub.counters();
    assert_eq!(counters.views, 0, "{counters:?}");
    assert_eq!(changes_taken(&hub), 12 + 4, "{counters:?}");
    assert!(counters.batches >= 1, "{counters:?}");

    // (c) Watches cut (an API server restart) and a change made meanwhile:
    // the watcher resumes from its resourceVersion and catches up.
    double.drop_watches();
    double.delete(Kind::NetworkPolicy, Some("prod"), "default-deny");
    objects.retain(|o| key(o) != ("NetworkPolicy".into(), "prod".into(), "default-deny".into()));
    let from_manifest = manifest_state(dir.path(), &objects, "r3");
    wait_for_plans(
        &hub,
        &from_manifest,
        "the policy deleted while disconnected",
    )
    .await;
    assert_eq!(changes_taken(&hub), 12 + 4 + 1);

    // What kube's watcher actually asked: one full list per kind, then
    // watches from the list's revision, with bookmarks.
    let requests = double.requests();
    for kind in Kind::ALL {
        let of_kind: Vec<_> = requests.iter().filter(|r| r.kind == kind).collect();
        let lists: Vec<_> = of_kind.iter().filter(|r| !r.is_watch()).collect();
        assert_eq!(lists.len(), 1, "{kind:?}: {of_kind:?}");
        assert_eq!(lists[0].query.get("limit").map(String::as_str), Some("500"));
        assert!(
            !lists[0].query.contains_key("resourceVersion"),
            "{:?}",
            lists[0]
        );
        let watches: Vec<_> = of_kind.iter().filter(|r| r.is_watch()).collect();
        assert!(watches.len() >= 2, "{kind:?} did not re-watch: {of_kind:?}");
        for w in watches {
            assert_eq!(
                w.query.get("allowWatchBookmarks").map(String::as_str),
                Some("true")
            );
            assert_eq!(
                w.query.get("timeoutSeconds").map(String::as_str),
                Some("290")
            );
            assert!(
                w.query.get("resourceVersion").is_some_and(|rv| rv != "0"),
                "{w:?}"
            );
            assert!(!w.query.contains_key("sendInitialEvents"), "{w:?}");
        }
    }

    // (d) An outage past the history the API server keeps: the resumed
    // watches get 410 Gone and every kind relists. Objects deleted
    // meanwhile must go (a pod, and a Service whose ClusterIP client-1's
    // egress allowed before), a changed one must change, and the objects
    // that did not move must not be applied again.
    let client_1 = objects
        .iter_mut()
        .find(|o| key(o) == ("Pod".into(), "dev".into(), "client-1".into()))
        .unwrap();
    client_1["metadata"]["labels"] = json!({"app": "client", "tier": "gold"});
    let client_1 = client_1.clone();
    double.outage(|offline| {
        offline.delete(Kind::Pod, Some("prod"), "db-1");
        offline.delete(Kind::Service, Some("dev"), "ext");
        offline.apply(client_1);
    });
    objects.retain(|o| {
        key(o) != ("Pod".into(), "prod".into(), "db-1".into())
            && key(o) != ("Service".into(), "dev".into(), "ext".into())
    });
    let from_manifest = manifest_state(dir.path(), &objects, "r4");
    assert_eq!(counts(&from_manifest), (2, 3, 3, 0, 1));
    let plans = wait_for_plans(&hub, &from_manifest, "the relist after an outage")
        .await
        .plans;
    assert!(!plans["node-a"]
        .pods
        .contains_key(&("prod".into(), "db-1".into())));
    // Kinds where nothing moved relist on their own backoff schedule, and
    // a deletion that changes no plan (the Service) may land after the
    // plans match.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while Kind::ALL.iter().any(|k| lists_of(&double, *k) < 2)
        || changes_taken(&hub) < 12 + 4 + 1 + 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every kind relisted, or not every change taken ({:?}): {:?}",
            hub.counters(),
            double.requests()
        );
        tokio::time::sleep(Duration::from_millis(10)).await; // poll: the double records requests as they come
    }
    wait_for_plans(&hub, &from_manifest, "after every relist").await;
    let counters = hub.counters();
    assert_eq!(counters.views, 0, "{counters:?}");
    assert_eq!(
        changes_taken(&hub),
        12 + 4 + 1 + 3,
        "only what moved during the outage: {counters:?}"
    );

    source.abort();
}

/// An API server that cannot be reached: no state is ever published (so the
/// controller stays unsynced) and the watch failures are reported.
#[tokio::test]
async fn unreachable_api_server_publishes_nothing_and_says_why() {
    // A port that was just free: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (hub, source) = start_controller(&format!("http://127.0.0.1:{port}"));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let errors = loop {
        let errors = hub.view().errors;
        if !errors.is_empty() {
            break errors;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no watch error reported"
        );
        tokio::time::sleep(Duration::from_millis(10)).await; // poll: errors reach the hub through the feed
    };
    assert!(
        errors.iter().all(|e| e.starts_with("watching ")),
        "{errors:?}"
    );
    assert_eq!(hub.counters(), Default::default(), "changes without a list");
    // Still unsynced, and a subscriber is told why.
    let refused = hub.subscribe("n1").err().expect("refused before sync");
    assert!(refused.0.contains("watching "), "{refused}");
    assert!(!hub.view().source_synced);
    source.abort();
}

/// The streaming-list path of the double answers kube's opt-in protocol too,
/// so a future switch to `streaming_lists()` is testable against it.
#[tokio::test]
async fn double_serves_streaming_lists() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::runtime::watcher;

    let double = ApiDouble::start().await;
    double.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}));
    let client = kube::Client::try_from(kube::Config::new(double.url.parse().unwrap())).unwrap();
    let api: kube::Api<Namespace> = kube::Api::all(client);
    let mut events = watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut seen = Vec::new();
    let outcome = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = events.next().await {
            match event.unwrap() {
                watcher::Event::InitApply(ns) => seen.push(ns.metadata.name.unwrap()),
                watcher::Event::InitDone => return,
                _ => {}
            }
        }
    })
    .await;
    assert!(outcome.is_ok(), "no InitDone");
    assert_eq!(seen, ["a"]);
    let watch = double
        .requests()
        .into_iter()
        .find(|r| r.is_watch())
        .unwrap();
    assert_eq!(
        watch.query.get("sendInitialEvents").map(String::as_str),
        Some("true")
    );
}

/// An Admin Deny of everything from team b's namespaces into prod, an
/// egress Deny to node-a's addresses, and (AWS's group) a Baseline Accept
/// of DNS for team b; two Nodes for the `nodes` peer.
const CLUSTER_POLICIES: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-prod}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress:
  - {name: no-team-b, action: Deny, from: [{namespaces: {matchLabels: {team: b}}}]}
  egress:
  - {name: no-node-a, action: Deny, to: [{nodes: {matchLabels: {zone: a}}}]}
---
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: baseline-dns}
spec:
  tier: Baseline
  priority: 5
  subject: {pods: {namespaceSelector: {matchLabels: {team: b}}, podSelector: {}}}
  egress:
  - {action: Accept, to: [{networks: [10.96.0.0/16]}], ports: [{portNumber: {protocol: UDP, port: 53}}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {zone: a}}
status: {addresses: [{type: InternalIP, address: 192.168.0.10}, {type: Hostname, address: node-a}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {zone: b}}
status: {addresses: [{type: InternalIP, address: 192.168.0.11}]}
"#;

const GUARD: &str = "ClusterNetworkPolicy/guard-prod";
const DNS: &str = "ClusterNetworkPolicy.networking.k8s.aws/baseline-dns";

/// The tier rules of a pod's ingress or egress: (policy, action), in order.
fn tier_rules(
    plans: &BTreeMap<String, NodePlan>,
    node: &str,
    pod: (&str, &str),
    egress: bool,
    admin: bool,
) -> Vec<(String, palisade_proto::v1::TierAction)> {
    let Some(plan) = plans.get(node) else {
        return vec![];
    };
    let Some(p) = plan.pods.get(&(pod.0.to_string(), pod.1.to_string())) else {
        return vec![];
    };
    let direction = if egress { &p.egress } else { &p.ingress };
    direction
        .iter()
        .flat_map(|d| if admin { &d.admin } else { &d.baseline })
        .map(|r| (r.policy.clone(), r.action()))
        .collect()
}

fn find<'a>(objects: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    objects
        .iter_mut()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap()
}

async fn wait_for_errors(hub: &Hub, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let errors = hub.view().errors;
        if done(&errors) {
            return errors;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: errors did not come to the expected state within {DEADLINE:?}: {errors:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await; // poll: errors reach the hub through the feed
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_network_policies_of_both_groups_and_nodes_reach_the_plans() {
    use palisade_proto::v1::TierAction;
    let dir = tempfile::tempdir().unwrap();
    let mut objects = yaml_documents(OBJECTS);
    objects.extend(yaml_documents(CLUSTER_POLICIES));
    let double = ApiDouble::start().await;
    for object in &objects {
        double.apply(object.clone());
    }
    let (hub, source) = start_controller(&double.url);

    let want = manifest_state(dir.path(), &objects, "c1");
    assert_eq!((want.cluster_policies.len(), want.nodes.len()), (2, 2));
    let plans = wait_for_plans(&hub, &want, "the initial lists").await.plans;
    // The Admin Deny is in the ingress of every prod pod, first.
    for (node, pod) in [("node-a", "web-1"), ("node-b", "web-2"), ("node-a", "db-1")] {
        assert_eq!(
            tier_rules(&plans, node, ("prod", pod), false, true),
            [(GUARD.to_string(), TierAction::Deny)],
            "{pod}"
        );
    }
    assert_eq!(
        tier_rules(&plans, "node-a", ("prod", "web-1"), true, true),
        [(GUARD.to_string(), TierAction::Deny)]
    );
    assert_eq!(
        tier_rules(&plans, "node-b", ("dev", "client-1"), true, false),
        [(DNS.to_string(), TierAction::Accept)]
    );
    assert!(tier_rules(&plans, "node-b", ("dev", "client-1"), false, true).is_empty());
    let marker = hub.view().source_marker;
    assert!(
        marker.contains(" nodes=1") && !marker.contains("clusternetworkpolicies= "),
        "{marker}"
    );

    // Edits: the Deny becomes a Pass; node-a moves; the AWS policy goes.
    find(&mut objects, "ClusterNetworkPolicy", "guard-prod")["spec"]["ingress"][0]["action"] =
        json!("Pass");
    double.apply(find(&mut objects, "ClusterNetworkPolicy", "guard-prod").clone());
    find(&mut objects, "Node", "node-a")["status"]["addresses"] =
        json!([{"type": "InternalIP", "address": "192.168.0.20"}]);
    double.apply(find(&mut objects, "Node", "node-a").clone());
    double.delete(Kind::AwsClusterNetworkPolicy, None, "baseline-dns");
    objects.retain(|o| o["metadata"]["name"] != "baseline-dns");
    let want = manifest_state(dir.path(), &objects, "c2");
    let plans = wait_for_plans(&hub, &want, "the edits").await.plans;
    assert_eq!(
        tier_rules(&plans, "node-a", ("prod", "web-1"), false, true),
        [(GUARD.to_string(), TierAction::Pass)]
    );
    assert!(tier_rules(&plans, "node-b", ("dev", "client-1"), true, false).is_empty());

    // Deletes: the policy, and a Node.
    double.delete(Kind::UpstreamClusterNetworkPolicy, None, "guard-prod");
    double.delete(Kind::Node, None, "node-b");
    objects.retain(|o| o["metadata"]["name"] != "guard-prod" && o["metadata"]["name"] != "node-b");
    let want = manifest_state(dir.path(), &objects, "c3");
    assert_eq!((want.cluster_policies.len(), want.nodes.len()), (0, 1));
    let plans = wait_for_plans(&hub, &want, "the deletes").await.plans;
    assert!(tier_rules(&plans, "node-a", ("prod", "web-1"), false, true).is_empty());
    assert!(hub.view().errors.is_empty(), "{:?}", hub.view().errors);
    source.abort();
}

const APPLICATION_POLICY: &str = r#"
apiVersion: networking.k8s.aws/v1alpha1
kind: ApplicationNetworkPolicy
metadata: {name: allow-web, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress:
  - to: [{domainNames: [api.example.com, "*.example.org"]}]
    ports: [{protocol: TCP, port: 443}]
  - to: [{ipBlock: {cidr: 192.0.2.0/24}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_network_policy_is_a_network_policy_with_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut objects = yaml_documents(OBJECTS);
    objects.extend(yaml_documents(APPLICATION_POLICY));
    let double = ApiDouble::start().await;
    for object in &objects {
        double.apply(object.clone());
    }
    let (hub, source) = start_controller(&double.url);

    let want = manifest_state(dir.path(), &objects, "a1");
    let plans = wait_for_plans(&hub, &want, "the initial lists").await.plans;
    // Beside the NetworkPolicy of the same name, not in its place.
    assert_eq!(
        pod_policies(&plans, "node-a", "prod", "web-1"),
        [
            "prod/ApplicationNetworkPolicy:allow-web",
            "prod/allow-web",
            "prod/default-deny"
        ]
    );
    let egress = plans["node-a"].pods[&("prod".to_string(), "web-1".to_string())]
        .egress
        .clone()
        .expect("the policy isolates egress");
    let by_name: Vec<_> = egress
        .rules
        .iter()
        .filter(|r| !r.domain_names.is_empty())
        .map(|r| {
            (
                r.domain_names.clone(),
                r.ports.len(),
                r.peers.len(),
                r.policy.clone(),
            )
        })
        .collect();
    assert_eq!(
        by_name,
        [(
            vec!["*.example.org".to_string(), "api.example.com".to_string()],
            1,
            0,
            "prod/ApplicationNetworkPolicy:allow-web".to_string()
        )]
    );
    assert_eq!(egress.rules.len(), 2, "the names and the block: {egress:?}");
    assert!(
        hub.view()
            .source_marker
            .contains("applicationnetworkpolicies.networking.k8s.aws=14"),
        "{}",
        hub.view().source_marker
    );

    // Deleted: the NetworkPolicy of that name stays.
    double.delete(Kind::ApplicationNetworkPolicy, Some("prod"), "allow-web");
    objects.retain(|o| o["kind"] != "ApplicationNetworkPolicy");
    let want = manifest_state(dir.path(), &objects, "a2");
    let plans = wait_for_plans(&hub, &want, "the delete").await.plans;
    assert_eq!(
        pod_policies(&plans, "node-a", "prod", "web-1"),
        ["prod/allow-web", "prod/default-deny"]
    );
    assert!(hub.view().errors.is_empty(), "{:?}", hub.view().errors);
    source.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_crd_is_missing_is_none_until_it_is_installed() {
    let dir = tempfile::tempdir().unwrap();
    let mut objects = yaml_documents(OBJECTS);
    let mut aws = Vec::new();
    for o in yaml_documents(CLUSTER_POLICIES) {
        if o["apiVersion"] == "networking.k8s.aws/v1alpha1" {
            aws.push(o);
        } else {
            objects.push(o);
        }
    }
    let double = ApiDouble::start().await;
    double.set_served(Kind::AwsClusterNetworkPolicy, false);
    for object in &objects {
        double.apply(object.clone());
    }
    let (hub, source) = start_controller(&double.url);

    // Synced without the AWS group, and that is no error.
    let want = manifest_state(dir.path(), &objects, "m1");
    let plans = wait_for_plans(&hub, &want, "synced without the AWS CRD")
        .await
        .plans;
    assert!(!tier_rules(&plans, "node-a", ("prod", "web-1"), false, true).is_empty());
    assert!(hub.view().errors.is_empty(), "{:?}", hub.view().errors);

    // The CRD appears, with a policy: picked up on the backoff's next try.
    double.set_served(Kind::AwsClusterNetworkPolicy, true);
    double.apply(aws[0].clone());
    objects.push(aws[0].clone());
    let want = manifest_state(dir.path(), &objects, "m2");
    let plans = wait_for_plans(&hub, &want, "the AWS CRD installed")
        .await
        .plans;
    assert_eq!(
        tier_rules(&plans, "node-b", ("dev", "client-1"), true, false).len(),
        1
    );

    // Removed again: its policies are gone with it.
    double.set_served(Kind::AwsClusterNetworkPolicy, false);
    objects.pop();
    let want = manifest_state(dir.path(), &objects, "m3");
    let plans = wait_for_plans(&hub, &want, "the AWS CRD removed")
        .await
        .plans;
    assert!(tier_rules(&plans, "node-b", ("dev", "client-1"), true, false).is_empty());
    assert!(hub.view().errors.is_empty(), "{:?}", hub.view().errors);
    // A missing CRD never holds back the kinds that are served.
    assert!(lists_of(&double, Kind::AwsClusterNetworkPolicy) >= 2);
    source.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_cluster_network_policy_keeps_its_last_version_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut objects = yaml_documents(OBJECTS);
    objects.extend(yaml_documents(CLUSTER_POLICIES));
    let double = ApiDouble::start().await;
    for object in &objects {
        double.apply(object.clone());
    }
    let (hub, source) = start_controller(&double.url);
    let good = manifest_state(dir.path(), &objects, "u1");
    wait_for_plans(&hub, &good, "the initial lists").await;

    // A version of guard-prod the API server should not have admitted (a
    // CRD without validation would): the previous version stays.
    let mut bad = find(&mut objects, "ClusterNetworkPolicy", "guard-prod").clone();
    bad["spec"]["tier"] = json!(7);
    double.apply(bad);
    // One that never could be read, and one with a field newer than ours
    // (read: a newer field is no error).
    double.apply(json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy", "metadata": {"name": "broken"}}));
    let mut newer = find(&mut objects, "ClusterNetworkPolicy", "baseline-dns").clone();
    newer["spec"]["futureField"] = json!({"x": 1});
    double.apply(newer);
    let errors = wait_for_errors(&hub, "the unreadable objects", |e| e.len() == 2).await;
    assert!(
        errors[0].starts_with("ClusterNetworkPolicy/broken: spec: Required value")
            && !errors[0].contains("stays in force"),
        "{errors:?}"
    );
    assert!(
        errors[1]
            .starts_with("ClusterNetworkPolicy/guard-prod: spec.tier: invalid type: integer `7`")
            && errors[1].ends_with("; its previous version stays in force"),
        "{errors:?}"
    );
    wait_for_plans(&hub, &good, "the last good version in force").await;

    // Fixed, and the broken one deleted: no error, the new version in force.
    find(&mut objects, "ClusterNetworkPolicy", "guard-prod")["spec"]["priority"] = json!(20);
    double.apply(find(&mut objects, "ClusterNetworkPolicy", "guard-prod").clone());
    double.delete(Kind::UpstreamClusterNetworkPolicy, None, "broken");
    wait_for_errors(&hub, "the objects fixed", <[String]>::is_empty).await;
    let want = manifest_state(dir.path(), &objects, "u2");
    wait_for_plans(&hub, &want, "the fixed version").await;
    source.abort();
}

async fn next_update(rx: &mut mpsc::UnboundedReceiver<feed::Update>) -> feed::Update {
    tokio::time::timeout(DEADLINE, rx.recv())
        .await
        .expect("an update within the deadline")
        .expect("the source runs")
}

/// A list comes in name order, not in the order its objects were written,
/// so the newest resourceVersion can come first (here `p-11`, listed
/// before `p-2`). A relist while synced (after an outage past the kept
/// history: HTTP 410) is passed on whole: one update holds every slice,
/// and no update before it claims the list's revision with slices still
/// missing (which, for a policy's Deny entries, a view would enforce as
/// allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_while_synced_arrives_whole() {
    use policy_controller::engine::Change;
    use policy_controller::source::policy_endpoint::PolicySource;

    const SLICES: usize = 12;
    let double = ApiDouble::start().await;
    let client = kube::Client::try_from(kube::Config::new(double.url.parse().unwrap())).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (etx, _erx) = watch::channel(Vec::new());
    tokio::spawn(kube_source::run_with(
        client,
        tx,
        etx,
        PolicySource::PolicyEndpoint,
    ));
    while !next_update(&mut rx).await.synced {}

    double.outage(|offline| {
        for i in 0..SLICES {
            offline.apply(json!({
                "apiVersion": "networking.k8s.aws/v1alpha1",
                "kind": "ClusterPolicyEndpoint",
                "metadata": {"name": format!("p-{i}")},
                "spec": {"policyRef": {"name": "p"}, "tier": "Admin", "priority": 1,
                         "subject": {"namespaces": {}},
                         "ingress": [{"action": "Deny", "cidr": format!("10.0.0.{i}")}]},
            }));
        }
    });
    let newest = format!(
        "clusterpolicyendpoints={}",
        api_double::FIRST_REVISION + SLICES as u64
    );
    loop {
        let update = next_update(&mut rx).await;
        let slices = update
            .changes
            .iter()
            .filter(|c| matches!(c, Change::ApplyClusterPolicyEndpoint(_)))
            .count();
        if slices == 0 {
            assert!(
                !update.marker.contains(&newest),
                "an update claims the relist's revision before its slices: {}",
                update.marker
            );
            continue;
        }
        assert_eq!(slices, SLICES, "the relist arrives whole");
        assert!(update.synced);
        assert!(update.marker.ends_with(&newest), "{}", update.marker);
        break;
    }
    assert!(
        lists_of(&double, Kind::ClusterPolicyEndpoint) >= 2,
        "the outage made the source list again"
    );
}
