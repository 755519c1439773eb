//! NetworkPolicy (networking.k8s.io/v1) as the API server validates it
//! (kubernetes pkg/apis/networking/validation): the selectors, each rule's
//! ports and peers, and policyTypes.
//!
//! What it accepts that may surprise: a missing `spec` or `podSelector`
//! (the empty selector: every pod of the namespace), a rule with neither
//! ports nor peers (`{}`: everything), duplicate rules or policyTypes,
//! and ipBlock CIDRs with host bits set (the network is the masked one).
//! The API server accepts all of these, so refusing them here would make
//! the manifest source disagree with a cluster.

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::field::{Errors, Path};
use super::meta;

pub const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
pub const POLICY_TYPES: &[&str] = &["Ingress", "Egress"];

pub fn validate(np: &NetworkPolicy, errs: &mut Errors) {
    meta::object_meta(&np.metadata, true, meta::dns1123_subdomain, errs);
    spec(
        np.spec.as_ref().unwrap_or(&NetworkPolicySpec::default()),
        &Path::new("spec"),
        errs,
    );
}

fn spec(spec: &NetworkPolicySpec, path: &Path, errs: &mut Errors) {
    if let Some(sel) = &spec.pod_selector {
        meta::label_selector(sel, &path.child("podSelector"), errs);
    }
    for (i, rule) in spec.ingress.iter().flatten().enumerate() {
        let at = path.child("ingress").index(i);
        for (j, p) in rule.ports.iter().flatten().enumerate() {
            port(p, &at.child("ports").index(j), errs);
        }
        for (j, p) in rule.from.iter().flatten().enumerate() {
            peer(p, &at.child("from").index(j), errs);
        }
    }
    for (i, rule) in spec.egress.iter().flatten().enumerate() {
        let at = path.child("egress").index(i);
        for (j, p) in rule.ports.iter().flatten().enumerate() {
            port(p, &at.child("ports").index(j), errs);
        }
        for (j, p) in rule.to.iter().flatten().enumerate() {
            peer(p, &at.child("to").index(j), errs);
        }
    }
    let types = spec.policy_types.as_deref().unwrap_or_default();
    if types.len() > POLICY_TYPES.len() {
        errs.invalid(
            &path.child("policyTypes"),
            format!("{types:?}").as_str(),
            "may not specify more than two policyTypes",
        );
        return;
    }
    for (i, t) in types.iter().enumerate() {
        if !POLICY_TYPES.contains(&t.as_str()) {
            errs.not_supported(
                &path.child("policyTypes").index(i),
                t.as_str(),
                POLICY_TYPES,
            );
        }
    }
}

fn port(p: &NetworkPolicyPort, path: &Path, errs: &mut Errors) {
    if let Some(proto) = p.protocol.as_deref() {
        if !PROTOCOLS.contains(&proto) {
            errs.not_supported(&path.child("protocol"), proto, PROTOCOLS);
        }
    }
    match (&p.port, p.end_port) {
        (Some(IntOrString::Int(n)), end) => {
            errs.invalid_each(&path.child("port"), *n, meta::port_number(i64::from(*n)));
            if let Some(end) = end {
                if end < *n {
                    errs.invalid(
                        &path.child("endPort"),
                        end,
                        "must be greater than or equal to `port`",
                    );
                }
                errs.invalid_each(
                    &path.child("endPort"),
                    end,
                    meta::port_number(i64::from(end)),
                );
            }
        }
        (Some(IntOrString::String(name)), end) => {
            if let Some(end) = end {
                errs.invalid(
                    &path.child("endPort"),
                    end,
                    "may not be specified when `port` is non-numeric",
                );
            }
            errs.invalid_each(&path.child("port"), name.as_str(), meta::port_name(name));
        }
        (None, Some(end)) => errs.invalid(
            &path.child("endPort"),
            end,
            "may not be specified when `port` is not specified",
        ),
        (None, None) => {}
    }
}

fn peer(p: &NetworkPolicyPeer, path: &Path, errs: &mut Errors) {
    let mut count = 0;
    if let Some(sel) = &p.pod_selector {
        count += 1;
        meta::label_selector(sel, &path.child("podSelector"), errs);
    }
    if let Some(sel) = &p.namespace_selector {
        count += 1;
        meta::label_selector(sel, &path.child("namespaceSelector"), errs);
    }
    if let Some(b) = &p.ip_block {
        count += 1;
        ip_block(b, &path.child("ipBlock"), errs);
    }
    if count == 0 {
        errs.required(path, "must specify a peer");
    } else if count > 1 && p.ip_block.is_some() {
        errs.forbidden(path, "may not specify both ipBlock and another peer");
    }
}

fn ip_block(b: &IPBlock, path: &Path, errs: &mut Errors) {
    if b.cidr.is_empty() {
        errs.required(&path.child("cidr"), "");
        return;
    }
    errs.invalid_each(
        &path.child("cidr"),
        b.cidr.as_str(),
        meta::cidr_legacy(&b.cidr),
    );
    let Some(cidr) = crate::cidr::parse_sloppy(&b.cidr) else {
        return;
    };
    for (i, e) in b.except.iter().flatten().enumerate() {
        let at = path.child("except").index(i);
        errs.invalid_each(&at, e.as_str(), meta::cidr_legacy(e));
        let Some(except) = crate::cidr::parse_sloppy(e) else {
            continue;
        };
        // Upstream compares the masked networks: a strict subset, and of
        // the same family (a v4 net never contains a v6 one).
        if !cidr.contains(&except.network()) || cidr.prefix_len() >= except.prefix_len() {
            errs.invalid(&at, e.as_str(), "must be a strict subset of `cidr`");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn check(spec: Value) -> Vec<String> {
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"}, "spec": spec,
        }))
        .unwrap();
        let mut errs = Errors::default();
        validate(&np, &mut errs);
        errs.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn accepted_as_the_api_server_accepts_them() {
        let ok = [
            json!({}),
            json!({"podSelector": {}}),
            json!({"podSelector": {}, "ingress": [{}], "egress": [{}]}),
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            json!({"podSelector": {}, "policyTypes": ["Egress", "Egress"]}),
            json!({"podSelector": {}, "policyTypes": []}),
            json!({"ingress": [{"ports": [{}, {"protocol": "UDP"}, {"port": 80}, {"port": "http"},
                {"port": 80, "endPort": 80}, {"port": 1, "endPort": 65535, "protocol": "SCTP"}]}]}),
            json!({"ingress": [{"from": [{"podSelector": {}}, {"namespaceSelector": {}},
                {"podSelector": {"matchLabels": {"a": "b"}}, "namespaceSelector": {}},
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "10.2.3.4/32"]}},
                {"ipBlock": {"cidr": "10.0.0.1/8"}}, {"ipBlock": {"cidr": "::/0", "except": ["fd00::/8"]}}]}]}),
            json!({"egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 53, "protocol": "UDP"}]},
                              {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 53, "protocol": "UDP"}]}]}),
        ];
        for spec in ok {
            assert_eq!(check(spec.clone()), Vec::<String>::new(), "{spec}");
        }
    }

    #[test]
    fn refused_as_the_api_server_refuses_them_with_the_field() {
        let cases = [
            (json!({"policyTypes": ["Ingress", "Sideways"]}),
             "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\""),
            (json!({"policyTypes": ["ingress"]}), "spec.policyTypes[0]: Unsupported value: \"ingress\""),
            (json!({"policyTypes": ["Ingress", "Egress", "Ingress"]}),
             "spec.policyTypes: Invalid value: \"[\\\"Ingress\\\", \\\"Egress\\\", \\\"Ingress\\\"]\": may not specify more than two policyTypes"),
            (json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}}),
             "spec.podSelector.matchExpressions[0].operator: Invalid value: \"Equals\": not a valid selector operator"),
            (json!({"ingress": [{}, {"from": [{}]}]}), "spec.ingress[1].from[0]: Required value: must specify a peer"),
            (json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
             "spec.egress[0].to[0]: Forbidden: may not specify both ipBlock and another peer"),
            (json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}]}]}),
             "spec.egress[0].to[0]: Forbidden"),
            (json!({"ingress": [{"from": [{"ipBlock": {"cidr": ""}}]}]}),
             "spec.ingress[0].from[0].ipBlock.cidr: Required value"),
            (json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0"}}]}]}),
             "spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"10.0.0.0\": must be a valid CIDR value"),
            (json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]}]}),
             "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.0.0.0/8\": must be a strict subset of `cidr`"),
            (json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}]}),
             "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"11.0.0.0/16\": must be a strict subset"),
            (json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/64"]}}]}]}),
             "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"fd00::/64\": must be a strict subset"),
            (json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["x"]}}]}]}),
             "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"x\": must be a valid CIDR value"),
            (json!({"ingress": [{"ports": [{"protocol": "ICMP"}]}]}),
             "spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\""),
            (json!({"ingress": [{"ports": [{"protocol": "tcp"}]}]}), "spec.ingress[0].ports[0].protocol: Unsupported value: \"tcp\""),
            (json!({"ingress": [{"ports": [{"port": 0}]}]}),
             "spec.ingress[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"),
            (json!({"ingress": [{"ports": [{"port": 65536}]}]}), "spec.ingress[0].ports[0].port: Invalid value: 65536"),
            (json!({"ingress": [{"ports": [{"port": "80"}]}]}),
             "spec.ingress[0].ports[0].port: Invalid value: \"80\": must contain at least one letter (a-z)"),
            (json!({"ingress": [{"ports": [{"port": "HTTP"}]}]}), "spec.ingress[0].ports[0].port: Invalid value: \"HTTP\""),
            (json!({"ingress": [{"ports": [{"port": 80, "endPort": 79}]}]}),
             "spec.ingress[0].ports[0].endPort: Invalid value: 79: must be greater than or equal to `port`"),
            (json!({"ingress": [{"ports": [{"port": 80, "endPort": 65536}]}]}),
             "spec.ingress[0].ports[0].endPort: Invalid value: 65536: must be between 1 and 65535, inclusive"),
            (json!({"ingress": [{"ports": [{"port": "http", "endPort": 90}]}]}),
             "spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric"),
            (json!({"egress": [{"ports": [{"endPort": 90}]}]}),
             "spec.egress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is not specified"),
            (json!({"egress": [{"to": [{"namespaceSelector": {"matchLabels": {"a": "-"}}}]}]}),
             "spec.egress[0].to[0].namespaceSelector.matchLabels: Invalid value: \"-\""),
            (json!({"egress": [{"to": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]}}]}]}),
             "spec.egress[0].to[0].podSelector.matchExpressions[0].values: Forbidden"),
        ];
        for (spec, want) in cases {
            let got = check(spec.clone());
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{spec}: {got:#?}\n  want {want}"
            );
        }
    }

    #[test]
    fn every_error_of_an_object_is_reported() {
        let got = check(
            json!({"policyTypes": ["Sideways"], "ingress": [{"from": [{}], "ports": [{"port": 0}]}]}),
        );
        assert_eq!(got.len(), 3, "{got:#?}");
    }

    #[test]
    fn metadata_is_checked() {
        let np: NetworkPolicy =
            serde_json::from_value(json!({"metadata": {"name": "Bad_Name", "namespace": "x"}}))
                .unwrap();
        let mut errs = Errors::default();
        validate(&np, &mut errs);
        assert!(
            errs.0[0]
                .to_string()
                .starts_with("metadata.name: Invalid value: \"Bad_Name\""),
            "{:?}",
            errs.0
        );
    }
}
