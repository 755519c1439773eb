//! The policy-controller: watches the cluster, resolves NetworkPolicies into a
//! plan per node, streams each node its plan and keeps what each node reports.

pub use palisade_model::cluster;
pub mod allocator;
pub use allocator::Allocator;
pub mod budget;
pub mod cidr;
pub mod debug;
pub mod engine;
pub mod feed;
pub mod hub;
pub mod keys;
pub mod leader;
pub mod limits;
pub mod metrics;
pub use palisade_model::verdict as model;
pub mod plan;
pub mod resolve;
pub mod server;
pub mod source;
pub mod telemetry;
pub mod tls;
