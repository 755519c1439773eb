//! The desired datapath: a pure function of what the enforcer knows about
//! each pod (its plan entry, or why it has none), the node's mode, and the
//! interfaces that are live. Nothing here depends on the order events arrived
//! in (DESIGN invariant 2).
//!
//! Fail closed (invariant 9): a pod whose policy the enforcer cannot be sure
//! of is denied, or keeps the policy it last had, and the reason is kept so
//! the state dump shows it. The only pod left open without a policy is a
//! standard-mode pod whose pod-up deadline passed, and it is marked
//! unprotected.

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_proto::v1::{DirectionPolicy, PodPolicy};

use crate::compile::{compile, PolicySet, Prefix};

pub type PodKey = (String, String);

/// The enforcer's mode, with the AWS agent's meaning.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A pod no policy selects is open; a pod whose policy is not known by
    /// its pod-up deadline starts open, shown as unprotected.
    #[default]
    Standard,
    /// A pod no policy selects is denied (except its own node); a pod whose
    /// policy is not known by its deadline is refused.
    Strict,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "standard" => Ok(Mode::Standard),
            "strict" => Ok(Mode::Strict),
            other => Err(format!(
                "mode {other:?} is neither \"standard\" nor \"strict\""
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Standard => "standard",
            Mode::Strict => "strict",
        })
    }
}

/// A pod as the CNI plugin reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodRuntime {
    pub container_id: String,
    pub netns: String,
    pub host_interfaces: Vec<String>,
    pub ips: Vec<Prefix>,
    /// The kernel index each host interface had when the pod came up. A name
    /// alone is not an identity: a recreated veth can reuse it.
    #[serde(default)]
    pub ifindexes: BTreeMap<String, u32>,
    /// The mode the pod was brought up under (NPBackend requests name it);
    /// None: the enforcer's own.
    #[serde(default)]
    pub mode: Option<Mode>,
}

/// What the enforcer knows about a pod's policy.
#[derive(Clone, Debug, PartialEq)]
pub enum Knowledge<'a> {
    /// The controller's plan lists the pod.
    Known(&'a PodPolicy),
    /// Pod-up is waiting for the controller to deliver the pod's policy.
    Waiting,
    /// Standard mode, deadline passed, policy still unknown: open, visibly.
    Unprotected,
    /// No usable plan (none yet after a restart, or the controller does not
    /// list a pod we already enforce): keep what is enforced now.
    Hold,
}

/// What one direction of an interface must do.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Not isolated.
    Open,
    /// Nothing passes, not even the node: for a pod that is not running yet,
    /// or whose tables could not be written.
    Deny,
    Policy(Arc<PolicySet>),
}

/// Which pod an interface with our programs is enforced for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claim {
    /// The pod whose host interface it is.
    Pod(PodKey),
    /// An interface with our programs that no pod explains (a damaged
    /// checkpoint): it keeps its policy until it goes away or is explained.
    Unexplained,
}

impl Claim {
    pub fn pod(&self) -> Option<&PodKey> {
        match self {
            Claim::Pod(k) => Some(k),
            Claim::Unexplained => None,
        }
    }
}

/// What one host interface must have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredEndpoint {
    pub claim: Claim,
    pub ifindex: u32,
    pub ingress: Verdict,
    pub egress: Verdict,
    pub pod_addrs: Vec<[u8; 16]>,
    /// The egress policy its table was compiled from, when it has rules
    /// by domain name: what the learner compiles learned addresses with
    /// (`names`). None when egress is not judged by that policy's table.
    pub names: Option<crate::names::Egress>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub endpoints: BTreeMap<String, DesiredEndpoint>,
    /// Why a pod is not enforced exactly as its plan says (compile errors,
    /// unknown policy); shown in the dump.
    pub errors: BTreeMap<PodKey, String>,
    /// Pods a direction of which waits for its table ([`NoTable::InFlight`]):
    /// their pod-ups are answered once it is complete.
    pub awaiting_tables: std::collections::BTreeSet<PodKey>,
}

/// What an interface enforces now: ingress, egress, the pod's addresses.
pub type Enforced = (Verdict, Verdict, Vec<[u8; 16]>);

/// What interfaces enforce now, by name, each with the index of the
/// interface it is enforced on.
pub type Held = BTreeMap<String, (u32, Enforced)>;

/// Why a direction has no table to point at.
#[derive(Clone, Debug, PartialEq)]
pub enum NoTable {
    /// The policy cannot be compiled: the direction is denied, and why is
    /// shown.
    Failed(String),
    /// Its table is being compiled or written (a big policy, off the
    /// reconciler's thread or in slices): the interface keeps what it
    /// enforces now, or is denied, until the table is complete.
    InFlight(String),
}

impl std::fmt::Display for NoTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoTable::Failed(e) => f.write_str(e),
            NoTable::InFlight(why) => write!(f, "{why}: its table is not complete yet"),
        }
    }
}

impl From<String> for NoTable {
    fn from(e: String) -> Self {
        NoTable::Failed(e)
    }
}

/// Compiles a direction's policy; the reconciler memoizes it by content.
pub type Compiler<'a> = dyn FnMut(&DirectionPolicy) -> Result<Arc<PolicySet>, NoTable> + 'a;

/// One pod's part of [`Desired`].
pub struct PodDesired {
    pub endpoints: Vec<(String, DesiredEndpoint)>,
    /// Why it is not enforced as its plan says, if it is not.
    pub error: Option<String>,
    /// A direction's table is not complete yet ([`NoTable::InFlight`]).
    pub awaiting_table: bool,
}

/// Inputs of [`desired`] and [`desired_pod`].
pub struct Inputs<'a> {
    pub mode: Mode,
    pub pods: &'a BTreeMap<PodKey, PodRuntime>,
    pub knowledge: &'a dyn Fn(&PodKey) -> Knowledge<'a>,
    /// The interfaces that exist now, by name, with their index.
    pub live: &'a BTreeMap<String, u32>,
    /// Interfaces nobody explains, with what they enforce now.
    pub unexplained: &'a Held,
    /// What an interface enforces now, with the index of the interface it
    /// is enforced on: for held pods, and directions whose table is not
    /// complete yet.
    pub held: &'a dyn Fn(&str) -> Option<(u32, Enforced)>,
    /// The node's own addresses, always allowed in an isolated direction.
    pub node_addresses: &'a [Prefix],
}

/// The name flow logs and explain give strict mode's default in a tiered
/// direction.
pub const STRICT_DEFAULT: &str = "strict mode default";

/// `d` (tiers, no NetworkPolicy isolation) with strict mode's default, a
/// deny of everything, as its last Baseline rule: what no tier decides is
/// denied (the node's own addresses stay allowed, as everywhere).
fn with_strict_default(d: &DirectionPolicy) -> DirectionPolicy {
    let everything = |addr: Vec<u8>| palisade_proto::v1::PeerBlock {
        cidr: Some(palisade_proto::v1::IpPrefix {
            addr,
            prefix_len: 0,
        }),
        except: vec![],
    };
    let mut d = d.clone();
    d.baseline.push(palisade_proto::v1::TierRule {
        action: palisade_proto::v1::TierAction::Deny as i32,
        peers: vec![everything(vec![0; 4]), everything(vec![0; 16])],
        policy: STRICT_DEFAULT.into(),
        ..Default::default()
    });
    d
}

/// The desired endpoints of one pod, and why it is not enforced as its plan
/// says, if it is not.
pub fn desired_pod(
    i: &Inputs<'_>,
    key: &PodKey,
    pod: &PodRuntime,
    compile_set: &mut Compiler<'_>,
) -> PodDesired {
    let mode = pod.mode.unwrap_or(i.mode);
    let knowledge = (i.knowledge)(key);
    let mut error = None;
    let mut awaiting_table = false;
    // The egress policy as compiled, when it or the staged egress learns
    // by name.
    let mut names: Option<crate::names::Egress> = None;
    // The verdict (None: the direction's table is not complete yet,
    // resolved per interface below: what it enforces now, or deny) and,
    // when it learns by name or `keep` asks, the policy its table was
    // compiled from (None: no table). A copy only then: policies can be
    // large, and every pod of a convergence passes here.
    let mut direction = |d: Option<&DirectionPolicy>,
                         name: &str,
                         keep: bool|
     -> (Option<Verdict>, Option<DirectionPolicy>) {
        // Deny, but never the node itself (kubelet probes must reach it).
        let node_only = |c: &mut Compiler<'_>| {
            Verdict::Policy(c(&DirectionPolicy::default()).unwrap_or_default())
        };
        // A direction present only for tiers it no longer has decides
        // nothing, as an absent one.
        let d = d.filter(|d| !d.not_isolated || !d.admin.is_empty() || !d.baseline.is_empty());
        let Some(d) = d else {
            return (
                Some(match mode {
                    Mode::Standard => Verdict::Open,
                    Mode::Strict => node_only(compile_set),
                }),
                None,
            );
        };
        let strict_default;
        let d = if mode == Mode::Strict && d.not_isolated {
            // Strict mode's default comes last, after the Baseline tier.
            strict_default = with_strict_default(d);
            &strict_default
        } else {
            d
        };
        match compile_set(d) {
            Ok(set) => {
                let learns = keep || crate::names::rules::learns(d);
                (Some(Verdict::Policy(set)), learns.then(|| d.clone()))
            }
            Err(NoTable::InFlight(why)) => {
                awaiting_table = true;
                error = Some(format!(
                    "{name} policy of {}/{} ({why}) is not realized yet: the pod keeps what it enforces now, or is denied, until its table is complete",
                    key.0, key.1
                ));
                (None, None)
            }
            Err(NoTable::Failed(e)) => {
                error = Some(format!(
                    "{name} policy of {}/{} cannot be compiled, so it is denied: {e}",
                    key.0, key.1
                ));
                (Some(node_only(compile_set)), None)
            }
        }
    };
    let (ingress, egress) = match &knowledge {
        Knowledge::Known(p) => {
            let (ingress, _) = direction(p.ingress.as_ref(), "ingress", false);
            let staged = p
                .audit_egress
                .as_ref()
                .filter(|d| crate::names::rules::learns(d));
            let (egress, compiled_from) = direction(p.egress.as_ref(), "egress", staged.is_some());
            let enforced_learns = compiled_from
                .as_ref()
                .is_some_and(crate::names::rules::learns);
            names = (enforced_learns || staged.is_some()).then(|| crate::names::Egress {
                // Without a table (not isolated, policy 0) the datapath
                // never reads an entry's enforced port set; were it to,
                // the empty policy's (the node only) denies.
                enforced: Arc::new(compiled_from.unwrap_or_default()),
                staged: staged.cloned().map(Arc::new),
            });
            (ingress, egress)
        }
        Knowledge::Waiting => {
            error = Some(format!(
                "{}/{}: waiting for the controller to deliver the pod's policy; denied meanwhile",
                key.0, key.1
            ));
            (Some(Verdict::Deny), Some(Verdict::Deny))
        }
        Knowledge::Unprotected => {
            error = Some(format!(
                "{}/{}: UNPROTECTED: the pod's policy was not known by its pod-up deadline (standard mode lets it start open)",
                key.0, key.1
            ));
            (Some(Verdict::Open), Some(Verdict::Open))
        }
        // Resolved per interface below.
        Knowledge::Hold => {
            error = Some(format!(
                "{}/{}: not in the controller's plan (or no plan yet); keeping the policy it had",
                key.0, key.1
            ));
            (Some(Verdict::Deny), Some(Verdict::Deny))
        }
    };
    // NPBackend requests carry no addresses: the plan's stand in.
    let mut addrs: Vec<[u8; 16]> = pod.ips.iter().map(|p| p.addr).collect();
    if let (true, Knowledge::Known(p)) = (addrs.is_empty(), &knowledge) {
        addrs = p
            .pod_ips
            .iter()
            .filter_map(|ip| Prefix::from_wire(ip).ok().map(|p| p.addr))
            .take(crate::datapath::MAX_POD_ADDRS)
            .collect();
    }
    let mut out = Vec::new();
    for ifname in &pod.host_interfaces {
        let Some(&ifindex) = i.live.get(ifname) else {
            continue;
        };
        // The name now belongs to another interface: this pod's is gone.
        if pod
            .ifindexes
            .get(ifname)
            .is_some_and(|&want| want != ifindex)
        {
            continue;
        }
        // Only what this very interface enforces: a record of an older
        // interface of the same name (its DEL lost, its link event not
        // handled yet) holds another pod's verdicts, maybe open.
        let held = (i.held)(ifname)
            .filter(|(at, _)| *at == ifindex)
            .map(|(_, e)| e);
        // The table compiled from the policy judges this interface only
        // when the direction is complete (not held, not awaiting).
        let learns = egress.is_some() && !matches!(knowledge, Knowledge::Hold);
        let (ingress, egress) = match (&knowledge, held) {
            (Knowledge::Hold, Some((ing, eg, _))) => (ing, eg),
            // A table not complete yet: what the interface enforces now
            // (make before break), else nothing passes.
            (_, held) => {
                let (held_in, held_eg) = held.map_or((None, None), |(i, e, _)| (Some(i), Some(e)));
                (
                    ingress.clone().or(held_in).unwrap_or(Verdict::Deny),
                    egress.clone().or(held_eg).unwrap_or(Verdict::Deny),
                )
            }
        };
        out.push((
            ifname.clone(),
            DesiredEndpoint {
                claim: Claim::Pod(key.clone()),
                ifindex,
                ingress,
                egress,
                pod_addrs: addrs.clone(),
                names: names.clone().filter(|_| learns),
            },
        ));
    }
    PodDesired {
        endpoints: out,
        error,
        awaiting_table,
    }
}

/// The endpoint an unexplained interface keeps, if it still lives and no
/// pod claims it.
pub fn desired_unexplained(i: &Inputs<'_>, ifname: &str) -> Option<DesiredEndpoint> {
    let (at, (ingress, egress, addrs)) = i.unexplained.get(ifname)?;
    // Only that interface: a newer one of its name is not the one whose
    // policy and pod addresses it keeps (they would drop its traffic).
    let &ifindex = i.live.get(ifname).filter(|&live| live == at)?;
    Some(DesiredEndpoint {
        claim: Claim::Unexplained,
        ifindex,
        ingress: ingress.clone(),
        egress: egress.clone(),
        pod_addrs: addrs.clone(),
        names: None,
    })
}

/// The whole desired datapath, from scratch: what the reconciler's
/// incremental updates must always equal.
pub fn desired(i: &Inputs<'_>) -> Desired {
    // Pods with equal policies get the same Arc, so sharing is by content.
    let mut interned: BTreeMap<PolicySet, Arc<PolicySet>> = BTreeMap::new();
    let mut compile_set = |d: &DirectionPolicy| -> Result<Arc<PolicySet>, NoTable> {
        let set = compile(d, i.node_addresses).map_err(|e| NoTable::Failed(e.to_string()))?;
        Ok(interned
            .entry(set.clone())
            .or_insert_with(|| Arc::new(set))
            .clone())
    };
    desired_with(i, &mut compile_set)
}

/// [`desired`] with the compiler given (the reconciler's memoizes).
pub fn desired_with(i: &Inputs<'_>, compile_set: &mut Compiler<'_>) -> Desired {
    let mut out = Desired::default();
    for (key, pod) in i.pods {
        let d = desired_pod(i, key, pod, compile_set);
        out.endpoints.extend(d.endpoints);
        if let Some(e) = d.error {
            out.errors.insert(key.clone(), e);
        }
        if d.awaiting_table {
            out.awaiting_tables.insert(key.clone());
        }
    }
    for ifname in i.unexplained.keys() {
        if out.endpoints.contains_key(ifname) {
            continue;
        }
        if let Some(e) = desired_unexplained(i, ifname) {
            out.endpoints.insert(ifname.clone(), e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ifname: &str, ifindex: u32) -> PodRuntime {
        PodRuntime {
            container_id: "c".into(),
            netns: String::new(),
            host_interfaces: vec![ifname.into()],
            ips: vec![Prefix::from_ip("10.0.0.9".parse().unwrap(), 32)],
            ifindexes: BTreeMap::from([(ifname.to_string(), ifindex)]),
            mode: None,
        }
    }

    fn run(mode: Mode, k: Knowledge<'_>, live_index: u32) -> Desired {
        let pods = BTreeMap::from([(("x".to_string(), "a".to_string()), pod("veth-a", 10))]);
        let live = BTreeMap::from([("veth-a".to_string(), live_index)]);
        let none = Held::new();
        let knowledge = move |_: &PodKey| k.clone();
        desired(&Inputs {
            mode,
            pods: &pods,
            knowledge: &knowledge,
            live: &live,
            unexplained: &none,
            held: &|_| None,
            node_addresses: &[],
        })
    }

    #[test]
    fn unselected_pod_is_open_in_standard_and_denied_in_strict() {
        let unselected = PodPolicy::default();
        let d = run(Mode::Standard, Knowledge::Known(&unselected), 10);
        assert_eq!(d.endpoints["veth-a"].ingress, Verdict::Open);
        let d = run(Mode::Strict, Knowledge::Known(&unselected), 10);
        assert!(matches!(d.endpoints["veth-a"].ingress, Verdict::Policy(_)));
        assert!(matches!(d.endpoints["veth-a"].egress, Verdict::Policy(_)));
    }

    #[test]
    fn unknown_policy_is_denied_and_named_until_the_deadline() {
        for mode in [Mode::Standard, Mode::Strict] {
            let d = run(mode, Knowledge::Waiting, 10);
            assert_eq!(d.endpoints["veth-a"].ingress, Verdict::Deny);
            assert_eq!(d.endpoints["veth-a"].egress, Verdict::Deny);
            assert!(d.errors.values().next().unwrap().contains("waiting"));
        }
        let d = run(Mode::Standard, Knowledge::Unprotected, 10);
        assert_eq!(d.endpoints["veth-a"].ingress, Verdict::Open);
        assert!(d.errors.values().next().unwrap().contains("UNPROTECTED"));
    }

    #[test]
    fn a_recreated_interface_is_not_the_pods() {
        let unselected = PodPolicy::default();
        let d = run(Mode::Standard, Knowledge::Known(&unselected), 11);
        assert!(d.endpoints.is_empty(), "{d:?}");
    }

    fn admin_deny_22() -> palisade_proto::v1::DirectionPolicy {
        palisade_proto::v1::DirectionPolicy {
            admin: vec![palisade_proto::v1::TierRule {
                action: palisade_proto::v1::TierAction::Deny as i32,
                peers: vec![palisade_proto::v1::PeerBlock {
                    cidr: Some(palisade_proto::v1::IpPrefix {
                        addr: vec![10, 0, 0, 0],
                        prefix_len: 8,
                    }),
                    except: vec![],
                }],
                ports: vec![palisade_proto::v1::PortRange {
                    protocol: palisade_proto::v1::Protocol::Tcp as i32,
                    port: 22,
                    end_port: 0,
                }],
                ..Default::default()
            }],
            not_isolated: true,
            ..Default::default()
        }
    }

    #[test]
    fn tiers_without_isolation_fall_to_the_modes_default() {
        let p = PodPolicy {
            ingress: Some(admin_deny_22()),
            ..Default::default()
        };
        let peer = "10.1.1.1".parse().unwrap();
        let outside = "192.168.0.1".parse().unwrap();
        let d = run(Mode::Standard, Knowledge::Known(&p), 10);
        let Verdict::Policy(set) = &d.endpoints["veth-a"].ingress else {
            panic!("{d:?}")
        };
        assert!(!set.allows(peer, 6, 22));
        assert!(set.allows(peer, 6, 80) && set.allows(outside, 6, 22));
        let d = run(Mode::Strict, Knowledge::Known(&p), 10);
        let Verdict::Policy(set) = &d.endpoints["veth-a"].ingress else {
            panic!("{d:?}")
        };
        assert!(!set.allows(peer, 6, 22));
        assert!(
            !set.allows(peer, 6, 80) && !set.allows(outside, 6, 22),
            "strict: what no tier decides is denied"
        );
        // A direction left with no tiers and no isolation decides nothing.
        let p = PodPolicy {
            ingress: Some(palisade_proto::v1::DirectionPolicy {
                not_isolated: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = run(Mode::Standard, Knowledge::Known(&p), 10);
        assert_eq!(d.endpoints["veth-a"].ingress, Verdict::Open);
    }
}
