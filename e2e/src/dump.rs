//! Checks on what the node shows: the enforcer's state dump and the
//! kernel's view of the TC hooks. A scenario step lists them under `dump:`;
//! the lab polls each until it holds or its deadline passes, because the
//! things they watch (netlink cleanup, a pod-up deadline) settle on their own
//! time.
//!
//! The judgements here are pure; gathering the dump and querying the kernel
//! is the lab's job.

use std::fmt;

use anyhow::{anyhow, bail, Result};
use palisade_proto::v1::GetEnforcerStateResponse;
use serde::Deserialize;

use crate::scenario::PodName;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpCheck {
    /// The dump lists the pod, with an empty error (`true`: its policy is in
    /// the datapath) or with an error saying why not (`false`: the pod is
    /// visibly unprotected).
    Realized { pod: PodName, realized: bool },
    /// The pod's host veth has Palisade programs on it in the kernel and is
    /// in the dump's interfaces.
    VethAttached(PodName),
    /// The pod's host veth is gone from the kernel and from the dump.
    VethGone(PodName),
    /// No TC program at all on the lab's bridge device (bridge chains only):
    /// Palisade must attach to pod veths, never to the bridge.
    BridgeClean,
}

impl fmt::Display for DumpCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Realized { pod, realized } => write!(f, "pod {pod} realized: {realized}"),
            Self::VethAttached(p) => write!(f, "the host veth of {p} is enforced"),
            Self::VethGone(p) => write!(f, "the host veth of {p} is gone"),
            Self::BridgeClean => f.write_str("nothing is attached to the bridge"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDumpCheck {
    pod: Option<String>,
    realized: Option<bool>,
    veth: Option<String>,
    bridge: Option<String>,
}

pub(crate) fn parse(raw: RawDumpCheck) -> Result<DumpCheck> {
    if let Some(b) = raw.bridge {
        if raw.pod.is_some() || raw.realized.is_some() || raw.veth.is_some() {
            bail!("bridge: a bridge check takes no pod, realized or veth");
        }
        return match b.as_str() {
            "clean" => Ok(DumpCheck::BridgeClean),
            other => bail!("bridge: expected clean, got {other:?}"),
        };
    }
    let pod = raw
        .pod
        .ok_or_else(|| anyhow!("pod: missing (or give bridge: clean)"))?;
    let pod = PodName::parse(&pod).map_err(|e| anyhow!("pod: {e}"))?;
    match (raw.realized, raw.veth.as_deref()) {
        (Some(realized), None) => Ok(DumpCheck::Realized { pod, realized }),
        (None, Some("attached")) => Ok(DumpCheck::VethAttached(pod)),
        (None, Some("gone")) => Ok(DumpCheck::VethGone(pod)),
        (None, Some(other)) => bail!("veth: expected attached or gone, got {other:?}"),
        (None, None) => bail!("expected realized: true|false or veth: attached|gone"),
        (Some(_), Some(_)) => bail!("give either realized or veth, not both"),
    }
}

impl DumpCheck {
    /// The pod this check is about, for reference checking.
    pub fn pod(&self) -> Option<&PodName> {
        match self {
            Self::Realized { pod, .. } | Self::VethAttached(pod) | Self::VethGone(pod) => Some(pod),
            Self::BridgeClean => None,
        }
    }
}

/// Judges a realized check against the dump.
pub fn judge_realized(
    state: &GetEnforcerStateResponse,
    pod: &PodName,
    realized: bool,
) -> Result<(), String> {
    let listed = state
        .state
        .as_ref()
        .map(|s| s.pods.as_slice())
        .unwrap_or_default()
        .iter()
        .find(|p| {
            p.pod
                .as_ref()
                .is_some_and(|r| r.namespace == pod.namespace && r.name == pod.name)
        })
        .ok_or_else(|| format!("the enforcer's dump does not list pod {pod}"))?;
    match (realized, listed.error.is_empty()) {
        (true, true) | (false, false) => Ok(()),
        (true, false) => Err(format!("pod {pod} is not realized: {:?}", listed.error)),
        (false, true) => Err(format!(
            "pod {pod} is shown as realized (no error), but its policy cannot be known yet"
        )),
    }
}

/// Whether the dump lists an interface of that name.
pub fn dump_lists_interface(state: &GetEnforcerStateResponse, name: &str) -> bool {
    state.interfaces.iter().any(|i| i.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_proto::v1::{InterfaceState, NodeState, PodRef, PodState};

    fn check(yaml: &str) -> Result<DumpCheck> {
        parse(serde_yaml::from_str(yaml)?)
    }

    #[test]
    fn parses_and_names_errors() {
        assert_eq!(check("{bridge: clean}").unwrap(), DumpCheck::BridgeClean);
        assert_eq!(
            check("{pod: x/a, realized: false}").unwrap(),
            DumpCheck::Realized {
                pod: PodName::parse("x/a").unwrap(),
                realized: false
            }
        );
        assert_eq!(
            check("{pod: x/a, veth: gone}").unwrap(),
            DumpCheck::VethGone(PodName::parse("x/a").unwrap())
        );
        let e = |y: &str| format!("{:#}", check(y).unwrap_err());
        assert!(e("{pod: x/a, veth: maybe}").contains("veth"));
        assert!(e("{pod: x/a}").contains("realized"));
        assert!(e("{bridge: dirty}").contains("bridge"));
        assert!(e("{realized: true}").contains("pod"));
        assert!(e("{pod: x/a, colour: red}").contains("colour"));
    }

    fn state(error: &str) -> GetEnforcerStateResponse {
        GetEnforcerStateResponse {
            state: Some(NodeState {
                pods: vec![PodState {
                    pod: Some(PodRef {
                        namespace: "x".into(),
                        name: "a".into(),
                    }),
                    error: error.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            interfaces: vec![InterfaceState {
                name: "veth1".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn judges_realization_both_ways() {
        let a = PodName::parse("x/a").unwrap();
        let b = PodName::parse("x/b").unwrap();
        assert!(judge_realized(&state(""), &a, true).is_ok());
        assert!(judge_realized(&state(""), &a, false).is_err());
        assert!(judge_realized(&state("policy not known"), &a, false).is_ok());
        assert!(judge_realized(&state("policy not known"), &a, true).is_err());
        assert!(judge_realized(&state(""), &b, true)
            .unwrap_err()
            .contains("does not list"));
        assert!(dump_lists_interface(&state(""), "veth1"));
        assert!(!dump_lists_interface(&state(""), "veth2"));
    }
}
