//! The real cluster: Namespaces, Pods, NetworkPolicies, Services,
//! EndpointSlices, Nodes, the ClusterNetworkPolicies of both API groups and
//! AWS's ApplicationNetworkPolicies (read as NetworkPolicies)
//! from the API server through kube-rs watchers (list, then watch, all
//! namespaces), delivered as changes to single objects.
//!
//! Every watch event becomes one [`Change`]: an object applied or deleted,
//! so a change in the cluster costs the engine what that change touches,
//! not a comparison of the whole cluster. A list is passed on whole, at its
//! end: its objects come in name order, not in the order they were
//! written, so delivering them one by one would show a view (and a marker)
//! that no moment of the cluster had. A relist (the first list, or
//! after the watch fell too far behind, HTTP 410) replays every object: the
//! [`Tracker`] of each kind drops the objects whose resourceVersion did not
//! move and turns the objects missing from the relist into deletions, so an
//! object deleted while the watch was down is deleted here too.
//!
//! Updates carry `synced: false` until every kind has finished its first
//! list: resolving with the policies listed but the pods not yet would hand
//! nodes a plan that drops every peer (and without the Services, every
//! ClusterIP an egress rule allows), so until then the feed only stages
//! the changes and the hub stays unsynced.
//!
//! A ClusterNetworkPolicy is read leniently (see
//! [`super::cluster_network_policy`]); one that cannot be read at all is an
//! error naming it, published with the watch errors until it is fixed or
//! deleted, and the version read before stays in force. A group whose CRD
//! is not installed (the API server answers 404) counts as listed and
//! empty, so that it does not keep the controller from syncing; the
//! watcher's backoff keeps asking, and the group is picked up when its CRD
//! appears (and emptied if it goes).
//!
//! The marker is `k8s namespaces=<rv> pods=<rv> networkpolicies=<rv>
//! services=<rv> endpointslices=<rv> nodes=<rv> clusternetworkpolicies=<rv>
//! clusternetworkpolicies.networking.k8s.aws=<rv>
//! applicationnetworkpolicies.networking.k8s.aws=<rv>`: for
//! each kind, the highest resourceVersion its watch has delivered (compared
//! as numbers, as etcd issues them; a non-numeric one simply replaces the
//! previous). Kinds are kept apart because each has its own watch stream: the
//! view is at least that new for each kind, which one cluster-wide number
//! could not promise.
//!
//! With [`PolicySource::PolicyEndpoint`] the policy comes from the AWS
//! network policy controller's PolicyEndpoints instead: NetworkPolicies,
//! Services and EndpointSlices are not watched (that controller has already
//! resolved them into addresses), nor are ClusterNetworkPolicies and Nodes:
//! the ClusterPolicyEndpoints it resolves them into are (a missing CRD
//! counting as none, as for ClusterNetworkPolicies). The marker is `k8s
//! namespaces=<rv> pods=<rv> policyendpoints=<rv>
//! clusterpolicyendpoints=<rv>`.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Debug;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::application_network_policy as anp;
use super::cluster_network_policy::{self as cnp, AwsObject, UpstreamObject};
use super::cluster_policy_endpoint::ClusterPolicyEndpoint;
use super::policy_endpoint::{PolicyEndpoint, PolicySource};
use super::tracker::Tracker;
use super::{SourceError, SourceProblem};
use crate::engine::Change;
use crate::feed::Update;
use crate::keys::ObjectKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Namespaces,
    Pods,
    NetworkPolicies,
    Services,
    EndpointSlices,
    PolicyEndpoints,
    ClusterPolicyEndpoints,
    Nodes,
    UpstreamClusterNetworkPolicies,
    AwsClusterNetworkPolicies,
    ApplicationNetworkPolicies,
}

impl Kind {
    /// As watch errors name it.
    fn name(self) -> &'static str {
        match self {
            Kind::Namespaces => "Namespaces",
            Kind::Pods => "Pods",
            Kind::NetworkPolicies => "NetworkPolicies",
            Kind::Services => "Services",
            Kind::EndpointSlices => "EndpointSlices",
            Kind::PolicyEndpoints => "PolicyEndpoints",
            Kind::ClusterPolicyEndpoints => "ClusterPolicyEndpoints",
            Kind::Nodes => "Nodes",
            Kind::UpstreamClusterNetworkPolicies => {
                "ClusterNetworkPolicies.policy.networking.k8s.io"
            }
            Kind::AwsClusterNetworkPolicies => "ClusterNetworkPolicies.networking.k8s.aws",
            Kind::ApplicationNetworkPolicies => "ApplicationNetworkPolicies.networking.k8s.aws",
        }
    }
}

/// How a watched object becomes a change: `Err` when it cannot be read.
type Read<K> = fn(K) -> Result<Change, cnp::Unreadable>;

/// Whether a kind is served only once its CRD is installed: then a 404
/// means "none" rather than a failure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Served {
    Always,
    ByCrd,
}

/// What one watch reported.
struct Notice {
    kind: Kind,
    resource_version: Option<String>,
    changes: Vec<Change>,
    /// This kind has completed a list (now or before).
    listed: bool,
    /// The watch failed (and will be retried).
    error: Option<watcher::Error>,
    /// Objects that could not be read, or that can be again (`None`).
    unreadable: Vec<(ObjectKey, Option<SourceProblem>)>,
}

/// The latest watch failure of each kind, cleared by that kind's next event,
/// and every object that cannot be read, until it can or is deleted;
/// published so that operators (and a refused Subscribe) can say why the
/// controller has not synced, or what it does not enforce as written.
#[derive(Default)]
struct WatchErrors {
    watches: std::collections::BTreeMap<Kind, SourceProblem>,
    objects: std::collections::BTreeMap<(Kind, ObjectKey), SourceProblem>,
}

impl WatchErrors {
    fn note(&mut self, notice: &mut Notice, tx: &watch::Sender<Vec<SourceProblem>>) {
        let kind = notice.kind;
        let mut changed = match notice.error.take() {
            Some(cause) => {
                let problem = SourceProblem::from(&SourceError::Watch {
                    kind: kind.name(),
                    cause,
                });
                self.watches.insert(kind, problem.clone()) != Some(problem)
            }
            None => self.watches.remove(&kind).is_some(),
        };
        for (key, problem) in notice.unreadable.drain(..) {
            changed |= match problem {
                Some(p) => self.objects.insert((kind, key), p.clone()) != Some(p),
                None => self.objects.remove(&(kind, key)).is_some(),
            };
        }
        if changed {
            let all = self.watches.values().chain(self.objects.values());
            tx.send_replace(all.cloned().collect());
        }
    }
}

/// Watches the cluster through `client` and sends every change on `tx`.
/// Returns only when `tx` has no receiver left or every watch stream has
/// ended (they do not end on errors: those are logged, put on `errors` and
/// retried with backoff).
pub async fn run(
    client: Client,
    tx: mpsc::UnboundedSender<Update>,
    errors: watch::Sender<Vec<SourceProblem>>,
) {
    run_with(client, tx, errors, PolicySource::NetworkPolicy).await
}

/// As [`run`], taking policy from `source`.
pub async fn run_with(
    client: Client,
    tx: mpsc::UnboundedSender<Update>,
    errors: watch::Sender<Vec<SourceProblem>>,
    source: PolicySource,
) {
    let watches = match source {
        PolicySource::NetworkPolicy => network_policy_watches(client),
        PolicySource::PolicyEndpoint => policy_endpoint_watches(client),
    };
    let kinds = watches.len();
    let mut notices = stream::select_all(watches);
    let mut versions = Versions {
        source,
        ..Default::default()
    };
    let mut watch_errors = WatchErrors::default();
    let mut listed = BTreeSet::new();
    let mut synced = false;
    loop {
        let notice = tokio::select! {
            notice = notices.next() => notice,
            _ = tx.closed() => return,
        };
        let Some(mut notice) = notice else {
            tracing::error!("all watch streams ended");
            return;
        };
        versions.note(&notice);
        watch_errors.note(&mut notice, &errors);
        if notice.listed {
            listed.insert(notice.kind);
        }
        let now_synced = listed.len() == kinds;
        if notice.changes.is_empty() && now_synced == synced {
            continue;
        }
        if now_synced && !synced {
            tracing::info!(marker = %versions.marker(), "every kind listed");
        }
        synced = now_synced;
        let update = Update {
            changes: notice.changes,
            marker: versions.marker(),
            synced,
        };
        if tx.send(update).is_err() {
            return;
        }
    }
}

/// The pods and the slices the AWS controller resolved their policies
/// into (PolicyEndpoints from NetworkPolicies; ClusterPolicyEndpoints from
/// its ClusterNetworkPolicies, a CRD that controller installs only from
/// its v1.3, so a 404 counts as none); namespaces for the pods' namespaces
/// and the subjects' namespace selectors.
fn policy_endpoint_watches(client: Client) -> Vec<BoxStream<'static, Notice>> {
    use Served::{Always, ByCrd};
    vec![
        watch_kind::<Namespace>(
            Api::all(client.clone()),
            Kind::Namespaces,
            false,
            Always,
            |ns| Ok(Change::ApplyNamespace(ns)),
        ),
        watch_kind::<Pod>(Api::all(client.clone()), Kind::Pods, true, Always, |p| {
            Ok(Change::ApplyPod(p))
        }),
        watch_kind::<PolicyEndpoint>(
            Api::all(client.clone()),
            Kind::PolicyEndpoints,
            true,
            Always,
            |pe| Ok(Change::ApplyPolicyEndpoint(pe)),
        ),
        watch_kind::<ClusterPolicyEndpoint>(
            Api::all(client),
            Kind::ClusterPolicyEndpoints,
            false,
            ByCrd,
            |cpe| Ok(Change::ApplyClusterPolicyEndpoint(cpe)),
        ),
    ]
}

fn network_policy_watches(client: Client) -> Vec<BoxStream<'static, Notice>> {
    use Served::{Always, ByCrd};
    vec![
        watch_kind::<Namespace>(
            Api::all(client.clone()),
            Kind::Namespaces,
            false,
            Always,
            |ns| Ok(Change::ApplyNamespace(ns)),
        ),
        watch_kind::<Pod>(Api::all(client.clone()), Kind::Pods, true, Always, |p| {
            Ok(Change::ApplyPod(p))
        }),
        watch_kind::<NetworkPolicy>(
            Api::all(client.clone()),
            Kind::NetworkPolicies,
            true,
            Always,
            |np| Ok(Change::ApplyPolicy(np)),
        ),
        watch_kind::<Service>(
            Api::all(client.clone()),
            Kind::Services,
            true,
            Always,
            |svc| Ok(Change::ApplyService(svc)),
        ),
        watch_kind::<EndpointSlice>(
            Api::all(client.clone()),
            Kind::EndpointSlices,
            true,
            Always,
            |slice| Ok(Change::ApplyEndpointSlice(slice)),
        ),
        watch_kind::<Node>(Api::all(client.clone()), Kind::Nodes, false, Always, |n| {
            Ok(Change::ApplyNode(n))
        }),
        watch_kind::<UpstreamObject>(
            Api::all(client.clone()),
            Kind::UpstreamClusterNetworkPolicies,
            false,
            ByCrd,
            |o| cnp::read_upstream(o).map(Change::ApplyClusterPolicy),
        ),
        watch_kind::<AwsObject>(
            Api::all(client.clone()),
            Kind::AwsClusterNetworkPolicies,
            false,
            ByCrd,
            |o| cnp::read_aws(o).map(Change::ApplyClusterPolicy),
        ),
        // Lowered to NetworkPolicies: applied and deleted as those are,
        // under their own (prefixed) names.
        watch_kind::<anp::Object>(
            Api::all(client),
            Kind::ApplicationNetworkPolicies,
            true,
            ByCrd,
            |o| anp::read(o).map(Change::ApplyPolicy),
        ),
    ]
}

/// Whether a watch error is the API server saying it does not serve the
/// resource (404): a CRD not installed, or removed.
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.is_not_found(),
        watcher::Error::WatchError(s) => s.is_not_found(),
        _ => false,
    }
}

/// One kind's watch as a stream of notices carrying its changes.
fn watch_kind<K>(
    api: Api<K>,
    kind: Kind,
    namespaced: bool,
    served: Served,
    read: Read<K>,
) -> BoxStream<'static, Notice>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let key = move |obj: &K| -> ObjectKey {
        let ns = obj.namespace().unwrap_or_default();
        let ns = if namespaced && ns.is_empty() {
            // As resolution files an object without a namespace.
            "default".to_string()
        } else {
            ns
        };
        (ns, obj.name_any())
    };
    let delete = move |(ns, name): ObjectKey| -> Change {
        match kind {
            Kind::Namespaces => Change::DeleteNamespace(name),
            Kind::Pods => Change::DeletePod((ns, name)),
            Kind::NetworkPolicies => Change::DeletePolicy((ns, name)),
            Kind::Services => Change::DeleteService((ns, name)),
            Kind::EndpointSlices => Change::DeleteEndpointSlice((ns, name)),
            Kind::PolicyEndpoints => Change::DeletePolicyEndpoint((ns, name)),
            Kind::ClusterPolicyEndpoints => Change::DeleteClusterPolicyEndpoint(name),
            Kind::Nodes => Change::DeleteNode(name),
            Kind::UpstreamClusterNetworkPolicies => {
                Change::DeleteClusterPolicy(palisade_apis::ApiGroup::Upstream, name)
            }
            Kind::AwsClusterNetworkPolicies => {
                Change::DeleteClusterPolicy(palisade_apis::ApiGroup::Aws, name)
            }
            Kind::ApplicationNetworkPolicies => Change::DeletePolicy((
                ns,
                palisade_apis::application_network_policy::lowered_name(&name),
            )),
        }
    };
    let mut tracker: Tracker<ObjectKey> = Tracker::default();
    // A list is delivered whole, at its end: its objects come in name
    // order, not in the order they were written, so the highest
    // resourceVersion can arrive first. Passed on one at a time, a list
    // taken while synced (a relist after HTTP 410) would publish a view
    // claiming that version with the objects after it still missing (a
    // policy's later slices: its Deny entries among them). Held changes are
    // kept across a list that fails and starts over: the tracker has
    // already counted them as delivered.
    let mut listing = Taken::default();
    let mut listing_version: Option<String> = None;
    // Objects read once (so a version stays in force when a later one
    // cannot be read), and whether the CRD was found missing.
    let mut read_once: HashSet<ObjectKey> = HashSet::new();
    let mut absent = false;
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        // managedFields are often the larger part of an object and policy
        // never reads them.
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .map(move |event| {
            let mut out = Taken::default();
            let mut version = None;
            match event {
                Ok(Event::Init) => {
                    if std::mem::take(&mut absent) {
                        tracing::info!(kind = kind.name(), "served now (its CRD is installed): watching");
                    }
                    tracker.init()
                }
                Ok(Event::InitApply(obj)) => {
                    let listed_version = obj.resource_version().unwrap_or_default();
                    let k = key(&obj);
                    if tracker.init_apply(k.clone(), &listed_version) {
                        listing.read(kind, read, obj, k, &mut read_once);
                    }
                    if listing_version
                        .as_deref()
                        .is_none_or(|held| is_newer(&listed_version, held))
                    {
                        listing_version = Some(listed_version);
                    }
                }
                Ok(Event::InitDone) => {
                    out = std::mem::take(&mut listing);
                    version = listing_version.take();
                    let gone = tracker.init_done();
                    tracing::info!(
                        ?kind,
                        objects = tracker.count(),
                        deleted_meanwhile = gone.len(),
                        "listed"
                    );
                    for k in gone {
                        out.delete(delete, k, &mut read_once);
                    }
                }
                Ok(Event::Apply(obj)) => {
                    version = obj.resource_version();
                    let k = key(&obj);
                    if tracker.apply(k.clone(), version.as_deref().unwrap_or_default()) {
                        out.read(kind, read, obj, k, &mut read_once);
                    }
                }
                Ok(Event::Delete(obj)) => {
                    version = obj.resource_version();
                    let k = key(&obj);
                    tracker.delete(&k);
                    out.delete(delete, k, &mut read_once);
                }
                Err(e) if served == Served::ByCrd && not_served(&e) => {
                    // No CRD, no objects: listed, and empty (if it was
                    // removed, what it held is gone). The backoff asks
                    // again; said once, as this repeats until installed.
                    if !absent {
                        absent = true;
                        tracing::info!(
                            kind = kind.name(),
                            "not served (its CRD is not installed): taken as none until it is; asking again with backoff"
                        );
                    }
                    // Whatever a list in progress held is gone with it.
                    listing = Taken::default();
                    listing_version = None;
                    tracker.init();
                    for k in tracker.init_done() {
                        out.delete(delete, k, &mut read_once);
                    }
                    return Notice {
                        kind,
                        resource_version: None,
                        changes: out.changes,
                        listed: true,
                        error: None,
                        unreadable: out.unreadable,
                    };
                }
                Err(e) => {
                    // The backoff retries; a transient API error must never
                    // stop the controller or withdraw what is in force.
                    tracing::warn!(?kind, error = %e, "watch failed; retrying with backoff");
                    return Notice {
                        kind,
                        resource_version: None,
                        changes: out.changes,
                        listed: tracker.listed(),
                        error: Some(e),
                        unreadable: out.unreadable,
                    };
                }
            }
            Notice {
                kind,
                resource_version: version,
                changes: out.changes,
                listed: tracker.listed(),
                error: None,
                unreadable: out.unreadable,
            }
        })
        .boxed()
}

/// What one watch event gives: changes, and objects that became
/// unreadable or readable again.
#[derive(Default)]
struct Taken {
    changes: Vec<Change>,
    unreadable: Vec<(ObjectKey, Option<SourceProblem>)>,
}

impl Taken {
    /// An object new or changed since the watch last delivered it. One
    /// that cannot be read is no change: what is in force stays.
    fn read<K>(
        &mut self,
        kind: Kind,
        read: Read<K>,
        obj: K,
        k: ObjectKey,
        read_once: &mut HashSet<ObjectKey>,
    ) {
        match read(obj) {
            Ok(change) => {
                self.changes.push(change);
                read_once.insert(k.clone());
                self.unreadable.push((k, None));
            }
            Err(error) => {
                let e = SourceError::Unreadable {
                    error,
                    kept: read_once.contains(&k),
                };
                tracing::warn!(kind = kind.name(), error = %e, "object cannot be read");
                self.unreadable.push((k, Some(SourceProblem::from(&e))));
            }
        }
    }

    fn delete(
        &mut self,
        delete: impl Fn(ObjectKey) -> Change,
        k: ObjectKey,
        read_once: &mut HashSet<ObjectKey>,
    ) {
        read_once.remove(&k);
        self.unreadable.push((k.clone(), None));
        self.changes.push(delete(k));
    }
}

/// Whether resourceVersion `new` is past `old`: compared as numbers, as
/// etcd issues them; a non-numeric one simply replaces the previous.
fn is_newer(new: &str, old: &str) -> bool {
    match (new.parse::<u64>(), old.parse::<u64>()) {
        (Ok(new), Ok(old)) => new > old,
        _ => true,
    }
}

#[derive(Default)]
struct Versions {
    source: PolicySource,
    namespaces: String,
    pods: String,
    policies: String,
    services: String,
    slices: String,
    policy_endpoints: String,
    cluster_policy_endpoints: String,
    nodes: String,
    upstream_cluster_policies: String,
    aws_cluster_policies: String,
    application_policies: String,
}

impl Versions {
    fn note(&mut self, notice: &Notice) {
        let Some(rv) = notice
            .resource_version
            .as_deref()
            .filter(|rv| !rv.is_empty())
        else {
            return;
        };
        let slot = match notice.kind {
            Kind::Namespaces => &mut self.namespaces,
            Kind::Pods => &mut self.pods,
            Kind::NetworkPolicies => &mut self.policies,
            Kind::Services => &mut self.services,
            Kind::EndpointSlices => &mut self.slices,
            Kind::PolicyEndpoints => &mut self.policy_endpoints,
            Kind::ClusterPolicyEndpoints => &mut self.cluster_policy_endpoints,
            Kind::Nodes => &mut self.nodes,
            Kind::UpstreamClusterNetworkPolicies => &mut self.upstream_cluster_policies,
            Kind::AwsClusterNetworkPolicies => &mut self.aws_cluster_policies,
            Kind::ApplicationNetworkPolicies => &mut self.application_policies,
        };
        if is_newer(rv, slot) {
            *slot = rv.to_string();
        }
    }

    fn marker(&self) -> String {
        if self.source == PolicySource::PolicyEndpoint {
            return format!(
                "k8s namespaces={} pods={} policyendpoints={} clusterpolicyendpoints={}",
                self.namespaces, self.pods, self.policy_endpoints, self.cluster_policy_endpoints
            );
        }
        format!(
            "k8s namespaces={} pods={} networkpolicies={} services={} endpointslices={} \
             nodes={} clusternetworkpolicies={} clusternetworkpolicies.networking.k8s.aws={} \
             applicationnetworkpolicies.networking.k8s.aws={}",
            self.namespaces,
            self.pods,
            self.policies,
            self.services,
            self.slices,
            self.nodes,
            self.upstream_cluster_policies,
            self.aws_cluster_policies,
            self.application_policies
        )
    }
}
