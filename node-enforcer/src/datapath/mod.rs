//! The node's datapath as the reconciler sees it: a handful of table and
//! attachment operations. `bpf` does them with aya on real interfaces;
//! `fake` records them in memory so the reconciler's ordering guarantees can
//! be tested exhaustively without a kernel.

pub mod addresses;
pub mod bpf;
mod error;
pub mod fake;
pub mod ifindex;
pub mod inspect;
pub mod rtnetlink;

use std::collections::{BTreeMap, BTreeSet};

use crate::compile::{PortSet, Prefix};

/// What a datapath already holds when the enforcer starts: the tables and
/// attachments a previous enforcer process left behind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Adopted {
    pub endpoints: BTreeMap<u32, EndpointEntry>,
    pub policies: BTreeMap<PolicyId, Vec<(Prefix, PortSetId)>>,
    pub portsets: BTreeMap<PortSetId, PortSet>,
    /// Interfaces that still have our programs attached, by the name they
    /// were attached by (a renamed one's is its old name), with the index
    /// of the interface the programs are on (0: not known).
    pub attached: BTreeMap<String, u32>,
    /// Names whose pinned links could not be read: kept, on an interface
    /// that cannot be said, so no endpoint entry can be told to be theirs.
    pub unlocated: BTreeSet<String>,
    /// What could not be taken over and keeps enforcing as it was (a link
    /// kept with the previous program, filters not promoted), for the
    /// dump's warnings.
    pub warnings: Vec<String>,
}

/// Most addresses one pod may have (one per family is usual); a pod with
/// more is refused rather than partly protected. The datapath's own limit.
pub use palisade_ebpf::MAX_POD_ADDRS;

/// A host interface's entry in the endpoint table. Written with one map
/// update, so a packet sees the whole old entry or the whole new one.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointEntry {
    pub ingress: PolicyId,
    pub egress: PolicyId,
    /// The pod's own addresses, IPv6 or IPv4-mapped (`::ffff:a.b.c.d`), at
    /// most [`MAX_POD_ADDRS`]. Packets the pod sends from any other source
    /// are dropped; with none, every IP packet from the pod is dropped.
    pub pod_addrs: Vec<[u8; 16]>,
}

/// An interface's entry in the audit table (the staged word of its endpoint
/// slot): the policy tables of the pod's staged (audit) policies per
/// direction, 0 where none applies. New flows are judged by them beside the enforced ones and only
/// reported, never enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditEntry {
    pub ingress: PolicyId,
    pub egress: PolicyId,
}

impl AuditEntry {
    pub fn is_none(&self) -> bool {
        self.ingress == 0 && self.egress == 0
    }
}

/// Identifies a policy set in the tables; 0 means "not isolated".
pub type PolicyId = u32;
/// Identifies a port set in the tables; 0 is the empty set (no entries).
pub type PortSetId = u32;

/// Port set ids from here up are the learner's (the port sets of learned
/// overlay entries, `bpf::learned`): the reconciler never allocates,
/// adopts or removes them, and the learner no other.
pub const LEARNED_PORTSET_BASE: PortSetId = 1 << 31;

pub use error::{DatapathError, DatapathErrorKind, Result};

/// How a pod-up attaches the programs to the pod's host interface.
///
/// `Tcx`: two TCX links at the head of its chains, pinned. The kernel
/// creates each holding RTNL through an RCU grace period, so a burst of
/// pod-ups queues on the node's grace periods.
///
/// `Fast` (the default): cls_bpf filters of the clsact qdisc, which need
/// no grace period, promoted to the links once no pod-up has come for a
/// while (`--promote-quiet-ms`) or the oldest waits too long. Until then a
/// TCX program that ran before ours could pass a packet around policy: on
/// a new pod veth, only one an earlier plugin of the chain attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachMode {
    #[default]
    Fast,
    Tcx,
}

impl std::str::FromStr for AttachMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fast" => Ok(AttachMode::Fast),
            "tcx" => Ok(AttachMode::Tcx),
            other => Err(format!("attach mode {other:?}: fast or tcx")),
        }
    }
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachMode::Fast => "fast",
            AttachMode::Tcx => "tcx",
        })
    }
}

pub trait Datapath: Send {
    /// Reads back everything already in the datapath, so a new process can
    /// take it over without a moment of unenforced traffic.
    fn adopt(&mut self) -> Result<Adopted>;
    fn add_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()>;
    fn remove_portset(&mut self, id: PortSetId, set: &PortSet) -> Result<()>;
    /// Adds entries to table `id` (a big table is written in several calls,
    /// before anything points at it).
    fn add_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()>;
    fn remove_policy(&mut self, id: PolicyId, entries: &[(Prefix, PortSetId)]) -> Result<()>;
    /// Edits a policy table that may be in use, one key at a time: every
    /// upsert in the order given, then every removal. Packets see each
    /// intermediate table, so the caller orders the writes to keep each of
    /// them safe (see `reconciler::in_place`). A failure leaves the writes
    /// before it done; the caller no longer knows the table's content.
    fn update_policy(
        &mut self,
        id: PolicyId,
        upserts: &[(Prefix, PortSetId)],
        removals: &[Prefix],
    ) -> Result<()>;
    /// Moves the chosen directions of an endpoint to a never-used epoch, so
    /// established flows are judged again by the (edited) policy on their
    /// next packet. An endpoint that does not exist is an error.
    fn renew_epochs(&mut self, ifindex: u32, ingress: bool, egress: bool) -> Result<()>;
    /// The interface's index, or an error naming it when it does not exist.
    fn ifindex(&mut self, ifname: &str) -> Result<u32>;
    /// Every interface of the node, by name, with its index.
    fn interfaces(&mut self) -> Result<BTreeMap<String, u32>>;
    /// The indexes of those of `names` that exist now (a name missing from
    /// the answer is gone). The reconciler asks this on every burst of link
    /// events, only about the interfaces it knows; a datapath that can look
    /// up one name at a time avoids listing the whole node.
    fn interfaces_named(&mut self, names: &[&str]) -> Result<BTreeMap<String, u32>> {
        let all = self.interfaces()?;
        Ok(names
            .iter()
            .filter_map(|n| all.get(*n).map(|i| (n.to_string(), *i)))
            .collect())
    }
    /// The names those of `indexes` that exist have now (an index missing
    /// from the answer is gone). Asked about interfaces whose name no
    /// longer finds them: renamed, or gone.
    fn interfaces_indexed(&mut self, indexes: &[u32]) -> Result<BTreeMap<u32, String>> {
        Ok(self
            .interfaces()?
            .into_iter()
            .filter(|(_, i)| indexes.contains(i))
            .map(|(n, i)| (i, n))
            .collect())
    }
    /// Attaches both programs to the interface; attaching twice is a no-op.
    /// Once it returns, the interface's packets are judged by our programs:
    /// by filters first where the datapath attaches fast, to be promoted.
    fn attach(&mut self, ifname: &str, ifindex: u32) -> Result<()>;
    /// Detaches both programs; an interface that is already gone is fine.
    fn detach(&mut self, ifname: &str, ifindex: u32) -> Result<()>;
    /// Interfaces attached fast and not yet promoted, with their index
    /// and since when, oldest first.
    fn unpromoted(&self) -> Vec<(String, u32, std::time::Instant)> {
        Vec::new()
    }
    /// Moves an interface from the fast attachment to links at the head of
    /// its chains (no-op when it has them, or is gone).
    fn promote(&mut self, _ifname: &str) -> Result<()> {
        Ok(())
    }
    fn set_endpoint(&mut self, ifindex: u32, entry: &EndpointEntry) -> Result<()>;
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()>;
    /// The node's own addresses (every address in the node's network
    /// namespace), which policy never blocks.
    fn node_addresses(&mut self) -> Result<Vec<std::net::IpAddr>>;
    /// Where the datapath pins its objects, for the debug dump.
    fn describe(&self) -> String;
    // Staged (audit) policies. The defaults are for datapaths without an
    // audit table (wrappers in tests and benchmarks): audit then fails
    // visibly and is skipped, which never touches enforcement.

    /// Points an interface's staged (audit) policies at tables, with one
    /// write; the tables must exist. Never read by enforcement.
    fn set_audit(&mut self, ifindex: u32, _entry: &AuditEntry) -> Result<()> {
        Err(no_audit_table(ifindex))
    }
    /// Whether the interface's pod learns addresses by domain name (its
    /// egress consults the learned overlay); the endpoint must exist.
    fn set_learns(&mut self, _ifindex: u32, _learns: bool) -> Result<()> {
        Ok(())
    }
    /// Removes an interface's audit entry; one that is not there is fine.
    fn remove_audit(&mut self, _ifindex: u32) -> Result<()> {
        Ok(())
    }
    /// Every audit entry, by ifindex (what a previous process left).
    fn audit_entries(&mut self) -> Result<BTreeMap<u32, AuditEntry>> {
        Ok(BTreeMap::new())
    }
}

fn no_audit_table(ifindex: u32) -> DatapathError {
    DatapathError::invariant(format!(
        "audit entry for ifindex {ifindex}: this datapath has no audit table"
    ))
}
