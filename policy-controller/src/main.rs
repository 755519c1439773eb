//! palisade-controller: resolves NetworkPolicies into per-node plans and
//! streams each node-enforcer its own.

use std::path::PathBuf;

use clap::Parser;
use palisade_runtime::transport::{serve, serve_on, shutdown_signal, Address, Listener};
use policy_controller::leader::{self, Elector, Leadership, Timings};
use policy_controller::{cluster::ClusterState, feed, hub::Hub, server, source, telemetry};
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
    /// Where policy comes from: NetworkPolicies, or the PolicyEndpoints and
    /// ClusterPolicyEndpoints the AWS network policy controller writes
    /// (Kubernetes API only).
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
    /// Serve plans only while holding a coordination.k8s.io/v1 Lease, so
    /// several replicas can run and exactly one serves. Off: this process
    /// always serves (term 0).
    #[arg(long, env = "PALISADE_LEADER_ELECT")]
    leader_elect: bool,
    /// The Lease's name.
    #[arg(
        long,
        env = "PALISADE_LEASE_NAME",
        default_value = "palisade-controller"
    )]
    lease_name: String,
    /// The Lease's namespace; default: POD_NAMESPACE, else "default".
    #[arg(long, env = "PALISADE_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Who this replica is in the Lease; default: POD_NAME, else
    /// hostname-pid.
    #[arg(long, env = "PALISADE_LEADER_IDENTITY")]
    leader_identity: Option<String>,
    /// Rules (ingress plus egress) one NetworkPolicy may have; a policy with
    /// more is not enforced: the pods it selects are denied what it would
    /// allow, and the controller's errors name it.
    #[arg(long, env = "PALISADE_MAX_RULES_PER_POLICY", default_value_t = policy_controller::limits::MAX_RULES_PER_POLICY)]
    max_rules_per_policy: usize,
    /// Bytes one node's plan may take; over it, the policies bringing the
    /// most bytes are left out of that node's plan (their pods there are
    /// denied what they would allow) and the errors name them.
    #[arg(long, env = "PALISADE_MAX_PLAN_BYTES_PER_NODE", default_value_t = policy_controller::limits::MAX_PLAN_BYTES_PER_NODE)]
    max_plan_bytes_per_node: usize,
    /// How long a lease lives after its last renewal (whole seconds).
    #[arg(long, env = "PALISADE_LEASE_DURATION_MS", default_value_t = 15_000)]
    lease_duration_ms: u64,
    /// A leader stops serving this long after the start of its last
    /// successful renewal; shorter than the lease duration.
    #[arg(long, env = "PALISADE_RENEW_DEADLINE_MS", default_value_t = 10_000)]
    renew_deadline_ms: u64,
    /// How often the lease is read and renewed.
    #[arg(long, env = "PALISADE_RETRY_PERIOD_MS", default_value_t = 2_000)]
    retry_period_ms: u64,
    /// Serve TLS with this certificate (PEM); with --tls-key.
    #[arg(long, env = "PALISADE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "PALISADE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates from this CA (PEM): each enforcer's
    /// names its node (CN=node:NODE_NAME) and gets only that node's plan.
    #[arg(long, env = "PALISADE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Also serve the gRPC health service alone, in plaintext, here (for
    /// kubelet probes, which cannot present a client certificate).
    #[arg(long, env = "PALISADE_HEALTH_LISTEN")]
    health_listen: Option<Address>,
    /// Export traces of policy changes to this OTLP/gRPC collector
    /// (http://HOST:PORT); default: OTEL_EXPORTER_OTLP_ENDPOINT. Off when
    /// neither is set.
    #[arg(long, env = "PALISADE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

fn identity(given: Option<String>) -> String {
    given
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "controller".into());
            format!("{host}-{}", std::process::id())
        })
}

#[global_allocator]
static ALLOCATOR: policy_controller::Allocator = policy_controller::Allocator;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a container's log (what
        // kubectl logs shows) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    policy_controller::limits::set_rules_per_policy(args.max_rules_per_policy);
    let telemetry =
        palisade_runtime::telemetry::start(args.otlp_endpoint.clone(), telemetry::export_config());
    let result = run(args).await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    if let Err(e) = result {
        tracing::error!("{e}");
        eprintln!("palisade-controller: {e}");
        std::process::exit(1);
    }
}

/// What stops the controller, as its last log line and stderr say it.
type RunError = Box<dyn std::error::Error + Send + Sync>;

async fn run(args: Args) -> Result<(), RunError> {
    let start_micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1);
    // Seeded per process by the standard library: enough to tell replicas
    // apart (see first_version).
    let random = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    };
    let first_version = policy_controller::hub::first_version(start_micros, random);
    if let Some(e) = policy_controller::limits::check_plan_budget(args.max_plan_bytes_per_node) {
        return Err(e.into());
    }
    let hub = Hub::new(first_version).with_plan_budget(args.max_plan_bytes_per_node);
    let (err_tx, err_rx) = watch::channel::<Vec<source::SourceProblem>>(Vec::new());
    let timings = Timings {
        lease_duration: std::time::Duration::from_millis(args.lease_duration_ms),
        renew_deadline: std::time::Duration::from_millis(args.renew_deadline_ms),
        retry_period: std::time::Duration::from_millis(args.retry_period_ms),
    };
    if args.leader_elect {
        timings.check()?;
    }
    let mut kube_client = None;
    if args.manifests.is_none() || args.leader_elect {
        kube_client = Some(
            kube::Client::try_default()
                .await
                .map_err(|e| format!("cannot reach the Kubernetes API: {e}"))?,
        );
    }

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
            let client = kube_client.clone().expect("made above");
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(feed::run_changes(hub.clone(), rx, err_rx));
            let policy_source = args.policy_source;
            tracing::info!(?policy_source, "watching the Kubernetes API");
            tokio::spawn(
                async move { source::kube::run_with(client, tx, err_tx, policy_source).await },
            )
        }
    };

    // Counted by the servers, read by the metrics and the debug service.
    let refusals = std::sync::Arc::new(policy_controller::tls::Refusals::default());
    if let Some(addr) = args.metrics_addr {
        let listener = palisade_runtime::metrics_http::bind(addr).await?;
        tracing::info!(metrics_addr = %listener.local_addr().map_err(|e| e.to_string())?, "serving metrics");
        let hub = hub.clone();
        let refusals = refusals.clone();
        let render = move || policy_controller::metrics::controller::render(&hub.view(), &refusals);
        tokio::spawn(palisade_runtime::metrics_http::serve(
            listener,
            palisade_runtime::metrics_http::blocking(render),
        ));
    }
    let (leadership, elector_task) = if args.leader_elect {
        let namespace = args
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let me = identity(args.leader_identity.clone());
        tracing::info!(lease = %format!("{namespace}/{}", args.lease_name), identity = %me, ?timings, "leader election on: serving plans only while leading");
        let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(kube_client.clone().expect("made above"), &namespace);
        let leadership = Leadership::standby();
        let task = tokio::spawn(leader::lease::run(
            api.clone(),
            args.lease_name.clone(),
            Elector::new(me.clone(), timings),
            leadership.clone(),
        ));
        (leadership, Some((task, api, me)))
    } else {
        (Leadership::always(), None)
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(policy_controller::tls::server_config(
            cert,
            key,
            args.tls_client_ca.as_deref(),
        )?),
        _ => None,
    };
    let tcp = args.listen.iter().find(|a| matches!(a, Address::Tcp(_)));
    match (tcp, &tls) {
        (Some(listen), None) => tracing::warn!(
            %listen,
            "SERVING PLANS OVER PLAINTEXT TCP: anyone who can reach this port can read every node's plan and report for any node. Use --tls-cert, --tls-key and --tls-client-ca outside a lab"
        ),
        (_, Some(_)) if args.tls_client_ca.is_none() => tracing::warn!(
            "TLS without --tls-client-ca: callers are not authenticated, and any of them can read any node's plan"
        ),
        _ => {}
    }
    let options = server::ServeOptions {
        leadership: leadership.clone(),
        tls,
        authz: policy_controller::tls::Authz {
            mutual: args.tls_client_ca.is_some(),
            refusals,
        },
    };
    let elector_abort = elector_task.as_ref().map(|(t, _, _)| t.abort_handle());
    // One server per address, all stopped together; the first to fail
    // stops the others, as a half-listening controller would be reachable
    // by some nodes only.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    let mut health_router = None;
    // Every address is bound before any is served and before "serving" is
    // said: a client that saw the log line (or the metrics) may connect at
    // once, and an address that cannot be bound stops the start-up here.
    let mut bound = Vec::new();
    for addr in args.listen.clone() {
        let listener = Listener::bind(&addr).await?;
        bound.push((addr, listener));
    }
    for (addr, listener) in bound {
        let (router, health) = server::router_with(hub.clone(), options.clone()).await?;
        health_router.get_or_insert(health);
        tracing::info!(listen = %addr, "serving");
        let mut stop = stop_rx.clone();
        servers.spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            serve_on(router, listener, &addr, stopped).await
        });
    }
    if let (Some(addr), Some(health_router)) = (args.health_listen.clone(), health_router) {
        tracing::info!(listen = %addr, "serving health (plaintext)");
        tokio::spawn(async move {
            if let Err(e) = serve(health_router, &addr, std::future::pending()).await {
                tracing::error!("health: {e}");
            }
        });
    }
    let mut result = Ok(());
    tokio::select! {
        _ = shutdown_signal() => tracing::info!("shutting down"),
        Some(first) = servers.join_next() => {
            result = first.map_err(|e| format!("a server task failed: {e}")).and_then(|r| r);
        }
    }
    // Stop serving before anything else, and for good: the elector is
    // stopped first so it cannot make this process lead again.
    if let Some(a) = elector_abort {
        a.abort();
    }
    leadership.set(leader::Role::Standby { holder: None });
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
    if let Some((task, api, me)) = elector_task {
        task.abort();
        let _ = task.await;
        match tokio::time::timeout(
            std::time::Duration::from_secs(2),
            leader::lease::release(&api, &args.lease_name, &me),
        )
        .await
        {
            Ok(Ok(true)) => tracing::info!("released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!("{e}; a standby takes over when the lease expires"),
            Err(_) => tracing::warn!(
                "releasing the lease timed out; a standby takes over when it expires"
            ),
        }
    }
    for addr in &args.listen {
        if let Address::Unix(p) = addr {
            let _ = std::fs::remove_file(p);
        }
    }
    result.map_err(Into::into)
}
