//! apimachinery's checks: names (RFC 1123 / 1035), label keys and values,
//! port names and numbers, IP addresses and CIDRs, object metadata and label
//! selectors. Messages are upstream's, so an error reads as `kubectl apply`
//! would print it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::field::{Errors, Path};
use crate::cidr;

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
pub const LABEL_VALUE_MAX: usize = 63;
/// The total size of an object's annotations (keys and values).
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

fn regex_error(msg: &str, re: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{re}')",
        examples.join("or ")
    )
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} bytes")
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|c| is_lower_alnum(*c) || *c == b'-')
}

fn matches_dns_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns_label)
}

pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !matches_dns_label(s) {
        if matches_dns_subdomain(s) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if !matches_dns_subdomain(s) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

pub fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !(matches_dns_label(s) && s.as_bytes()[0].is_ascii_lowercase()) {
        errs.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn matches_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label key (upstream's IsQualifiedName): an optional DNS subdomain
/// prefix and '/', then a name of at most 63 characters.
pub fn qualified_name(s: &str) -> Vec<String> {
    const MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
    let examples = ["MyName", "my.name", "123-abc"];
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                errs.extend(dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            return vec![format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(MSG, LABEL_KEY_FMT, &examples)
            )]
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > DNS1123_LABEL_MAX {
        errs.push(format!("name part {}", max_len_error(DNS1123_LABEL_MAX)));
    }
    if !matches_label_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(MSG, LABEL_KEY_FMT, &examples)
        ));
    }
    errs
}

pub fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        errs.push(max_len_error(LABEL_VALUE_MAX));
    }
    if !s.is_empty() && !matches_label_name(s) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// An IANA service name, as named ports must be.
pub fn port_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 15 {
        errs.push(max_len_error(15));
    }
    if s.is_empty() || !s.bytes().all(|b| is_lower_alnum(b) || b == b'-') {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if !s.bytes().any(|b| b.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    errs
}

pub fn port_number(n: i64) -> Vec<String> {
    if (1..=65535).contains(&n) {
        vec![]
    } else {
        vec!["must be between 1 and 65535, inclusive".into()]
    }
}

pub fn ip_legacy(s: &str) -> Vec<String> {
    match cidr::parse_ip_sloppy(s) {
        Some(_) => vec![],
        None => vec!["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into()],
    }
}

/// A strictly valid IP: no leading zeros, not IPv4-mapped, canonical.
pub fn ip_strict(s: &str) -> Vec<String> {
    let Some(sloppy) = cidr::parse_ip_sloppy(s) else {
        return ip_legacy(s);
    };
    let mut errs = Vec::new();
    match s.parse::<IpAddr>() {
        Err(_) => errs.push("must not have leading 0s".into()),
        Ok(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => {
            errs.push("must not be an IPv4-mapped IPv6 address".into())
        }
        Ok(_) => {}
    }
    if errs.is_empty() && sloppy.to_string() != s {
        errs.push(format!(
            "must be in canonical form ({:?})",
            sloppy.to_string()
        ));
    }
    errs
}

pub fn cidr_legacy(s: &str) -> Vec<String> {
    match cidr::parse_sloppy(s) {
        Some(_) => vec![],
        None => vec!["must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)".into()],
    }
}

/// Labels: every key a qualified name, every value a label value.
pub fn labels(map: &BTreeMap<String, String>, path: &Path, errs: &mut Errors) {
    for (k, v) in map {
        label_key(k, path, errs);
        errs.invalid_each(path, v.as_str(), label_value(v));
    }
}

pub fn label_key(key: &str, path: &Path, errs: &mut Errors) {
    errs.invalid_each(path, key, qualified_name(key));
}

pub fn annotations(map: &BTreeMap<String, String>, path: &Path, errs: &mut Errors) {
    for k in map.keys() {
        errs.invalid_each(path, k.as_str(), qualified_name(&k.to_lowercase()));
    }
    let total: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > ANNOTATIONS_MAX_BYTES {
        errs.push(
            path,
            super::field::Problem::TooLong {
                max: ANNOTATIONS_MAX_BYTES,
            },
        );
    }
}

/// How a kind's names are checked.
pub type NameCheck = fn(&str) -> Vec<String>;

/// Finalizers the API server knows by their bare name.
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

/// An object's metadata. `namespaced`: the kind lives in a namespace (the
/// source has already put a defaulted one in).
pub fn object_meta(meta: &ObjectMeta, namespaced: bool, name_check: NameCheck, errs: &mut Errors) {
    let path = Path::new("metadata");
    if let Some(prefix) = meta.generate_name.as_deref().filter(|g| !g.is_empty()) {
        // A prefix may end in a dash: a suffix follows it.
        let masked = match prefix.strip_suffix('-') {
            Some(rest) => format!("{rest}a"),
            None => prefix.to_string(),
        };
        errs.invalid_each(&path.child("generateName"), prefix, name_check(&masked));
    }
    match meta.name.as_deref() {
        None | Some("") if meta.generate_name.as_deref().is_some_and(|g| !g.is_empty()) => errs
            .required(
                &path.child("name"),
                "a manifest needs a name (generateName is for the API server to complete)",
            ),
        None | Some("") => errs.required(&path.child("name"), "name or generateName is required"),
        Some(name) => errs.invalid_each(&path.child("name"), name, name_check(name)),
    }
    if namespaced {
        match meta.namespace.as_deref() {
            None | Some("") => errs.required(&path.child("namespace"), ""),
            Some(ns) => errs.invalid_each(&path.child("namespace"), ns, dns1123_label(ns)),
        }
    }
    if let Some(g) = meta.generation {
        if g < 0 {
            errs.invalid(
                &path.child("generation"),
                g,
                "must be greater than or equal to 0",
            );
        }
    }
    if let Some(l) = &meta.labels {
        labels(l, &path.child("labels"), errs);
    }
    if let Some(a) = &meta.annotations {
        annotations(a, &path.child("annotations"), errs);
    }
    let owners = path.child("ownerReferences");
    let mut controller: Option<String> = None;
    for (i, o) in meta.owner_references.iter().flatten().enumerate() {
        let at = owners.index(i);
        if o.api_version.is_empty() {
            errs.required(&at.child("apiVersion"), "must not be empty");
        } else if !valid_group_version(&o.api_version) {
            errs.invalid(
                &at.child("apiVersion"),
                o.api_version.as_str(),
                "must be <group>/<version> or <version>",
            );
        }
        if o.kind.is_empty() {
            errs.required(&at.child("kind"), "must not be empty");
        }
        if o.name.is_empty() {
            errs.required(&at.child("name"), "must not be empty");
        }
        if o.uid.is_empty() {
            errs.required(&at.child("uid"), "must not be empty");
        }
        if o.api_version == "v1" && o.kind == "Event" {
            errs.invalid(
                &at,
                "/v1, Kind=Event",
                "/v1, Kind=Event is disallowed from being an owner",
            );
        }
        if o.controller == Some(true) {
            let this = format!("{}/{}", o.kind, o.name);
            match &controller {
                Some(first) => errs.invalid(
                    &owners,
                    "[...]",
                    format!("Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"),
                ),
                None => controller = Some(this),
            }
        }
    }
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    for (i, f) in finalizers.iter().enumerate() {
        errs.invalid_each(&path.child("finalizers"), f.as_str(), qualified_name(f));
        if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f.as_str()) {
            errs.invalid(
                &path.child("finalizers").index(i),
                f.as_str(),
                "name is neither a standard finalizer name nor is it fully qualified",
            );
        }
    }
    if finalizers.iter().any(|f| f == "orphan")
        && finalizers.iter().any(|f| f == "foregroundDeletion")
    {
        errs.invalid(
            &path.child("finalizers"),
            "[...]",
            "finalizer orphan and foregroundDeletion cannot be both set",
        );
    }
}

fn valid_group_version(s: &str) -> bool {
    match s.split('/').collect::<Vec<_>>().as_slice() {
        [version] => !version.is_empty(),
        [_, version] => !version.is_empty(),
        _ => false,
    }
}

/// A label selector: matchLabels as labels; each requirement's operator,
/// values and key.
pub fn label_selector(sel: &LabelSelector, path: &Path, errs: &mut Errors) {
    if let Some(m) = &sel.match_labels {
        labels(m, &path.child("matchLabels"), errs);
    }
    for (i, r) in sel.match_expressions.iter().flatten().enumerate() {
        let at = path.child("matchExpressions").index(i);
        let values = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errs.required(
                &at.child("values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.forbidden(
                &at.child("values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.invalid(
                &at.child("operator"),
                other,
                "not a valid selector operator",
            ),
        }
        label_key(&r.key, &at.child("key"), errs);
        for (j, v) in values.iter().enumerate() {
            errs.invalid_each(&at.child("values").index(j), v.as_str(), label_value(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for ok in ["a", "a-b", "0", "abc-123", &"a".repeat(63)] {
            assert!(dns1123_label(ok).is_empty(), "{ok}");
        }
        assert_eq!(dns1123_label("a.b"), ["must not contain dots"]);
        for bad in ["", "-a", "a-", "A", "a_b"] {
            assert!(
                dns1123_label(bad)[0].starts_with("a lowercase RFC 1123 label"),
                "{bad}"
            );
        }
        assert_eq!(
            dns1123_label(&"a".repeat(64))[0],
            "must be no more than 63 bytes"
        );
        for ok in ["a.b", "example.com", "a", &format!("{}.b", "a".repeat(63))] {
            assert!(dns1123_subdomain(ok).is_empty(), "{ok}");
        }
        for bad in ["", "a..b", ".a", "a.", "A.b", "a_b"] {
            assert!(!dns1123_subdomain(bad).is_empty(), "{bad}");
        }
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254))[0],
            "must be no more than 253 bytes"
        );
        assert!(dns1035_label("web").is_empty());
        assert!(!dns1035_label("1web").is_empty());
        assert!(!dns1035_label("we.b").is_empty());
    }

    #[test]
    fn label_keys_and_values() {
        for ok in [
            "a",
            "app",
            "A.b_c-d",
            "example.com/a",
            "kubernetes.io/metadata.name",
            &"a".repeat(63),
        ] {
            assert!(qualified_name(ok).is_empty(), "{ok}");
        }
        let cases: [(&str, &str); 7] = [
            ("", "name part must be non-empty"),
            ("/a", "prefix part must be non-empty"),
            ("a/", "name part must be non-empty"),
            ("a/b/c", "a valid label key must consist"),
            ("-a", "name part must consist"),
            (
                "Example.com/a",
                "prefix part a lowercase RFC 1123 subdomain",
            ),
            ("a b", "name part must consist"),
        ];
        for (key, want) in cases {
            let got = qualified_name(key);
            assert!(got.iter().any(|m| m.starts_with(want)), "{key:?}: {got:?}");
        }
        assert_eq!(
            qualified_name(&"a".repeat(64))[0],
            "name part must be no more than 63 bytes"
        );
        for ok in ["", "a", "A-b_c.d", "123"] {
            assert!(label_value(ok).is_empty(), "{ok}");
        }
        for bad in ["-a", "a b", "a/b", &"a".repeat(64)] {
            assert!(!label_value(bad).is_empty(), "{bad}");
        }
    }

    #[test]
    fn port_names_and_numbers() {
        for ok in ["http", "a", "serve-80-tcp", "h2c", "abcdefghijklmno"] {
            assert!(port_name(ok).is_empty(), "{ok}");
        }
        let cases = [
            ("80", "must contain at least one letter (a-z)"),
            (
                "HTTP",
                "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            ),
            ("a--b", "must not contain consecutive hyphens"),
            ("-a", "must not begin or end with a hyphen"),
            ("abcdefghijklmnop", "must be no more than 15 bytes"),
            (
                "a_b",
                "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            ),
        ];
        for (name, want) in cases {
            assert!(
                port_name(name).contains(&want.to_string()),
                "{name}: {:?}",
                port_name(name)
            );
        }
        assert!(port_number(1).is_empty() && port_number(65535).is_empty());
        assert!(
            !port_number(0).is_empty()
                && !port_number(65536).is_empty()
                && !port_number(-1).is_empty()
        );
    }

    #[test]
    fn addresses_and_cidrs_as_go_reads_them() {
        assert!(ip_strict("10.0.0.1").is_empty());
        assert_eq!(ip_strict("010.0.0.1"), ["must not have leading 0s"]);
        assert_eq!(
            ip_strict("::ffff:1.2.3.4"),
            ["must not be an IPv4-mapped IPv6 address"]
        );
        assert_eq!(
            ip_strict("fd00:0::1"),
            ["must be in canonical form (\"fd00::1\")"]
        );
        assert!(!ip_strict("x").is_empty());
        assert!(ip_legacy("010.0.0.1").is_empty());
        assert!(cidr_legacy("010.0.0.1/08").is_empty());
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/",
            "x/8",
            "fd00::/129",
            "10.0.0.0/-1",
        ] {
            assert!(!cidr_legacy(bad).is_empty(), "{bad}");
        }
        assert!(cidr_legacy("::/0").is_empty());
    }

    fn selector(json: serde_json::Value) -> Vec<String> {
        let sel: LabelSelector = serde_json::from_value(json).unwrap();
        let mut errs = Errors::default();
        label_selector(&sel, &Path::new("spec").child("podSelector"), &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn selectors() {
        use serde_json::json;
        assert!(selector(json!({})).is_empty());
        assert!(selector(json!({"matchLabels": {"a": "b", "c": ""},
            "matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]},
                                 {"key": "b", "operator": "Exists"}]}))
        .is_empty());
        let got = selector(json!({"matchExpressions": [
            {"key": "a", "operator": "In"},
            {"key": "a", "operator": "NotIn", "values": []},
            {"key": "a", "operator": "Exists", "values": ["x"]},
            {"key": "a", "operator": "DoesNotExist", "values": ["x"]},
            {"key": "a", "operator": "in", "values": ["x"]},
            {"key": "-a", "operator": "Exists"},
            {"key": "a", "operator": "In", "values": ["a b"]},
        ]}));
        let want_prefixes = [
            "spec.podSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
            "spec.podSelector.matchExpressions[1].values: Required value",
            "spec.podSelector.matchExpressions[2].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            "spec.podSelector.matchExpressions[3].values: Forbidden",
            "spec.podSelector.matchExpressions[4].operator: Invalid value: \"in\": not a valid selector operator",
            "spec.podSelector.matchExpressions[5].key: Invalid value: \"-a\": name part must consist",
            "spec.podSelector.matchExpressions[6].values[0]: Invalid value: \"a b\": a valid label must be",
        ];
        assert_eq!(got.len(), want_prefixes.len(), "{got:#?}");
        for (g, w) in got.iter().zip(want_prefixes) {
            assert!(g.starts_with(w), "{g}\n  want {w}");
        }
        let got = selector(json!({"matchLabels": {"a b": "c", "d": "-e"}}));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].starts_with("spec.podSelector.matchLabels: Invalid value: \"a b\": name part")
        );
        assert!(got[1]
            .starts_with("spec.podSelector.matchLabels: Invalid value: \"-e\": a valid label"));
    }

    fn meta(json: serde_json::Value, namespaced: bool) -> Vec<String> {
        let m: ObjectMeta = serde_json::from_value(json).unwrap();
        let mut errs = Errors::default();
        object_meta(&m, namespaced, dns1123_subdomain, &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn metadata() {
        use serde_json::json;
        assert!(meta(json!({"name": "a.b", "namespace": "x", "labels": {"a": "b"},
            "annotations": {"Example.com/Key": "any value at all"},
            "finalizers": ["kubernetes", "example.com/f"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u", "controller": true}]}), true)
        .is_empty());
        let cases: Vec<(serde_json::Value, bool, &str)> = vec![
            (json!({}), true, "metadata.name: Required value: name or generateName is required"),
            (json!({"generateName": "a-"}), false, "metadata.name: Required value: a manifest needs a name"),
            (json!({"name": "A"}), false, "metadata.name: Invalid value: \"A\": a lowercase RFC 1123 subdomain"),
            (json!({"name": "a"}), true, "metadata.namespace: Required value"),
            (json!({"name": "a", "namespace": "a.b"}), true, "metadata.namespace: Invalid value: \"a.b\": must not contain dots"),
            (json!({"name": "a", "generation": -1}), false, "metadata.generation: Invalid value: -1"),
            (json!({"name": "a", "labels": {"a": "b c"}}), false, "metadata.labels: Invalid value: \"b c\""),
            (json!({"name": "a", "annotations": {"a b": "c"}}), false, "metadata.annotations: Invalid value: \"a b\""),
            (json!({"name": "a", "annotations": {"a": "x".repeat(ANNOTATIONS_MAX_BYTES)}}), false, "metadata.annotations: Too long"),
            (json!({"name": "a", "finalizers": ["mine"]}), false, "metadata.finalizers[0]: Invalid value: \"mine\": name is neither"),
            (json!({"name": "a", "finalizers": ["orphan", "foregroundDeletion"]}), false, "metadata.finalizers: Invalid value"),
            (json!({"name": "a", "ownerReferences": [{"apiVersion": "", "kind": "", "name": "", "uid": ""}]}), false,
             "metadata.ownerReferences[0].apiVersion: Required value"),
            (json!({"name": "a", "ownerReferences": [
                {"apiVersion": "v1", "kind": "K", "name": "a", "uid": "1", "controller": true},
                {"apiVersion": "v1", "kind": "K", "name": "b", "uid": "2", "controller": true}]}), false,
             "metadata.ownerReferences: Invalid value: \"[...]\": Only one reference can have Controller set to true"),
        ];
        for (m, namespaced, want) in cases {
            let got = meta(m.clone(), namespaced);
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{m}: {got:#?}\n  want {want}"
            );
        }
    }
}
