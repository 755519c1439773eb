//! One flow log line: a JSON object per event, fields in a fixed order.

use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlowRecord {
    /// RFC 3339, UTC.
    pub time: String,
    pub node: String,
    /// `allowed`, `denied`, `would-deny`, `would-allow`.
    pub verdict: &'static str,
    /// Why: `policy`, `not_isolated`, `node`, `spoofed_source`,
    /// `malformed`, `fragment`, `conntrack_share`, `fail_closed`,
    /// `staged_policy`, `learned`.
    pub reason: &'static str,
    /// Of the local pod: `egress` (it sent) or `ingress` (it receives).
    pub direction: &'static str,
    /// `namespace/name`; null when the interface is no known pod's.
    pub pod: Option<String>,
    pub ifindex: u32,
    pub src_ip: String,
    pub src_port: u16,
    pub dst_ip: String,
    pub dst_port: u16,
    pub protocol: String,
    /// The peer address's pod, when it is one this node knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_pod: Option<String>,
    /// The NetworkPolicy whose rule allowed the flow (for `would-allow`,
    /// the staged one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// That rule's index in the policy's spec.ingress or spec.egress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_index: Option<u32>,
    /// When a ClusterNetworkPolicy rule decided: its tier (`Admin`,
    /// `Baseline`), its policy's priority and the rule's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    /// For a denial by policy: the policies isolating the pod (all that
    /// select it: the plan does not say which isolate which direction);
    /// for `would-deny`, the staged ones.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// For `learned`: the names whose answers gave the pod this address,
    /// as the learner knew them when the line was written (none for an
    /// address adopted from a previous enforcer, whose names are lost).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub domain_names: Vec<String>,
}

impl FlowRecord {
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("a record always serializes");
        line.push('\n');
        line
    }
}
