//! The lab's DNS, as a cluster has it: an authoritative server inside the
//! pod the scenario names (as CoreDNS runs in pods behind the kube-dns
//! Service), answering from the scenario's records on that pod's UDP port
//! 53; and the stub resolver a probe to `name:HOST` runs inside its source
//! pod first, sending the query to the scenario's resolver (the Service's
//! ClusterIP) as a pod's libc would, then connecting to the first address.
//!
//! ```yaml
//! dns:
//!   server: kube-system/coredns          # declares UDP port 53
//!   resolver: svc/kube-system/kube-dns   # the default
//!   records:
//!     api.example.com: {a: [x/b, 192.0.2.7], ttl: 30}   # pods or addresses
//!     www.example.com: {cname: api.example.com}
//! steps:
//!   - dns: {records: {...}}              # the answers change from here on
//!     probes: [{from: x/a, to: name:api.example.com, port: 80, expect: allow}]
//! ```
//!
//! The wire format is `palisade-dns`'s (the learner's own reader and
//! writer), so the lab's traffic is what the learner must read.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use palisade_dns::wire::{
    Header, Question, RData, Record as WireRecord, CLASS_IN, OPCODE_QUERY, RCODE_NOERROR, TYPE_A,
    TYPE_AAAA, TYPE_CNAME,
};
use palisade_dns::{Message, Name};
use serde::Deserialize;

use crate::netns::NetNs;
use crate::scenario::{PodName, ServiceRef, Target};

pub const DNS_PORT: u16 = 53;
/// A record's TTL when the scenario gives none.
pub const DEFAULT_TTL: u32 = 30;
/// The longest CNAME chain the server follows within its records.
const MAX_CHAIN: usize = 16;
/// NXDOMAIN (RFC 1035 4.1.1).
const RCODE_NXDOMAIN: u8 = 3;

/// `dns:` at the top of a scenario.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDns {
    server: String,
    resolver: Option<String>,
    #[serde(default)]
    records: BTreeMap<String, RawRecord>,
    /// The enforcers learn from this DNS (`--dns-server`).
    #[serde(default)]
    learn: bool,
}

/// `dns:` in a step: the records from this step on.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStepDns {
    records: BTreeMap<String, RawRecord>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRecord {
    a: Option<Vec<String>>,
    cname: Option<String>,
    ttl: Option<u32>,
}

/// The scenario's DNS.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsSpec {
    pub server: PodName,
    pub resolver: Target,
    pub records: Records,
    /// Once the server and the resolver exist, every enforcer is restarted
    /// trusting them (`--dns-server`, as an operator sets the chart's
    /// `dns.servers`), so egress rules by domain name are learned.
    pub learn: bool,
}

/// A name's answer as the scenario writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Pods (their address) and literal addresses: A for IPv4, AAAA for IPv6.
    Addrs(Vec<Target>),
    Cname(Name),
}

/// Every name the server knows, with its TTL and answer.
pub type Records = BTreeMap<Name, (u32, Answer)>;

/// The records with every pod replaced by its address: what is served.
pub type Zone = BTreeMap<Name, (u32, ZoneAnswer)>;

#[derive(Debug, Clone, PartialEq)]
pub enum ZoneAnswer {
    Addrs(Vec<IpAddr>),
    Cname(Name),
}

/// The zone a server serves, replaced whole when a step changes it.
pub type SharedZone = Arc<RwLock<Zone>>;

/// A name as scenarios write it (`api.example.com`, a trailing dot allowed).
pub fn parse_name(text: &str) -> Result<Name> {
    let t = text.strip_suffix('.').unwrap_or(text);
    if t.is_empty() {
        bail!("{text:?}: an empty name");
    }
    Name::from_labels(t.split('.').map(str::as_bytes)).map_err(|e| anyhow!("{text:?}: {e}"))
}

pub fn parse(raw: RawDns) -> Result<DnsSpec> {
    let server = PodName::parse(&raw.server).context("server")?;
    let resolver = match raw.resolver.as_deref() {
        None => Target::Service(ServiceRef {
            namespace: "kube-system".into(),
            name: "kube-dns".into(),
        }),
        Some(r) => match Target::parse(r).context("resolver")? {
            t @ (Target::Service(_) | Target::Ip(_)) => t,
            other => bail!("resolver: {other} is not a Service or an address"),
        },
    };
    Ok(DnsSpec {
        server,
        resolver,
        records: parse_records(raw.records).context("records")?,
        learn: raw.learn,
    })
}

pub fn parse_step(raw: RawStepDns) -> Result<Records> {
    parse_records(raw.records).context("records")
}

fn parse_records(raw: BTreeMap<String, RawRecord>) -> Result<Records> {
    raw.into_iter()
        .map(|(text, r)| {
            let name = parse_name(&text)?;
            let answer = match (r.a, r.cname) {
                (Some(addrs), None) => Answer::Addrs(
                    addrs
                        .iter()
                        .map(|a| match Target::parse(a) {
                            Ok(t @ (Target::Pod(_) | Target::Ip(_))) => Ok(t),
                            _ => Err(anyhow!("{text}.a: {a:?} is neither a pod nor an address")),
                        })
                        .collect::<Result<_>>()?,
                ),
                (None, Some(c)) => {
                    Answer::Cname(parse_name(&c).with_context(|| format!("{text}.cname"))?)
                }
                _ => bail!("{text}: give either a (addresses) or cname"),
            };
            Ok((name, (r.ttl.unwrap_or(DEFAULT_TTL), answer)))
        })
        .collect()
}

/// The zone the records make, pods replaced by `pod_ip`'s answer.
pub fn zone(records: &Records, pod_ip: impl Fn(&PodName) -> Option<IpAddr>) -> Result<Zone> {
    records
        .iter()
        .map(|(name, (ttl, answer))| {
            let served = match answer {
                Answer::Cname(t) => ZoneAnswer::Cname(t.clone()),
                Answer::Addrs(targets) => ZoneAnswer::Addrs(
                    targets
                        .iter()
                        .map(|t| match t {
                            Target::Ip(ip) => Ok(*ip),
                            Target::Pod(p) => pod_ip(p).ok_or_else(|| {
                                anyhow!("record {name}: pod {p} has no address now")
                            }),
                            other => Err(anyhow!("record {name}: {other} is not a pod or address")),
                        })
                        .collect::<Result<_>>()?,
                ),
            };
            Ok((name.clone(), (*ttl, served)))
        })
        .collect()
}

/// The response to `query` from `zone`; `None` for what is not a query.
pub fn respond(zone: &Zone, query: &[u8]) -> Option<Vec<u8>> {
    let q = Message::parse(query).ok()?;
    if q.header.response || q.header.opcode != OPCODE_QUERY {
        return None;
    }
    let mut answers = Vec::new();
    let mut rcode = RCODE_NOERROR;
    let mut name = q.question.name.clone();
    for hop in 0..=MAX_CHAIN {
        match zone.get(&name) {
            None => {
                if hop == 0 {
                    rcode = RCODE_NXDOMAIN;
                }
                break;
            }
            Some((ttl, ZoneAnswer::Cname(target))) => {
                answers.push(WireRecord {
                    name: name.clone(),
                    rtype: TYPE_CNAME,
                    class: CLASS_IN,
                    ttl: *ttl,
                    data: RData::Cname(target.clone()),
                });
                name = target.clone();
            }
            Some((ttl, ZoneAnswer::Addrs(addrs))) => {
                for addr in addrs {
                    let (rtype, data) = match addr {
                        IpAddr::V4(a) => (TYPE_A, RData::A(*a)),
                        IpAddr::V6(a) => (TYPE_AAAA, RData::Aaaa(*a)),
                    };
                    if rtype == q.question.qtype {
                        answers.push(WireRecord {
                            name: name.clone(),
                            rtype,
                            class: CLASS_IN,
                            ttl: *ttl,
                            data,
                        });
                    }
                }
                break;
            }
        }
    }
    Some(
        Message {
            header: Header {
                id: q.header.id,
                response: true,
                opcode: OPCODE_QUERY,
                truncated: false,
                rcode,
            },
            question: q.question,
            answers,
        }
        .encode(),
    )
}

/// Serves `zone` on `socket` until the task is aborted.
pub async fn serve(socket: tokio::net::UdpSocket, zone: SharedZone) {
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let reply = {
            let zone = zone.read().unwrap_or_else(|e| e.into_inner());
            respond(&zone, &buf[..n])
        };
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, peer).await;
        }
    }
}

/// What a pod's resolver learned about a name.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Each address with its TTL, along the chain (`palisade_dns::resolve`).
    pub addrs: Vec<(IpAddr, u32)>,
}

/// Resolves `name` (type A) from inside `ns` through `server`, as a stub
/// resolver does: one query from a fresh port, the answer whose id and
/// question match, until `timeout`. Runs on the calling thread.
pub fn resolve(ns: &NetNs, server: SocketAddr, name: &str, timeout: Duration) -> Result<Resolved> {
    let qname = parse_name(name)?;
    ns.run(|| resolve_here(server, qname, TYPE_A, timeout))?
        .with_context(|| format!("resolving {name} through {server} from netns {}", ns.name()))
}

/// [`resolve`] for IPv6 addresses: a type AAAA query.
pub fn resolve6(ns: &NetNs, server: SocketAddr, name: &str, timeout: Duration) -> Result<Resolved> {
    let qname = parse_name(name)?;
    ns.run(|| resolve_here(server, qname, TYPE_AAAA, timeout))?
        .with_context(|| {
            format!(
                "resolving {name} (AAAA) through {server} from netns {}",
                ns.name()
            )
        })
}

fn resolve_here(server: SocketAddr, name: Name, qtype: u16, timeout: Duration) -> Result<Resolved> {
    let sock = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))?;
    // Connected: the kernel drops datagrams from anyone but the server.
    sock.connect(server)?;
    let id = query_id();
    let query = query_of(id, name, qtype);
    let question = query.question.clone();
    sock.send(&query.encode())?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no answer within {} ms", timeout.as_millis());
        }
        sock.set_read_timeout(Some(left))?;
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("receiving the answer"),
        };
        let Ok(m) = Message::parse(&buf[..n]) else {
            continue;
        };
        if m.header.id != id || !m.header.response || m.question != question {
            continue;
        }
        if m.header.rcode == RCODE_NXDOMAIN {
            bail!("no such name (NXDOMAIN)");
        }
        let r =
            palisade_dns::resolve(&m).map_err(|e| anyhow!("an answer that says nothing: {e}"))?;
        if r.addrs.is_empty() {
            bail!("no address in the answer");
        }
        return Ok(Resolved { addrs: r.addrs });
    }
}

/// What a client that connects the instant it has an address saw: the
/// address, and whether its TCP connection to it was accepted.
#[derive(Debug)]
pub struct Connected {
    pub addr: IpAddr,
    pub result: std::io::Result<()>,
}

/// Resolves `name` as [`resolve`] does and, on the same thread the moment
/// the answer is read, connects to its first address on `port` (TCP,
/// waiting at most `connect_timeout`): no gap a learner could hide in.
pub fn resolve_and_connect(
    ns: &NetNs,
    server: SocketAddr,
    name: &str,
    port: u16,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<Connected> {
    let qname = parse_name(name)?;
    ns.run(|| -> Result<Connected> {
        let r = resolve_here(server, qname, TYPE_A, timeout)?;
        let addr = r.addrs[0].0;
        let result =
            std::net::TcpStream::connect_timeout(&SocketAddr::new(addr, port), connect_timeout)
                .map(drop);
        Ok(Connected { addr, result })
    })?
    .with_context(|| format!("resolving {name} through {server} from netns {}", ns.name()))
}

/// A type A query for `name` with `id`, as a stub resolver sends it.
pub fn a_query(id: u16, name: Name) -> Message {
    query_of(id, name, TYPE_A)
}

fn query_of(id: u16, name: Name, qtype: u16) -> Message {
    Message {
        header: Header {
            id,
            response: false,
            opcode: OPCODE_QUERY,
            truncated: false,
            rcode: 0,
        },
        question: Question {
            name,
            qtype,
            qclass: CLASS_IN,
        },
        answers: Vec::new(),
    }
}

/// A query id nobody off the path can guess (RFC 5452).
fn query_id() -> u16 {
    use std::io::Read;
    let mut b = [0u8; 2];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        // Only the lab's own answers are at stake; never fail a probe on it.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.subsec_nanos() as u16;
    }
    u16::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(yaml: &str) -> Records {
        let raw: BTreeMap<String, RawRecord> = serde_yaml::from_str(yaml).unwrap();
        parse_records(raw).unwrap()
    }

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        Message {
            header: Header {
                id: 77,
                response: false,
                opcode: OPCODE_QUERY,
                truncated: false,
                rcode: 0,
            },
            question: Question {
                name: parse_name(name).unwrap(),
                qtype,
                qclass: CLASS_IN,
            },
            answers: vec![],
        }
        .encode()
    }

    #[test]
    fn answers_follow_the_records() {
        let r = records(
            "{api.example.com: {a: [x/b, 192.0.2.7, '2001:db8::7'], ttl: 5}, www.example.com: {cname: api.example.com}}",
        );
        let b: IpAddr = "10.244.0.3".parse().unwrap();
        let z = zone(&r, |p| (p.to_string() == "x/b").then_some(b)).unwrap();
        let reply =
            Message::parse(&respond(&z, &query("WWW.example.com", TYPE_A)).unwrap()).unwrap();
        assert_eq!(reply.header.id, 77);
        let got = palisade_dns::resolve(&reply).unwrap();
        assert_eq!(got.addrs, vec![(b, 5), ("192.0.2.7".parse().unwrap(), 5)]);
        let reply =
            Message::parse(&respond(&z, &query("api.example.com", TYPE_AAAA)).unwrap()).unwrap();
        assert_eq!(
            palisade_dns::resolve(&reply).unwrap().addrs,
            vec![("2001:db8::7".parse().unwrap(), 5)]
        );
        let reply =
            Message::parse(&respond(&z, &query("nope.example.com", TYPE_A)).unwrap()).unwrap();
        assert_eq!(reply.header.rcode, RCODE_NXDOMAIN);
        // A response is not answered.
        let mut m = Message::parse(&query("api.example.com", TYPE_A)).unwrap();
        m.header.response = true;
        assert!(respond(&z, &m.encode()).is_none());
    }

    #[test]
    fn bad_records_are_named() {
        let raw: BTreeMap<String, RawRecord> =
            serde_yaml::from_str("{a.b: {a: [x/b], cname: c.d}}").unwrap();
        assert!(parse_records(raw)
            .unwrap_err()
            .to_string()
            .contains("either a"));
        let raw: BTreeMap<String, RawRecord> =
            serde_yaml::from_str("{a.b: {a: [svc/x/y]}}").unwrap();
        assert!(format!("{:#}", parse_records(raw).unwrap_err()).contains("neither a pod"));
        let r = records("{a.b: {a: [x/gone]}}");
        assert!(zone(&r, |_| None)
            .unwrap_err()
            .to_string()
            .contains("x/gone"));
    }
}
