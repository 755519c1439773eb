//! One pod cannot evict every other pod's flows (issue 18 item 5, DESIGN
//! invariant 18). The eBPF conntrack maps are node-wide LRUs: a pod
//! opening new flows as fast as it can used to push other pods'
//! established entries out, and their replies, which policy does not allow
//! on their own, were then dropped.
//!
//! Real sockets in the lab's pod namespaces on one node: a client holds
//! 100 UDP flows to a server (the client accepts nothing, the server sends
//! nothing: every packet from the server rides on conntrack), and the
//! server keeps sending on each of them, numbered, while a third pod opens
//! 200,000 new UDP flows to a fourth one its egress allows. Every datagram
//! the server sends must reach the client: a lost one is a reply the
//! datapath dropped because the flow's entry was gone. The flooding pod's
//! own new flows past its share are dropped at its hook and counted
//! (`reason="conntrack_share"`).
//!
//! It prints key=value lines with what was lost, so a run against an older
//! datapath says how much.

mod common;
use common::require_root;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::metrics::{get, metrics_addr, scrape};
use common::*;
use palisade_e2e::{Lab, LabConfig};

const FLOWS: usize = 100;
const NEW_FLOWS: usize = 200_000;
/// How often the server speaks on each long-lived flow: each flow is idle
/// for this long between its packets, as long-lived flows are.
const PUSH_EVERY: Duration = Duration::from_millis(300);
const SERVER_PORT: u16 = 7070;
const TIMEOUT: Duration = Duration::from_secs(2);

const OBJECTS: &str = r#"
nodes: 1
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - {apiVersion: v1, kind: Pod, metadata: {name: client, namespace: x, labels: {app: client}}, spec: {containers: [{name: c, image: none}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: server, namespace: x, labels: {app: server}}, spec: {containers: [{name: c, image: none}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: flood, namespace: x, labels: {app: flood}}, spec: {containers: [{name: c, image: none}]}}
  - {apiVersion: v1, kind: Pod, metadata: {name: sink, namespace: x, labels: {app: sink}}, spec: {containers: [{name: c, image: none}]}}
"#;

/// The client may send to the server and accepts nothing; the server
/// accepts the client and sends nothing; the flooding pod may send
/// anything to the sink, which accepts it.
const POLICIES: &str = r#"
objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: x, labels: {ns: x}}}
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: client, namespace: x}
    spec:
      podSelector: {matchLabels: {app: client}}
      policyTypes: [Ingress, Egress]
      egress: [{to: [{podSelector: {matchLabels: {app: server}}}]}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: server, namespace: x}
    spec:
      podSelector: {matchLabels: {app: server}}
      policyTypes: [Ingress, Egress]
      ingress: [{from: [{podSelector: {matchLabels: {app: client}}}]}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: flood, namespace: x}
    spec:
      podSelector: {matchLabels: {app: flood}}
      policyTypes: [Egress]
      egress: [{to: [{podSelector: {matchLabels: {app: sink}}}]}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: sink, namespace: x}
    spec:
      podSelector: {matchLabels: {app: sink}}
      policyTypes: [Ingress]
      ingress: [{from: [{podSelector: {matchLabels: {app: flood}}}]}]
"#;

/// Sends datagram `seq` to every client, each tagged with its flow.
fn push(server: &UdpSocket, clients: &[SocketAddr], seq: u32) {
    for (flow, to) in clients.iter().enumerate() {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&(flow as u32).to_be_bytes());
        msg[4..].copy_from_slice(&seq.to_be_bytes());
        server.send_to(&msg, to).expect("server send");
    }
}

/// The sequence numbers a client socket received on its flow, reading
/// until datagram `last` arrives or `deadline` passes.
fn received(flow: usize, socket: &UdpSocket, last: u32, deadline: Instant) -> BTreeSet<u32> {
    let mut got = BTreeSet::new();
    let mut buf = [0u8; 16];
    while !got.contains(&last) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        socket.set_read_timeout(Some(left)).unwrap();
        let Ok(n) = socket.recv(&mut buf) else { break };
        assert_eq!(n, 8);
        assert_eq!(
            u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize,
            flow
        );
        got.insert(u32::from_be_bytes(buf[4..8].try_into().unwrap()));
    }
    got
}

/// Opens `NEW_FLOWS` UDP flows from the flooding pod to the sink: four
/// sockets, every destination port; returns how long it took.
fn flood(lab: &Lab) -> Duration {
    let sink = pod_ipv4(lab, "x/sink");
    let sockets: Vec<UdpSocket> = pod_ns(lab, "x/flood")
        .run(|| {
            (0..NEW_FLOWS.div_ceil(65535))
                .map(|_| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap())
                .collect()
        })
        .unwrap();
    let started = Instant::now();
    for i in 0..NEW_FLOWS {
        let port = (i % 65535 + 1) as u16;
        // A datagram the flooding pod's own hook drops still leaves the
        // socket: the send succeeds either way.
        sockets[i / 65535]
            .send_to(b"x", (sink, port))
            .expect("flood send");
    }
    started.elapsed()
}

#[test]
#[ignore = "needs root"]
fn one_pod_opening_flows_fast_costs_other_pods_flows_nothing() {
    require_root();
    // The only test in this binary: the variable reaches the enforcer, and
    // port 0 lets it bind its own.
    std::env::set_var("PALISADE_METRICS_ADDR", "127.0.0.1:0");
    let mut lab = Lab::start(LabConfig {
        // The flood's kernel conntrack entries (unreplied UDP) go soon.
        node_sysctls: vec![("net.netfilter.nf_conntrack_udp_timeout".into(), "5".into())],
        ..LabConfig::default()
    })
    .expect("lab starts");
    lab.apply(&objects(OBJECTS)).expect("pods");
    lab.apply(&policies(POLICIES)).expect("policies");
    lab.wait_realized().expect("realized");

    // The long-lived flows: each client socket speaks once, then the
    // server speaks on all of them.
    let server_ip = pod_ipv4(&lab, "x/server");
    let server = pod_ns(&lab, "x/server")
        .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, SERVER_PORT)))
        .unwrap()
        .unwrap();
    server.set_read_timeout(Some(TIMEOUT)).unwrap();
    let clients: Vec<UdpSocket> = pod_ns(&lab, "x/client")
        .run(|| {
            (0..FLOWS)
                .map(|_| {
                    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
                    s.connect((server_ip, SERVER_PORT)).unwrap();
                    s
                })
                .collect()
        })
        .unwrap();
    let mut addrs = vec![None; FLOWS];
    for (flow, c) in clients.iter().enumerate() {
        c.send(&(flow as u32).to_be_bytes()).unwrap();
        let mut buf = [0u8; 4];
        let (_, from) = server
            .recv_from(&mut buf)
            .expect("the server hears every client");
        addrs[u32::from_be_bytes(buf) as usize] = Some(from);
    }
    let addrs: Vec<SocketAddr> = addrs.into_iter().map(Option::unwrap).collect();
    // The flows work before the flood: the first datagram of each arrives.
    push(&server, &addrs, 0);
    for (flow, c) in clients.iter().enumerate() {
        c.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut buf = [0u8; 16];
        c.recv(&mut buf)
            .unwrap_or_else(|e| panic!("flow {flow} does not work before the flood: {e}"));
    }

    // The server speaks on every flow while the flood runs, and twice more
    // after it (so that a flow whose entry went is seen losing).
    let flooding = AtomicBool::new(true);
    let (pushed, took) = std::thread::scope(|s| {
        let pusher = s.spawn(|| {
            let mut seq = 1;
            let mut after = 0;
            while after < 2 {
                push(&server, &addrs, seq);
                seq += 1;
                if !flooding.load(Ordering::Relaxed) {
                    after += 1;
                }
                // Paces the server: each flow's idle time between packets
                // (traffic shape, not a wait for anything).
                std::thread::sleep(PUSH_EVERY); // poll: the traffic's pacing, not a wait
            }
            seq
        });
        let took = flood(&lab);
        flooding.store(false, Ordering::Relaxed);
        (pusher.join().unwrap(), took)
    });

    // Each flow's datagrams, up to the last one sent (a flow whose entry
    // went never gets it: everything after is dropped too).
    let deadline = Instant::now() + TIMEOUT;
    let mut lost = 0;
    let mut flows_losing = 0;
    for (flow, c) in clients.iter().enumerate() {
        let got = received(flow, c, pushed - 1, deadline);
        let missing = (1..pushed).filter(|s| !got.contains(s)).count();
        lost += missing;
        flows_losing += usize::from(missing > 0);
    }
    let e = scrape(
        lab.node_netns(),
        &metrics_addr(&lab.log_dir().join("enforcer.log")),
    );
    let verdicts = |direction: &str, verdict: &str, reason: &str| {
        let key = format!(
            "palisade_enforcer_verdicts_total{{direction=\"{direction}\",verdict=\"{verdict}\",reason=\"{reason}\"}}"
        );
        e.get(&key).copied().unwrap_or(0.0)
    };
    println!(
        "bench=conntrack_flood flows={FLOWS} new_flows={NEW_FLOWS} flood_s={:.2} datagrams_sent={} datagrams_lost={lost} flows_losing={flows_losing} denied_by_policy={} denied_for_share={}",
        took.as_secs_f64(),
        (pushed - 1) as usize * FLOWS,
        verdicts("egress", "denied", "policy") + verdicts("ingress", "denied", "policy"),
        verdicts("egress", "denied", "conntrack_share"),
    );
    assert_eq!(
        lost, 0,
        "{lost} datagrams lost on {flows_losing} of {FLOWS} long-lived flows while another pod opened {NEW_FLOWS} flows"
    );
    // The flood met its share: most of it was dropped at its own hook.
    let share = get(&e, "palisade_enforcer_conntrack_share");
    assert!(
        verdicts("egress", "denied", "conntrack_share") >= (NEW_FLOWS as f64 - 2.0 * share),
        "the flooding pod's new flows past its share ({share}) were not dropped: {e:#?}"
    );
    lab.shutdown().unwrap();
}
