//! Egress by domain name, enforced, with real DNS traffic and the real
//! datapath: examples/dns-names.yaml plays (the enforcers learn from the
//! lab's DNS: an address is allowed to the pod that resolved a name its
//! policy allows, on the rule's ports, from the moment the answer reaches
//! it; nothing else is).

mod common;
use common::metrics::{get, metrics_addr, scrape};
use common::require_root;

use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pod_ipv4, pod_ns};
use palisade_e2e::forge;
use palisade_e2e::netns::NetNs;
use palisade_e2e::scenario::{FlowLogMode, ProbeSpec, Protocol, Target, Verdict};
use palisade_e2e::{dns, run_scenario, Lab, LabConfig, Scenario};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/dns-names.yaml")
}

/// Every process serves /metrics on a port of its own; set before any lab
/// of this binary starts a process.
fn metrics_on() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("PALISADE_METRICS_ADDR", "127.0.0.1:0"));
}

/// A lab where the example has played: app/client may reach
/// `*.example.com` on 443 by name, and nothing else but DNS.
fn lab_after_example() -> (Lab, Scenario) {
    lab_after_example_on(LabConfig::default())
}

/// The same on a lab configured from `base` (e.g. dual-stack).
fn lab_after_example_on(base: LabConfig) -> (Lab, Scenario) {
    lab_after(&example(), base)
}

/// A lab where `example` has played, every new flow logged.
fn lab_after(example: &std::path::Path, base: LabConfig) -> (Lab, Scenario) {
    metrics_on();
    let scenario = Scenario::from_file(example).expect("the example is valid");
    let mut config = base.for_scenario(&scenario);
    // Every new flow logged: a learned allow names its name.
    config.flow_log = Some(FlowLogMode::All);
    let mut lab = Lab::start(config).expect("lab starts");
    let mut out = Vec::new();
    let result = run_scenario(&mut lab, &scenario, &mut out);
    let table = String::from_utf8_lossy(&out).into_owned();
    match result {
        Ok(report) if report.passed() => {}
        Ok(report) => panic!("{}\n{table}\n{}", report.summary(), lab.log_tails(60)),
        Err(e) => panic!("{e:#}\n{table}\n{}", lab.log_tails(60)),
    }
    (lab, scenario)
}

#[test]
fn the_examples_are_valid_and_learn() {
    for path in [example(), aws_example()] {
        let s = Scenario::from_file(&path).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(s.dns.expect("the example has a DNS").learn, "{path:?}");
    }
}

/// A staged policy's rules by name judge by what the pod resolved, as the
/// enforced ones do: staged above the example's policy, an Accept of
/// api.example.com alone and a Deny of the rest report the connection to
/// deep.in.example.com as would-deny and the one to api.example.com
/// not at all; enforcement is the example's.
#[test]
#[ignore = "needs root"]
fn a_staged_rule_by_name_judges_what_the_pod_resolved() {
    require_root();
    let (mut lab, _) = lab_after_example();
    let staged = palisade_e2e::scenario::Object::from_value(serde_json::json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "staged-api-only", "annotations": {"palisade.io/audit": "true"}},
        "spec": {
            "tier": "Admin", "priority": 5,
            "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "app"}}},
            "egress": [
                {"name": "dns", "action": "Accept",
                 "to": [{"pods": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                  "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}}],
                 "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                {"name": "api", "action": "Accept", "to": [{"domainNames": ["api.example.com"]}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]},
                {"name": "rest", "action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]},
            ],
        },
    }))
    .unwrap();
    lab.apply(&[staged]).unwrap();
    lab.wait_realized().unwrap();
    let ip = |pod: &str| {
        lab.pod_ip(&palisade_e2e::PodName::parse(pod).unwrap())
            .unwrap()
            .to_string()
    };
    let (api, deep) = (ip("web/api"), ip("web/deep"));
    // One after the other: api's line, if any, is written before deep's.
    for to in ["name:api.example.com", "name:deep.in.example.com"] {
        let spec = ProbeSpec::new("app/client", to, 443, Protocol::Tcp).unwrap();
        assert_eq!(
            lab.probe(&spec).unwrap().verdict(),
            Some(Verdict::Allow),
            "{to}"
        );
    }
    let node = lab.node_name().to_string();
    let would_deny = |l: &serde_json::Value, dst: &str| {
        l["verdict"] == "would-deny" && l["pod"] == "app/client" && l["dst_ip"] == dst
    };
    let lines = lab
        .wait_flow_log(
            &node,
            "the staged policy's would-deny for deep.in.example.com",
            Duration::from_secs(30),
            |lines| {
                lines
                    .iter()
                    .any(|l| would_deny(l, &deep) && l["dst_port"] == 443)
            },
        )
        .unwrap();
    assert!(
        !lines.iter().any(|l| would_deny(l, &api)),
        "the staged Accept of api.example.com allows what the pod resolved: {:?}",
        lines
            .iter()
            .filter(|l| would_deny(l, &api))
            .collect::<Vec<_>>()
    );
}

/// The same with AWS's ApplicationNetworkPolicy.
fn aws_example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/dns-names-aws.yaml")
}

#[test]
#[ignore = "needs root"]
fn aws_policies_allow_their_names_an_application_one_beside_a_network_policy_of_its_name() {
    require_root();
    // The example's probes: the NetworkPolicy's pod allowed, an unresolved
    // address, an unlisted name and another port denied, both listed names
    // (one by wildcard) allowed once resolved; the same for a pod of AWS's
    // ClusterNetworkPolicy.
    let (lab, _) = lab_after(&aws_example(), LabConfig::default());
    let ip = |pod: &str| {
        lab.pod_ip(&palisade_e2e::PodName::parse(pod).unwrap())
            .unwrap()
            .to_string()
    };
    let (api, deep) = (ip("web/api"), ip("web/deep"));
    assert_eq!(
        learned_addresses(&lab, "app/client", "api.example.com"),
        std::slice::from_ref(&api)
    );
    assert_eq!(
        learned_addresses(&lab, "app/client", "deep.in.example.com"),
        [deep]
    );
    assert!(
        learned_addresses(&lab, "app/client", "elsewhere.example.net").is_empty(),
        "a name the policy does not list is not learned"
    );
    // ops/tool, by AWS's ClusterNetworkPolicy: its one name, not another.
    assert_eq!(
        learned_addresses(&lab, "ops/tool", "api.example.com"),
        std::slice::from_ref(&api)
    );
    assert!(learned_addresses(&lab, "ops/tool", "deep.in.example.com").is_empty());
    // Both policies are the pod's, each under its own name.
    let node = lab.node_name().to_string();
    let state = lab.enforcer_state().expect("the enforcer answers");
    let pods = state.state.expect("the dump has the node's state").pods;
    let client = pods
        .iter()
        .find(|p| {
            p.pod
                .as_ref()
                .is_some_and(|r| r.namespace == "app" && r.name == "client")
        })
        .unwrap_or_else(|| panic!("app/client not in the dump: {pods:?}"));
    assert_eq!(
        client.policies,
        ["app/ApplicationNetworkPolicy:egress", "app/egress"],
        "{client:?}"
    );
    lab.wait_flow_log(
        &node,
        "app/client's connection to api allowed as learned, naming api.example.com",
        Duration::from_secs(30),
        |lines| {
            lines.iter().any(|l| {
                learned_line(l, "app/client", &api)
                    && l["domain_names"] == serde_json::json!(["api.example.com"])
            })
        },
    )
    .unwrap();
}

#[test]
#[ignore = "needs root"]
fn a_resolved_name_opens_its_addresses_to_the_pod_that_resolved_it_only() {
    require_root();
    let (mut lab, scenario) = lab_after_example();
    // The enforcer learns: no warning that names match nothing.
    let state = lab.enforcer_state().expect("the enforcer answers");
    assert!(
        !state.warnings.iter().any(|w| w.contains("match nothing")),
        "{:?}",
        state.warnings
    );
    // The dump lists what the client learned, with the answer's address
    // and what is left of its TTL; the bystander resolved nothing.
    let api = lab
        .pod_ip(&palisade_e2e::PodName::parse("web/api").unwrap())
        .unwrap()
        .to_string();
    let names = state.names.expect("a learner runs");
    assert!(names.learning, "{names:?}");
    assert!(!names.servers.is_empty(), "{names:?}");
    let client = names
        .pods
        .iter()
        .find(|p| p.pod == "app/client")
        .unwrap_or_else(|| panic!("app/client learned nothing: {names:?}"));
    let learned = client
        .names
        .iter()
        .find(|n| n.name == "api.example.com")
        .unwrap_or_else(|| panic!("api.example.com not learned: {client:?}"));
    let entry = learned
        .addresses
        .iter()
        .find(|a| a.address == api)
        .unwrap_or_else(|| panic!("{api} not learned for api.example.com: {learned:?}"));
    assert!(
        entry.expires_in_ms > 0 && entry.expires_in_ms <= 30_000,
        "TTL 30 s: {entry:?}"
    );
    assert!(
        !names.pods.iter().any(|p| p.pod == "app/bystander"),
        "{names:?}"
    );
    assert!(names.answers_learned_from >= 3, "{names:?}");
    assert!(
        names.recent_holds >= 3 && names.hold_p50_us > 0 && names.hold_max_us >= names.hold_p99_us,
        "hold times: {names:?}"
    );
    // The flow log names the name that allowed the connection.
    let node = lab.node_name().to_string();
    lab.wait_flow_log(
        &node,
        "app/client's connection allowed as learned, naming api or www.example.com",
        Duration::from_secs(30),
        |lines| {
            // Both names answer api's address; the probes may resolve them
            // in either order, and a line names what the learner had
            // reported for the address by then: one of them, or both.
            lines.iter().any(|l| {
                learned_line(l, "app/client", &api)
                    && l["domain_names"].as_array().is_some_and(|n| {
                        !n.is_empty()
                            && n.iter()
                                .all(|n| n == "api.example.com" || n == "www.example.com")
                    })
            })
        },
    )
    .unwrap();
    // The same in the metrics, with how long answers were held.
    let enforcer_metrics = || {
        let addr = metrics_addr(&lab.log_dir().join("enforcer.log"));
        scrape(lab.node_netns(), &addr)
    };
    let m = enforcer_metrics();
    assert_eq!(get(&m, "palisade_dns_learner_up"), 1.0);
    assert!(get(&m, "palisade_dns_learned_names") >= 3.0, "{m:#?}");
    // api and www answer one address; deep another.
    assert!(get(&m, "palisade_dns_learned_addresses") >= 2.0, "{m:#?}");
    assert!(
        get(
            &m,
            "palisade_dns_datapath_frames_total{event=\"answer_held\"}"
        ) >= 3.0,
        "{m:#?}"
    );
    assert!(
        get(&m, "palisade_dns_answer_hold_seconds_count") >= 3.0,
        "{m:#?}"
    );

    // A name the rule matches, for an address the client never learned.
    let mut records = scenario.dns.clone().unwrap().records;
    records.insert(
        dns::parse_name("late.example.com").unwrap(),
        (
            30,
            dns::Answer::Addrs(vec![
                palisade_e2e::scenario::Target::parse("web/other").unwrap()
            ]),
        ),
    );
    lab.set_dns_records(&records).unwrap();
    let probe = |lab: &Lab, to: &str| {
        let spec = ProbeSpec::new("app/client", to, 443, Protocol::Tcp).unwrap();
        lab.probe(&spec).unwrap().verdict()
    };

    // The enforcer killed (no clean exit): once its lease lapses, answers
    // pass unheld, so resolution works; what was learned keeps working;
    // a new name is not learned, so its address stays denied.
    let pid = lab.enforcer_pid().expect("the enforcer runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let client = pod_ns(&lab, "app/client");
    let resolver = lab.dns_resolver().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while dns::resolve(
        &client,
        resolver,
        "late.example.com",
        Duration::from_millis(500),
    )
    .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "resolution never came back without an enforcer"
        );
    }
    assert_eq!(
        probe(&lab, "name:late.example.com"),
        Some(Verdict::Deny),
        "not learned: fails closed"
    );
    assert_eq!(
        probe(&lab, "name:api.example.com"),
        Some(Verdict::Allow),
        "learned before: kept"
    );

    // A new enforcer adopts what was learned, and learns again.
    lab.restart_enforcer().expect("the enforcer restarts");
    lab.wait_realized().expect("realized");
    // Its dump shows what it adopted: addresses without their names.
    let learned_by = |lab: &Lab| {
        let names = lab
            .enforcer_state()
            .expect("the enforcer answers")
            .names
            .expect("a learner runs");
        assert!(names.learning, "{names:?}");
        names
            .pods
            .iter()
            .find(|p| p.pod == "app/client")
            .cloned()
            .unwrap_or_else(|| panic!("app/client has nothing learned: {names:?}"))
    };
    let client = learned_by(&lab);
    assert!(
        client.adopted.iter().any(|a| a.address == api),
        "{api} adopted: {client:?}"
    );
    assert_eq!(
        probe(&lab, "name:api.example.com"),
        Some(Verdict::Allow),
        "adopted"
    );
    assert_eq!(
        probe(&lab, "name:late.example.com"),
        Some(Verdict::Allow),
        "learned by the new enforcer"
    );
    let client = learned_by(&lab);
    assert!(
        client.names.iter().any(|n| n.name == "late.example.com"),
        "learned again, by name: {client:?}"
    );
}

/// No window: a client that connects the instant its answer is read is
/// allowed, every time. Each name answers a fresh address of the lab's
/// internet (the fabric answers them all, on 443), so each connection
/// needs what its own answer taught.
#[test]
#[ignore = "needs root"]
fn a_client_that_connects_the_instant_its_answer_arrives_is_allowed_a_thousand_times() {
    require_root();
    const NAMES: usize = 1000;
    let (mut lab, scenario) = lab_after_example();
    let _internet = Internet::serve(&lab);
    // Addresses 198.18.0.1 on, one per name, none resolved before.
    let addr = |i: usize| Ipv4Addr::new(198, 18, (i / 250) as u8, (i % 250) as u8 + 1);
    assert!(palisade_e2e::lab::INTERNET.starts_with("198.18."));
    let mut records = scenario.dns.clone().unwrap().records;
    for i in 0..NAMES {
        records.insert(
            dns::parse_name(&format!("n{i}.example.com")).unwrap(),
            (60, dns::Answer::Addrs(vec![Target::Ip(addr(i).into())])),
        );
    }
    lab.set_dns_records(&records).unwrap();
    let client = pod_ns(&lab, "app/client");
    let resolver = lab.dns_resolver().unwrap();
    // The test can fail: an internet address nobody resolved is refused.
    assert!(
        connect(&client, Ipv4Addr::new(198, 19, 0, 1)).is_err(),
        "an unresolved address"
    );
    // A SYN refused would be retransmitted a second later and might then
    // pass: every first SYN must pass, which the denial counter says (and a
    // connection not made well within the retransmission timeout).
    let denied_before = denied(&lab);
    let mut failed = Vec::new();
    for i in 0..NAMES {
        let name = format!("n{i}.example.com");
        let c = dns::resolve_and_connect(
            &client,
            resolver,
            &name,
            443,
            Duration::from_secs(2),
            Duration::from_millis(900),
        )
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(c.addr, IpAddr::from(addr(i)), "{name}");
        if let Err(e) = c.result {
            failed.push(format!("{name} ({}): {e}", c.addr));
        }
    }
    let denied_during = denied(&lab) - denied_before;
    // What the client learned is the client's.
    let bystander = pod_ns(&lab, "app/bystander");
    assert!(connect(&bystander, addr(0)).is_err(), "the bystander");
    assert!(
        failed.is_empty(),
        "{} of {NAMES} connections made the instant the answer arrived were refused: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
    assert_eq!(
        denied_during, 0.0,
        "packets of the client's egress denied while it connected to what it had just resolved"
    );
}

/// Every address of the lab's internet accepts TCP connections on 443,
/// and echoes what it is sent, while this lives.
struct Internet {
    ns: NetNs,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl Internet {
    fn serve(lab: &Lab) -> Internet {
        Internet::serve_on(lab, Ipv4Addr::UNSPECIFIED.into())
    }

    /// Bound to `any`: `::` serves IPv6 and IPv4 alike.
    fn serve_on(lab: &Lab, any: IpAddr) -> Internet {
        let ns = NetNs::from_existing(lab.internet_netns().expect("a fabric"));
        let listener = ns
            .run(|| TcpListener::bind((any, 443)))
            .unwrap()
            .expect("a listener for the internet");
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    // Echoes until the client closes: an established
                    // connection shows it still works.
                    if let Ok(mut c) = conn {
                        std::thread::spawn(move || {
                            let mut r = c.try_clone().expect("a second handle");
                            let _ = std::io::copy(&mut r, &mut c);
                        });
                    }
                }
            })
        };
        Internet {
            ns,
            stop,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the acceptor, which then sees the flag.
        let _ = self
            .ns
            .run(|| TcpStream::connect((Ipv4Addr::LOCALHOST, 443)));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// A TCP connection from `ns` to `to`:443, given a second.
fn connect(ns: &NetNs, to: impl Into<IpAddr>) -> std::io::Result<TcpStream> {
    let to = std::net::SocketAddr::new(to.into(), 443);
    ns.run(|| TcpStream::connect_timeout(&to, Duration::from_secs(1)))
        .unwrap()
}

/// Sends `packets` out of the pod's eth0 as they are (a packet socket: what
/// a pod with CAP_NET_RAW can do).
fn forge_from(ns: &NetNs, packets: &[forge::Forged]) {
    ns.run(|| {
        let gw = forge::default_gateway()?;
        let mac = forge::gateway_mac(gw, Duration::from_secs(2))?;
        forge::send(palisade_e2e::cni::IFNAME, mac, packets)
    })
    .unwrap()
    .expect("forging");
}

/// Packets of pods' egress the enforcer's node denied by policy, so far.
fn denied(lab: &Lab) -> f64 {
    let addr = metrics_addr(&lab.log_dir().join("enforcer.log"));
    let m = scrape(lab.node_netns(), &addr);
    get(
        &m,
        "palisade_enforcer_verdicts_total{direction=\"egress\",verdict=\"denied\",reason=\"policy\"}",
    )
}

/// Packets the enforcer's node denied for a spoofed source, so far.
fn spoofed(lab: &Lab) -> f64 {
    let addr = metrics_addr(&lab.log_dir().join("enforcer.log"));
    let m = scrape(lab.node_netns(), &addr);
    get(
        &m,
        "palisade_enforcer_verdicts_total{direction=\"egress\",verdict=\"denied\",reason=\"spoofed_source\"}",
    )
}

/// Only the trusted servers' answers, to a query the pod sent, teach: an
/// answer forged by the pod itself or by another pod, with the server's
/// address or its own, and an answer from a resolver the enforcer does not
/// trust (one the policy lets the pod query), open nothing.
#[test]
#[ignore = "needs root"]
fn forged_answers_and_untrusted_resolvers_teach_nothing() {
    require_root();
    let (mut lab, scenario) = lab_after_example();
    let _internet = Internet::serve(&lab);
    let genuine = Ipv4Addr::new(198, 18, 100, 1);
    let forged = Ipv4Addr::new(198, 18, 100, 2);
    let rogue = Ipv4Addr::new(198, 18, 100, 3);
    let name = dns::parse_name("target.example.com").unwrap();
    let mut records = scenario.dns.clone().unwrap().records;
    records.insert(
        name.clone(),
        (60, dns::Answer::Addrs(vec![Target::Ip(genuine.into())])),
    );
    lab.set_dns_records(&records).unwrap();
    let (client, bystander) = (pod_ns(&lab, "app/client"), pod_ns(&lab, "app/bystander"));
    let client_ip = pod_ipv4(&lab, "app/client");
    let bystander_ip = pod_ipv4(&lab, "app/bystander");
    let server_ip = pod_ipv4(&lab, "kube-system/coredns");
    let resolver = lab.dns_resolver().unwrap();
    let IpAddr::V4(service_ip) = resolver.ip() else {
        panic!("an IPv4 resolver: {resolver}")
    };

    // The client asks, from a port and with an id the forgers are given
    // (the worst case: they need not guess).
    const PORT: u16 = 35353;
    const ID: u16 = 0x4242;
    let query = dns::a_query(ID, name.clone()).encode();
    let evil: dns::Records = [(
        name.clone(),
        (60, dns::Answer::Addrs(vec![Target::Ip(forged.into())])),
    )]
    .into();
    let answer = dns::respond(&dns::zone(&evil, |_| None).unwrap(), &query).unwrap();
    let forgery = |what: &str, src: Ipv4Addr| forge::Forged {
        what: what.into(),
        packet: forge::udp_packet(src, client_ip, 53, PORT, &answer),
    };
    let spoofed_before = spoofed(&lab);
    let sock = client
        .run(|| -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, PORT))?;
            s.send_to(&query, resolver)?;
            Ok(s)
        })
        .unwrap()
        .expect("the client's query");
    forge_from(
        &client,
        &[
            forgery("from the client as the Service", service_ip),
            forgery("from the client as the server pod", server_ip),
            forgery("from the client as itself", client_ip),
        ],
    );
    forge_from(
        &bystander,
        &[
            forgery("from the bystander as the Service", service_ip),
            forgery("from the bystander as the server pod", server_ip),
            forgery("from the bystander as itself", bystander_ip),
        ],
    );
    // The genuine answer reaches the client, and teaches.
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1500];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no genuine answer");
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if from == resolver {
            let m = palisade_dns::Message::parse(&buf[..n]).unwrap();
            let got = palisade_dns::resolve(&m).unwrap();
            if got.addrs.iter().any(|(a, _)| *a == IpAddr::from(genuine)) {
                break;
            }
        }
    }
    assert!(
        connect(&client, genuine).is_ok(),
        "the genuine answer teaches"
    );
    assert!(
        connect(&client, forged).is_err(),
        "a forged answer opened {forged}"
    );
    // Each forgery with another's address was dropped at its sender.
    assert!(
        spoofed(&lab) - spoofed_before >= 4.0,
        "spoofed sources denied: before {spoofed_before}, now {}",
        spoofed(&lab)
    );

    // A resolver of the pod's own choosing, which the policy lets it ask.
    let other = pod_ns(&lab, "web/other");
    let rogue_zone = dns::zone(
        &[(
            dns::parse_name("rogue.example.com").unwrap(),
            (60, dns::Answer::Addrs(vec![Target::Ip(rogue.into())])),
        )]
        .into(),
        |_| None,
    )
    .unwrap();
    let rogue_sock = other
        .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 53)))
        .unwrap()
        .expect("the rogue resolver's socket");
    let rogue_server = std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        let (n, from) = rogue_sock.recv_from(&mut buf).expect("a query");
        let reply = dns::respond(&rogue_zone, &buf[..n]).expect("an answer");
        rogue_sock.send_to(&reply, from).expect("answering");
    });
    lab.apply(&common::objects(
        r#"
objects:
  - apiVersion: policy.networking.k8s.io/v1alpha2
    kind: ClusterNetworkPolicy
    metadata: {name: rogue-dns}
    spec:
      tier: Admin
      priority: 5
      subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: app}}}
      egress:
        - name: rogue
          action: Accept
          to: [{pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: web}}, podSelector: {matchLabels: {app: other}}}}]
          protocols: [{udp: {destinationPort: {number: 53}}}]
"#,
    ))
    .unwrap();
    lab.wait_realized().unwrap();
    let other_ip = pod_ipv4(&lab, "web/other");
    let got = dns::resolve(
        &client,
        (other_ip, 53).into(),
        "rogue.example.com",
        Duration::from_secs(5),
    )
    .expect("the rogue resolver answers");
    rogue_server.join().unwrap();
    assert_eq!(got.addrs[0].0, IpAddr::from(rogue));
    assert!(
        connect(&client, rogue).is_err(),
        "an untrusted resolver's answer opened {rogue}"
    );
    // Nothing of it is in the dump.
    let names = lab.enforcer_state().unwrap().names.expect("a learner runs");
    let text = format!("{names:?}");
    assert!(
        !text.contains("198.18.100.2") && !text.contains("198.18.100.3"),
        "{text}"
    );
    assert!(text.contains("198.18.100.1"), "{text}");
}

/// Whether flow log line `l` is `pod`'s connection to `dst` allowed by
/// what it learned.
fn learned_line(l: &serde_json::Value, pod: &str, dst: &str) -> bool {
    l["pod"] == pod && l["reason"] == "learned" && l["dst_ip"] == dst
}

/// The addresses the dump lists for `pod`'s learned `name` (empty: none,
/// or expired and cleared).
fn learned_addresses(lab: &Lab, pod: &str, name: &str) -> Vec<String> {
    let names = lab
        .enforcer_state()
        .expect("the enforcer answers")
        .names
        .expect("a learner runs");
    names
        .pods
        .iter()
        .filter(|p| p.pod == pod)
        .flat_map(|p| &p.names)
        .filter(|n| n.name == name)
        .flat_map(|n| n.addresses.iter().map(|a| a.address.clone()))
        .collect()
}

/// Sends `data` on `stream` and reads it back from the echo.
fn echoes(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(data)?;
    let mut back = vec![0u8; data.len()];
    stream.read_exact(&mut back)?;
    assert_eq!(back, data);
    Ok(())
}

/// An answer's TTL bounds new connections, never open ones; a name whose
/// answer changes opens its new address.
#[test]
#[ignore = "needs root"]
fn expiry_keeps_open_connections_and_refuses_new_ones_and_a_changed_answer_opens_its_address() {
    require_root();
    let (mut lab, scenario) = lab_after_example();
    let _internet = Internet::serve(&lab);
    let first = Ipv4Addr::new(198, 18, 110, 1);
    let second = Ipv4Addr::new(198, 18, 110, 2);
    let mut records = scenario.dns.clone().unwrap().records;
    let record = |addr: Ipv4Addr| (1, dns::Answer::Addrs(vec![Target::Ip(addr.into())]));
    let name = dns::parse_name("brief.example.com").unwrap();
    records.insert(name.clone(), record(first));
    lab.set_dns_records(&records).unwrap();
    let client = pod_ns(&lab, "app/client");
    let resolve = |lab: &Lab| {
        dns::resolve(
            &client,
            lab.dns_resolver().unwrap(),
            "brief.example.com",
            Duration::from_secs(2),
        )
        .expect("it resolves")
    };
    // TTL 1 s, raised to the 5 s floor.
    let got = resolve(&lab);
    assert_eq!(got.addrs, vec![(IpAddr::from(first), 1)]);
    let mut open = connect(&client, first).expect("allowed once resolved");
    echoes(&mut open, b"before").unwrap();
    let learned = learned_addresses(&lab, "app/client", "brief.example.com");
    assert_eq!(learned, [first.to_string()]);

    // Expired: the learner clears it (the datapath already ignores it for
    // new flows at its expiry).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !learned_addresses(&lab, "app/client", "brief.example.com").is_empty() {
        assert!(Instant::now() < deadline, "brief.example.com never expired");
        std::thread::sleep(Duration::from_millis(200)); // poll: expiry is the learner's own clock
    }
    echoes(&mut open, b"after expiry").expect("an open connection outlives its answer");
    assert!(
        connect(&client, first).is_err(),
        "a new connection after expiry"
    );

    // The answer changes: the new address is allowed once resolved; the
    // old one, not answered again, stays refused.
    records.insert(name, record(second));
    lab.set_dns_records(&records).unwrap();
    let got = resolve(&lab);
    assert_eq!(got.addrs, vec![(IpAddr::from(second), 1)]);
    assert!(connect(&client, second).is_ok(), "the new answer's address");
    assert!(connect(&client, first).is_err(), "the old answer's address");
    echoes(&mut open, b"still").expect("the first connection still works");
}

/// An answer from the trusted server itself to a query the pod never sent
/// teaches nothing; one name with 100 addresses (an answer IP fragments
/// carry) opens all of them.
#[test]
#[ignore = "needs root"]
fn an_unasked_answer_teaches_nothing_and_a_hundred_addresses_are_learned() {
    require_root();
    let (mut lab, scenario) = lab_after_example();
    let _internet = Internet::serve(&lab);
    let client = pod_ns(&lab, "app/client");
    let client_ip = pod_ipv4(&lab, "app/client");
    let server = pod_ns(&lab, "kube-system/coredns");
    let server_ip = pod_ipv4(&lab, "kube-system/coredns");
    let unasked = Ipv4Addr::new(198, 18, 120, 1);
    let name = dns::parse_name("unasked.example.com").unwrap();
    let zone: dns::Records = [(
        name.clone(),
        (60, dns::Answer::Addrs(vec![Target::Ip(unasked.into())])),
    )]
    .into();
    let answer = dns::respond(
        &dns::zone(&zone, |_| None).unwrap(),
        &dns::a_query(0x777, name).encode(),
    )
    .unwrap();
    let ignored = |lab: &Lab| {
        lab.enforcer_state()
            .unwrap()
            .names
            .expect("a learner runs")
            .ignored
            .get("no_query")
            .copied()
            .unwrap_or(0)
    };
    let before = ignored(&lab);
    forge_from(
        &server,
        &[forge::Forged {
            what: "an answer from the server to a query never sent".into(),
            packet: forge::udp_packet(server_ip, client_ip, 53, 34343, &answer),
        }],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while ignored(&lab) == before {
        assert!(
            Instant::now() < deadline,
            "the learner never saw the unasked answer: {:?}",
            lab.enforcer_state().unwrap().names
        );
        std::thread::sleep(Duration::from_millis(100)); // poll: the learner reads on its own schedule
    }
    assert!(
        connect(&client, unasked).is_err(),
        "an unasked answer opened {unasked}"
    );

    // 100 addresses: about 1.6 KB of answer, more than one frame.
    let addrs: Vec<Ipv4Addr> = (1..=100).map(|i| Ipv4Addr::new(198, 18, 121, i)).collect();
    let mut records = scenario.dns.clone().unwrap().records;
    records.insert(
        dns::parse_name("many.example.com").unwrap(),
        (
            60,
            dns::Answer::Addrs(addrs.iter().map(|a| Target::Ip((*a).into())).collect()),
        ),
    );
    lab.set_dns_records(&records).unwrap();
    let got = dns::resolve(
        &client,
        lab.dns_resolver().unwrap(),
        "many.example.com",
        Duration::from_secs(2),
    )
    .unwrap_or_else(|e| {
        let addr = metrics_addr(&lab.log_dir().join("enforcer.log"));
        let m = scrape(lab.node_netns(), &addr);
        let dns: Vec<_> = m
            .iter()
            .filter(|(k, v)| {
                (k.starts_with("palisade_dns") || k.starts_with("palisade_enforcer_verdicts"))
                    && **v > 0.0
                    && !k.contains("bucket")
            })
            .collect();
        panic!("{e:#}\n{:?}\n{dns:#?}", lab.enforcer_state().unwrap().names)
    });
    assert_eq!(got.addrs.len(), 100, "{got:?}");
    let refused: Vec<Ipv4Addr> = addrs
        .iter()
        .copied()
        .filter(|a| connect(&client, *a).is_err())
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    let state = lab.enforcer_state().unwrap();
    let learned = learned_addresses(&lab, "app/client", "many.example.com");
    assert_eq!(learned.len(), 100, "{:?}", state.names);
}

/// AAAA: an IPv6 address a AAAA answer gave is allowed, over IPv6, to the
/// pod that asked; one never answered is not, nor is the address to
/// another pod.
#[test]
#[ignore = "needs root"]
fn an_address_from_a_aaaa_answer_is_learned_for_ipv6() {
    require_root();
    let (mut lab, scenario) = lab_after_example_on(LabConfig {
        pod_subnet6: Some("fd00:10:244::/64".into()),
        ..LabConfig::default()
    });
    // The example denies the IPv4 rest; deny IPv6's below the names too.
    lab.apply(&common::objects(
        r#"
objects:
  - apiVersion: policy.networking.k8s.io/v1alpha2
    kind: ClusterNetworkPolicy
    metadata: {name: no-other-ipv6}
    spec:
      tier: Admin
      priority: 20
      subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: app}}}
      egress:
        - name: nothing-else-v6
          action: Deny
          to: [{networks: ["::/0"]}]
"#,
    ))
    .unwrap();
    lab.wait_realized().unwrap();
    let _internet = Internet::serve_on(&lab, std::net::Ipv6Addr::UNSPECIFIED.into());
    let answered: std::net::Ipv6Addr = "2001:2::1".parse().unwrap();
    let unanswered: std::net::Ipv6Addr = "2001:2::2".parse().unwrap();
    assert!(palisade_e2e::lab::INTERNET6.starts_with("2001:2::"));
    let mut records = scenario.dns.clone().unwrap().records;
    records.insert(
        dns::parse_name("six.example.com").unwrap(),
        (60, dns::Answer::Addrs(vec![Target::Ip(answered.into())])),
    );
    lab.set_dns_records(&records).unwrap();
    let client = pod_ns(&lab, "app/client");
    assert!(
        connect(&client, answered).is_err(),
        "not resolved yet: the policy denies it"
    );
    let got = dns::resolve6(
        &client,
        lab.dns_resolver().unwrap(),
        "six.example.com",
        Duration::from_secs(2),
    )
    .expect("it resolves");
    assert_eq!(got.addrs, vec![(IpAddr::from(answered), 60)]);
    connect(&client, answered).expect("learned from the AAAA answer");
    assert!(connect(&client, unanswered).is_err(), "never answered");
    let bystander = pod_ns(&lab, "app/bystander");
    assert!(connect(&bystander, answered).is_err(), "the bystander");
    let learned = learned_addresses(&lab, "app/client", "six.example.com");
    assert_eq!(learned, [answered.to_string()]);
}
