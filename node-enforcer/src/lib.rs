//! The node-enforcer: owns the node's datapath. One reconciler receives every
//! event in order (see `reconciler`); the gRPC servers, the plan stream and
//! the CNI plugin only talk to it.

pub mod checkpoint;
pub mod cni_plugin;
pub mod compile;
pub mod conntrack;
pub mod datapath;
pub mod desired;
pub mod flow_log;
pub mod handle;
pub mod incarnation;
pub mod links;
pub mod lock;
pub mod metrics;
pub mod metrics_maps;
pub mod metrics_names;
pub mod names;
pub mod plan_client;
pub mod pods_saver;
pub mod private;
pub mod reconciler;
pub mod server;
pub mod stall;
pub(crate) mod sys_bpf;
pub mod telemetry;
