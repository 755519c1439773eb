//! palisade-lab: runs a scenario on a lab node built on this machine.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use palisade_e2e::lab::ImageRun;
use palisade_e2e::preflight::{Missing, NotRoot};
use palisade_e2e::runtime::PodRuntime;
use palisade_e2e::scenario::Mode;
use palisade_e2e::{run_scenario, Cancel, Interrupted, Lab, LabConfig, Scenario};

/// Exit codes, stable for scripts and CI.
const EXIT_FAILED: u8 = 1;
const EXIT_CANNOT_RUN: u8 = 2;
const EXIT_LAB_ERROR: u8 = 3;
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Parser)]
#[command(
    name = "palisade-lab",
    about = "A Kubernetes node on this machine: netns pods, the CNI chain, the Palisade controller and enforcer, real traffic",
    after_help = "Exit codes: 0 every expectation met, 1 an expectation failed, 2 cannot run (not root, missing pieces, bad scenario), 3 the lab failed, 130 interrupted."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a lab, play the scenario, print the probe table, clean up.
    Run {
        scenario: PathBuf,
        /// Where palisade-controller, palisade-enforcer and palisade-cni are
        /// [default: the directory of this executable].
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Where the standard CNI plugins (ptp, host-local) are.
        #[arg(long, default_value = "/usr/lib/cni")]
        cni_bin_dir: PathBuf,
        /// Keep the process logs after the run and print where they are.
        #[arg(long)]
        keep_logs: bool,
        /// Seconds to wait for each change to be realized on the node.
        #[arg(long, default_value_t = 30)]
        realize_timeout: u64,
        /// Plain ptp networking, no Palisade process: checks the lab itself.
        #[arg(long)]
        baseline: bool,
        #[command(flatten)]
        node_processes: NodeProcesses,
        /// datapath: a real lab; model: the reference model alone (no root,
        /// no lab, milliseconds; refuses what it cannot judge).
        #[arg(long, default_value = "datapath", value_parser = ["datapath", "model"])]
        engine: String,
        /// Who starts the pods, over the scenario's `runtime:` (lab: the
        /// lab runs the CNI chain itself; containerd: a containerd per node
        /// over CRI).
        #[arg(long, value_parser = ["lab", "containerd"])]
        runtime: Option<String>,
    },
    /// DNS latency benchmark: queries through the lab's resolver from a
    /// pod that learns by domain name (its answers held until learned) and
    /// from one without domain rules, interleaved, on the scenario's lab
    /// (its steps played first); prints `bench=dns with_p50_ms=
    /// with_p99_ms= without_p50_ms= without_p99_ms= added_p99_ms=`.
    BenchDns {
        #[arg(long, default_value_t = 2000)]
        queries: usize,
        #[arg(long, default_value = "examples/dns-names.yaml")]
        scenario: PathBuf,
        /// The learning pod, and the one without domain rules.
        #[arg(long, default_value = "app/client")]
        with: String,
        #[arg(long, default_value = "web/api")]
        without: String,
        /// The name both ask.
        #[arg(long, default_value = "api.example.com")]
        name: String,
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        #[arg(long, default_value = "/usr/lib/cni")]
        cni_bin_dir: PathBuf,
    },
    /// Pod-up benchmark: start PODS pods, PARALLEL at a time, through the
    /// real CNI chain and enforcer; print the palisade-cni ADD time (exec to
    /// reply) as `mode=M pods=N p50_ms=X p99_ms=Y`.
    BenchPodup {
        #[arg(long, default_value_t = 1000)]
        pods: usize,
        #[arg(long, default_value_t = 20)]
        parallel: usize,
        /// Passed to the enforcer as --mode; none: no flag (its default).
        #[arg(long, value_parser = ["standard", "strict"])]
        mode: Option<String>,
        /// Passed to the enforcer as --pod-up-deadline-ms.
        #[arg(long)]
        pod_up_deadline_ms: Option<u64>,
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        #[arg(long, default_value = "/usr/lib/cni")]
        cni_bin_dir: PathBuf,
        /// containerd: time RunPodSandbox instead, in bursts, with and
        /// without palisade-cni in the chain (interleaved), one line per
        /// burst size: `runtime=containerd burst=N with_p50_ms=...`.
        #[arg(long, value_parser = ["lab", "containerd"], default_value = "lab")]
        runtime: String,
        /// With --runtime containerd: the burst sizes.
        #[arg(long, value_delimiter = ',', default_value = "20,100")]
        bursts: Vec<usize>,
        /// With --runtime containerd: bursts of each size and chain.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// With --runtime containerd: pods started one at a time first,
        /// with and without palisade-cni: the uncontended baseline.
        #[arg(long, default_value_t = 40)]
        uncontended: usize,
    },
    /// Build a lab, play the scenario, then keep it running for a person to
    /// explore (grpcurl, nsenter) until Ctrl-C; cleans up as `run` does.
    Up {
        scenario: PathBuf,
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        #[arg(long, default_value = "/usr/lib/cni")]
        cni_bin_dir: PathBuf,
        #[arg(long, default_value_t = 30)]
        realize_timeout: u64,
        /// As for `run`.
        #[arg(long, value_parser = ["lab", "containerd"])]
        runtime: Option<String>,
        #[command(flatten)]
        node_processes: NodeProcesses,
    },
    /// Check a scenario file without building anything.
    Validate { scenario: PathBuf },
    /// Remove what labs killed before their cleanup left behind
    /// (labs still running are left alone).
    Clean,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Validate { scenario } => match Scenario::from_file(&scenario) {
            Ok(s) => {
                let probes: usize = s.steps.iter().map(|s| s.probes.len()).sum();
                println!(
                    "{}: ok ({} objects, {} steps, {probes} probes)",
                    scenario.display(),
                    s.objects.len(),
                    s.steps.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("palisade-lab: {e:#}");
                ExitCode::from(EXIT_CANNOT_RUN)
            }
        },
        Cmd::Clean => clean(),
        Cmd::BenchDns {
            queries,
            scenario,
            with,
            without,
            name,
            bin_dir,
            cni_bin_dir,
        } => ExitCode::from(bench_dns(
            &scenario,
            queries,
            [&with, &without],
            &name,
            bin_dir,
            cni_bin_dir,
        )),
        Cmd::BenchPodup {
            pods,
            parallel,
            mode,
            pod_up_deadline_ms,
            bin_dir,
            cni_bin_dir,
            runtime,
            bursts,
            rounds,
            uncontended,
        } => {
            let cri = runtime == "containerd";
            let mut config = LabConfig {
                cni_bin_dir,
                mode: mode.as_deref().and_then(Mode::parse),
                pod_up_deadline: pod_up_deadline_ms.map(Duration::from_millis),
                // Room for every pod: host-local leaves out the network,
                // gateway and broadcast addresses.
                pod_subnet: bench_subnet(if cri {
                    bursts.iter().copied().max().unwrap_or(1)
                } else {
                    pods
                }),
                cni_timeout: Duration::from_secs(60),
                realize_timeout: Duration::from_secs(120),
                ..LabConfig::default()
            };
            if let Some(dir) = bin_dir {
                config.bin_dir = dir;
            }
            if cri {
                config.runtime = PodRuntime::Containerd;
                return ExitCode::from(bench_runtime(&bursts, rounds, uncontended, config));
            }
            ExitCode::from(bench(
                pods,
                parallel,
                mode.as_deref().unwrap_or("default"),
                config,
            ))
        }
        Cmd::Run {
            scenario,
            bin_dir,
            cni_bin_dir,
            keep_logs,
            realize_timeout,
            baseline,
            engine,
            runtime,
            node_processes,
        } => {
            if engine == "model" {
                return ExitCode::from(run_model(&scenario));
            }
            let mut config = LabConfig {
                cni_bin_dir,
                keep_logs,
                with_palisade: !baseline,
                realize_timeout: Duration::from_secs(realize_timeout),
                image: node_processes.image_run(),
                ..LabConfig::default()
            };
            if let Some(dir) = bin_dir {
                config.bin_dir = dir;
            }
            ExitCode::from(run(&scenario, config, runtime_arg(runtime), false))
        }
        Cmd::Up {
            scenario,
            bin_dir,
            cni_bin_dir,
            realize_timeout,
            runtime,
            node_processes,
        } => {
            let mut config = LabConfig {
                cni_bin_dir,
                realize_timeout: Duration::from_secs(realize_timeout),
                image: node_processes.image_run(),
                ..LabConfig::default()
            };
            if let Some(dir) = bin_dir {
                config.bin_dir = dir;
            }
            ExitCode::from(run(&scenario, config, runtime_arg(runtime), true))
        }
    }
}

/// How the node processes (controller, enforcers) run; who starts the
/// pods is `--runtime`, apart from this.
#[derive(clap::Args)]
struct NodeProcesses {
    /// host: the workspace binaries as the lab's own processes (see
    /// --bin-dir); image: Palisade's image (--image) run as the Helm
    /// chart's pods, rendered by the Helm library, on podman.
    #[arg(long, default_value = "host", value_parser = ["host", "image"])]
    node_processes: String,
    /// The image for --node-processes image (scripts/image.sh builds it)
    /// [default: the repository and version scripts/image.sh tags].
    #[arg(long)]
    image: Option<String>,
    /// The chart for --node-processes image [default: this repository's helm/palisade].
    #[arg(long)]
    chart: Option<PathBuf>,
}

impl NodeProcesses {
    fn image_run(self) -> Option<ImageRun> {
        (self.node_processes == "image").then(|| ImageRun {
            image: self
                .image
                .unwrap_or_else(palisade_e2e::image::default_reference),
            chart: self
                .chart
                .unwrap_or_else(palisade_e2e::chart::default_chart),
        })
    }
}

/// `run --engine model`: the table from the reference model alone.
fn run_model(path: &std::path::Path) -> u8 {
    let scenario = match Scenario::from_file(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return EXIT_CANNOT_RUN;
        }
    };
    match palisade_e2e::model_engine::run(&scenario, &mut std::io::stdout()) {
        Ok(report) => {
            println!("{} (model)", report.summary());
            if report.passed() {
                0
            } else {
                EXIT_FAILED
            }
        }
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            EXIT_CANNOT_RUN
        }
    }
}

/// A `--runtime` value (clap has checked it).
fn runtime_arg(r: Option<String>) -> Option<PodRuntime> {
    r.as_deref().and_then(PodRuntime::parse)
}

/// `run`, or with `stay_up` (`up`): after the scenario, print how to reach
/// the lab and wait for a signal before cleaning up.
fn run(
    path: &std::path::Path,
    config: LabConfig,
    runtime: Option<PodRuntime>,
    stay_up: bool,
) -> u8 {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("palisade-lab: {NotRoot}");
        return EXIT_CANNOT_RUN;
    }
    let scenario = match Scenario::from_file(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return EXIT_CANNOT_RUN;
        }
    };
    let mut config = config.for_scenario(&scenario);
    if let Some(r) = runtime {
        config.runtime = r;
    }
    let signalled = watch_signals(config.cancel.clone());
    let keep_logs = config.keep_logs;
    let mut lab = match Lab::start(config) {
        Ok(lab) => lab,
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("palisade-lab: interrupted");
            return EXIT_INTERRUPTED;
        }
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return if e.chain().any(|c| c.is::<Missing>() || c.is::<NotRoot>()) {
                EXIT_CANNOT_RUN
            } else {
                EXIT_LAB_ERROR
            };
        }
    };
    println!(
        "lab {} (nodes {}, logs {})",
        lab.id(),
        lab.node_names().join(", "),
        lab.log_dir().display()
    );
    let result = run_scenario(&mut lab, &scenario, &mut std::io::stdout());
    let code = match &result {
        Ok(report) => {
            println!("{}", report.summary());
            if report.passed() {
                0
            } else {
                EXIT_FAILED
            }
        }
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("palisade-lab: interrupted, cleaning up");
            EXIT_INTERRUPTED
        }
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            EXIT_LAB_ERROR
        }
    };
    if (code == EXIT_FAILED || code == EXIT_LAB_ERROR) && !keep_logs {
        eprint!("{}", lab.log_tails(40));
    }
    if stay_up && code != EXIT_INTERRUPTED && code != EXIT_LAB_ERROR {
        print!("{}", how_to_reach(&lab));
        // Blocks until SIGINT or SIGTERM: the lab is for a person now.
        let _ = signalled.recv();
    }
    let log_dir = lab.log_dir().to_path_buf();
    if let Err(e) = lab.shutdown() {
        eprintln!("palisade-lab: {e:#}");
        return if code == 0 { EXIT_LAB_ERROR } else { code };
    }
    if keep_logs {
        println!("logs kept in {}", log_dir.display());
    }
    code
}

/// The smallest /N of 10.244.0.0 with an address for every pod.
/// `bench-dns`: DNS latency with and without learning, interleaved.
fn bench_dns(
    scenario: &std::path::Path,
    queries: usize,
    pods: [&str; 2],
    name: &str,
    bin_dir: Option<PathBuf>,
    cni_bin_dir: PathBuf,
) -> u8 {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("palisade-lab: {NotRoot}");
        return EXIT_CANNOT_RUN;
    }
    let scenario = match Scenario::from_file(scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return EXIT_CANNOT_RUN;
        }
    };
    let mut config = LabConfig {
        cni_bin_dir,
        ..LabConfig::default()
    }
    .for_scenario(&scenario);
    if let Some(dir) = bin_dir {
        config.bin_dir = dir;
    }
    watch_signals(config.cancel.clone());
    let mut lab = match Lab::start(config) {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return EXIT_LAB_ERROR;
        }
    };
    let result = (|| -> anyhow::Result<String> {
        let mut sink = Vec::new();
        let report = palisade_e2e::run_scenario(&mut lab, &scenario, &mut sink)?;
        anyhow::ensure!(
            report.passed(),
            "the scenario did not pass: {}\n{}",
            report.summary(),
            String::from_utf8_lossy(&sink)
        );
        let resolver = lab.dns_resolver()?;
        let ns = |p: &str| -> anyhow::Result<palisade_e2e::netns::NetNs> {
            let pod = palisade_e2e::PodName::parse(p)?;
            let path = lab
                .pod_netns(&pod)
                .ok_or_else(|| anyhow::anyhow!("{p}: no such pod in the scenario"))?;
            Ok(palisade_e2e::netns::NetNs::from_existing(path))
        };
        let (with, without) = (ns(pods[0])?, ns(pods[1])?);
        let timeout = std::time::Duration::from_secs(2);
        let mut times = [Vec::with_capacity(queries), Vec::with_capacity(queries)];
        for _ in 0..queries {
            for (i, from) in [&with, &without].into_iter().enumerate() {
                let started = std::time::Instant::now();
                palisade_e2e::dns::resolve(from, resolver, name, timeout)?;
                times[i].push(started.elapsed());
            }
        }
        let ms = |v: &[std::time::Duration], p: f64| {
            palisade_e2e::bench::percentile(v, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        let (w50, w99, o50, o99) = (
            ms(&times[0], 50.0),
            ms(&times[0], 99.0),
            ms(&times[1], 50.0),
            ms(&times[1], 99.0),
        );
        // The datapath's copy to the re-injection, the learner's writes
        // between: answer to map entry, as the enforcer timed it.
        let names = lab
            .enforcer_state()?
            .names
            .ok_or_else(|| anyhow::anyhow!("the enforcer runs no learner"))?;
        Ok(format!(
            "bench=dns queries={queries} with_p50_ms={w50:.3} with_p99_ms={w99:.3} without_p50_ms={o50:.3} without_p99_ms={o99:.3} added_p99_ms={:.3}\n\
             bench=dns part=hold held={} hold_p50_us={} hold_p99_us={} hold_max_us={}",
            w99 - o99,
            names.recent_holds,
            names.hold_p50_us,
            names.hold_p99_us,
            names.hold_max_us
        ))
    })();
    let code = match result {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            eprint!("{}", lab.log_tails(20));
            EXIT_LAB_ERROR
        }
    };
    if let Err(e) = lab.shutdown() {
        eprintln!("palisade-lab: {e:#}");
        return if code == 0 { EXIT_LAB_ERROR } else { code };
    }
    code
}

fn bench_subnet(pods: usize) -> String {
    let mut prefix = 24u32;
    while prefix > 16 && (1usize << (32 - prefix)) < pods + 3 {
        prefix -= 1;
    }
    format!("10.244.0.0/{prefix}")
}

fn bench(pods: usize, parallel: usize, mode: &str, config: LabConfig) -> u8 {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("palisade-lab: {NotRoot}");
        return EXIT_CANNOT_RUN;
    }
    watch_signals(config.cancel.clone());
    let mut lab = match Lab::start(config) {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return if e.is::<Interrupted>() {
                EXIT_INTERRUPTED
            } else {
                EXIT_LAB_ERROR
            };
        }
    };
    eprintln!(
        "lab {}: starting {pods} pods, {parallel} at a time (mode {mode})",
        lab.id()
    );
    let result = lab.bench_pod_up(pods, parallel);
    let code = match &result {
        Ok(times) => {
            let last: Vec<_> = times.iter().map(|t| t.last).collect();
            let before: Vec<_> = times.iter().map(|t| t.before_last).collect();
            println!(
                "{} {}",
                palisade_e2e::bench::result_line(mode, &last),
                palisade_e2e::bench::chain_fields(&before)
            );
            0
        }
        Err(e) if e.is::<Interrupted>() => EXIT_INTERRUPTED,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            eprint!("{}", lab.log_tails(20));
            EXIT_LAB_ERROR
        }
    };
    eprintln!("cleaning up {} pods", lab.pods().count());
    if let Err(e) = lab.shutdown() {
        eprintln!("palisade-lab: {e:#}");
        return if code == 0 { EXIT_LAB_ERROR } else { code };
    }
    code
}

/// `bench-podup --runtime containerd`: RunPodSandbox bursts, with and
/// without palisade-cni.
fn bench_runtime(bursts: &[usize], rounds: usize, uncontended: usize, config: LabConfig) -> u8 {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("palisade-lab: {NotRoot}");
        return EXIT_CANNOT_RUN;
    }
    watch_signals(config.cancel.clone());
    let mut lab = match Lab::start(config) {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            return if e.is::<Interrupted>() {
                EXIT_INTERRUPTED
            } else if e.chain().any(|c| c.is::<Missing>()) {
                EXIT_CANNOT_RUN
            } else {
                EXIT_LAB_ERROR
            };
        }
    };
    eprintln!(
        "lab {}: RunPodSandbox for {uncontended} pods one at a time, then in bursts of {bursts:?}, {rounds} of each, with and without palisade-cni",
        lab.id()
    );
    let code = match lab.bench_runtime_pod_up(bursts, rounds, uncontended) {
        Ok(results) => {
            let baseline = results.iter().find(|r| r.burst == 1);
            for r in &results {
                println!(
                    "{}",
                    palisade_e2e::bench::runtime_line("containerd", r, baseline)
                );
            }
            0
        }
        Err(e) if e.is::<Interrupted>() => EXIT_INTERRUPTED,
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            eprint!("{}", lab.log_tails(20));
            EXIT_LAB_ERROR
        }
    };
    if let Err(e) = lab.shutdown() {
        eprintln!("palisade-lab: {e:#}");
        return if code == 0 { EXIT_LAB_ERROR } else { code };
    }
    code
}

/// SIGINT/SIGTERM only set the cancel flag: the main thread notices at its
/// next wait and tears the lab down in order.
/// What `up` prints: the processes' sockets for grpcurl, and how to run a
/// command in the node or a pod.
fn how_to_reach(lab: &Lab) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let g = "grpcurl -plaintext -authority localhost -unix";
    let _ = writeln!(
        out,
        "\nlab {} is up; Ctrl-C stops it and removes everything it made.",
        lab.id()
    );
    let _ = writeln!(
        out,
        "  controller: {g} {} list",
        lab.controller_socket().display()
    );
    for node in lab.node_names() {
        if let Ok(socket) = lab.enforcer_socket_of(node) {
            let _ = writeln!(
                out,
                "  {node:<11} {g} {} palisade.v1.DebugService/GetEnforcerState",
                socket.display()
            );
        }
        if let Ok(ns) = lab.node_netns_of(node) {
            let _ = writeln!(out, "  {node:<11} nsenter --net=/run/netns/{ns} ip route");
        }
    }
    let ips = lab.pod_ips();
    for pod in lab.pods() {
        let ip = ips
            .get(pod)
            .map(|i| i.to_string())
            .unwrap_or_else(|| "-".into());
        if let Some(ns) = lab.pod_netns(pod) {
            let node = lab.node_of(pod).unwrap_or("-");
            let _ = writeln!(
                out,
                "  pod {pod:<12} {ip:<15} {node:<8} nsenter --net=/run/netns/{ns} sh"
            );
        }
    }
    let _ = writeln!(out, "  logs:       {}", lab.log_dir().display());
    out
}

/// Cancels `cancel` on SIGINT or SIGTERM, and says so on the returned
/// channel (for `up`, which waits for exactly that).
fn watch_signals(cancel: Cancel) -> std::sync::mpsc::Receiver<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            eprintln!("palisade-lab: signal received, stopping and cleaning up");
            cancel.cancel();
            let _ = tx.send(());
        });
    });
    rx
}

fn clean() -> ExitCode {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("palisade-lab: {NotRoot}");
        return ExitCode::from(EXIT_CANNOT_RUN);
    }
    match palisade_e2e::sweep::sweep(&LabConfig::default().run_root) {
        Ok(swept) => {
            for r in &swept.removed {
                println!("removed {r}");
            }
            for e in &swept.errors {
                eprintln!("palisade-lab: {e}");
            }
            if swept.removed.is_empty() && swept.errors.is_empty() {
                println!("nothing to clean");
            }
            if swept.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_LAB_ERROR)
            }
        }
        Err(e) => {
            eprintln!("palisade-lab: {e:#}");
            ExitCode::from(EXIT_LAB_ERROR)
        }
    }
}
