//! What the controller keys the cluster's objects by: namespace and name.

/// Namespace and name of a namespaced object of any kind: a NetworkPolicy,
/// a Service, an EndpointSlice, a PolicyEndpoint.
pub type ObjectKey = (String, String);

/// Namespace and name of a pod: a target of resolution, and the key of a
/// node's plan entries, as the wire's plan code ([`palisade_proto::plan`])
/// keys them.
pub use palisade_proto::plan::PodKey;
