//! AWS's ApplicationNetworkPolicies as the kube source watches them: the
//! spec is watched as JSON and read leniently here (see
//! [`super::cluster_network_policy`] for why), then lowered to the
//! NetworkPolicy it is ([`palisade_apis::application_network_policy`]).

use k8s_openapi::api::networking::v1::NetworkPolicy;
use palisade_apis::application_network_policy::{self as anp, ApplicationNetworkPolicy};

use super::cluster_network_policy::Unreadable;
use super::validate::{strict, Path};

watched_resource!(
    /// An ApplicationNetworkPolicy as watched: the spec stays JSON until
    /// [`read`].
    Object,
    kube::core::NamespaceResourceScope,
    kind: anp::KIND,
    group: "networking.k8s.aws",
    version: "v1alpha1",
    plural: "applicationnetworkpolicies"
);

/// How errors name one: `ApplicationNetworkPolicy.networking.k8s.aws
/// ns/name`, as the manifest source does.
pub fn display_name(ns: &str, name: &str) -> String {
    format!("{}.networking.k8s.aws {ns}/{name}", anp::KIND)
}

/// Reads one; a missing spec selects every pod of the namespace for
/// ingress isolation, as a NetworkPolicy's would.
pub fn read(o: Object) -> Result<NetworkPolicy, Unreadable> {
    let spec = if o.spec.is_null() {
        None
    } else {
        let spec =
            strict::decode_lenient(&o.spec, &Path::new("spec")).map_err(|error| Unreadable {
                object: display_name(
                    o.metadata.namespace.as_deref().unwrap_or_default(),
                    o.metadata.name.as_deref().unwrap_or_default(),
                ),
                error,
            })?;
        Some(spec)
    };
    Ok(anp::lower(&ApplicationNetworkPolicy {
        metadata: o.metadata,
        spec,
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn object(spec: serde_json::Value) -> Object {
        Object {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("x".into()),
                ..Default::default()
            },
            spec,
        }
    }

    #[test]
    fn a_newer_field_is_skipped_and_names_are_carried() {
        let np = read(object(json!({
            "podSelector": {}, "newField": 1,
            "egress": [{"to": [{"domainNames": ["a.example"], "newPeer": {}}]}],
        })))
        .unwrap();
        assert_eq!(
            np.metadata.name.as_deref(),
            Some("ApplicationNetworkPolicy:p")
        );
        assert_eq!(anp::domain_names(&np).len(), 1);
    }

    #[test]
    fn an_unreadable_policy_names_the_object_and_the_field() {
        let got = read(object(
            json!({"podSelector": {}, "egress": [{"to": [{"domainNames": "a"}]}]}),
        ))
        .unwrap_err()
        .to_string();
        assert!(
            got.starts_with("ApplicationNetworkPolicy.networking.k8s.aws x/p: spec.egress[0].to[0].domainNames: invalid type"),
            "{got}"
        );
    }
}
