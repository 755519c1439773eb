//! ClusterNetworkPolicy of both API groups, checked as the API server
//! checks a custom resource against its CRD: strict field validation (an
//! unknown or repeated field at any depth is an error), the OpenAPI schema
//! (required fields, enums, minimum and maximum, item and length limits,
//! "exactly one field" objects, list-type sets, patterns), then every CEL
//! rule (`x-kubernetes-validations`) the CRD carries.
//!
//! The CRDs: network-policy-api v0.2.0's
//! `policy.networking.k8s.io_clusternetworkpolicies.yaml` (the experimental
//! channel: the standard one lacks `nodes` and `domainNames` and the egress
//! rule's named-port rule, so an object either channel admits with those
//! fields passes here, and what enforcement cannot do is decided there),
//! and amazon-network-policy-controller-k8s's
//! `networking.k8s.aws_clusternetworkpolicies.yaml`.
//!
//! One module for both groups: they share the spec's skeleton (tier,
//! priority, subject, rules, the namespaces and pods peers, networks and
//! domain names), and one set of checks over it keeps the two from drifting
//! apart; where they differ (upstream's protocols against AWS's ports, 25
//! items against 100, which CEL rules) [`Group`] says so.
//!
//! What the API server admits and so does this, which may surprise: label
//! selectors are not checked beyond their shape (a CRD's schema has no rule
//! for operators or label syntax: resolution reports a bad one); an AWS port
//! entry may set none or several of its fields, and its protocol is any
//! string (no enum in that CRD); AWS `networks` entries are not checked as
//! CIDRs (only their length). The typed reading fails closed on each.
//!
//! Messages are the API server's: `spec.priority: Invalid value: 1001:
//! spec.priority in body should be less than or equal to 1000`, and for a
//! CEL rule `spec.egress[0]: Invalid value: "object": <the rule's message>`.
//! As there, the CEL rules are not run on an object with a blocking schema
//! error (a missing field, a value not in an enum, too many items, too
//! long a string): one error says so instead.

use std::collections::BTreeSet;
use std::net::IpAddr;

use palisade_apis::wire::{
    AwsClusterNetworkPolicy, AwsEgressRule, AwsIngressRule, AwsPort, IngressPeer, Subject,
    UpstreamClusterNetworkPolicy, UpstreamEgressPeer, UpstreamEgressRule, UpstreamIngressRule,
    UpstreamPort, UpstreamPorts, UpstreamProtocol,
};
use serde_json::Value;

use super::field::{Errors, FieldError, Path, Problem};
use super::{meta, strict};

pub const TIERS: &[&str] = &["Admin", "Baseline"];
pub const ACTIONS: &[&str] = &["Accept", "Deny", "Pass"];
pub const PRIORITY_MAX: i64 = 1000;
/// A rule's `name`, in characters (a CRD's maxLength counts characters).
pub const RULE_NAME_MAX: usize = 100;
/// A `networks` entry, in characters.
pub const CIDR_MAX: usize = 43;
/// `networks` and `domainNames`, in both groups.
pub const PEER_LIST_MAX: usize = 25;

/// Which CRD an object is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Upstream,
    Aws,
}

impl Group {
    /// Rules per direction, peers per rule, ports (protocols) per rule.
    fn max_items(self) -> usize {
        match self {
            Group::Upstream => 25,
            Group::Aws => 100,
        }
    }
}

/// Decodes and validates an upstream (`policy.networking.k8s.io/v1alpha2`)
/// object. A stray `metadata.namespace` is dropped, as the API server drops
/// it from a cluster-scoped object.
pub fn upstream(mut value: Value) -> Result<UpstreamClusterNetworkPolicy, Vec<FieldError>> {
    prune_null_spec(&mut value);
    let mut missing = Errors::default();
    requirements(&value["spec"], &Path::new("spec"), &mut missing);
    let mut cnp: UpstreamClusterNetworkPolicy = strict::decode(value)?;
    cnp.metadata.namespace = None;
    let mut errs = Errors::default();
    meta::object_meta(&cnp.metadata, false, meta::dns1123_subdomain, &mut errs);
    let mut check = Check::new(Group::Upstream);
    check.schema.0.extend(missing.0);
    let spec = &cnp.spec;
    let path = Path::new("spec");
    check.common(&spec.tier, spec.priority, &spec.subject, &path);
    if let Some(rules) = &spec.ingress {
        let at = path.child("ingress");
        check.max_items(rules.len(), &at);
        for (i, r) in rules.iter().enumerate() {
            check.upstream_ingress(r, &at.index(i));
        }
    }
    if let Some(rules) = &spec.egress {
        let at = path.child("egress");
        check.max_items(rules.len(), &at);
        for (i, r) in rules.iter().enumerate() {
            check.upstream_egress(r, &at.index(i));
        }
    }
    check.finish(&mut errs);
    errs.into_result().map(|()| cnp)
}

/// Decodes and validates an AWS (`networking.k8s.aws/v1alpha1`) object, as
/// [`upstream`].
pub fn aws(mut value: Value) -> Result<AwsClusterNetworkPolicy, Vec<FieldError>> {
    prune_null_spec(&mut value);
    // The wire type defaults a pods peer's namespaceSelector (upstream's
    // is optional); AWS's CRD requires it, so its absence is looked for
    // in the object as written.
    let mut missing = Errors::default();
    requirements(&value["spec"], &Path::new("spec"), &mut missing);
    aws_namespace_selectors(&value, &mut missing);
    let no_spec = value.get("spec").is_none_or(Value::is_null);
    let mut cnp: AwsClusterNetworkPolicy = strict::decode(value)?;
    cnp.metadata.namespace = None;
    let mut errs = Errors::default();
    meta::object_meta(&cnp.metadata, false, meta::dns1123_subdomain, &mut errs);
    let mut check = Check::new(Group::Aws);
    check.schema.0.extend(missing.0);
    let spec = &cnp.spec;
    let path = Path::new("spec");
    // `spec` is optional in AWS's CRD (Go's omitempty), and then it has
    // none of the fields it would require: the object selects nothing.
    if !no_spec {
        check.common(&spec.tier, spec.priority, &spec.subject, &path);
    }
    if let Some(rules) = &spec.ingress {
        let at = path.child("ingress");
        check.max_items(rules.len(), &at);
        for (i, r) in rules.iter().enumerate() {
            check.aws_ingress(r, &at.index(i));
        }
    }
    if let Some(rules) = &spec.egress {
        let at = path.child("egress");
        check.max_items(rules.len(), &at);
        for (i, r) in rules.iter().enumerate() {
            check.aws_egress(r, &at.index(i));
        }
    }
    check.finish(&mut errs);
    errs.into_result().map(|()| cnp)
}

/// `spec:` left empty in YAML is null, which the API server prunes as it
/// prunes every null of a field that is not nullable: then upstream's spec
/// is missing, and AWS's simply absent.
fn prune_null_spec(value: &mut Value) {
    if let Some(m) = value.as_object_mut() {
        if m.get("spec").is_some_and(Value::is_null) {
            m.remove("spec");
        }
    }
}

/// A selector requirement's `key` and `operator` are required by the CRD,
/// but k8s-openapi's type reads an absent one as empty: so they are looked
/// for in the object as written, in every selector (the only objects with
/// `matchExpressions` in either CRD).
fn requirements(value: &Value, path: &Path, errs: &mut Errors) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                let at = path.child(k);
                if let ("matchExpressions", Value::Array(items)) = (k.as_str(), v) {
                    for (i, item) in items.iter().enumerate() {
                        for field in ["key", "operator"] {
                            if item.is_object() && item.get(field).is_none_or(Value::is_null) {
                                errs.required(&at.index(i).child(field), "");
                            }
                        }
                    }
                } else {
                    requirements(v, &at, errs);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                requirements(v, &path.index(i), errs);
            }
        }
        _ => {}
    }
}

/// Every `pods` peer (and subject) without `namespaceSelector`.
fn aws_namespace_selectors(value: &Value, errs: &mut Errors) {
    let spec = &value["spec"];
    let path = Path::new("spec");
    let check = |pods: &Value, at: &Path, errs: &mut Errors| {
        if pods.is_object() && pods.get("namespaceSelector").is_none_or(Value::is_null) {
            errs.required(&at.child("namespaceSelector"), "");
        }
    };
    check(
        &spec["subject"]["pods"],
        &path.child("subject").child("pods"),
        errs,
    );
    for (dir, peers) in [("ingress", "from"), ("egress", "to")] {
        let Some(rules) = spec[dir].as_array() else {
            continue;
        };
        for (i, rule) in rules.iter().enumerate() {
            let Some(list) = rule[peers].as_array() else {
                continue;
            };
            for (j, peer) in list.iter().enumerate() {
                let at = path.child(dir).index(i).child(peers).index(j).child("pods");
                check(&peer["pods"], &at, errs);
            }
        }
    }
}

/// The checks of one object: the schema's, and the CEL rules', kept apart
/// because the second run only when the first found nothing blocking.
struct Check {
    group: Group,
    schema: Errors,
    cel: Errors,
}

impl Check {
    fn new(group: Group) -> Self {
        Check {
            group,
            schema: Errors::default(),
            cel: Errors::default(),
        }
    }

    fn finish(self, errs: &mut Errors) {
        // The API server's rule (apiextensions' hasBlockingErr): these
        // schema errors mean the CEL rules cannot be trusted to evaluate.
        let blocking = self.schema.0.iter().any(|e| {
            matches!(
                e.problem,
                Problem::Required(_)
                    | Problem::NotSupported { .. }
                    | Problem::TooLong { .. }
                    | Problem::TooMany { .. }
                    | Problem::Type(_)
            )
        });
        errs.0.extend(self.schema.0);
        if blocking {
            errs.push(
                &Path::default(),
                Problem::Invalid {
                    value: "null".into(),
                    detail: "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
                },
            );
        } else {
            errs.0.extend(self.cel.0);
        }
    }

    fn common(&mut self, tier: &str, priority: i64, subject: &Subject, path: &Path) {
        if !TIERS.contains(&tier) {
            self.schema.not_supported(&path.child("tier"), tier, TIERS);
        }
        let at = path.child("priority");
        if priority < 0 {
            self.schema.invalid(
                &at,
                priority,
                format!("{at} in body should be greater than or equal to 0"),
            );
        } else if priority > PRIORITY_MAX {
            self.schema.invalid(
                &at,
                priority,
                format!("{at} in body should be less than or equal to {PRIORITY_MAX}"),
            );
        }
        let at = path.child("subject");
        self.one_of(&[subject.namespaces.is_some(), subject.pods.is_some()], &at);
    }

    /// MinProperties=1, MaxProperties=1 over the fields set.
    fn one_of(&mut self, set: &[bool], path: &Path) {
        let n = set.iter().filter(|s| **s).count();
        if n < 1 {
            self.schema.invalid(
                path,
                n,
                format!("{path} in body should have at least 1 properties"),
            );
        } else if n > 1 {
            self.schema.invalid(
                path,
                n,
                format!("{path} in body should have at most 1 properties"),
            );
        }
    }

    fn max_items(&mut self, n: usize, path: &Path) {
        self.max_items_of(n, self.group.max_items(), path);
    }

    fn max_items_of(&mut self, n: usize, max: usize, path: &Path) {
        if n > max {
            self.schema.push(path, Problem::TooMany { got: n, max });
        }
    }

    fn min_items(&mut self, n: usize, path: &Path) {
        if n < 1 {
            self.schema.invalid(
                path,
                n,
                format!("{path} in body should have at least 1 items"),
            );
        }
    }

    /// A rule's name, action and peer count.
    fn rule(
        &mut self,
        name: Option<&str>,
        action: &str,
        peers: usize,
        path: &Path,
        peer_field: &str,
    ) {
        if let Some(name) = name {
            if name.chars().count() > RULE_NAME_MAX {
                self.schema
                    .push(&path.child("name"), Problem::TooLong { max: RULE_NAME_MAX });
            }
        }
        if !ACTIONS.contains(&action) {
            self.schema
                .not_supported(&path.child("action"), action, ACTIONS);
        }
        let at = path.child(peer_field);
        self.min_items(peers, &at);
        self.max_items(peers, &at);
    }

    fn ingress_peer(&mut self, p: &IngressPeer, path: &Path) {
        self.one_of(&[p.namespaces.is_some(), p.pods.is_some()], path);
    }

    fn upstream_ingress(&mut self, r: &UpstreamIngressRule, path: &Path) {
        self.rule(r.name.as_deref(), &r.action, r.from.len(), path, "from");
        for (j, p) in r.from.iter().enumerate() {
            self.ingress_peer(p, &path.child("from").index(j));
        }
        if let Some(ps) = &r.protocols {
            self.protocols(ps, &path.child("protocols"));
        }
    }

    fn upstream_egress(&mut self, r: &UpstreamEgressRule, path: &Path) {
        self.rule(r.name.as_deref(), &r.action, r.to.len(), path, "to");
        for (j, p) in r.to.iter().enumerate() {
            self.upstream_egress_peer(p, &path.child("to").index(j));
        }
        if let Some(ps) = &r.protocols {
            self.protocols(ps, &path.child("protocols"));
        }
        // CEL on ClusterNetworkPolicyEgressRule (experimental channel).
        let addressed =
            r.to.iter()
                .any(|p| p.networks.is_some() || p.nodes.is_some() || p.domain_names.is_some());
        let named = r
            .protocols
            .iter()
            .flatten()
            .any(|p| p.destination_named_port.is_some());
        if addressed && named {
            self.cel.invalid(
                path,
                "object",
                "networks/nodes/domainNames peer cannot be set with namedPorts since there are no namedPorts for networks/nodes/domainNames",
            );
        }
    }

    fn upstream_egress_peer(&mut self, p: &UpstreamEgressPeer, path: &Path) {
        self.one_of(
            &[
                p.namespaces.is_some(),
                p.pods.is_some(),
                p.nodes.is_some(),
                p.networks.is_some(),
                p.domain_names.is_some(),
            ],
            path,
        );
        if let Some(n) = &p.networks {
            self.networks(n, &path.child("networks"));
        }
        if let Some(d) = &p.domain_names {
            self.domain_names(d, &path.child("domainNames"));
        }
    }

    fn protocols(&mut self, ps: &[UpstreamProtocol], path: &Path) {
        self.min_items(ps.len(), path);
        self.max_items(ps.len(), path);
        for (i, p) in ps.iter().enumerate() {
            let at = path.index(i);
            self.one_of(
                &[
                    p.tcp.is_some(),
                    p.udp.is_some(),
                    p.sctp.is_some(),
                    p.destination_named_port.is_some(),
                ],
                &at,
            );
            for (field, ports) in [("tcp", &p.tcp), ("udp", &p.udp), ("sctp", &p.sctp)] {
                if let Some(ports) = ports {
                    self.upstream_ports(ports, &at.child(field));
                }
            }
        }
    }

    fn upstream_ports(&mut self, p: &UpstreamPorts, path: &Path) {
        // MinProperties=1: `tcp: {}` is refused.
        let Some(port) = &p.destination_port else {
            self.schema.invalid(
                path,
                0usize,
                format!("{path} in body should have at least 1 properties"),
            );
            return;
        };
        let at = path.child("destinationPort");
        let UpstreamPort { number, range } = port;
        self.one_of(&[number.is_some(), range.is_some()], &at);
        if let Some(n) = number {
            self.port_number(*n, &at.child("number"));
        }
        if let Some(r) = range {
            self.range(r.start, r.end, &at.child("range"));
        }
    }

    /// Minimum=1, Maximum=65535.
    fn port_number(&mut self, n: i64, path: &Path) {
        if n < 1 {
            self.schema.invalid(
                path,
                n,
                format!("{path} in body should be greater than or equal to 1"),
            );
        } else if n > 65535 {
            self.schema.invalid(
                path,
                n,
                format!("{path} in body should be less than or equal to 65535"),
            );
        }
    }

    /// A port range's bounds, and its CEL rule `self.start < self.end`.
    fn range(&mut self, start: i64, end: i64, path: &Path) {
        self.port_number(start, &path.child("start"));
        self.port_number(end, &path.child("end"));
        if start >= end {
            self.cel
                .invalid(path, "object", "Start port must be less than End port");
        }
    }

    /// MinItems=1, MaxItems=25, a set, each at most 43 characters; upstream
    /// also has the CEL rule `isCIDR(self)` on each.
    fn networks(&mut self, nets: &[String], path: &Path) {
        self.min_items(nets.len(), path);
        self.max_items_of(nets.len(), PEER_LIST_MAX, path);
        self.set(nets, path);
        for (i, n) in nets.iter().enumerate() {
            let at = path.index(i);
            if n.chars().count() > CIDR_MAX {
                self.schema.push(&at, Problem::TooLong { max: CIDR_MAX });
            }
            if self.group == Group::Upstream && !is_cidr(n) {
                self.cel
                    .invalid(&at, "string", "Invalid CIDR format provided");
            }
        }
    }

    /// MinItems=1, MaxItems=25, a set, each matching the CRD's pattern.
    fn domain_names(&mut self, names: &[String], path: &Path) {
        self.min_items(names.len(), path);
        self.max_items_of(names.len(), PEER_LIST_MAX, path);
        self.set(names, path);
        for (i, n) in names.iter().enumerate() {
            if !palisade_dns::pattern::is_domain_name(n) {
                let at = path.index(i);
                self.schema.invalid(
                    &at,
                    n,
                    format!(
                        "{at} in body should match '{}'",
                        palisade_dns::pattern::DOMAIN_PATTERN
                    ),
                );
            }
        }
    }

    /// `x-kubernetes-list-type: set`: no item twice.
    fn set(&mut self, items: &[String], path: &Path) {
        let mut seen = BTreeSet::new();
        for (i, item) in items.iter().enumerate() {
            if !seen.insert(item.as_str()) {
                self.schema.duplicate(&path.index(i), item);
            }
        }
    }

    fn aws_ingress(&mut self, r: &AwsIngressRule, path: &Path) {
        self.rule(r.name.as_deref(), &r.action, r.from.len(), path, "from");
        for (j, p) in r.from.iter().enumerate() {
            self.ingress_peer(p, &path.child("from").index(j));
        }
        if let Some(ps) = &r.ports {
            self.aws_ports(ps, &path.child("ports"));
        }
    }

    fn aws_egress(&mut self, r: &AwsEgressRule, path: &Path) {
        self.rule(r.name.as_deref(), &r.action, r.to.len(), path, "to");
        for (j, p) in r.to.iter().enumerate() {
            let at = path.child("to").index(j);
            self.one_of(
                &[
                    p.namespaces.is_some(),
                    p.pods.is_some(),
                    p.networks.is_some(),
                    p.domain_names.is_some(),
                ],
                &at,
            );
            if let Some(n) = &p.networks {
                self.networks(n, &at.child("networks"));
            }
            if let Some(d) = &p.domain_names {
                self.domain_names(d, &at.child("domainNames"));
            }
        }
        if let Some(ps) = &r.ports {
            self.aws_ports(ps, &path.child("ports"));
        }
        // CEL on AWS's ClusterNetworkPolicyEgressRule.
        if r.action != "Accept" && r.to.iter().any(|p| p.domain_names.is_some()) {
            self.cel.invalid(
                path,
                "object",
                "domainNames peer can only be used with Accept action",
            );
        }
    }

    /// MinItems=1, MaxItems=100. An entry has no "exactly one" rule and its
    /// protocol no enum in AWS's CRD (the typed reading fails closed on an
    /// entry it cannot read).
    fn aws_ports(&mut self, ps: &[AwsPort], path: &Path) {
        self.min_items(ps.len(), path);
        self.max_items(ps.len(), path);
        for (i, p) in ps.iter().enumerate() {
            let at = path.index(i);
            if let Some(n) = &p.port_number {
                self.port_number(n.port, &at.child("portNumber").child("port"));
            }
            if let Some(r) = &p.port_range {
                self.range(r.start, r.end, &at.child("portRange"));
            }
        }
    }
}

/// The CEL library's `isCIDR`: Go's `netip.ParsePrefix` (no leading zeros
/// in the address or the length, no zone), and not an IPv4-mapped IPv6
/// address. Host bits may be set.
pub fn is_cidr(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    let digits = !bits.is_empty() && bits.bytes().all(|b| b.is_ascii_digit());
    if !digits || (bits.len() > 1 && bits.starts_with('0')) {
        return false;
    }
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match addr {
        IpAddr::V4(_) => bits <= 32,
        IpAddr::V6(v6) => bits <= 128 && v6.to_ipv4_mapped().is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_upstream(spec: Value) -> Vec<String> {
        let v = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}, "spec": spec});
        match upstream(v) {
            Ok(_) => vec![],
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn check_aws(spec: Value) -> Vec<String> {
        let v = json!({"apiVersion": "networking.k8s.aws/v1alpha1",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}, "spec": spec});
        match aws(v) {
            Ok(_) => vec![],
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn ns() -> Value {
        json!({"namespaces": {"matchLabels": {"a": "b"}}})
    }

    #[test]
    fn upstream_objects_either_channel_admits_pass() {
        let ok = [
            json!({"tier": "Admin", "priority": 0, "subject": ns()}),
            json!({"tier": "Baseline", "priority": 1000,
                   "subject": {"pods": {"podSelector": {}}},
                   "ingress": [{"name": "r", "action": "Deny", "from": [
                        {"namespaces": {}},
                        {"pods": {"namespaceSelector": {"matchLabels": {"x": "y"}}, "podSelector": {}}}],
                      "protocols": [{"tcp": {"destinationPort": {"number": 80}}},
                                    {"udp": {"destinationPort": {"range": {"start": 1, "end": 65535}}}},
                                    {"sctp": {"destinationPort": {"number": 9}}},
                                    {"destinationNamedPort": "http"}]}],
                   "egress": [
                      {"action": "Accept", "to": [{"networks": ["10.0.0.0/8", "10.0.0.1/8", "fd00::/8", "0.0.0.0/0"]},
                                                  {"nodes": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}},
                                                  {"domainNames": ["example.com", "*.example.com"]}],
                       "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]},
                      {"action": "Pass", "to": [{"pods": {"podSelector": {}}}],
                       "protocols": [{"destinationNamedPort": "dns"}]}]}),
            // Selectors are not checked beyond their shape by a CRD.
            json!({"tier": "Admin", "priority": 5, "subject": {"namespaces": {
                "matchExpressions": [{"key": "a b", "operator": "Equals"}]}}}),
        ];
        for spec in ok {
            assert_eq!(check_upstream(spec.clone()), Vec::<String>::new(), "{spec}");
        }
        // A status is the implementation's, and dropped on create.
        let with_status = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": "p", "namespace": "stray"},
            "spec": {"tier": "Admin", "priority": 1, "subject": ns()},
            "status": {"conditions": []}});
        let cnp = upstream(with_status).unwrap();
        assert_eq!(cnp.metadata.namespace, None, "cluster-scoped");
    }

    #[test]
    fn upstream_schema_refusals_name_the_field() {
        let rule =
            |r: Value| json!({"tier": "Admin", "priority": 1, "subject": ns(), "egress": [r]});
        let many = |n: usize, item: Value| Value::Array(vec![item; n]);
        let cases = [
            (json!({"priority": 1, "subject": ns()}), "spec.tier: Required value"),
            (json!({"tier": "Admin", "subject": ns()}), "spec.priority: Required value"),
            (json!({"tier": "admin", "priority": 1, "subject": ns()}),
             "spec.tier: Unsupported value: \"admin\": supported values: \"Admin\", \"Baseline\""),
            (json!({"tier": "Admin", "priority": 1001, "subject": ns()}),
             "spec.priority: Invalid value: 1001: spec.priority in body should be less than or equal to 1000"),
            (json!({"tier": "Admin", "priority": -1, "subject": ns()}),
             "spec.priority: Invalid value: -1: spec.priority in body should be greater than or equal to 0"),
            (json!({"tier": "Admin", "priority": "1", "subject": ns()}), "spec.priority: invalid type"),
            (json!({"tier": "Admin", "priority": 1, "subject": {}}),
             "spec.subject: Invalid value: 0: spec.subject in body should have at least 1 properties"),
            (json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}, "pods": {"podSelector": {}}}}),
             "spec.subject: Invalid value: 2: spec.subject in body should have at most 1 properties"),
            (json!({"tier": "Admin", "priority": 1, "subject": {"pods": {"namespaceSelector": {}}}}),
             "spec.subject.pods.podSelector: Required value"),
            (json!({"tier": "Admin", "priority": 1, "subject": {"namespace": {}}}),
             "spec.subject.namespace: unknown field"),
            (json!({"tier": "Admin", "priority": 1, "subject": {"pods": {"podSelector": {"matchExpressions": [{"key": "a"}]}}}}),
             "spec.subject.pods.podSelector.matchExpressions[0].operator: Required value"),
            (rule(json!({"action": "Deny", "to": [{"nodes": {"matchExpressions": [{"operator": "Exists"}]}}]})),
             "spec.egress[0].to[0].nodes.matchExpressions[0].key: Required value"),
            (json!({"tier": "Admin", "priority": 1, "subject": ns(), "ingress": many(26, json!({"action": "Deny", "from": [{"namespaces": {}}]}))}),
             "spec.ingress: Too many: 26: must have at most 25 items"),
            (rule(json!({"action": "Deny", "to": []})),
             "spec.egress[0].to: Invalid value: 0: spec.egress[0].to in body should have at least 1 items"),
            (rule(json!({"action": "Deny"})), "spec.egress[0].to: Required value"),
            (rule(json!({"to": [{"namespaces": {}}]})), "spec.egress[0].action: Required value"),
            (rule(json!({"action": "Allow", "to": [{"namespaces": {}}]})),
             "spec.egress[0].action: Unsupported value: \"Allow\": supported values: \"Accept\", \"Deny\", \"Pass\""),
            (rule(json!({"action": "Deny", "name": "x".repeat(101), "to": [{"namespaces": {}}]})),
             "spec.egress[0].name: Too long: may not be more than 100 bytes"),
            (rule(json!({"action": "Deny", "to": [{}]})),
             "spec.egress[0].to[0]: Invalid value: 0: spec.egress[0].to[0] in body should have at least 1 properties"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}, "networks": ["10.0.0.0/8"]}]})),
             "spec.egress[0].to[0]: Invalid value: 2: spec.egress[0].to[0] in body should have at most 1 properties"),
            (rule(json!({"action": "Deny", "to": [{"networks": []}]})),
             "spec.egress[0].to[0].networks: Invalid value: 0: spec.egress[0].to[0].networks in body should have at least 1 items"),
            (rule(json!({"action": "Deny", "to": [{"networks": many(26, json!("10.0.0.0/8"))}]})),
             "spec.egress[0].to[0].networks: Too many: 26: must have at most 25 items"),
            (rule(json!({"action": "Deny", "to": [{"networks": ["10.0.0.0/8", "10.0.0.0/8"]}]})),
             "spec.egress[0].to[0].networks[1]: Duplicate value: \"10.0.0.0/8\""),
            (rule(json!({"action": "Deny", "to": [{"networks": ["0000:0000:0000:0000:0000:0000:0000:00000/128"]}]})),
             "spec.egress[0].to[0].networks[0]: Too long: may not be more than 43 bytes"),
            (rule(json!({"action": "Accept", "to": [{"domainNames": ["-bad.com"]}]})),
             "spec.egress[0].to[0].domainNames[0]: Invalid value: \"-bad.com\": spec.egress[0].to[0].domainNames[0] in body should match '^(\\*\\.)?"),
            (rule(json!({"action": "Accept", "to": [{"domainNames": ["a.com", "a.com"]}]})),
             "spec.egress[0].to[0].domainNames[1]: Duplicate value: \"a.com\""),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": []})),
             "spec.egress[0].protocols: Invalid value: 0: spec.egress[0].protocols in body should have at least 1 items"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{}]})),
             "spec.egress[0].protocols[0]: Invalid value: 0: spec.egress[0].protocols[0] in body should have at least 1 properties"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"tcp": {}, "udp": {}}]})),
             "spec.egress[0].protocols[0]: Invalid value: 2"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"tcp": {}}]})),
             "spec.egress[0].protocols[0].tcp: Invalid value: 0: spec.egress[0].protocols[0].tcp in body should have at least 1 properties"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"tcp": {"destinationPort": {}}}]})),
             "spec.egress[0].protocols[0].tcp.destinationPort: Invalid value: 0"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"udp": {"destinationPort": {"number": 0}}}]})),
             "spec.egress[0].protocols[0].udp.destinationPort.number: Invalid value: 0: spec.egress[0].protocols[0].udp.destinationPort.number in body should be greater than or equal to 1"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"udp": {"destinationPort": {"number": 65536}}}]})),
             "spec.egress[0].protocols[0].udp.destinationPort.number: Invalid value: 65536: spec.egress[0].protocols[0].udp.destinationPort.number in body should be less than or equal to 65535"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"sctp": {"destinationPort": {"range": {"start": 5}}}}]})),
             "spec.egress[0].protocols[0].sctp.destinationPort.range.end: Required value"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": [{"icmp": {}}]})),
             "spec.egress[0].protocols[0].icmp: unknown field"),
            (json!({"tier": "Admin", "priority": 1, "subject": ns(), "ingress": [{"action": "Deny", "from": [{"networks": ["10.0.0.0/8"]}]}]}),
             "spec.ingress[0].from[0].networks: unknown field"),
        ];
        for (spec, want) in cases {
            let got = check_upstream(spec.clone());
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{spec}: {got:#?}\n  want {want}"
            );
        }
    }

    #[test]
    fn upstream_cel_rules() {
        let rule =
            |r: Value| json!({"tier": "Admin", "priority": 1, "subject": ns(), "egress": [r]});
        let named = json!([{"destinationNamedPort": "http"}]);
        for peer in [
            json!({"networks": ["10.0.0.0/8"]}),
            json!({"nodes": {}}),
            json!({"domainNames": ["a.com"]}),
        ] {
            let got = check_upstream(rule(json!({"action": "Accept",
                "to": [{"namespaces": {}}, peer], "protocols": named})));
            assert_eq!(
                got,
                ["spec.egress[0]: Invalid value: \"object\": networks/nodes/domainNames peer cannot be set with namedPorts since there are no namedPorts for networks/nodes/domainNames"],
            );
        }
        let range = |start: i64, end: i64| {
            rule(json!({"action": "Deny", "to": [{"namespaces": {}}],
                "protocols": [{"tcp": {"destinationPort": {"range": {"start": start, "end": end}}}}]}))
        };
        assert_eq!(
            check_upstream(range(80, 80)),
            ["spec.egress[0].protocols[0].tcp.destinationPort.range: Invalid value: \"object\": Start port must be less than End port"]
        );
        assert!(check_upstream(range(80, 81)).is_empty());
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "010.0.0.0/8",
            "10.0.0.0/08",
            "::ffff:1.2.3.4/120",
            "x/8",
            "10.0.0.0/+8",
        ] {
            let got = check_upstream(rule(json!({"action": "Deny", "to": [{"networks": [bad]}]})));
            assert_eq!(
                got,
                ["spec.egress[0].to[0].networks[0]: Invalid value: \"string\": Invalid CIDR format provided"],
                "{bad}"
            );
        }
        // A blocking schema error: the CEL rules are not run, and one error
        // says so.
        let got = check_upstream(json!({"tier": "Top", "priority": 1, "subject": ns(),
            "egress": [{"action": "Deny", "to": [{"networks": ["x"]}]}]}));
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(got[1].starts_with("Invalid value: null: some validation rules were not checked"));
    }

    #[test]
    fn aws_objects_its_crd_admits_pass() {
        let ok = [
            json!({"tier": "Admin", "priority": 0,
                   "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "a"}}}},
                   "ingress": [{"action": "Pass", "from": [{"namespaces": {}}],
                                "ports": [{"portNumber": {"port": 80}}, {"portNumber": {"protocol": "UDP", "port": 53}},
                                          {"portRange": {"start": 1000, "end": 2000}}, {"namedPort": "http"},
                                          // No "exactly one" and no protocol enum in AWS's CRD.
                                          {}, {"portNumber": {"protocol": "ICMP", "port": 1}, "namedPort": "x"}]}],
                   "egress": [{"action": "Accept", "to": [{"domainNames": ["*.example.com"]}, {"networks": ["not a cidr"]}]}]}),
            // A spec is optional there.
            Value::Null,
        ];
        for spec in ok {
            assert_eq!(check_aws(spec.clone()), Vec::<String>::new(), "{spec}");
        }
        // 100 rules, 100 peers.
        let peers = Value::Array(vec![json!({"namespaces": {}}); 100]);
        let rules = Value::Array(vec![json!({"action": "Deny", "from": peers}); 100]);
        assert!(check_aws(
            json!({"tier": "Admin", "priority": 1, "subject": ns(), "ingress": rules})
        )
        .is_empty());
    }

    #[test]
    fn aws_refusals_and_cel_rules() {
        let rule =
            |r: Value| json!({"tier": "Admin", "priority": 1, "subject": ns(), "egress": [r]});
        let cases = [
            (json!({"tier": "Admin", "priority": 1, "subject": {"pods": {"podSelector": {}}}}),
             "spec.subject.pods.namespaceSelector: Required value"),
            (json!({"tier": "Admin", "priority": 1, "subject": ns(),
                    "ingress": [{"action": "Deny", "from": [{"pods": {"podSelector": {}}}]}]}),
             "spec.ingress[0].from[0].pods.namespaceSelector: Required value"),
            (json!({"priority": 1, "subject": ns()}), "spec.tier: Required value"),
            (json!({"tier": "Admin", "priority": 1, "subject": ns(),
                    "egress": Value::Array(vec![json!({"action": "Deny", "to": [{"namespaces": {}}]}); 101])}),
             "spec.egress: Too many: 101: must have at most 100 items"),
            (rule(json!({"action": "Deny", "to": [{"nodes": {}}]})), "spec.egress[0].to[0].nodes: unknown field"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "protocols": []})),
             "spec.egress[0].protocols: unknown field"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "ports": [{"portNumber": {"port": 0}}]})),
             "spec.egress[0].ports[0].portNumber.port: Invalid value: 0"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}], "ports": [{"portRange": {"start": 9, "end": 9}}]})),
             "spec.egress[0].ports[0].portRange: Invalid value: \"object\": Start port must be less than End port"),
            (rule(json!({"action": "Deny", "to": [{"networks": ["0000:0000:0000:0000:0000:0000:0000:00000/128"]}]})),
             "spec.egress[0].to[0].networks[0]: Too long"),
            (rule(json!({"action": "Pass", "to": [{"domainNames": ["a.com"]}]})),
             "spec.egress[0]: Invalid value: \"object\": domainNames peer can only be used with Accept action"),
            (rule(json!({"action": "Deny", "to": [{"namespaces": {}}, {"domainNames": ["a.com"]}]})),
             "spec.egress[0]: Invalid value: \"object\": domainNames peer can only be used with Accept action"),
        ];
        for (spec, want) in cases {
            let got = check_aws(spec.clone());
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "{spec}: {got:#?}\n  want {want}"
            );
        }
    }

    #[test]
    fn metadata_is_checked_as_for_any_object() {
        let v = json!({"apiVersion": "networking.k8s.aws/v1alpha1", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "Bad_Name"}, "spec": {"tier": "Admin", "priority": 1, "subject": ns()}});
        let got: Vec<String> = aws(v)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            got[0].starts_with("metadata.name: Invalid value: \"Bad_Name\""),
            "{got:?}"
        );
    }

    #[test]
    fn cidrs_as_the_cel_library_reads_them() {
        for ok in [
            "10.0.0.0/8",
            "10.0.0.1/8",
            "0.0.0.0/0",
            "::/0",
            "fd00::/8",
            "2001:db8::1/128",
        ] {
            assert!(is_cidr(ok), "{ok}");
        }
        for bad in [
            "",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "fd00::/129",
            "010.0.0.0/8",
            "10.0.0.0/08",
            "10.0.0.0/-1",
            "::ffff:10.0.0.0/104",
            "fe80::1%eth0/64",
        ] {
            assert!(!is_cidr(bad), "{bad}");
        }
    }
}
