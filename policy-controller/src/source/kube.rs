//! The real cluster: Namespaces, Pods, NetworkPolicies, Services and
//! EndpointSlices from the API server through kube-rs reflectors (list, then
//! watch, all namespaces).
//!
//! Nothing is published until every reflector has finished its first list:
//! resolving with the policies listed but the pods not yet would hand nodes
//! a plan that drops every peer (and without the Services, every ClusterIP
//! an egress rule allows). After that, each burst of changes is
//! coalesced for [`DEBOUNCE`] (at most [`MAX_DELAY`] under constant churn)
//! and published once, if the objects actually differ from the last
//! publication.
//!
//! The marker is `k8s namespaces=<rv> pods=<rv> networkpolicies=<rv>
//! services=<rv> endpointslices=<rv>`: for
//! each kind, the highest resourceVersion its watch has delivered (compared
//! as numbers, as etcd issues them; a non-numeric one simply replaces the
//! previous). Kinds are kept apart because each has its own watch stream: the
//! view is at least that new for each kind, which one cluster-wide number
//! could not promise.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::cluster::{ClusterState, Object};

pub const DEBOUNCE: Duration = Duration::from_millis(50);
pub const MAX_DELAY: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Namespaces,
    Pods,
    NetworkPolicies,
    Services,
    EndpointSlices,
}

/// What one reflector reported, after its store took it in.
struct Notice {
    kind: Kind,
    resource_version: Option<String>,
    /// Whether the store may now differ. An object of a relist is only
    /// buffered by the store until the relist completes.
    changed: bool,
    /// The watch failed (and will be retried).
    error: Option<String>,
}

/// The latest watch failure of each kind, cleared by that kind's next event;
/// published so that operators (and a refused Subscribe) can say why the
/// controller has not synced.
#[derive(Default)]
struct WatchErrors(std::collections::BTreeMap<Kind, String>);

impl WatchErrors {
    fn note(&mut self, notice: &Notice, tx: &watch::Sender<Vec<String>>) {
        let changed = match &notice.error {
            Some(e) => self.0.insert(notice.kind, e.clone()).as_ref() != Some(e),
            None => self.0.remove(&notice.kind).is_some(),
        };
        if changed {
            tx.send_replace(
                self.0
                    .iter()
                    .map(|(kind, e)| format!("watching {kind:?}: {e}"))
                    .collect(),
            );
        }
    }
}

/// Watches the cluster through `client` and publishes `Some(state)` on `tx`
/// after the initial lists and after every change. Returns only when `tx`
/// has no receivers left or every watch stream has ended (they do not end on
/// errors: those are logged, put on `errors` and retried with backoff).
pub async fn run(
    client: Client,
    tx: watch::Sender<Option<ClusterState>>,
    errors: watch::Sender<Vec<String>>,
) {
    let (namespaces, ns_writer) = reflector::store::<Namespace>();
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (policies, np_writer) = reflector::store::<NetworkPolicy>();
    let (services, svc_writer) = reflector::store::<Service>();
    let (slices, slice_writer) = reflector::store::<EndpointSlice>();
    let stores = Stores {
        namespaces,
        pods,
        policies,
        services,
        slices,
    };
    let mut notices = stream::select_all([
        reflect(Api::all(client.clone()), ns_writer, Kind::Namespaces),
        reflect(Api::all(client.clone()), pod_writer, Kind::Pods),
        reflect(Api::all(client.clone()), np_writer, Kind::NetworkPolicies),
        reflect(Api::all(client.clone()), svc_writer, Kind::Services),
        reflect(Api::all(client), slice_writer, Kind::EndpointSlices),
    ]);
    let mut versions = Versions::default();
    let mut watch_errors = WatchErrors::default();

    // The stores fill only while their streams are polled, so wait for
    // readiness while draining the notices.
    let ready = async {
        tokio::try_join!(
            stores.namespaces.wait_until_ready(),
            stores.pods.wait_until_ready(),
            stores.policies.wait_until_ready(),
            stores.services.wait_until_ready(),
            stores.slices.wait_until_ready(),
        )
    };
    tokio::pin!(ready);
    loop {
        tokio::select! {
            result = &mut ready => {
                if let Err(e) = result {
                    tracing::error!(error = %e, "a reflector stopped before its first list");
                    return;
                }
                break;
            }
            notice = notices.next() => match notice {
                Some(notice) => {
                    versions.note(&notice);
                    watch_errors.note(&notice, &errors);
                }
                None => {
                    tracing::error!("watch streams ended before the first list");
                    return;
                }
            },
            _ = tx.closed() => return,
        }
    }

    let mut published: Option<ClusterState> = None;
    publish(&tx, &mut published, &stores, &versions);

    loop {
        let first = tokio::select! {
            notice = notices.next() => notice,
            _ = tx.closed() => return,
        };
        let Some(first) = first else {
            tracing::error!("all watch streams ended");
            return;
        };
        versions.note(&first);
        watch_errors.note(&first, &errors);
        if !first.changed {
            continue;
        }
        let deadline = tokio::time::Instant::now() + MAX_DELAY;
        loop {
            let quiet = (tokio::time::Instant::now() + DEBOUNCE).min(deadline);
            match tokio::time::timeout_at(quiet, notices.next()).await {
                Ok(Some(notice)) => {
                    versions.note(&notice);
                    watch_errors.note(&notice, &errors);
                }
                Ok(None) | Err(_) => break,
            }
        }
        publish(&tx, &mut published, &stores, &versions);
    }
}

/// One kind's reflector as a stream of notices.
fn reflect<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    kind: Kind,
) -> BoxStream<'static, Notice>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        // managedFields are often the larger part of an object and policy
        // never reads them; the store keeps every object of the cluster.
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .reflect(writer)
        .filter_map(move |event| async move {
            let (object, changed) = match event {
                Ok(Event::Apply(obj) | Event::Delete(obj)) => (Some(obj), true),
                Ok(Event::InitApply(obj)) => (Some(obj), false),
                // The store swaps in the relisted objects here.
                Ok(Event::InitDone) => (None, true),
                Ok(Event::Init) => (None, false),
                Err(e) => {
                    // The backoff retries; a transient API error must never
                    // stop the controller or withdraw the published state.
                    tracing::warn!(?kind, error = %e, "watch failed; retrying with backoff");
                    return Some(Notice {
                        kind,
                        resource_version: None,
                        changed: false,
                        error: Some(e.to_string()),
                    });
                }
            };
            Some(Notice {
                kind,
                resource_version: object.and_then(|o| o.resource_version()),
                changed,
                error: None,
            })
        })
        .boxed()
}

#[derive(Default)]
struct Versions {
    namespaces: String,
    pods: String,
    policies: String,
    services: String,
    slices: String,
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
        format!(
            "k8s namespaces={} pods={} networkpolicies={} services={} endpointslices={}",
            self.namespaces, self.pods, self.policies, self.services, self.slices
        )
    }
}

/// The reflectors' stores, one per kind.
struct Stores {
    namespaces: Store<Namespace>,
    pods: Store<Pod>,
    policies: Store<NetworkPolicy>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

fn publish(
    tx: &watch::Sender<Option<ClusterState>>,
    published: &mut Option<ClusterState>,
    stores: &Stores,
    versions: &Versions,
) {
    fn all<K: Clone + Resource>(
        store: &Store<K>,
        wrap: fn(K) -> Object,
    ) -> impl Iterator<Item = Object>
    where
        K::DynamicType: Eq + Hash + Clone,
    {
        store.state().into_iter().map(move |o| wrap((*o).clone()))
    }
    let objects = all(&stores.namespaces, Object::Namespace)
        .chain(all(&stores.pods, Object::Pod))
        .chain(all(&stores.policies, Object::NetworkPolicy))
        .chain(all(&stores.services, Object::Service))
        .chain(all(&stores.slices, Object::EndpointSlice));
    let state = ClusterState::from_objects(objects, versions.marker());
    // A relist after a watch reconnect replays the whole cluster; without
    // this, every reconnect would make every node's plan be recomputed.
    if let Some(last) = published {
        if last.namespaces == state.namespaces
            && last.pods == state.pods
            && last.policies == state.policies
            && last.services == state.services
            && last.endpoint_slices == state.endpoint_slices
        {
            return;
        }
    }
    tracing::info!(
        marker = %state.marker,
        namespaces = state.namespaces.len(),
        pods = state.pods.len(),
        policies = state.policies.len(),
        services = state.services.len(),
        endpoint_slices = state.endpoint_slices.len(),
        "cluster state changed"
    );
    *published = Some(state.clone());
    tx.send_replace(Some(state));
}
