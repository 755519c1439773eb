//! What the debug service computes from the hub and the engine, apart from
//! the gRPC handlers: realization status per node and per policy, and the
//! explanation of one flow by the reference model, and each node's
//! connection history.

pub mod connection;
pub mod explain;
pub mod realization;
