//! Explain: whether the controller's current view of the cluster allows one
//! flow, and which policy and rule decided each direction, computed by the
//! reference model (palisade-model), not by the resolver, so that it is an
//! independent reading of the objects.
//!
//! A side is named as "namespace/name" (a pod, which must be known and hold
//! an address) or as an IP address: the address of a known pod means that
//! pod; any other address is an external peer, which only ipBlocks can
//! match and whose own policies nobody knows (its direction is left out).
//! A Service's ClusterIP is refused: which backend the kernel picks is not
//! known here, so ask about a backend pod.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use palisade_model::cluster::ClusterState;
use palisade_model::explain::{self as model, Decided, Decision, Explanation, Peer, Query};
use palisade_model::tiers::Mode;
use palisade_model::verdict::{Direction, Endpoint};
use palisade_proto::v1::{DirectionExplanation, ExplainRequest, ExplainResponse};

/// Why a request cannot be explained; each names the problem.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
}

/// One side of the flow as understood.
enum Side<'a> {
    Pod(&'a Pod, IpAddr),
    External(IpAddr),
}

impl Side<'_> {
    fn describe(&self) -> String {
        match self {
            Side::Pod(pod, ip) => format!("pod {} ({ip})", pod_name(pod)),
            Side::External(ip) => format!("external {ip}"),
        }
    }
    fn peer(&self) -> Peer<'_> {
        match self {
            Side::Pod(pod, ip) => Peer::Pod(Endpoint { pod, ip: *ip }),
            Side::External(ip) => Peer::External(*ip),
        }
    }
}

pub fn explain(
    cluster: &ClusterState,
    req: &ExplainRequest,
) -> Result<ExplainResponse, ExplainError> {
    let protocol = match req.protocol.to_ascii_uppercase().as_str() {
        "" | "TCP" => "TCP",
        "UDP" => "UDP",
        "SCTP" => "SCTP",
        other => {
            return Err(ExplainError::Invalid(format!(
                "protocol {other:?}: expected TCP, UDP or SCTP"
            )))
        }
    };
    let mode = match req.mode.to_ascii_lowercase().as_str() {
        "" | "standard" => Mode::Standard,
        "strict" => Mode::Strict,
        other => {
            return Err(ExplainError::Invalid(format!(
                "mode {other:?}: expected standard or strict"
            )))
        }
    };
    let port = u16::try_from(req.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ExplainError::Invalid(format!("port {}: expected 1..=65535", req.port)))?;
    let src = side(cluster, "source", &req.source)?;
    let dst = side(cluster, "destination", &req.destination)?;
    if matches!((&src, &dst), (Side::External(_), Side::External(_))) {
        return Err(ExplainError::Invalid(
            "neither source nor destination is a pod: no NetworkPolicy applies".into(),
        ));
    }
    let server = match dst {
        Side::Pod(pod, _) => Some(pod),
        Side::External(_) => None,
    };
    let egress = match src {
        Side::Pod(pod, _) => Some(direction(
            pod,
            model::explain(
                cluster,
                mode,
                &Query {
                    subject: pod,
                    peer: dst.peer(),
                    server,
                    protocol,
                    port,
                    dir: Direction::Egress,
                },
            ),
        )),
        Side::External(_) => None,
    };
    let ingress = server.map(|pod| {
        direction(
            pod,
            model::explain(
                cluster,
                mode,
                &Query {
                    subject: pod,
                    peer: src.peer(),
                    server,
                    protocol,
                    port,
                    dir: Direction::Ingress,
                },
            ),
        )
    });
    Ok(ExplainResponse {
        allowed: egress.iter().chain(ingress.iter()).all(|d| d.allowed),
        egress,
        ingress,
        source: src.describe(),
        destination: dst.describe(),
        source_marker: cluster.marker.clone(),
    })
}

fn side<'a>(cluster: &'a ClusterState, what: &str, text: &str) -> Result<Side<'a>, ExplainError> {
    let text = text.trim();
    if let Some((ns, name)) = text.split_once('/') {
        let pod = cluster
            .pods
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") == ns
                    && p.metadata.name.as_deref() == Some(name)
            })
            .ok_or_else(|| {
                ExplainError::NotFound(format!(
                    "{what} {text}: no such pod in the controller's view"
                ))
            })?;
        let ip = pod_ips(pod).into_iter().next().ok_or_else(|| {
            ExplainError::NotFound(format!("{what} {text}: the pod has no address yet"))
        })?;
        return Ok(Side::Pod(pod, ip));
    }
    let ip: IpAddr = text.parse().map_err(|_| {
        ExplainError::Invalid(format!(
            "{what} {text:?}: expected namespace/name of a pod, or an IP address"
        ))
    })?;
    let holders: Vec<&Pod> = cluster
        .pods
        .iter()
        .filter(|p| pod_ips(p).contains(&ip))
        .collect();
    match holders.as_slice() {
        [pod] => return Ok(Side::Pod(pod, ip)),
        [] => {}
        many => {
            let names: Vec<String> = many.iter().map(|p| pod_name(p)).collect();
            return Err(ExplainError::Invalid(format!(
                "{what} {ip} is held by several pods ({}): name one",
                names.join(", ")
            )));
        }
    }
    if let Some(svc) = cluster.services.iter().find(|s| {
        s.spec.iter().any(|spec| {
            spec.cluster_ip
                .iter()
                .chain(spec.cluster_ips.iter().flatten())
                .any(|c| c.parse() == Ok(ip))
        })
    }) {
        return Err(ExplainError::Invalid(format!(
            "{what} {ip} is the ClusterIP of Service {}/{}: explain a flow to one of its backend pods",
            svc.metadata.namespace.as_deref().unwrap_or("default"),
            svc.metadata.name.as_deref().unwrap_or_default()
        )));
    }
    Ok(Side::External(ip))
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return vec![];
    };
    if matches!(status.phase.as_deref(), Some("Succeeded") | Some("Failed")) {
        return vec![];
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ip
        .iter()
        .chain(status.pod_ips.iter().flatten().map(|i| &i.ip))
        .filter_map(|i| i.parse().ok())
        .collect();
    ips.dedup();
    ips
}

/// A tier rule met on the way, as `passed` and `by_name` list it.
fn met(r: &palisade_model::explain::TierRule) -> String {
    format!(
        "{} tier, {} (priority {}): {}",
        r.tier.as_str(),
        r.policy,
        r.priority,
        r.description
    )
}

fn direction(pod: &Pod, e: Explanation) -> DirectionExplanation {
    let passed: Vec<String> = e.passed.iter().map(met).collect();
    let by_name: Vec<String> = e
        .by_name
        .iter()
        .map(met)
        .chain(
            e.by_name_network_policy
                .iter()
                .map(|r| format!("NetworkPolicy tier, {}: {}", r.policy, r.description)),
        )
        .collect();
    let allowed = e.allowed();
    let mut out = match e.decided {
        Decided::NetworkPolicy(d) => network_policy(pod, d),
        Decided::HostNetwork => DirectionExplanation {
            pod: pod_name(pod),
            allowed,
            reason: "a host-network pod: no policy applies to it".into(),
            ..Default::default()
        },
        Decided::OwnNode => DirectionExplanation {
            pod: pod_name(pod),
            allowed,
            reason: "traffic with the pod's own node is always allowed".into(),
            ..Default::default()
        },
        Decided::Rule(r) => DirectionExplanation {
            pod: pod_name(pod),
            allowed,
            reason: format!(
                "{} by a {} tier rule",
                if allowed { "accepted" } else { "denied" },
                r.tier.as_str()
            ),
            policy: r.policy,
            rule_index: r.rule as u32,
            rule: r.description,
            tier: r.tier.as_str().into(),
            priority: r.priority,
            rule_name: r.name,
            ..Default::default()
        },
        // The words operators know when nothing at all applies.
        Decided::Default { allowed: true } if passed.is_empty() => DirectionExplanation {
            pod: pod_name(pod),
            allowed,
            reason: "no policy isolates this pod".into(),
            ..Default::default()
        },
        Decided::Default { allowed } => DirectionExplanation {
            pod: pod_name(pod),
            allowed,
            reason: format!(
                "no tier decides and no NetworkPolicy isolates this pod: the default ({})",
                if allowed {
                    "standard mode: allowed"
                } else {
                    "strict mode: denied"
                }
            ),
            ..Default::default()
        },
    };
    out.passed = passed;
    out.by_name = by_name;
    out
}

/// A direction NetworkPolicy decided, as before tiers.
fn network_policy(pod: &Pod, decision: Decision) -> DirectionExplanation {
    let pod = pod_name(pod);
    match decision {
        Decision::NotIsolated => DirectionExplanation {
            pod,
            allowed: true,
            reason: "no policy isolates this pod".into(),
            ..Default::default()
        },
        Decision::Allowed(rule) => DirectionExplanation {
            pod,
            allowed: true,
            reason: "allowed by rule".into(),
            policy: rule.policy,
            rule_index: rule.rule as u32,
            rule: rule.description,
            ..Default::default()
        },
        Decision::Denied { isolated_by } => DirectionExplanation {
            pod,
            allowed: false,
            reason: "isolated, no rule allows".into(),
            isolated_by,
            ..Default::default()
        },
    }
}
