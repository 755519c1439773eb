//! Where the controller's view of the cluster comes from.
//!
//! [`kube`] watches a real API server and sends changes to single objects
//! ([`Update`](crate::feed::Update)s, marked synced once every kind has been
//! listed); [`manifest`] watches a directory of manifests (the lab's
//! cluster) and publishes whole views ([`ClusterState`](crate::cluster::ClusterState))
//! through a `tokio::sync::watch` channel holding `Option<ClusterState>`,
//! `None` until it has a complete first view. Either way nothing downstream
//! ever resolves a half-listed cluster.
//!
//! This module also holds the manifest parser both the manifest source and the
//! tests use. Every document is untrusted: one the API server would refuse is
//! an error naming the document, the object and the field, never a panic and
//! never a silently dropped object or field (a dropped NetworkPolicy, or a
//! rule that lost a misspelt field, would open traffic).

/// A custom resource as the sources watch it: metadata, and a spec kept as
/// JSON until the source's own typed reading (which names every field it
/// refuses). One definition for every such kind, so none drifts.
macro_rules! watched_resource {
    ($(#[$doc:meta])* $ty:ident, $scope:ty, kind: $kind:expr, group: $group:expr,
     version: $version:expr, plural: $plural:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
        pub struct $ty {
            #[serde(default)]
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
            pub spec: serde_json::Value,
        }

        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod application_network_policy;
pub mod cluster_network_policy;
pub mod cluster_policy_endpoint;
mod error;
pub mod kube;
pub mod manifest;
pub mod policy_endpoint;
mod tracker;
pub mod validate;

use serde_json::Value;

use crate::cluster::Object;
pub use error::{DocumentError, ObjectError, SourceError, SourceProblem};

/// Parses manifests: YAML (several documents separated by `---`) or JSON (one
/// or more concatenated values, or a top-level array). `List` objects (and
/// typed lists such as `PodList`, as `kubectl get -o json` prints them) are
/// flattened. v1 Namespace, v1 Pod, v1 Service, v1 Node,
/// discovery.k8s.io/v1 EndpointSlice, networking.k8s.io/v1 NetworkPolicy
/// and ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2 and
/// networking.k8s.aws/v1alpha1) objects are decoded and validated as the
/// API server would ([`validate`]); other kinds the API serves are skipped, and a kind it does not serve in the groups Palisade
/// reads is an error (a misspelt NetworkPolicy must not vanish). A
/// namespaced object without a namespace lands in "default", as `kubectl
/// apply` would put it.
pub fn parse_objects(text: &str) -> Result<Vec<Object>, SourceError> {
    let mut objects = Vec::new();
    let trimmed = text.trim_start();
    // JSON is nearly YAML, but serde_json reports JSON mistakes far better
    // and handles concatenated values, so JSON-looking text goes there.
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        for (i, value) in validate::strict::json_values(text).enumerate() {
            let document = i + 1;
            let value = value.map_err(|e| SourceError::Document {
                document,
                problem: Box::new(DocumentError::Json(e)),
            })?;
            decode_document(value, document, &mut objects)?;
        }
    } else {
        for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let document = i + 1;
            let value = validate::strict::yaml_value(doc).map_err(|e| SourceError::Document {
                document,
                problem: Box::new(DocumentError::Yaml(e)),
            })?;
            decode_document(value, document, &mut objects)?;
        }
    }
    Ok(objects)
}

fn decode_document(
    value: Value,
    document: usize,
    out: &mut Vec<Object>,
) -> Result<(), SourceError> {
    let err = |problem: ObjectError| SourceError::Document {
        document,
        problem: Box::new(problem.into()),
    };
    match value {
        // `---` at the start or end of a file, or an empty document.
        Value::Null => Ok(()),
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                decode_object(item, &format!("[{i}]: "), None, out).map_err(err)?;
            }
            Ok(())
        }
        value => decode_object(value, "", None, out).map_err(err),
    }
}

/// `inherited` is the (apiVersion, kind) of the items of a typed list, whose
/// items may omit their own.
fn decode_object(
    value: Value,
    at: &str,
    inherited: Option<(&str, &str)>,
    out: &mut Vec<Object>,
) -> Result<(), ObjectError> {
    let at_ = || at.to_string();
    let mut map = match value {
        Value::Object(map) => map,
        other => {
            return Err(ObjectError::NotAnObject {
                at: at_(),
                found: json_type(&other),
            })
        }
    };
    let field = |name: &str| -> Result<Option<String>, ObjectError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ObjectError::NotAString {
                at: at_(),
                field: name.to_string(),
                found: json_type(other),
            }),
        }
    };
    let (api_version, kind) = match (field("apiVersion")?, field("kind")?, inherited) {
        (Some(a), Some(k), _) => (a, k),
        (None, None, Some((a, k))) => (a.to_string(), k.to_string()),
        (None, _, _) => return Err(ObjectError::NoApiVersion { at: at_() }),
        (_, None, _) => return Err(ObjectError::NoKind { at: at_() }),
    };

    if let Some(item_kind) = kind.strip_suffix("List") {
        if let Some(items) = map.remove("items") {
            let Value::Array(items) = items else {
                return Err(ObjectError::ItemsNotASequence {
                    at: at_(),
                    found: json_type(&items),
                });
            };
            // A generic `List` carries fully typed items; `PodList` and the
            // like may carry bare ones whose type the list implies.
            let implied = (!item_kind.is_empty()).then_some((api_version.as_str(), item_kind));
            for (i, item) in items.into_iter().enumerate() {
                decode_object(item, &format!("{at}items[{i}]: "), implied, out)?;
            }
            return Ok(());
        }
    }

    let display = {
        // Two groups serve a ClusterNetworkPolicy: name the AWS one as
        // kubectl does, so that two of one name can be told apart.
        let kind = match api_version.split_once('/') {
            Some((group @ "networking.k8s.aws", _)) => format!("{kind}.{group}"),
            _ => kind.clone(),
        };
        let meta = map.get("metadata");
        let get = |k: &str| {
            meta.and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        match (get("namespace"), get("name")) {
            ("", name) => format!("{kind} {}", or_unnamed(name)),
            (ns, name) => format!("{kind} {ns}/{}", or_unnamed(name)),
        }
    };
    let value = Value::Object(map);

    let kind = match validate::kind_of(&api_version, &kind) {
        Ok(Some(kind)) => kind,
        Ok(None) => {
            tracing::debug!(%api_version, %kind, "skipping object of a kind policy does not read");
            return Ok(());
        }
        Err(cause) => {
            return Err(ObjectError::Kind {
                at: at_(),
                object: display,
                cause,
            })
        }
    };
    // Typed objects from a typed list may lack apiVersion/kind; k8s-openapi
    // checks them only when present, so the value can be used as it is.
    let object = validate::object(kind, value).map_err(|errors| ObjectError::Invalid {
        at: at_(),
        object: display,
        errors,
    })?;
    out.push(object);
    Ok(())
}

fn or_unnamed(name: &str) -> &str {
    if name.is_empty() {
        "<unnamed>"
    } else {
        name
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a map",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(objects: &[Object]) -> Vec<String> {
        objects
            .iter()
            .map(|o| match o {
                Object::Namespace(n) => format!("ns {}", n.metadata.name.as_deref().unwrap()),
                Object::Pod(p) => format!(
                    "pod {}/{}",
                    p.metadata.namespace.as_deref().unwrap(),
                    p.metadata.name.as_deref().unwrap()
                ),
                Object::NetworkPolicy(p) => format!(
                    "np {}/{}",
                    p.metadata.namespace.as_deref().unwrap(),
                    p.metadata.name.as_deref().unwrap()
                ),
                Object::Service(s) => format!(
                    "svc {}/{}",
                    s.metadata.namespace.as_deref().unwrap(),
                    s.metadata.name.as_deref().unwrap()
                ),
                Object::EndpointSlice(s) => format!(
                    "eps {}/{}",
                    s.metadata.namespace.as_deref().unwrap(),
                    s.metadata.name.as_deref().unwrap()
                ),
                Object::ClusterNetworkPolicy(p) => p.id(),
                Object::Node(n) => format!("node {}", n.metadata.name.as_deref().unwrap()),
            })
            .collect()
    }

    #[test]
    fn multi_document_yaml_skips_unknown_kinds_and_defaults_namespace() {
        let text = r#"
---
apiVersion: v1
kind: Namespace
metadata:
  name: web
  labels: {team: a}
---
apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  nodeName: n1
  containers: [{name: c, image: i, ports: [{containerPort: 80, name: http}]}]
status: {podIP: 10.0.0.1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: web}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c, namespace: web}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: web}
spec:
  selector: {app: db}
  clusterIP: 10.96.0.10
  ports: [{port: 5432, targetPort: pg}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-1, labels: {kubernetes.io/service-name: ext}}
addressType: IPv4
endpoints: [{addresses: [10.0.9.9]}]
ports: [{port: 443}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: web}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
"#;
        let objects = parse_objects(text).unwrap();
        assert_eq!(
            names(&objects),
            [
                "ns web",
                "pod default/p1",
                "svc web/s",
                "eps default/ext-1",
                "np web/deny"
            ]
        );
    }

    #[test]
    fn list_and_typed_list_are_flattened() {
        let yaml = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: a}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: skip, namespace: a}
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: a}
  spec: {containers: [{name: c, image: i}]}
"#;
        assert_eq!(names(&parse_objects(yaml).unwrap()), ["ns a", "pod a/p"]);
        // As the API serves it: items without apiVersion/kind.
        let json = r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"7"},
            "items":[{"metadata":{"name":"x","namespace":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}},
                     {"metadata":{"name":"y","namespace":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}}]}"#;
        assert_eq!(names(&parse_objects(json).unwrap()), ["pod b/x", "pod b/y"]);
    }

    #[test]
    fn json_single_concatenated_and_array() {
        let one = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}"#;
        assert_eq!(names(&parse_objects(one).unwrap()), ["ns a"]);
        let two = format!("{one}\n{}", one.replace("\"a\"", "\"b\""));
        assert_eq!(names(&parse_objects(&two).unwrap()), ["ns a", "ns b"]);
        let array = format!("[{one}]");
        assert_eq!(names(&parse_objects(&array).unwrap()), ["ns a"]);
    }

    #[test]
    fn malformed_document_error_names_document_object_and_field() {
        let text = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Namespace
metadata: {name: y}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports:
    - port: [80]
"#;
        let err = parse_objects(text).unwrap_err().to_string();
        assert!(
            err.starts_with("document 3: NetworkPolicy x/deny: spec.ingress[0].ports[0].port: "),
            "{err}"
        );
    }

    #[test]
    fn every_kind_of_garbage_is_an_error_not_a_panic() {
        let cases = [
            ("a: [unclosed", "document 1: invalid YAML"),
            ("{\"kind\": ", "document 1: invalid JSON"),
            ("- 1\n- 2\n", "document 1: [0]: expected an object, found a number"),
            ("42\n", "document 1: expected an object, found a number"),
            ("kind: Pod\nmetadata: {name: x}\n", "document 1: apiVersion is missing"),
            ("apiVersion: v1\nmetadata: {name: x}\n", "document 1: kind is missing"),
            ("apiVersion: v1\nkind: 3\n", "document 1: kind: expected a string"),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: c, image: i}]}\n",
                "document 1: Pod <unnamed>: metadata.name: Required value: name or generateName is required",
            ),
            ("apiVersion: v1\nkind: List\nitems: 3\n", "document 1: items: expected a sequence"),
            (
                "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Pod, metadata: {name: p}, spec: 5}]\n",
                "document 1: items[0]: Pod p: spec: invalid type",
            ),
            (
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {a: [1]}}\n",
                "document 2: Pod p: metadata.labels.a: invalid type",
            ),
            (
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: p}\n---\n[",
                "document 2: invalid YAML",
            ),
        ];
        for (text, want) in cases {
            let got = parse_objects(text).unwrap_err().to_string();
            assert!(
                got.starts_with(want),
                "{text:?}: got {got:?}, want {want:?}"
            );
        }
    }

    /// Issue 18: the misspelt key was dropped, the rule became `{}`, and
    /// `{}` allows every source on every port.
    #[test]
    fn a_typo_in_a_rule_is_refused_not_read_as_allow_everything() {
        let yaml = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-a, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: 80}]
  - fromm: [{podSelector: {}}]
"#;
        assert_eq!(
            parse_objects(yaml).unwrap_err().to_string(),
            "document 1: NetworkPolicy x/allow-a: spec.ingress[1].fromm: unknown field"
        );
        let json = serde_json::to_string(&serde_yaml::from_str::<Value>(yaml).unwrap()).unwrap();
        assert_eq!(
            parse_objects(&json).unwrap_err().to_string(),
            "document 1: NetworkPolicy x/allow-a: spec.ingress[1].fromm: unknown field"
        );
    }

    #[test]
    fn what_the_api_server_refuses_is_refused_naming_object_and_field() {
        let np = |spec: &str| {
            format!("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p, namespace: x}}\n{spec}")
        };
        let cases = [
            (np("spec: {podSelector: {}}\nstatus: {}\n"), "document 1: NetworkPolicy x/p: status: unknown field"),
            (
                np("spec: {podSelector: {}, policyTypes: [Ingress, Sideways]}\n"),
                "document 1: NetworkPolicy x/p: spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"",
            ),
            (
                np("spec: {ingress: [{fromm: []}], policyTypes: [Sideways]}\n"),
                // Decoding fails first, as the API server's does.
                "document 1: NetworkPolicy x/p: spec.ingress[0].fromm: unknown field",
            ),
            (
                np("spec:\n  podSelector: {}\n  podSelector: {matchLabels: {a: b}}\n"),
                "document 1: invalid YAML",
            ),
            (
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolcy\nmetadata: {name: p, namespace: x}\n".to_string(),
                "document 1: NetworkPolcy x/p: kind \"NetworkPolcy\" is not served by networking.k8s.io/v1",
            ),
            (
                r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "name": "b"}}"#.to_string(),
                "document 1: invalid JSON: duplicate field \"name\"",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: x}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: 80, name: HTTP}]}]}\n".to_string(),
                "document 1: Pod x/p: spec.containers[0].ports[0].name: Invalid value: \"HTTP\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            ),
        ];
        for (text, want) in cases {
            let got = parse_objects(&text).unwrap_err().to_string();
            assert!(got.starts_with(want), "{text}\n  got  {got}\n  want {want}");
        }
        // Every error of the object, not only the first.
        let got = parse_objects(&np(
            "spec: {policyTypes: [Sideways], ingress: [{from: [{}]}]}\n",
        ))
        .unwrap_err()
        .to_string();
        assert_eq!(
            got,
            "document 1: NetworkPolicy x/p: spec.ingress[0].from[0]: Required value: must specify a peer; \
             spec.policyTypes[0]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\""
        );
    }

    /// The API server accepts a policy without podSelector (or without
    /// spec): the empty selector, every pod of the namespace.
    #[test]
    fn a_policy_without_pod_selector_selects_every_pod_as_upstream() {
        let text = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\nspec: {policyTypes: [Ingress]}\n";
        assert_eq!(names(&parse_objects(text).unwrap()), ["np x/p"]);
    }

    const CNPS: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-db}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress:
  - {name: no-dev, action: Deny, from: [{namespaces: {matchLabels: {env: dev}}}]}
---
apiVersion: networking.k8s.aws/v1alpha1
kind: ClusterNetworkPolicy
metadata: {name: deny-db}
spec:
  tier: Baseline
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: db}}}}
  egress:
  - {action: Accept, to: [{domainNames: [example.com]}], ports: [{portNumber: {port: 443}}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {zone: a}}
status:
  addresses: [{type: InternalIP, address: 192.168.0.10}, {type: Hostname, address: node-a}]
"#;

    #[test]
    fn cluster_network_policies_of_both_groups_and_nodes_are_read() {
        let objects = parse_objects(CNPS).unwrap();
        assert_eq!(
            names(&objects),
            [
                "ClusterNetworkPolicy/deny-db",
                "ClusterNetworkPolicy.networking.k8s.aws/deny-db",
                "node node-a"
            ]
        );
        let Object::ClusterNetworkPolicy(up) = &objects[0] else {
            unreachable!()
        };
        assert_eq!(
            (up.tier, up.priority, up.ingress[0].action),
            (palisade_apis::Tier::Admin, 10, palisade_apis::Action::Deny)
        );
        let Object::Node(node) = &objects[2] else {
            unreachable!()
        };
        let addresses = node.status.as_ref().unwrap().addresses.as_ref().unwrap();
        assert_eq!(addresses[0].address, "192.168.0.10");
    }

    #[test]
    fn an_application_network_policy_is_read_as_a_network_policy_with_names() {
        let text = "apiVersion: networking.k8s.aws/v1alpha1\nkind: ApplicationNetworkPolicy\nmetadata: {name: p}\nspec:\n  podSelector: {}\n  egress: [{to: [{domainNames: [api.example.com]}]}]\n";
        let objects = parse_objects(text).unwrap();
        let [Object::NetworkPolicy(np)] = &objects[..] else {
            panic!("{objects:?}");
        };
        assert_eq!(np.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            np.metadata.name.as_deref(),
            Some("ApplicationNetworkPolicy:p")
        );
        assert_eq!(
            palisade_apis::application_network_policy::domain_names(np),
            std::collections::BTreeMap::from([(0, vec!["api.example.com".to_string()])])
        );
    }

    #[test]
    fn a_refused_cluster_network_policy_or_node_names_object_and_field() {
        let up = "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: p}\n";
        let aws = "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterNetworkPolicy\nmetadata: {name: q}\n";
        let cases = [
            (
                format!("{up}spec: {{tier: Admin, priority: 1, subject: {{namespaces: {{}}}}, ingress: [{{action: Deny, fromm: []}}]}}\n"),
                "document 1: ClusterNetworkPolicy p: spec.ingress[0].fromm: unknown field",
            ),
            (
                format!("{up}spec: {{tier: Admin, priority: 1, subject: {{}}}}\n"),
                "document 1: ClusterNetworkPolicy p: spec.subject: Invalid value: 0: spec.subject in body should have at least 1 properties",
            ),
            (
                format!("{up}spec:\n"),
                "document 1: ClusterNetworkPolicy p: spec: Required value",
            ),
            (
                format!("{aws}spec: {{tier: Admin, priority: 1, subject: {{namespaces: {{}}}}, egress: [{{action: Pass, to: [{{domainNames: [a.com]}}]}}]}}\n"),
                "document 1: ClusterNetworkPolicy.networking.k8s.aws q: spec.egress[0]: Invalid value: \"object\": domainNames peer can only be used with Accept action",
            ),
            (
                "apiVersion: networking.k8s.aws/v1alpha1\nkind: ApplicationNetworkPolicy\nmetadata: {name: r, namespace: x}\nspec: {podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}, domainNames: [a.com]}]}]}\n".to_string(),
                "document 1: ApplicationNetworkPolicy.networking.k8s.aws x/r: spec.egress[0].to[0]: Invalid value: \"object\": ipBlock and domainNames are mutually exclusive",
            ),
            (
                "apiVersion: networking.k8s.aws/v1alpha1\nkind: ClusterNetworkPolcy\nmetadata: {name: q}\n".to_string(),
                "document 1: ClusterNetworkPolcy.networking.k8s.aws q: kind \"ClusterNetworkPolcy\" is not served by networking.k8s.aws/v1alpha1",
            ),
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: Node_A}\n".to_string(),
                "document 1: Node Node_A: metadata.name: Invalid value: \"Node_A\"",
            ),
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {adresses: []}\n".to_string(),
                "document 1: Node n: status.adresses: unknown field",
            ),
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nspec: {taints: [{key: k, effect: Never}]}\n".to_string(),
                "document 1: Node n: spec.taints[0].effect: Unsupported value: \"Never\"",
            ),
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nspec: {podCIDRs: [10.0.0.0/24, 10.1.0.0/24]}\n".to_string(),
                "document 1: Node n: spec.podCIDRs: Invalid value: \"[\\\"10.0.0.0/24\\\", \\\"10.1.0.0/24\\\"]\": may specify no more than one CIDR for each IP family",
            ),
        ];
        for (text, want) in cases {
            let got = parse_objects(&text).unwrap_err().to_string();
            assert!(got.starts_with(want), "{text}\n  got  {got}\n  want {want}");
        }
        // A Node or policy with a stray namespace: dropped, as the API
        // server drops it from a cluster-scoped object.
        let objects =
            parse_objects("apiVersion: v1\nkind: Node\nmetadata: {name: n, namespace: x}\n")
                .unwrap();
        let Object::Node(node) = &objects[0] else {
            unreachable!()
        };
        assert_eq!(node.metadata.namespace, None);
    }

    #[test]
    fn empty_text_is_no_objects() {
        assert!(parse_objects("").unwrap().is_empty());
        assert!(parse_objects("---\n---\n").unwrap().is_empty());
        assert!(parse_objects("# only a comment\n").unwrap().is_empty());
    }
}
