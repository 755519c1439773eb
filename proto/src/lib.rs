//! Generated code for Palisade's gRPC API. `proto/` at the repository root is
//! the one source of the wire format.

pub mod palisade {
    pub mod v1 {
        tonic::include_proto!("palisade.v1");
    }
}

/// The AWS VPC CNI's `NPBackend` service, reproduced wire-for-wire.
pub mod rpc {
    tonic::include_proto!("rpc");
}

pub use palisade::v1;

/// A node's plan held as pods, and applying a delta to it.
pub mod plan;

/// `IpPrefix` to and from the standard library's addresses.
mod prefix;

/// Encoded `FileDescriptorSet` of every Palisade service, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/palisade_descriptor.bin"));

/// Largest plan message (a snapshot, a delta, one pod's plan) the
/// controller sends and an enforcer accepts: far above tonic's default of
/// 4 MiB, which a policy of ~100,000 rules selecting one pod passes. A
/// bigger message fails its stream with an error both sides log and the
/// enforcer's dump shows (`plan_stream_error`); the node keeps its plan.
pub const MAX_PLAN_MESSAGE_BYTES: usize = 64 << 20;

/// The response metadata key a standby controller sets on the UNAVAILABLE
/// with which it refuses plan calls: the enforcer then tries again at once,
/// since every replica behind the controller's Service is Ready, leader or
/// not, and the next connection may reach the leader.
pub const STANDBY_METADATA: &str = "palisade-standby";

/// Whether `status` is a standby controller's refusal.
pub fn is_standby_refusal(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && status.metadata().contains_key(STANDBY_METADATA)
}

/// Fully-qualified service names, as reflection and health report them.
pub mod service_names {
    pub const PLAN: &str = "palisade.v1.PlanService";
    pub const CNI: &str = "palisade.v1.CniService";
    pub const DEBUG: &str = "palisade.v1.DebugService";
    pub const NP_BACKEND: &str = "rpc.NPBackend";
}
