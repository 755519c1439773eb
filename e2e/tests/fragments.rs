//! Fragmented traffic for real (issue 18, item 3): UDP sockets in the pods
//! send datagrams bigger than the pods' veth MTU, so the pods' own kernels
//! fragment them, over IPv4 and IPv6 (a dual-stack lab).
//!
//! Where the programs see fragments: palisade_from_pod runs at TC ingress of
//! the sender's host veth, before anything of the node's stack, so it sees
//! the fragments the pod's kernel made; palisade_to_pod runs at TC egress of
//! the receiver's host veth, after the node forwarded them, as they came or
//! (where the node's conntrack reassembles, nf_defrag) cut again to their
//! first sizes before TC egress. Either way each test proves, from the
//! enforcer's counters (`palisade_enforcer_verdicts_total`, reason
//! `fragment`), that both hooks judged later fragments, not whole datagrams.
//!
//! Policies: the client may send UDP 7070 and 7071 to the server and
//! accepts nothing; the server accepts UDP 7070 from the client and sends
//! nothing. So 7070 passes both hooks, 7071 is denied by the server's
//! ingress, 7072 by the client's egress, and every answer rides on
//! conntrack.

mod common;
use common::require_root;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Once;
use std::time::{Duration, Instant};

use common::metrics::{get, metrics_addr, scrape};
use common::*;
use palisade_e2e::ctmap::Hook;
use palisade_e2e::netns::{links_json, NetNs};
use palisade_e2e::{Lab, LabConfig, PodName};

/// Bigger than the 1500-byte MTU of the lab's veths, so every datagram
/// leaves its pod in three fragments (two of them later ones).
const DATAGRAM: usize = 3000;
const ALLOWED: u16 = 7070;
const DENIED_BY_SERVER: u16 = 7071;
const DENIED_BY_CLIENT: u16 = 7072;
const WAIT: Duration = Duration::from_secs(10);

const OBJECTS: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - {apiVersion: v1, kind: Pod, metadata: {name: client, namespace: x, labels: {app: client}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 80}]}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: server, namespace: x, labels: {app: server}}, spec: {containers: [{name: c, image: none, ports: [{containerPort: 80}]}]}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: client, namespace: x}
    spec:
      podSelector: {matchLabels: {app: client}}
      policyTypes: [Ingress, Egress]
      egress:
        - to: [{podSelector: {matchLabels: {app: server}}}]
          ports: [{protocol: UDP, port: 7070}, {protocol: UDP, port: 7071}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: server, namespace: x}
    spec:
      podSelector: {matchLabels: {app: server}}
      policyTypes: [Ingress, Egress]
      ingress:
        - from: [{podSelector: {matchLabels: {app: client}}}]
          ports: [{protocol: UDP, port: 7070}]
"#;

/// The same and a ClusterIP for the server's UDP 7070: the node's DNAT
/// (nftables, as kube-proxy writes it) turns the node's kernel conntrack
/// on, whose defragmentation reassembles IPv4 datagrams before routing.
const SERVICE: &str = r#"
  - apiVersion: v1
    kind: Service
    metadata: {name: big, namespace: x}
    spec:
      clusterIP: 10.96.0.20
      selector: {app: server}
      ports: [{name: big, port: 70, targetPort: 7070, protocol: UDP}]
"#;
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const SERVICE_PORT: u16 = 70;

/// Both processes serve /metrics on a port of their own; set before any
/// lab of this binary starts a process.
fn metrics_on() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("PALISADE_METRICS_ADDR", "127.0.0.1:0"));
}

fn lab() -> Lab {
    lab_of(OBJECTS)
}

fn lab_of(objects_yaml: &str) -> Lab {
    metrics_on();
    let mut lab = Lab::start(LabConfig {
        pod_subnet6: Some("fd00:10:244::/64".into()),
        ..LabConfig::default()
    })
    .expect("lab starts");
    lab.apply(&objects(objects_yaml))
        .expect("pods and policies");
    lab.wait_realized().expect("realized");
    for pod in ["x/client", "x/server"] {
        let ns = lab.pod_netns(&name(pod)).unwrap().to_string();
        let links = links_json(&ns).unwrap();
        let mtu = links
            .iter()
            .find(|l| l["ifname"] == "eth0")
            .and_then(|l| l["mtu"].as_u64())
            .unwrap_or_else(|| panic!("{pod}: no eth0 MTU in {links:?}"));
        assert!(
            (mtu as usize) < DATAGRAM,
            "{pod}: eth0 MTU {mtu} would carry the datagrams whole"
        );
    }
    lab
}

fn name(pod: &str) -> PodName {
    PodName::parse(pod).unwrap()
}

/// The pod's address of each family.
fn addresses(lab: &Lab, pod: &str) -> [IpAddr; 2] {
    let p = name(pod);
    [
        lab.pod_ip(&p).expect("an IPv4 address"),
        IpAddr::V6(lab.pod_ip6(&p).expect("an IPv6 address")),
    ]
}

/// A UDP socket of `family`'s kind in `pod`, on `port` (0: any).
fn socket(lab: &Lab, pod: &str, family: IpAddr, port: u16) -> UdpSocket {
    let ns = NetNs::from_existing(lab.pod_netns(&name(pod)).unwrap());
    let any: IpAddr = match family {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = ns
        .run(move || UdpSocket::bind(SocketAddr::new(any, port)))
        .unwrap()
        .unwrap_or_else(|e| panic!("{pod}: binding UDP {port}: {e}"));
    sock.set_read_timeout(Some(WAIT)).unwrap();
    sock
}

/// A recognisable datagram: every byte says where it is.
fn payload(tag: u8) -> Vec<u8> {
    (0..DATAGRAM).map(|i| (i as u8) ^ tag).collect()
}

/// The next datagram on `sock`, waiting at most [`WAIT`].
fn receive(sock: &UdpSocket, what: &str, lab: &Lab) -> (Vec<u8>, SocketAddr) {
    let mut buf = vec![0u8; 65536];
    match sock.recv_from(&mut buf) {
        Ok((n, from)) => (buf[..n].to_vec(), from),
        Err(e) => panic!(
            "{what}: nothing arrived within {WAIT:?} ({e})\n{}",
            lab.log_tails(20)
        ),
    }
}

/// Nothing has arrived on `sock` (without waiting: the caller has seen the
/// datagram's every fragment dropped).
fn nothing_arrived(sock: &UdpSocket, what: &str) {
    sock.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 65536];
    match sock.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((n, from)) => panic!("{what}: {n} bytes from {from} arrived"),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The enforcer's verdict counters, by `direction/verdict/reason`.
struct Counters<'a> {
    lab: &'a Lab,
    addr: String,
}

impl<'a> Counters<'a> {
    fn of(lab: &'a Lab) -> Self {
        let addr = metrics_addr(&lab.log_dir().join("enforcer.log"));
        Counters { lab, addr }
    }

    fn read(&self) -> BTreeMap<String, f64> {
        scrape(self.lab.node_netns(), &self.addr)
    }

    /// Waits until every `(direction, verdict, reason, by)` grew by `by`
    /// since `before`: exactly, for reason `fragment` (only the tests'
    /// datagrams are fragmented, each into one first and two later
    /// fragments, so more would be fragments judged twice or made up), at
    /// least for the others (the pods' own NDP and MLD may count too).
    fn wait_grown(&self, before: &BTreeMap<String, f64>, growth: &[(&str, &str, &str, f64)]) {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = self.read();
            for &(direction, verdict, reason, by) in growth {
                let key = verdicts(direction, verdict, reason);
                let grown = get(&now, &key) - get(before, &key);
                assert!(
                    reason != "fragment" || grown <= by,
                    "{key} grew by {grown}, more than the {by} later fragments sent"
                );
            }
            let short: Vec<String> = growth
                .iter()
                .filter_map(|&(direction, verdict, reason, by)| {
                    let key = verdicts(direction, verdict, reason);
                    let grown = get(&now, &key) - get(before, &key);
                    (grown < by).then(|| format!("{key} grew by {grown}, not {by}"))
                })
                .collect();
            if short.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "after {WAIT:?}:\n  {}\n{}",
                short.join("\n  "),
                self.lab.log_tails(20)
            );
            std::thread::sleep(Duration::from_millis(50)); // poll: counters move as packets pass
        }
    }
}

fn verdicts(direction: &str, verdict: &str, reason: &str) -> String {
    format!(
        "palisade_enforcer_verdicts_total{{direction=\"{direction}\",verdict=\"{verdict}\",reason=\"{reason}\"}}"
    )
}

/// A datagram bigger than the MTU to a port both hooks allow arrives
/// whole, in either family, and both hooks judged its later fragments.
#[test]
#[ignore = "needs root"]
fn a_datagram_to_an_allowed_port_arrives_whole() {
    require_root();
    let lab = lab();
    let counters = Counters::of(&lab);
    for (family, (server, client)) in addresses(&lab, "x/server")
        .into_iter()
        .zip(addresses(&lab, "x/client"))
        .enumerate()
    {
        let inbox = socket(&lab, "x/server", server, ALLOWED);
        let out = socket(&lab, "x/client", client, 0);
        let sent = payload(family as u8);
        let before = counters.read();
        out.send_to(&sent, SocketAddr::new(server, ALLOWED))
            .unwrap();
        let (got, from) = receive(&inbox, &format!("{client} -> {server}:{ALLOWED}"), &lab);
        assert_eq!(got.len(), DATAGRAM, "{server}: the datagram's size");
        assert!(got == sent, "{server}: the datagram arrived altered");
        assert_eq!(from.ip(), client);
        counters.wait_grown(
            &before,
            &[
                ("egress", "allowed", "fragment", 2.0),
                ("ingress", "allowed", "fragment", 2.0),
            ],
        );
    }
    finish(lab);
}

/// No fragment of a datagram to a port policy denies gets through, on
/// either hook, in either family: the server's socket on that port never
/// receives it.
#[test]
#[ignore = "needs root"]
fn a_datagram_to_a_denied_port_never_arrives() {
    require_root();
    let lab = lab();
    let counters = Counters::of(&lab);
    for (server, client) in addresses(&lab, "x/server")
        .into_iter()
        .zip(addresses(&lab, "x/client"))
    {
        for (port, direction) in [(DENIED_BY_SERVER, "ingress"), (DENIED_BY_CLIENT, "egress")] {
            let inbox = socket(&lab, "x/server", server, port);
            let out = socket(&lab, "x/client", client, 0);
            let before = counters.read();
            out.send_to(&payload(1), SocketAddr::new(server, port))
                .unwrap();
            // Its first fragment denied by policy, then both later ones as
            // fragments of a denied datagram: all three judged.
            counters.wait_grown(
                &before,
                &[
                    (direction, "denied", "policy", 1.0),
                    (direction, "denied", "fragment", 2.0),
                ],
            );
            nothing_arrived(&inbox, &format!("{client} -> {server}:{port}"));
        }
    }
    finish(lab);
}

/// A large answer (as DNS over UDP sends) to a small question comes back
/// in fragments through the flow the question opened: the server's egress
/// and the client's ingress allow nothing but replies. Conntrack holds the
/// flow by its real ports, on both hooks, and nothing of port 0.
#[test]
#[ignore = "needs root"]
fn a_large_reply_through_an_established_flow_arrives_whole() {
    require_root();
    let lab = lab();
    let counters = Counters::of(&lab);
    for (family, (server, client)) in addresses(&lab, "x/server")
        .into_iter()
        .zip(addresses(&lab, "x/client"))
        .enumerate()
    {
        let inbox = socket(&lab, "x/server", server, ALLOWED);
        let out = socket(&lab, "x/client", client, 0);
        out.connect(SocketAddr::new(server, ALLOWED)).unwrap();
        out.send(b"question").unwrap();
        let (question, asker) = receive(&inbox, &format!("the question to {server}"), &lab);
        assert_eq!(question, b"question");
        let before = counters.read();
        let answer = payload(0x40 | family as u8);
        inbox.send_to(&answer, asker).unwrap();
        let (got, from) = receive(&out, &format!("the answer from {server}"), &lab);
        assert!(got == answer, "{server}: the answer arrived altered or cut");
        assert_eq!(from, SocketAddr::new(server, ALLOWED));
        counters.wait_grown(
            &before,
            &[
                ("egress", "allowed", "reply", 1.0),
                ("egress", "allowed", "fragment", 2.0),
                ("ingress", "allowed", "reply", 1.0),
                ("ingress", "allowed", "fragment", 2.0),
            ],
        );
        let port = out.local_addr().unwrap().port();
        let entries = lab.conntrack_entries().unwrap();
        let flow: Vec<_> = entries
            .iter()
            .filter(|e| e.src == client && e.sport == port)
            .collect();
        assert!(
            flow.iter()
                .any(|e| e.hook == Hook::FromPod && e.dport == ALLOWED)
                && flow
                    .iter()
                    .any(|e| e.hook == Hook::ToPod && e.dport == ALLOWED),
            "{client}:{port} -> {server}:{ALLOWED} on both hooks: {entries:#?}"
        );
        assert!(
            entries
                .iter()
                .all(|e| e.proto != 17 || (e.sport != 0 && e.dport != 0)),
            "a UDP entry without ports: {entries:#?}"
        );
    }
    finish(lab);
}

/// The same through a ClusterIP, where the node's conntrack reassembles
/// the datagram to translate it and the kernel cuts it again to its first
/// fragments' sizes on the way out: the client's egress judges the
/// fragments its kernel made, the server's ingress those the node cut
/// again, and the large answer comes back the same way.
#[test]
#[ignore = "needs root"]
fn a_datagram_through_a_cluster_ip_arrives_whole_past_the_nodes_reassembly() {
    require_root();
    let lab = lab_of(&format!("{OBJECTS}{SERVICE}"));
    let counters = Counters::of(&lab);
    let [client, _] = addresses(&lab, "x/client");
    let [server, _] = addresses(&lab, "x/server");
    let inbox = socket(&lab, "x/server", server, ALLOWED);
    let out = socket(&lab, "x/client", client, 0);
    let vip = SocketAddr::new(CLUSTER_IP.into(), SERVICE_PORT);
    let question = payload(7);
    let before = counters.read();
    out.send_to(&question, vip).unwrap();
    let (got, asker) = receive(&inbox, &format!("{client} -> {vip}"), &lab);
    assert!(got == question, "the datagram arrived altered or cut");
    assert_eq!(asker.ip(), client, "DNAT keeps the client's address");
    let answer = payload(8);
    inbox.send_to(&answer, asker).unwrap();
    let (got, from) = receive(&out, &format!("the answer through {vip}"), &lab);
    assert!(got == answer, "the answer arrived altered or cut");
    assert_eq!(from, vip, "the answer comes from the ClusterIP");
    counters.wait_grown(
        &before,
        &[
            ("egress", "allowed", "fragment", 4.0),
            ("ingress", "allowed", "fragment", 4.0),
        ],
    );
    // The node's conntrack held the flow, so it had the datagram whole.
    let kernel = lab.kernel_conntrack().unwrap();
    assert!(
        kernel
            .iter()
            .any(|l| l.contains("udp") && l.contains(&format!("dport={SERVICE_PORT} "))),
        "no kernel conntrack entry of the flow to {vip}: {kernel:#?}"
    );
    finish(lab);
}
