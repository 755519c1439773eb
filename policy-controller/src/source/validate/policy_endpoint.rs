//! A PolicyEndpoint's spec checked against the CRD's structural schema, as
//! the API server checks a custom resource: each field's type (and int32
//! format), the required fields, and strict field validation (a field the
//! schema does not have is an error, at any depth).
//!
//! The schema is aws/amazon-network-policy-controller-k8s's
//! `config/crd/bases/networking.k8s.aws_policyendpoints.yaml`. Released
//! versions differ: v1.0 requires `cidr` in every entry; v1.1 adds
//! `domainName` (so `cidr` is optional); the admin-policy variant adds
//! `action`, `isGlobal` and `priority`. Every one of those fields is known
//! here and only what all of them require is required, so an object any of
//! those CRDs admits passes; what none of them knows is refused. The
//! schema sets no enums: the values of `podIsolation`, `protocol` and
//! `action` are judged when the slices are resolved.
//!
//! [`cluster_spec`] checks a ClusterPolicyEndpoint's spec against
//! `config/crd/bases/networking.k8s.aws_clusterpolicyendpoints.yaml` the same
//! way, with the enums that schema does set (`tier`, an entry's `action`)
//! and its one-field `subject`.

use palisade_dns::pattern::{is_domain_name as domain_name, DOMAIN_PATTERN};
use serde_json::Value;

use super::field::{Errors, Path, Problem};

pub fn spec(spec: &Value, errs: &mut Errors) {
    let path = Path::new("spec");
    let Some(m) = object(spec, &path, &SPEC, &["policyRef"], errs) else {
        return;
    };
    for (key, v) in m {
        let at = path.child(key.as_str());
        match key.as_str() {
            "policyRef" => {
                if let Some(r) =
                    object(v, &at, &["name", "namespace"], &["name", "namespace"], errs)
                {
                    for (k, v) in r {
                        string(v, &at.child(k.as_str()), errs);
                    }
                }
            }
            "podSelector" => selector(v, &at, errs),
            "podIsolation" => array(v, &at, errs, text),
            "podSelectorEndpoints" => array(v, &at, errs, |v, at, errs| {
                if let Some(e) = object(v, at, &POD_ENDPOINT, &POD_ENDPOINT, errs) {
                    for (k, v) in e {
                        string(v, &at.child(k.as_str()), errs);
                    }
                }
            }),
            "ingress" | "egress" => array(v, &at, errs, entry),
            "isGlobal" => boolean(v, &at, errs),
            "priority" => integer(v, &at, errs, None),
            _ => unreachable!("object() refused it"),
        }
    }
}

const SPEC: [&str; 8] = [
    "policyRef",
    "podSelector",
    "podIsolation",
    "podSelectorEndpoints",
    "ingress",
    "egress",
    "isGlobal",
    "priority",
];
const POD_ENDPOINT: [&str; 4] = ["hostIP", "name", "namespace", "podIP"];

fn entry(v: &Value, path: &Path, errs: &mut Errors) {
    let Some(m) = object(
        v,
        path,
        &["action", "cidr", "domainName", "except", "ports"],
        &[],
        errs,
    ) else {
        return;
    };
    for (key, v) in m {
        let at = path.child(key.as_str());
        match key.as_str() {
            "action" | "cidr" => text(v, &at, errs),
            "domainName" => {
                if let Some(s) = string(v, &at, errs) {
                    if !domain_name(s) {
                        errs.invalid(&at, s, format!("should match '{DOMAIN_PATTERN}'"));
                    }
                }
            }
            "except" => array(v, &at, errs, text),
            "ports" => array(v, &at, errs, port),
            _ => unreachable!("object() refused it"),
        }
    }
}

/// A ClusterPolicyEndpoint's spec (the CRD has one published version).
pub fn cluster_spec(spec: &Value, errs: &mut Errors) {
    let path = Path::new("spec");
    let required = ["policyRef", "priority", "subject", "tier"];
    let Some(m) = object(spec, &path, &CLUSTER_SPEC, &required, errs) else {
        return;
    };
    for (key, v) in m {
        let at = path.child(key.as_str());
        match key.as_str() {
            "policyRef" => {
                if let Some(r) = object(v, &at, &["name"], &["name"], errs) {
                    for (k, v) in r {
                        string(v, &at.child(k.as_str()), errs);
                    }
                }
            }
            "tier" => enumerated(v, &at, &TIERS, errs),
            "priority" => integer(v, &at, errs, Some("int32")),
            "subject" => cluster_subject(v, &at, errs),
            "podSelectorEndpoints" => array(v, &at, errs, |v, at, errs| {
                if let Some(e) = object(v, at, &POD_ENDPOINT, &POD_ENDPOINT, errs) {
                    for (k, v) in e {
                        string(v, &at.child(k.as_str()), errs);
                    }
                }
            }),
            "ingress" | "egress" => array(v, &at, errs, cluster_entry),
            _ => unreachable!("object() refused it"),
        }
    }
}

const CLUSTER_SPEC: [&str; 7] = [
    "policyRef",
    "tier",
    "priority",
    "subject",
    "podSelectorEndpoints",
    "ingress",
    "egress",
];
const TIERS: [&str; 2] = ["Admin", "Baseline"];
const ACTIONS: [&str; 3] = ["Accept", "Deny", "Pass"];

/// `subject`: exactly one of `namespaces` and `pods` (minProperties and
/// maxProperties 1), `pods` with both its selectors.
fn cluster_subject(v: &Value, path: &Path, errs: &mut Errors) {
    let Some(m) = object(v, path, &["namespaces", "pods"], &[], errs) else {
        return;
    };
    let n = m.len();
    if n != 1 {
        let bound = if n < 1 { "at least" } else { "at most" };
        errs.invalid(
            path,
            n,
            format!("{path} in body should have {bound} 1 properties"),
        );
    }
    for (key, v) in m {
        let at = path.child(key.as_str());
        if key == "namespaces" {
            selector(v, &at, errs);
            continue;
        }
        let both = ["namespaceSelector", "podSelector"];
        if let Some(p) = object(v, &at, &both, &both, errs) {
            for (k, v) in p {
                selector(v, &at.child(k.as_str()), errs);
            }
        }
    }
}

fn cluster_entry(v: &Value, path: &Path, errs: &mut Errors) {
    let known = ["action", "cidr", "domainName", "ports"];
    let Some(m) = object(v, path, &known, &["action"], errs) else {
        return;
    };
    for (key, v) in m {
        let at = path.child(key.as_str());
        match key.as_str() {
            "action" => enumerated(v, &at, &ACTIONS, errs),
            "cidr" => text(v, &at, errs),
            "domainName" => {
                if let Some(s) = string(v, &at, errs) {
                    if !domain_name(s) {
                        errs.invalid(&at, s, format!("should match '{DOMAIN_PATTERN}'"));
                    }
                }
            }
            "ports" => array(v, &at, errs, port),
            _ => unreachable!("object() refused it"),
        }
    }
}

fn port(v: &Value, path: &Path, errs: &mut Errors) {
    if let Some(p) = object(v, path, &["protocol", "port", "endPort"], &[], errs) {
        for (k, v) in p {
            match k.as_str() {
                "protocol" => text(v, &path.child(k.as_str()), errs),
                _ => integer(v, &path.child(k.as_str()), errs, Some("int32")),
            }
        }
    }
}

/// A string of the schema's enum.
fn enumerated(v: &Value, path: &Path, values: &'static [&'static str], errs: &mut Errors) {
    if let Some(s) = string(v, path, errs) {
        if !values.contains(&s) {
            errs.not_supported(path, s, values);
        }
    }
}

fn selector(v: &Value, path: &Path, errs: &mut Errors) {
    let Some(m) = object(v, path, &["matchLabels", "matchExpressions"], &[], errs) else {
        return;
    };
    for (key, v) in m {
        let at = path.child(key.as_str());
        if key == "matchLabels" {
            match v {
                Value::Object(labels) => {
                    for (k, v) in labels {
                        string(v, &at.child(k.as_str()), errs);
                    }
                }
                other => type_error(other, &at, "object", errs),
            }
        } else {
            array(v, &at, errs, |v, at, errs| {
                let required = ["key", "operator"];
                if let Some(r) = object(v, at, &["key", "operator", "values"], &required, errs) {
                    for (k, v) in r {
                        match k.as_str() {
                            "values" => array(v, &at.child(k.as_str()), errs, text),
                            _ => text(v, &at.child(k.as_str()), errs),
                        }
                    }
                }
            });
        }
    }
}

/// The known fields when `v` is an object; unknown and missing fields
/// reported.
fn object<'a>(
    v: &'a Value,
    path: &Path,
    known: &[&str],
    required: &[&str],
    errs: &mut Errors,
) -> Option<Vec<(&'a String, &'a Value)>> {
    let Value::Object(m) = v else {
        type_error(v, path, "object", errs);
        return None;
    };
    for r in required {
        if !m.contains_key(*r) {
            errs.required(&path.child(r), "");
        }
    }
    let mut ok = Vec::new();
    for (k, v) in m {
        if known.contains(&k.as_str()) {
            ok.push((k, v));
        } else {
            errs.push(&path.child(k), Problem::UnknownField);
        }
    }
    Some(ok)
}

fn array(v: &Value, path: &Path, errs: &mut Errors, item: impl Fn(&Value, &Path, &mut Errors)) {
    match v {
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                item(v, &path.index(i), errs);
            }
        }
        other => type_error(other, path, "array", errs),
    }
}

fn text(v: &Value, path: &Path, errs: &mut Errors) {
    string(v, path, errs);
}

fn string<'a>(v: &'a Value, path: &Path, errs: &mut Errors) -> Option<&'a str> {
    match v {
        Value::String(s) => Some(s),
        other => {
            type_error(other, path, "string", errs);
            None
        }
    }
}

fn boolean(v: &Value, path: &Path, errs: &mut Errors) {
    if !v.is_boolean() {
        type_error(v, path, "boolean", errs);
    }
}

fn integer(v: &Value, path: &Path, errs: &mut Errors, format: Option<&str>) {
    match v {
        Value::Number(n) if n.is_i64() || n.is_u64() => {
            let fits = n.as_i64().is_some_and(|n| i32::try_from(n).is_ok());
            if format == Some("int32") && !fits {
                errs.invalid(
                    path,
                    n.to_string().as_str(),
                    format!("{path} in body must be of type int32: \"{n}\""),
                );
            }
        }
        other => type_error(other, path, "integer", errs),
    }
}

fn type_error(v: &Value, path: &Path, want: &str, errs: &mut Errors) {
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    errs.invalid(
        path,
        got,
        format!("{path} in body must be of type {want}: {got:?}"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Vec<String> {
        let mut errs = Errors::default();
        spec(&v, &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn slices_every_published_crd_admits_pass() {
        for v in [
            // As v1.1 writes it (no isGlobal, no action).
            json!({"policyRef": {"name": "p", "namespace": "ns"},
                   "podIsolation": ["Ingress", "Egress"],
                   "podSelector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]},
                   "podSelectorEndpoints": [{"hostIP": "192.168.1.10", "podIP": "10.0.0.5", "name": "web-1", "namespace": "ns"}],
                   "ingress": [{"cidr": "10.0.0.7", "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}]}],
                   "egress": [{"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}, {"domainName": "*.example.com", "ports": [{"port": 443}]}]}),
            // The admin-policy variant.
            json!({"policyRef": {"name": "p", "namespace": "ns"}, "isGlobal": false, "priority": 1001,
                   "ingress": [{"action": "Allow", "cidr": "10.0.0.7"}]}),
            json!({"policyRef": {"name": "p", "namespace": ""}}),
        ] {
            assert_eq!(check(v.clone()), Vec::<String>::new(), "{v}");
        }
    }

    #[test]
    fn refused_as_the_api_server_refuses_them() {
        let r = json!({"name": "p", "namespace": "ns"});
        let cases = [
            (json!({}), "spec.policyRef: Required value"),
            (json!({"policyRef": {"name": "p"}}), "spec.policyRef.namespace: Required value"),
            (json!({"policyRef": {"name": 1, "namespace": "ns"}}),
             "spec.policyRef.name: Invalid value: \"integer\": spec.policyRef.name in body must be of type string: \"integer\""),
            (json!({"policyRef": r, "ingres": []}), "spec.ingres: unknown field"),
            (json!({"policyRef": r, "ingress": [{"cidr": "10.0.0.1", "prots": []}]}), "spec.ingress[0].prots: unknown field"),
            (json!({"policyRef": r, "ingress": [{"cidr": "10.0.0.1", "ports": [{"port": 80, "portt": 1}]}]}), "spec.ingress[0].ports[0].portt: unknown field"),
            (json!({"policyRef": r, "ingress": [{"cidr": "10.0.0.1", "ports": [{"port": "http"}]}]}),
             "spec.ingress[0].ports[0].port: Invalid value: \"string\": spec.ingress[0].ports[0].port in body must be of type integer"),
            (json!({"policyRef": r, "ingress": [{"cidr": "10.0.0.1", "ports": [{"port": 4294967296i64}]}]}),
             "spec.ingress[0].ports[0].port: Invalid value: \"4294967296\": spec.ingress[0].ports[0].port in body must be of type int32"),
            (json!({"policyRef": r, "ingress": [{"cidr": "10.0.0.1", "ports": [{"port": 80.5}]}]}),
             "spec.ingress[0].ports[0].port: Invalid value: \"number\""),
            (json!({"policyRef": r, "ingress": {"cidr": "10.0.0.1"}}), "spec.ingress: Invalid value: \"object\": spec.ingress in body must be of type array"),
            (json!({"policyRef": r, "egress": [{"cidr": null}]}), "spec.egress[0].cidr: Invalid value: \"null\""),
            (json!({"policyRef": r, "egress": [{"domainName": "-bad-.com"}]}), "spec.egress[0].domainName: Invalid value: \"-bad-.com\": should match"),
            (json!({"policyRef": r, "podSelectorEndpoints": [{"name": "a", "namespace": "ns", "podIP": "10.0.0.1"}]}),
             "spec.podSelectorEndpoints[0].hostIP: Required value"),
            (json!({"policyRef": r, "podSelectorEndpoints": [{"name": "a", "namespace": "ns", "podIP": "1", "hostIP": "2", "nodeName": "n"}]}),
             "spec.podSelectorEndpoints[0].nodeName: unknown field"),
            (json!({"policyRef": r, "podSelector": {"matchExpressions": [{"key": "a"}]}}), "spec.podSelector.matchExpressions[0].operator: Required value"),
            (json!({"policyRef": r, "podSelector": {"matchLabels": {"a": 1}}}), "spec.podSelector.matchLabels.a: Invalid value: \"integer\""),
            (json!({"policyRef": r, "podSelector": {"matchLabel": {}}}), "spec.podSelector.matchLabel: unknown field"),
            (json!({"policyRef": r, "isGlobal": "yes"}), "spec.isGlobal: Invalid value: \"string\""),
            (json!({"policyRef": r, "podIsolation": "Ingress"}), "spec.podIsolation: Invalid value: \"string\""),
            (json!("spec"), "spec: Invalid value: \"string\": spec in body must be of type object"),
        ];
        for (v, want) in cases {
            let got = check(v.clone());
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{v}: {got:#?}\n  want {want}"
            );
        }
    }

    fn check_cluster(v: Value) -> Vec<String> {
        let mut errs = Errors::default();
        cluster_spec(&v, &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn cluster_slices_as_the_aws_controller_writes_them_pass() {
        let v = json!({
            "policyRef": {"name": "p"}, "tier": "Admin", "priority": 10,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
            "podSelectorEndpoints": [{"hostIP": "192.168.1.10", "podIP": "10.0.0.5", "name": "db-1", "namespace": "ns"}],
            "ingress": [{"action": "Deny", "cidr": "10.0.0.7", "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}]}],
            "egress": [{"action": "Pass", "domainName": "*.example.com"}, {"action": "Accept", "cidr": "10.0.0.0/8"}],
        });
        assert_eq!(check_cluster(v), Vec::<String>::new());
        let v = json!({"policyRef": {"name": "p"}, "tier": "Baseline", "priority": 0,
                       "subject": {"namespaces": {}}});
        assert_eq!(check_cluster(v), Vec::<String>::new());
    }

    #[test]
    fn cluster_slices_are_refused_as_the_api_server_refuses_them() {
        let ok = |extra: Value| {
            let mut v = json!({"policyRef": {"name": "p"}, "tier": "Admin", "priority": 1,
                               "subject": {"namespaces": {}}});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            v
        };
        let cases = [
            (json!({}), "spec.policyRef: Required value"),
            (json!({}), "spec.subject: Required value"),
            (json!({}), "spec.tier: Required value"),
            (json!({}), "spec.priority: Required value"),
            (ok(json!({"tier": "Developer"})),
             "spec.tier: Unsupported value: \"Developer\": supported values: \"Admin\", \"Baseline\""),
            (ok(json!({"priority": 4294967296i64})), "spec.priority: Invalid value: \"4294967296\""),
            (ok(json!({"subject": {}})),
             "spec.subject: Invalid value: 0: spec.subject in body should have at least 1 properties"),
            (ok(json!({"subject": {"namespaces": {}, "pods": {"namespaceSelector": {}, "podSelector": {}}}})),
             "spec.subject: Invalid value: 2: spec.subject in body should have at most 1 properties"),
            (ok(json!({"subject": {"pods": {"podSelector": {}}}})),
             "spec.subject.pods.namespaceSelector: Required value"),
            (ok(json!({"policyRef": {"name": "p", "namespace": "x"}})), "spec.policyRef.namespace: unknown field"),
            (ok(json!({"ingress": [{"cidr": "10.0.0.1"}]})), "spec.ingress[0].action: Required value"),
            (ok(json!({"ingress": [{"action": "Allow", "cidr": "10.0.0.1"}]})),
             "spec.ingress[0].action: Unsupported value: \"Allow\""),
            (ok(json!({"ingress": [{"action": "Deny", "cidr": "10.0.0.1", "except": []}]})),
             "spec.ingress[0].except: unknown field"),
            (ok(json!({"egress": [{"action": "Deny", "cidr": "10.0.0.1", "ports": [{"port": "http"}]}]})),
             "spec.egress[0].ports[0].port: Invalid value: \"string\""),
            (ok(json!({"podIsolation": ["Ingress"]})), "spec.podIsolation: unknown field"),
        ];
        for (v, want) in cases {
            let got = check_cluster(v.clone());
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{v}: {got:#?}\n  want {want}"
            );
        }
    }
}
