//! PolicyEndpoints (`networking.k8s.aws/v1alpha1`), as the AWS network
//! policy controller (amazon-network-policy-controller-k8s) writes them: an
//! EKS cluster can keep that controller, which resolves every
//! NetworkPolicy into addresses, and have Palisade enforce the result in
//! place of the AWS node agent.
//!
//! One NetworkPolicy becomes one or more PolicyEndpoint objects ("slices"):
//! the AWS controller packs a bounded number of entries into each, so the
//! pods a policy selects (`podSelectorEndpoints`) and its peers (`ingress`,
//! `egress`: CIDRs with excepts and ports) are spread over several objects
//! that all name the policy in `spec.policyRef`. Only the union of the
//! slices of a policy means anything; [`merge`] turns that union into the
//! policy the engine enforces.
//!
//! The object is watched with its spec left as JSON and parsed here, field
//! by field: a malformed PolicyEndpoint is an error naming the object and the
//! field, never a watch that fails to decode (which would stall every
//! PolicyEndpoint, and the controller's sync, on one bad object).

pub mod merge;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;
use serde_json::Value;

use super::validate::{joined, FieldError};

/// Which objects the controller takes policy from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicySource {
    /// NetworkPolicies, resolved by this controller.
    #[default]
    #[value(name = "networkpolicy")]
    NetworkPolicy,
    /// PolicyEndpoints and ClusterPolicyEndpoints written by the AWS
    /// network policy controller.
    #[value(name = "policyendpoint")]
    PolicyEndpoint,
}

watched_resource!(
    /// A PolicyEndpoint as watched: the spec stays JSON until [`parse_spec`].
    PolicyEndpoint,
    kube::core::NamespaceResourceScope,
    kind: "PolicyEndpoint",
    group: "networking.k8s.aws",
    version: "v1alpha1",
    plural: "policyendpoints"
);

/// The spec as the AWS controller's CRD defines it. Go's `omitempty` means
/// any list may be absent or null.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyEndpointSpec {
    pub policy_ref: PolicyRef,
    /// The policy's own pod selector, copied by the AWS controller.
    #[serde(default)]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default)]
    pub pod_isolation: Option<Vec<String>>,
    #[serde(default)]
    pub pod_selector_endpoints: Option<Vec<PodEndpoint>>,
    #[serde(default)]
    pub ingress: Option<Vec<EndpointInfo>>,
    #[serde(default)]
    pub egress: Option<Vec<EndpointInfo>>,
    /// Set on slices of AdminNetworkPolicies, whose semantics (priorities,
    /// Deny and Pass) a plan cannot hold.
    #[serde(default)]
    pub is_global: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PolicyRef {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodEndpoint {
    #[serde(default, rename = "hostIP")]
    pub host_ip: Option<String>,
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct EndpointInfo {
    /// Empty for NetworkPolicy slices; Allow, Deny or Pass for admin ones.
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub cidr: String,
    /// An FQDN rule (v1.1 of the AWS controller): an egress rule by name.
    #[serde(default, rename = "domainName")]
    pub domain_name: Option<String>,
    #[serde(default)]
    pub except: Option<Vec<String>>,
    #[serde(default)]
    pub ports: Option<Vec<Port>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default)]
    pub protocol: Option<String>,
    /// Wider than the CRD's int32 so that an out-of-range number is
    /// reported as such, not as a type error.
    #[serde(default)]
    pub port: Option<i64>,
    #[serde(default)]
    pub end_port: Option<i64>,
}

/// The display name of a slice, as errors name it.
pub fn display_name(ns: &str, name: &str) -> String {
    format!("PolicyEndpoint {ns}/{name}")
}

/// Why a slice cannot be used; each names the object (`object`, as
/// [`display_name`] gives it) and the field.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error("{object}: spec is missing")]
    NoSpec { object: String },
    /// Refused as the API server would refuse it: every bad field.
    #[error("{object}: {}", joined(.errors))]
    Invalid {
        object: String,
        errors: Vec<FieldError>,
    },
    /// Valid by the schema, but not what Palisade reads.
    #[error("{object}: {field}: {cause}")]
    Decode {
        object: String,
        field: String,
        #[source]
        cause: serde_json::Error,
    },
    #[error("{object}: spec.policyRef.name: missing")]
    NoPolicyName { object: String },
    /// Only the policy's own namespace holds its slices.
    #[error(
        "{object}: spec.policyRef.namespace: {namespace:?} is not the object's namespace; slice ignored"
    )]
    ForeignPolicy { object: String, namespace: String },
}

/// Parses a slice's spec, checked first as the API server checks it
/// against the CRD's schema (`validate::policy_endpoint`); the error names
/// the object and every bad field.
pub fn parse_spec(ns: &str, name: &str, spec: &Value) -> Result<PolicyEndpointSpec, SliceError> {
    let object = display_name(ns, name);
    if spec.is_null() {
        return Err(SliceError::NoSpec { object });
    }
    let mut errs = super::validate::Errors::default();
    super::validate::policy_endpoint::spec(spec, &mut errs);
    if let Err(errors) = errs.into_result() {
        return Err(SliceError::Invalid { object, errors });
    }
    serde_path_to_error::deserialize::<_, PolicyEndpointSpec>(spec).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        SliceError::Decode {
            object,
            field,
            cause: e.into_inner(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_slice_as_the_aws_controller_writes_it_parses() {
        let spec = json!({
            "isGlobal": false,
            "priority": 1001,
            "podIsolation": ["Ingress", "Egress"],
            "podSelector": {"matchLabels": {"app": "web"}},
            "podSelectorEndpoints": [
                {"hostIP": "192.168.1.10", "podIP": "10.0.0.5", "name": "web-1", "namespace": "prod"}
            ],
            "policyRef": {"name": "allow-web", "namespace": "prod"},
            "ingress": [{"cidr": "10.0.0.7", "ports": [{"protocol": "TCP", "port": 80}]}],
            "egress": [{"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}],
        });
        let parsed = parse_spec("prod", "allow-web-abcde", &spec).unwrap();
        assert_eq!(parsed.policy_ref.name, "allow-web");
        assert_eq!(parsed.pod_selector_endpoints.unwrap()[0].name, "web-1");
        assert_eq!(
            parsed.ingress.unwrap()[0].ports.as_ref().unwrap()[0].port,
            Some(80)
        );
        assert_eq!(
            parsed.egress.unwrap()[0].except.as_deref(),
            Some(&["10.0.0.0/8".to_string()][..])
        );
    }

    #[test]
    fn a_malformed_spec_names_the_object_and_the_field() {
        let spec = json!({
            "policyRef": {"name": "p", "namespace": "ns"},
            "ingress": [{"cidr": "10.0.0.1", "ports": [{"port": "http"}]}],
        });
        let err = parse_spec("ns", "p-1", &spec).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "PolicyEndpoint ns/p-1: spec.ingress[0].ports[0].port: Invalid value: \"string\""
            ),
            "{err}"
        );
        // A typo is refused, not skipped (strict field validation).
        let typo = json!({"policyRef": {"name": "p", "namespace": "ns"}, "ingres": []});
        assert_eq!(
            parse_spec("ns", "p-4", &typo).unwrap_err().to_string(),
            "PolicyEndpoint ns/p-4: spec.ingres: unknown field"
        );
        let err = parse_spec("ns", "p-2", &json!({"ingress": []}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("policyRef"), "{err}");
        assert_eq!(
            parse_spec("ns", "p-3", &Value::Null)
                .unwrap_err()
                .to_string(),
            "PolicyEndpoint ns/p-3: spec is missing"
        );
    }
}
