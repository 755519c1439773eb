//! Egress by domain name: what the enforcer learns from the DNS answers
//! its pods receive (docs/DESIGN.md, "Egress by domain name").
//!
//! The datapath copies a learning pod's queries to trusted servers and
//! holds their answers; this module turns those frames into the pod's
//! overlay entries. [`frame`] reads the datagram out of a frame (IP
//! fragments put back together), [`rules`] numbers a pod's rules by
//! name, and [`learner`] matches answers to queries and says which
//! overlay entries to write. It does no I/O: the enforcer's learner task
//! ([`task`]) reads the ring buffer, writes the maps and re-injects the
//! answers, and answers [`report`]'s requests for the dump and metrics.

pub mod frame;
pub mod learner;
pub mod reinject;
pub mod report;
pub mod rules;
pub mod task;

use std::sync::Arc;

use palisade_proto::v1::DirectionPolicy;

/// A pod's egress policy as its table was compiled from it, and its
/// staged (audit) egress, when either has rules by domain name: what the
/// learner compiles learned addresses with.
#[derive(Clone, Debug, PartialEq)]
pub struct Egress {
    pub enforced: Arc<DirectionPolicy>,
    pub staged: Option<Arc<DirectionPolicy>>,
}

// A plan's policy holds no floating-point field: equality is total.
impl Eq for Egress {}
