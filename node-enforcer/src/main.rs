//! palisade-enforcer: the per-node daemon.

use std::path::PathBuf;

use clap::Parser;
use node_enforcer::checkpoint::Checkpoint;
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::handle::Handle;
use node_enforcer::reconciler::Reconciler;
use node_enforcer::{plan_client, server};
use palisade_proto::transport::{serve, shutdown_signal, Address};
use palisade_proto::v1::NodeState;
use tokio::sync::{mpsc, watch};

#[derive(Parser, Debug)]
#[command(name = "palisade-enforcer", version, about)]
struct Args {
    /// This node's name, as in the pods' spec.nodeName.
    #[arg(long, env = "PALISADE_NODE_NAME")]
    node_name: String,
    /// The policy-controller: unix:PATH or HOST:PORT.
    #[arg(long, env = "PALISADE_CONTROLLER")]
    controller: Address,
    /// The unix socket for the CNI plugin, debug, health and reflection.
    #[arg(
        long,
        env = "PALISADE_CNI_SOCKET",
        default_value = "/run/palisade/cni.sock"
    )]
    cni_socket: PathBuf,
    /// Where this enforcer pins its eBPF maps; one directory per enforcer.
    #[arg(
        long,
        env = "PALISADE_PIN_ROOT",
        default_value = "/sys/fs/bpf/palisade"
    )]
    pin_root: PathBuf,
    /// Where the enforcer keeps its inputs (last plan, known pods) so that a
    /// restart takes over the datapath instead of rebuilding it. Must survive
    /// a restart of the enforcer (a hostPath in a DaemonSet).
    #[arg(
        long,
        env = "PALISADE_STATE_DIR",
        default_value = "/run/palisade/state"
    )]
    state_dir: PathBuf,
    /// Host interface prefix of the AWS VPC CNI, for NPBackend requests.
    #[arg(long, env = "PALISADE_AWS_INTERFACE_PREFIX", default_value = "eni")]
    aws_interface_prefix: String,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Args::parse()).await {
        tracing::error!("{e}");
        eprintln!("palisade-enforcer: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    if args.node_name.is_empty() {
        return Err("--node-name must not be empty".into());
    }
    let datapath = BpfDatapath::load(&args.pin_root).map_err(|e| e.to_string())?;
    let checkpoint = Checkpoint::open(&args.state_dir)?;
    let saved = checkpoint.load()?;
    let enforcer_id = format!("{}-{}", args.node_name, std::process::id());
    let (tx, rx) = mpsc::channel(256);
    let (state_tx, state_rx) = watch::channel(NodeState::default());
    let mut reconciler = Reconciler::new(args.node_name.clone(), enforcer_id.clone(), datapath)
        .with_checkpoint(checkpoint);
    // Before serving anything: the previous process's links keep enforcing
    // until this one has taken them over.
    reconciler.recover(saved)?;
    let reconciler_thread = std::thread::Builder::new()
        .name("reconciler".into())
        .spawn(move || reconciler.run(rx, state_tx))
        .map_err(|e| format!("starting the reconciler: {e}"))?;
    let handle = Handle::new(tx.clone());
    // Node addresses change without an event we subscribe to (yet): look
    // every few seconds.
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            if tx
                .send(node_enforcer::reconciler::Event::Tick)
                .await
                .is_err()
            {
                return;
            }
        }
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let plan = tokio::spawn(plan_client::run(
        args.controller.clone(),
        args.node_name.clone(),
        enforcer_id,
        handle.clone(),
        stop_rx,
    ));
    let report = tokio::spawn(plan_client::report(args.controller.clone(), state_rx));

    let router = server::router(handle, args.aws_interface_prefix.clone()).await?;
    let socket = Address::Unix(args.cni_socket.clone());
    tracing::info!(socket = %socket, pin_root = %args.pin_root.display(), "serving");
    let shutdown = async {
        shutdown_signal().await;
        tracing::info!("shutting down");
    };
    let result = serve(router, &socket, shutdown).await;
    let _ = stop_tx.send(true);
    plan.abort();
    report.abort();
    let _ = std::fs::remove_file(&args.cni_socket);
    // Links and maps are pinned: the programs keep enforcing after exit, and
    // the next enforcer takes them over.
    drop(reconciler_thread);
    result
}
