//! palisade-enforcer: the per-node daemon.

use std::path::PathBuf;

use clap::Parser;
use node_enforcer::checkpoint::Checkpoint;
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::desired::Mode;
use node_enforcer::handle::Handle;
use node_enforcer::reconciler::{Event, Reconciler};
use node_enforcer::{plan_client, server, telemetry};
use palisade_proto::v1::NodeState;
use palisade_runtime::transport::{serve_on, Address, Listener};
use tokio::sync::{mpsc, watch};

#[derive(Parser, Debug)]
#[command(name = "palisade-enforcer", version, about)]
struct Args {
    /// This node's name, as in the pods' spec.nodeName.
    #[arg(long, env = "PALISADE_NODE_NAME")]
    node_name: String,
    /// The policy-controller: unix:PATH or HOST:PORT; several, comma
    /// separated or repeated, are tried in turn (only the leader serves).
    #[arg(
        long,
        env = "PALISADE_CONTROLLER",
        value_delimiter = ',',
        required = true
    )]
    controller: Vec<Address>,
    /// HTTP/2 keepalive towards the controller: a controller that stops
    /// answering pings for this long (paused, cut off) is left for the next.
    #[arg(
        long,
        env = "PALISADE_CONTROLLER_KEEPALIVE_MS",
        default_value_t = 10_000
    )]
    controller_keepalive_ms: u64,
    /// Speak TLS to the controller, trusting this CA (PEM).
    #[arg(long, env = "PALISADE_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This node's client certificate (PEM, CN=node:NODE_NAME); with
    /// --tls-key. The controller serves it only this node's plan.
    #[arg(
        long,
        env = "PALISADE_TLS_CERT",
        requires = "tls_key",
        requires = "tls_ca"
    )]
    tls_cert: Option<PathBuf>,
    #[arg(long, env = "PALISADE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The name to verify the controller's certificate for (default: the
    /// host of the controller address).
    #[arg(long, env = "PALISADE_TLS_SERVER_NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
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
    /// standard: pods no policy selects are open; strict: they are denied,
    /// and a pod whose policy is unknown at its pod-up deadline is refused.
    #[arg(long, env = "PALISADE_MODE", default_value = "standard")]
    mode: Mode,
    /// How long pod up (CNI ADD, EnforceNpToPod) waits for the pod's policy.
    /// The AWS VPC CNI gives its agent 2 s in all.
    #[arg(long, env = "PALISADE_POD_UP_DEADLINE_MS", default_value_t = 1500)]
    pod_up_deadline_ms: u64,
    /// How long to wait for another enforcer holding this node's lock to
    /// exit; 0 waits forever (a surge rollout's new pod waits for the old).
    #[arg(long, env = "PALISADE_LOCK_TIMEOUT_SECS", default_value_t = 0)]
    lock_timeout_secs: u64,
    /// A file written once this node is known to load the programs (the
    /// preflight, or the load itself) and removed at start. The chart's
    /// readiness probe requires it, so a surge pod whose programs the node
    /// refuses is never Ready, although the old enforcer answers its socket.
    #[arg(long, env = "PALISADE_PROGRAMS_LOADED_FILE")]
    programs_loaded_file: Option<PathBuf>,
    /// Size of each of the eBPF conntrack maps (IPv4 and IPv6), applied when they are first created.
    #[arg(
        long,
        env = "PALISADE_CONNTRACK_MAX_ENTRIES",
        default_value_t = palisade_ebpf::MAX_CONNTRACK_ENTRIES
    )]
    conntrack_max_entries: u32,
    /// Most eBPF conntrack entries one hook (egress or ingress) of one pod
    /// may hold; a new flow past it is dropped. 0: a quarter of the IPv4
    /// conntrack map's size.
    #[arg(long, env = "PALISADE_CONNTRACK_SHARE", default_value_t = 0)]
    conntrack_share: u32,
    /// How often eBPF conntrack entries are checked against the kernel's
    /// conntrack; entries nothing explains are removed.
    #[arg(long, env = "PALISADE_CONNTRACK_CLEANUP_SECS", default_value_t = 60)]
    conntrack_cleanup_secs: u64,
    /// How the cleanup asks the kernel's conntrack about a flow: lookup (a
    /// bpf_skb_ct_lookup per idle entry, TCP and UDP in the default zone;
    /// falls back to dump when the kernel lacks the kfunc) or dump (the
    /// whole table over netlink, every zone, ~1.8 µs per kernel entry).
    #[arg(long, env = "PALISADE_CONNTRACK_ASK", default_value = "lookup")]
    conntrack_ask: node_enforcer::conntrack::sweep::AskWith,
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT); off when unset.
    #[arg(long, env = "PALISADE_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Export traces of plan realization to this OTLP/gRPC collector
    /// (http://HOST:PORT); default: OTEL_EXPORTER_OTLP_ENDPOINT. Off when
    /// neither is set.
    #[arg(long, env = "PALISADE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Flow log: off, deny (every dropped packet) or all (and every new
    /// flow allowed). Staged policies' verdicts are logged in every mode.
    #[arg(long, env = "PALISADE_FLOW_LOG", default_value = "off")]
    flow_log: node_enforcer::flow_log::FlowLogMode,
    /// Direction policies of at least this many peers (and excepts) are
    /// compiled off the reconciler's thread and their tables written in
    /// slices between events, so pods they do not select start meanwhile.
    #[arg(long, env = "PALISADE_BACKGROUND_COMPILE_PEERS", default_value_t = node_enforcer::reconciler::BACKGROUND_PEERS)]
    background_compile_peers: usize,
    /// Most entries one compiled policy table may have; a direction whose
    /// table would be bigger is denied, and the dump names its policies.
    #[arg(long, env = "PALISADE_MAX_TABLE_ENTRIES", default_value_t = node_enforcer::compile::MAX_TABLE_ENTRIES)]
    max_table_entries: usize,
    /// One event keeping the reconciler longer than this makes health
    /// NOT_SERVING until it is done.
    #[arg(long, env = "PALISADE_STALL_AFTER_MS", default_value_t = node_enforcer::stall::STALL_AFTER.as_millis() as u64)]
    stall_after_ms: u64,
    /// Flow log events per second for the whole node (burst: the same);
    /// the datapath drops and counts the rest. 0: no flow events at all.
    #[arg(long, env = "PALISADE_FLOW_LOG_RATE", default_value_t = 1000)]
    flow_log_rate: u32,
    /// Where flow log lines (JSON) go: `-` for stdout, else a file appended to.
    #[arg(long, env = "PALISADE_FLOW_LOG_PATH", default_value = "-")]
    flow_log_path: String,
    /// How a pod-up attaches the programs: fast (clsact filters, which cost
    /// the kernel no RCU grace period, promoted to TCX links at the head of
    /// the interface's chains once the node is quiet) or tcx (the links at
    /// once: two grace periods under RTNL per pod, so bursts queue).
    #[arg(long, env = "PALISADE_ATTACH", default_value = "fast")]
    attach: node_enforcer::datapath::AttachMode,
    /// With --attach fast: promote once no pod-up or pod-down came for
    /// this long.
    #[arg(long, env = "PALISADE_PROMOTE_QUIET_MS", default_value_t = node_enforcer::reconciler::PROMOTE_QUIET.as_millis() as u64)]
    promote_quiet_ms: u64,
    /// With --attach fast: the longest an interface stays on filters while
    /// pod-ups keep coming.
    #[arg(long, env = "PALISADE_PROMOTE_MAX_WAIT_MS", default_value_t = node_enforcer::reconciler::PROMOTE_MAX_WAIT.as_millis() as u64)]
    promote_max_wait_ms: u64,
    /// The cluster's DNS servers, whose answers teach egress rules by
    /// domain name: the kube-dns Service's ClusterIP (answers come back
    /// from it) and any address pods query directly (a node-local cache).
    /// Repeat the flag or separate with commas. None: no learner runs,
    /// rules by name match nothing, and the dump says so.
    #[arg(
        long = "dns-server",
        env = "PALISADE_DNS_SERVERS",
        value_delimiter = ','
    )]
    dns_servers: Vec<std::net::IpAddr>,
    /// An address learned by name stays allowed at least this long after
    /// its answer, whatever its TTL (clients connect after the answer).
    #[arg(long, env = "PALISADE_DNS_MIN_TTL_SECS", default_value_t = palisade_dns::Limits::default().min_ttl_s)]
    dns_min_ttl_secs: u32,
    /// Names remembered per pod; beyond it the least recently answered is
    /// forgotten (counted).
    #[arg(long, env = "PALISADE_DNS_NAMES_PER_POD", default_value_t = palisade_dns::Limits::default().names_per_pod)]
    dns_names_per_pod: usize,
    /// Addresses learned per name; beyond it the soonest to expire go.
    #[arg(long, env = "PALISADE_DNS_ADDRS_PER_NAME", default_value_t = palisade_dns::Limits::default().addrs_per_name)]
    dns_addrs_per_name: usize,
    /// Learned (rule, address) entries per pod; beyond it the soonest to
    /// expire go (counted: the next connection needs a new answer).
    #[arg(long, env = "PALISADE_DNS_ENTRIES_PER_POD", default_value_t = palisade_dns::Limits::default().entries_per_pod)]
    dns_entries_per_pod: usize,
    /// Queries awaiting their answer per pod; beyond it the oldest is
    /// forgotten (its answer then teaches nothing).
    #[arg(long, env = "PALISADE_DNS_PENDING_PER_POD", default_value_t = palisade_dns::Limits::default().pending_per_pod)]
    dns_pending_per_pod: usize,
    /// Bytes of the datapath's ring of DNS frames copied and held for the
    /// learner: what bounds the answers held at once (an answer that does
    /// not fit passes unheld, counted, and teaches nothing). A power of
    /// two from 4096; applied when the ring is first created on a node.
    #[arg(long, env = "PALISADE_DNS_HELD_BYTES", default_value_t = palisade_ebpf::DNS_FRAMES_BYTES)]
    dns_held_bytes: u32,
}

/// The longest the enforcer spends promoting interfaces (two grace periods
/// each: 400 interfaces here) and writing the pods checkpoint before it
/// exits, well inside the pod's termination grace period.
const PROMOTE_ON_EXIT: std::time::Duration = std::time::Duration::from_secs(10);

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
    let telemetry = palisade_runtime::telemetry::start(
        args.otlp_endpoint.clone(),
        telemetry::export_config(&args.node_name),
    );
    let result = run(args).await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    if let Err(e) = result {
        tracing::error!("{e}");
        eprintln!("palisade-enforcer: {e}");
        std::process::exit(1);
    }
}

/// SIGTERM (the kubelet's stop) or SIGINT, registered once and early so
/// that none is lost between phases.
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn listen() -> Result<Stop, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| signal(kind).map_err(|e| format!("listening for signals: {e}"));
        Ok(Stop {
            term: listen(SignalKind::terminate())?,
            int: listen(SignalKind::interrupt())?,
        })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Whatever stopped the enforcer, told once by `main` (each part's own
/// error, typed or text).
type RunError = Box<dyn std::error::Error + Send + Sync>;

/// A setting `run` refuses before it waits for the node lock.
#[derive(Debug, thiserror::Error)]
enum SettingError {
    /// A flag's value (`flag` names it, with its dashes) is refused.
    #[error("{flag}: {problem}")]
    Flag { flag: &'static str, problem: String },
    /// A TLS file could not be read (the text names it).
    #[error("--tls-ca, --tls-cert, --tls-key: {0}")]
    TlsFiles(String),
    /// The TLS files do not make a client configuration for `controller`.
    #[error("TLS towards the controller {controller}: {problem}")]
    Tls { controller: String, problem: String },
}

fn flag(flag: &'static str, problem: impl Into<String>) -> SettingError {
    SettingError::Flag {
        flag,
        problem: problem.into(),
    }
}

/// `--programs-loaded-file`: removed at start, written once the programs
/// are known to load here.
struct ProgramsLoaded(Option<PathBuf>);

impl ProgramsLoaded {
    fn reset(path: Option<PathBuf>) -> Result<Self, String> {
        if let Some(p) = &path {
            match std::fs::remove_file(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "--programs-loaded-file: removing {}: {e}",
                        p.display()
                    ))
                }
                _ => {}
            }
        }
        Ok(ProgramsLoaded(path))
    }

    fn write(&self) -> Result<(), String> {
        match &self.0 {
            Some(p) => std::fs::write(p, b"")
                .map_err(|e| format!("--programs-loaded-file: writing {}: {e}", p.display())),
            None => Ok(()),
        }
    }
}

/// Checks every setting that needs no node state (flags; the TLS files,
/// read and parsed), and gives the controller client's options. Done
/// before the node lock: in a surge rollout the new enforcer waits for the
/// old one to exit, and a bad setting found after that would leave the
/// node with no enforcer at all.
fn check_settings(args: &Args) -> Result<palisade_runtime::transport::ClientOptions, SettingError> {
    if args.node_name.is_empty() {
        return Err(flag("--node-name", "must not be empty"));
    }
    if args.pod_up_deadline_ms == 0 || args.pod_up_deadline_ms > 600_000 {
        return Err(flag(
            "--pod-up-deadline-ms",
            format!("{} is out of range 1..=600000", args.pod_up_deadline_ms),
        ));
    }
    if args.conntrack_cleanup_secs == 0 {
        return Err(flag("--conntrack-cleanup-secs", "must be at least 1"));
    }
    if args.conntrack_max_entries == 0 {
        return Err(flag("--conntrack-max-entries", "must be at least 1"));
    }
    node_enforcer::datapath::bpf::check_dns_frames_bytes(args.dns_held_bytes)
        .map_err(|e| flag("--dns-held-bytes", e))?;
    node_enforcer::flow_log::check_rate(args.flow_log_rate)
        .map_err(|e| flag("--flow-log-rate", e.to_string()))?;
    if args.controller_keepalive_ms == 0 {
        return Err(flag("--controller-keepalive-ms", "must be at least 1"));
    }
    let tls = match &args.tls_ca {
        Some(ca) => {
            let tls = palisade_runtime::transport::client_tls(
                ca,
                args.tls_cert.as_deref().zip(args.tls_key.as_deref()),
                args.tls_server_name.as_deref(),
            )
            .map_err(SettingError::TlsFiles)?;
            for controller in &args.controller {
                check_tls(&tls, controller)?;
            }
            Some(tls)
        }
        None => {
            if args.controller.iter().any(|a| matches!(a, Address::Tcp(_))) {
                tracing::warn!("talking to the controller over plaintext TCP: use --tls-ca, --tls-cert and --tls-key outside a lab");
            }
            None
        }
    };
    Ok(palisade_runtime::transport::ClientOptions {
        keepalive: Some(std::time::Duration::from_millis(
            args.controller_keepalive_ms,
        )),
        tls,
    })
}

/// Parses the certificates and key as a connection to `controller` will
/// (tonic reads the PEM only when an endpoint takes the configuration).
fn check_tls(
    tls: &tonic::transport::ClientTlsConfig,
    controller: &Address,
) -> Result<(), SettingError> {
    let uri = match controller {
        // As the transport dials a socket: the URI is a placeholder.
        Address::Unix(_) => "http://[::]:50051".to_string(),
        Address::Tcp(uri) => match uri.strip_prefix("http://") {
            Some(rest) => format!("https://{rest}"),
            None => uri.clone(),
        },
    };
    let problem = |problem: String| SettingError::Tls {
        controller: controller.to_string(),
        problem,
    };
    tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| problem(e.to_string()))?
        .tls_config(tls.clone())
        .map_err(|e| problem(palisade_runtime::transport::source_chain(&e)))?;
    Ok(())
}

async fn run(args: Args) -> Result<(), RunError> {
    let client_options = check_settings(&args)?;
    // Listened for from here on: as a container's PID 1 the enforcer has no
    // default action for SIGTERM, so one that came before a listener (while
    // it waits for the node lock, in a surge rollout) would be lost and the
    // kubelet would have to SIGKILL it after the grace period.
    let mut stop = Stop::listen()?;
    let load = node_enforcer::datapath::bpf::LoadOptions {
        conntrack_entries: Some(args.conntrack_max_entries),
        dns_frames_bytes: Some(args.dns_held_bytes),
    };
    let loaded = ProgramsLoaded::reset(args.programs_loaded_file.clone())?;
    // Before waiting on the lock, as the settings: a version whose programs
    // this node refuses must fail while the running enforcer still has the
    // node. With the lock free the load itself comes first (no preflight:
    // it costs about as much as the load).
    let preflighted = node_enforcer::lock::is_held(&args.state_dir);
    if preflighted {
        let started = std::time::Instant::now();
        BpfDatapath::preflight(&args.pin_root, load).map_err(|e| {
            format!("the eBPF programs cannot be loaded on this node, so this enforcer does not take it over: {e}")
        })?;
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "preflight: the eBPF programs load on this node"
        );
        loaded.write()?;
    }
    // Before touching anything shared: one enforcer per node.
    let lock_timeout = (args.lock_timeout_secs > 0)
        .then(|| std::time::Duration::from_secs(args.lock_timeout_secs));
    let (state_dir, pin_root) = (args.state_dir.clone(), args.pin_root.clone());
    let stop_waiting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop_waiting.clone();
    let mut waiting = tokio::task::spawn_blocking(move || {
        node_enforcer::lock::acquire(&state_dir, &pin_root, lock_timeout, &flag)
    });
    let _lock = tokio::select! {
        lock = &mut waiting => lock.map_err(|e| format!("waiting for the node lock: {e}"))??,
        () = stop.wait() => {
            stop_waiting.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = waiting.await;
            tracing::info!("stopped while waiting for the node lock; nothing was touched");
            return Ok(());
        }
    };
    let mut datapath = BpfDatapath::load_opts(&args.pin_root, load)
        .map_err(|e| e.to_string())?
        .with_attach_mode(args.attach);
    if !preflighted {
        loaded.write()?;
    }
    let share = datapath
        .set_conntrack_share((args.conntrack_share > 0).then_some(args.conntrack_share))
        .map_err(|e| format!("--conntrack-share: {e}"))?;
    tracing::info!(share, "conntrack entries one pod hook may hold");
    let checkpoint = Checkpoint::open(&args.state_dir)?;
    let saved = checkpoint.load()?;
    let controllers = plan_client::Controllers::new(
        args.controller.clone(),
        client_options,
        saved.highest_term(),
    )?;
    let enforcer_id = node_enforcer::incarnation::enforcer_id(&args.node_name);
    let (tx, rx) = mpsc::channel(256);
    let (state_tx, state_rx) = watch::channel(NodeState::default());
    let (fetch_tx, fetch_rx) = mpsc::unbounded_channel();
    let links_pending = node_enforcer::links::Pending::default();
    let mut reconciler = Reconciler::new(args.node_name.clone(), enforcer_id.clone(), datapath)
        .with_link_events(links_pending.clone())
        .with_checkpoint(checkpoint)
        .with_mode(args.mode)
        .with_fetcher(fetch_tx)
        .with_max_table_entries(args.max_table_entries)
        .with_promotion(
            std::time::Duration::from_millis(args.promote_quiet_ms),
            std::time::Duration::from_millis(args.promote_max_wait_ms),
        )
        .with_background_compile(tx.clone(), args.background_compile_peers)
        .map_err(|e| format!("starting the compile thread: {e}"))?;
    // The learner hears of pods from the reconciler; it starts once the
    // reconciler runs (updates queue meanwhile).
    let learner_updates = if args.dns_servers.is_empty() {
        None
    } else {
        let (names_tx, names_rx) = mpsc::unbounded_channel();
        reconciler = reconciler.with_learner(names_tx);
        Some(names_rx)
    };
    let busy_since = reconciler.busy_since();
    // Before serving anything: the previous process's links keep enforcing
    // until this one has taken them over.
    reconciler.recover(saved)?;
    let (dead_tx, dead_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("reconciler".into())
        .spawn(move || {
            // Dropped when the thread ends, by return or by panic.
            let _alive = dead_tx;
            reconciler.run(rx, state_tx)
        })
        .map_err(|e| format!("starting the reconciler: {e}"))?;
    let learning = if let Some(updates) = learner_updates {
        let limits = palisade_dns::Limits {
            min_ttl_s: args.dns_min_ttl_secs,
            names_per_pod: args.dns_names_per_pod,
            addrs_per_name: args.dns_addrs_per_name,
            entries_per_pod: args.dns_entries_per_pod,
            pending_per_pod: args.dns_pending_per_pod,
            ..Default::default()
        };
        let (_, learning) = node_enforcer::names::task::start(
            node_enforcer::names::task::Options {
                pin_root: args.pin_root.clone(),
                servers: args.dns_servers.clone(),
                limits,
                reassembly: Default::default(),
            },
            updates,
        )
        .map_err(|e| format!("starting the learner: {e}"))?;
        tracing::info!(servers = ?args.dns_servers, "learning egress by domain name from these DNS servers");
        Some(learning)
    } else {
        None
    };
    let mut handle = Handle::new(
        tx.clone(),
        std::time::Duration::from_millis(args.pod_up_deadline_ms),
    );
    if let Some(learning) = learning {
        handle = handle.with_learning(learning);
    }
    node_enforcer::links::watch(tx.clone(), links_pending)?;
    if let Some(addr) = args.metrics_addr {
        let listener = palisade_runtime::metrics_http::bind(addr).await?;
        tracing::info!(metrics_addr = %listener.local_addr().map_err(|e| e.to_string())?, "serving metrics");
        let scrape = node_enforcer::metrics::scraper(handle.clone(), args.pin_root.clone());
        tokio::spawn(palisade_runtime::metrics_http::serve(listener, scrape));
    }
    node_enforcer::flow_log::start(
        node_enforcer::flow_log::Options {
            mode: args.flow_log,
            rate_per_sec: args.flow_log_rate,
            path: args.flow_log_path.clone(),
            node: args.node_name.clone(),
            pin_root: args.pin_root.clone(),
            state_dir: args.state_dir.clone(),
        },
        handle.clone(),
    )
    .await?;
    let mut conntrack = node_enforcer::conntrack::sweep::open(
        &args.pin_root,
        node_enforcer::conntrack::sweep::Asking::with(args.conntrack_ask),
    )?;
    tracing::info!(asked_by = %conntrack.asking.describe(), "conntrack cleanup asks the kernel by");
    let cleanup_tx = tx.clone();
    let period = std::time::Duration::from_secs(args.conntrack_cleanup_secs);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(period);
        every.tick().await;
        loop {
            every.tick().await;
            // Off the async runtime: a pass over a million entries takes a
            // while and must not stall the gRPC servers.
            let (map, report) = match tokio::task::spawn_blocking(move || {
                let r = node_enforcer::conntrack::sweep::sweep(&mut conntrack);
                (conntrack, r)
            })
            .await
            {
                Ok(x) => x,
                Err(_) => return,
            };
            conntrack = map;
            // The reconciler keeps the text for its dump and metrics.
            let report = report.map_err(|e| e.to_string());
            if cleanup_tx
                .send(Event::ConntrackCleaned(report))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    // Node addresses change without an event we subscribe to (yet), and a
    // lost link event must not leave a vanished pod forever: look every few
    // seconds.
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            if tx.send(Event::Tick).await.is_err() {
                return;
            }
        }
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let reachable = std::sync::Arc::new(tokio::sync::Notify::new());
    let plan = tokio::spawn(plan_client::run(
        controllers.clone(),
        args.node_name.clone(),
        enforcer_id,
        handle.clone(),
        stop_rx,
        reachable.clone(),
    ));
    let report = tokio::spawn(plan_client::report(controllers.clone(), state_rx));
    let fetch = tokio::spawn(plan_client::fetch_pods(
        controllers,
        args.node_name.clone(),
        handle.clone(),
        fetch_rx,
        std::time::Duration::from_millis(args.pod_up_deadline_ms),
        reachable,
    ));

    let on_exit = handle.clone();
    let (router, health) = server::router(handle, args.aws_interface_prefix.clone()).await?;
    tokio::spawn(node_enforcer::stall::watch(
        busy_since,
        std::time::Duration::from_millis(args.stall_after_ms),
        health.clone(),
    ));
    let socket = Address::Unix(args.cni_socket.clone());
    // Bound before "serving" is said: the CNI plugin may call at once.
    let listener = Listener::bind(&socket).await?;
    tracing::info!(socket = %socket, pin_root = %args.pin_root.display(), mode = %args.mode, "serving");
    let mut reconciler_died = false;
    let result = {
        let shutdown = async {
            tokio::select! {
                () = stop.wait() => tracing::info!("shutting down"),
                _ = dead_rx => {
                    // Nothing can change the datapath any more: say so, and
                    // exit so the node restarts us (the pinned programs keep
                    // enforcing meanwhile).
                    server::set_not_serving(&health).await;
                    tracing::error!("the reconciler thread died; exiting");
                    reconciler_died = true;
                }
            }
        };
        serve_on(router, listener, &socket, shutdown).await
    };
    let _ = stop_tx.send(true);
    plan.abort();
    report.abort();
    fetch.abort();
    // Still ours: the lock is held until the process exits.
    let _ = std::fs::remove_file(&args.cni_socket);
    // Links and maps are pinned: the programs keep enforcing after exit, and
    // the next enforcer takes them over.
    if reconciler_died {
        return Err("the reconciler thread died".into());
    }
    // An interface still on filters would be unknown to an older version
    // taking over (a rollback): give every one its links first. The answer
    // also waits for the pods checkpoint: the reconciler thread is not
    // joined, and the process ends with this function.
    match tokio::time::timeout(PROMOTE_ON_EXIT, on_exit.promote_all()).await {
        Ok(Ok(0)) => {}
        Ok(Ok(left)) => {
            tracing::warn!(left, "interfaces left on filters at exit; the next enforcer promotes them")
        }
        Ok(Err(e)) => tracing::warn!("promoting interfaces and saving pods at exit: {e}"),
        Err(_) => tracing::warn!(
            "promoting interfaces and saving pods at exit took over {PROMOTE_ON_EXIT:?}; the next enforcer promotes the rest, and finds the pods the checkpoint missed by their addresses"
        ),
    }
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A surge rollout: the old enforcer holds the node's lock. A new one
    /// with a bad setting must fail at once, not once the old one exits.
    #[tokio::test]
    async fn a_bad_setting_fails_before_the_node_lock_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let (state, pins) = (dir.path().join("state"), dir.path().join("pins"));
        let stop = std::sync::atomic::AtomicBool::new(false);
        let _old = node_enforcer::lock::acquire(&state, &pins, None, &stop).unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a PEM file").unwrap();
        let garbage = garbage.to_str().unwrap();
        let missing = dir.path().join("missing.pem");
        let missing = missing.to_str().unwrap();
        let cases: [(&[&str], &str); 6] = [
            (
                &["--conntrack-cleanup-secs", "0"],
                "--conntrack-cleanup-secs: must be at least 1",
            ),
            (
                &["--dns-held-bytes", "1000"],
                "--dns-held-bytes: 1000 bytes",
            ),
            (
                &["--controller-keepalive-ms", "0"],
                "--controller-keepalive-ms: must be at least 1",
            ),
            (
                &["--conntrack-max-entries", "0"],
                "--conntrack-max-entries: must be at least 1",
            ),
            (
                &["--tls-ca", missing],
                &format!("--tls-ca, --tls-cert, --tls-key: reading {missing}"),
            ),
            (
                &[
                    "--tls-ca",
                    garbage,
                    "--tls-cert",
                    garbage,
                    "--tls-key",
                    garbage,
                ],
                "TLS towards the controller unix:",
            ),
        ];
        for (flags, expected) in cases {
            let mut argv = vec![
                "palisade-enforcer",
                "--node-name",
                "n1",
                "--controller",
                "unix:/nonexistent/controller.sock",
                "--state-dir",
                state.to_str().unwrap(),
                "--pin-root",
                pins.to_str().unwrap(),
                // Bounds the test should the lock be waited for: then the
                // error is the lock's, not the setting's.
                "--lock-timeout-secs",
                "1",
            ];
            argv.extend_from_slice(flags);
            let args = Args::try_parse_from(argv).unwrap();
            let e = run(args).await.unwrap_err().to_string();
            assert!(e.starts_with(expected), "{flags:?}: {e}");
        }
    }
}
