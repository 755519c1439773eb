//! Verdict benchmark (issue 6, `bench=verdict`): ns per packet of the real
//! programs via BPF_PROG_TEST_RUN, for pod policies of 10 to 100,000 CIDR
//! rules, as ratios to a bare parse of the same round; and (issue 21) the
//! same pod's flows when 10 and 100 Admin tier rules of
//! ClusterNetworkPolicies come first (rows `*_tiers`, lines with
//! `admin=`), the table compiled by the enforcer's `compile`. Run it
//! through `scripts/bench-datapath.sh verdict`; needs root and bpffs. By
//! hand:
//!
//!     cargo bench -p node-enforcer --bench verdict -- [--rounds N] [--rules 10,1000,...] [--admin 10,100]

mod bench;
mod report;
mod scenario;

use std::time::Instant;

use bench::{Bench, REPEAT_NEW, REPEAT_STEADY};
use report::Sample;
use scenario::{policy, round_order, Row};

const DEFAULT_ROUNDS: usize = 11;
const DEFAULT_RULES: [usize; 4] = [10, 1_000, 10_000, 100_000];
const DEFAULT_ADMIN: [usize; 2] = [10, 100];
const SEED: u64 = 0x5eed_0006;
const USAGE: &str =
    "usage: verdict [--rounds N (11)] [--rules 10,1000,10000,100000] [--admin 10,100 (0: none)]";

struct Args {
    rounds: usize,
    rules: Vec<usize>,
    admin: Vec<usize>,
}

fn list(flag: &str, value: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .map(|n| n.trim().parse().ok().filter(|&n: &usize| n > 0))
        .collect::<Option<Vec<_>>>()
        .ok_or(format!("{flag}: not a list of positive numbers: {value}"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        rounds: DEFAULT_ROUNDS,
        rules: DEFAULT_RULES.to_vec(),
        admin: DEFAULT_ADMIN.to_vec(),
    };
    // `cargo bench` adds `--bench`, which takes no value.
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rounds" => {
                args.rounds = value
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("--rounds: not a positive number: {value}"))?
            }
            "--rules" => args.rules = list("--rules", &value)?,
            "--admin" if value.trim() == "0" => args.admin = vec![],
            "--admin" => args.admin = list("--admin", &value)?,
            _ => {
                return Err(format!(
                    "unknown flag {flag} (known: --rounds N, --rules A,B,.., --admin A,B,..)"
                ))
            }
        }
    }
    Ok(args)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("verdict: {e}");
        std::process::exit(2);
    });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "verdict benchmark: BPF_PROG_TEST_RUN on kernel {}, {} rounds, every row of every rule count in each round",
        kernel.trim(),
        args.rounds
    );

    let started = Instant::now();
    let policies: Vec<_> = args.rules.iter().map(|&n| policy(n, SEED)).collect();
    let mut bench = Bench::new(&policies, &args.admin, SEED);
    println!(
        "setup: {} rules in {} policies, each also behind {:?} Admin rules (compiled by the enforcer), {} table entries in maps of {}, written in {:.1} s",
        args.rules.iter().sum::<usize>(),
        args.rules.len(),
        args.admin,
        bench.policy_entries.1,
        bench.policy_entries.0,
        started.elapsed().as_secs_f64()
    );

    let mut samples: Vec<Sample> = Vec::new();
    let counts = bench.rule_counts();
    for round in 0..args.rounds {
        for (t, &rules) in counts.iter().enumerate() {
            for (row, admin) in round_order(round + t, &args.admin) {
                samples.push(bench.measure(round, rules, row, admin));
            }
        }
    }

    let summaries = report::summarize(&samples);
    println!();
    print!("{}", report::table(&summaries));
    println!();
    println!(
        "Each cell: median over rounds of ns per packet, and median of ns / bare of the same round and rule count."
    );
    println!(
        "bare, established_*, new_denied: {REPEAT_STEADY} runs of one packet per measurement (kernel's mean)."
    );
    println!(
        "new_allowed*: {REPEAT_NEW} runs per measurement through bench_new_flow, which gives every run a source port of its"
    );
    println!(
        "  own and tail-calls palisade_from_pod; the `wrapper` row (bench_new_flow tail-calling a program that returns at once,"
    );
    println!(
        "  same round and rule count) is subtracted from them before the ratio. new_allowed starts each measurement with"
    );
    println!(
        "  conntrack empty; new_allowed_ctfull with it full ({} of {} entries, each new flow evicts one).",
        bench.ct_filled,
        palisade_ebpf::MAX_CONNTRACK_ENTRIES
    );
    println!(
        "  new_allowed*: a TCP SYN, which policy judges without conntrack lookups (no entry vouches for a first"
    );
    println!(
        "  segment); new_allowed_udp*: a UDP datagram, which looks up both entries first (information, no target)."
    );
    println!(
        "established_*: ACK segments of a connection allowed earlier; new_denied: a SYN policy denies."
    );
    println!(
        "fragment_allowed / fragment_denied: a UDP datagram's later fragment, after its first fragment policy allowed /"
    );
    println!("  denied left its record: judged by that record (no conntrack or policy lookup).");
    println!(
        "*_tiers admin=N: established_fwd, new_allowed and new_denied of a pod whose direction puts N Admin rules"
    );
    println!(
        "  (ClusterNetworkPolicies of five rules, Accept/Deny/Pass, /32 and /24 peers, half on ports) in front of the"
    );
    println!(
        "  same NetworkPolicy rules, compiled by node_enforcer::compile into one table and written by its BpfDatapath;"
    );
    println!(
        "  the Admin rules decide neither flow. Targets compare them with the same flow without tiers, same round."
    );
    println!(
        "established_fwd_by_copy: established_fwd through a build that reads every header with bpf_skb_load_bytes (the"
    );
    println!(
        "  fallback for headers in paged data, which test runs cannot produce): what direct packet access saves."
    );
    println!(
        "Rows are checked, not assumed: every run of a measurement must return the row's verdict and bump its counter."
    );
    println!();
    let targets = report::targets(&summaries, &samples);
    for t in &targets {
        println!(
            "target {:<30} {:<40} {}",
            t.name,
            t.measured,
            if t.met { "met" } else { "MISSED" }
        );
    }
    println!();
    print!("{}", report::key_values(&summaries));
    print!("{}", report::target_lines(&targets));
    println!(
        "bench=verdict total_s={:.1} rows={}",
        started.elapsed().as_secs_f64(),
        Row::ALL.len()
    );
}
