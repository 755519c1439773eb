//! ClusterPolicyEndpoints (`networking.k8s.aws/v1alpha1`, cluster-scoped):
//! the AWS network policy controller's resolved form of its
//! ClusterNetworkPolicies, read by the `policyendpoint` source beside
//! PolicyEndpoints.
//!
//! One ClusterNetworkPolicy becomes one or more ClusterPolicyEndpoints
//! ("slices", named after the policy with a generated suffix) that all name
//! it in `spec.policyRef.name` and carry its `tier`, `priority` and
//! `subject`. The pods the subject selected (`podSelectorEndpoints`, any
//! namespace) and the rules' peers resolved to addresses (`ingress`,
//! `egress`: one entry per address, with the rule's `action` and ports) are
//! spread over the slices; only their union means anything, and
//! [`merge`] turns it into tier rules.
//!
//! What a slice does not hold is the order of the policy's rules: the AWS
//! controller (`pkg/resolvers/clusternetworkpolicy_resolver.go`,
//! `pkg/policyendpoints/clusterpolicyendpoints_chunking.go` and
//! `manager.go`) deduplicates the entries, files them in a Go map keyed by
//! a hash of (cidr, domainName, action, ports) and packs them into slices in
//! that map's iteration order, which Go randomizes; an update keeps the
//! entries already packed where they are and appends the new ones; each
//! slice's entries are then merged by (cidr, action) through another map.
//! So neither the order of entries in a slice nor that of the slices says
//! which rule came first, nor whether two entries came from one rule, and
//! rule names are not written at all. [`merge`] therefore judges a
//! policy's entries by action: Deny, then Pass, then Accept (see there).
//!
//! The spec is watched as JSON and parsed here, checked against the CRD's
//! schema first (`validate::policy_endpoint::cluster_spec`), as for
//! PolicyEndpoints.

pub mod merge;

use serde::Deserialize;
use serde_json::Value;

use super::policy_endpoint::{PodEndpoint, Port, SliceError};
use palisade_apis::wire;

watched_resource!(
    /// A ClusterPolicyEndpoint as watched: the spec stays JSON until
    /// [`parse_spec`].
    ClusterPolicyEndpoint,
    kube::core::ClusterResourceScope,
    kind: "ClusterPolicyEndpoint",
    group: "networking.k8s.aws",
    version: "v1alpha1",
    plural: "clusterpolicyendpoints"
);

/// The spec as the AWS controller's CRD defines it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicyEndpointSpec {
    pub policy_ref: ClusterPolicyRef,
    /// Admin or Baseline (the schema's enum).
    pub tier: String,
    pub priority: i64,
    /// The policy's subject, copied by the AWS controller.
    pub subject: wire::Subject,
    #[serde(default)]
    pub pod_selector_endpoints: Option<Vec<PodEndpoint>>,
    #[serde(default)]
    pub ingress: Option<Vec<ClusterEndpointInfo>>,
    #[serde(default)]
    pub egress: Option<Vec<ClusterEndpointInfo>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ClusterPolicyRef {
    pub name: String,
}

/// One address (or domain name) of a rule, with the rule's action.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ClusterEndpointInfo {
    /// Accept, Deny or Pass (the schema's enum).
    pub action: String,
    #[serde(default)]
    pub cidr: Option<String>,
    #[serde(default, rename = "domainName")]
    pub domain_name: Option<String>,
    #[serde(default)]
    pub ports: Option<Vec<Port>>,
}

/// The display name of a slice, as errors name it.
pub fn display_name(name: &str) -> String {
    format!("ClusterPolicyEndpoint {name}")
}

/// Parses a slice's spec, checked first as the API server checks it
/// against the CRD's schema; the error names the object and every bad
/// field.
pub fn parse_spec(name: &str, spec: &Value) -> Result<ClusterPolicyEndpointSpec, SliceError> {
    let object = display_name(name);
    if spec.is_null() {
        return Err(SliceError::NoSpec { object });
    }
    let mut errs = super::validate::Errors::default();
    super::validate::policy_endpoint::cluster_spec(spec, &mut errs);
    if let Err(errors) = errs.into_result() {
        return Err(SliceError::Invalid { object, errors });
    }
    let spec: ClusterPolicyEndpointSpec = serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        SliceError::Decode {
            object: object.clone(),
            field,
            cause: e.into_inner(),
        }
    })?;
    if spec.policy_ref.name.is_empty() {
        return Err(SliceError::NoPolicyName { object });
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_slice_as_the_aws_controller_writes_it_parses() {
        let spec = json!({
            "policyRef": {"name": "deny-db"},
            "tier": "Admin",
            "priority": 10,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
            "podSelectorEndpoints": [
                {"hostIP": "192.168.1.10", "podIP": "10.0.0.5", "name": "db-1", "namespace": "prod"}
            ],
            "ingress": [{"action": "Deny", "cidr": "10.0.0.7", "ports": [{"protocol": "TCP", "port": 80}]}],
            "egress": [{"action": "Accept", "domainName": "example.com"}],
        });
        let parsed = parse_spec("deny-db-x7k2p", &spec).unwrap();
        assert_eq!(parsed.policy_ref.name, "deny-db");
        assert_eq!((parsed.tier.as_str(), parsed.priority), ("Admin", 10));
        assert!(parsed.subject.pods.is_some());
        assert_eq!(parsed.pod_selector_endpoints.unwrap()[0].namespace, "prod");
        let ingress = parsed.ingress.unwrap();
        assert_eq!(ingress[0].action, "Deny");
        assert_eq!(ingress[0].ports.as_ref().unwrap()[0].port, Some(80));
        assert_eq!(
            parsed.egress.unwrap()[0].domain_name.as_deref(),
            Some("example.com")
        );
    }

    #[test]
    fn a_malformed_spec_names_the_object_and_the_field() {
        let base = json!({"policyRef": {"name": "p"}, "tier": "Admin", "priority": 1,
                          "subject": {"namespaces": {}}});
        let mut bad = base.clone();
        bad["ingress"] = json!([{"action": "Allow", "cidr": "10.0.0.1"}]);
        assert_eq!(
            parse_spec("p-1", &bad).unwrap_err().to_string(),
            "ClusterPolicyEndpoint p-1: spec.ingress[0].action: Unsupported value: \"Allow\": \
             supported values: \"Accept\", \"Deny\", \"Pass\""
        );
        let mut nameless = base.clone();
        nameless["policyRef"]["name"] = json!("");
        assert_eq!(
            parse_spec("p-2", &nameless).unwrap_err().to_string(),
            "ClusterPolicyEndpoint p-2: spec.policyRef.name: missing"
        );
        assert_eq!(
            parse_spec("p-3", &Value::Null).unwrap_err().to_string(),
            "ClusterPolicyEndpoint p-3: spec is missing"
        );
        assert!(parse_spec("p-4", &base).is_ok());
    }
}
