//! Compiles a direction with ClusterNetworkPolicy tiers into the same one
//! LPM table NetworkPolicy uses, so the datapath judges every tier in one
//! lookup per new flow and its established fast path does not change.
//!
//! Every prefix the direction mentions (a rule's CIDR or except, a node
//! address, and `::/0` for the rest) names the addresses whose longest
//! match it is. For those addresses, which rules match is decided by
//! containment of whole prefixes (as in `compile`), so the whole chain can
//! be evaluated per prefix: the Admin tier's rules in order (the first
//! that matches decides Accept or Deny; Pass skips the rest of the tier),
//! then NetworkPolicy if it isolates the pod (allowed iff a rule allows),
//! then the Baseline tier likewise, then allow (the default; strict mode
//! adds a last Baseline rule that denies everything, see `desired.rs`).
//!
//! What the chain decides per protocol and port is piecewise constant: for
//! every protocol other than TCP, UDP and SCTP (which only rules without
//! ports match) one value, and for each of those three, intervals of ports
//! between the rules' range boundaries. A prefix's port set holds it as a
//! longest-prefix match: `Any` for the other protocols' value, a protocol's
//! most common value where it differs, and port blocks where a range
//! differs from that (`PortEntry::DenyProto` and `DenyBlock` deny inside
//! what a less specific entry allows).
//!
//! The node's own addresses stay allowed whatever the tiers say (kubelet
//! probes), as in every isolated direction.
//!
//! A host learned by domain name gets the same chain evaluated for it
//! alone, with the rules by name that it was learned for matching it
//! ([`host_port_set`]): the port set of its overlay entry.

use std::collections::{BTreeSet, HashMap};

use palisade_proto::v1::{DirectionPolicy, PortRange, Protocol, TierAction, TierRule};

use super::{BlockIndex, CompileError, PolicySet, PortEntry, PortSet, Prefix};

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;
/// The protocols rules can name ports of.
const PORTED: [u8; 3] = [TCP, UDP, SCTP];

/// What a rule matches of the protocol and port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum PortMatch {
    /// Every protocol and port (a rule without ports).
    Any,
    /// `lo..=hi` of one protocol (0..=65535 for every port).
    Range { proto: u8, lo: u32, hi: u32 },
}

impl PortMatch {
    fn matches(&self, proto: Proto, port: u32) -> bool {
        match (self, proto) {
            (PortMatch::Any, _) => true,
            (PortMatch::Range { proto: p, lo, hi }, Proto::Ported(q)) => {
                *p == q && (*lo..=*hi).contains(&port)
            }
            (PortMatch::Range { .. }, Proto::Other) => false,
        }
    }
}

/// A packet's protocol as rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Ported(u8),
    /// Any protocol other than TCP, UDP and SCTP.
    Other,
}

fn port_matches(ports: &[PortRange]) -> Result<Vec<PortMatch>, CompileError> {
    if ports.is_empty() {
        return Ok(vec![PortMatch::Any]);
    }
    ports
        .iter()
        .map(|r| {
            let proto = match Protocol::try_from(r.protocol) {
                Ok(Protocol::Tcp) => TCP,
                Ok(Protocol::Udp) => UDP,
                Ok(Protocol::Sctp) => SCTP,
                _ => return Err(CompileError::Protocol(r.protocol)),
            };
            if r.port == 0 {
                return Ok(PortMatch::Range {
                    proto,
                    lo: 0,
                    hi: 65535,
                });
            }
            let end = if r.end_port == 0 { r.port } else { r.end_port };
            if r.port > 65535 || end > 65535 || end < r.port {
                return Err(CompileError::PortRange { port: r.port, end });
            }
            Ok(PortMatch::Range {
                proto,
                lo: r.port,
                hi: end,
            })
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Accept,
    Deny,
    Pass,
}

fn action(raw: i32) -> Action {
    match TierAction::try_from(raw) {
        Ok(TierAction::Accept) => Action::Accept,
        Ok(TierAction::Pass) => Action::Pass,
        // Unspecified or unknown (a newer controller's): fail closed.
        _ => Action::Deny,
    }
}

/// One tier rule, parsed.
struct Parsed {
    action: Action,
    ports: Vec<PortMatch>,
}

/// A tier's rules and the index of their blocks (tagged by position).
struct Tier {
    rules: Vec<Parsed>,
    index: BlockIndex,
}

impl Tier {
    fn new(rules: &[TierRule], mentioned: &mut Vec<Prefix>) -> Result<Tier, CompileError> {
        let mut parsed = Vec::with_capacity(rules.len());
        let mut blocks = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            parsed.push(Parsed {
                action: action(r.action),
                ports: port_matches(&r.ports)?,
            });
            for peer in &r.peers {
                let (cidr, except) = super::block_of(peer)?;
                mentioned.push(cidr);
                mentioned.extend(except.iter().copied());
                blocks.push((i, cidr, except));
            }
        }
        Ok(Tier {
            rules: parsed,
            index: BlockIndex::new(blocks),
        })
    }
}

/// What decides at one prefix: the rules of each tier that match its
/// addresses (positions, ascending), NetworkPolicy's matching rules (or
/// None when it does not isolate), and whether it is the node's.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Chain {
    admin: Vec<usize>,
    network_policy: Option<Vec<usize>>,
    baseline: Vec<usize>,
    node: bool,
}

struct Compiler {
    admin: Tier,
    baseline: Tier,
    np_ports: Vec<Vec<PortMatch>>,
}

impl Compiler {
    /// The chain's verdict for one protocol and port.
    fn decide(&self, chain: &Chain, proto: Proto, port: u32) -> bool {
        if chain.node {
            return true;
        }
        let tier = |tier: &Tier, matching: &[usize]| -> Option<bool> {
            for &i in matching {
                let r = &tier.rules[i];
                if r.ports.iter().any(|m| m.matches(proto, port)) {
                    return match r.action {
                        Action::Accept => Some(true),
                        Action::Deny => Some(false),
                        Action::Pass => None,
                    };
                }
            }
            None
        };
        if let Some(v) = tier(&self.admin, &chain.admin) {
            return v;
        }
        if let Some(rules) = &chain.network_policy {
            return rules
                .iter()
                .any(|&i| self.np_ports[i].iter().any(|m| m.matches(proto, port)));
        }
        tier(&self.baseline, &chain.baseline).unwrap_or(true)
    }

    /// The ranges rules of the chain name for `proto`, as the starts of
    /// the intervals over which the verdict is constant.
    fn boundaries(&self, chain: &Chain, proto: u8) -> Vec<u32> {
        let mut starts = BTreeSet::from([0u32]);
        let mut add = |ports: &[PortMatch]| {
            for m in ports {
                if let PortMatch::Range { proto: p, lo, hi } = m {
                    if *p == proto {
                        starts.insert(*lo);
                        if *hi < 65535 {
                            starts.insert(hi + 1);
                        }
                    }
                }
            }
        };
        for &i in &chain.admin {
            add(&self.admin.rules[i].ports);
        }
        for &i in chain.network_policy.iter().flatten() {
            add(&self.np_ports[i]);
        }
        for &i in &chain.baseline {
            add(&self.baseline.rules[i].ports);
        }
        starts.into_iter().collect()
    }

    /// The chain's verdicts as one port set (see the module comment).
    fn port_set(&self, chain: &Chain) -> PortSet {
        let other = self.decide(chain, Proto::Other, 0);
        let mut set = BTreeSet::new();
        if other {
            set.insert(PortEntry::Any);
        }
        for proto in PORTED {
            let starts = self.boundaries(chain, proto);
            // (lo, hi, verdict), adjacent equal verdicts merged.
            let mut runs: Vec<(u32, u32, bool)> = Vec::new();
            for (k, &lo) in starts.iter().enumerate() {
                let hi = starts.get(k + 1).map_or(65535, |n| n - 1);
                let v = self.decide(chain, Proto::Ported(proto), lo);
                match runs.last_mut() {
                    Some(last) if last.2 == v => last.1 = hi,
                    _ => runs.push((lo, hi, v)),
                }
            }
            // The protocol's value: the one most ports have (the one
            // `Any` gives on a tie, so no entry is needed for it).
            let allowed: u32 = runs.iter().filter(|r| r.2).map(|r| r.1 - r.0 + 1).sum();
            let base = match allowed.cmp(&(65536 - allowed)) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Equal => other,
            };
            if base != other {
                set.insert(if base {
                    PortEntry::Proto(proto)
                } else {
                    PortEntry::DenyProto(proto)
                });
            }
            for &(lo, hi, v) in runs.iter().filter(|r| r.2 != base) {
                for (port, bits) in palisade_ebpf::port_prefixes(lo as u16, hi as u16) {
                    set.insert(if v {
                        PortEntry::Block { proto, port, bits }
                    } else {
                        PortEntry::DenyBlock { proto, port, bits }
                    });
                }
            }
        }
        // A set that allows nothing is what a miss gives: empty.
        if !set.iter().any(PortEntry::allows) {
            set.clear();
        }
        PortSet(set)
    }
}

/// A direction read for compiling: its tiers, NetworkPolicy's rules and
/// the node's addresses, indexed by the blocks that match an address.
struct Direction {
    compiler: Compiler,
    np_index: BlockIndex,
    node_index: BlockIndex,
    isolated: bool,
}

impl Direction {
    /// Reads `policy`; every prefix it mentions goes to `mentioned`.
    fn new(
        policy: &DirectionPolicy,
        always_allowed: &[Prefix],
        mentioned: &mut Vec<Prefix>,
    ) -> Result<Direction, CompileError> {
        mentioned.extend(always_allowed.iter().copied());
        let admin = Tier::new(&policy.admin, mentioned)?;
        let baseline = Tier::new(&policy.baseline, mentioned)?;
        let mut np_ports = Vec::with_capacity(policy.rules.len());
        let mut np_blocks = Vec::new();
        for (i, rule) in policy.rules.iter().enumerate() {
            np_ports.push(port_matches(&rule.ports)?);
            for peer in &rule.peers {
                let (cidr, except) = super::block_of(peer)?;
                mentioned.push(cidr);
                mentioned.extend(except.iter().copied());
                np_blocks.push((i, cidr, except));
            }
        }
        Ok(Direction {
            compiler: Compiler {
                admin,
                baseline,
                np_ports,
            },
            np_index: BlockIndex::new(np_blocks),
            node_index: BlockIndex::new(always_allowed.iter().map(|p| (0, *p, vec![])).collect()),
            isolated: !policy.not_isolated,
        })
    }

    /// The rules that decide for the addresses of `p` (a mentioned prefix,
    /// or a host): those whose blocks contain it, and the rules by name
    /// in `named`.
    fn chain(&self, p: &Prefix, named: &Named, covering: &mut Vec<usize>) -> Chain {
        let with = |covering: &Vec<usize>, named: &BTreeSet<usize>| -> Vec<usize> {
            let mut rules = covering.clone();
            if !named.is_empty() {
                rules.extend(named.iter().copied());
                rules.sort_unstable();
                rules.dedup();
            }
            rules
        };
        self.compiler.admin.index.covering(p, covering);
        let admin = with(covering, &named.admin);
        self.compiler.baseline.index.covering(p, covering);
        let baseline = with(covering, &named.baseline);
        let network_policy = if self.isolated {
            self.np_index.covering(p, covering);
            Some(with(covering, &named.network_policy))
        } else {
            None
        };
        self.node_index.covering(p, covering);
        Chain {
            admin,
            network_policy,
            baseline,
            node: !covering.is_empty(),
        }
    }
}

/// Rules of a direction that match an address by name (positions in the
/// plan's lists: `admin`, `rules`, `baseline`), as the enforcer learned
/// from the answers the pod resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Named {
    pub admin: BTreeSet<usize>,
    pub network_policy: BTreeSet<usize>,
    pub baseline: BTreeSet<usize>,
}

/// The port set of one learned host: the direction's whole chain for
/// `host`, as its table would give it, with the rules in `named` matching
/// it besides those whose blocks contain it. This is the datapath's
/// overlay entry for the host, which decides instead of the table: tier
/// order (an Admin Deny above an Accept by name) is already in it. A
/// position in `named` beyond its list, whose rule has no names, or whose
/// tier rule does not Accept, is ignored: only an allow by name can be
/// learned (the controller sends no other), so an overlay entry only ever
/// allows more than the table, and a packet that misses one fails closed.
pub fn host_port_set(
    policy: &DirectionPolicy,
    always_allowed: &[Prefix],
    host: std::net::IpAddr,
    named: &Named,
) -> Result<PortSet, CompileError> {
    Ok(HostCompiler::new(policy, always_allowed)?.port_set(host, named))
}

/// [`host_port_set`] for many hosts of one direction: the direction is
/// read once.
pub struct HostCompiler {
    direction: Direction,
    /// Which positions allow by name, per list.
    learnable: Named,
}

impl HostCompiler {
    pub fn new(policy: &DirectionPolicy, always_allowed: &[Prefix]) -> Result<Self, CompileError> {
        let positions = |n: usize, ok: &dyn Fn(usize) -> bool| (0..n).filter(|&i| ok(i)).collect();
        Ok(HostCompiler {
            direction: Direction::new(policy, always_allowed, &mut Vec::new())?,
            learnable: Named {
                admin: positions(policy.admin.len(), &|i| accepts_by_name(&policy.admin[i])),
                network_policy: positions(policy.rules.len(), &|i| {
                    !policy.rules[i].domain_names.is_empty()
                }),
                baseline: positions(policy.baseline.len(), &|i| {
                    accepts_by_name(&policy.baseline[i])
                }),
            },
        })
    }

    /// The port set of `host` learned for the rules in `named`.
    pub fn port_set(&self, host: std::net::IpAddr, named: &Named) -> PortSet {
        let keep = |want: &BTreeSet<usize>, ok: &BTreeSet<usize>| {
            want.intersection(ok).copied().collect::<BTreeSet<usize>>()
        };
        let named = Named {
            admin: keep(&named.admin, &self.learnable.admin),
            network_policy: keep(&named.network_policy, &self.learnable.network_policy),
            baseline: keep(&named.baseline, &self.learnable.baseline),
        };
        let host = Prefix::from_ip(host, if host.is_ipv4() { 32 } else { 128 });
        let chain = self.direction.chain(&host, &named, &mut Vec::new());
        self.direction.compiler.port_set(&chain)
    }
}

/// Whether a tier rule allows by name (see [`host_port_set`]).
fn accepts_by_name(rule: &TierRule) -> bool {
    !rule.domain_names.is_empty() && action(rule.action) == Action::Accept
}

/// Compiles a direction that has tiers, or that no NetworkPolicy isolates
/// (see the module comment). `always_allowed`: the node's addresses.
pub(super) fn compile_tiered(
    policy: &DirectionPolicy,
    always_allowed: &[Prefix],
) -> Result<PolicySet, CompileError> {
    // Every address is somewhere: the whole space is the last match.
    let mut mentioned: Vec<Prefix> = vec![Prefix::new([0; 16], 0)];
    let direction = Direction::new(policy, always_allowed, &mut mentioned)?;
    mentioned.sort_unstable();
    mentioned.dedup();
    let compiler = &direction.compiler;
    let none = Named::default();
    let mut memo: HashMap<Chain, PortSet> = HashMap::new();
    let mut covering = Vec::new();
    let mut entries: Vec<(Prefix, PortSet)> = Vec::with_capacity(mentioned.len());
    for p in &mentioned {
        let chain = direction.chain(p, &none, &mut covering);
        let ports = match memo.get(&chain) {
            Some(ports) => ports.clone(),
            None => {
                let ports = compiler.port_set(&chain);
                memo.insert(chain, ports.clone());
                ports
            }
        };
        entries.push((*p, ports));
    }
    // An entry that allows nothing matters only below one that allows
    // something; elsewhere a miss already denies.
    let allowing: std::collections::HashSet<Prefix> = entries
        .iter()
        .filter(|(_, ports)| !ports.0.is_empty())
        .map(|(p, _)| *p)
        .collect();
    let mut lens: Vec<u8> = allowing.iter().map(|p| p.len).collect();
    lens.sort_unstable();
    lens.dedup();
    entries.retain(|(p, ports)| {
        !ports.0.is_empty()
            || lens
                .iter()
                .take_while(|&&len| len < p.len)
                .any(|&len| allowing.contains(&Prefix::new(p.addr, len)))
    });
    Ok(PolicySet::new(entries.into_iter().collect()))
}

/// Whether a direction is compiled here rather than by NetworkPolicy's
/// union: it has tiers, or no NetworkPolicy isolates it.
pub(super) fn is_tiered(policy: &DirectionPolicy) -> bool {
    !policy.admin.is_empty() || !policy.baseline.is_empty() || policy.not_isolated
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_proto::v1::{IpPrefix, PeerBlock, Rule};
    use std::net::{IpAddr, Ipv4Addr};

    /// The plan's semantics read naively: one packet, rule by rule.
    fn naive(d: &DirectionPolicy, node: &[Prefix], ip: IpAddr, proto: u8, port: u16) -> bool {
        naive_named(d, node, ip, proto, port, &Named::default())
    }

    /// The same, where the rules in `named` also match `ip` if they
    /// allow by name (tier rules that Accept, NetworkPolicy rules).
    fn naive_named(
        d: &DirectionPolicy,
        node: &[Prefix],
        ip: IpAddr,
        proto: u8,
        port: u16,
        named: &Named,
    ) -> bool {
        let host = Prefix::from_ip(ip, if ip.is_ipv4() { 32 } else { 128 });
        if node.iter().any(|n| n.contains(&host)) {
            return true;
        }
        let in_peers = |peers: &[PeerBlock]| {
            peers.iter().any(|b| {
                let (cidr, except) = super::super::block_of(b).unwrap();
                cidr.contains(&host) && !except.iter().any(|e| e.contains(&host))
            })
        };
        let on_ports = |ports: &[PortRange]| {
            ports.is_empty()
                || ports.iter().any(|r| {
                    let p = match Protocol::try_from(r.protocol).unwrap() {
                        Protocol::Tcp => 6,
                        Protocol::Udp => 17,
                        Protocol::Sctp => 132,
                        Protocol::Unspecified => unreachable!(),
                    };
                    let end = if r.end_port == 0 { r.port } else { r.end_port };
                    p == proto && (r.port == 0 || (r.port..=end).contains(&u32::from(port)))
                })
        };
        let tier = |rules: &[TierRule], named: &BTreeSet<usize>| -> Option<bool> {
            for (i, r) in rules.iter().enumerate() {
                let by_name = named.contains(&i)
                    && !r.domain_names.is_empty()
                    && action(r.action) == Action::Accept;
                if (in_peers(&r.peers) || by_name) && on_ports(&r.ports) {
                    return match action(r.action) {
                        Action::Accept => Some(true),
                        Action::Deny => Some(false),
                        Action::Pass => None,
                    };
                }
            }
            None
        };
        if let Some(v) = tier(&d.admin, &named.admin) {
            return v;
        }
        if !d.not_isolated {
            return d.rules.iter().enumerate().any(|(i, r)| {
                let by_name = named.network_policy.contains(&i) && !r.domain_names.is_empty();
                (in_peers(&r.peers) || by_name) && on_ports(&r.ports)
            });
        }
        tier(&d.baseline, &named.baseline).unwrap_or(true)
    }

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn v4(a: [u8; 4], len: u32) -> IpPrefix {
        IpPrefix {
            addr: a.to_vec(),
            prefix_len: len,
        }
    }

    fn block(rng: &mut Rng) -> PeerBlock {
        match rng.below(8) {
            0 => PeerBlock {
                cidr: Some(v4([0, 0, 0, 0], 0)),
                except: if rng.below(2) == 0 {
                    vec![v4([10, 0, 0, 0], 25)]
                } else {
                    vec![]
                },
            },
            1 => PeerBlock {
                cidr: Some(IpPrefix {
                    addr: vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    prefix_len: 8,
                }),
                except: vec![],
            },
            _ => {
                let len = 24 + rng.below(9) as u32;
                let host = rng.below(256) as u8;
                let masked = (u32::from(host) & (0xffu32 << (32 - len))) as u8;
                let except = if len < 30 && rng.below(3) == 0 {
                    vec![v4([10, 0, 0, masked | (rng.below(4) as u8)], 32)]
                } else {
                    vec![]
                };
                PeerBlock {
                    cidr: Some(v4([10, 0, 0, masked], len)),
                    except,
                }
            }
        }
    }

    fn ports(rng: &mut Rng) -> Vec<PortRange> {
        let protos = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
        (0..rng.below(3))
            .map(|_| {
                let protocol = protos[rng.below(3) as usize] as i32;
                match rng.below(4) {
                    0 => PortRange {
                        protocol,
                        port: 0,
                        end_port: 0,
                    },
                    1 => PortRange {
                        protocol,
                        port: 1000,
                        end_port: 1100,
                    },
                    _ => PortRange {
                        protocol,
                        port: [80, 81, 443][rng.below(3) as usize],
                        end_port: 0,
                    },
                }
            })
            .collect()
    }

    /// As the controller sends them: a rule by name has no peers.
    fn names(rng: &mut Rng) -> Vec<String> {
        if rng.below(4) == 0 {
            vec!["*.example.com".into()]
        } else {
            vec![]
        }
    }

    fn tier_rules(rng: &mut Rng) -> Vec<TierRule> {
        (0..rng.below(5))
            .map(|_| {
                let domain_names = names(rng);
                TierRule {
                    action: rng.below(4) as i32,
                    peers: if domain_names.is_empty() {
                        (0..1 + rng.below(2)).map(|_| block(rng)).collect()
                    } else {
                        vec![]
                    },
                    ports: ports(rng),
                    domain_names,
                    ..Default::default()
                }
            })
            .collect()
    }

    fn policy(rng: &mut Rng) -> DirectionPolicy {
        let not_isolated = rng.below(2) == 0;
        DirectionPolicy {
            admin: tier_rules(rng),
            baseline: tier_rules(rng),
            rules: if not_isolated {
                vec![]
            } else {
                (0..rng.below(3))
                    .map(|_| {
                        let domain_names = names(rng);
                        Rule {
                            peers: if domain_names.is_empty() {
                                (0..1 + rng.below(2)).map(|_| block(rng)).collect()
                            } else {
                                vec![]
                            },
                            ports: ports(rng),
                            domain_names,
                            ..Default::default()
                        }
                    })
                    .collect()
            },
            not_isolated,
        }
    }

    #[test]
    fn the_table_gives_what_the_tier_chain_decides_for_every_address_protocol_and_port() {
        let mut rng = Rng(0x5eed_cafe);
        let node = [Prefix::from_ip(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 200)),
            32,
        )];
        let probe_ports = [
            0u16, 79, 80, 81, 82, 442, 443, 444, 999, 1000, 1050, 1100, 1101, 65535,
        ];
        let mut addresses: Vec<IpAddr> = (0..=255u8)
            .step_by(3)
            .map(|h| IpAddr::V4(Ipv4Addr::new(10, 0, 0, h)))
            .collect();
        addresses.extend(
            ["192.168.1.1", "10.0.1.1", "fd00::1", "2001:db8::1"]
                .iter()
                .map(|a| a.parse::<IpAddr>().unwrap()),
        );
        let mut denied_somewhere = 0;
        for case in 0..300 {
            let d = policy(&mut rng);
            let set = compile_tiered(&d, &node).unwrap();
            for &ip in &addresses {
                for proto in [6u8, 17, 132, 1] {
                    for &port in &probe_ports {
                        let want = naive(&d, &node, ip, proto, port);
                        denied_somewhere += usize::from(!want);
                        assert_eq!(
                            set.allows(ip, proto, port),
                            want,
                            "case {case}: {ip} proto {proto} port {port}\n{d:#?}\n{set:#?}"
                        );
                    }
                }
            }
        }
        assert!(
            denied_somewhere > 10_000,
            "the cases deny too little to test much"
        );
    }

    #[test]
    fn a_learned_host_gets_the_chain_with_its_rules_by_name_and_never_less_than_the_table() {
        let mut rng = Rng(0xd0_5eed);
        let node = [Prefix::from_ip(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 200)),
            32,
        )];
        let probe_ports = [0u16, 80, 81, 443, 1000, 1101, 65535];
        let hosts: Vec<IpAddr> = ["10.0.0.7", "10.0.0.200", "192.168.1.1", "fd00::1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let subset = |rng: &mut Rng, len: usize| -> BTreeSet<usize> {
            // Positions past the end too: they must be ignored.
            (0..len + 1).filter(|_| rng.below(2) == 0).collect()
        };
        let (mut widened, mut by_name_cases) = (0, 0);
        for case in 0..400 {
            let d = policy(&mut rng);
            let table = compile_tiered(&d, &node).unwrap();
            let named = Named {
                admin: subset(&mut rng, d.admin.len()),
                network_policy: subset(&mut rng, d.rules.len()),
                baseline: subset(&mut rng, d.baseline.len()),
            };
            by_name_cases += usize::from(
                d.admin
                    .iter()
                    .chain(&d.baseline)
                    .any(|r| !r.domain_names.is_empty()),
            );
            for &ip in &hosts {
                let set = host_port_set(&d, &node, ip, &named).unwrap();
                for proto in [6u8, 17, 132, 1] {
                    for &port in &probe_ports {
                        let want = naive_named(&d, &node, ip, proto, port, &named);
                        assert_eq!(
                            set.allows(proto, port),
                            want,
                            "case {case}: {ip} proto {proto} port {port} named {named:?}\n{d:#?}"
                        );
                        let before = table.allows(ip, proto, port);
                        assert!(want || !before, "case {case}: learning narrowed {ip}");
                        widened += usize::from(want && !before);
                    }
                }
            }
        }
        assert!(
            widened > 500 && by_name_cases > 100,
            "too few cases where a name decides: widened {widened}, cases {by_name_cases}"
        );
    }

    #[test]
    fn a_deny_or_pass_by_name_is_never_learned() {
        for action in [TierAction::Deny, TierAction::Pass] {
            let d = DirectionPolicy {
                admin: vec![TierRule {
                    action: action as i32,
                    domain_names: vec!["x.example".into()],
                    ..Default::default()
                }],
                not_isolated: true,
                ..Default::default()
            };
            let named = Named {
                admin: BTreeSet::from([0]),
                ..Default::default()
            };
            let set = host_port_set(&d, &[], "10.1.2.3".parse().unwrap(), &named).unwrap();
            assert!(set.allows(6, 80), "{action:?}: the table's verdict, open");
        }
    }

    #[test]
    fn an_unknown_action_denies() {
        let d = DirectionPolicy {
            admin: vec![TierRule {
                action: 99,
                peers: vec![PeerBlock {
                    cidr: Some(v4([0, 0, 0, 0], 0)),
                    except: vec![],
                }],
                ..Default::default()
            }],
            not_isolated: true,
            ..Default::default()
        };
        let set = compile_tiered(&d, &[]).unwrap();
        assert!(!set.allows("10.1.2.3".parse().unwrap(), 6, 80));
        assert!(set.allows("fd00::1".parse().unwrap(), 6, 80), "IPv4 only");
    }

    #[test]
    fn an_admin_deny_of_one_port_keeps_everything_else_open_in_few_entries() {
        let d = DirectionPolicy {
            admin: vec![TierRule {
                action: TierAction::Deny as i32,
                peers: vec![PeerBlock {
                    cidr: Some(v4([10, 0, 0, 0], 8)),
                    except: vec![],
                }],
                ports: vec![PortRange {
                    protocol: Protocol::Tcp as i32,
                    port: 22,
                    end_port: 0,
                }],
                ..Default::default()
            }],
            not_isolated: true,
            ..Default::default()
        };
        let set = compile_tiered(&d, &[]).unwrap();
        let ip = "10.9.9.9".parse().unwrap();
        assert!(!set.allows(ip, 6, 22));
        assert!(set.allows(ip, 6, 23) && set.allows(ip, 17, 22) && set.allows(ip, 1, 0));
        assert!(set.allows("11.0.0.1".parse().unwrap(), 6, 22));
        assert_eq!(set.entries.len(), 2, "{set:#?}");
        let inside = &set.entries[&Prefix::from_ip(ip, 8)];
        assert_eq!(
            inside.0,
            BTreeSet::from([
                PortEntry::Any,
                PortEntry::DenyBlock {
                    proto: 6,
                    port: 22,
                    bits: 16
                }
            ])
        );
    }
}
