//! AWS's ApplicationNetworkPolicy (`networking.k8s.aws/v1alpha1`) as the API
//! server checks it: against its CRD's schema and CEL rules, which is less
//! than a NetworkPolicy gets (no "must specify a peer", no port range).
//! What the schema lets through and the resolver cannot use (a peer `{}`,
//! port 0) is an error there, naming the policy and the field, and drops
//! only the rule it spoils.

use std::collections::BTreeSet;

use palisade_apis::application_network_policy::{ApplicationNetworkPolicy, Peer};
use serde_json::Value;

use super::field::{Errors, FieldError, Path};
use super::{meta, strict};

/// Decodes and validates one object; a missing namespace is "default".
pub fn validate(value: Value) -> Result<ApplicationNetworkPolicy, Vec<FieldError>> {
    let mut errs = Errors::default();
    // Required by the CRD when there is a spec; the wire type reads its
    // absence as the empty selector, so it is looked for as written.
    if let Some(spec) = value.get("spec").filter(|s| s.is_object()) {
        if spec.get("podSelector").is_none_or(Value::is_null) {
            errs.required(&Path::new("spec").child("podSelector"), "");
        }
    }
    let mut anp: ApplicationNetworkPolicy = strict::decode(value)?;
    if anp.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        anp.metadata.namespace = Some("default".into());
    }
    meta::object_meta(&anp.metadata, true, meta::dns1123_subdomain, &mut errs);
    let spec = Path::new("spec");
    for (i, rule) in anp
        .spec
        .iter()
        .flat_map(|s| s.egress.iter().flatten())
        .enumerate()
    {
        let at = spec.child("egress").index(i);
        for (j, p) in rule.to.iter().flatten().enumerate() {
            peer(p, &at.child("to").index(j), &mut errs);
        }
    }
    errs.into_result().map(|()| anp)
}

/// The CRD's CEL rules (names exclusive of every other peer kind) and its
/// `domainNames` schema: at least one, a set, each matching its pattern.
fn peer(p: &Peer, path: &Path, errs: &mut Errors) {
    let Some(names) = &p.domain_names else {
        return;
    };
    for (set, other) in [
        (p.ip_block.is_some(), "ipBlock"),
        (p.pod_selector.is_some(), "podSelector"),
        (p.namespace_selector.is_some(), "namespaceSelector"),
    ] {
        if set {
            errs.invalid(
                path,
                "object",
                format!("{other} and domainNames are mutually exclusive"),
            );
        }
    }
    let at = path.child("domainNames");
    if names.is_empty() {
        errs.invalid(&at, 0, format!("{at} in body should have at least 1 items"));
    }
    let mut seen = BTreeSet::new();
    for (i, n) in names.iter().enumerate() {
        let item = at.index(i);
        if !seen.insert(n.as_str()) {
            errs.duplicate(&item, n.as_str());
        }
        if !palisade_dns::pattern::is_domain_name(n) {
            errs.invalid(
                &item,
                n.as_str(),
                format!(
                    "{item} in body should match '{}'",
                    palisade_dns::pattern::DOMAIN_PATTERN
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::validate::joined;
    use serde_json::json;

    fn check(spec: Value) -> Result<ApplicationNetworkPolicy, String> {
        validate(json!({
            "apiVersion": "networking.k8s.aws/v1alpha1", "kind": "ApplicationNetworkPolicy",
            "metadata": {"name": "p"}, "spec": spec,
        }))
        .map_err(|e| joined(&e))
    }

    #[test]
    fn a_policy_the_crd_admits_is_read() {
        let anp = check(json!({
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [
                {"to": [{"domainNames": ["api.example.com", "*.example.org."]}], "ports": [{"port": 443}]},
                {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}, {"namespaceSelector": {}}]},
            ],
        }))
        .unwrap();
        assert_eq!(anp.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(anp.spec.unwrap().egress.unwrap().len(), 2);
    }

    #[test]
    fn what_the_crd_refuses_is_named() {
        let cases = [
            (json!({"egress": []}), "spec.podSelector: Required value"),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "domainNames": ["a.com"]}]}]}),
                "spec.egress[0].to[0]: Invalid value: \"object\": ipBlock and domainNames are mutually exclusive",
            ),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}, "namespaceSelector": {}, "domainNames": ["a.com"]}]}]}),
                "spec.egress[0].to[0]: Invalid value: \"object\": podSelector and domainNames are mutually exclusive; \
                 spec.egress[0].to[0]: Invalid value: \"object\": namespaceSelector and domainNames are mutually exclusive",
            ),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"domainNames": []}]}]}),
                "spec.egress[0].to[0].domainNames: Invalid value: 0: spec.egress[0].to[0].domainNames in body should have at least 1 items",
            ),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"domainNames": ["a.com", "a.com"]}]}]}),
                "spec.egress[0].to[0].domainNames[1]: Duplicate value: \"a.com\"",
            ),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"domainNames": ["-bad.com"]}]}]}),
                "spec.egress[0].to[0].domainNames[0]: Invalid value: \"-bad.com\": spec.egress[0].to[0].domainNames[0] in body should match",
            ),
            (
                json!({"podSelector": {}, "ingress": [{"from": [{"domainNames": ["a.com"]}]}]}),
                "spec.ingress[0].from[0].domainNames: unknown field",
            ),
            (
                json!({"podSelector": {}, "egress": [{"too": []}]}),
                "spec.egress[0].too: unknown field",
            ),
        ];
        for (spec, want) in cases {
            let got = check(spec.clone()).unwrap_err();
            assert!(got.starts_with(want), "{spec}:\n got {got}\nwant {want}");
        }
    }
}
