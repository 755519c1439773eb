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
    let set = compile_(&DirectionPolicy::default()).unwrap();
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
    let deny_all = compile(&DirectionPolicy::default(), &node).unwrap();
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
