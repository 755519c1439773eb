//! The policy-controller: watches the cluster, resolves NetworkPolicies into a
//! plan per node, streams each node its plan and keeps what each node reports.

pub mod cluster;
pub mod engine;
pub mod feed;
pub mod hub;
pub mod model;
pub mod plan;
pub mod resolve;
pub mod server;
pub mod source;
