//! The kernel side: the real programs and the benchmark's own, the policy
//! tables, and one measured BPF_PROG_TEST_RUN per row.
//!
//! NetworkPolicy tables are written as rules straight into the maps (as
//! the enforcer writes them); a tiered table (Admin rules in front of the
//! same rules) is what the enforcer makes of the pod's direction:
//! `node_enforcer::compile::compile`, written by its own `BpfDatapath` into
//! the same pinned maps.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use aya::maps::ProgramArray;
use aya::programs::SchedClassifier;
use aya::{Ebpf, EbpfLoader};
use node_enforcer::compile::{compile, PolicySet, PortSet};
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::Datapath;
use palisade_ebpf::testkit::frames::{ipv4_fragment, tcp, tcp_flags, udp, SYN};
use palisade_ebpf::testkit::*;
use palisade_ebpf::*;

use crate::report::Sample;
use crate::scenario::{admin_rules, direction, Policy, Row, PEER_PORT};

/// Runs per measurement of rows whose packet stays the same kind of packet
/// however often it is repeated (issue 6 asks for at least a million).
pub const REPEAT_STEADY: u32 = 1_000_000;
/// Runs per measurement through the new-flow wrapper: one per source port
/// it hands out, so no run of it meets a flow an earlier run made.
pub const REPEAT_NEW: u32 = BENCH_NEW_FLOW_PORTS;

/// The IPv4 id of the fragmented datagrams; one per table is enough, as
/// every datagram's record is made again at the start of its row.
const FRAGMENT_ID: u16 = 0x4242;

/// Tiered tables' ids start here, apart from the NetworkPolicy tables'
/// (1, 2, ...), policy ids and port set ids alike.
const TIERED_IDS: u32 = 1 << 20;

/// One pod's policy at one rule count (behind `admin` Admin rules, or
/// none), and the frames its rows send.
struct Table {
    rules: usize,
    admin: usize,
    policy_id: u32,
    fwd: Vec<u8>,
    reply: Vec<u8>,
    denied: Vec<u8>,
    new_flow: Vec<u8>,
    new_flow_udp: Vec<u8>,
    /// A UDP datagram in two fragments to the allowed peer, and to the
    /// denied one: (first, later).
    fragments_allowed: (Vec<u8>, Vec<u8>),
    fragments_denied: (Vec<u8>, Vec<u8>),
}

/// A tiered direction compiled, before it is written.
struct Tiered {
    rules: usize,
    admin: usize,
    peers: (Ipv4Addr, Ipv4Addr),
    set: PolicySet,
}

pub struct Bench {
    /// Wrote the tiered tables; declared before the harness, whose pins
    /// go with it.
    _datapath: Option<BpfDatapath>,
    harness: Harness,
    /// The headers-by-copy build, sharing the harness's pinned maps.
    by_copy: Ebpf,
    extra: Ebpf,
    tables: Vec<Table>,
    pub ct_filled: usize,
    /// Entries the policy maps were made with, and how many are used.
    pub policy_entries: (u32, usize),
}

impl Bench {
    /// Compiles the tiered directions (each of `policies` behind each of
    /// `admin` Admin rules), loads both objects and writes every table at
    /// once under its own policy id (as on a node, where many policies
    /// share the trie). The policy maps are made big enough for every
    /// table at once, and never smaller than a node's.
    pub fn new(policies: &[Policy], admin: &[usize], seed: u64) -> Self {
        let mut tiered = Vec::new();
        for policy in policies {
            for &a in admin {
                let direction = direction(policy, admin_rules(a, seed ^ a as u64, policy));
                let set = compile(&direction, &[]).expect("the bench's direction compiles");
                let judged = |peer: Ipv4Addr| set.allows(IpAddr::V4(peer), PROTO_TCP, PEER_PORT);
                assert!(
                    judged(policy.allowed_peer) && !judged(policy.denied_peer),
                    "the Admin rules decided a measured flow"
                );
                tiered.push(Tiered {
                    rules: policy.rules.len(),
                    admin: a,
                    peers: (policy.allowed_peer, policy.denied_peer),
                    set,
                });
            }
        }
        let used = policies.iter().map(|p| p.rules.len()).sum::<usize>()
            + tiered.iter().map(|t| t.set.entries.len()).sum::<usize>();
        let entries = (used.next_power_of_two() as u32).max(MAX_POLICY_ENTRIES);
        let mut harness = Harness::with_policy_entries(entries);
        let mut extra = EbpfLoader::new()
            .load(testkit::BENCH_OBJECT)
            .unwrap_or_else(|e| panic!("load bench object: {e:?}"));
        for name in [PROG_BENCH_BARE, PROG_BENCH_NEW_FLOW, PROG_BENCH_RETURN] {
            let prog: &mut SchedClassifier = extra.program_mut(name).unwrap().try_into().unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejected {name}: {e:?}"));
        }
        let mut by_copy = EbpfLoader::new()
            .default_map_pin_directory(harness.pins())
            .load(testkit::HEADERS_BY_COPY_OBJECT)
            .unwrap_or_else(|e| panic!("load headers-by-copy object: {e:?}"));
        let prog: &mut SchedClassifier = by_copy
            .program_mut(PROG_FROM_POD)
            .unwrap()
            .try_into()
            .unwrap();
        prog.load()
            .unwrap_or_else(|e| panic!("verifier rejected {PROG_FROM_POD} by copy: {e:?}"));
        let mut tables = Vec::new();
        let mut sport = 40000;
        for (i, policy) in policies.iter().enumerate() {
            let policy_id = i as u32 + 1;
            let portset_id = policy_id;
            harness.ports(portset_id, PROTO_TCP, PEER_PORT, PEER_PORT);
            harness.ports(portset_id, PROTO_UDP, PEER_PORT, PEER_PORT);
            for &(net, len) in &policy.rules {
                harness.rule(&PolicyKey::lpm(policy_id, IpAddr::V4(net), len), portset_id);
            }
            tables.push(Table::new(
                policy.rules.len(),
                0,
                policy_id,
                sport,
                (policy.allowed_peer, policy.denied_peer),
            ));
            sport += 1;
        }
        let datapath = (!tiered.is_empty()).then(|| {
            // The enforcer's own writes, on the harness's pinned maps.
            let mut dp = BpfDatapath::load(harness.pins()).expect("the enforcer's datapath loads");
            let mut portsets: BTreeMap<PortSet, u32> = BTreeMap::new();
            for (i, t) in tiered.iter().enumerate() {
                let policy_id = TIERED_IDS + i as u32;
                let mut entries = Vec::with_capacity(t.set.entries.len());
                for (prefix, ports) in &t.set.entries {
                    let id = if ports.0.is_empty() {
                        0
                    } else {
                        let next = TIERED_IDS + portsets.len() as u32 + 1;
                        let id = *portsets.entry(ports.clone()).or_insert(next);
                        if id == next {
                            dp.add_portset(id, ports).expect("port set written");
                        }
                        id
                    };
                    entries.push((*prefix, id));
                }
                dp.add_policy(policy_id, &entries).expect("table written");
                tables.push(Table::new(t.rules, t.admin, policy_id, sport, t.peers));
                sport += 1;
            }
            dp
        });
        // Every new-flow row makes tens of thousands of entries for one
        // pod, which user space then forgets behind the counters' back:
        // no share, though every new flow still pays for checking it. (Set
        // after the enforcer's load, which sets its own.)
        harness.set_ct_share(u32::MAX);
        Bench {
            _datapath: datapath,
            harness,
            by_copy,
            extra,
            tables,
            ct_filled: 0,
            policy_entries: (entries, used),
        }
    }

    /// The NetworkPolicy tables' rule counts, in the order written.
    pub fn rule_counts(&self) -> Vec<usize> {
        self.tables
            .iter()
            .filter(|t| t.admin == 0)
            .map(|t| t.rules)
            .collect()
    }

    /// Prepares and measures `row` against the table of `rules` rules
    /// behind `admin` Admin rules (0: NetworkPolicy's table alone; rows of
    /// neither table, bare and wrapper, use that one).
    pub fn measure(&mut self, round: usize, rules: usize, row: Row, admin: usize) -> Sample {
        let t = self
            .tables
            .iter()
            .position(|t| t.rules == rules && t.admin == admin)
            .expect("a table of that many rules and Admin rules");
        let table = &self.tables[t];
        // Both directions isolated by this table, with an epoch of its own:
        // entries written under another table's turn are re-judged, never
        // trusted.
        let id = table.policy_id;
        self.harness.switch(id, id, id, id);
        let (rules, fwd, reply, denied) = (
            table.rules,
            table.fwd.clone(),
            table.reply.clone(),
            table.denied.clone(),
        );
        let (fragments_allowed, fragments_denied) = (
            table.fragments_allowed.clone(),
            table.fragments_denied.clone(),
        );
        let new_flow = match row {
            Row::NewAllowedUdp | Row::NewAllowedUdpCtFull => table.new_flow_udp.clone(),
            _ => table.new_flow.clone(),
        };
        let (prog, frame, repeat, verdict, stat) = match row {
            Row::Bare => (
                self.extra_prog(PROG_BENCH_BARE),
                fwd,
                REPEAT_STEADY,
                0,
                None,
            ),
            Row::Wrapper => {
                self.target(PROG_BENCH_RETURN);
                (
                    self.extra_prog(PROG_BENCH_NEW_FLOW),
                    new_flow,
                    REPEAT_NEW,
                    ALLOW,
                    None,
                )
            }
            Row::EstablishedFwd | Row::EstablishedFwdTiers => {
                self.expect(PROG_FROM_POD, &fwd, ALLOW);
                let prog = self.harness.program(PROG_FROM_POD);
                (
                    prog,
                    fwd,
                    REPEAT_STEADY,
                    ALLOW,
                    Some(STAT_ALLOWED_ESTABLISHED),
                )
            }
            Row::EstablishedFwdByCopy => {
                self.expect(PROG_FROM_POD, &fwd, ALLOW);
                let prog: &SchedClassifier = self
                    .by_copy
                    .program(PROG_FROM_POD)
                    .unwrap()
                    .try_into()
                    .unwrap();
                (
                    prog,
                    fwd,
                    REPEAT_STEADY,
                    ALLOW,
                    Some(STAT_ALLOWED_ESTABLISHED),
                )
            }
            Row::EstablishedReply => {
                self.expect(PROG_FROM_POD, &fwd, ALLOW);
                let prog = self.harness.program(PROG_TO_POD);
                (prog, reply, REPEAT_STEADY, ALLOW, Some(STAT_ALLOWED_REPLY))
            }
            Row::NewAllowed
            | Row::NewAllowedCtFull
            | Row::NewAllowedUdp
            | Row::NewAllowedUdpCtFull
            | Row::NewAllowedTiers => {
                self.harness.ct_clear();
                if matches!(row, Row::NewAllowedCtFull | Row::NewAllowedUdpCtFull) {
                    self.fill_conntrack();
                }
                self.target(PROG_FROM_POD);
                let prog = self.extra_prog(PROG_BENCH_NEW_FLOW);
                (prog, new_flow, REPEAT_NEW, ALLOW, Some(STAT_ALLOWED_POLICY))
            }
            Row::NewDenied | Row::NewDeniedTiers => {
                let prog = self.harness.program(PROG_FROM_POD);
                (prog, denied, REPEAT_STEADY, DROP, Some(STAT_DENIED))
            }
            // The first fragment leaves its record under this turn's
            // epochs; every run is then its datagram's later fragment.
            Row::FragmentAllowed => {
                self.expect(PROG_FROM_POD, &fragments_allowed.0, ALLOW);
                let prog = self.harness.program(PROG_FROM_POD);
                (
                    prog,
                    fragments_allowed.1,
                    REPEAT_STEADY,
                    ALLOW,
                    Some(STAT_ALLOWED_FRAGMENT),
                )
            }
            Row::FragmentDenied => {
                self.expect(PROG_FROM_POD, &fragments_denied.0, DROP);
                let prog = self.harness.program(PROG_FROM_POD);
                (
                    prog,
                    fragments_denied.1,
                    REPEAT_STEADY,
                    DROP,
                    Some(STAT_DENIED_FRAGMENT),
                )
            }
        };
        let before = self.harness.stats();
        let result = test_run(prog, LO, &frame, repeat);
        assert_eq!(
            result.return_value,
            verdict,
            "{} at {rules} rules ({admin} Admin): wrong verdict, the row measured another path",
            row.name()
        );
        if let Some(s) = stat {
            let after = self.harness.stats();
            let counted = after[s as usize] - before[s as usize];
            let by_stat: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
            assert_eq!(
                counted,
                u64::from(repeat),
                "{} at {rules} rules ({admin} Admin): {counted} of {repeat} runs took the path (runs by STAT_* index: {by_stat:?})",
                row.name()
            );
        }
        Sample {
            round,
            rules,
            admin,
            row,
            ns: result.duration.as_nanos() as f64,
            repeat,
        }
    }

    fn extra_prog(&self, name: &str) -> &SchedClassifier {
        self.extra.program(name).unwrap().try_into().unwrap()
    }

    /// Puts `name` (of either object) in the wrapper's slot 0.
    fn target(&mut self, name: &str) {
        let fd = if name == PROG_BENCH_RETURN {
            self.extra_prog(name).fd().unwrap().try_clone().unwrap()
        } else {
            self.harness
                .program(name)
                .fd()
                .unwrap()
                .try_clone()
                .unwrap()
        };
        let mut slots: ProgramArray<_> =
            ProgramArray::try_from(self.extra.map_mut(MAP_BENCH_TARGETS).unwrap()).unwrap();
        slots.set(0, &fd, 0).unwrap();
    }

    fn expect(&self, prog: &str, frame: &[u8], verdict: u32) {
        assert_eq!(
            self.harness.run(prog, frame),
            verdict,
            "setting up via {prog}"
        );
    }

    /// Fills conntrack to its size with flows of an interface no packet
    /// comes from, so every new flow of the run evicts one.
    fn fill_conntrack(&mut self) {
        let mut ct = self.harness.conntrack4();
        for i in 0..MAX_CONNTRACK_ENTRIES {
            let key = Ct4Key::of(&CtKey::new(
                Tuple {
                    src: IpAddr::V4(Ipv4Addr::from(0x0a80_0000 | i)),
                    sport: 40000,
                    dst: IpAddr::V4(Ipv4Addr::new(10, 129, 0, 1)),
                    dport: 80,
                    proto: PROTO_TCP,
                },
                u32::MAX,
                HOOK_FROM_POD,
            ))
            .expect("IPv4");
            let value = CtValue::default();
            ct.insert(key, value, 0).unwrap();
        }
        if self.ct_filled == 0 {
            self.ct_filled = self.harness.ct_len();
        }
    }
}

impl Table {
    /// Table `policy_id`'s frames, from source port `sport`, to its
    /// (allowed, denied) peers.
    fn new(
        rules: usize,
        admin: usize,
        policy_id: u32,
        sport: u16,
        (allowed, denied): (Ipv4Addr, Ipv4Addr),
    ) -> Table {
        let peer = allowed.to_string();
        let denied = denied.to_string();
        let fragmented = |to: &str| {
            let mut datagram = udp(POD4, sport, to, PEER_PORT)[14 + 20..].to_vec();
            datagram.resize(16 + 1400, 0);
            (
                ipv4_fragment(POD4, to, PROTO_UDP, FRAGMENT_ID, 0, true, &datagram[..16]),
                ipv4_fragment(POD4, to, PROTO_UDP, FRAGMENT_ID, 16, false, &datagram[16..]),
            )
        };
        Table {
            rules,
            admin,
            policy_id,
            // Segments of a connection under way (ACK) ...
            fwd: tcp(POD4, sport, &peer, PEER_PORT),
            reply: tcp(&peer, PEER_PORT, POD4, sport),
            // ... and first segments (SYN), as new connections send.
            denied: tcp_flags(POD4, sport, &denied, PEER_PORT, SYN),
            // The wrapper overwrites the source port of every run.
            new_flow: tcp_flags(POD4, 0, &peer, PEER_PORT, SYN),
            new_flow_udp: udp(POD4, 0, &peer, PEER_PORT),
            fragments_allowed: fragmented(&peer),
            fragments_denied: fragmented(&denied),
        }
    }
}
