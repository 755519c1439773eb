//! Decoding as the API server's strict field validation does (kubectl's
//! default, `--validate=strict`): every field the type does not have, at any
//! depth, is an error naming its path, and so is a key given twice. The
//! k8s-openapi types skip unknown fields on their own, which is what made a
//! typo (`fromm:`) vanish and turn a rule into "allow everything".

use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Value};

use super::field::{FieldError, Path, Problem};

/// Decodes `value` as `T`, refusing unknown fields. A value of the wrong
/// type, or a required field missing, stops decoding (as the API server's
/// does): it is reported after the unknown fields met before it; otherwise
/// every unknown field is reported.
pub fn decode<T: DeserializeOwned>(value: Value) -> Result<T, Vec<FieldError>> {
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let inner = serde_path_to_error::Deserializer::new(value, &mut track);
    let decoded = serde_ignored::deserialize(inner, |path| unknown.push(render(&path)));
    match decoded {
        Err(e) => {
            // The unknown fields met before the decode stopped are
            // reported too: a misspelt required field is both.
            let mut errors: Vec<FieldError> = unknown
                .into_iter()
                .map(|path| FieldError {
                    path,
                    problem: Problem::UnknownField,
                })
                .collect();
            errors.push(stopped(&Path::default(), &track.path(), &e));
            Err(errors)
        }
        Ok(_) if !unknown.is_empty() => Err(unknown
            .into_iter()
            .map(|path| FieldError {
                path,
                problem: Problem::UnknownField,
            })
            .collect()),
        Ok(t) => Ok(t),
    }
}

/// As [`decode`] without strict field validation: unknown fields are
/// skipped. For objects the API server has already validated, where a
/// field newer than ours must not stop the read. Paths start at `root`.
pub fn decode_lenient<T: DeserializeOwned>(value: &Value, root: &Path) -> Result<T, FieldError> {
    let mut track = serde_path_to_error::Track::new();
    let inner = serde_path_to_error::Deserializer::new(value, &mut track);
    T::deserialize(inner).map_err(|e| stopped(root, &track.path(), &e))
}

/// Where and why a decode stopped. A required field absent is named at
/// the field, as the API server names it, not at the object lacking it.
fn stopped(root: &Path, at: &serde_path_to_error::Path, e: &impl std::fmt::Display) -> FieldError {
    let at = at.to_string();
    let path = if at == "." {
        root.clone()
    } else {
        root.child(&at)
    };
    let message = e.to_string();
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'));
    match missing {
        Some(field) => FieldError {
            path: path.child(field),
            problem: Problem::Required(String::new()),
        },
        None => FieldError {
            path,
            problem: Problem::Type(message),
        },
    }
}

fn render(path: &serde_ignored::Path<'_>) -> Path {
    use serde_ignored::Path as P;
    match path {
        P::Root => Path::default(),
        P::Seq { parent, index } => render(parent).index(*index),
        P::Map { parent, key } => render(parent).child(key),
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            render(parent)
        }
    }
}

/// One YAML document as a JSON value, read as kubectl reads it: a key
/// given twice in a mapping is an error (serde_yaml's own value refuses
/// it, where a JSON value would keep the last), and merge keys (`<<`) are
/// applied.
pub fn yaml_value<'de>(doc: serde_yaml::Deserializer<'de>) -> Result<Value, serde_yaml::Error> {
    let mut value = serde_yaml::Value::deserialize(doc)?;
    value.apply_merge()?;
    serde_json::to_value(&value).map_err(serde::de::Error::custom)
}

/// JSON text as a value, refusing a key that appears twice in one object
/// (serde_json would silently keep the last, as YAML parsers refuse to).
pub fn json_values(text: &str) -> impl Iterator<Item = Result<Value, serde_json::Error>> + '_ {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Unique>();
    std::iter::from_fn(move || stream.next().map(|r| r.map(|u| u.0)))
}

/// A JSON value built without duplicate keys.
struct Unique(Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Unique(v) = map.next_value_seed(UniqueSeed)?;
            if out.insert(key.clone(), v).is_some() {
                return Err(serde::de::Error::custom(format!("duplicate field {key:?}")));
            }
        }
        Ok(Value::Object(out))
    }
}

struct UniqueSeed;

impl<'de> DeserializeSeed<'de> for UniqueSeed {
    type Value = Unique;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Unique, D::Error> {
        Unique::deserialize(d)
    }
}

use serde::Deserialize as _;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use serde_json::json;

    fn unknown(value: Value) -> Vec<String> {
        match decode::<NetworkPolicy>(value) {
            Ok(_) => vec![],
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn unknown_fields_are_named_at_every_depth() {
        let np = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "a", "namespace": "x", "lables": {"a": "b"}},
            "spex": {},
            "spec": {
                "podSelector": {"matchLabel": {"a": "b"}},
                "ingress": [
                    {"from": [{"podSelector": {}}]},
                    {"fromm": [{"podSelector": {}}]},
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "excpt": []}}],
                     "ports": [{"prot": "TCP"}]},
                ],
                "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [
                    {"key": "a", "operator": "In", "valuse": ["b"]}]}}]}],
            },
        });
        assert_eq!(
            unknown(np),
            [
                "metadata.lables: unknown field",
                "spec.egress[0].to[0].namespaceSelector.matchExpressions[0].valuse: unknown field",
                "spec.ingress[1].fromm: unknown field",
                "spec.ingress[2].from[0].ipBlock.excpt: unknown field",
                "spec.ingress[2].ports[0].prot: unknown field",
                "spec.podSelector.matchLabel: unknown field",
                "spex: unknown field",
            ]
        );
    }

    #[test]
    fn a_null_unknown_field_is_still_unknown_and_known_ones_pass() {
        let np = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "a", "resourceVersion": "5", "uid": "u"},
            "spec": {"podSelector": {}, "ingress": [{"fromm": null}]}});
        assert_eq!(unknown(np), ["spec.ingress[0].fromm: unknown field"]);
        let ok = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "a", "creationTimestamp": null, "annotations": {"k": "v"}},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}});
        assert!(unknown(ok).is_empty());
    }

    #[test]
    fn a_wrong_type_names_its_field() {
        let np = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "a"},
            "spec": {"ingress": [{"ports": [{"port": [80]}]}]}});
        let got = unknown(np);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("spec.ingress[0].ports[0].port: "),
            "{got:?}"
        );
    }

    #[test]
    fn a_missing_required_field_is_named_at_the_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Rule {
            action: String,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Spec {
            rules: Vec<Rule>,
        }
        let got = decode::<Spec>(json!({"rules": [{"action": "a"}, {}]})).unwrap_err();
        assert_eq!(got[0].to_string(), "rules[1].action: Required value");
        // Leniently: an unknown field is skipped, the rest as strictly.
        let spec = Path::new("spec");
        let ok = json!({"rules": [{"action": "a", "newer": 1}]});
        assert!(decode_lenient::<Spec>(&ok, &spec).is_ok());
        let bad = json!({"rules": [{"action": 1}]});
        let got = decode_lenient::<Spec>(&bad, &spec).unwrap_err().to_string();
        assert!(
            got.starts_with("spec.rules[0].action: invalid type"),
            "{got}"
        );
        let got = decode_lenient::<Spec>(&json!({}), &spec)
            .unwrap_err()
            .to_string();
        assert_eq!(got, "spec.rules: Required value");
    }

    #[test]
    fn yaml_refuses_duplicate_keys_and_applies_merge_keys() {
        let doc = |t| yaml_value(serde_yaml::Deserializer::from_str(t));
        let err = doc("a: {b: 1, b: 2}\n").unwrap_err().to_string();
        assert!(err.contains("duplicate entry with key \"b\""), "{err}");
        let merged = doc("base: &b {x: 1}\nc: {<<: *b, y: 2}\n").unwrap();
        assert_eq!(merged["c"], json!({"x": 1, "y": 2}));
    }

    #[test]
    fn json_refuses_duplicate_keys_at_any_depth() {
        let dup = r#"{"a": {"b": 1, "b": 2}}"#;
        let err = json_values(dup).next().unwrap().unwrap_err().to_string();
        assert!(err.contains("duplicate field \"b\""), "{err}");
        let two = r#"{"a": 1} [1, {"x": null}]"#;
        let values: Vec<Value> = json_values(two).map(Result::unwrap).collect();
        assert_eq!(values, [json!({"a": 1}), json!([1, {"x": null}])]);
    }
}
