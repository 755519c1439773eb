//! AWS's ApplicationNetworkPolicy (`networking.k8s.aws/v1alpha1`): a
//! NetworkPolicy whose egress peers may also be `domainNames` (exclusive of
//! the other peer kinds). It is a policy of the NetworkPolicy tier: it
//! isolates the pods it selects and its rules are unioned with the
//! NetworkPolicies' (the AWS controller resolves both into PolicyEndpoints
//! that the node agent unions).
//!
//! Palisade reads one as the NetworkPolicy it is ([`lower`]), so that every
//! later step (the engine's indexes, the full computation, the reference
//! model, explain, staging) has one kind of namespaced policy to handle:
//!
//! - the lowered policy's name is [`NAME_PREFIX`] and the name, which no
//!   NetworkPolicy can have (`:` and capitals are not in a DNS subdomain):
//!   a NetworkPolicy and an ApplicationNetworkPolicy of the same name stay
//!   two policies;
//! - its `domainNames` peers leave `to` and go, by rule index, into the
//!   annotation [`DOMAIN_NAMES_ANNOTATION`], which is read back
//!   ([`domain_names`]) only for a lowered name, so no NetworkPolicy can
//!   carry names in by annotation;
//! - a rule left with no peer by address is given [`never_peer`], a valid
//!   peer that selects no pod: an empty `to` would mean every destination.
//!   Everything that reads only addresses (the model, explain) sees a rule
//!   by name as matching nothing, which is what it can know: only the node
//!   knows what a pod resolved.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use serde::{Deserialize, Serialize};

pub const KIND: &str = "ApplicationNetworkPolicy";
/// The lowered NetworkPolicy's name is this and the policy's name.
pub const NAME_PREFIX: &str = "ApplicationNetworkPolicy:";
/// On a lowered policy: `{"<egress rule index>": ["pattern", ...]}`.
pub const DOMAIN_NAMES_ANNOTATION: &str = "palisade.io/domain-names";
/// The label key of [`never_peer`]'s selector.
const NEVER_KEY: &str = "palisade.io/domain-names-only";

/// As the API group serves it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationNetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Spec>,
    /// Written by the AWS controller; never read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Required by the CRD; absent reads as the empty selector, as a
    /// NetworkPolicy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<NetworkPolicyIngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<EgressRule>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<NetworkPolicyPort>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<Peer>>,
}

/// A NetworkPolicyPeer, or `domainNames` alone.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IPBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<Vec<String>>,
}

impl Peer {
    /// The peer by address, when it is one. A peer with `domainNames` is
    /// one by name only (the CRD refuses both; one that got past it is
    /// read as its names, never as "every pod" for want of a selector).
    fn by_address(&self) -> Option<NetworkPolicyPeer> {
        self.domain_names.is_none().then(|| NetworkPolicyPeer {
            pod_selector: self.pod_selector.clone(),
            namespace_selector: self.namespace_selector.clone(),
            ip_block: self.ip_block.clone(),
        })
    }
}

/// The NetworkPolicy an ApplicationNetworkPolicy is (see the module's
/// documentation). Its metadata keeps the namespace, the annotations and
/// the labels; the name is prefixed.
pub fn lower(anp: &ApplicationNetworkPolicy) -> NetworkPolicy {
    let mut metadata = anp.metadata.clone();
    metadata.name = Some(lowered_name(anp.metadata.name.as_deref().unwrap_or("")));
    let spec = anp.spec.clone().unwrap_or_default();
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let egress = spec.egress.map(|rules| {
        rules
            .into_iter()
            .enumerate()
            .map(|(i, rule)| {
                let Some(peers) = rule.to else {
                    return NetworkPolicyEgressRule {
                        ports: rule.ports,
                        to: None,
                    };
                };
                let mut to: Vec<NetworkPolicyPeer> =
                    peers.iter().filter_map(Peer::by_address).collect();
                let by_name: Vec<String> = peers
                    .iter()
                    .flat_map(|p| p.domain_names.iter().flatten())
                    .cloned()
                    .collect();
                if to.is_empty() && !peers.is_empty() {
                    // Every peer was by name (or an empty `domainNames`,
                    // which the CRD refuses): nothing by address.
                    to.push(never_peer());
                }
                if !by_name.is_empty() {
                    names.insert(i.to_string(), by_name);
                }
                NetworkPolicyEgressRule {
                    ports: rule.ports,
                    to: Some(to),
                }
            })
            .collect()
    });
    // The annotation is only ever this function's: one the object brought
    // is replaced, or removed when the policy has no names.
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(DOMAIN_NAMES_ANNOTATION);
    if !names.is_empty() {
        annotations.insert(
            DOMAIN_NAMES_ANNOTATION.to_string(),
            serde_json::to_string(&names).expect("a map of strings serializes"),
        );
    }
    if annotations.is_empty() {
        metadata.annotations = None;
    }
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(spec.pod_selector.unwrap_or_default()),
            policy_types: spec.policy_types,
            ingress: spec.ingress,
            egress,
        }),
    }
}

/// The name an ApplicationNetworkPolicy's lowered NetworkPolicy has.
pub fn lowered_name(name: &str) -> String {
    format!("{NAME_PREFIX}{name}")
}

/// A namespaced policy's kind and own name, from the name the lowered
/// policy carries: (`ApplicationNetworkPolicy`, `x`) for
/// `ApplicationNetworkPolicy:x`, (`NetworkPolicy`, `x`) for `x`.
pub fn kind_and_name(name: &str) -> (&'static str, &str) {
    match name.strip_prefix(NAME_PREFIX) {
        Some(own) => (KIND, own),
        None => ("NetworkPolicy", name),
    }
}

/// A lowered policy's names by name, by egress rule index, as written
/// (the resolver parses them). Empty for a NetworkPolicy, whatever its
/// annotations say.
pub fn domain_names(np: &NetworkPolicy) -> BTreeMap<usize, Vec<String>> {
    let lowered = np
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with(NAME_PREFIX));
    let written = np
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DOMAIN_NAMES_ANNOTATION));
    let (true, Some(written)) = (lowered, written) else {
        return BTreeMap::new();
    };
    // Only `lower` writes it; a map it cannot read gives no names (they
    // then match nothing: closed).
    let by_index: BTreeMap<String, Vec<String>> = serde_json::from_str(written).unwrap_or_default();
    by_index
        .into_iter()
        .filter_map(|(i, names)| Some((i.parse().ok()?, names)))
        .collect()
}

/// A peer that selects no pod (a label both present and absent): the
/// address part of a rule whose every peer is by name.
pub fn never_peer() -> NetworkPolicyPeer {
    let requirement = |operator: &str| LabelSelectorRequirement {
        key: NEVER_KEY.to_string(),
        operator: operator.to_string(),
        values: None,
    };
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_expressions: Some(vec![requirement("Exists"), requirement("DoesNotExist")]),
            match_labels: None,
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn anp(spec: serde_json::Value) -> ApplicationNetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.aws/v1alpha1", "kind": KIND,
            "metadata": {"name": "p", "namespace": "x", "annotations": {"palisade.io/audit": "true"}},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn names_leave_the_peers_and_a_rule_by_name_alone_matches_no_address() {
        let np = lower(&anp(json!({
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}, {"domainNames": ["api.example.com"]}],
                 "ports": [{"port": 443}]},
                {"to": [{"domainNames": ["*.example.org", "b.example.net"]}]},
                {"ports": [{"port": 53, "protocol": "UDP"}]},
                {"to": []},
            ],
        })));
        assert_eq!(
            np.metadata.name.as_deref(),
            Some("ApplicationNetworkPolicy:p")
        );
        assert_eq!(np.metadata.namespace.as_deref(), Some("x"));
        let egress = np.spec.as_ref().unwrap().egress.as_ref().unwrap();
        assert_eq!(egress[0].to.as_ref().unwrap().len(), 1);
        assert!(egress[0].to.as_ref().unwrap()[0].ip_block.is_some());
        assert_eq!(egress[1].to.as_deref(), Some(&[never_peer()][..]));
        assert_eq!(egress[2].to, None, "no `to`: every destination, as written");
        assert_eq!(egress[3].to.as_deref(), Some(&[][..]), "as written");
        assert_eq!(
            domain_names(&np),
            BTreeMap::from([
                (0, vec!["api.example.com".to_string()]),
                (
                    1,
                    vec!["*.example.org".to_string(), "b.example.net".to_string()]
                ),
            ])
        );
        let annotations = np.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["palisade.io/audit"], "true", "staging is kept");
    }

    #[test]
    fn only_a_lowered_policy_has_names() {
        let mut np = lower(&anp(
            json!({"egress": [{"to": [{"domainNames": ["a.example"]}]}]}),
        ));
        assert_eq!(domain_names(&np).len(), 1);
        np.metadata.name = Some("p".into());
        assert!(
            domain_names(&np).is_empty(),
            "a NetworkPolicy cannot bring names in"
        );
        // A policy that brought the annotation itself has it replaced.
        let mut brought = anp(json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}));
        brought.metadata.annotations = Some(BTreeMap::from([(
            DOMAIN_NAMES_ANNOTATION.to_string(),
            r#"{"0":["evil.example"]}"#.to_string(),
        )]));
        let np = lower(&brought);
        assert!(domain_names(&np).is_empty());
        assert_eq!(np.metadata.annotations, None);
    }

    #[test]
    fn a_peer_with_names_and_a_selector_is_read_by_its_names_only() {
        let np = lower(&anp(json!({"egress": [{"to": [
            {"podSelector": {}, "domainNames": ["a.example"]},
        ]}]})));
        let to = np.spec.unwrap().egress.unwrap()[0].to.clone().unwrap();
        assert_eq!(to, vec![never_peer()], "never every pod of the namespace");
    }

    #[test]
    fn kinds_and_names() {
        assert_eq!(kind_and_name("ApplicationNetworkPolicy:p"), (KIND, "p"));
        assert_eq!(kind_and_name("p"), ("NetworkPolicy", "p"));
        let spec = lower(&ApplicationNetworkPolicy::default()).spec.unwrap();
        assert_eq!(spec.pod_selector, Some(LabelSelector::default()));
    }
}
