//! The Kubernetes objects Palisade reads that k8s-openapi does not carry.
//!
//! - [`wire`]: each object exactly as its API group serves it (serde), for
//!   the sources to decode and validate field by field, as the API server
//!   would;
//! - [`cluster_network_policy`]: one typed reading of both
//!   ClusterNetworkPolicy groups (`policy.networking.k8s.io/v1alpha2` and
//!   AWS's `networking.k8s.aws/v1alpha1`), what the reference model, the
//!   controller's resolution and explain work on;
//! - [`application_network_policy`]: AWS's ApplicationNetworkPolicy, read
//!   as the NetworkPolicy it is, its `domainNames` peers carried beside.

pub mod application_network_policy;
pub mod cluster_network_policy;
pub mod wire;

pub use cluster_network_policy::{
    Action, ApiGroup, ClusterNetworkPolicy, NamespacedPods, Peer, PortMatch, Protocol, Rule,
    Subject, Tier,
};
