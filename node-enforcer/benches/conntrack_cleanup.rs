//! Conntrack cleanup at scale: N eBPF entries against a kernel table of N
//! entries (real conntrack, created over nfnetlink in a namespace of its
//! own), 10% of the eBPF entries stale. Each size is swept twice on the same
//! tables, once per way of asking the kernel (`method=lookup`: a
//! bpf_skb_ct_lookup per idle entry, the default; `method=dump`: the
//! netlink dump of the whole table). Prints wall time, CPU time and the
//! peak extra memory of each sweep, as a table and as `key=value` lines;
//! beside them, the CPU the kernel alone takes to hand over its table
//! (`bare_dump_cpu_s`) and the eBPF map (`bare_read_cpu_s`) once, which
//! bounds from below what a dump pass costs.
//! Root. `cargo bench -p node-enforcer --bench conntrack_cleanup [-- N ... [lookup|dump]]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use aya::maps::IterableMap;

/// Counts live heap bytes and their peak, so the sweep's extra memory is
/// measured exactly (RSS hides reuse of memory freed earlier).
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Relaxed) + l.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

use node_enforcer::conntrack::{kernel, sweep, Tuple};
use node_enforcer::datapath::bpf::BpfDatapath;
use palisade_ebpf::{Ct4Key, CtKey, CtValue, HOOK_FROM_POD, HOOK_TO_POD};

fn v4(i: u32) -> [u8; 16] {
    let mut o = [0u8; 16];
    o[10] = 0xff;
    o[11] = 0xff;
    o[12..].copy_from_slice(&(0x0a00_0000 | i).to_be_bytes());
    o
}

fn thread_cpu_s() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

struct Row {
    method: &'static str,
    entries: usize,
    kernel: usize,
    removed: usize,
    wall_s: f64,
    cpu_s: f64,
    extra_mb: f64,
    /// CPU of a bare kernel dump and of a bare map read, after the pass.
    dump_cpu_s: f64,
    read_cpu_s: f64,
}

fn run(n: usize, only: Option<&'static str>) -> Vec<Row> {
    let ns = format!("pbench{}", std::process::id());
    assert!(Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap()
        .success());
    let pins =
        std::path::Path::new("/sys/fs/bpf").join(format!("palisade-bench-{}", std::process::id()));
    let path = format!("/run/netns/{ns}");
    let row = std::thread::spawn({
        let pins = pins.clone();
        move || {
            let netns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            // Flows: client i:1000+j -> backend; half recorded on the
            // client's side, half on the backend's, 10% with no kernel entry.
            let backend = v4(0xffffff);
            let flow = |i: u32| Tuple {
                src: v4(i),
                dst: backend,
                sport: 1024 + (i % 50_000) as u16,
                dport: 8080,
                proto: 17,
            };
            let live = n - n / 10;
            let pairs: Vec<(Tuple, Tuple)> = (0..live as u32)
                .map(|i| (flow(i), flow(i).reversed()))
                .collect();
            kernel::insert_v4(&pairs, 3600).unwrap();
            drop(pairs);
            let _dp = BpfDatapath::load_with(&pins, Some(n as u32 + 1024)).unwrap();
            let mut rows = Vec::new();
            for method in METHODS {
                if only.is_some_and(|m| m != method) {
                    continue;
                }
                let mut maps = sweep::open(&pins, asking(method)).unwrap();
                fill(&mut maps, n, &flow);
                if method == "lookup_icmp" {
                    let ping = flow(0);
                    let k = CtKey {
                        src: ping.src,
                        dst: ping.dst,
                        sport: 0,
                        dport: 0,
                        ifindex: 7,
                        proto: 1,
                        hook: HOOK_FROM_POD,
                        pad: [0; 2],
                    };
                    let old = CtValue {
                        last_seen_ns: 1,
                        epoch: 1,
                        pad: 0,
                    };
                    maps.v4
                        .insert(Ct4Key::of(&k).expect("IPv4"), old, 0)
                        .unwrap();
                }
                rows.push(measure(method, &mut maps));
            }
            rows
        }
    })
    .join();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let _ = std::fs::remove_dir_all(&pins);
    row.expect("bench run")
}

/// `lookup_icmp`: lookups, with one idle ICMP entry among the rest, which
/// the lookup cannot take: the pass adds a dump of the kernel's ICMP
/// entries (the kernel filters, but walks its whole table).
const METHODS: [&str; 3] = ["lookup", "dump", "lookup_icmp"];

/// The way of asking `method` names; the lookup must be available.
fn asking(method: &str) -> sweep::Asking {
    if method == "dump" {
        return sweep::Asking::with(sweep::AskWith::Dump);
    }
    let a = sweep::Asking::best();
    assert!(
        matches!(a, sweep::Asking::Lookup(_)),
        "no kernel lookup here: {}",
        a.describe()
    );
    a
}

/// Writes the N eBPF entries (again, after a pass removed some), all idle.
fn fill(maps: &mut sweep::Conntrack, n: usize, flow: &dyn Fn(u32) -> Tuple) {
    let old = CtValue {
        last_seen_ns: 1,
        epoch: 1,
        pad: 0,
    };
    for i in 0..n as u32 {
        let t = flow(i);
        let k = CtKey {
            src: t.src,
            dst: t.dst,
            sport: t.sport.to_be(),
            dport: t.dport.to_be(),
            ifindex: 7 + (i % 2),
            proto: 17,
            hook: if i % 2 == 0 {
                HOOK_FROM_POD
            } else {
                HOOK_TO_POD
            },
            pad: [0; 2],
        };
        maps.v4
            .insert(Ct4Key::of(&k).expect("IPv4"), old, 0)
            .unwrap();
    }
}

/// One pass, measured, then the kernel's bare share on the same tables.
fn measure(method: &'static str, maps: &mut sweep::Conntrack) -> Row {
    // Peak heap from here on is the sweep's.
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let (cpu0, t0) = (thread_cpu_s(), Instant::now());
    let report = sweep::sweep(maps).unwrap();
    let (cpu, wall) = (thread_cpu_s() - cpu0, t0.elapsed().as_secs_f64());
    let extra = PEAK.load(Relaxed).saturating_sub(base) as f64 / (1024.0 * 1024.0);
    assert_eq!(report.listed.len(), report.entries.min(256));
    assert_eq!(report.skipped, "", "{}", report.skipped);
    assert_eq!(report.dumped, method != "lookup", "{}", report.asked_by);
    // What the kernel alone charges for reading both tables once (the
    // netlink dump, the map walk), with no judgement: the part of a dump
    // pass no code of ours can shrink. Measured after the pass, on the
    // tables as it left them.
    let cpu0 = thread_cpu_s();
    let mut seen = 0usize;
    kernel::dump(|_, _| seen += 1).unwrap();
    let dump_cpu = thread_cpu_s() - cpu0;
    let cpu0 = thread_cpu_s();
    let mut read = 0usize;
    node_enforcer::conntrack::batch::read_all::<Ct4Key, CtValue>(
        maps.v4.map().fd().as_fd().as_raw_fd(),
        |k, _| read += k.len(),
    )
    .unwrap();
    let read_cpu = thread_cpu_s() - cpu0;
    assert_eq!(seen, report.kernel_entries);
    assert_eq!(read, report.entries - report.removed);
    Row {
        method,
        entries: report.entries,
        kernel: report.kernel_entries,
        removed: report.removed,
        wall_s: wall,
        cpu_s: cpu,
        extra_mb: extra,
        dump_cpu_s: dump_cpu,
        read_cpu_s: read_cpu,
    }
}

fn main() {
    // Arguments: sizes, and optionally one method (`lookup` or `dump`).
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let only = METHODS.into_iter().find(|m| args.iter().any(|a| a == m));
    let sizes = if sizes.is_empty() {
        vec![100_000, 1_000_000]
    } else {
        sizes
    };
    let max = "/proc/sys/net/netfilter/nf_conntrack_max";
    let before = std::fs::read_to_string(max).unwrap_or_default();
    let need = sizes.iter().max().copied().unwrap_or(0) * 2 + 1024;
    if before.trim().parse::<usize>().unwrap_or(0) < need {
        std::fs::write(max, need.to_string()).expect("raising nf_conntrack_max");
    }
    // The kernel's hash (global, left as the machine has it) sets how long
    // a lookup's chain walk is: about 2 x entries / buckets tuples a bucket.
    let buckets = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_buckets")
        .unwrap_or_default()
        .trim()
        .to_string();
    println!(
        "conntrack cleanup: eBPF entries vs a kernel table of the same size (10% stale); kernel hash buckets: {buckets}"
    );
    println!(
        "{:>7} {:>10} {:>10} {:>9} {:>8} {:>8} {:>9} {:>12} {:>12}",
        "method",
        "entries",
        "kernel",
        "removed",
        "wall_s",
        "cpu_s",
        "extra_mb",
        "bare_dump_s",
        "bare_read_s"
    );
    let mut lines = Vec::new();
    for r in sizes.into_iter().flat_map(|n| run(n, only)) {
        println!(
            "{:>7} {:>10} {:>10} {:>9} {:>8.3} {:>8.3} {:>9.1} {:>12.3} {:>12.3}",
            r.method,
            r.entries,
            r.kernel,
            r.removed,
            r.wall_s,
            r.cpu_s,
            r.extra_mb,
            r.dump_cpu_s,
            r.read_cpu_s
        );
        lines.push(format!(
            "bench=cleanup method={} entries={} kernel_entries={} kernel_buckets={buckets} removed={} wall_s={:.3} cpu_s={:.3} extra_mb={:.1} bare_dump_cpu_s={:.3} bare_read_cpu_s={:.3}",
            r.method, r.entries, r.kernel, r.removed, r.wall_s, r.cpu_s, r.extra_mb, r.dump_cpu_s, r.read_cpu_s
        ));
    }
    if !before.trim().is_empty() {
        let _ = std::fs::write(max, before.trim());
    }
    for l in lines {
        println!("{l}");
    }
}
