//! Leader election over a coordination.k8s.io/v1 Lease: only the leader
//! serves plans, and every plan carries the leader's term.

pub mod decide;
pub mod lease;
pub mod role;

pub use decide::{Elector, Timings, TimingsError};
pub use role::{Leadership, NotLeader, Role, Serving};
