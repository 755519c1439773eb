//! Policy resolution: a pure function from the cluster's objects to the plan
//! of every node. It follows NetworkPolicy v1 as upstream defines it: a pod is
//! isolated in a direction once any policy selects it for that direction, and
//! the rules of every such policy are unioned.
//!
//! A node's plan names every pod that lives on it, isolated or not (a pod
//! missing from a plan is one the controller does not know, which an enforcer
//! must not read as "not isolated"); peers appear as addresses, so a node
//! learns nothing else about the cluster. Host-network pods are left out:
//! they share the node's interfaces, so there is nothing per pod to enforce.
//!
//! The walk, by file:
//!
//! - `oracle.rs`: every node's plan by scanning, the oracle the engine is
//!   tested against;
//! - `target.rs`: one pod's policy from the policies that select it (where
//!   policy tiers meet);
//! - `tiers.rs`: ClusterNetworkPolicy (Admin and Baseline tiers): which
//!   apply to a pod, their rules as tier rules;
//! - `staging.rs`: staged (audit) policies;
//! - `rules.rs`: one policy rule as plan rules, with `peers.rs` (address
//!   blocks and selected pods), `ports.rs` (numbered and named ports) and
//!   `services.rs` (the ClusterIPs an egress rule allows);
//! - `objects.rs`: pods and namespaces as resolution reads them;
//! - `selectors.rs`: label selectors;
//! - `node_plan.rs`: what resolution produces.

mod node_plan;
mod objects;
mod oracle;
mod peers;
mod ports;
mod rules;
mod selectors;
mod services;
mod staging;
mod target;
mod tiers;

pub use node_plan::{NodePlan, Resolution};
pub use objects::UnknownProtocol;
pub(crate) use objects::{
    default_ns_labels, namespace_of, ns_labels, parse_protocol, pod_info, PodInfo,
};
pub use oracle::resolve_cluster;
pub(crate) use peers::{block, PeerSelection, Selected};
pub use peers::{parse_block, BlockError};
pub use selectors::{selector_matches, validate_selector, SelectorError, UnknownOperator};
pub(crate) use services::{is_selectorless, selector_of, service_info, slice_service, ServiceInfo};
pub use staging::{is_staged, AUDIT_ANNOTATION};
pub(crate) use target::resolve_pod;
pub(crate) use tiers::{node_ips, TieredPolicy};

#[cfg(test)]
mod tests;
