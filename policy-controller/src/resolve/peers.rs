//! A rule's peers: address blocks (ipBlock, or every address when none is
//! listed) and the pods selectors pick (found through a [`PeerSelection`]:
//! by scanning, or through the engine's indexes). A new kind of peer (a
//! domain name, say) is a new [`PeerSpec`].

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use palisade_proto::v1::{IpPrefix, PeerBlock};

use super::objects::PodInfo;
use super::rules::{Path, RuleContext};
use super::selectors::{validate_selector, SelectorError};
use super::services::ServiceInfo;
use crate::cidr::{self, prefix, CidrError};

/// A peer of a rule: an address block, or pods (which named ports need).
pub(super) enum PeerSpec {
    Block(PeerBlock),
    Pods(Arc<Selected>),
}

/// The pods a selector peer selects, and their addresses as peer blocks,
/// computed once and shared by every rule that uses the same selector.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Selected {
    /// Sorted by namespace and name; host-network pods are never peers.
    pub pods: Vec<Arc<PodInfo>>,
    pub blocks: Vec<PeerBlock>,
}

impl Selected {
    pub fn new(pods: Vec<Arc<PodInfo>>) -> Self {
        let blocks = pods
            .iter()
            .flat_map(|p| p.ips.iter().map(|ip| block(IpPrefix::host(*ip), vec![])))
            .collect();
        Selected { pods, blocks }
    }
}

/// How rules find the pods their peers name: by scanning (the oracle) or
/// through the engine's indexes and caches.
pub(crate) trait PeerSelection {
    /// The pods a peer with a podSelector and/or namespaceSelector selects.
    fn select(
        &mut self,
        policy_ns: &str,
        peer: &NetworkPolicyPeer,
    ) -> Result<Arc<Selected>, SelectorError>;
    /// Every pod (not host-network) with a container port named `name`,
    /// sorted by namespace and name.
    fn with_port_name(&mut self, name: &str) -> Vec<Arc<PodInfo>>;
    /// The Services with a selector in `ns` that have a ClusterIP, sorted by
    /// name.
    fn services_in(&mut self, ns: &str) -> Arc<Vec<Arc<ServiceInfo>>>;
    /// Every Service without a selector that has a ClusterIP, sorted by
    /// namespace and name.
    fn selectorless_services(&mut self) -> Arc<Vec<Arc<ServiceInfo>>>;
    /// The addresses of the nodes `selector` selects (a ClusterNetworkPolicy
    /// `nodes` peer), sorted.
    fn node_addresses(
        &mut self,
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Vec<IpAddr>, SelectorError>;
}

impl RuleContext<'_> {
    pub(super) fn peers(
        &mut self,
        field: &dyn std::fmt::Display,
        key: &'static str,
        peers: Option<&[NetworkPolicyPeer]>,
    ) -> Vec<PeerSpec> {
        let peers = peers.unwrap_or_default();
        if peers.is_empty() {
            // No peers listed: every address, in both families.
            return vec![
                PeerSpec::Block(block(prefix("0.0.0.0/0".parse().unwrap()), vec![])),
                PeerSpec::Block(block(prefix("::/0".parse().unwrap()), vec![])),
            ];
        }
        let mut out = Vec::new();
        for (i, peer) in peers.iter().enumerate() {
            let f = Path {
                parent: field,
                key,
                index: i,
            };
            if let Some(ip_block) = &peer.ip_block {
                match parse_block(
                    &ip_block.cidr,
                    ip_block.except.as_deref().unwrap_or_default(),
                ) {
                    Ok(b) => out.push(PeerSpec::Block(b)),
                    Err(e) => self.error(&format!("{f}.ipBlock"), e),
                }
                continue;
            }
            if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
                self.error(
                    &f,
                    "peer has none of podSelector, namespaceSelector, ipBlock",
                );
                continue;
            }
            // Checked here, whatever pods exist, so that an invalid selector
            // is reported the same way by every selection strategy.
            if let Some(Err(e)) = peer.namespace_selector.as_ref().map(validate_selector) {
                self.error(&f, SelectorError::new("namespaceSelector", e));
                continue;
            }
            if let Some(Err(e)) = peer.pod_selector.as_ref().map(validate_selector) {
                self.error(&f, SelectorError::new("podSelector", e));
                continue;
            }
            match self.selection.select(self.policy_ns, peer) {
                Ok(selected) => out.push(PeerSpec::Pods(selected)),
                Err(e) => self.error(&f, e),
            }
        }
        out
    }
}

pub(super) fn peer_blocks(peers: &[PeerSpec]) -> Vec<PeerBlock> {
    let mut out = Vec::new();
    for peer in peers {
        match peer {
            PeerSpec::Block(b) => out.push(b.clone()),
            PeerSpec::Pods(selected) => out.extend_from_slice(&selected.blocks),
        }
    }
    out
}

pub(super) fn block_contains(b: &PeerBlock, ip: IpAddr) -> bool {
    let net = |p: &IpPrefix| -> Option<IpNet> {
        let addr = match p.addr.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(p.addr.as_slice()).ok()?),
            16 => IpAddr::from(<[u8; 16]>::try_from(p.addr.as_slice()).ok()?),
            _ => return None,
        };
        IpNet::new(addr, p.prefix_len as u8).ok()
    };
    b.cidr
        .as_ref()
        .and_then(net)
        .is_some_and(|c| c.contains(&ip))
        && !b.except.iter().filter_map(net).any(|e| e.contains(&ip))
}

pub(crate) fn block(cidr: IpPrefix, except: Vec<IpPrefix>) -> PeerBlock {
    PeerBlock {
        cidr: Some(cidr),
        except,
    }
}

/// Why an ipBlock was left out of its rule.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error("except: {0}")]
    Except(#[source] CidrError),
    #[error("except {except:?} is not inside cidr {cidr:?}")]
    ExceptOutside { except: String, cidr: String },
}

/// Parses an ipBlock. Host bits set in a CIDR are an error, as the API server
/// would reject them; an except must lie inside the CIDR.
pub fn parse_block(cidr: &str, except: &[String]) -> Result<PeerBlock, BlockError> {
    let net = cidr::parse_strict(cidr)?;
    let mut out = Vec::new();
    for e in except {
        let ex = cidr::parse_strict(e).map_err(BlockError::Except)?;
        if !net.contains(&ex) {
            return Err(BlockError::ExceptOutside {
                except: e.clone(),
                cidr: cidr.to_string(),
            });
        }
        out.push(prefix(ex));
    }
    Ok(block(prefix(net), out))
}
