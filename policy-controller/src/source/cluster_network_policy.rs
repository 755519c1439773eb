//! ClusterNetworkPolicies as the kube source watches them, one type per
//! API group (`policy.networking.k8s.io/v1alpha2` and AWS's
//! `networking.k8s.aws/v1alpha1`).
//!
//! As with PolicyEndpoints, the spec is watched as JSON and read here: a
//! watch that decoded into our types would fail as a whole on one object it
//! could not read, and stall every policy of the group (and the
//! controller's sync) on it. The read is lenient (a field newer than our
//! types is skipped, and the typed reading fails closed on what it cannot
//! interpret), so only an object whose known fields have another shape
//! than ours is unreadable: that is an error naming the object and the
//! field, and the version in force stays.

use palisade_apis::{wire, ApiGroup, ClusterNetworkPolicy};

use super::validate::strict;
use super::validate::{FieldError, Path, Problem};

watched_resource!(
    /// An upstream ClusterNetworkPolicy as watched: the spec stays JSON
    /// until [`read_upstream`].
    UpstreamObject,
    kube::core::ClusterResourceScope,
    kind: wire::CLUSTER_NETWORK_POLICY,
    group: "policy.networking.k8s.io",
    version: "v1alpha2",
    plural: "clusternetworkpolicies"
);
watched_resource!(
    /// An AWS ClusterNetworkPolicy as watched (see [`UpstreamObject`]).
    AwsObject,
    kube::core::ClusterResourceScope,
    kind: wire::CLUSTER_NETWORK_POLICY,
    group: "networking.k8s.aws",
    version: "v1alpha1",
    plural: "clusternetworkpolicies"
);

/// How errors name a policy: `ClusterNetworkPolicy/NAME`, or
/// `ClusterNetworkPolicy.networking.k8s.aws/NAME` (as kubectl names them).
pub fn display_name(group: ApiGroup, name: &str) -> String {
    match group {
        ApiGroup::Upstream => format!("{}/{name}", wire::CLUSTER_NETWORK_POLICY),
        ApiGroup::Aws => format!("{}.{}/{name}", wire::CLUSTER_NETWORK_POLICY, group.group()),
    }
}

/// A policy the API server served that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {error}")]
pub struct Unreadable {
    /// As [`display_name`] gives it.
    pub object: String,
    pub error: FieldError,
}

/// Reads an upstream policy; its spec is required.
pub fn read_upstream(o: UpstreamObject) -> Result<ClusterNetworkPolicy, Unreadable> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let fail = |error| Unreadable {
        object: display_name(ApiGroup::Upstream, &name),
        error,
    };
    if o.spec.is_null() {
        return Err(fail(FieldError {
            path: Path::new("spec"),
            problem: Problem::Required(String::new()),
        }));
    }
    let spec = strict::decode_lenient(&o.spec, &Path::new("spec")).map_err(fail)?;
    Ok(ClusterNetworkPolicy::from_upstream(
        &wire::UpstreamClusterNetworkPolicy {
            metadata: o.metadata,
            spec,
            ..Default::default()
        },
    ))
}

/// Reads an AWS policy; its spec is optional (then the policy selects
/// nothing).
pub fn read_aws(o: AwsObject) -> Result<ClusterNetworkPolicy, Unreadable> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let spec = if o.spec.is_null() {
        wire::AwsSpec::default()
    } else {
        strict::decode_lenient(&o.spec, &Path::new("spec")).map_err(|error| Unreadable {
            object: display_name(ApiGroup::Aws, &name),
            error,
        })?
    };
    Ok(ClusterNetworkPolicy::from_aws(
        &wire::AwsClusterNetworkPolicy {
            metadata: o.metadata,
            spec,
            ..Default::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use palisade_apis::{Action, Peer, Tier};
    use serde_json::{json, Value};

    fn upstream(spec: Value) -> Result<ClusterNetworkPolicy, String> {
        read_upstream(UpstreamObject {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            spec,
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_newer_field_is_skipped_and_read_fails_closed() {
        let p = upstream(json!({
            "tier": "Admin", "priority": 3, "subject": {"namespaces": {}}, "newField": 1,
            "ingress": [{"action": "Deny", "from": [{"serviceAccounts": {"name": "x"}}]}],
        }))
        .unwrap();
        assert_eq!((p.tier, p.priority), (Tier::Admin, 3));
        assert_eq!(p.ingress[0].action, Action::Deny);
        assert_eq!(p.ingress[0].peers, [Peer::Unknown], "a peer of a newer CRD");
    }

    #[test]
    fn an_unreadable_policy_names_the_object_and_the_field() {
        let got = upstream(json!({"tier": 1, "priority": 3, "subject": {}})).unwrap_err();
        assert!(
            got.starts_with("ClusterNetworkPolicy/p: spec.tier: invalid type: integer `1`"),
            "{got}"
        );
        assert_eq!(
            upstream(Value::Null).unwrap_err(),
            "ClusterNetworkPolicy/p: spec: Required value"
        );
        let got = read_aws(AwsObject {
            metadata: ObjectMeta {
                name: Some("q".into()),
                ..Default::default()
            },
            spec: json!({"tier": "Admin", "priority": 1, "subject": {}, "egress": [{"action": "Deny"}]}),
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            got,
            "ClusterNetworkPolicy.networking.k8s.aws/q: spec.egress[0].to: Required value"
        );
    }

    #[test]
    fn an_aws_policy_without_spec_selects_nothing() {
        let p = read_aws(AwsObject::default()).unwrap();
        assert_eq!(p.subject, palisade_apis::Subject::Unknown);
    }
}
