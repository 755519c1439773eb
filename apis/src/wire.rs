//! Wire shapes: the objects as their API groups serve them. Every field the
//! CRDs define is here, with Go's `omitempty` as `Option`; enumerations and
//! numbers stay strings and `i64` so that validation can name a bad value
//! as the API server does (`Unsupported value`, `must be less than or equal
//! to 1000`) rather than fail to decode.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

pub const UPSTREAM_API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
pub const AWS_API_VERSION: &str = "networking.k8s.aws/v1alpha1";
pub const CLUSTER_NETWORK_POLICY: &str = "ClusterNetworkPolicy";

/// `policy.networking.k8s.io/v1alpha2` ClusterNetworkPolicy
/// (network-policy-api v0.2.0, standard and experimental channels).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamClusterNetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: UpstreamSpec,
    /// Written by implementations; never read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSpec {
    pub tier: String,
    pub priority: i64,
    pub subject: Subject,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<UpstreamIngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<UpstreamEgressRule>>,
}

/// Exactly one field set (both groups).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    /// Empty (or absent): every namespace.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    pub pod_selector: LabelSelector,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamIngressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: String,
    pub from: Vec<IngressPeer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<UpstreamProtocol>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamEgressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: String,
    pub to: Vec<UpstreamEgressPeer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<UpstreamProtocol>>,
}

/// Exactly one field set (both groups).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IngressPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// Exactly one field set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamEgressPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    /// Experimental channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    /// Experimental channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<Vec<String>>,
}

/// Exactly one field set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamProtocol {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<UpstreamPorts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UpstreamPorts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<UpstreamPorts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_named_port: Option<String>,
}

/// At least one field set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamPorts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<UpstreamPort>,
}

/// Exactly one field set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<PortRange>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    pub start: i64,
    pub end: i64,
}

/// AWS's `networking.k8s.aws/v1alpha1` ClusterNetworkPolicy
/// (amazon-network-policy-controller-k8s): the upstream tiers and actions
/// with AWS's port shapes, up to 100 rules, and domain names with Pass.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsClusterNetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `omitempty` in AWS's Go type, but every field in it is required.
    #[serde(default)]
    pub spec: AwsSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsSpec {
    pub tier: String,
    pub priority: i64,
    pub subject: Subject,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<AwsIngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<AwsEgressRule>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsIngressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: String,
    pub from: Vec<IngressPeer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<AwsPort>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsEgressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: String,
    pub to: Vec<AwsEgressPeer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<AwsPort>>,
}

/// Exactly one field set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsEgressPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<Vec<String>>,
}

/// One of its fields set (the CRD does not say so; the controller reads
/// the first it finds).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<AwsPortNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_range: Option<AwsPortRange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_port: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsPortNumber {
    /// Defaults to TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    pub port: i64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwsPortRange {
    /// Defaults to TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    pub start: i64,
    pub end: i64,
}
