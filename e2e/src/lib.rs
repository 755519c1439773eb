//! palisade-lab: a Kubernetes node on one Linux machine, for trying Palisade
//! and for its end-to-end tests.
//!
//! Pods are network namespaces wired by the real CNI chain (ptp + host-local,
//! then palisade-cni), the real controller reads the lab's manifests, the
//! real enforcer runs in the node's namespace, and probes send real traffic.
//!
//! ```no_run
//! use palisade_e2e::{Lab, LabConfig, Scenario};
//! let scenario = Scenario::from_file("examples/quickstart.yaml".as_ref())?;
//! let mut lab = Lab::start(LabConfig::default())?;
//! let report = palisade_e2e::run_scenario(&mut lab, &scenario, &mut std::io::stdout());
//! lab.shutdown()?;
//! assert!(report?.passed());
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! The API is synchronous (the lab owns its tokio runtime); call it from
//! plain threads and `#[test]`s, not from inside an async runtime.

pub mod admission;
pub mod bench;
pub mod cancel;
pub mod chart;
pub mod cni;
pub mod cnp;
pub mod ctmap;
pub mod dns;
pub mod dump;
pub mod exec_trace;
pub mod fault;
pub mod forge;
pub mod grpc;
pub mod image;
pub mod kubelet;
pub mod lab;
pub mod listener;
pub mod manifests;
pub mod model_engine;
pub mod nat;
pub mod netns;
pub mod netpol;
pub mod preflight;
pub mod probe;
pub mod process;
pub mod realized;
pub mod report;
pub mod runner;
pub mod runtime;
pub mod scenario;
pub mod sctp;
pub mod service;
pub mod sweep;
pub mod tcx;

pub use cancel::{Cancel, Interrupted};
pub use lab::{Footprint, Lab, LabConfig};
pub use probe::Outcome;
pub use report::Report;
pub use runner::run_scenario;
pub use scenario::{Object, ObjectKey, PodName, ProbeSpec, Protocol, Scenario, Verdict};
