use super::*;
use crate::flow_log::deciding::tests::rule;
use palisade_ebpf::{mapped_addr, HOOK_TO_POD, STAT_ALLOWED_POLICY};
use palisade_proto::v1::{PodRef, Protocol};

const TCP: i32 = Protocol::Tcp as i32;
const UDP: i32 = Protocol::Udp as i32;

fn bytes(ip: &str) -> [u8; 16] {
    mapped_addr(ip.parse().unwrap())
}

/// `flow`: (source, source port, destination, destination port, protocol).
fn event(kind: u8, stat: u32, hook: u8, flow: (&str, u16, &str, u16, u8)) -> FlowEvent {
    let (src, sport, dst, dport, proto) = flow;
    FlowEvent {
        ts_ns: 5_000_000_000,
        ifindex: 7,
        policy_id: 3,
        src: bytes(src),
        dst: bytes(dst),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        hook,
        kind,
        stat: stat as u8,
    }
}

/// Pod ns/web (10.244.0.5 on ifindex 7): ingress from 10.244.0.0/24 on TCP
/// 80 (ns/allow-web rule 1), egress only UDP 53 anywhere (ns/dns rule 0);
/// pod ns/client is 10.244.0.6; the node is 10.244.0.1.
fn knowledge() -> Knowledge {
    let web = ("ns".to_string(), "web".to_string());
    let client = ("ns".to_string(), "client".to_string());
    let plan = PodPolicy {
        pod: Some(PodRef {
            namespace: "ns".into(),
            name: "web".into(),
        }),
        ingress: Some(DirectionPolicy {
            rules: vec![rule(
                "ns/allow-web",
                1,
                "10.244.0.0/24",
                &[],
                &[(TCP, 80, 0)],
            )],
        }),
        egress: Some(DirectionPolicy {
            rules: vec![rule("ns/dns", 0, "0.0.0.0/0", &[], &[(UDP, 53, 0)])],
        }),
        policies: vec![
            "ns/allow-web".into(),
            "ns/default-deny".into(),
            "ns/dns".into(),
        ],
        staged_policies: vec!["ns/lockdown".into()],
        audit_ingress: Some(DirectionPolicy {
            rules: vec![rule("ns/lockdown", 4, "10.9.0.0/16", &[], &[])],
        }),
        ..Default::default()
    };
    Knowledge {
        node: "node-1".into(),
        by_ifindex: [(7, web.clone())].into(),
        by_ip: [
            ("10.244.0.5".parse().unwrap(), web.clone()),
            ("10.244.0.6".parse().unwrap(), client),
        ]
        .into(),
        plans: [(web, plan)].into(),
        node_addresses: vec![Prefix::from_ip("10.244.0.1".parse().unwrap(), 32)],
    }
}

#[test]
fn an_allowed_flow_names_its_deciding_rule_and_peer_pod() {
    let e = event(
        FLOW_ALLOWED,
        STAT_ALLOWED_POLICY,
        HOOK_TO_POD,
        ("10.244.0.6", 41000, "10.244.0.5", 80, 6),
    );
    let r = annotate(&e, &knowledge(), 1_700_000_000_000_000_000);
    assert_eq!(
        r,
        FlowRecord {
            time: "2023-11-14T22:13:25.000000Z".into(),
            node: "node-1".into(),
            verdict: "allowed",
            reason: "policy",
            direction: "ingress",
            pod: Some("ns/web".into()),
            ifindex: 7,
            src_ip: "10.244.0.6".into(),
            src_port: 41000,
            dst_ip: "10.244.0.5".into(),
            dst_port: 80,
            protocol: "tcp".into(),
            peer_pod: Some("ns/client".into()),
            policy: Some("ns/allow-web".into()),
            rule_index: Some(1),
            policies: vec![],
        }
    );
    assert_eq!(
        r.to_line(),
        concat!(
            r#"{"time":"2023-11-14T22:13:25.000000Z","node":"node-1","verdict":"allowed","reason":"policy","#,
            r#""direction":"ingress","pod":"ns/web","ifindex":7,"src_ip":"10.244.0.6","src_port":41000,"#,
            r#""dst_ip":"10.244.0.5","dst_port":80,"protocol":"tcp","peer_pod":"ns/client","#,
            r#""policy":"ns/allow-web","rule_index":1}"#,
            "\n"
        )
    );
}

#[test]
fn a_denied_flow_lists_the_pods_policies() {
    let e = event(
        FLOW_DENIED,
        STAT_DENIED,
        HOOK_FROM_POD,
        ("10.244.0.5", 41000, "192.0.2.9", 443, 6),
    );
    let r = annotate(&e, &knowledge(), 0);
    assert_eq!(
        (r.verdict, r.reason, r.direction),
        ("denied", "policy", "egress")
    );
    assert_eq!(r.policies, ["ns/allow-web", "ns/default-deny", "ns/dns"]);
    assert_eq!((&r.policy, r.rule_index, &r.peer_pod), (&None, None, &None));
    let line = r.to_line();
    assert!(
        line.contains(r#""policies":["ns/allow-web","ns/default-deny","ns/dns"]"#),
        "{line}"
    );
    assert!(!line.contains("rule_index"), "{line}");
}

#[test]
fn reasons_without_a_policy() {
    let k = knowledge();
    let open = event(
        FLOW_ALLOWED,
        STAT_ALLOWED_UNISOLATED,
        HOOK_FROM_POD,
        ("10.244.0.5", 1, "10.1.1.1", 2, 17),
    );
    let r = annotate(&open, &k, 0);
    assert_eq!(
        (r.verdict, r.reason, r.policy, r.policies.len()),
        ("allowed", "not_isolated", None, 0)
    );
    let spoof = event(
        FLOW_DENIED,
        STAT_DENIED_SPOOF,
        HOOK_FROM_POD,
        ("10.6.6.6", 1, "10.1.1.1", 2, 17),
    );
    let r = annotate(&spoof, &k, 0);
    assert_eq!(
        (r.verdict, r.reason, r.policies.len()),
        ("denied", "spoofed_source", 0)
    );
    let over_share = event(
        FLOW_DENIED,
        STAT_DENIED_CT_SHARE,
        HOOK_FROM_POD,
        ("10.1.1.1", 1, "10.1.1.2", 2, 17),
    );
    let r = annotate(&over_share, &k, 0);
    assert_eq!(
        (r.verdict, r.reason, r.policies.len()),
        ("denied", "conntrack_share", 0)
    );
    let kubelet = event(
        FLOW_ALLOWED,
        STAT_ALLOWED_POLICY,
        HOOK_TO_POD,
        ("10.244.0.1", 5000, "10.244.0.5", 8080, 6),
    );
    let r = annotate(&kubelet, &k, 0);
    assert_eq!(
        (r.reason, r.policy),
        ("node", None),
        "the node is always allowed"
    );
    let mut failed = event(
        FLOW_DENIED,
        STAT_DENIED,
        HOOK_TO_POD,
        ("10.1.1.1", 1, "10.244.0.5", 80, 6),
    );
    failed.policy_id = DENY_ALL;
    assert_eq!(annotate(&failed, &k, 0).reason, "fail_closed");
    // A later fragment dropped as such (no allowed first fragment), with
    // its datagram's ports when its first fragment was seen: not a
    // policy's verdict, so no policies are listed.
    let fragment = event(
        FLOW_DENIED,
        palisade_ebpf::STAT_DENIED_FRAGMENT,
        HOOK_FROM_POD,
        ("10.244.0.5", 1000, "10.1.1.1", 53, 17),
    );
    let r = annotate(&fragment, &k, 0);
    assert_eq!(
        (r.verdict, r.reason, r.policies.len()),
        ("denied", "fragment", 0)
    );
}

#[test]
fn staged_policy_events_name_the_staged_policies() {
    let k = knowledge();
    let would_allow = event(
        FLOW_WOULD_ALLOW,
        STAT_DENIED,
        HOOK_TO_POD,
        ("10.9.1.1", 1, "10.244.0.5", 22, 6),
    );
    let r = annotate(&would_allow, &k, 0);
    assert_eq!((r.verdict, r.reason), ("would-allow", "staged_policy"));
    assert_eq!(
        (r.policy.as_deref(), r.rule_index),
        (Some("ns/lockdown"), Some(4))
    );
    let would_deny = event(
        FLOW_WOULD_DENY,
        STAT_ALLOWED_POLICY,
        HOOK_TO_POD,
        ("10.244.0.6", 1, "10.244.0.5", 80, 6),
    );
    let r = annotate(&would_deny, &k, 0);
    assert_eq!((r.verdict, r.reason), ("would-deny", "staged_policy"));
    assert_eq!(r.policies, ["ns/lockdown"]);
}

#[test]
fn unknown_interfaces_ipv6_and_unknown_protocols_still_log() {
    let mut e = event(
        FLOW_DENIED,
        STAT_DENIED,
        HOOK_FROM_POD,
        ("fd00::5", 0, "fd00::9", 0, 47),
    );
    e.ifindex = 99;
    let r = annotate(&e, &knowledge(), 0);
    assert_eq!(r.pod, None);
    assert_eq!(
        (r.src_ip.as_str(), r.dst_ip.as_str()),
        ("fd00::5", "fd00::9")
    );
    assert_eq!(r.protocol, "47");
    assert!(r.to_line().contains(r#""pod":null"#));
    e.kind = 9;
    assert_eq!(annotate(&e, &knowledge(), 0).verdict, "unknown");
}
