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
    /// Where to serve gRPC: unix:PATH or HOST:PORT. Repeat the flag (or
    /// separate with commas) to serve several, e.g. TCP for the enforcers
    /// and a unix socket for local debugging.
    #[arg(
        long,
        env = "PALISADE_LISTEN",
        default_value = "0.0.0.0:7443",
        value_delimiter = ','
    )]
    listen: Vec<Address>,
    /// Read objects from manifest files in this directory (the lab) instead
    /// of watching the Kubernetes API.
    #[arg(long, env = "PALISADE_MANIFESTS")]
    manifests: Option<PathBuf>,
    /// Where policy comes from: NetworkPolicies, or the PolicyEndpoints the
    /// AWS network policy controller writes (Kubernetes API only).
    #[arg(
        long,
        env = "PALISADE_POLICY_SOURCE",
        value_enum,
        default_value = "networkpolicy"
    )]
    policy_source: source::policy_endpoint::PolicySource,
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
        Some(_) if args.policy_source == source::policy_endpoint::PolicySource::PolicyEndpoint => {
            return Err("--policy-source policyendpoint reads the Kubernetes API; \
                        it cannot be used with --manifests"
                .into());
        }
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
            let policy_source = args.policy_source;
            tracing::info!(?policy_source, "watching the Kubernetes API");
            tokio::spawn(
                async move { source::kube::run_with(client, tx, err_tx, policy_source).await },
            )
        }
    };

    if let Some(addr) = args.metrics_addr {
        let listener = policy_controller::metrics::http::bind(addr).await?;
        tracing::info!(metrics_addr = %listener.local_addr().map_err(|e| e.to_string())?, "serving metrics");
        let hub = hub.clone();
        let render = move || policy_controller::metrics::controller::render(&hub.view());
        tokio::spawn(policy_controller::metrics::http::serve(listener, render));
    }
    // One server per address, all stopped by the same signal; the first
    // to fail stops the others, as a half-listening controller would be
    // reachable by some nodes only.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    for addr in args.listen.clone() {
        let router = server::router(hub.clone()).await?;
        tracing::info!(listen = %addr, "serving");
        let mut stop = stop_rx.clone();
        servers.spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            serve(router, &addr, stopped).await
        });
    }
    let mut result = Ok(());
    tokio::select! {
        _ = shutdown_signal() => tracing::info!("shutting down"),
        Some(first) = servers.join_next() => {
            result = first.map_err(|e| format!("a server task failed: {e}")).and_then(|r| r);
        }
    }
    hub.close();
    let _ = stop_tx.send(true);
    while let Some(r) = servers.join_next().await {
        if result.is_ok() {
            result = r
                .map_err(|e| format!("a server task failed: {e}"))
                .and_then(|r| r);
        }
    }
    source_task.abort();
    for addr in &args.listen {
        if let Address::Unix(p) = addr {
            let _ = std::fs::remove_file(p);
        }
    }
    result
}
