//! A node's plan as the engine and the hub hold it: every pod's entry kept
//! in its wire encoding, not as message structs.
//!
//! Decoded, a pod's policy is a tree of small allocations (every peer
//! address is a struct with its own byte vector), several kilobytes per pod
//! for a few hundred bytes on the wire; the controller holds the plan of
//! every node, connected or not, so that difference is most of its memory
//! at cluster scale. Encoded entries also compare by bytes, which is all the
//! engine needs to tell whether a node's plan changed; they are decoded only
//! for a subscriber (a snapshot, or the upserts of a delta).
//!
//! An entry is two parts: the pod's own fields (its reference and
//! addresses) and the rest (rules and policy names). The rest is the same
//! for every pod of a namespace with the same labels and named ports, so it
//! is shared between them. Because the fields of `PodPolicy` are numbered
//! in that order, the two parts concatenated are exactly the encoding of
//! the whole message.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::net::IpAddr;

use palisade_proto::v1::{PodPolicy, PodRef};
use prost::Message;

use crate::keys::PodKey;
use crate::resolve::NodePlan;

/// One pod's entry.
#[derive(Clone, Debug)]
pub struct Entry {
    /// `pod` and `pod_ips`, encoded.
    own: Box<[u8]>,
    /// `ingress`, `egress` and `policies`, encoded; shared by pods that
    /// resolved alike.
    body: Arc<[u8]>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.own == other.own && (Arc::ptr_eq(&self.body, &other.body) || self.body == other.body)
    }
}

impl Eq for Entry {}

impl Entry {
    /// Splits a pod's policy into its own fields and a body to share.
    pub fn new(mut policy: PodPolicy) -> Entry {
        let own = PodPolicy {
            pod: policy.pod.take(),
            pod_ips: std::mem::take(&mut policy.pod_ips),
            ..Default::default()
        };
        Entry {
            own: encode(&own).into(),
            body: encode(&policy).into(),
        }
    }

    /// The entry of another pod that resolved like `self`'s pod: its own
    /// reference and addresses, `self`'s body.
    pub fn sibling(&self, namespace: &str, name: &str, ips: &[IpAddr]) -> Entry {
        let own = PodPolicy {
            pod: Some(PodRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            pod_ips: ips
                .iter()
                .map(|ip| palisade_proto::v1::IpPrefix::host(*ip))
                .collect(),
            ..Default::default()
        };
        Entry {
            own: encode(&own).into(),
            body: self.body.clone(),
        }
    }

    pub fn decode(&self) -> PodPolicy {
        // The two parts are fields of one message: decoding one and merging
        // the other in gives the whole, without copying them together first
        // (a delta decodes an entry for every pod it upserts).
        let mut policy = PodPolicy::decode(&*self.body).expect("entries hold what prost encoded");
        policy
            .merge(&*self.own)
            .expect("entries hold what prost encoded");
        policy
    }

    /// Bytes this entry holds on its own (the body counted in full).
    pub fn encoded_len(&self) -> usize {
        self.own.len() + self.body.len()
    }
}

fn encode(m: &PodPolicy) -> Vec<u8> {
    m.encode_to_vec()
}

/// Every pod's entry of one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Keys shared with the engine's own records of the pod.
    pub pods: BTreeMap<Arc<PodKey>, Entry>,
}

impl Plan {
    /// Equality that skips the comparison of shared bodies.
    pub fn same_as(&self, other: &Plan) -> bool {
        self.pods == other.pods
    }

    /// The plan as messages, in the oracle's shape.
    pub fn decode(&self) -> NodePlan {
        NodePlan {
            pods: self
                .pods
                .iter()
                .map(|(k, e)| (PodKey::clone(k), Arc::new(e.decode())))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_proto::v1::{DirectionPolicy, IpPrefix, PeerBlock, Rule};

    fn policy(name: &str, addr: u8) -> PodPolicy {
        PodPolicy {
            pod: Some(PodRef {
                namespace: "ns".into(),
                name: name.into(),
            }),
            pod_ips: vec![IpPrefix {
                addr: vec![10, 0, 0, addr],
                prefix_len: 32,
            }],
            ingress: Some(DirectionPolicy {
                rules: vec![Rule {
                    peers: vec![PeerBlock {
                        cidr: Some(IpPrefix {
                            addr: vec![10, 0, 0, 9],
                            prefix_len: 32,
                        }),
                        except: vec![],
                    }],
                    ports: vec![],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            egress: None,
            policies: vec!["ns/a".into()],
            ..Default::default()
        }
    }

    #[test]
    fn parts_concatenated_are_the_whole_encoding() {
        let p = policy("a", 1);
        let e = Entry::new(p.clone());
        let mut whole = e.own.to_vec();
        whole.extend_from_slice(&e.body);
        assert_eq!(whole, p.encode_to_vec());
        assert_eq!(e.decode(), p);
    }

    #[test]
    fn a_sibling_shares_the_body_and_keeps_its_own_fields() {
        let a = Entry::new(policy("a", 1));
        let b_policy = policy("b", 2);
        let b = a.sibling("ns", "b", &["10.0.0.2".parse().unwrap()]);
        assert!(Arc::ptr_eq(&a.body, &b.body));
        assert_eq!(b.decode(), b_policy);
        assert_ne!(a, b);
        assert_eq!(b, Entry::new(b_policy), "equal by content, shared or not");
    }
}
