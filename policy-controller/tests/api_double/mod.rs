//! An in-process stand-in for the Kubernetes API server: just enough of list
//! and watch, over real HTTP, for kube-rs's watcher to run unchanged.
//!
//! What kube 5's `watcher::Config::default()` sends, and how this answers:
//!
//! - LIST `GET <collection>?limit=500` (no resourceVersion: the default
//!   `ListSemantic::MostRecent`; with `Any` it would add `resourceVersion=0`
//!   and `resourceVersionMatch=NotOlderThan`). Answered with every object in
//!   one page (no `continue`), `metadata.resourceVersion` = the current
//!   revision, and items without `apiVersion`/`kind`, as the API server
//!   serves typed lists.
//! - WATCH `GET <collection>?watch=true&timeoutSeconds=290&
//!   allowWatchBookmarks=true&resourceVersion=<list's>`. Answered with a
//!   chunked body of newline-delimited `{"type", "object"}` events: every
//!   change after that revision, then a BOOKMARK at the current revision,
//!   then changes as they happen, until `timeoutSeconds` or
//!   [`ApiDouble::drop_watches`].
//! - `sendInitialEvents=true` (kube's opt-in streaming lists) is answered
//!   too: ADDED for every object, then the BOOKMARK annotated
//!   `k8s.io/initial-events-end`. `resourceVersion` 0 or empty starts with
//!   ADDED for every object, as the API server's "any" watch does.
//! - Selectors are refused (400): nothing here evaluates them, and a silent
//!   unfiltered answer would hide a change in what the controller asks.
//!
//! - A kind served by a CRD can be made unserved ([`ApiDouble::set_served`]):
//!   its list and watch are answered 404, as the API server answers for a
//!   CRD that is not installed.
//!
//! Revisions are one counter across kinds, as etcd's are.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Pod,
    NetworkPolicy,
    Service,
    EndpointSlice,
    /// The AWS network policy controller's CRD (networking.k8s.aws/v1alpha1).
    PolicyEndpoint,
    /// Its cluster-scoped slices of ClusterNetworkPolicies.
    ClusterPolicyEndpoint,
    Node,
    /// policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy.
    UpstreamClusterNetworkPolicy,
    /// networking.k8s.aws/v1alpha1 ClusterNetworkPolicy.
    AwsClusterNetworkPolicy,
    /// networking.k8s.aws/v1alpha1 ApplicationNetworkPolicy.
    ApplicationNetworkPolicy,
    /// Served as single named objects (GET/PUT/POST), not listed or watched.
    Lease,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Namespace,
        Kind::Pod,
        Kind::NetworkPolicy,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::UpstreamClusterNetworkPolicy,
        Kind::AwsClusterNetworkPolicy,
        Kind::ApplicationNetworkPolicy,
    ];
    /// Served as well, outside `ALL` (the kinds the NetworkPolicy source
    /// watches, which tests check one by one).
    pub const CUSTOM: [Kind; 2] = [Kind::PolicyEndpoint, Kind::ClusterPolicyEndpoint];
    fn of(api_version: &str, kind: &str) -> Kind {
        match kind {
            "ClusterNetworkPolicy" if api_version.starts_with("networking.k8s.aws/") => {
                Kind::AwsClusterNetworkPolicy
            }
            "ClusterNetworkPolicy" => Kind::UpstreamClusterNetworkPolicy,
            "Node" => Kind::Node,
            "ApplicationNetworkPolicy" => Kind::ApplicationNetworkPolicy,
            "Namespace" => Kind::Namespace,
            "Pod" => Kind::Pod,
            "NetworkPolicy" => Kind::NetworkPolicy,
            "Service" => Kind::Service,
            "EndpointSlice" => Kind::EndpointSlice,
            "PolicyEndpoint" => Kind::PolicyEndpoint,
            "ClusterPolicyEndpoint" => Kind::ClusterPolicyEndpoint,
            "Lease" => Kind::Lease,
            other => panic!("the double does not serve {other}"),
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::PolicyEndpoint
            | Kind::ClusterPolicyEndpoint
            | Kind::AwsClusterNetworkPolicy
            | Kind::ApplicationNetworkPolicy => "networking.k8s.aws/v1alpha1",
            Kind::UpstreamClusterNetworkPolicy => "policy.networking.k8s.io/v1alpha2",
            Kind::Lease => "coordination.k8s.io/v1",
            _ => "v1",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::PolicyEndpoint => "PolicyEndpoint",
            Kind::ClusterPolicyEndpoint => "ClusterPolicyEndpoint",
            Kind::Lease => "Lease",
            Kind::Node => "Node",
            Kind::ApplicationNetworkPolicy => "ApplicationNetworkPolicy",
            Kind::UpstreamClusterNetworkPolicy | Kind::AwsClusterNetworkPolicy => {
                "ClusterNetworkPolicy"
            }
        }
    }
    /// Cluster-scoped: stored without a namespace.
    fn cluster_scoped(self) -> bool {
        matches!(
            self,
            Kind::Namespace
                | Kind::Node
                | Kind::UpstreamClusterNetworkPolicy
                | Kind::AwsClusterNetworkPolicy
                | Kind::ClusterPolicyEndpoint
        )
    }
    fn path(self) -> &'static str {
        match self {
            Kind::Namespace => "/api/v1/namespaces",
            Kind::Pod => "/api/v1/pods",
            Kind::NetworkPolicy => "/apis/networking.k8s.io/v1/networkpolicies",
            Kind::Service => "/api/v1/services",
            Kind::EndpointSlice => "/apis/discovery.k8s.io/v1/endpointslices",
            Kind::PolicyEndpoint => "/apis/networking.k8s.aws/v1alpha1/policyendpoints",
            Kind::ClusterPolicyEndpoint => {
                "/apis/networking.k8s.aws/v1alpha1/clusterpolicyendpoints"
            }
            Kind::Lease => "/apis/coordination.k8s.io/v1/leases",
            Kind::Node => "/api/v1/nodes",
            Kind::UpstreamClusterNetworkPolicy => {
                "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"
            }
            Kind::AwsClusterNetworkPolicy => {
                "/apis/networking.k8s.aws/v1alpha1/clusternetworkpolicies"
            }
            Kind::ApplicationNetworkPolicy => {
                "/apis/networking.k8s.aws/v1alpha1/applicationnetworkpolicies"
            }
        }
    }
}

/// One request as received, for asserting what the client asks.
#[derive(Clone, Debug)]
pub struct Request {
    pub kind: Kind,
    pub query: BTreeMap<String, String>,
}

impl Request {
    pub fn is_watch(&self) -> bool {
        self.query.get("watch").map(String::as_str) == Some("true")
    }
}

/// The revision of an empty store, as etcd's first is 1. Never 0: a list
/// at "0" would have the client watch from "0", which means "any
/// revision" and starts with a synthetic ADDED for every object, in name
/// order rather than the order they were written; a real list never
/// answers "0".
pub const FIRST_REVISION: u64 = 1;

#[derive(Default)]
struct Store {
    revision: u64,
    /// Current objects by kind and (namespace, name).
    objects: BTreeMap<Kind, BTreeMap<(String, String), Value>>,
    /// Every change ever made, in order: (revision, kind, event).
    log: Vec<(u64, Kind, Value)>,
    requests: Vec<Request>,
    /// Bumped to end every open watch, as an API server restart would.
    watch_epoch: u64,
    /// Watches from before this revision are refused with 410 Gone, as
    /// etcd's compaction makes the API server do: the client must relist.
    compacted: u64,
    /// Kinds answered 404, as for a CRD not installed.
    unserved: std::collections::BTreeSet<Kind>,
}

impl Store {
    fn apply(&mut self, mut object: Value) {
        let kind = Kind::of(
            object["apiVersion"].as_str().unwrap_or(""),
            object["kind"].as_str().expect("object without kind"),
        );
        self.revision += 1;
        let revision = self.revision;
        let meta = object["metadata"]
            .as_object_mut()
            .expect("object without metadata");
        let name = meta["name"]
            .as_str()
            .expect("object without name")
            .to_string();
        let namespace = if kind.cluster_scoped() {
            String::new()
        } else {
            meta.entry("namespace")
                .or_insert_with(|| json!("default"))
                .as_str()
                .unwrap()
                .to_string()
        };
        meta.insert("resourceVersion".into(), json!(revision.to_string()));
        meta.entry("uid")
            .or_insert_with(|| json!(format!("uid-{namespace}-{name}")));
        let existed = self
            .objects
            .entry(kind)
            .or_default()
            .insert((namespace, name), object.clone())
            .is_some();
        let kind_of_event = if existed { "MODIFIED" } else { "ADDED" };
        self.log.push((
            revision,
            kind,
            json!({"type": kind_of_event, "object": object}),
        ));
    }

    fn delete(&mut self, kind: Kind, namespace: Option<&str>, name: &str) {
        self.revision += 1;
        let revision = self.revision;
        let key = (namespace.unwrap_or("").to_string(), name.to_string());
        let mut object = self
            .objects
            .entry(kind)
            .or_default()
            .remove(&key)
            .unwrap_or_else(|| panic!("deleting {kind:?} {key:?}, which is not there"));
        object["metadata"]["resourceVersion"] = json!(revision.to_string());
        self.log
            .push((revision, kind, json!({"type": "DELETED", "object": object})));
    }
}

/// The store during an [`ApiDouble::outage`].
pub struct Offline<'a>(&'a mut Store);

impl Offline<'_> {
    pub fn apply(&mut self, object: Value) {
        self.0.apply(object);
    }

    pub fn delete(&mut self, kind: Kind, namespace: Option<&str>, name: &str) {
        self.0.delete(kind, namespace, name);
    }
}

struct Shared {
    store: Mutex<Store>,
    /// Carries (revision, watch epoch); open watches wait on it.
    changed: watch::Sender<(u64, u64)>,
}

#[derive(Clone)]
pub struct ApiDouble {
    pub url: String,
    shared: Arc<Shared>,
}

impl ApiDouble {
    /// Serves on 127.0.0.1 on a free port until the runtime ends.
    pub async fn start() -> ApiDouble {
        Self::start_on(std::net::TcpListener::bind("127.0.0.1:0").unwrap()).await
    }

    /// Serves on `listener` (bound where the caller needs it, e.g. in
    /// another network namespace) until the runtime ends.
    #[allow(dead_code)] // not every test binary serves elsewhere
    pub async fn start_on(listener: std::net::TcpListener) -> ApiDouble {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                revision: FIRST_REVISION,
                ..Store::default()
            }),
            changed: watch::channel((0, 0)).0,
        });
        let mut app = Router::new();
        for kind in Kind::ALL.into_iter().chain(Kind::CUSTOM) {
            app = app.route(
                kind.path(),
                get(
                    move |State(shared): State<Arc<Shared>>,
                          Query(query): Query<BTreeMap<String, String>>| async move {
                        serve(shared, kind, query)
                    },
                ),
            );
        }
        app = app
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                get(get_lease).put(put_lease),
            )
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                axum::routing::post(post_lease),
            );
        let app = app.with_state(shared.clone());
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        ApiDouble { url, shared }
    }

    /// Creates or replaces an object (ADDED or MODIFIED to watchers);
    /// returns the revision it made.
    pub fn apply(&self, object: Value) -> u64 {
        let mut store = self.shared.store.lock().unwrap();
        store.apply(object);
        self.notify(&store);
        store.revision
    }

    /// Deletes an object (DELETED to watchers, carrying the deletion's
    /// revision as the API server does); returns the revision it made.
    pub fn delete(&self, kind: Kind, namespace: Option<&str>, name: &str) -> u64 {
        let mut store = self.shared.store.lock().unwrap();
        store.delete(kind, namespace, name);
        self.notify(&store);
        store.revision
    }

    /// An outage the watches cannot catch up with: every open watch ends,
    /// `changes` are made while none is open, and the history is compacted
    /// past them, so a watch resuming from an older revision gets 410 Gone
    /// and the client has to list again (and find out from the list what
    /// was deleted meanwhile).
    pub fn outage(&self, changes: impl FnOnce(&mut Offline)) {
        let mut store = self.shared.store.lock().unwrap();
        store.watch_epoch += 1;
        changes(&mut Offline(&mut store));
        store.compacted = store.revision;
        self.notify(&store);
    }

    /// Ends every open watch stream, as an API server restart or a load
    /// balancer timeout would; clients must resume from their revision.
    pub fn drop_watches(&self) {
        let mut store = self.shared.store.lock().unwrap();
        store.watch_epoch += 1;
        self.notify(&store);
    }

    /// Serves a kind or stops serving it (404, as for a CRD not installed;
    /// the objects stay stored, to be served again). Ends every open watch,
    /// as the API server's would end with its resource.
    #[allow(dead_code)] // not every test binary installs CRDs
    pub fn set_served(&self, kind: Kind, served: bool) {
        let mut store = self.shared.store.lock().unwrap();
        if served {
            store.unserved.remove(&kind);
        } else {
            store.unserved.insert(kind);
        }
        store.watch_epoch += 1;
        self.notify(&store);
    }

    /// One object as stored, if there.
    #[allow(dead_code)] // not every test binary reads objects back
    pub fn object(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let store = self.shared.store.lock().unwrap();
        store
            .objects
            .get(&kind)
            .and_then(|o| o.get(&(namespace.to_string(), name.to_string())))
            .cloned()
    }

    pub fn requests(&self) -> Vec<Request> {
        self.shared.store.lock().unwrap().requests.clone()
    }

    fn notify(&self, store: &Store) {
        self.shared
            .changed
            .send_replace((store.revision, store.watch_epoch));
    }
}

fn serve(shared: Arc<Shared>, kind: Kind, query: BTreeMap<String, String>) -> Response {
    {
        let mut store = shared.store.lock().unwrap();
        store.requests.push(Request {
            kind,
            query: query.clone(),
        });
        if store.unserved.contains(&kind) {
            return status(
                StatusCode::NOT_FOUND,
                "the server could not find the requested resource",
            );
        }
    }
    for unsupported in ["labelSelector", "fieldSelector", "continue"] {
        if query.contains_key(unsupported) {
            return status(
                StatusCode::BAD_REQUEST,
                &format!("{unsupported} is not supported"),
            );
        }
    }
    if query.get("watch").map(String::as_str) == Some("true") {
        watch_response(shared, kind, &query)
    } else {
        list_response(&shared, kind)
    }
}

fn list_response(shared: &Shared, kind: Kind) -> Response {
    let store = shared.store.lock().unwrap();
    let items: Vec<Value> = store
        .objects
        .get(&kind)
        .into_iter()
        .flat_map(|objects| objects.values())
        .map(|object| {
            let mut item = object.clone();
            let map = item.as_object_mut().unwrap();
            map.remove("apiVersion");
            map.remove("kind");
            item
        })
        .collect();
    let body = json!({
        "kind": format!("{}List", kind.name()),
        "apiVersion": kind.api_version(),
        "metadata": {"resourceVersion": store.revision.to_string()},
        "items": items,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn watch_response(shared: Arc<Shared>, kind: Kind, query: &BTreeMap<String, String>) -> Response {
    let flag = |name: &str| query.get(name).map(String::as_str) == Some("true");
    let timeout = match query.get("timeoutSeconds").map(|t| t.parse::<u64>()) {
        None => Duration::from_secs(1800),
        Some(Ok(secs)) => Duration::from_secs(secs),
        Some(Err(_)) => return status(StatusCode::BAD_REQUEST, "bad timeoutSeconds"),
    };
    let send_initial = flag("sendInitialEvents");
    let bookmarks = flag("allowWatchBookmarks");
    let from = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");

    let mut first = Vec::new();
    let mut changes = shared.changed.subscribe();
    let (cursor, epoch) = {
        let store = shared.store.lock().unwrap();
        let cursor = if send_initial || from.is_empty() || from == "0" {
            for object in store
                .objects
                .get(&kind)
                .into_iter()
                .flat_map(|o| o.values())
            {
                first.push(json!({"type": "ADDED", "object": object}));
            }
            store.revision
        } else {
            match from.parse::<u64>() {
                Ok(rv) if rv < store.compacted => {
                    // As the API server answers it: a 200 whose one event
                    // is an ERROR carrying the 410 status.
                    let event = json!({"type": "ERROR", "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": format!("too old resource version: {rv} ({})", store.compacted),
                        "reason": "Expired",
                        "code": 410,
                    }});
                    return (
                        [(header::CONTENT_TYPE, "application/json")],
                        format!("{event}\n"),
                    )
                        .into_response();
                }
                Ok(rv) if rv <= store.revision => rv,
                _ => return status(StatusCode::BAD_REQUEST, "bad resourceVersion"),
            }
        };
        (cursor, store.watch_epoch)
    };

    struct Cursor {
        shared: Arc<Shared>,
        kind: Kind,
        revision: u64,
        epoch: u64,
        pending: VecDeque<Value>,
        changes: watch::Receiver<(u64, u64)>,
        deadline: tokio::time::Instant,
        bookmark_due: bool,
        initial_end: bool,
    }
    let cursor = Cursor {
        shared,
        kind,
        revision: cursor,
        epoch,
        pending: first.into(),
        changes: {
            changes.borrow_and_update();
            changes
        },
        deadline: tokio::time::Instant::now() + timeout,
        // The streaming-list protocol needs its end-of-initial bookmark even
        // from a client that did not ask for bookmarks.
        bookmark_due: bookmarks || send_initial,
        initial_end: send_initial,
    };
    let events = futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(event) = c.pending.pop_front() {
                let mut line = event.to_string();
                line.push('\n');
                return Some((Ok::<_, Infallible>(Bytes::from(line)), c));
            }
            let (mut newer, epoch) = {
                let store = c.shared.store.lock().unwrap();
                let newer: Vec<Value> = store
                    .log
                    .iter()
                    .filter(|(rv, kind, _)| *rv > c.revision && *kind == c.kind)
                    .map(|(_, _, event)| event.clone())
                    .collect();
                c.revision = c.revision.max(store.revision);
                (newer, store.watch_epoch)
            };
            if std::mem::take(&mut c.bookmark_due) {
                let mut annotations = serde_json::Map::new();
                if c.initial_end {
                    annotations.insert("k8s.io/initial-events-end".into(), json!("true"));
                }
                newer.push(json!({"type": "BOOKMARK", "object": {
                    "kind": c.kind.name(),
                    "apiVersion": c.kind.api_version(),
                    "metadata": {
                        "resourceVersion": c.revision.to_string(),
                        "annotations": annotations,
                    },
                }}));
            }
            if epoch != c.epoch {
                return None;
            }
            if !newer.is_empty() {
                c.pending.extend(newer);
                continue;
            }
            tokio::select! {
                result = c.changes.changed() => {
                    if result.is_err() {
                        return None;
                    }
                    c.changes.borrow_and_update();
                }
                _ = tokio::time::sleep_until(c.deadline) => return None,
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(events),
    )
        .into_response()
}

type Named = axum::extract::Path<(String, String)>;

fn lease_key(ns: &str, name: &str) -> (String, String) {
    (ns.to_string(), name.to_string())
}

fn object_response(code: StatusCode, object: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        object.to_string(),
    )
        .into_response()
}

async fn get_lease(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((ns, name)): Named,
) -> Response {
    let store = shared.store.lock().unwrap();
    match store
        .objects
        .get(&Kind::Lease)
        .and_then(|o| o.get(&lease_key(&ns, &name)))
    {
        Some(o) => object_response(StatusCode::OK, o),
        None => status(
            StatusCode::NOT_FOUND,
            &format!("leases \"{name}\" not found"),
        ),
    }
}

/// A replace succeeds only from the current resourceVersion, as the API
/// server's optimistic concurrency has it: anything else is 409.
async fn put_lease(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((ns, name)): Named,
    axum::Json(mut object): axum::Json<Value>,
) -> Response {
    let mut store = shared.store.lock().unwrap();
    let current = store
        .objects
        .get(&Kind::Lease)
        .and_then(|o| o.get(&lease_key(&ns, &name)))
        .cloned();
    let Some(current) = current else {
        return status(
            StatusCode::NOT_FOUND,
            &format!("leases \"{name}\" not found"),
        );
    };
    if object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Operation cannot be fulfilled on leases: the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    object["metadata"]["namespace"] = json!(ns);
    store.apply(object);
    let stored = store.objects[&Kind::Lease][&lease_key(&ns, &name)].clone();
    drop(store);
    object_response(StatusCode::OK, &stored)
}

async fn post_lease(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(ns): axum::extract::Path<String>,
    axum::Json(mut object): axum::Json<Value>,
) -> Response {
    let mut store = shared.store.lock().unwrap();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if store
        .objects
        .get(&Kind::Lease)
        .is_some_and(|o| o.contains_key(&lease_key(&ns, &name)))
    {
        return status(
            StatusCode::CONFLICT,
            &format!("leases \"{name}\" already exists"),
        );
    }
    object["metadata"]["namespace"] = json!(ns);
    store.apply(object);
    let stored = store.objects[&Kind::Lease][&lease_key(&ns, &name)].clone();
    drop(store);
    object_response(StatusCode::CREATED, &stored)
}

fn status(code: StatusCode, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": match code {
            StatusCode::NOT_FOUND => "NotFound",
            StatusCode::CONFLICT => "Conflict",
            _ => "BadRequest",
        },
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The manifest objects as the double serves them: YAML documents to JSON.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}
