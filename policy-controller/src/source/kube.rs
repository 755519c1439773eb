//! The real cluster: Namespaces, Pods, NetworkPolicies, Services and
//! EndpointSlices from the API server through kube-rs watchers (list, then
//! watch, all namespaces), delivered as changes to single objects.
//!
//! Every watch event becomes one [`Change`]: an object applied or deleted,
//! so a change in the cluster costs the engine what that change touches,
//! not a comparison of the whole cluster. A relist (the first list, or
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
//! The marker is `k8s namespaces=<rv> pods=<rv> networkpolicies=<rv>
//! services=<rv> endpointslices=<rv>`: for
//! each kind, the highest resourceVersion its watch has delivered (compared
//! as numbers, as etcd issues them; a non-numeric one simply replaces the
//! previous). Kinds are kept apart because each has its own watch stream: the
//! view is at least that new for each kind, which one cluster-wide number
//! could not promise.
//!
//! With [`PolicySource::PolicyEndpoint`] the policy comes from the AWS
//! network policy controller's PolicyEndpoints instead: NetworkPolicies,
//! Services and EndpointSlices are not watched (that controller has already
//! resolved them into addresses), and the marker is `k8s namespaces=<rv>
//! pods=<rv> policyendpoints=<rv>`.

use std::collections::BTreeSet;
use std::fmt::Debug;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

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
        }
    }
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
}

/// The latest watch failure of each kind, cleared by that kind's next event;
/// published so that operators (and a refused Subscribe) can say why the
/// controller has not synced.
#[derive(Default)]
struct WatchErrors(std::collections::BTreeMap<Kind, SourceProblem>);

impl WatchErrors {
    fn note(
        &mut self,
        kind: Kind,
        error: Option<watcher::Error>,
        tx: &watch::Sender<Vec<SourceProblem>>,
    ) {
        let changed = match error {
            Some(cause) => {
                let problem = SourceProblem::from(&SourceError::Watch {
                    kind: kind.name(),
                    cause,
                });
                self.0.insert(kind, problem.clone()) != Some(problem)
            }
            None => self.0.remove(&kind).is_some(),
        };
        if changed {
            tx.send_replace(self.0.values().cloned().collect());
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
        watch_errors.note(notice.kind, notice.error.take(), &errors);
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
/// into; namespaces only for the marker's shape and the pods' namespaces.
fn policy_endpoint_watches(client: Client) -> Vec<BoxStream<'static, Notice>> {
    vec![
        watch_kind::<Namespace>(Api::all(client.clone()), Kind::Namespaces, false, |ns| {
            Change::ApplyNamespace(ns)
        }),
        watch_kind::<Pod>(Api::all(client.clone()), Kind::Pods, true, Change::ApplyPod),
        watch_kind::<PolicyEndpoint>(
            Api::all(client),
            Kind::PolicyEndpoints,
            true,
            Change::ApplyPolicyEndpoint,
        ),
    ]
}

fn network_policy_watches(client: Client) -> Vec<BoxStream<'static, Notice>> {
    vec![
        watch_kind::<Namespace>(Api::all(client.clone()), Kind::Namespaces, false, |ns| {
            Change::ApplyNamespace(ns)
        }),
        watch_kind::<Pod>(Api::all(client.clone()), Kind::Pods, true, Change::ApplyPod),
        watch_kind::<NetworkPolicy>(
            Api::all(client.clone()),
            Kind::NetworkPolicies,
            true,
            Change::ApplyPolicy,
        ),
        watch_kind::<Service>(
            Api::all(client.clone()),
            Kind::Services,
            true,
            Change::ApplyService,
        ),
        watch_kind::<EndpointSlice>(
            Api::all(client),
            Kind::EndpointSlices,
            true,
            Change::ApplyEndpointSlice,
        ),
    ]
}

/// One kind's watch as a stream of notices carrying its changes.
fn watch_kind<K>(
    api: Api<K>,
    kind: Kind,
    namespaced: bool,
    apply: fn(K) -> Change,
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
        }
    };
    let mut tracker: Tracker<ObjectKey> = Tracker::default();
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        // managedFields are often the larger part of an object and policy
        // never reads them.
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .map(move |event| {
            let mut changes = Vec::new();
            let mut version = None;
            match event {
                Ok(Event::Init) => tracker.init(),
                Ok(Event::InitApply(obj)) => {
                    version = obj.resource_version();
                    if tracker.init_apply(key(&obj), version.as_deref().unwrap_or_default()) {
                        changes.push(apply(obj));
                    }
                }
                Ok(Event::InitDone) => {
                    let gone = tracker.init_done();
                    tracing::info!(
                        ?kind,
                        objects = tracker.count(),
                        deleted_meanwhile = gone.len(),
                        "listed"
                    );
                    changes.extend(gone.into_iter().map(delete));
                }
                Ok(Event::Apply(obj)) => {
                    version = obj.resource_version();
                    if tracker.apply(key(&obj), version.as_deref().unwrap_or_default()) {
                        changes.push(apply(obj));
                    }
                }
                Ok(Event::Delete(obj)) => {
                    version = obj.resource_version();
                    let k = key(&obj);
                    tracker.delete(&k);
                    changes.push(delete(k));
                }
                Err(e) => {
                    // The backoff retries; a transient API error must never
                    // stop the controller or withdraw what is in force.
                    tracing::warn!(?kind, error = %e, "watch failed; retrying with backoff");
                    return Notice {
                        kind,
                        resource_version: None,
                        changes,
                        listed: tracker.listed(),
                        error: Some(e),
                    };
                }
            }
            Notice {
                kind,
                resource_version: version,
                changes,
                listed: tracker.listed(),
                error: None,
            }
        })
        .boxed()
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
        };
        let newer = match (rv.parse::<u64>(), slot.parse::<u64>()) {
            (Ok(new), Ok(old)) => new > old,
            _ => true,
        };
        if newer {
            *slot = rv.to_string();
        }
    }

    fn marker(&self) -> String {
        if self.source == PolicySource::PolicyEndpoint {
            return format!(
                "k8s namespaces={} pods={} policyendpoints={}",
                self.namespaces, self.pods, self.policy_endpoints
            );
        }
        format!(
            "k8s namespaces={} pods={} networkpolicies={} services={} endpointslices={}",
            self.namespaces, self.pods, self.policies, self.services, self.slices
        )
    }
}
