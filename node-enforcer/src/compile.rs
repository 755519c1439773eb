//! Compiles one direction of a pod's plan into the content of the datapath's
//! lookup tables: a longest-prefix-match table from peer prefix to a set of
//! allowed ports. Pure: the same policy always compiles to the same value, so
//! pods whose policies compile equal can share one table (DESIGN invariant 3).
//!
//! The LPM table must give, for every address, exactly the union of the rules
//! that allow it. For every prefix the policy mentions (a CIDR or an except),
//! the addresses whose longest match is that prefix are inside it and outside
//! every longer mentioned prefix, so whether a rule's block contains them is
//! decided by containment of whole prefixes. That makes the table exact: an
//! `except` of one rule only removes what that rule allowed, never what
//! another allows.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

use palisade_proto::v1::{DirectionPolicy, IpPrefix, PortRange, Protocol};

mod tiers;
pub use tiers::{host_port_set, HostCompiler, Named};

/// An address prefix in the datapath's single family: IPv4 is IPv4-mapped
/// IPv6, so one table serves both.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Prefix {
    pub addr: [u8; 16],
    /// 0..=128, in IPv6 bits.
    pub len: u8,
}

impl Prefix {
    pub fn new(addr: [u8; 16], len: u8) -> Self {
        Prefix {
            addr: mask(addr, len),
            len,
        }
    }

    pub fn from_ip(ip: IpAddr, len: u8) -> Self {
        match ip {
            IpAddr::V4(v4) => Prefix::new(v4.to_ipv6_mapped().octets(), len + 96),
            IpAddr::V6(v6) => Prefix::new(v6.octets(), len),
        }
    }

    pub fn contains(&self, other: &Prefix) -> bool {
        self.len <= other.len && mask(other.addr, self.len) == self.addr
    }

    /// A wire prefix, checked: an address of 4 or 16 bytes and a length
    /// that fits it.
    pub fn from_wire(p: &IpPrefix) -> Result<Prefix, CompileError> {
        let ip = p
            .ip()
            .ok_or_else(|| CompileError::AddressLength(p.addr.clone()))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if p.prefix_len > max {
            return Err(CompileError::PrefixLength {
                addr: ip.to_string(),
                len: p.prefix_len,
            });
        }
        Ok(Prefix::from_ip(ip, p.prefix_len as u8))
    }

    /// The wire's form: an IPv4-mapped prefix as IPv4.
    pub fn to_wire(&self) -> IpPrefix {
        let v6 = Ipv6Addr::from(self.addr);
        match v6.to_ipv4_mapped() {
            Some(v4) if self.len >= 96 => IpPrefix::new(IpAddr::V4(v4), self.len - 96),
            _ => IpPrefix::new(IpAddr::V6(v6), self.len),
        }
    }

    /// The address and prefix length as operators write them.
    pub fn display(&self) -> String {
        let v6 = Ipv6Addr::from(self.addr);
        match v6.to_ipv4_mapped() {
            Some(v4) if self.len >= 96 => format!("{v4}/{}", self.len - 96),
            _ => format!("{v6}/{}", self.len),
        }
    }
}

fn mask(mut addr: [u8; 16], len: u8) -> [u8; 16] {
    for (i, byte) in addr.iter_mut().enumerate() {
        let bits = (len as usize).saturating_sub(i * 8).min(8);
        *byte &= if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    addr
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CompileError {
    #[error("address {0:?} is neither 4 (IPv4) nor 16 (IPv6) bytes long")]
    AddressLength(Vec<u8>),
    #[error("prefix length {len} is too long for {addr}")]
    PrefixLength { addr: String, len: u32 },
    #[error("a peer block has no cidr")]
    MissingCidr,
    #[error("unknown protocol number {0}")]
    Protocol(i32),
    #[error("port {port}..{end} is not a valid range within 1-65535")]
    PortRange { port: u32, end: u32 },
    #[error("the table would have {entries} entries, more than the {limit} one table may have (--max-table-entries); from NetworkPolicy {policies}")]
    TooLarge {
        entries: usize,
        limit: usize,
        /// The policies its rules come from (namespace/name), comma separated.
        policies: String,
    },
}

/// Most entries one compiled table may have. The node's policy maps hold
/// [`palisade_ebpf::MAX_POLICY_ENTRIES`] in all, and a table replaced by a
/// new one is written before the old one goes (make before break), so one
/// table may use at most half of them.
pub const MAX_TABLE_ENTRIES: usize = palisade_ebpf::MAX_POLICY_ENTRIES as usize / 2;

/// [`compile`], refusing a table of more than `max_entries` entries with an
/// error naming the policies its rules come from.
pub fn compile_limited(
    policy: &DirectionPolicy,
    always_allowed: &[Prefix],
    max_entries: usize,
) -> Result<PolicySet, CompileError> {
    let set = compile(policy, always_allowed)?;
    if set.entries.len() > max_entries {
        let names: BTreeSet<&str> = policy
            .rules
            .iter()
            .map(|r| r.policy.as_str())
            .chain(
                policy
                    .admin
                    .iter()
                    .chain(&policy.baseline)
                    .map(|r| r.policy.as_str()),
            )
            .filter(|p| !p.is_empty())
            .collect();
        return Err(CompileError::TooLarge {
            entries: set.entries.len(),
            limit: max_entries,
            policies: names.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    Ok(set)
}

/// One entry of a port table: protocol `proto` (unless `any_proto`) and the
/// ports matching `port` on its first `port_bits` bits.
///
/// The table is a longest-prefix match over (protocol, port): the most
/// specific entry of a set decides. NetworkPolicy sets only allow (a miss
/// denies); a tiered set (`compile::tiers`) may deny a protocol or a block
/// inside what a less specific entry allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortEntry {
    /// Every protocol, every port: a rule without ports.
    Any,
    /// Every port of one protocol.
    Proto(u8),
    /// A block of ports of one protocol, as the LPM table stores it.
    Block { proto: u8, port: u16, bits: u8 },
    /// Denies every port of one protocol (under an allowing `Any`).
    DenyProto(u8),
    /// Denies a block of ports (under an allowing `Any` or `Proto`).
    DenyBlock { proto: u8, port: u16, bits: u8 },
}

impl PortEntry {
    /// Whether a packet this entry matches is allowed.
    pub fn allows(&self) -> bool {
        matches!(
            self,
            PortEntry::Any | PortEntry::Proto(_) | PortEntry::Block { .. }
        )
    }

    /// (protocol or None for every protocol, port, bits of the port that
    /// are fixed): where it sits in the table.
    pub fn key(&self) -> (Option<u8>, u16, u8) {
        match *self {
            PortEntry::Any => (None, 0, 0),
            PortEntry::Proto(p) | PortEntry::DenyProto(p) => (Some(p), 0, 0),
            PortEntry::Block { proto, port, bits } | PortEntry::DenyBlock { proto, port, bits } => {
                (Some(proto), port, bits)
            }
        }
    }

    /// How specific it is: its key's length in the table.
    fn specificity(&self) -> u32 {
        match self.key() {
            (None, _, _) => 0,
            (Some(_), _, bits) => 1 + u32::from(bits),
        }
    }

    fn matches(&self, proto: u8, port: u16) -> bool {
        match self.key() {
            (None, _, _) => true,
            (Some(p), start, bits) => {
                p == proto
                    && (bits == 0
                        || (u32::from(port) >> (16 - bits)) == (u32::from(start) >> (16 - bits)))
            }
        }
    }
}

/// The ports a prefix allows. Empty means nothing is allowed: such an entry
/// exists only to stop a shorter prefix from matching.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortSet(pub BTreeSet<PortEntry>);

impl PortSet {
    fn add_range(&mut self, r: &PortRange) -> Result<(), CompileError> {
        let proto = match Protocol::try_from(r.protocol) {
            Ok(Protocol::Tcp) => 6u8,
            Ok(Protocol::Udp) => 17,
            Ok(Protocol::Sctp) => 132,
            _ => return Err(CompileError::Protocol(r.protocol)),
        };
        if r.port == 0 {
            self.0.insert(PortEntry::Proto(proto));
            return Ok(());
        }
        let end = if r.end_port == 0 { r.port } else { r.end_port };
        if r.port > 65535 || end > 65535 || end < r.port {
            return Err(CompileError::PortRange { port: r.port, end });
        }
        for (port, bits) in palisade_ebpf::port_prefixes(r.port as u16, end as u16) {
            self.0.insert(PortEntry::Block { proto, port, bits });
        }
        Ok(())
    }

    /// Drops entries another entry already covers, so equal sets of allowed
    /// ports have one representation.
    fn normalize(&mut self) {
        if self.0.contains(&PortEntry::Any) {
            self.0 = BTreeSet::from([PortEntry::Any]);
            return;
        }
        let protos: BTreeSet<u8> = self
            .0
            .iter()
            .filter_map(|e| match e {
                PortEntry::Proto(p) => Some(*p),
                _ => None,
            })
            .collect();
        let blocks: Vec<(u8, u16, u8)> = self
            .0
            .iter()
            .filter_map(|e| match e {
                PortEntry::Block { proto, port, bits } => Some((*proto, *port, *bits)),
                _ => None,
            })
            .collect();
        self.0.retain(|e| match e {
            PortEntry::Block { proto, port, bits } => {
                !protos.contains(proto)
                    && !blocks.iter().any(|(p2, port2, bits2)| {
                        p2 == proto
                            && bits2 < bits
                            && (u32::from(*port) >> (16 - u32::from(*bits2)))
                                == (u32::from(*port2) >> (16 - u32::from(*bits2)))
                    })
            }
            _ => true,
        });
    }

    /// Whether this set allows everything `other` allows. Exact for sets
    /// that only allow (NetworkPolicy's); a set with denying entries is
    /// answered no unless the two are equal, which can only over-report a
    /// narrowing (established flows are judged again, never wrongly kept).
    pub fn allows_all_of(&self, other: &PortSet) -> bool {
        if self == other {
            return true;
        }
        if self.0.iter().chain(&other.0).any(|e| !e.allows()) {
            return false;
        }
        if self.0.contains(&PortEntry::Any) {
            return true;
        }
        other.0.iter().all(|e| match e.key() {
            // Every protocol: only `Any` covers it.
            (None, _, _) => false,
            (Some(proto), port, bits) => self.0.iter().any(|mine| match mine.key() {
                (None, _, _) => true,
                (Some(p), start, my_bits) => {
                    p == proto
                        && my_bits <= bits
                        && (my_bits == 0
                            || (u32::from(port) >> (16 - my_bits))
                                == (u32::from(start) >> (16 - my_bits)))
                }
            }),
        })
    }

    /// The set's verdict for a packet, as the datapath's longest-prefix
    /// match gives it: the most specific matching entry decides; none
    /// denies.
    pub fn allows(&self, proto: u8, port: u16) -> bool {
        self.0
            .iter()
            .filter(|e| e.matches(proto, port))
            .max_by_key(|e| e.specificity())
            .is_some_and(PortEntry::allows)
    }
}

/// A compiled direction of a policy: what the LPM table holds for it.
/// Compared, ordered and hashed by its entries alone.
#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    pub entries: BTreeMap<Prefix, PortSet>,
    /// [`PolicySet::id`], computed once: a dump names every table, and
    /// naming one of 100,000 entries reads all of them.
    id: std::sync::OnceLock<String>,
}

impl PartialEq for PolicySet {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Eq for PolicySet {}

impl PartialOrd for PolicySet {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PolicySet {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.entries.cmp(&other.entries)
    }
}

impl std::hash::Hash for PolicySet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.entries.hash(state);
    }
}

impl PolicySet {
    pub fn new(entries: BTreeMap<Prefix, PortSet>) -> Self {
        PolicySet {
            entries,
            id: Default::default(),
        }
    }

    /// The table's verdict for a peer address, protocol and port: the
    /// longest matching prefix decides. Used by tests and as a model of the
    /// datapath.
    pub fn allows(&self, peer: IpAddr, proto: u8, port: u16) -> bool {
        let addr = Prefix::from_ip(peer, if peer.is_ipv4() { 32 } else { 128 });
        self.entries
            .iter()
            .filter(|(p, _)| p.contains(&addr))
            .max_by_key(|(p, _)| p.len)
            .is_some_and(|(_, ports)| ports.allows(proto, port))
    }

    /// A short stable name for operators, derived from the content.
    pub fn id(&self) -> String {
        self.id.get_or_init(|| self.compute_id()).clone()
    }

    fn compute_id(&self) -> String {
        // FNV-1a over the Debug form: stable across runs and builds, unlike
        // RandomState, and this is a label, not a security boundary. The
        // form is streamed into the hash: a table of 100,000 entries would
        // otherwise build a 10 MB string for every dump.
        struct Fnv(u64);
        impl std::fmt::Write for Fnv {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                for b in s.bytes() {
                    self.0 ^= u64::from(b);
                    self.0 = self.0.wrapping_mul(0x100000001b3);
                }
                Ok(())
            }
        }
        let mut h = Fnv(0xcbf29ce484222325);
        let _ = std::fmt::Write::write_fmt(&mut h, format_args!("{:?}", self.entries));
        format!("ps-{:016x}", h.0)
    }
}

/// The excepts of one peer block, sorted, with the lengths they use, so
/// whether one of them contains a prefix is a binary search per length,
/// not a scan (a block of 0.0.0.0/0 with 100,000 excepts would make
/// compiling it quadratic).
struct Excepts {
    sorted: Vec<Prefix>,
    lens: Vec<u8>,
}

impl Excepts {
    fn new(mut sorted: Vec<Prefix>) -> Self {
        sorted.sort_unstable();
        sorted.dedup();
        let mut lens: Vec<u8> = sorted.iter().map(|p| p.len).collect();
        lens.sort_unstable();
        lens.dedup();
        Excepts { sorted, lens }
    }

    fn contain(&self, p: &Prefix) -> bool {
        self.lens
            .iter()
            .take_while(|&&len| len <= p.len)
            .any(|&len| self.sorted.binary_search(&Prefix::new(p.addr, len)).is_ok())
    }
}

/// A peer block's CIDR and excepts as prefixes.
fn block_of(peer: &palisade_proto::v1::PeerBlock) -> Result<(Prefix, Vec<Prefix>), CompileError> {
    let cidr = Prefix::from_wire(peer.cidr.as_ref().ok_or(CompileError::MissingCidr)?)?;
    let except = peer
        .except
        .iter()
        .map(Prefix::from_wire)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((cidr, except))
}

/// Every block of every rule by its CIDR: the blocks containing a prefix
/// are found by masking it to each CIDR length the policy uses, so a
/// mentioned prefix costs the lengths and the blocks that contain it, not
/// a visit of every rule (a policy of 100,000 rules made compiling it
/// quadratic: every prefix asked every rule).
struct BlockIndex {
    /// CIDR -> (port set, excepts) of the blocks with that CIDR.
    by_cidr: std::collections::HashMap<Prefix, Vec<(usize, Excepts)>>,
    lens: Vec<u8>,
}

impl BlockIndex {
    fn new(blocks: Vec<(usize, Prefix, Vec<Prefix>)>) -> Self {
        let mut by_cidr: std::collections::HashMap<Prefix, Vec<(usize, Excepts)>> =
            std::collections::HashMap::with_capacity(blocks.len());
        for (rule, cidr, except) in blocks {
            by_cidr
                .entry(cidr)
                .or_default()
                .push((rule, Excepts::new(except)));
        }
        let mut lens: Vec<u8> = by_cidr.keys().map(|c| c.len).collect();
        lens.sort_unstable();
        lens.dedup();
        BlockIndex { by_cidr, lens }
    }

    /// The port sets of the blocks that contain `p` outside their
    /// excepts, sorted and distinct.
    fn covering(&self, p: &Prefix, out: &mut Vec<usize>) {
        out.clear();
        for &len in self.lens.iter().take_while(|&&len| len <= p.len) {
            if let Some(blocks) = self.by_cidr.get(&Prefix::new(p.addr, len)) {
                out.extend(
                    blocks
                        .iter()
                        .filter(|(_, except)| !except.contain(p))
                        .map(|(rule, _)| *rule),
                );
            }
        }
        out.sort_unstable();
        out.dedup();
    }
}

/// Compiles a direction of a pod's policy. `always_allowed` are peers no
/// policy can block: upstream NetworkPolicy always allows traffic between a
/// pod and its own node (kubelet probes, for one).
///
/// Near-linear in the policy's size: every step is a sort, a hash lookup
/// per prefix length, or a pass over the prefixes.
pub fn compile(
    policy: &DirectionPolicy,
    always_allowed: &[Prefix],
) -> Result<PolicySet, CompileError> {
    if tiers::is_tiered(policy) {
        return tiers::compile_tiered(policy, always_allowed);
    }
    // Every block tagged with its rule's ports, as an index into the
    // distinct port sets: rules of a big policy mostly allow the same ports.
    let mut port_sets: Vec<PortSet> = Vec::new();
    let mut port_ids: std::collections::HashMap<PortSet, usize> = Default::default();
    let mut intern = |ports: PortSet| -> usize {
        *port_ids.entry(ports).or_insert_with_key(|ports| {
            port_sets.push(ports.clone());
            port_sets.len() - 1
        })
    };
    let mut blocks: Vec<(usize, Prefix, Vec<Prefix>)> = Vec::new();
    let mut mentioned: Vec<Prefix> = Vec::new();
    if !always_allowed.is_empty() {
        let any = intern(PortSet(BTreeSet::from([PortEntry::Any])));
        mentioned.extend(always_allowed.iter().copied());
        blocks.extend(always_allowed.iter().map(|p| (any, *p, vec![])));
    }
    for rule in &policy.rules {
        let mut ports = PortSet::default();
        if rule.ports.is_empty() {
            ports.0.insert(PortEntry::Any);
        }
        for r in &rule.ports {
            ports.add_range(r)?;
        }
        let index = intern(ports);
        for peer in &rule.peers {
            let (cidr, except) = block_of(peer)?;
            mentioned.push(cidr);
            mentioned.extend(except.iter().copied());
            blocks.push((index, cidr, except));
        }
    }
    mentioned.sort_unstable();
    mentioned.dedup();

    let index = BlockIndex::new(blocks);
    // Prefixes covered by blocks of the same port sets get the same ports:
    // their union is computed once per distinct combination.
    let mut unions: std::collections::HashMap<Vec<usize>, PortSet> = Default::default();
    let mut covering = Vec::new();
    let mut entries: Vec<(Prefix, PortSet)> = Vec::with_capacity(mentioned.len());
    for p in &mentioned {
        index.covering(p, &mut covering);
        let ports = match unions.get(&covering) {
            Some(ports) => ports.clone(),
            None => {
                let mut ports = PortSet::default();
                for &id in &covering {
                    ports.0.extend(port_sets[id].0.iter().copied());
                }
                ports.normalize();
                unions.insert(covering.clone(), ports.clone());
                ports
            }
        };
        entries.push((*p, ports));
    }
    // An entry that allows nothing matters only below a prefix that allows
    // something; elsewhere a miss already denies.
    let allowing: std::collections::HashSet<Prefix> = entries
        .iter()
        .filter(|(_, ports)| !ports.0.is_empty())
        .map(|(p, _)| *p)
        .collect();
    let mut allowing_lens: Vec<u8> = allowing.iter().map(|p| p.len).collect();
    allowing_lens.sort_unstable();
    allowing_lens.dedup();
    entries.retain(|(p, ports)| {
        !ports.0.is_empty()
            || allowing_lens
                .iter()
                .take_while(|&&len| len < p.len)
                .any(|&len| allowing.contains(&Prefix::new(p.addr, len)))
    });
    // Sorted and distinct already: the map is built in one pass.
    Ok(PolicySet::new(entries.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_proto::v1::{PeerBlock, Rule};
    use std::net::Ipv4Addr;

    fn p(s: &str) -> IpPrefix {
        let net: ipnet::IpNet = s.parse().unwrap();
        IpPrefix {
            addr: match net.addr() {
                IpAddr::V4(a) => a.octets().to_vec(),
                IpAddr::V6(a) => a.octets().to_vec(),
            },
            prefix_len: net.prefix_len().into(),
        }
    }

    fn block(cidr: &str, except: &[&str]) -> PeerBlock {
        PeerBlock {
            cidr: Some(p(cidr)),
            except: except.iter().map(|e| p(e)).collect(),
        }
    }

    fn tcp(port: u32, end: u32) -> PortRange {
        PortRange {
            protocol: Protocol::Tcp as i32,
            port,
            end_port: end,
        }
    }

    fn compile_(p: &DirectionPolicy) -> Result<PolicySet, CompileError> {
        compile(p, &[])
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn no_rules_denies_everything() {
        let set = compile_(&DirectionPolicy {
            rules: vec![],
            ..Default::default()
        })
        .unwrap();
        assert!(set.entries.is_empty());
        assert!(!set.allows(ip("10.0.0.1"), 6, 80));
    }

    #[test]
    fn cidr_and_port_range() {
        let set = compile_(&DirectionPolicy {
            rules: vec![Rule {
                peers: vec![block("10.0.0.0/24", &[])],
                ports: vec![tcp(1000, 1999)],
                ..Default::default()
            }],
            ..Default::default()
        })
        .unwrap();
        assert!(set.allows(ip("10.0.0.7"), 6, 1000));
        assert!(set.allows(ip("10.0.0.7"), 6, 1999));
        assert!(!set.allows(ip("10.0.0.7"), 6, 999));
        assert!(!set.allows(ip("10.0.0.7"), 6, 2000));
        assert!(!set.allows(ip("10.0.0.7"), 17, 1000));
        assert!(!set.allows(ip("10.0.1.7"), 6, 1000));
    }

    #[test]
    fn except_in_one_rule_never_blocks_what_another_allows() {
        let set = compile_(&DirectionPolicy {
            rules: vec![
                Rule {
                    peers: vec![block("10.0.0.0/8", &["10.1.0.0/16"])],
                    ports: vec![],
                    ..Default::default()
                },
                Rule {
                    peers: vec![block("10.1.2.0/24", &[])],
                    ports: vec![tcp(443, 0)],
                    ..Default::default()
                },
            ],
            ..Default::default()
        })
        .unwrap();
        assert!(
            set.allows(ip("10.2.0.1"), 17, 53),
            "rule 1 allows all ports"
        );
        assert!(
            !set.allows(ip("10.1.3.1"), 6, 443),
            "excepted, no other rule"
        );
        assert!(
            set.allows(ip("10.1.2.1"), 6, 443),
            "rule 2 inside rule 1's except"
        );
        assert!(!set.allows(ip("10.1.2.1"), 6, 80));
    }

    #[test]
    fn more_than_24_ports_per_cidr() {
        let ports: Vec<PortRange> = (0..100).map(|i| tcp(2000 + i * 3, 0)).collect();
        let set = compile_(&DirectionPolicy {
            rules: vec![Rule {
                peers: vec![block("0.0.0.0/0", &[])],
                ports,
                ..Default::default()
            }],
            ..Default::default()
        })
        .unwrap();
        for i in 0..100 {
            assert!(set.allows(ip("1.2.3.4"), 6, 2000 + i * 3));
            assert!(!set.allows(ip("1.2.3.4"), 6, 2001 + i * 3));
        }
    }

    #[test]
    fn ipv6_and_ipv4_do_not_mix() {
        let set = compile_(&DirectionPolicy {
            rules: vec![Rule {
                peers: vec![block("fd00::/64", &[])],
                ports: vec![],
                ..Default::default()
            }],
            ..Default::default()
        })
        .unwrap();
        assert!(set.allows(ip("fd00::1"), 6, 1));
        assert!(!set.allows(ip("10.0.0.1"), 6, 1));
        let set = compile_(&DirectionPolicy {
            rules: vec![Rule {
                peers: vec![block("0.0.0.0/0", &[])],
                ports: vec![],
                ..Default::default()
            }],
            ..Default::default()
        })
        .unwrap();
        assert!(set.allows(ip("10.0.0.1"), 6, 1));
        assert!(!set.allows(ip("fd00::1"), 6, 1), "0.0.0.0/0 is IPv4 only");
    }

    #[test]
    fn equal_policies_compile_equal_whatever_the_rule_order() {
        let a = Rule {
            peers: vec![block("10.0.0.0/24", &[])],
            ports: vec![tcp(80, 0), tcp(80, 80)],
            ..Default::default()
        };
        let b = Rule {
            peers: vec![block("10.0.0.0/24", &[])],
            ports: vec![tcp(1, 65535)],
            ..Default::default()
        };
        let one = compile_(&DirectionPolicy {
            rules: vec![a.clone(), b.clone()],
            ..Default::default()
        })
        .unwrap();
        let two = compile_(&DirectionPolicy {
            rules: vec![b, a],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(one, two);
        assert_eq!(one.id(), two.id());
    }

    #[test]
    fn bad_input_is_an_error() {
        let bad_addr = DirectionPolicy {
            rules: vec![Rule {
                peers: vec![PeerBlock {
                    cidr: Some(IpPrefix {
                        addr: vec![1, 2, 3],
                        prefix_len: 8,
                    }),
                    except: vec![],
                }],
                ports: vec![],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(
            compile_(&bad_addr),
            Err(CompileError::AddressLength(_))
        ));
        let bad_len = DirectionPolicy {
            rules: vec![Rule {
                peers: vec![PeerBlock {
                    cidr: Some(IpPrefix {
                        addr: vec![1, 2, 3, 4],
                        prefix_len: 33,
                    }),
                    except: vec![],
                }],
                ports: vec![],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(
            compile_(&bad_len),
            Err(CompileError::PrefixLength { .. })
        ));
        let bad_port = DirectionPolicy {
            rules: vec![Rule {
                peers: vec![block("10.0.0.0/8", &[])],
                ports: vec![tcp(90, 80)],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(
            compile_(&bad_port),
            Err(CompileError::PortRange { .. })
        ));
    }

    /// Exhaustive check against a direct reading of the rules, on a small
    /// address space where every address can be tried.
    #[test]
    fn lpm_table_equals_rule_union_for_every_address() {
        let rules = vec![
            Rule {
                peers: vec![block("10.0.0.0/28", &["10.0.0.8/29", "10.0.0.4/31"])],
                ports: vec![tcp(80, 0)],
                ..Default::default()
            },
            Rule {
                peers: vec![
                    block("10.0.0.8/30", &["10.0.0.9/32"]),
                    block("10.0.0.0/26", &["10.0.0.0/27"]),
                ],
                ports: vec![tcp(81, 82)],
                ..Default::default()
            },
            Rule {
                peers: vec![block("10.0.0.4/32", &[])],
                ports: vec![],
                ..Default::default()
            },
        ];
        let set = compile_(&DirectionPolicy {
            rules: rules.clone(),
            ..Default::default()
        })
        .unwrap();
        for last in 0u8..=70 {
            let addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, last));
            for port in [79u16, 80, 81, 82, 83] {
                let host = Prefix::from_ip(addr, 32);
                let expected = rules.iter().any(|r| {
                    let in_peer = r.peers.iter().any(|b| {
                        Prefix::from_wire(b.cidr.as_ref().unwrap())
                            .unwrap()
                            .contains(&host)
                            && !b
                                .except
                                .iter()
                                .any(|e| Prefix::from_wire(e).unwrap().contains(&host))
                    });
                    let in_ports = r.ports.is_empty()
                        || r.ports.iter().any(|pr| {
                            let end = if pr.end_port == 0 {
                                pr.port
                            } else {
                                pr.end_port
                            };
                            (pr.port..=end).contains(&u32::from(port))
                        });
                    in_peer && in_ports
                });
                assert_eq!(set.allows(addr, 6, port), expected, "{addr} port {port}");
            }
        }
    }

    #[test]
    fn the_node_is_always_allowed_even_inside_an_except() {
        let node = [Prefix::from_ip(ip("10.1.0.1"), 32)];
        let deny_all = compile(
            &DirectionPolicy {
                rules: vec![],
                ..Default::default()
            },
            &node,
        )
        .unwrap();
        assert!(deny_all.allows(ip("10.1.0.1"), 6, 10250));
        assert!(deny_all.allows(ip("10.1.0.1"), 1, 0), "ICMP too");
        assert!(!deny_all.allows(ip("10.1.0.2"), 6, 10250));
        let except = compile(
            &DirectionPolicy {
                rules: vec![Rule {
                    peers: vec![block("10.0.0.0/8", &["10.1.0.0/16"])],
                    ports: vec![tcp(80, 0)],
                    ..Default::default()
                }],
                ..Default::default()
            },
            &node,
        )
        .unwrap();
        assert!(except.allows(ip("10.1.0.1"), 17, 53));
        assert!(!except.allows(ip("10.1.0.2"), 6, 80));
        assert!(except.allows(ip("10.2.0.2"), 6, 80));
    }

    /// The compilation as first written: every block scanned for every
    /// mentioned prefix (quadratic, obviously right). The indexed one must give
    /// exactly its tables.
    fn compile_by_scan(policy: &DirectionPolicy, always: &[Prefix]) -> PolicySet {
        type Blocks = Vec<(Prefix, Vec<Prefix>)>;
        let mut rules: Vec<(Blocks, PortSet)> = Vec::new();
        let mut mentioned = BTreeSet::new();
        if !always.is_empty() {
            mentioned.extend(always.iter().copied());
            rules.push((
                always.iter().map(|p| (*p, vec![])).collect(),
                PortSet(BTreeSet::from([PortEntry::Any])),
            ));
        }
        for rule in &policy.rules {
            let mut ports = PortSet::default();
            if rule.ports.is_empty() {
                ports.0.insert(PortEntry::Any);
            }
            for r in &rule.ports {
                ports.add_range(r).unwrap();
            }
            let mut blocks = Vec::new();
            for peer in &rule.peers {
                let cidr = Prefix::from_wire(peer.cidr.as_ref().unwrap()).unwrap();
                let except: Vec<Prefix> = peer
                    .except
                    .iter()
                    .map(|e| Prefix::from_wire(e).unwrap())
                    .collect();
                mentioned.insert(cidr);
                mentioned.extend(except.iter().copied());
                blocks.push((cidr, except));
            }
            rules.push((blocks, ports));
        }
        let mut entries = BTreeMap::new();
        for p in &mentioned {
            let mut ports = PortSet::default();
            for (blocks, rule_ports) in &rules {
                if blocks
                    .iter()
                    .any(|(c, ex)| c.contains(p) && !ex.iter().any(|e| e.contains(p)))
                {
                    ports.0.extend(rule_ports.0.iter().copied());
                }
            }
            ports.normalize();
            entries.insert(*p, ports);
        }
        let keep: Vec<Prefix> = entries
            .iter()
            .filter(|(p, ports)| {
                !ports.0.is_empty()
                    || entries
                        .iter()
                        .any(|(q, qp)| q.len < p.len && q.contains(p) && !qp.0.is_empty())
            })
            .map(|(p, _)| *p)
            .collect();
        entries.retain(|p, _| keep.contains(p));
        PolicySet::new(entries)
    }

    #[test]
    fn indexed_compilation_equals_the_scan_on_random_policies() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut below = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..3000 {
            let random_prefix = |below: &mut dyn FnMut(u64) -> u64| {
                let len = 24 + below(9) as u32;
                let last = (below(256) as u32) & !((1u32 << (32 - len)).wrapping_sub(1)) & 0xff;
                p(&format!("10.0.0.{last}/{len}"))
            };
            let rules: Vec<Rule> = (0..below(4))
                .map(|_| Rule {
                    peers: (0..below(5))
                        .map(|_| PeerBlock {
                            cidr: Some(random_prefix(&mut below)),
                            except: (0..below(3)).map(|_| random_prefix(&mut below)).collect(),
                        })
                        .collect(),
                    ports: (0..below(3))
                        .map(|_| {
                            let port = 1 + below(100) as u32;
                            tcp(
                                port,
                                if below(2) == 0 {
                                    0
                                } else {
                                    port + below(50) as u32
                                },
                            )
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect();
            let always: Vec<Prefix> = (0..below(2))
                .map(|_| Prefix::from_wire(&random_prefix(&mut below)).unwrap())
                .collect();
            let policy = DirectionPolicy {
                rules,
                ..Default::default()
            };
            assert_eq!(
                compile(&policy, &always).unwrap(),
                compile_by_scan(&policy, &always),
                "{policy:?} {always:?}"
            );
        }
    }

    #[test]
    fn a_table_over_the_limit_is_refused_naming_its_policies() {
        let rule = |a: u8, policy: &str| palisade_proto::v1::Rule {
            peers: vec![palisade_proto::v1::PeerBlock {
                cidr: Some(palisade_proto::v1::IpPrefix {
                    addr: vec![10, 0, 0, a],
                    prefix_len: 32,
                }),
                except: vec![],
            }],
            policy: policy.into(),
            ..Default::default()
        };
        let d = DirectionPolicy {
            rules: vec![rule(1, "x/b"), rule(2, "x/a"), rule(3, "x/b")],
            ..Default::default()
        };
        assert_eq!(compile_limited(&d, &[], 3).unwrap().entries.len(), 3);
        let e = compile_limited(&d, &[], 2).unwrap_err();
        assert_eq!(
            e,
            CompileError::TooLarge {
                entries: 3,
                limit: 2,
                policies: "x/a, x/b".into()
            }
        );
        assert!(e.to_string().contains("--max-table-entries"));
    }
}
