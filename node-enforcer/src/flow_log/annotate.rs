//! Pure: one datapath flow event and what the enforcer knows → one flow log
//! record.

use std::net::{IpAddr, Ipv6Addr};

use palisade_ebpf::{
    FlowEvent, FLOW_ALLOWED, FLOW_DENIED, FLOW_WOULD_ALLOW, FLOW_WOULD_DENY, HOOK_FROM_POD,
    STAT_ALLOWED_UNISOLATED, STAT_DENIED, STAT_DENIED_CT_SHARE, STAT_DENIED_FRAGMENT,
    STAT_DENIED_MALFORMED, STAT_DENIED_SPOOF,
};
use palisade_proto::v1::{DirectionPolicy, PodPolicy};

use super::deciding::first_matching_rule;
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
    policies: Vec<String>,
}

impl Decision {
    fn new(verdict: &'static str, reason: &'static str) -> Self {
        Decision {
            verdict,
            reason,
            policy: None,
            rule_index: None,
            policies: Vec::new(),
        }
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
        policies: d.policies,
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
    let rule_of = |d: &mut Decision, audit: bool| {
        if let Some(r) = direction(plan, egress, audit)
            .and_then(|p| first_matching_rule(p, peer, e.proto, dport))
        {
            d.policy = (!r.policy.is_empty()).then(|| r.policy.clone());
            d.rule_index = d.policy.is_some().then_some(r.rule_index);
        }
    };
    match e.kind {
        FLOW_ALLOWED if stat == STAT_ALLOWED_UNISOLATED => Decision::new("allowed", "not_isolated"),
        FLOW_ALLOWED => {
            let mut d = Decision::new("allowed", "policy");
            rule_of(&mut d, false);
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
            d.policies = plan.map(|p| p.policies.clone()).unwrap_or_default();
            d
        }
        FLOW_WOULD_ALLOW => {
            let mut d = Decision::new("would-allow", "staged_policy");
            rule_of(&mut d, true);
            d
        }
        FLOW_WOULD_DENY => {
            let mut d = Decision::new("would-deny", "staged_policy");
            d.policies = plan.map(|p| p.staged_policies.clone()).unwrap_or_default();
            d
        }
        _ => Decision::new("unknown", "unknown_event"),
    }
}

#[cfg(test)]
mod tests;
