//! Checks for the Helm chart (helm/palisade) as the real Helm library
//! renders it (helm/check/render.py): each rendered object must parse as the
//! Kubernetes type its `kind` names, with no field the type does not know.
//!
//! k8s-openapi's types skip unknown fields when they deserialize, so a typo
//! (`contaners:`) would parse "fine" and vanish from what the API server
//! receives. The check therefore parses each object, serializes it back, and
//! reports every field of the original that the round trip lost.

pub mod pod_security;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Parses `object` as the type its apiVersion and kind name, and returns
/// the problems found: an unknown kind, a value of the wrong shape, or the
/// paths of fields the type does not have.
pub fn check_object(object: &Value) -> Vec<String> {
    let api_version = object["apiVersion"].as_str().unwrap_or("");
    let kind = object["kind"].as_str().unwrap_or("");
    let name = object["metadata"]["name"].as_str().unwrap_or("?");
    let what = format!("{kind} {name}");
    let problems = match (api_version, kind) {
        ("apps/v1", "Deployment") => round_trip::<Deployment>(object),
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(object),
        ("v1", "Service") => round_trip::<Service>(object),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(object),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(object),
        ("v1", "Secret") => round_trip::<Secret>(object),
        ("v1", "Namespace") => round_trip::<Namespace>(object),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(object)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(object),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(object),
        _ => vec![format!(
            "{api_version:?} {kind:?} is not a kind this check knows; add it"
        )],
    };
    problems
        .into_iter()
        .map(|p| format!("{what}: {p}"))
        .collect()
}

fn round_trip<T: DeserializeOwned + Serialize>(object: &Value) -> Vec<String> {
    let typed: T = match serde_json::from_value(object.clone()) {
        Ok(t) => t,
        Err(e) => return vec![format!("does not parse: {e}")],
    };
    let back = serde_json::to_value(&typed).expect("a typed object serializes");
    let mut lost = Vec::new();
    missing_paths(object, &back, String::new(), &mut lost);
    lost.into_iter()
        .map(|p| format!("unknown field {p}"))
        .collect()
}

/// Every path present in `original` and absent from `back`.
fn missing_paths(original: &Value, back: &Value, path: String, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(o), Value::Object(b)) => {
            for (key, value) in o {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(bv) => missing_paths(value, bv, here, out),
                    // An explicit null is "unset", which the type drops too.
                    None if value.is_null() => {}
                    None => out.push(here),
                }
            }
        }
        (Value::Array(o), Value::Array(b)) => {
            for (i, value) in o.iter().enumerate() {
                match b.get(i) {
                    Some(bv) => missing_paths(value, bv, format!("{path}[{i}]"), out),
                    None => out.push(format!("{path}[{i}]")),
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_typo_in_a_field_name_is_reported_with_its_path() {
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "c"},
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"spec": {"contaners": [{"name": "x"}], "containers": []}}
            }
        });
        let problems = check_object(&deployment);
        assert_eq!(
            problems,
            ["Deployment c: unknown field .spec.template.spec.contaners"]
        );
    }

    #[test]
    fn a_valid_object_has_no_problems_and_an_unknown_kind_is_named() {
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "s"}});
        assert!(check_object(&sa).is_empty());
        let odd = json!({"apiVersion": "v9", "kind": "Gizmo", "metadata": {"name": "g"}});
        assert!(check_object(&odd)[0].contains("\"Gizmo\""));
        let wrong_shape = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                                 "spec": {"ports": "80"}});
        assert!(check_object(&wrong_shape)[0].contains("does not parse"));
    }
}
