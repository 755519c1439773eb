//! Palisade's TC programs and the Rust view of the maps they share with the
//! node-enforcer.
//!
//! The programs live in `c/palisade.bpf.c` (their parts in `c/lib/`) and are
//! compiled by clang at build time; [`OBJECT`] is the resulting ELF, ready
//! for `aya::EbpfLoader::load`.
//! Every map is pinned by name, so loading with
//! `EbpfLoader::default_map_pin_directory(dir)` shares one copy of each map
//! at `dir/<map name>` across all loads.
//!
//! Addresses are always 16 bytes: IPv6 as is, IPv4 as IPv4-mapped IPv6
//! (`::ffff:a.b.c.d`, see [`mapped_addr`]), so one trie serves both families.

use std::net::{IpAddr, Ipv6Addr};

use aya::maps::lpm_trie::Key;

pub mod policy_lens;
#[cfg(feature = "testkit")]
pub mod testkit;

#[repr(C, align(8))]
pub(crate) struct Aligned<B: ?Sized>(pub(crate) B);

// aya parses the ELF in place, which needs the 8-byte alignment that
// include_bytes! alone does not promise.
static ALIGNED_OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/palisade.bpf.o")));

/// The compiled eBPF object (ELF with BTF) holding both programs and all maps.
pub static OBJECT: &[u8] = &ALIGNED_OBJECT.0;

static ALIGNED_CT_EXPLAIN: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/ct_explain.bpf.o"
)));

/// The conntrack cleanup's question to the kernel (`c/ct_explain.bpf.c`):
/// one TC program, never attached, run with BPF_PROG_TEST_RUN. It calls
/// kfuncs, which aya 0.14 cannot relocate, so the enforcer loads it itself.
pub static CT_EXPLAIN_OBJECT: &[u8] = &ALIGNED_CT_EXPLAIN.0;

/// The program's name (its symbol) in [`CT_EXPLAIN_OBJECT`].
pub const PROG_CT_EXPLAIN: &str = "palisade_ct_explain";

/// Attach at TC ingress of a pod's host-side veth: judges what the pod sends
/// (its egress policy).
pub const PROG_FROM_POD: &str = "palisade_from_pod";
/// Attach at TC egress of a pod's host-side veth: judges what the pod
/// receives (its ingress policy).
pub const PROG_TO_POD: &str = "palisade_to_pod";

/// `Array<EpSlot>` of [`EP_SLOTS`], memory-mapped (`BPF_F_MMAPABLE`):
/// every endpoint's state, in a slot the programs find at its home
/// ([`ep_home`]) or through [`MAP_EP_INDEX`]. See [`EpSlot`] for how it may
/// be written.
pub const MAP_EP_SLOTS: &str = "pal_ep_slots";
/// `HashMap<u32 /*host veth ifindex*/, u32 /*slot*/>`: where an endpoint's
/// slot is. Written only when an endpoint comes, goes or moves; trusted by
/// the programs only when the slot names the interface.
pub const MAP_EP_INDEX: &str = "pal_ep_index";
/// `Array<CtShare>` of [`EP_SLOTS`], memory-mapped: the conntrack entries
/// each endpoint hook created and removed, by slot.
pub const MAP_CT_SHARE: &str = "pal_ct_share";
/// One [`CtConfig`] at key 0.
pub const MAP_CT_CONFIG: &str = "pal_ct_config";
/// `LpmTrie<PolicyKey, PolicyValue>`.
pub const MAP_POLICY: &str = "pal_policy";
/// `HashMap<Key<PolicyKey>, PolicyValue>` (open as
/// `aya::maps::HashMap<_, [u8; 24], PolicyValue>` or through
/// [`PolicyExactKey`]): the entries of [`MAP_POLICY`] again, found by exact
/// key, one lookup per prefix length listed in [`MAP_POLICY_LENS`]. Always
/// a subset of [`MAP_POLICY`]: written after it, removed before it.
pub const MAP_POLICY_EXACT: &str = "pal_policy_exact";
/// `HashMap<u32 /*policy id*/, PolicyLens>`: the prefix lengths a policy's
/// entries have. A policy without one is looked up in [`MAP_POLICY`]'s trie.
pub const MAP_POLICY_LENS: &str = "pal_policy_lens";
/// `LpmTrie<PortKey, PortValue>`.
pub const MAP_PORTS: &str = "pal_ports";
/// `LruHashMap<CtKey, CtValue>` (open as `aya::maps::HashMap`): IPv6 flows.
/// (Before IPv4 flows had [`MAP_CT4`], it held them too, IPv4-mapped; such
/// entries left by an older version are moved to [`MAP_CT4`].)
pub const MAP_CONNTRACK: &str = "pal_conntrack";
/// `LruHashMap<Ct4Key, CtValue>`: IPv4 flows.
pub const MAP_CT4: &str = "pal_ct4";
/// `PerCpuArray<u64>` of verdict counters, indexed by [`stat_slot`]
/// (direction and `STAT_*` kind), with room for [`STAT_CAPACITY`] kinds.
pub const MAP_STATS: &str = "pal_verdicts";
/// Maps of older versions, which this one no longer reads: a pinned map
/// keeps its type and size across upgrades, so a map whose shape changed
/// got a new name. The enforcer moves what they hold into the new maps
/// and unpins them once no program of the older version runs.
pub mod legacy {
    /// The counters of versions that counted no direction (one slot per
    /// kind).
    pub const MAP_STATS_UNDIRECTED: &str = "pal_stats";
    /// The counters by direction, with room for exactly the kinds of its
    /// day.
    pub const MAP_DIR_STATS: &str = "pal_dir_stats";
    /// `HashMap<u32 /*ifindex*/, Endpoint>`: the endpoints before
    /// [`super::MAP_EP_SLOTS`].
    pub const MAP_ENDPOINTS: &str = "pal_endpoints";
    /// An array copy of [`MAP_ENDPOINTS`]' epochs and IPv4 addresses.
    pub const MAP_EP_CACHE: &str = "pal_ep_cache";
    /// `HashMap<u32 /*ifindex*/, AuditPolicy>`: staged policy ids before
    /// they were a word of [`super::EpSlot`].
    pub const MAP_AUDIT: &str = "pal_audit";
    /// Every older map this version unpins once it runs on every link.
    pub const UNPINNED_AFTER_ADOPT: [&str; 5] = [
        MAP_STATS_UNDIRECTED,
        MAP_DIR_STATS,
        MAP_ENDPOINTS,
        MAP_EP_CACHE,
        MAP_AUDIT,
    ];

    /// Value of [`MAP_ENDPOINTS`].
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct Endpoint {
        pub ingress_policy: u32,
        pub egress_policy: u32,
        pub ingress_epoch: u32,
        pub egress_epoch: u32,
        pub addr_count: u32,
        pub pad: u32,
        pub addrs: [[u8; 16]; super::MAX_POD_ADDRS],
    }

    impl Endpoint {
        pub fn pod_addrs(&self) -> &[[u8; 16]] {
            &self.addrs[..(self.addr_count as usize).min(super::MAX_POD_ADDRS)]
        }
    }

    /// Value of [`MAP_AUDIT`].
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct AuditPolicy {
        pub ingress_policy: u32,
        pub egress_policy: u32,
    }

    const _: () = assert!(std::mem::size_of::<Endpoint>() == 24 + super::MAX_POD_ADDRS * 16);
    const _: () = assert!(std::mem::size_of::<AuditPolicy>() == 8);
    // SAFETY: repr(C) integers and byte arrays without padding.
    unsafe impl aya::Pod for Endpoint {}
    unsafe impl aya::Pod for AuditPolicy {}
}
/// `LruHashMap<Frag4Key, FragValue>`: the verdicts IPv4 first fragments
/// got, for their datagrams' later fragments (`c/lib/fragments.h`).
pub const MAP_FRAGS4: &str = "pal_frags4";
/// `LruHashMap<Frag6Key, FragValue>`: the same for IPv6.
pub const MAP_FRAGS6: &str = "pal_frags6";
/// Ring buffer of [`FlowEvent`]s for the flow log.
pub const MAP_FLOW_EVENTS: &str = "pal_flow_events";
/// One [`FlowConfig`] at key 0.
pub const MAP_FLOW_CONFIG: &str = "pal_flow_config";
/// Per-CPU counters indexed by `FLOW_STAT_*`.
pub const MAP_FLOW_STATS: &str = "pal_flow_stats";
/// The flow log rate limit's one shared word (GCRA theoretical arrival time).
pub const MAP_FLOW_BUCKET: &str = "pal_flow_bucket";
/// `Array<LearnedSlot>` (memory-mapped): the pods' learned overlays, the
/// addresses a pod with domain-name rules ([`EP_FLAG_LEARNS`]) learned, each
/// a slot with its pod, peer, expiry and the port set that is the pod's
/// whole egress verdict for that host, found through
/// [`MAP_LEARNED_INDEX`]. Written by the enforcer only, by the rules of
/// [`LearnedSlot`].
pub const MAP_LEARNED: &str = "pal_learned";
/// `HashMap<LearnedKey, u32>`: the slot of [`MAP_LEARNED`] that holds a
/// pod's entry for a peer. A hint only: a reused element may yield any
/// number, and the programs use a slot only when it names the key's pod
/// and peer.
pub const MAP_LEARNED_INDEX: &str = "pal_learned_index";
/// `HashMap<[u8; 16], u32>`: the trusted DNS servers (the cluster DNS
/// Service's address and its backends, see [`mapped_addr`]), value 1: a
/// learning pod's DNS with them is copied to [`MAP_DNS_FRAMES`]
/// (`c/lib/dns_capture.h`).
pub const MAP_DNS_SERVERS: &str = "pal_dns_servers";
/// One [`DnsConfig`] at key 0: until when the learner is alive.
pub const MAP_DNS_CONFIG: &str = "pal_dns_config";
/// Ring buffer of [`DnsFrameHdr`] records, each followed by its frame: the
/// learning pods' DNS queries (copied) and answers (held until the enforcer
/// re-injects them).
pub const MAP_DNS_FRAMES: &str = "pal_dns_frames";
/// Per-CPU counters indexed by `DNS_STAT_*`.
pub const MAP_DNS_STATS: &str = "pal_dns_stats";
/// `LruHashMap<DnsFragKey, u32>`: whether the first fragment of a DNS
/// answer to a learning pod was held (1) or passed (0), for its later
/// fragments.
pub const MAP_DNS_FRAGS: &str = "pal_dns_frags";
/// Every map name, in no particular order; all are pinned by name.
pub const MAP_NAMES: [&str; 24] = [
    MAP_EP_SLOTS,
    MAP_EP_INDEX,
    MAP_CT_SHARE,
    MAP_CT_CONFIG,
    MAP_POLICY,
    MAP_POLICY_EXACT,
    MAP_POLICY_LENS,
    MAP_PORTS,
    MAP_CONNTRACK,
    MAP_CT4,
    MAP_STATS,
    MAP_FLOW_EVENTS,
    MAP_FLOW_CONFIG,
    MAP_FLOW_STATS,
    MAP_FLOW_BUCKET,
    MAP_FRAGS4,
    MAP_FRAGS6,
    MAP_LEARNED,
    MAP_LEARNED_INDEX,
    MAP_DNS_SERVERS,
    MAP_DNS_CONFIG,
    MAP_DNS_FRAMES,
    MAP_DNS_STATS,
    MAP_DNS_FRAGS,
];

/// The sizes the programs share with user space: generated by build.rs from
/// `c/lib/sizes.h`, their one home (`PAL_<NAME>` there is `<NAME>` here;
/// the conntrack cleanup's batch is `c/ct_explain.bpf.c`'s), so no number
/// here mirrors the C by hand.
pub mod sizes {
    include!(concat!(env!("OUT_DIR"), "/sizes.rs"));
}

// `max_entries` of the maps, as compiled into [`OBJECT`].
pub use sizes::{
    DNS_FRAMES_BYTES, DNS_FRAME_MAX, EP_SLOTS, FLOW_EVENTS_BYTES, MAX_CONNTRACK_ENTRIES,
    MAX_DNS_FRAGS, MAX_DNS_SERVERS, MAX_FRAG_ENTRIES, MAX_LEARNED_ENTRIES, MAX_POLICY_ENTRIES,
    MAX_POLICY_LENS_ENTRIES, MAX_PORT_ENTRIES, STAT_CAPACITY, STAT_DIRECTIONS, STAT_MAP_ENTRIES,
};
// ep_home masks the ifindex, as the programs do.
const _: () = assert!(EP_SLOTS.is_power_of_two());
/// The most endpoints [`MAP_EP_INDEX`] holds: one a slot of [`MAP_EP_SLOTS`].
pub const MAX_ENDPOINTS: u32 = EP_SLOTS;
/// Most prefix lengths a [`PolicyLens`] lists.
pub const MAX_POLICY_LENS: usize = sizes::MAX_POLICY_LENS as usize;

/// How far past the packet a [`CtValue::last_seen_ns`] may be: the
/// programs stamp it [`sizes::COARSE_CLOCK_LAG_NS`] ahead.
pub const LAST_SEEN_MAX_AHEAD_NS: u64 = sizes::COARSE_CLOCK_LAG_NS as u64;

/// The verdict kinds (`STAT_*`, and their number `STAT_COUNT`): why a
/// packet passed or was dropped, as the programs count it in [`MAP_STATS`]
/// and write it in [`FlowEvent::stat`]. Generated by build.rs from
/// `c/lib/reasons.h` (`enum pal_stat`), their one home.
pub mod reasons {
    include!(concat!(env!("OUT_DIR"), "/reasons.rs"));
}
pub use reasons::*;
/// Slots of [`MAP_STATS`] the kinds of this version use (the first ones).
pub const STAT_SLOTS: u32 = STAT_COUNT * STAT_DIRECTIONS;
const _: () = assert!(STAT_COUNT <= STAT_CAPACITY);

/// The [`MAP_STATS`] slot counting kind `stat` judged by `hook`
/// (`STAT_SLOT` in the C header): kind-major, so a kind added later takes
/// new slots and moves none.
pub const fn stat_slot(hook: u8, stat: u32) -> u32 {
    stat * STAT_DIRECTIONS + hook as u32
}

/// What an allowed packet returns: `TC_ACT_UNSPEC`, which TCX reads as
/// `TCX_NEXT`, so programs attached after Palisade's still run.
pub const VERDICT_NEXT: i32 = -1;
/// What a denied packet returns: `TC_ACT_SHOT` (`TCX_DROP`).
pub const VERDICT_DROP: i32 = 2;
/// What a held DNS answer returns: `TC_ACT_REDIRECT` (`TCX_REDIRECT`) to
/// no interface, which frees it while telling its sender it went out (a
/// sender fragmenting a datagram stops at a fragment that was dropped).
pub const VERDICT_HOLD: i32 = 7;

/// Most addresses an [`EpSlot`] holds.
pub const MAX_POD_ADDRS: usize = sizes::MAX_POD_ADDRS as usize;

/// [`CtKey::hook`] of an entry created by the source pod's egress hook.
pub const HOOK_FROM_POD: u8 = 0;
/// [`CtKey::hook`] of an entry created by the destination pod's ingress hook.
pub const HOOK_TO_POD: u8 = 1;

/// IP protocol numbers as the programs put them in [`PortKey::proto`].
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;
pub const PROTO_SCTP: u8 = 132;

/// Bits of `policy_id` at the front of every [`PolicyKey`].
pub const POLICY_ID_BITS: u32 = 32;
/// Prefix length the programs look policies up with (id + full address).
pub const POLICY_FULL_PREFIX_LEN: u32 = POLICY_ID_BITS + 128;
/// [`PortKey`] prefix length matching every protocol and port of a portset.
pub const PORT_KEY_ANY_PROTO_PREFIX_LEN: u32 = 32;
/// [`PortKey`] prefix length matching every port of one protocol.
pub const PORT_KEY_ANY_PORT_PREFIX_LEN: u32 = 40;
/// Prefix length the programs look ports up with (portset + proto + port).
pub const PORT_KEY_FULL_PREFIX_LEN: u32 = 56;

/// A direction's policy id and epoch as the programs read them, in one
/// 8-byte word of an [`EpSlot`] (policy id in the low half).
///
/// The epoch must move to a value never used before (on any endpoint)
/// whenever that direction's policy id changes: a conntrack entry written
/// under the current epoch lets its flow pass without a policy lookup, one
/// of any other epoch is re-judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Direction {
    /// 0: not isolated in that direction.
    pub policy: u32,
    pub epoch: u32,
}

impl Direction {
    pub const fn word(self) -> u64 {
        self.policy as u64 | (self.epoch as u64) << 32
    }

    pub const fn of_word(w: u64) -> Self {
        Direction {
            policy: w as u32,
            epoch: (w >> 32) as u32,
        }
    }
}

/// [`EpSlot::flags`] bit: the pod's egress has rules by domain name, so
/// its flows consult its entries in [`MAP_LEARNED`] before the egress
/// table.
pub const EP_FLAG_LEARNS: u32 = 1 << 0;

/// The staged (audit) policy ids of an endpoint, as one word of its
/// [`EpSlot`]: ingress in the low half, egress in the high one; 0 where no
/// staged policy applies.
pub const fn audit_word(ingress: u32, egress: u32) -> u64 {
    ingress as u64 | (egress as u64) << 32
}

/// The home slot of interface `ifindex` in [`MAP_EP_SLOTS`]: where the
/// programs look first. Two interfaces may share one; the slot holds at
/// most one of them, the other is found through [`MAP_EP_INDEX`].
pub const fn ep_home(ifindex: u32) -> u32 {
    ifindex & (EP_SLOTS - 1)
}

/// Value of [`MAP_EP_SLOTS`] (`struct ep_slot`): one endpoint's state. The
/// first `addr_count` of `addrs` (see [`mapped_addr`]) are the only sources
/// the pod may send from (with none, every IP packet it sends is dropped);
/// `v4` repeats the IPv4 ones for the programs' IPv4 fast path.
///
/// How a writer keeps every packet's reading whole (the C header says the
/// same): `ifindex`, the addresses and `v4` are written before the slot is
/// published through [`MAP_EP_INDEX`] and never change while `ifindex`
/// names the interface; `home` is set to the ifindex only a grace period
/// after that; a retired slot gets `home` and `ifindex` cleared and is
/// written again only a grace period later; `ingress`, `egress` and
/// `audit` change in place, each with one atomic 8-byte store, and `flags`
/// with one atomic 4-byte store (the programs read each once per packet).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EpSlot {
    pub ifindex: u32,
    pub home: u32,
    /// [`Direction::word`]s.
    pub ingress: u64,
    pub egress: u64,
    /// [`audit_word`].
    pub audit: u64,
    pub v4_count: u32,
    pub addr_count: u32,
    /// Network order, as in the packet.
    pub v4: [[u8; 4]; MAX_POD_ADDRS],
    /// `EP_FLAG_*` bits.
    pub flags: u32,
    pub pad: u32,
    pub addrs: [[u8; 16]; MAX_POD_ADDRS],
}

impl EpSlot {
    /// The slot of interface `ifindex` for a pod with these directions and
    /// own addresses (not trusted at home, no staged policy), or `None`
    /// when there are more than [`MAX_POD_ADDRS`] addresses.
    pub fn new(
        ifindex: u32,
        ingress: Direction,
        egress: Direction,
        pod_addrs: &[[u8; 16]],
    ) -> Option<Self> {
        if pod_addrs.len() > MAX_POD_ADDRS {
            return None;
        }
        let mut addrs = [[0u8; 16]; MAX_POD_ADDRS];
        addrs[..pod_addrs.len()].copy_from_slice(pod_addrs);
        let mut v4 = [[0u8; 4]; MAX_POD_ADDRS];
        let mut n = 0;
        for a in pod_addrs {
            if let Some(addr) = Ipv6Addr::from(*a).to_ipv4_mapped() {
                v4[n] = addr.octets();
                n += 1;
            }
        }
        Some(EpSlot {
            ifindex,
            home: 0,
            ingress: ingress.word(),
            egress: egress.word(),
            audit: 0,
            v4_count: n as u32,
            addr_count: pod_addrs.len() as u32,
            v4,
            flags: 0,
            pad: 0,
            addrs,
        })
    }

    /// The pod's own addresses. A count past [`MAX_POD_ADDRS`] (which the
    /// programs never trust beyond the array either) is cut at the array.
    pub fn pod_addrs(&self) -> &[[u8; 16]] {
        &self.addrs[..(self.addr_count as usize).min(MAX_POD_ADDRS)]
    }

    pub fn ingress(&self) -> Direction {
        Direction::of_word(self.ingress)
    }

    pub fn egress(&self) -> Direction {
        Direction::of_word(self.egress)
    }

    /// The staged (ingress, egress) policy ids.
    pub fn audit(&self) -> (u32, u32) {
        (self.audit as u32, (self.audit >> 32) as u32)
    }
}

/// Value of [`MAP_CT_SHARE`] (`struct ct_share`): conntrack entries hook
/// `hook` ([`HOOK_FROM_POD`], [`HOOK_TO_POD`]) of the slot's endpoint
/// created and removed, both counting up; it holds the difference.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtShare {
    pub created: [u64; 2],
    pub removed: [u64; 2],
}

/// Value of [`MAP_CT_CONFIG`] (`struct ct_config`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtConfig {
    /// Most conntrack entries one hook of one endpoint may hold.
    pub share: u32,
    pub pad: u32,
}

/// Data part of a [`MAP_POLICY`] key (aya's [`Key`] adds the prefix length).
/// `addr` is the peer address, see [`mapped_addr`]; `policy_id` is in host
/// order (it is always matched in full, so its byte order never matters).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyKey {
    pub policy_id: u32,
    pub addr: [u8; 16],
}

impl PolicyKey {
    /// The trie key for `policy_id` and the CIDR `net/ip_prefix_len`, with
    /// the host bits cleared so the same CIDR always yields the same key.
    pub fn lpm(policy_id: u32, net: IpAddr, ip_prefix_len: u8) -> Key<PolicyKey> {
        let prefix_len = policy_prefix_len(ip_prefix_len, net.is_ipv4());
        let mut addr = mapped_addr(net);
        mask_bits(&mut addr, (prefix_len - POLICY_ID_BITS) as usize);
        Key::new(prefix_len, PolicyKey { policy_id, addr })
    }
}

/// Key of [`MAP_POLICY_EXACT`]: the same bytes as the trie's key (prefix
/// length, then [`PolicyKey`]), matched whole.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyExactKey {
    pub prefix_len: u32,
    pub key: PolicyKey,
}

impl PolicyExactKey {
    pub fn of(key: &Key<PolicyKey>) -> Self {
        PolicyExactKey {
            prefix_len: key.prefix_len(),
            key: key.data(),
        }
    }
}

/// Value of [`MAP_POLICY_LENS`]: the trie prefix lengths of a policy's
/// entries, longest first. It may list a length no entry has (one wasted
/// lookup) but must never miss one, or entries of that length go unseen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyLens {
    pub count: u32,
    pub prefix_len: [u32; MAX_POLICY_LENS],
}

impl PolicyLens {
    /// The value listing `lens` (trie prefix lengths, any order, repeats
    /// allowed), or `None` when there are more than [`MAX_POLICY_LENS`]
    /// distinct ones: such a policy is looked up in the trie.
    pub fn new(lens: impl IntoIterator<Item = u32>) -> Option<Self> {
        let mut sorted: Vec<u32> = lens.into_iter().collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        sorted.dedup();
        if sorted.len() > MAX_POLICY_LENS {
            return None;
        }
        let mut prefix_len = [0; MAX_POLICY_LENS];
        prefix_len[..sorted.len()].copy_from_slice(&sorted);
        Some(PolicyLens {
            count: sorted.len() as u32,
            prefix_len,
        })
    }

    pub fn lens(&self) -> &[u32] {
        &self.prefix_len[..(self.count as usize).min(MAX_POLICY_LENS)]
    }
}

/// Value of [`MAP_POLICY`]: which portset applies to peers in that CIDR.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyValue {
    pub portset_id: u32,
}

/// Data part of a [`MAP_PORTS`] key. `port` is big-endian so an aligned port
/// range is a bit prefix; `portset_id` is host order and always matched whole.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortKey {
    pub portset_id: u32,
    pub proto: u8,
    pub port: [u8; 2],
    pub pad: u8,
}

impl PortKey {
    /// Matches every protocol and every port (a rule without `ports`).
    pub fn lpm_any_protocol(portset_id: u32) -> Key<PortKey> {
        Key::new(
            PORT_KEY_ANY_PROTO_PREFIX_LEN,
            PortKey {
                portset_id,
                ..PortKey::default()
            },
        )
    }

    /// Matches `proto` and the aligned block of ports starting at `port`
    /// whose first `port_bits` bits are fixed (see [`port_prefixes`]);
    /// `port_bits` 0 means every port of `proto`. Bits past `port_bits` are
    /// cleared so the same block always yields the same key.
    pub fn lpm(portset_id: u32, proto: u8, port: u16, port_bits: u8) -> Key<PortKey> {
        let port_bits = port_bits.min(16);
        let mut port = port.to_be_bytes();
        mask_bits(&mut port, port_bits as usize);
        Key::new(
            port_key_prefix_len(port_bits),
            PortKey {
                portset_id,
                proto,
                port,
                pad: 0,
            },
        )
    }
}

/// Value of [`MAP_PORTS`]; [`PortValue::ALLOW`] allows, 0 denies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortValue {
    pub allow: u32,
}

impl PortValue {
    pub const ALLOW: PortValue = PortValue { allow: 1 };
    /// A tiered set's denying entry: matched, and dropped.
    pub const DENY: PortValue = PortValue { allow: 0 };
}

/// Key of [`MAP_CONNTRACK`]: a flow as seen by the hook that allowed it,
/// named by the host veth `ifindex` and `hook` (which of its two hooks).
/// `sport`/`dport` hold the network-order bytes (use [`CtKey::new`] and
/// [`CtKey::sport`]/[`CtKey::dport`] to stay in host order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub ifindex: u32,
    pub proto: u8,
    pub hook: u8,
    pub pad: [u8; 2],
}

/// Key of [`MAP_CT4`]: [`CtKey`] of an IPv4 flow, addresses in network
/// order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ct4Key {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
    pub ifindex: u32,
    pub proto: u8,
    pub hook: u8,
    pub pad: [u8; 2],
}

impl Ct4Key {
    /// The IPv4 form of `k`, or `None` when its addresses are not both
    /// IPv4-mapped (an IPv6 flow).
    pub fn of(k: &CtKey) -> Option<Self> {
        let v4 = |a: [u8; 16]| Ipv6Addr::from(a).to_ipv4_mapped().map(|v| v.octets());
        Some(Ct4Key {
            src: v4(k.src)?,
            dst: v4(k.dst)?,
            sport: k.sport,
            dport: k.dport,
            ifindex: k.ifindex,
            proto: k.proto,
            hook: k.hook,
            pad: [0; 2],
        })
    }

    /// The same flow as a [`CtKey`] (addresses IPv4-mapped), the one form
    /// callers that handle both families work with.
    pub fn widen(&self) -> CtKey {
        CtKey {
            src: std::net::Ipv4Addr::from(self.src).to_ipv6_mapped().octets(),
            dst: std::net::Ipv4Addr::from(self.dst).to_ipv6_mapped().octets(),
            sport: self.sport,
            dport: self.dport,
            ifindex: self.ifindex,
            proto: self.proto,
            hook: self.hook,
            pad: [0; 2],
        }
    }
}

/// A flow's addresses and ports (host order), as [`CtKey::new`] takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: u8,
}

impl CtKey {
    /// The entry `hook` ([`HOOK_FROM_POD`] or [`HOOK_TO_POD`]) of
    /// interface `ifindex` writes when it allows `flow`.
    pub fn new(flow: Tuple, ifindex: u32, hook: u8) -> Self {
        CtKey {
            src: mapped_addr(flow.src),
            dst: mapped_addr(flow.dst),
            sport: flow.sport.to_be(),
            dport: flow.dport.to_be(),
            ifindex,
            proto: flow.proto,
            hook,
            pad: [0; 2],
        }
    }

    pub fn src_ip(&self) -> IpAddr {
        unmapped_addr(self.src)
    }

    pub fn dst_ip(&self) -> IpAddr {
        unmapped_addr(self.dst)
    }

    /// Source port in host order.
    pub fn sport(&self) -> u16 {
        u16::from_be(self.sport)
    }

    /// Destination port in host order.
    pub fn dport(&self) -> u16 {
        u16::from_be(self.dport)
    }
}

/// Value of [`MAP_CONNTRACK`]. `last_seen_ns` is the `CLOCK_MONOTONIC` time
/// (not counting suspend) of the flow's last packet as the programs read it
/// from the cheap coarse clock, rounded up: never earlier than the packet
/// and at most [`LAST_SEEN_MAX_AHEAD_NS`] later, so `last_seen_ns < t` proves
/// that no packet was seen since `t`. `epoch` is the writing direction's
/// [`Direction`] epoch when policy last allowed the flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtValue {
    pub last_seen_ns: u64,
    pub epoch: u32,
    pub pad: u32,
}

/// Key of [`MAP_FRAGS4`] (`struct frag4_key`): one IPv4 datagram as one
/// hook of one pod sees its fragments; addresses and id in network order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frag4Key {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub ifindex: u32,
    pub id: [u8; 2],
    pub proto: u8,
    pub hook: u8,
}

/// Key of [`MAP_FRAGS6`] (`struct frag6_key`): the same for IPv6, whose
/// datagrams are named without a protocol; `id` is the fragment header's,
/// in network order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frag6Key {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub id: [u8; 4],
    pub ifindex: u32,
    pub hook: u8,
    pub pad: [u8; 3],
}

/// Value of [`MAP_FRAGS4`] and [`MAP_FRAGS6`] (`struct frag_value`): the first fragment's
/// ports (network order), where its L4 header ends in the fragmentable
/// part, its L4 protocol, its verdict and the endpoint's epochs then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FragValue {
    pub sport: u16,
    pub dport: u16,
    pub l4_end: u16,
    pub proto: u8,
    pub allowed: u8,
    pub ingress_epoch: u32,
    pub egress_epoch: u32,
}

/// Key of [`MAP_LEARNED_INDEX`] (`struct learned_key`): the pod, by its
/// host veth `ifindex` (as [`CtKey::ifindex`]), and the peer `addr` (see
/// [`mapped_addr`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LearnedKey {
    pub ifindex: u32,
    pub pad: u32,
    pub addr: [u8; 16],
}

impl LearnedKey {
    pub fn new(ifindex: u32, peer: IpAddr) -> Self {
        LearnedKey {
            ifindex,
            pad: 0,
            addr: mapped_addr(peer),
        }
    }
}

/// A slot of [`MAP_LEARNED`] (`struct learned_slot`): one learned entry,
/// the pod's (`ifindex`, its host veth; 0: a free slot) for the peer
/// `addr` (see [`mapped_addr`]).
///
/// For the pod's egress (only: names are egress-only, and staged policies
/// never look) to that peer, the entry decides alone, by `portset_id`: a
/// port set of [`MAP_PORTS`] that is the pod's WHOLE egress verdict for
/// that one host, compiled with the learned name rules included (tier
/// order resolved in it). A new flow heeds it while `expires_ns`
/// (`CLOCK_BOOTTIME`, which neither a suspend nor a restart resets) is
/// later than now, and the egress table decides once it has passed; an
/// established flow re-judged under a newer epoch heeds it whether or not
/// it has expired (it opened while the name was allowed), so the enforcer
/// deletes or rewrites the entries of names the policy no longer grants.
///
/// A packet finds the slot through [`MAP_LEARNED_INDEX`], whose elements
/// the kernel may reuse under it, and uses it only when `ifindex` and
/// `addr` are its pod and peer; any other slot is no entry (the table
/// decides, which fails closed: names only add Accepts). So the writer
/// (DESIGN invariant 14, as for [`EpSlot`]):
/// - fills a free slot by writing `addr`, `portset_id` and `expires_ns`,
///   then `ifindex` last with a release store, then inserts the index
///   entry;
/// - never changes `addr` or `ifindex` while `ifindex` is non-zero
///   (another peer or pod takes another slot);
/// - rewrites `portset_id`, `audit_portset_id` and `expires_ns` of a live
///   slot in place, each
///   with one atomic store (a packet reads each once, and may see the old
///   or the new value of each: both are the key's);
/// - retires a slot by deleting its index entry, then clearing `ifindex`
///   (one store), and writes it again only a grace period later (never on
///   a kernel without grace periods).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LearnedSlot {
    pub addr: [u8; 16],
    pub ifindex: u32,
    pub portset_id: u32,
    /// The staged (audit) egress's port set for the host, its staged
    /// rules by name included; 0: none (the staged table decides).
    /// Written as `portset_id` is.
    pub audit_portset_id: u32,
    pub pad: u32,
    pub expires_ns: u64,
}

impl LearnedSlot {
    /// The slot of `key`, live until `expires_ns`, judged by `portset_id`
    /// (and its staged table by `audit_portset_id`, 0: by the table).
    pub fn new(key: &LearnedKey, portset_id: u32, audit_portset_id: u32, expires_ns: u64) -> Self {
        LearnedSlot {
            addr: key.addr,
            ifindex: key.ifindex,
            portset_id,
            audit_portset_id,
            pad: 0,
            expires_ns,
        }
    }
}

/// `kind` of a [`FlowEvent`] (`FLOW_*`), generated by build.rs from
/// `c/palisade.h`'s `enum pal_flow_kind`.
pub mod flow_kinds {
    include!(concat!(env!("OUT_DIR"), "/flow_kinds.rs"));
}
pub use flow_kinds::*;

/// `mode` of [`FlowConfig`] (`FLOW_LOG_*`): which events besides
/// `FLOW_WOULD_*` are sent; generated from `enum pal_flow_log_mode`.
pub mod flow_log_modes {
    include!(concat!(env!("OUT_DIR"), "/flow_log_modes.rs"));
}
pub use flow_log_modes::*;

/// What the conntrack cleanup's program answers about a flow
/// (`ANSWER_*` in `struct ask.answer`), generated by build.rs from
/// `c/ct_explain.bpf.c`'s `enum pal_ct_answer`; the batch's layout is in
/// [`sizes`] (`CT_EXPLAIN_*`, `CT_ASK_*`).
pub mod ct_answers {
    include!(concat!(env!("OUT_DIR"), "/ct_answers.rs"));
}

/// Indices into [`MAP_FLOW_STATS`] (`FLOW_STAT_*`, and their number
/// `FLOW_STAT_COUNT`), generated by build.rs from `c/palisade.h`'s
/// `enum pal_flow_stat`.
pub mod flow_stats {
    include!(concat!(env!("OUT_DIR"), "/flow_stats.rs"));
}
pub use flow_stats::*;

/// Indices into [`MAP_DNS_STATS`] (`DNS_STAT_*`, and their number
/// `DNS_STAT_COUNT`), generated by build.rs from `c/palisade.h`'s
/// `enum pal_dns_stat`.
pub mod dns_stats {
    include!(concat!(env!("OUT_DIR"), "/dns_stats.rs"));
}
pub use dns_stats::*;

/// `kind` of a [`DnsFrameHdr`] (`DNS_FRAME_*`), generated by build.rs from
/// `c/palisade.h`'s `enum pal_dns_frame_kind`.
pub mod dns_frame_kinds {
    include!(concat!(env!("OUT_DIR"), "/dns_frame_kinds.rs"));
}
pub use dns_frame_kinds::*;

/// Value of [`MAP_DNS_CONFIG`] (`struct dns_config`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// `CLOCK_BOOTTIME` until which the learner is alive; 0 or past: no
    /// learner, and the programs copy and hold nothing.
    pub learner_deadline_ns: u64,
    pub pad: u64,
}

/// The header of a record of [`MAP_DNS_FRAMES`] (`struct dns_frame_hdr`),
/// followed by `len` bytes of the frame from its Ethernet header on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DnsFrameHdr {
    /// `CLOCK_BOOTTIME`.
    pub ts_ns: u64,
    /// The pod's host veth.
    pub ifindex: u32,
    pub len: u16,
    /// `DNS_FRAME_QUERY` (copied) or `DNS_FRAME_ANSWER` (held: the enforcer
    /// must re-inject it).
    pub kind: u8,
    pub pad: u8,
}

/// Key of [`MAP_DNS_FRAGS`] (`struct dns_frag_key`): one datagram to one
/// pod, as [`Frag4Key`] and [`Frag6Key`] name it, both families in one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsFragKey {
    /// IPv6 or IPv4-mapped.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// IPv6's identification; IPv4's in the low 16 bits, network order.
    pub id: u32,
    pub ifindex: u32,
    /// IPv4's protocol; 0 for IPv6.
    pub proto: u8,
    pub pad: [u8; 3],
}

/// One record of [`MAP_FLOW_EVENTS`] (`struct flow_event`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEvent {
    /// CLOCK_MONOTONIC.
    pub ts_ns: u64,
    pub ifindex: u32,
    /// The table that judged: the enforced one, the audit one for `FLOW_WOULD_*`.
    pub policy_id: u32,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Network order.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// `HOOK_*`.
    pub hook: u8,
    /// `FLOW_*`.
    pub kind: u8,
    /// `STAT_*`.
    pub stat: u8,
}

/// Value of [`MAP_FLOW_CONFIG`] (`struct flow_config`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowConfig {
    pub mode: u32,
    pub rate_per_sec: u32,
    pub burst: u32,
    pub pad: u32,
}

const _: () = assert!(std::mem::size_of::<FlowEvent>() == 56);
const _: () = assert!(std::mem::size_of::<FlowConfig>() == 16);

// SAFETY: all of these are repr(C), made only of integers and byte arrays,
// and have no padding (the size asserts in this file prove it), so every bit
// pattern is a valid value and no uninitialised byte reaches the kernel.
unsafe impl aya::Pod for FlowEvent {}
unsafe impl aya::Pod for FlowConfig {}
unsafe impl aya::Pod for EpSlot {}
unsafe impl aya::Pod for CtShare {}
unsafe impl aya::Pod for CtConfig {}
unsafe impl aya::Pod for PolicyKey {}
unsafe impl aya::Pod for PolicyValue {}
unsafe impl aya::Pod for PortKey {}
unsafe impl aya::Pod for PortValue {}
unsafe impl aya::Pod for CtKey {}
unsafe impl aya::Pod for Ct4Key {}
unsafe impl aya::Pod for PolicyExactKey {}
unsafe impl aya::Pod for PolicyLens {}
unsafe impl aya::Pod for CtValue {}
unsafe impl aya::Pod for Frag4Key {}
unsafe impl aya::Pod for Frag6Key {}
unsafe impl aya::Pod for FragValue {}
unsafe impl aya::Pod for LearnedKey {}
unsafe impl aya::Pod for LearnedSlot {}
unsafe impl aya::Pod for DnsConfig {}
unsafe impl aya::Pod for DnsFrameHdr {}
unsafe impl aya::Pod for DnsFragKey {}

// Sizes of the C structs in c/palisade.h (which asserts them too).
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<EpSlot>() == 128);
    assert!(size_of::<LearnedKey>() == 24);
    assert!(size_of::<LearnedSlot>() == 40);
    assert!(size_of::<DnsConfig>() == 16);
    assert!(size_of::<DnsFrameHdr>() == 16);
    assert!(size_of::<DnsFragKey>() == 44);
    // The offsets the writer's in-place stores use (c/palisade.h asserts
    // them too).
    assert!(std::mem::offset_of!(LearnedSlot, ifindex) == 16);
    assert!(std::mem::offset_of!(LearnedSlot, portset_id) == 20);
    assert!(std::mem::offset_of!(LearnedSlot, audit_portset_id) == 24);
    assert!(std::mem::offset_of!(LearnedSlot, expires_ns) == 32);
    assert!(size_of::<CtShare>() == 32);
    assert!(size_of::<CtConfig>() == 8);
    assert!(size_of::<PolicyKey>() == 20);
    assert!(size_of::<Key<PolicyKey>>() == 24);
    assert!(size_of::<PolicyValue>() == 4);
    assert!(size_of::<PortKey>() == 8);
    assert!(size_of::<Key<PortKey>>() == 12);
    assert!(size_of::<PortValue>() == 4);
    assert!(size_of::<CtKey>() == 44);
    assert!(size_of::<CtValue>() == 16);
    assert!(size_of::<Ct4Key>() == 20);
    assert!(size_of::<PolicyExactKey>() == 24);
    assert!(size_of::<PolicyLens>() == 4 + MAX_POLICY_LENS * 4);
    assert!(size_of::<Frag4Key>() == 16);
    assert!(size_of::<Frag6Key>() == 44);
    assert!(size_of::<FragValue>() == 16);
};

/// The 16-byte form the maps use: IPv6 as is, IPv4 as `::ffff:a.b.c.d`.
pub fn mapped_addr(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Inverse of [`mapped_addr`].
pub fn unmapped_addr(addr: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(addr);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Trie prefix length of a [`PolicyKey`] for a CIDR of `ip_prefix_len` bits:
/// the 32 bits of the policy id, plus the 96 bits of `::ffff:` for IPv4,
/// plus the CIDR bits. An out-of-range length is clamped to a host route;
/// callers validate CIDRs before they get here.
pub fn policy_prefix_len(ip_prefix_len: u8, is_v4: bool) -> u32 {
    if is_v4 {
        POLICY_ID_BITS + 96 + u32::from(ip_prefix_len.min(32))
    } else {
        POLICY_ID_BITS + u32::from(ip_prefix_len.min(128))
    }
}

/// Trie prefix length of a [`PortKey`] whose port has `port_bits` (0..=16)
/// fixed bits: portset id (32) + protocol (8) + port bits.
pub fn port_key_prefix_len(port_bits: u8) -> u32 {
    PORT_KEY_ANY_PORT_PREFIX_LEN + u32::from(port_bits.min(16))
}

/// Splits the inclusive range `start..=end` into the fewest aligned blocks,
/// each as `(first port, fixed prefix bits 0..=16)`; a block of `b` bits
/// covers `2^(16-b)` ports. Empty when `start > end`.
pub fn port_prefixes(start: u16, end: u16) -> Vec<(u16, u8)> {
    let mut blocks = Vec::new();
    let (mut next, end) = (u32::from(start), u32::from(end));
    while next <= end {
        // Largest block that is aligned at `next` and does not pass `end`.
        let mut free_bits = next.trailing_zeros().min(16);
        while next + (1 << free_bits) - 1 > end {
            free_bits -= 1;
        }
        blocks.push((next as u16, (16 - free_bits) as u8));
        next += 1 << free_bits;
    }
    blocks
}

/// Clears every bit of `bytes` after the first `keep` bits.
fn mask_bits(bytes: &mut [u8], keep: usize) {
    for (i, byte) in bytes.iter_mut().enumerate() {
        let first_bit = i * 8;
        if keep <= first_bit {
            *byte = 0;
        } else if keep < first_bit + 8 {
            *byte &= 0xffu8 << (8 - (keep - first_bit));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// Expands blocks back into the ports they cover.
    fn covered(blocks: &[(u16, u8)]) -> Vec<u32> {
        blocks
            .iter()
            .flat_map(|&(port, bits)| {
                let size = 1u32 << (16 - bits);
                assert_eq!(u32::from(port) % size, 0, "block {port}/{bits} not aligned");
                u32::from(port)..u32::from(port) + size
            })
            .collect()
    }

    #[test]
    fn whole_port_space_is_one_block() {
        assert_eq!(port_prefixes(0, 65535), vec![(0, 0)]);
    }

    #[test]
    fn single_port_is_a_full_prefix() {
        assert_eq!(port_prefixes(80, 80), vec![(80, 16)]);
        assert_eq!(port_prefixes(0, 0), vec![(0, 16)]);
        assert_eq!(port_prefixes(65535, 65535), vec![(65535, 16)]);
    }

    #[test]
    fn everything_but_port_zero() {
        let blocks = port_prefixes(1, 65535);
        assert_eq!(blocks.len(), 16);
        assert_eq!(blocks.first(), Some(&(1, 16)));
        assert_eq!(blocks.last(), Some(&(32768, 1)));
        assert_eq!(covered(&blocks), (1..=65535).collect::<Vec<_>>());
    }

    #[test]
    fn aligned_and_unaligned_ranges() {
        assert_eq!(port_prefixes(8000, 8007), vec![(8000, 13)]);
        assert_eq!(port_prefixes(1024, 2047), vec![(1024, 6)]);
        assert_eq!(
            port_prefixes(32000, 32768),
            vec![(32000, 8), (32256, 7), (32768, 16)]
        );
        assert_eq!(port_prefixes(65534, 65535), vec![(65534, 15)]);
        assert_eq!(port_prefixes(0, 32767), vec![(0, 1)]);
    }

    #[test]
    fn empty_range() {
        assert!(port_prefixes(10, 9).is_empty());
    }

    #[test]
    fn blocks_cover_exactly_the_range_and_are_minimal() {
        let cases = [
            (0u16, 1u16),
            (1, 2),
            (3, 1000),
            (80, 443),
            (1000, 1999),
            (30000, 32767),
            (12345, 54321),
            (0, 65534),
            (65000, 65535),
        ];
        for (start, end) in cases {
            let blocks = port_prefixes(start, end);
            assert_eq!(
                covered(&blocks),
                (u32::from(start)..=u32::from(end)).collect::<Vec<_>>(),
                "{start}..={end}"
            );
            // Minimal: no two neighbouring blocks could merge into one.
            for pair in blocks.windows(2) {
                let ((a, abits), (_, bbits)) = (pair[0], pair[1]);
                let mergeable =
                    abits == bbits && abits > 0 && u32::from(a) % (1 << (17 - abits)) == 0;
                assert!(!mergeable, "{start}..={end}: {blocks:?}");
            }
        }
    }

    #[test]
    fn prefix_lengths() {
        assert_eq!(policy_prefix_len(24, true), 32 + 96 + 24);
        assert_eq!(policy_prefix_len(32, true), 160);
        assert_eq!(policy_prefix_len(0, true), 128);
        assert_eq!(policy_prefix_len(64, false), 96);
        assert_eq!(policy_prefix_len(0, false), 32);
        assert_eq!(policy_prefix_len(128, false), POLICY_FULL_PREFIX_LEN);
        assert_eq!(port_key_prefix_len(0), PORT_KEY_ANY_PORT_PREFIX_LEN);
        assert_eq!(port_key_prefix_len(16), PORT_KEY_FULL_PREFIX_LEN);
    }

    #[test]
    fn mapped_addresses() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
        let mapped = mapped_addr(v4);
        assert_eq!(&mapped[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&mapped[12..], &[10, 1, 2, 3]);
        assert_eq!(unmapped_addr(mapped), v4);
        let v6 = IpAddr::V6("fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(unmapped_addr(mapped_addr(v6)), v6);
    }

    #[test]
    fn keys_clear_host_bits() {
        let key = PolicyKey::lpm(7, "10.1.2.3".parse().unwrap(), 16);
        assert_eq!(key.prefix_len(), 32 + 96 + 16);
        assert_eq!(key.data().policy_id, 7);
        assert_eq!(
            key.data().addr,
            mapped_addr("10.1.0.0".parse().unwrap()),
            "host bits must be cleared"
        );
        let key = PolicyKey::lpm(1, "fd00::1234".parse().unwrap(), 120);
        assert_eq!(key.data().addr, mapped_addr("fd00::1200".parse().unwrap()));

        let key = PortKey::lpm(3, PROTO_TCP, 8005, 13);
        assert_eq!(key.prefix_len(), 40 + 13);
        assert_eq!(key.data().port, 8000u16.to_be_bytes());
        assert_eq!(key.data().proto, PROTO_TCP);
        assert_eq!(PortKey::lpm_any_protocol(3).prefix_len(), 32);
    }

    #[test]
    fn ct_key_ports_are_network_order() {
        let key = CtKey::new(
            Tuple {
                src: "10.0.0.1".parse().unwrap(),
                sport: 40000,
                dst: "10.0.0.2".parse().unwrap(),
                dport: 80,
                proto: PROTO_TCP,
            },
            7,
            HOOK_TO_POD,
        );
        let bytes = aya_bytes(&key);
        assert_eq!(&bytes[32..34], &40000u16.to_be_bytes());
        assert_eq!(&bytes[34..36], &80u16.to_be_bytes());
        assert_eq!(&bytes[36..40], &7u32.to_ne_bytes());
        assert_eq!(bytes[40], PROTO_TCP);
        assert_eq!(bytes[41], HOOK_TO_POD);
        assert_eq!(key.sport(), 40000);
        assert_eq!(key.dport(), 80);
        assert_eq!(key.src_ip(), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    fn aya_bytes(key: &CtKey) -> [u8; 44] {
        // SAFETY: CtKey is Pod with size 44 (asserted above).
        unsafe { std::mem::transmute::<CtKey, [u8; 44]>(*key) }
    }

    #[test]
    fn ipv4_conntrack_keys_narrow_and_widen_exactly() {
        let key = CtKey::new(
            Tuple {
                src: "10.0.0.1".parse().unwrap(),
                sport: 40000,
                dst: "10.0.0.2".parse().unwrap(),
                dport: 80,
                proto: PROTO_TCP,
            },
            7,
            HOOK_TO_POD,
        );
        let k4 = Ct4Key::of(&key).unwrap();
        assert_eq!((k4.src, k4.dst), ([10, 0, 0, 1], [10, 0, 0, 2]));
        assert_eq!(k4.sport, key.sport, "ports stay network order");
        assert_eq!(k4.widen(), key);
        let v6 = CtKey {
            src: mapped_addr("fd00::1".parse().unwrap()),
            ..key
        };
        assert_eq!(Ct4Key::of(&v6), None, "one IPv6 address makes an IPv6 flow");
    }

    #[test]
    fn policy_lens_sort_dedup_and_refuse_too_many() {
        let lens = PolicyLens::new([152, 160, 152, 128]).unwrap();
        assert_eq!(lens.lens(), [160, 152, 128]);
        assert_eq!(lens.prefix_len[3..], [0; MAX_POLICY_LENS - 3]);
        assert!(PolicyLens::new(100..100 + MAX_POLICY_LENS as u32).is_some());
        assert!(PolicyLens::new(100..101 + MAX_POLICY_LENS as u32).is_none());
        let key = PolicyKey::lpm(3, "10.1.2.3".parse().unwrap(), 24);
        let exact = PolicyExactKey::of(&key);
        assert_eq!((exact.prefix_len, exact.key), (152, key.data()));
    }

    #[test]
    fn ep_slot_holds_at_most_max_pod_addrs_and_repeats_the_ipv4_ones() {
        let a = mapped_addr("10.0.0.2".parse().unwrap());
        let b = mapped_addr("fd00::2".parse().unwrap());
        let i = Direction {
            policy: 1,
            epoch: 7,
        };
        let e = Direction {
            policy: 2,
            epoch: 8,
        };
        let s = EpSlot::new(9, i, e, &[b, a]).unwrap();
        assert_eq!((s.ifindex, s.home, s.addr_count), (9, 0, 2));
        assert_eq!(s.flags & EP_FLAG_LEARNS, 0, "learns nothing until told");
        assert_eq!(s.pod_addrs(), &[b, a]);
        assert_eq!((s.v4_count, s.v4[0]), (1, [10, 0, 0, 2]));
        assert_eq!((s.ingress(), s.egress()), (i, e));
        assert_eq!(s.ingress, 1 | 7 << 32, "policy id low, epoch high");
        assert!(EpSlot::new(9, i, e, &[a; MAX_POD_ADDRS]).is_some());
        assert!(EpSlot::new(9, i, e, &[a; MAX_POD_ADDRS + 1]).is_none());
        let lying = EpSlot {
            addr_count: 99,
            ..s
        };
        assert_eq!(lying.pod_addrs().len(), MAX_POD_ADDRS);
        let staged = EpSlot {
            audit: audit_word(3, 4),
            ..s
        };
        assert_eq!(staged.audit(), (3, 4));
        assert_eq!(ep_home(7 + EP_SLOTS), 7);
    }

    #[test]
    fn stat_slots_are_kind_major_and_cover_the_map() {
        assert_eq!(stat_slot(HOOK_FROM_POD, STAT_ALLOWED_POLICY), 0);
        assert_eq!(stat_slot(HOOK_TO_POD, STAT_ALLOWED_POLICY), 1);
        assert_eq!(stat_slot(HOOK_FROM_POD, STAT_DENIED), 6);
        let mut seen: Vec<u32> = (0..STAT_COUNT)
            .flat_map(|s| [stat_slot(HOOK_FROM_POD, s), stat_slot(HOOK_TO_POD, s)])
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..STAT_SLOTS).collect::<Vec<_>>());
    }

    #[test]
    fn object_is_an_aligned_bpf_elf() {
        assert_eq!(&OBJECT[..4], b"\x7fELF");
        assert_eq!(OBJECT.as_ptr() as usize % 8, 0);
    }
}
