//! Palisade's reference model of Kubernetes NetworkPolicy, shared by the
//! policy-controller (its oracle tests) and the lab (`palisade-lab run
//! --engine model`, and its check of every observed verdict), so that the
//! lab never imports the controller's own code.
//!
//! - [`cluster`]: the objects (namespaces, pods, policies, cluster
//!   policies, Services, EndpointSlices, Nodes) as one value.
//! - [`selector`]: label selectors.
//! - [`tiers`]: how a ClusterNetworkPolicy selects pods and matches one
//!   connection.
//! - [`verdict`]: whether one connection is allowed, one at a time, naively:
//!   Admin tier, NetworkPolicy, Baseline tier, the default.
//! - [`explain`]: which tier, policy and rule decided one direction, for
//!   operators.

pub mod cluster;
pub mod explain;
pub mod selector;
pub mod tiers;
pub mod verdict;
