//! Manifests checked as the Kubernetes API server checks them, so that the
//! manifest source accepts exactly what `kubectl apply` would get into a
//! cluster and refuses the rest, naming the field.
//!
//! A manifest is decoded with strict field validation ([`strict`]: an
//! unknown or repeated field at any depth is an error, where k8s-openapi's
//! types would skip it; a typo such as `fromm:` in a rule would otherwise
//! make the rule `{}`, which allows everything), then validated by kind
//! ([`networkpolicy`], [`core`], [`discovery`], with [`meta`]'s shared
//! checks). [`cluster_network_policy`] checks ClusterNetworkPolicies of
//! both API groups against their CRDs (schema and CEL rules);
//! [`application_network_policy`] checks AWS's ApplicationNetworkPolicy
//! against its CRD; [`policy_endpoint`] checks PolicyEndpoint and ClusterPolicyEndpoint
//! specs against the AWS controller's CRD schemas.
//!
//! The kube source does not come through here for the built-in kinds: the
//! API server has already validated what it serves, and the lenient typed
//! decode is what keeps a field newer than our k8s-openapi version from
//! breaking the watch. Every function here is pure.

pub mod application_network_policy;
pub mod cluster_network_policy;
pub mod core;
pub mod discovery;
pub mod field;
pub mod meta;
pub mod networkpolicy;
pub mod policy_endpoint;
pub mod strict;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use palisade_apis::application_network_policy as anp;
use palisade_apis::wire::{AWS_API_VERSION, UPSTREAM_API_VERSION};
use palisade_apis::ClusterNetworkPolicy;
use serde_json::Value;

use crate::cluster::Object;
pub use field::{joined, Errors, FieldError, Path, Problem};

/// The kinds the manifest source reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Namespace,
    Pod,
    Service,
    EndpointSlice,
    NetworkPolicy,
    Node,
    /// `policy.networking.k8s.io/v1alpha2` ClusterNetworkPolicy.
    UpstreamClusterNetworkPolicy,
    /// `networking.k8s.aws/v1alpha1` ClusterNetworkPolicy.
    AwsClusterNetworkPolicy,
    /// `networking.k8s.aws/v1alpha1` ApplicationNetworkPolicy.
    ApplicationNetworkPolicy,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::Pod | Kind::Service | Kind::Node => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::UpstreamClusterNetworkPolicy => UPSTREAM_API_VERSION,
            Kind::AwsClusterNetworkPolicy | Kind::ApplicationNetworkPolicy => AWS_API_VERSION,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::Node => "Node",
            Kind::UpstreamClusterNetworkPolicy | Kind::AwsClusterNetworkPolicy => {
                "ClusterNetworkPolicy"
            }
            Kind::ApplicationNetworkPolicy => anp::KIND,
        }
    }
}

const READ: [Kind; 9] = [
    Kind::Namespace,
    Kind::Pod,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::NetworkPolicy,
    Kind::Node,
    Kind::UpstreamClusterNetworkPolicy,
    Kind::AwsClusterNetworkPolicy,
    Kind::ApplicationNetworkPolicy,
];

/// Kinds the API server serves at each version of the groups Palisade
/// reads from (lists excepted). Another kind there is a typo the API server
/// would refuse ("no matches for kind"), and skipping it would silently
/// drop, say, a misspelt NetworkPolicy.
const SERVED: [(&str, &[&str]); 7] = [
    (
        "v1",
        &[
            "Binding",
            "ComponentStatus",
            "ConfigMap",
            "Endpoints",
            "Event",
            "LimitRange",
            // kubectl's own container for several objects (an empty one
            // reaches here; one with items is flattened before).
            "List",
            "Namespace",
            "Node",
            "PersistentVolume",
            "PersistentVolumeClaim",
            "Pod",
            "PodTemplate",
            "ReplicationController",
            "ResourceQuota",
            "Secret",
            "Service",
            "ServiceAccount",
        ],
    ),
    (
        "networking.k8s.io/v1",
        &[
            "IPAddress",
            "Ingress",
            "IngressClass",
            "NetworkPolicy",
            "ServiceCIDR",
        ],
    ),
    ("networking.k8s.io/v1beta1", &["IPAddress", "ServiceCIDR"]),
    ("discovery.k8s.io/v1", &["EndpointSlice"]),
    // network-policy-api: v0.1's AdminNetworkPolicy and
    // BaselineAdminNetworkPolicy may still be installed beside v0.2.
    (
        "policy.networking.k8s.io/v1alpha1",
        &["AdminNetworkPolicy", "BaselineAdminNetworkPolicy"],
    ),
    (
        "policy.networking.k8s.io/v1alpha2",
        &["ClusterNetworkPolicy"],
    ),
    // amazon-network-policy-controller-k8s.
    (
        "networking.k8s.aws/v1alpha1",
        &[
            "ApplicationNetworkPolicy",
            "ClusterNetworkPolicy",
            "ClusterPolicyEndpoint",
            "PolicyEndpoint",
        ],
    ),
];

/// Groups whose every version and kind must be in [`SERVED`]: the ones
/// Palisade reads, "core" (a common mistake for the core group) and
/// "extensions", which once served NetworkPolicy.
const CHECKED_GROUPS: [&str; 7] = [
    "",
    "core",
    "networking.k8s.io",
    "discovery.k8s.io",
    "extensions",
    "policy.networking.k8s.io",
    "networking.k8s.aws",
];

/// Why an (apiVersion, kind) in a group Palisade reads is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    /// A kind Palisade reads, under another version.
    #[error("{kind} is not served as {api_version:?}: use apiVersion {want}")]
    WrongVersion {
        kind: String,
        api_version: String,
        want: &'static str,
    },
    #[error("kind {kind:?} is not served by {api_version} (it serves {})", .serves.join(", "))]
    NotServed {
        kind: String,
        api_version: String,
        serves: &'static [&'static str],
    },
    #[error("apiVersion {api_version:?} is not served")]
    NoSuchVersion { api_version: String },
}

/// What the manifest source does with an (apiVersion, kind): read it
/// (`Some`), skip it (`None`: another controller's object), or refuse it.
pub fn kind_of(api_version: &str, kind: &str) -> Result<Option<Kind>, KindError> {
    if let Some(k) = READ
        .iter()
        .find(|k| k.name() == kind && k.api_version() == api_version)
    {
        return Ok(Some(*k));
    }
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    if !CHECKED_GROUPS.contains(&group) {
        return Ok(None);
    }
    // The kind of this group if it has one (both ClusterNetworkPolicy
    // groups have the kind), else of any group.
    let same_group = |k: &&Kind| k.api_version().rsplit_once('/').map_or("", |(g, _)| g) == group;
    let named = || READ.iter().filter(move |k| k.name() == kind);
    if let Some(k) = named().find(same_group).or_else(|| named().next()) {
        return Err(KindError::WrongVersion {
            kind: kind.to_string(),
            api_version: api_version.to_string(),
            want: k.api_version(),
        });
    }
    match SERVED.iter().find(|(v, _)| *v == api_version) {
        Some((_, kinds)) if kinds.contains(&kind) => Ok(None),
        Some((_, kinds)) => Err(KindError::NotServed {
            kind: kind.to_string(),
            api_version: api_version.to_string(),
            serves: kinds,
        }),
        None => Err(KindError::NoSuchVersion {
            api_version: api_version.to_string(),
        }),
    }
}

/// Decodes and validates one object of a kind Palisade reads. A namespaced
/// object without a namespace lands in "default", as `kubectl apply` puts
/// it; a cluster-scoped object's (Namespace, Node, ClusterNetworkPolicy)
/// stray namespace is dropped, as the API server drops it.
pub fn object(kind: Kind, value: Value) -> Result<Object, Vec<FieldError>> {
    let mut errs = Errors::default();
    let object = match kind {
        Kind::Namespace => {
            let mut ns: Namespace = strict::decode(value)?;
            ns.metadata.namespace = None;
            core::namespace(&ns, &mut errs);
            Object::Namespace(ns)
        }
        Kind::Pod => {
            let mut pod: Pod = strict::decode(value)?;
            default_namespace(&mut pod.metadata);
            core::pod(&pod, &mut errs);
            core::normalize_pod_ips(&mut pod);
            Object::Pod(pod)
        }
        Kind::Service => {
            let mut svc: Service = strict::decode(value)?;
            default_namespace(&mut svc.metadata);
            core::service(&svc, &mut errs);
            Object::Service(svc)
        }
        Kind::EndpointSlice => {
            let mut slice: EndpointSlice = strict::decode(value)?;
            default_namespace(&mut slice.metadata);
            discovery::endpoint_slice(&slice, &mut errs);
            Object::EndpointSlice(slice)
        }
        Kind::NetworkPolicy => {
            let mut np: NetworkPolicy = strict::decode(value)?;
            default_namespace(&mut np.metadata);
            networkpolicy::validate(&np, &mut errs);
            Object::NetworkPolicy(np)
        }
        Kind::Node => {
            let mut node: Node = strict::decode(value)?;
            node.metadata.namespace = None;
            core::node(&node, &mut errs);
            Object::Node(node)
        }
        Kind::UpstreamClusterNetworkPolicy => {
            let wire = cluster_network_policy::upstream(value)?;
            Object::ClusterNetworkPolicy(ClusterNetworkPolicy::from_upstream(&wire))
        }
        Kind::AwsClusterNetworkPolicy => {
            let wire = cluster_network_policy::aws(value)?;
            Object::ClusterNetworkPolicy(ClusterNetworkPolicy::from_aws(&wire))
        }
        // Read as the NetworkPolicy it is (see `palisade_apis`).
        Kind::ApplicationNetworkPolicy => {
            let wire = application_network_policy::validate(value)?;
            Object::NetworkPolicy(anp::lower(&wire))
        }
    };
    errs.into_result().map(|()| object)
}

fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_skipped_and_refused() {
        assert_eq!(
            kind_of("networking.k8s.io/v1", "NetworkPolicy"),
            Ok(Some(Kind::NetworkPolicy))
        );
        assert_eq!(kind_of("v1", "Pod"), Ok(Some(Kind::Pod)));
        assert_eq!(
            kind_of("discovery.k8s.io/v1", "EndpointSlice"),
            Ok(Some(Kind::EndpointSlice))
        );
        for skipped in [
            ("v1", "ConfigMap"),
            ("apps/v1", "Deployment"),
            ("crd.projectcalico.org/v1", "NetworkPolicy"),
            ("networking.k8s.io/v1", "Ingress"),
            ("cilium.io/v2", "CiliumNetworkPolicy"),
        ] {
            assert_eq!(kind_of(skipped.0, skipped.1), Ok(None), "{skipped:?}");
        }
        assert_eq!(kind_of("v1", "Node"), Ok(Some(Kind::Node)));
        assert_eq!(
            kind_of("policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicy"),
            Ok(Some(Kind::UpstreamClusterNetworkPolicy))
        );
        assert_eq!(
            kind_of("networking.k8s.aws/v1alpha1", "ClusterNetworkPolicy"),
            Ok(Some(Kind::AwsClusterNetworkPolicy))
        );
        assert_eq!(
            kind_of("networking.k8s.aws/v1alpha1", "ApplicationNetworkPolicy"),
            Ok(Some(Kind::ApplicationNetworkPolicy))
        );
        for skipped in [
            ("networking.k8s.aws/v1alpha1", "PolicyEndpoint"),
            ("policy.networking.k8s.io/v1alpha1", "AdminNetworkPolicy"),
            // Antrea's kind of the same name: another controller's.
            ("crd.antrea.io/v1beta1", "ClusterNetworkPolicy"),
        ] {
            assert_eq!(kind_of(skipped.0, skipped.1), Ok(None), "{skipped:?}");
        }
        let refused = [
            ("networking.k8s.io/v1", "NetworkPolcy", "kind \"NetworkPolcy\" is not served by networking.k8s.io/v1"),
            ("networking.k8s.io/v1", "networkpolicy", "kind \"networkpolicy\" is not served"),
            ("networking.k8s.io/v1beta1", "NetworkPolicy", "NetworkPolicy is not served as \"networking.k8s.io/v1beta1\": use apiVersion networking.k8s.io/v1"),
            ("extensions/v1beta1", "NetworkPolicy", "NetworkPolicy is not served as \"extensions/v1beta1\""),
            ("v1", "NetworkPolicy", "NetworkPolicy is not served as \"v1\": use apiVersion networking.k8s.io/v1"),
            ("core/v1", "Pod", "Pod is not served as \"core/v1\": use apiVersion v1"),
            ("v1", "Pods", "kind \"Pods\" is not served by v1"),
            ("discovery.k8s.io/v1beta1", "EndpointSlice", "EndpointSlice is not served as \"discovery.k8s.io/v1beta1\""),
            ("v2", "Widget", "apiVersion \"v2\" is not served"),
            ("policy.networking.k8s.io/v1alpha1", "ClusterNetworkPolicy", "ClusterNetworkPolicy is not served as \"policy.networking.k8s.io/v1alpha1\": use apiVersion policy.networking.k8s.io/v1alpha2"),
            ("networking.k8s.aws/v1beta1", "ClusterNetworkPolicy", "ClusterNetworkPolicy is not served as \"networking.k8s.aws/v1beta1\": use apiVersion networking.k8s.aws/v1alpha1"),
            ("networking.k8s.aws/v1alpha1", "ClusterNetworkPolcy", "kind \"ClusterNetworkPolcy\" is not served by networking.k8s.aws/v1alpha1"),
            ("policy.networking.k8s.io/v1alpha2", "AdminNetworkPolicy", "kind \"AdminNetworkPolicy\" is not served by policy.networking.k8s.io/v1alpha2"),
            ("v1", "Nodes", "kind \"Nodes\" is not served by v1"),
        ];
        for (v, k, want) in refused {
            let got = kind_of(v, k).unwrap_err().to_string();
            assert!(got.starts_with(want), "{v} {k}: {got}");
        }
    }
}
