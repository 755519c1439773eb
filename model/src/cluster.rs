//! The controller's view of the cluster: the objects policy resolution reads.
//! Every source (kube-rs watchers, manifest files) produces this one type, so
//! everything after parsing is one code path.

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_apis::ClusterNetworkPolicy;

#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<NetworkPolicy>,
    /// Services and EndpointSlices: an egress rule that allows a Service's
    /// backends also allows its ClusterIP, which is what a client's egress
    /// hook sees before the kernel translates it.
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Cluster-wide tiered policies of both API groups, read (see
    /// `palisade_apis`), in no particular order: precedence is
    /// [`ClusterNetworkPolicy::precedence`].
    pub cluster_policies: Vec<ClusterNetworkPolicy>,
    /// Nodes, for the `nodes` peer of ClusterNetworkPolicy egress rules
    /// (their `status.addresses`).
    pub nodes: Vec<Node>,
    /// The source's own marker of this view: the lab's manifest revision, or
    /// the Kubernetes resourceVersions it reflects. Shown to operators.
    pub marker: String,
}

/// One object as read from a source.
// Objects are short-lived on the way into a ClusterState; boxing the large
// Pod variant would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Object {
    Namespace(Namespace),
    Pod(Pod),
    NetworkPolicy(NetworkPolicy),
    Service(Service),
    EndpointSlice(EndpointSlice),
    ClusterNetworkPolicy(ClusterNetworkPolicy),
    Node(Node),
}

impl ClusterState {
    /// Builds a state from objects in any order; later duplicates of the same
    /// kind/namespace/name replace earlier ones. Output is sorted so the same
    /// objects always give the same state.
    pub fn from_objects(objects: impl IntoIterator<Item = Object>, marker: String) -> Self {
        use std::collections::BTreeMap;
        let mut namespaces = BTreeMap::new();
        let mut pods = BTreeMap::new();
        let mut policies = BTreeMap::new();
        let mut services = BTreeMap::new();
        let mut slices = BTreeMap::new();
        let mut cluster_policies = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for object in objects {
            match object {
                Object::Namespace(ns) => {
                    namespaces.insert(ns.metadata.name.clone().unwrap_or_default(), ns);
                }
                Object::Pod(pod) => {
                    pods.insert(key(&pod.metadata), pod);
                }
                Object::NetworkPolicy(np) => {
                    policies.insert(key(&np.metadata), np);
                }
                Object::Service(svc) => {
                    services.insert(key(&svc.metadata), svc);
                }
                Object::EndpointSlice(slice) => {
                    slices.insert(key(&slice.metadata), slice);
                }
                Object::ClusterNetworkPolicy(cnp) => {
                    cluster_policies.insert((cnp.group, cnp.name.clone()), cnp);
                }
                Object::Node(node) => {
                    nodes.insert(node.metadata.name.clone().unwrap_or_default(), node);
                }
            }
        }
        ClusterState {
            namespaces: namespaces.into_values().collect(),
            pods: pods.into_values().collect(),
            policies: policies.into_values().collect(),
            services: services.into_values().collect(),
            endpoint_slices: slices.into_values().collect(),
            cluster_policies: cluster_policies.into_values().collect(),
            nodes: nodes.into_values().collect(),
            marker,
        }
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}
