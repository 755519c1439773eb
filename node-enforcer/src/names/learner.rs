//! The learner's state machine: queries a pod sent to a trusted server,
//! the answers it got, and the overlay entries they make.
//!
//! Every answer is judged on its own before anything is learned: it must
//! come from a trusted server's port 53 (the plan's resolvers), answer a
//! query this pod sent to that server from that address and port, with
//! that id and that question (`palisade_dns::Pending`, consumed once), and
//! be a NOERROR response to an A or AAAA question (`palisade_dns::resolve`).
//! Whatever fails teaches nothing and is counted; the held answer is
//! re-injected all the same (DNS never breaks for learning).
//!
//! An overlay entry is the pod's whole egress verdict for one address
//! (`compile::HostCompiler`): the rules the address was learned for by
//! name, until the earliest of their expiries. When that passes, the entry
//! is recomputed from what is left; the datapath ignores an expired entry
//! for new flows meanwhile, so a late recompute fails closed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use palisade_dns::learned::{Change, Slot};
use palisade_dns::pending::Mismatch;
use palisade_dns::{
    resolve, Learned, Limits, Message, Pattern, Pending, QueryKey, Unlearnable, WireError,
};
use palisade_proto::v1::DirectionPolicy;

use super::frame::{FrameError, Reassembly, ReassemblyLimits};
use super::rules::{DomainRules, PatternError};
use crate::compile::{CompileError, HostCompiler, PortSet, Prefix};

/// The DNS port: queries go to it, answers come from it.
pub const DNS_PORT: u16 = 53;

/// One write to the datapath's overlay, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// New flows from the pod on `ifindex` to `addr` are judged by `ports`
    /// until `expiry` (the learner's clock: CLOCK_BOOTTIME, ns).
    Set {
        ifindex: u32,
        addr: IpAddr,
        ports: PortSet,
        /// The same for the pod's staged egress (None: it has no staged
        /// rule by name, and its staged table decides).
        staged: Option<PortSet>,
        expiry: u64,
    },
    Clear {
        ifindex: u32,
        addr: IpAddr,
    },
}

/// Why a copied frame taught nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ignored {
    #[error("interface {0} is no pod with rules by name")]
    UnknownPod(u32),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("{0} is not a trusted DNS server's port {DNS_PORT}")]
    Untrusted(SocketAddr),
    #[error("the DNS message cannot be read: {0}")]
    Wire(#[from] WireError),
    #[error("a response where a query was expected, or the reverse")]
    Direction,
    #[error("the answer matches no query of the pod's: {0}")]
    Mismatch(#[from] Mismatch),
    #[error("the answer teaches nothing: {0}")]
    Unlearnable(#[from] Unlearnable),
}

impl Ignored {
    /// A short name for the counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Ignored::UnknownPod(_) => "unknown_pod",
            Ignored::Frame(FrameError::Incomplete) => "fragment_held",
            Ignored::Frame(_) => "frame",
            Ignored::Untrusted(_) => "untrusted_server",
            Ignored::Wire(_) => "unreadable",
            Ignored::Direction => "direction",
            Ignored::Mismatch(Mismatch::NoQuery) => "no_query",
            Ignored::Mismatch(Mismatch::Question) => "question",
            Ignored::Mismatch(Mismatch::Late) => "late",
            Ignored::Unlearnable(_) => "unlearnable",
        }
    }
}

/// What the learner has seen; cumulative.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counters {
    pub queries: u64,
    pub answers: u64,
    /// Answers that changed an overlay entry.
    pub learned: u64,
    pub ignored: BTreeMap<&'static str, u64>,
}

/// A learning pod: its egress (and staged egress) as the plan gives it,
/// read for learning.
struct Pod {
    egress: DirectionPolicy,
    staged: Option<DirectionPolicy>,
    node: Vec<Prefix>,
    rules: DomainRules,
    patterns: Vec<Vec<Pattern>>,
    compiler: HostCompiler,
    /// The staged egress's, when it has rules by name.
    staged_compiler: Option<HostCompiler>,
}

/// An overlay entry as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub ports: PortSet,
    pub staged: Option<PortSet>,
    pub expiry: u64,
}

pub struct Learner {
    servers: HashSet<IpAddr>,
    reassembly: Reassembly,
    pending: Pending<u32>,
    learned: Learned<u32>,
    pods: HashMap<u32, Pod>,
    overlay: HashMap<(u32, IpAddr), Entry>,
    /// The same entries by expiry: the next recompute.
    by_expiry: BTreeSet<(u64, u32, IpAddr)>,
    pub counters: Counters,
}

impl Learner {
    /// `servers`: the DNS servers whose answers teach (the cluster DNS
    /// Service's addresses and its backends).
    pub fn new(
        limits: Limits,
        reassembly: ReassemblyLimits,
        servers: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        Learner {
            servers: servers.into_iter().collect(),
            reassembly: Reassembly::new(reassembly),
            pending: Pending::new(&limits),
            learned: Learned::new(limits),
            pods: HashMap::new(),
            overlay: HashMap::new(),
            by_expiry: BTreeSet::new(),
            counters: Counters::default(),
        }
    }

    /// Whether the pod on `ifindex` learns (its copied frames are read).
    pub fn learns(&self, ifindex: u32) -> bool {
        self.pods.contains_key(&ifindex)
    }

    /// The pod on `ifindex` has egress `egress` (None: it is gone, or has
    /// no egress policy) and staged egress `staged` on a node whose
    /// addresses are `node`. A pod with no rule to learn for in either is
    /// forgotten, its entries cleared. Returns the writes, and the
    /// patterns that cannot be read.
    pub fn set_pod(
        &mut self,
        now: u64,
        ifindex: u32,
        egress: Option<&DirectionPolicy>,
        staged: Option<&DirectionPolicy>,
        node: &[Prefix],
    ) -> Result<(Vec<Write>, Vec<PatternError>), CompileError> {
        let staged = staged.filter(|s| super::rules::learns(s));
        let (rules, errors) = egress
            .map(|e| DomainRules::of(e, staged))
            .unwrap_or_default();
        let (Some(egress), false) = (egress, rules.is_empty()) else {
            return Ok((self.forget(ifindex), errors));
        };
        if let Some(pod) = self.pods.get(&ifindex) {
            if pod.egress == *egress && pod.staged.as_ref() == staged && pod.node == node {
                return Ok((Vec::new(), errors));
            }
        }
        let compiler = HostCompiler::new(egress, node)?;
        let staged_compiler = staged.map(|s| HostCompiler::new(s, node)).transpose()?;
        let patterns = rules.patterns();
        let renumbered = self.pods.get(&ifindex).is_some_and(|p| p.rules != rules);
        self.pods.insert(
            ifindex,
            Pod {
                egress: egress.clone(),
                staged: staged.cloned(),
                node: node.to_vec(),
                rules,
                patterns,
                compiler,
                staged_compiler,
            },
        );
        let mut addrs: BTreeSet<IpAddr> = self
            .overlay
            .keys()
            .filter(|(i, _)| *i == ifindex)
            .map(|(_, a)| *a)
            .collect();
        if renumbered {
            let pod = &self.pods[&ifindex];
            for change in self.learned.rules_changed(now, &ifindex, &pod.patterns) {
                addrs.insert(changed_addr(&change));
            }
        }
        let writes = addrs
            .into_iter()
            .filter_map(|a| self.recompute(now, ifindex, a))
            .collect();
        Ok((writes, errors))
    }

    /// Forgets the pod on `ifindex`: its queries, names and entries.
    pub fn forget(&mut self, ifindex: u32) -> Vec<Write> {
        self.pods.remove(&ifindex);
        self.pending.forget(&ifindex);
        self.learned.forget(&ifindex);
        self.reassembly.forget(ifindex);
        let addrs: Vec<IpAddr> = self
            .overlay
            .keys()
            .filter(|(i, _)| *i == ifindex)
            .map(|(_, a)| *a)
            .collect();
        addrs
            .into_iter()
            .map(|addr| {
                let e = self.overlay.remove(&(ifindex, addr)).expect("listed");
                self.by_expiry.remove(&(e.expiry, ifindex, addr));
                Write::Clear { ifindex, addr }
            })
            .collect()
    }

    fn count(&mut self, e: Ignored) -> Ignored {
        *self.counters.ignored.entry(e.reason()).or_default() += 1;
        e
    }

    /// A query the pod on `ifindex` sent, copied at `now`.
    pub fn query(&mut self, now: u64, ifindex: u32, frame: &[u8]) -> Result<(), Ignored> {
        self.counters.queries += 1;
        let r = self.read_query(now, ifindex, frame);
        r.map_err(|e| self.count(e))
    }

    fn read_query(&mut self, now: u64, ifindex: u32, frame: &[u8]) -> Result<(), Ignored> {
        if !self.learns(ifindex) {
            return Err(Ignored::UnknownPod(ifindex));
        }
        let d = self.reassembly.datagram(now, ifindex, frame)?;
        if d.dst.port() != DNS_PORT || !self.servers.contains(&d.dst.ip()) {
            return Err(Ignored::Untrusted(d.dst));
        }
        let msg = Message::parse(&d.payload)?;
        if msg.header.response {
            return Err(Ignored::Direction);
        }
        let key = QueryKey {
            client: d.src,
            server: d.dst,
            id: msg.header.id,
        };
        self.pending.sent(now, &ifindex, key, msg.question);
        Ok(())
    }

    /// An answer to the pod on `ifindex`, held by the datapath since `now`:
    /// the overlay writes to make before it is re-injected.
    pub fn answer(&mut self, now: u64, ifindex: u32, frame: &[u8]) -> Result<Vec<Write>, Ignored> {
        self.counters.answers += 1;
        let r = self.read_answer(now, ifindex, frame);
        match r {
            Ok(writes) => {
                self.counters.learned += u64::from(!writes.is_empty());
                Ok(writes)
            }
            Err(e) => Err(self.count(e)),
        }
    }

    fn read_answer(&mut self, now: u64, ifindex: u32, frame: &[u8]) -> Result<Vec<Write>, Ignored> {
        if !self.learns(ifindex) {
            return Err(Ignored::UnknownPod(ifindex));
        }
        let d = self.reassembly.datagram(now, ifindex, frame)?;
        if d.src.port() != DNS_PORT || !self.servers.contains(&d.src.ip()) {
            return Err(Ignored::Untrusted(d.src));
        }
        let msg = Message::parse(&d.payload)?;
        if !msg.header.response {
            return Err(Ignored::Direction);
        }
        let key = QueryKey {
            client: d.dst,
            server: d.src,
            id: msg.header.id,
        };
        self.pending.answered(now, &ifindex, &key, &msg.question)?;
        let resolution = resolve(&msg)?;
        let pod = &self.pods[&ifindex];
        let learning = self
            .learned
            .learn(now, &ifindex, &pod.patterns, &resolution);
        let addrs: BTreeSet<IpAddr> = learning.changes.iter().map(changed_addr).collect();
        Ok(addrs
            .into_iter()
            .filter_map(|a| self.recompute(now, ifindex, a))
            .collect())
    }

    /// What time has undone by `now`: queries past their timeout,
    /// unfinished datagrams, entries past their expiry.
    pub fn expire(&mut self, now: u64) -> Vec<Write> {
        self.pending.expire(now);
        self.reassembly.expire(now);
        let mut due: BTreeSet<(u32, IpAddr)> = self
            .learned
            .expire(now)
            .into_iter()
            .map(|(pod, c)| (pod, changed_addr(&c)))
            .collect();
        due.extend(
            self.by_expiry
                .iter()
                .take_while(|(e, _, _)| *e <= now)
                .map(|&(_, i, a)| (i, a)),
        );
        due.into_iter()
            .filter_map(|(i, a)| self.recompute(now, i, a))
            .collect()
    }

    /// When [`Learner::expire`] next has something to do for the overlay.
    pub fn next_expiry(&self) -> Option<u64> {
        self.by_expiry.first().map(|(e, _, _)| *e)
    }

    /// The pod's overlay entries, for the state dump.
    pub fn entries(&self, ifindex: u32) -> Vec<(IpAddr, &Entry)> {
        let mut out: Vec<(IpAddr, &Entry)> = self
            .overlay
            .iter()
            .filter(|((i, _), _)| *i == ifindex)
            .map(|((_, a), e)| (*a, e))
            .collect();
        out.sort_by_key(|(a, _)| *a);
        out
    }

    /// The pod's learned names, each with its addresses and expiries.
    pub fn names(&self, ifindex: u32) -> Vec<(String, Vec<(IpAddr, u64)>)> {
        let mut out: Vec<(String, Vec<(IpAddr, u64)>)> = self
            .learned
            .names(&ifindex)
            .map(|(n, a)| (n.to_string(), a.to_vec()))
            .collect();
        out.sort();
        out
    }

    /// Queries waiting for their answer.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// What the caps pushed out.
    pub fn evictions(&self) -> (&palisade_dns::learned::Counters, u64, u64) {
        (
            &self.learned.counters,
            self.pending.evicted,
            self.reassembly.dropped,
        )
    }

    /// The entry (ifindex, addr) as what is learned now makes it.
    fn recompute(&mut self, now: u64, ifindex: u32, addr: IpAddr) -> Option<Write> {
        let want = self.pods.get(&ifindex).and_then(|pod| {
            let live: Vec<(Slot, u64)> = (0..pod.rules.len())
                .filter_map(|s| {
                    let slot = Slot::try_from(s).ok()?;
                    let e = self.learned.expiry(&ifindex, slot, addr)?;
                    (e > now).then_some((slot, e))
                })
                .collect();
            let expiry = live.iter().map(|(_, e)| *e).min()?;
            let slots = || live.iter().map(|(s, _)| *s);
            Some(Entry {
                ports: pod.compiler.port_set(addr, &pod.rules.named(slots())),
                staged: pod
                    .staged_compiler
                    .as_ref()
                    .map(|c| c.port_set(addr, &pod.rules.named_staged(slots()))),
                expiry,
            })
        });
        let have = self.overlay.get(&(ifindex, addr));
        if have == want.as_ref() {
            return None;
        }
        if let Some(old) = self.overlay.remove(&(ifindex, addr)) {
            self.by_expiry.remove(&(old.expiry, ifindex, addr));
        }
        match want {
            Some(e) => {
                self.by_expiry.insert((e.expiry, ifindex, addr));
                let write = Write::Set {
                    ifindex,
                    addr,
                    ports: e.ports.clone(),
                    staged: e.staged.clone(),
                    expiry: e.expiry,
                };
                self.overlay.insert((ifindex, addr), e);
                Some(write)
            }
            None => Some(Write::Clear { ifindex, addr }),
        }
    }
}

fn changed_addr(c: &Change) -> IpAddr {
    match *c {
        Change::Upsert { addr, .. } | Change::Remove { addr, .. } => addr,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use palisade_dns::wire::{
        Header, Question, RData, Record, CLASS_IN, TYPE_A, TYPE_AAAA, TYPE_CNAME,
    };
    use palisade_dns::Name;
    use palisade_proto::v1::{IpPrefix, PeerBlock, PortRange, Protocol, TierAction, TierRule};

    use super::super::frame::build;
    use super::*;

    const S: u64 = 1_000_000_000;
    const POD: u32 = 7;
    const OTHER_POD: u32 = 8;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn name(s: &str) -> Name {
        Name::from_labels(s.split('.').map(str::as_bytes)).unwrap()
    }

    fn message(id: u16, q: &str, qtype: u16, response: bool, answers: Vec<Record>) -> Vec<u8> {
        Message {
            header: Header {
                id,
                response,
                opcode: 0,
                truncated: false,
                rcode: 0,
            },
            question: Question {
                name: name(q),
                qtype,
                qclass: CLASS_IN,
            },
            answers,
        }
        .encode()
    }

    fn a(owner: &str, ttl: u32, ip: [u8; 4]) -> Record {
        Record {
            name: name(owner),
            rtype: TYPE_A,
            class: CLASS_IN,
            ttl,
            data: RData::A(Ipv4Addr::from(ip)),
        }
    }

    fn tcp(port: u32) -> PortRange {
        PortRange {
            protocol: Protocol::Tcp as i32,
            port,
            end_port: 0,
        }
    }

    fn block(cidr: [u8; 4], len: u32) -> PeerBlock {
        PeerBlock {
            cidr: Some(IpPrefix {
                addr: cidr.to_vec(),
                prefix_len: len,
            }),
            except: vec![],
        }
    }

    /// Admin: Deny 10.9.0.0/16 on TCP, then Accept by name on TCP 443;
    /// Baseline: Deny everything.
    fn egress(names: &[&str]) -> DirectionPolicy {
        DirectionPolicy {
            admin: vec![
                TierRule {
                    action: TierAction::Deny as i32,
                    peers: vec![block([10, 9, 0, 0], 16)],
                    ports: vec![PortRange {
                        protocol: Protocol::Tcp as i32,
                        port: 0,
                        end_port: 0,
                    }],
                    ..Default::default()
                },
                TierRule {
                    action: TierAction::Accept as i32,
                    domain_names: names.iter().map(|s| s.to_string()).collect(),
                    ports: vec![tcp(443)],
                    ..Default::default()
                },
            ],
            baseline: vec![TierRule {
                action: TierAction::Deny as i32,
                peers: vec![block([0, 0, 0, 0], 0)],
                ..Default::default()
            }],
            not_isolated: true,
            ..Default::default()
        }
    }

    const CLIENT: &str = "10.0.1.5:40000";
    const SERVER: &str = "10.96.0.10:53";

    fn learner(names: &[&str]) -> Learner {
        let mut l = Learner::new(
            Limits::default(),
            ReassemblyLimits::default(),
            [sa(SERVER).ip(), "fd00::a".parse().unwrap()],
        );
        let (writes, errors) = l.set_pod(0, POD, Some(&egress(names)), None, &[]).unwrap();
        assert!(writes.is_empty() && errors.is_empty());
        l
    }

    fn ask(l: &mut Learner, now: u64, id: u16, q: &str) {
        let frame = build::datagram(
            sa(CLIENT),
            sa(SERVER),
            &message(id, q, TYPE_A, false, vec![]),
        );
        l.query(now, POD, &frame).unwrap();
    }

    fn answer_frame(id: u16, q: &str, records: Vec<Record>) -> Vec<u8> {
        build::datagram(
            sa(SERVER),
            sa(CLIENT),
            &message(id, q, TYPE_A, true, records),
        )
    }

    /// The pod asks `q` (query `id`) at `now` and gets one A record, TTL
    /// 60 s: the writes it makes.
    fn resolved(l: &mut Learner, now: u64, id: u16, q: &str, ip: [u8; 4]) -> Vec<Write> {
        ask(l, now, id, q);
        l.answer(now, POD, &answer_frame(id, q, vec![a(q, 60, ip)]))
            .unwrap()
    }

    fn set(writes: &[Write]) -> Vec<(IpAddr, u64)> {
        writes
            .iter()
            .map(|w| match w {
                Write::Set { addr, expiry, .. } => (*addr, *expiry),
                Write::Clear { addr, .. } => panic!("clear of {addr}"),
            })
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_answer_to_a_query_writes_the_chain_for_each_address() {
        let mut l = learner(&["*.example.com"]);
        ask(&mut l, 10 * S, 0x1234, "api.example.com");
        let writes = l
            .answer(
                11 * S,
                POD,
                &answer_frame(
                    0x1234,
                    "api.example.com",
                    vec![
                        a("api.example.com", 300, [192, 0, 2, 7]),
                        a("api.example.com", 2, [10, 9, 1, 1]),
                    ],
                ),
            )
            .unwrap();
        // TTL 2 s is raised to the 5 s floor.
        assert_eq!(
            set(&writes),
            [(ip("10.9.1.1"), 16 * S), (ip("192.0.2.7"), 311 * S)]
        );
        let ports = |w: &Write| match w {
            Write::Set { ports, .. } => ports.clone(),
            _ => unreachable!(),
        };
        let open = ports(&writes[1]);
        assert!(open.allows(6, 443) && !open.allows(6, 80) && !open.allows(17, 443));
        // The Admin Deny above the name decides for its addresses.
        assert!(!ports(&writes[0]).allows(6, 443), "{:?}", ports(&writes[0]));
        assert_eq!(l.next_expiry(), Some(16 * S));
        assert_eq!(l.counters.learned, 1);
        assert_eq!(l.names(POD)[0].0, "api.example.com");
    }

    #[test]
    fn no_forged_or_unasked_answer_teaches_anything() {
        let mut l = learner(&["*.example.com"]);
        let rec = || vec![a("api.example.com", 60, [192, 0, 2, 7])];
        let refused = |l: &mut Learner, ifindex: u32, frame: Vec<u8>| {
            l.answer(S, ifindex, &frame).unwrap_err()
        };

        // Nothing asked.
        assert_eq!(
            refused(&mut l, POD, answer_frame(1, "api.example.com", rec())),
            Ignored::Mismatch(Mismatch::NoQuery)
        );
        ask(&mut l, 0, 1, "api.example.com");
        // From a server the policy does not trust, or another port of it.
        for from in ["10.96.0.11:53", "10.0.1.6:53", "10.96.0.10:5353"] {
            let f = build::datagram(
                sa(from),
                sa(CLIENT),
                &message(1, "api.example.com", TYPE_A, true, rec()),
            );
            assert_eq!(refused(&mut l, POD, f), Ignored::Untrusted(sa(from)));
        }
        // To another port of the pod, or with another id.
        let f = build::datagram(
            sa(SERVER),
            sa("10.0.1.5:40001"),
            &message(1, "api.example.com", TYPE_A, true, rec()),
        );
        assert_eq!(
            refused(&mut l, POD, f),
            Ignored::Mismatch(Mismatch::NoQuery)
        );
        assert_eq!(
            refused(&mut l, POD, answer_frame(2, "api.example.com", rec())),
            Ignored::Mismatch(Mismatch::NoQuery)
        );
        // Another pod cannot use this pod's query (nor an unknown one).
        l.set_pod(0, OTHER_POD, Some(&egress(&["*.example.com"])), None, &[])
            .unwrap();
        assert_eq!(
            refused(&mut l, OTHER_POD, answer_frame(1, "api.example.com", rec())),
            Ignored::Mismatch(Mismatch::NoQuery)
        );
        assert_eq!(
            refused(&mut l, 99, answer_frame(1, "api.example.com", rec())),
            Ignored::UnknownPod(99)
        );
        // Another question (the query stays for the real answer).
        assert_eq!(
            refused(&mut l, POD, answer_frame(1, "evil.example.com", rec())),
            Ignored::Mismatch(Mismatch::Question)
        );
        // A query on the answer path.
        let q = build::datagram(
            sa(SERVER),
            sa(CLIENT),
            &message(1, "api.example.com", TYPE_A, false, vec![]),
        );
        assert_eq!(refused(&mut l, POD, q), Ignored::Direction);
        // The real answer teaches; the same answer again does not.
        assert_eq!(
            l.answer(S, POD, &answer_frame(1, "api.example.com", rec()))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            refused(&mut l, POD, answer_frame(1, "api.example.com", rec())),
            Ignored::Mismatch(Mismatch::NoQuery)
        );
        // A query to an untrusted server is not even kept.
        let q = build::datagram(
            sa(CLIENT),
            sa("8.8.8.8:53"),
            &message(3, "api.example.com", TYPE_A, false, vec![]),
        );
        assert_eq!(
            l.query(S, POD, &q),
            Err(Ignored::Untrusted(sa("8.8.8.8:53")))
        );
        assert!(l.entries(OTHER_POD).is_empty());
        assert_eq!(l.counters.ignored["untrusted_server"], 4);
    }

    #[test]
    fn a_name_no_rule_matches_and_an_answer_without_addresses_teach_nothing() {
        let mut l = learner(&["*.example.com"]);
        ask(&mut l, 0, 1, "example.com"); // `*.` needs a label more
        assert_eq!(
            l.answer(
                S,
                POD,
                &answer_frame(1, "example.com", vec![a("example.com", 60, [192, 0, 2, 1])])
            ),
            Ok(vec![])
        );
        ask(&mut l, 0, 2, "x.example.com");
        let nx = build::datagram(sa(SERVER), sa(CLIENT), &{
            let mut m = Message::parse(&message(2, "x.example.com", TYPE_A, true, vec![])).unwrap();
            m.header.rcode = 3;
            m.encode()
        });
        assert!(matches!(
            l.answer(S, POD, &nx),
            Err(Ignored::Unlearnable(_))
        ));
        assert!(l.entries(POD).is_empty());
        assert_eq!(l.counters.learned, 0);
    }

    #[test]
    fn cname_chains_ipv6_and_fragmented_answers_of_100_addresses() {
        let mut l = learner(&["api.example.com"]);
        let client6 = sa("[fd00:1::5]:40000");
        let server6 = sa("[fd00::a]:53");
        let q = build::datagram(
            client6,
            server6,
            &message(9, "api.example.com", TYPE_AAAA, false, vec![]),
        );
        l.query(0, POD, &q).unwrap();
        let mut records = vec![Record {
            name: name("api.example.com"),
            rtype: TYPE_CNAME,
            class: CLASS_IN,
            ttl: 30,
            data: RData::Cname(name("edge.cdn.net")),
        }];
        for i in 0..100u16 {
            records.push(Record {
                name: name("edge.cdn.net"),
                rtype: TYPE_AAAA,
                class: CLASS_IN,
                ttl: 600,
                data: RData::Aaaa(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i + 1)),
            });
        }
        let payload = message(9, "api.example.com", TYPE_AAAA, true, records);
        assert!(payload.len() > 2000, "{}", payload.len());
        let frags = build::fragments(server6, client6, 77, &payload, 1400);
        let (last, first) = frags.split_last().unwrap();
        for f in first {
            assert_eq!(
                l.answer(S, POD, f),
                Err(Ignored::Frame(FrameError::Incomplete))
            );
        }
        let writes = l.answer(S, POD, last).unwrap();
        assert_eq!(writes.len(), 100);
        // The chain's least TTL: 30 s.
        assert!(set(&writes).iter().all(|&(_, e)| e == 31 * S));
    }

    #[test]
    fn entries_expire_to_what_is_left_and_rule_changes_rewrite_them() {
        // Two rules by name for the same address: 443 for 60 s, 8443 for 600 s.
        let mut d = egress(&["api.example.com"]);
        d.admin.push(TierRule {
            action: TierAction::Accept as i32,
            domain_names: vec!["*.example.com".into()],
            ports: vec![tcp(8443)],
            ..Default::default()
        });
        let mut l = learner(&["api.example.com"]);
        l.set_pod(0, POD, Some(&d), None, &[]).unwrap();
        let w = resolved(&mut l, 0, 1, "api.example.com", [192, 0, 2, 7]);
        let Write::Set { ports, expiry, .. } = &w[0] else {
            panic!()
        };
        assert!(ports.allows(6, 443) && ports.allows(6, 8443));
        assert_eq!(*expiry, 60 * S, "the earliest of its rules'");
        // Nothing is due before.
        assert!(l.expire(59 * S).is_empty());
        // Both rules learned it from the same answer: both expire at 60 s.
        assert_eq!(
            l.expire(60 * S),
            [Write::Clear {
                ifindex: POD,
                addr: ip("192.0.2.7")
            }]
        );
        assert_eq!(l.next_expiry(), None);

        // Learned again; then the policy drops the name: cleared at once.
        ask(&mut l, 70 * S, 2, "api.example.com");
        l.answer(
            70 * S,
            POD,
            &answer_frame(
                2,
                "api.example.com",
                vec![a("api.example.com", 60, [192, 0, 2, 7])],
            ),
        )
        .unwrap();
        let (w, _) = l
            .set_pod(
                71 * S,
                POD,
                Some(&egress(&["other.example.org"])),
                None,
                &[],
            )
            .unwrap();
        assert_eq!(
            w,
            [Write::Clear {
                ifindex: POD,
                addr: ip("192.0.2.7")
            }]
        );

        // Learned again; then only the ports change: rewritten, same expiry.
        l.set_pod(72 * S, POD, Some(&egress(&["api.example.com"])), None, &[])
            .unwrap();
        ask(&mut l, 72 * S, 3, "api.example.com");
        l.answer(
            72 * S,
            POD,
            &answer_frame(
                3,
                "api.example.com",
                vec![a("api.example.com", 60, [192, 0, 2, 7])],
            ),
        )
        .unwrap();
        let mut wider = egress(&["api.example.com"]);
        wider.admin[1].ports.push(tcp(80));
        let (w, _) = l.set_pod(73 * S, POD, Some(&wider), None, &[]).unwrap();
        let Write::Set { ports, expiry, .. } = &w[0] else {
            panic!("{w:?}")
        };
        assert!(ports.allows(6, 80) && ports.allows(6, 443));
        assert_eq!(*expiry, 132 * S);

        // The pod goes: everything of it is cleared.
        assert_eq!(
            l.set_pod(74 * S, POD, None, None, &[]).unwrap().0,
            [Write::Clear {
                ifindex: POD,
                addr: ip("192.0.2.7")
            }]
        );
        assert!(!l.learns(POD));
    }

    #[test]
    fn staged_rules_by_name_give_the_staged_port_set_and_a_staged_only_pod_learns() {
        let mut l = Learner::new(
            Limits::default(),
            ReassemblyLimits::default(),
            [sa(SERVER).ip()],
        );
        // Enforced: not isolated, no names (the staged policy is the
        // pod's first); staged: the example's Accept of api.example.com.
        let open = DirectionPolicy {
            not_isolated: true,
            ..Default::default()
        };
        let staged = egress(&["api.example.com"]);
        l.set_pod(0, POD, Some(&open), Some(&staged), &[]).unwrap();
        assert!(l.learns(POD), "staged names alone make a pod learn");
        let staged_ports = |w: &[Write]| match &w[0] {
            Write::Set { staged, .. } => staged.clone().expect("a staged port set"),
            other => panic!("{other:?}"),
        };
        let w = resolved(&mut l, S, 1, "api.example.com", [192, 0, 2, 7]);
        let ports = staged_ports(&w);
        assert!(ports.allows(6, 443) && !ports.allows(6, 80), "{ports:?}");
        // A staged policy without names changes nothing: the pod forgets.
        let w = l
            .set_pod(2 * S, POD, Some(&open), Some(&open), &[])
            .unwrap()
            .0;
        assert_eq!(
            w,
            [Write::Clear {
                ifindex: POD,
                addr: ip("192.0.2.7")
            }]
        );
        assert!(!l.learns(POD));
        // Enforced names and no staged ones: no staged port set.
        l.set_pod(3 * S, POD, Some(&egress(&["api.example.com"])), None, &[])
            .unwrap();
        let w = resolved(&mut l, 3 * S, 2, "api.example.com", [192, 0, 2, 7]);
        assert!(matches!(&w[0], Write::Set { staged: None, .. }), "{w:?}");
    }
}
