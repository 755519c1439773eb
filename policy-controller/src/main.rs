//! palisade-controller: resolves NetworkPolicies into per-node plans and
//! streams each node-enforcer its own.

use std::path::PathBuf;

use clap::Parser;
use palisade_proto::transport::{serve, shutdown_signal, Address};
use policy_controller::{cluster::ClusterState, feed, hub::Hub, server, source};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(name = "palisade-controller", version, about)]
struct Args {
    /// Where to serve gRPC: unix:PATH or HOST:PORT.
    #[arg(long, env = "PALISADE_LISTEN", default_value = "0.0.0.0:7443")]
    listen: Address,
    /// Read objects from manifest files in this directory (the lab) instead
    /// of watching the Kubernetes API.
    #[arg(long, env = "PALISADE_MANIFESTS")]
    manifests: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT); off when unset.
    #[arg(long, env = "PALISADE_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
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
        eprintln!("palisade-controller: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let start_micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1);
    let hub = Hub::new(start_micros);
    let (err_tx, err_rx) = watch::channel::<Vec<String>>(Vec::new());

    let source_task = match args.manifests.clone() {
        Some(dir) => {
            tracing::info!(dir = %dir.display(), "reading manifests");
            let (tx, rx) = watch::channel::<Option<ClusterState>>(None);
            tokio::spawn(feed::run(hub.clone(), rx, err_rx));
            tokio::spawn(async move { source::manifest::run(dir, tx, err_tx).await })
        }
        None => {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| format!("cannot reach the Kubernetes API: {e}"))?;
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(feed::run_changes(hub.clone(), rx, err_rx));
            tokio::spawn(async move { source::kube::run(client, tx, err_tx).await })
        }
    };

    if let Some(addr) = args.metrics_addr {
        let listener = policy_controller::metrics::http::bind(addr).await?;
        tracing::info!(metrics_addr = %listener.local_addr().map_err(|e| e.to_string())?, "serving metrics");
        let hub = hub.clone();
        let render = move || policy_controller::metrics::controller::render(&hub.view());
        tokio::spawn(policy_controller::metrics::http::serve(listener, render));
    }
    let router = server::router(hub.clone()).await?;
    tracing::info!(listen = %args.listen, "serving");
    let shutdown = async {
        shutdown_signal().await;
        tracing::info!("shutting down");
        hub.close();
    };
    let result = serve(router, &args.listen, shutdown).await;
    source_task.abort();
    if let Address::Unix(p) = &args.listen {
        let _ = std::fs::remove_file(p);
    }
    result
}
