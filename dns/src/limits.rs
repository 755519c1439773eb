//! The caps and TTL bounds of learning, per pod so that no pod's queries
//! or answers can push out what another pod learned. The enforcer sets
//! them from its flags (the chart's values); the defaults are here only.

/// Caps and TTL bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// An address is allowed for at least this long after its answer, even
    /// when the TTL is shorter (0, and load-balancer TTLs of 1 s, are common:
    /// the client connects after the answer, not within its TTL).
    pub min_ttl_s: u32,
    /// And at most this long, whatever the TTL says.
    pub max_ttl_s: u32,
    /// Names remembered per pod (for a rule change, the dump, a restart);
    /// beyond it the least recently answered name is forgotten.
    pub names_per_pod: usize,
    /// Addresses remembered per name; beyond it the one expiring soonest
    /// is dropped from the name.
    pub addrs_per_name: usize,
    /// Datapath entries (rule, address) per pod; beyond it the entry that
    /// expires soonest is removed, and counted.
    pub entries_per_pod: usize,
    /// Queries awaiting their answer per pod; beyond it the oldest is
    /// forgotten (its answer then teaches nothing), and counted.
    pub pending_per_pod: usize,
    /// A query's answer must come within this long.
    pub query_timeout_s: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            min_ttl_s: 5,
            max_ttl_s: 24 * 3600,
            names_per_pod: 1024,
            addrs_per_name: 256,
            entries_per_pod: 8192,
            pending_per_pod: 256,
            query_timeout_s: 10,
        }
    }
}

impl Limits {
    /// How long an answer's TTL lets an address be reached, in seconds.
    pub fn ttl(&self, ttl_s: u32) -> u32 {
        ttl_s.clamp(self.min_ttl_s, self.max_ttl_s.max(self.min_ttl_s))
    }
}
