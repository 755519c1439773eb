//! The faults a scenario step can inject before its changes: processes
//! killed or started, a damaged checkpoint, a second enforcer, a broken
//! manifest source, a veth pulled without a CNI DEL.
//!
//! Parsing and the liveness bookkeeping (which process is up at each step)
//! are pure, so a scenario that kills a process twice or starts one that is
//! running is refused before any lab is built.

use std::fmt;

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use crate::scenario::PodName;

/// The only node name a scenario may give in `node:` (the lab has one node;
/// its real name is random per run).
pub const LAB_NODE: &str = "lab";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Controller,
    Enforcer,
}

impl Process {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Controller => "controller",
            Self::Enforcer => "enforcer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL; with `restart`, started again with the same flags and
    /// waited on until healthy. Without, it stays down until a `start`.
    Kill { process: Process, restart: bool },
    /// Starts a process that a `kill ... restart: false` left down.
    Start(Process),
    /// A second enforcer for the node, with the same pin root, state dir and
    /// socket, while the first runs (a DaemonSet surge rollout).
    SecondEnforcer,
    /// kill -9 the enforcer, truncate every file of its state dir (one to
    /// zero, the others to half their length), start it again.
    CorruptCheckpoint,
    /// Adds a manifest the controller cannot parse.
    BreakManifests,
    /// Removes it again.
    RepairManifests,
    /// Deletes the pod's host veth in the node (`ip link del`), with no
    /// CNI DEL: what a runtime crash or a manual cleanup leaves.
    Unplug(PodName),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kill { process, restart } => write!(
                f,
                "kill {}{}",
                process.as_str(),
                if *restart { "" } else { " (left down)" }
            ),
            Self::Start(p) => write!(f, "start {}", p.as_str()),
            Self::SecondEnforcer => f.write_str("start a second enforcer"),
            Self::CorruptCheckpoint => f.write_str("corrupt the enforcer checkpoint"),
            Self::BreakManifests => f.write_str("break the manifests"),
            Self::RepairManifests => f.write_str("repair the manifests"),
            Self::Unplug(p) => write!(f, "delete the host veth of {p} without a CNI DEL"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFault {
    kill: Option<String>,
    start: Option<String>,
    corrupt: Option<String>,
    #[serde(rename = "break")]
    break_: Option<String>,
    repair: Option<String>,
    unplug: Option<String>,
    restart: Option<bool>,
    node: Option<String>,
}

pub(crate) fn parse(raw: RawFault) -> Result<Fault> {
    if let Some(node) = &raw.node {
        if node != LAB_NODE {
            bail!("node: {node:?} is not a lab node (the lab has one node, {LAB_NODE:?})");
        }
    }
    let given: Vec<&str> = [
        ("kill", raw.kill.is_some()),
        ("start", raw.start.is_some()),
        ("corrupt", raw.corrupt.is_some()),
        ("break", raw.break_.is_some()),
        ("repair", raw.repair.is_some()),
        ("unplug", raw.unplug.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(k, _)| k)
    .collect();
    if given.len() != 1 {
        bail!(
            "expected exactly one of kill, start, corrupt, break, repair, unplug; got {}",
            if given.is_empty() {
                "none".to_string()
            } else {
                given.join(", ")
            }
        );
    }
    if raw.restart.is_some() && raw.kill.is_none() {
        bail!("restart: only a kill fault can say whether to restart");
    }
    let fault = if let Some(what) = raw.kill {
        let process = match what.as_str() {
            "controller" => Process::Controller,
            "enforcer" => Process::Enforcer,
            other => bail!("kill: expected controller or enforcer, got {other:?}"),
        };
        Fault::Kill {
            process,
            restart: raw.restart.unwrap_or(true),
        }
    } else if let Some(what) = raw.start {
        match what.as_str() {
            "controller" => Fault::Start(Process::Controller),
            "enforcer" => Fault::Start(Process::Enforcer),
            "second-enforcer" => Fault::SecondEnforcer,
            other => {
                bail!("start: expected controller, enforcer or second-enforcer, got {other:?}")
            }
        }
    } else if let Some(what) = raw.corrupt {
        match what.as_str() {
            "checkpoint" => Fault::CorruptCheckpoint,
            other => bail!("corrupt: expected checkpoint, got {other:?}"),
        }
    } else if let Some(what) = raw.break_ {
        match what.as_str() {
            "manifests" => Fault::BreakManifests,
            other => bail!("break: expected manifests, got {other:?}"),
        }
    } else if let Some(what) = raw.repair {
        match what.as_str() {
            "manifests" => Fault::RepairManifests,
            other => bail!("repair: expected manifests, got {other:?}"),
        }
    } else {
        let pod = raw.unplug.unwrap_or_default();
        Fault::Unplug(PodName::parse(&pod).map_err(|e| anyhow!("unplug: {e}"))?)
    };
    Ok(fault)
}

/// What is up and what is broken, followed through the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub controller_up: bool,
    pub enforcer_up: bool,
    pub manifests_broken: bool,
    pub second_enforcer: bool,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            controller_up: true,
            enforcer_up: true,
            manifests_broken: false,
            second_enforcer: false,
        }
    }
}

impl Liveness {
    /// Applies one fault, refusing those that cannot happen in this state.
    pub fn apply(&mut self, fault: &Fault) -> Result<()> {
        match fault {
            Fault::Kill { process, restart } => {
                let up = self.up(*process);
                if !*up {
                    bail!("the {} is already down", process.as_str());
                }
                *up = *restart;
            }
            Fault::Start(process) => {
                let up = self.up(*process);
                if *up {
                    bail!("the {} is already running", process.as_str());
                }
                *up = true;
            }
            Fault::SecondEnforcer => {
                if !self.enforcer_up {
                    bail!("a second enforcer needs a first one running");
                }
                if self.second_enforcer {
                    bail!("a second enforcer is already running");
                }
                self.second_enforcer = true;
            }
            Fault::CorruptCheckpoint => {
                if self.second_enforcer {
                    bail!("corrupt checkpoint restarts the enforcer, which a second enforcer would take over");
                }
                self.enforcer_up = true;
            }
            Fault::BreakManifests => {
                if self.manifests_broken {
                    bail!("the manifests are already broken");
                }
                self.manifests_broken = true;
            }
            Fault::RepairManifests => {
                if !self.manifests_broken {
                    bail!("the manifests are not broken");
                }
                self.manifests_broken = false;
            }
            Fault::Unplug(_) => {}
        }
        Ok(())
    }

    fn up(&mut self, process: Process) -> &mut bool {
        match process {
            Process::Controller => &mut self.controller_up,
            Process::Enforcer => &mut self.enforcer_up,
        }
    }

    /// Realization is only awaited when both processes are up and the
    /// source can be read: otherwise there is nothing to realize through.
    pub fn can_realize(&self) -> bool {
        self.controller_up && self.enforcer_up && !self.manifests_broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(yaml: &str) -> Result<Fault> {
        parse(serde_yaml::from_str(yaml)?)
    }

    #[test]
    fn parses_every_fault() {
        assert_eq!(
            fault("{kill: enforcer}").unwrap(),
            Fault::Kill {
                process: Process::Enforcer,
                restart: true
            }
        );
        assert_eq!(
            fault("{kill: controller, restart: false, node: lab}").unwrap(),
            Fault::Kill {
                process: Process::Controller,
                restart: false
            }
        );
        assert_eq!(
            fault("{corrupt: checkpoint}").unwrap(),
            Fault::CorruptCheckpoint
        );
        assert_eq!(
            fault("{start: second-enforcer}").unwrap(),
            Fault::SecondEnforcer
        );
        assert_eq!(
            fault("{start: controller}").unwrap(),
            Fault::Start(Process::Controller)
        );
        assert_eq!(
            fault("{unplug: x/b}").unwrap(),
            Fault::Unplug(PodName::parse("x/b").unwrap())
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = |y: &str| format!("{:#}", fault(y).unwrap_err());
        assert!(e("{kill: kubelet}").contains("kill"));
        assert!(e("{kill: enforcer, start: controller}").contains("kill, start"));
        assert!(e("{}").contains("none"));
        assert!(e("{start: enforcer, restart: true}").contains("restart"));
        assert!(e("{kill: enforcer, node: n2}").contains("node"));
        assert!(e("{corrupt: plan}").contains("corrupt"));
        assert!(e("{unplug: b}").contains("unplug"));
        assert!(e("{explode: enforcer}").contains("explode"));
    }

    #[test]
    fn liveness_refuses_impossible_sequences() {
        let mut l = Liveness::default();
        let kill_c = Fault::Kill {
            process: Process::Controller,
            restart: false,
        };
        l.apply(&kill_c).unwrap();
        assert!(!l.can_realize());
        assert!(l.apply(&kill_c).is_err());
        l.apply(&Fault::Start(Process::Controller)).unwrap();
        assert!(l.apply(&Fault::Start(Process::Controller)).is_err());
        l.apply(&Fault::BreakManifests).unwrap();
        assert!(!l.can_realize());
        assert!(l.apply(&Fault::BreakManifests).is_err());
        l.apply(&Fault::RepairManifests).unwrap();
        assert!(l.can_realize());
        l.apply(&Fault::SecondEnforcer).unwrap();
        assert!(l.apply(&Fault::CorruptCheckpoint).is_err());
    }
}
