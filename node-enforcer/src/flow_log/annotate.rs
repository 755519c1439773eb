//! Pure: one datapath flow event and what the enforcer knows → one flow log
//! record.

use std::net::{IpAddr, Ipv6Addr};

use palisade_ebpf::{
    FlowEvent, FLOW_ALLOWED, FLOW_DENIED, FLOW_WOULD_ALLOW, FLOW_WOULD_DENY, HOOK_FROM_POD,
    STAT_ALLOWED_LEARNED, STAT_ALLOWED_UNISOLATED, STAT_DENIED, STAT_DENIED_CT_SHARE,
    STAT_DENIED_FRAGMENT, STAT_DENIED_MALFORMED, STAT_DENIED_SPOOF,
};
use palisade_proto::v1::{DirectionPolicy, PodPolicy};

use super::deciding::{decided_by, Decided};
use super::knowledge::Knowledge;
use super::record::FlowRecord;
use crate::compile::Prefix;
use crate::desired::PodKey;
use crate::reconciler::DENY_ALL;

/// An address as operators write it: IPv4-mapped addresses as IPv4.
pub fn address(bytes: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(bytes);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

pub fn protocol_name(proto: u8) -> String {
    match proto {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn name(pod: &PodKey) -> String {
    format!("{}/{}", pod.0, pod.1)
}

/// What decided, filled into the record by kind.
struct Decision {
    verdict: &'static str,
    reason: &'static str,
    policy: Option<String>,
    rule_index: Option<u32>,
    tier: Option<&'static str>,
    priority: Option<u32>,
    rule_name: Option<String>,
    policies: Vec<String>,
}

impl Decision {
    fn new(verdict: &'static str, reason: &'static str) -> Self {
        Decision {
            verdict,
            reason,
            policy: None,
            rule_index: None,
            tier: None,
            priority: None,
            rule_name: None,
            policies: Vec::new(),
        }
    }

    /// Names the ClusterNetworkPolicy rule that decided.
    fn tier_rule(&mut self, tier: &'static str, r: &palisade_proto::v1::TierRule) {
        if r.policy == crate::desired::STRICT_DEFAULT {
            self.reason = "strict_default";
            return;
        }
        self.policy = Some(r.policy.clone());
        self.rule_index = Some(r.rule_index);
        self.tier = Some(tier);
        self.priority = Some(r.priority);
        self.rule_name = (!r.rule_name.is_empty()).then(|| r.rule_name.clone());
    }
}

/// `realtime_offset_ns`: CLOCK_REALTIME - CLOCK_MONOTONIC when read.
pub fn annotate(e: &FlowEvent, k: &Knowledge, realtime_offset_ns: i128) -> FlowRecord {
    let egress = e.hook == HOOK_FROM_POD;
    let (src, dst) = (address(e.src), address(e.dst));
    let peer = if egress { dst } else { src };
    let (sport, dport) = (u16::from_be(e.sport), u16::from_be(e.dport));
    let pod = k.by_ifindex.get(&e.ifindex);
    let plan = pod.and_then(|p| k.plans.get(p));
    let d = decide(e, egress, peer, dport, plan, &k.node_addresses);
    let domain_names = match d.reason {
        "learned" => k
            .learned
            .get(&(e.ifindex, peer))
            .cloned()
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    FlowRecord {
        time: super::rfc3339::format_unix_ns(i128::from(e.ts_ns) + realtime_offset_ns),
        node: k.node.clone(),
        verdict: d.verdict,
        reason: d.reason,
        direction: if egress { "egress" } else { "ingress" },
        pod: pod.map(name),
        ifindex: e.ifindex,
        src_ip: src.to_string(),
        src_port: sport,
        dst_ip: dst.to_string(),
        dst_port: dport,
        protocol: protocol_name(e.proto),
        peer_pod: k.by_ip.get(&peer).filter(|p| Some(*p) != pod).map(name),
        policy: d.policy,
        rule_index: d.rule_index,
        tier: d.tier,
        priority: d.priority,
        rule_name: d.rule_name,
        policies: d.policies,
        domain_names,
    }
}

fn direction(plan: Option<&PodPolicy>, egress: bool, audit: bool) -> Option<&DirectionPolicy> {
    let p = plan?;
    match (egress, audit) {
        (true, false) => p.egress.as_ref(),
        (false, false) => p.ingress.as_ref(),
        (true, true) => p.audit_egress.as_ref(),
        (false, true) => p.audit_ingress.as_ref(),
    }
}

fn decide(
    e: &FlowEvent,
    egress: bool,
    peer: IpAddr,
    dport: u16,
    plan: Option<&PodPolicy>,
    node_addresses: &[Prefix],
) -> Decision {
    let stat = u32::from(e.stat);
    // The rule that decided, named into `d`; false when no rule did (a
    // NetworkPolicy isolation no rule lifts, or the default).
    let rule_of = |d: &mut Decision, audit: bool| -> bool {
        let Some(p) = direction(plan, egress, audit) else {
            return false;
        };
        match decided_by(p, peer, e.proto, dport) {
            Decided::Tier { tier, rule } => {
                d.tier_rule(tier, rule);
                true
            }
            Decided::NetworkPolicy(Some(r)) => {
                d.policy = (!r.policy.is_empty()).then(|| r.policy.clone());
                d.rule_index = d.policy.is_some().then_some(r.rule_index);
                true
            }
            Decided::NetworkPolicy(None) | Decided::Default => false,
        }
    };
    match e.kind {
        FLOW_ALLOWED if stat == STAT_ALLOWED_UNISOLATED => Decision::new("allowed", "not_isolated"),
        // By an address the pod learned by domain name: the plan's tables
        // (what rule_of reads) do not hold it.
        FLOW_ALLOWED if stat == STAT_ALLOWED_LEARNED => Decision::new("allowed", "learned"),
        FLOW_ALLOWED => {
            let mut d = Decision::new("allowed", "policy");
            if !rule_of(&mut d, false)
                && direction(plan, egress, false).is_some_and(|p| p.not_isolated)
            {
                // Tiers that decided nothing: the default let it through.
                d.reason = "default";
            }
            let full = Prefix::from_ip(peer, if peer.is_ipv4() { 32 } else { 128 });
            if d.policy.is_none() && node_addresses.iter().any(|n| n.contains(&full)) {
                d.reason = "node";
            }
            d
        }
        FLOW_DENIED if stat == STAT_DENIED_SPOOF => Decision::new("denied", "spoofed_source"),
        FLOW_DENIED if stat == STAT_DENIED_MALFORMED => Decision::new("denied", "malformed"),
        FLOW_DENIED if stat == STAT_DENIED_FRAGMENT => Decision::new("denied", "fragment"),
        // Allowed by policy, but the pod's hook holds its conntrack share.
        FLOW_DENIED if stat == STAT_DENIED_CT_SHARE => Decision::new("denied", "conntrack_share"),
        FLOW_DENIED if stat == STAT_DENIED && e.policy_id == DENY_ALL => {
            // The enforcer could not write the pod's policy and denies all.
            Decision::new("denied", "fail_closed")
        }
        FLOW_DENIED => {
            let mut d = Decision::new("denied", "policy");
            // A tier's Deny names its rule; a NetworkPolicy isolation, the
            // policies that select the pod.
            if !rule_of(&mut d, false) && d.reason == "policy" {
                d.policies = plan.map(|p| p.policies.clone()).unwrap_or_default();
            }
            d
        }
        FLOW_WOULD_ALLOW => {
            let mut d = Decision::new("would-allow", "staged_policy");
            rule_of(&mut d, true);
            d
        }
        FLOW_WOULD_DENY => {
            let mut d = Decision::new("would-deny", "staged_policy");
            if !rule_of(&mut d, true) {
                d.policies = plan.map(|p| p.staged_policies.clone()).unwrap_or_default();
            }
            d
        }
        _ => Decision::new("unknown", "unknown_event"),
    }
}

#[cfg(test)]
mod tests {
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
                ..Default::default()
            }),
            egress: Some(DirectionPolicy {
                rules: vec![rule("ns/dns", 0, "0.0.0.0/0", &[], &[(UDP, 53, 0)])],
                ..Default::default()
            }),
            policies: vec![
                "ns/allow-web".into(),
                "ns/default-deny".into(),
                "ns/dns".into(),
            ],
            staged_policies: vec!["ns/lockdown".into()],
            audit_ingress: Some(DirectionPolicy {
                rules: vec![rule("ns/lockdown", 4, "10.9.0.0/16", &[], &[])],
                ..Default::default()
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
            learned: Default::default(),
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
                tier: None,
                priority: None,
                rule_name: None,
                policies: vec![],
                domain_names: vec![],
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
        let learned = event(
            FLOW_ALLOWED,
            STAT_ALLOWED_LEARNED,
            HOOK_FROM_POD,
            ("10.244.0.5", 40000, "10.1.1.1", 443, 6),
        );
        let r = annotate(&learned, &k, 0);
        assert_eq!(
            (r.verdict, r.reason, r.policy, r.policies.len()),
            ("allowed", "learned", None, 0)
        );
        assert!(r.domain_names.is_empty(), "the learner reported nothing");
        // The names the learner reported for that pod and address.
        let mut named = k.clone();
        named.learned.insert(
            (7, "10.1.1.1".parse().unwrap()),
            vec!["api.example.com".into(), "www.example.com".into()],
        );
        let r = annotate(&learned, &named, 0);
        assert_eq!(r.domain_names, ["api.example.com", "www.example.com"]);
        // Only a learned allow carries names.
        let by_policy = event(
            FLOW_ALLOWED,
            STAT_ALLOWED_POLICY,
            HOOK_FROM_POD,
            ("10.244.0.5", 40000, "10.1.1.1", 443, 6),
        );
        assert!(annotate(&by_policy, &named, 0).domain_names.is_empty());
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

    #[test]
    fn a_tier_rule_that_decided_is_named_with_its_tier_priority_and_name() {
        use palisade_proto::v1::{DirectionPolicy, TierAction, TierRule};
        let mut k = knowledge();
        let pod = ("ns".to_string(), "web".to_string());
        let tier_rule = |action: TierAction, index: u32, name: &str| TierRule {
            action: action as i32,
            peers: rule("", 0, "10.244.0.0/24", &[], &[]).peers,
            ports: vec![],
            policy: "ClusterNetworkPolicy/platform".into(),
            priority: 5,
            rule_index: index,
            rule_name: name.into(),
            domain_names: vec![],
        };
        let plan = k.plans.get_mut(&pod).unwrap();
        plan.ingress = Some(DirectionPolicy {
            admin: vec![
                tier_rule(TierAction::Pass, 0, "to-namespaces"),
                tier_rule(TierAction::Deny, 1, "never-reached"),
            ],
            baseline: vec![tier_rule(TierAction::Deny, 0, "default-deny")],
            not_isolated: true,
            ..Default::default()
        });
        let e = event(
            FLOW_DENIED,
            palisade_ebpf::STAT_DENIED,
            HOOK_TO_POD,
            ("10.244.0.6", 41000, "10.244.0.5", 80, 6),
        );
        let r = annotate(&e, &k, 0);
        assert_eq!((r.verdict, r.reason), ("denied", "policy"));
        assert_eq!(
            (
                r.policy.as_deref(),
                r.rule_index,
                r.tier,
                r.priority,
                r.rule_name.as_deref()
            ),
            (
                Some("ClusterNetworkPolicy/platform"),
                Some(0),
                Some("Baseline"),
                Some(5),
                Some("default-deny")
            ),
            "the Admin Pass hands it to Baseline"
        );
        assert!(r.policies.is_empty());
        assert!(r
            .to_line()
            .contains(r#""tier":"Baseline","priority":5,"rule_name":"default-deny""#));
    }
}
