//! The controller at cluster scale: full computation and single changes, on
//! Antrea's benchmark shape and on a mixed shape. Run through
//! `scripts/bench-controller.sh`; by hand:
//! `cargo bench -p policy-controller --bench controller -- antrea small`
//! (add `kube` for the kube source's path against the API double).
//!
//! Every measurement prints one line of `key=value` pairs so runs can be
//! compared; the script collects them into a table.

mod huge;
mod kube_path;
mod shapes;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use policy_controller::engine::Change;
use policy_controller::hub::{delta, Hub, PlanChange};
use prost::Message;
use shapes::{Scale, Shape};

/// Counts live heap bytes, so the state the controller holds can be told
/// apart from the process's peak (which includes the input), over the
/// controller binary's own allocator.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { policy_controller::Allocator.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { policy_controller::Allocator.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { policy_controller::Allocator.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The process's peak resident memory (VmHWM), in MB.
pub(crate) fn peak_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU time this thread has used, in ms. The machine is shared: wall time
/// also measures the neighbours, CPU time mostly the code.
pub(crate) fn cpu_ms() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (two 64-bit fields on
    // 64-bit Linux) to the pointer it is given.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    t.sec as f64 * 1e3 + t.nsec as f64 / 1e6
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Delta bytes as they would go on the wire to every node reached.
fn wire(changes: &[PlanChange]) -> usize {
    changes
        .iter()
        .filter_map(|c| delta(&c.before, &c.after))
        .map(|d| d.encoded_len())
        .sum()
}

pub(crate) fn line(scale: &str, shape: Shape, what: &str, fields: &[(&str, String)]) {
    line_as(scale, &shape_name(shape, false), what, fields)
}

/// The shape as lines name it: `antrea`, `mixed`, or with the
/// ClusterNetworkPolicies of `cnp` runs, `antrea+cnp`.
fn shape_name(shape: Shape, cnps: bool) -> String {
    let name = format!("{shape:?}").to_lowercase();
    if cnps {
        format!("{name}+cnp")
    } else {
        name
    }
}

fn line_as(scale: &str, shape: &str, what: &str, fields: &[(&str, String)]) {
    let rest: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("scale={scale} shape={shape} what={what} {}", rest.join(" "));
}

/// Builds the change to namespace `i`.
type MakeChange<'a> = Box<dyn Fn(usize) -> Change + 'a>;

/// Namespaces generated at a time: the bench's own input stays small, so
/// the peak is the hub's.
const CHUNK: usize = 500;

/// Feeds a cluster into `hub` as a source that watches events does: every
/// object staged as a change, generated a chunk at a time and dropped once
/// taken, then one apply that resolves everything. Returns the time spent
/// in the hub (generation excluded), split into staging and resolving.
/// With `cnps`, the ClusterNetworkPolicies come last, once every pod is
/// known (their subjects then select the most).
fn feed(hub: &Hub, shape: Shape, scale: Scale, with_policies: bool, cnps: bool) -> Fed {
    let mut stage = 0.0;
    let mut stage_cpu = 0.0;
    for chunk in (0..scale.namespaces).collect::<Vec<_>>().chunks(CHUNK) {
        let changes: Vec<Change> = chunk
            .iter()
            .flat_map(|&i| shapes::namespace_objects(shape, scale, i, with_policies))
            .map(Change::from)
            .collect();
        let (start, cpu) = (Instant::now(), cpu_ms());
        hub.stage(changes);
        stage += start.elapsed().as_secs_f64() * 1e3;
        stage_cpu += cpu_ms() - cpu;
    }
    if cnps && with_policies {
        let changes: Vec<Change> = (0..shapes::CLUSTER_POLICIES)
            .map(|k| Change::ApplyClusterPolicy(shapes::cluster_policy(k, scale, 0)))
            .collect();
        let (start, cpu) = (Instant::now(), cpu_ms());
        hub.stage(changes);
        stage += start.elapsed().as_secs_f64() * 1e3;
        stage_cpu += cpu_ms() - cpu;
    }
    let (start, cpu) = (Instant::now(), cpu_ms());
    let published = hub.apply(Vec::new(), "bench".into());
    Fed {
        stage_ms: stage,
        resolve_ms: start.elapsed().as_secs_f64() * 1e3,
        cpu_ms: stage_cpu + cpu_ms() - cpu,
        published,
    }
}

struct Fed {
    stage_ms: f64,
    resolve_ms: f64,
    cpu_ms: f64,
    published: Vec<PlanChange>,
}

fn run(shape: Shape, scale: Scale, cnps: bool) {
    let label = shape_name(shape, cnps);
    let line = |scale: &str, _: Shape, what: &str, fields: &[(&str, String)]| {
        line_as(scale, &label, what, fields)
    };
    // Held state: bytes the hub (engine + plans) holds, for pods alone and
    // with policies.
    let before = live();
    let hub = Hub::new(1);
    feed(&hub, shape, scale, false, cnps);
    let pods_bytes = live() - before;
    drop(hub);

    let before = live();
    let hub = Hub::new(1);
    let Fed {
        stage_ms,
        resolve_ms,
        cpu_ms: full_cpu,
        published,
    } = feed(&hub, shape, scale, true, cnps);
    let full_ms = stage_ms + resolve_ms;
    let held = live() - before;
    let mut plan_bytes: Vec<usize> = published
        .iter()
        .map(|c| c.after.snapshot().encoded_len())
        .collect();
    plan_bytes.sort();
    let stats = hub.with_engine(|e| e.expect("fed").stats());
    let pods = stats.pods;
    let policies = stats.policies;
    line(
        scale.name,
        shape,
        "full",
        &[
            ("ms", format!("{full_ms:.0}")),
            ("peak_mb", format!("{:.0}", peak_mb())),
            ("nodes_reached", published.len().to_string()),
            ("delta_bytes", plan_bytes.iter().sum::<usize>().to_string()),
            ("cpu_ms", format!("{full_cpu:.0}")),
            ("stage_ms", format!("{stage_ms:.0}")),
            ("resolve_ms", format!("{resolve_ms:.0}")),
            ("namespaces", scale.namespaces.to_string()),
            ("pods", pods.to_string()),
            ("policies", policies.to_string()),
            ("held_mb", format!("{:.0}", mb(held))),
            ("bytes_per_pod", (pods_bytes / pods.max(1)).to_string()),
            (
                "bytes_per_policy",
                (held.saturating_sub(pods_bytes) / policies.max(1)).to_string(),
            ),
            (
                "plan_bytes_max",
                plan_bytes.last().copied().unwrap_or(0).to_string(),
            ),
            (
                "plan_bytes_median",
                plan_bytes[plan_bytes.len() / 2].to_string(),
            ),
        ],
    );

    let total_pods = pods;
    let changes: [(&str, MakeChange); 4] = [
        (
            "pod_relabel",
            Box::new(|i| {
                Change::ApplyPod(shapes::pod(
                    shape,
                    i,
                    0,
                    i * 4,
                    scale.nodes,
                    shapes::default_app(shape, 2),
                ))
            }),
        ),
        (
            "ns_relabel",
            Box::new(|i| {
                // To the next team (mixed) or an extra label (Antrea, whose
                // policies select no namespaces by label).
                let mut ns = shapes::namespace(shape, i, &shapes::team(i + 5));
                ns.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert("relabelled".into(), "yes".into());
                Change::ApplyNamespace(ns)
            }),
        ),
        (
            "policy_edit",
            Box::new(|i| {
                let which = if shape == Shape::Antrea { 1 } else { 0 };
                Change::ApplyPolicy(shapes::policies(shape, i, 1).swap_remove(which))
            }),
        ),
        (
            "pod_add",
            Box::new(|i| {
                Change::ApplyPod(shapes::pod(
                    shape,
                    i,
                    4,
                    total_pods + i,
                    scale.nodes,
                    shapes::default_app(shape, 0),
                ))
            }),
        ),
    ];
    for (what, make) in &changes {
        let mut times = Vec::new();
        let mut cpu_times = Vec::new();
        let mut first: Option<(usize, usize)> = None;
        // Five changes, each to another namespace; the median is reported.
        for rep in 0..5 {
            let i = (rep * 7919 + 17) % scale.namespaces;
            let change = make(i);
            let (start, cpu) = (Instant::now(), cpu_ms());
            let published = hub.apply(vec![change], format!("{what}-{rep}"));
            let bytes = wire(&published);
            times.push(start.elapsed().as_secs_f64() * 1e3);
            cpu_times.push(cpu_ms() - cpu);
            first.get_or_insert((published.len(), bytes));
        }
        let (nodes, bytes) = first.unwrap();
        line(
            scale.name,
            shape,
            what,
            &[
                ("ms", format!("{:.3}", shapes::median(times))),
                ("peak_mb", format!("{:.0}", peak_mb())),
                ("nodes_reached", nodes.to_string()),
                ("cpu_ms", format!("{:.3}", shapes::median(cpu_times))),
                ("delta_bytes", bytes.to_string()),
            ],
        );
    }
    // The ClusterNetworkPolicies as the hub holds them after the edits,
    // for the view the manifest source would hand over.
    let held = if cnps {
        cnp_edits(&hub, scale, &label)
    } else {
        Vec::new()
    };
    view_diff(&hub, shape, scale, &label, held);
}

/// ClusterNetworkPolicy edits (`cnp` runs): one whose subject is one
/// namespace (five of them, a different policy each time), and the Admin
/// policy whose subject is every namespace (five edits of its port), each
/// from the hub's change to the deltas of every node it reaches. The
/// median is reported; nodes_reached and delta bytes are the first edit's.
/// Returns every ClusterNetworkPolicy as it is after the edits.
fn cnp_edits(hub: &Hub, scale: Scale, label: &str) -> Vec<palisade_apis::ClusterNetworkPolicy> {
    let mut variants = vec![0u32; shapes::CLUSTER_POLICIES];
    let one_ns: Vec<usize> = (0..shapes::CLUSTER_POLICIES)
        .filter(|&k| shapes::cnp_kind(k) == shapes::CnpKind::OneNamespace)
        .take(5)
        .collect();
    let cases: [(&str, Vec<(usize, u32)>); 2] = [
        (
            "cnp_edit_namespace",
            one_ns.iter().map(|&k| (k, 1)).collect(),
        ),
        ("cnp_edit_all", (1..=5).map(|v| (0, v)).collect()),
    ];
    for (what, edits) in cases {
        let mut times = Vec::new();
        let mut cpu_times = Vec::new();
        let mut first: Option<(usize, usize)> = None;
        for (rep, &(k, variant)) in edits.iter().enumerate() {
            variants[k] = variant;
            let change = Change::ApplyClusterPolicy(shapes::cluster_policy(k, scale, variant));
            let (start, cpu) = (Instant::now(), cpu_ms());
            let published = hub.apply(vec![change], format!("{what}-{rep}"));
            let bytes = wire(&published);
            times.push(start.elapsed().as_secs_f64() * 1e3);
            cpu_times.push(cpu_ms() - cpu);
            first.get_or_insert((published.len(), bytes));
        }
        let (nodes, bytes) = first.unwrap();
        line_as(
            scale.name,
            label,
            what,
            &[
                ("ms", format!("{:.3}", shapes::median(times))),
                ("peak_mb", format!("{:.0}", peak_mb())),
                ("nodes_reached", nodes.to_string()),
                ("cpu_ms", format!("{:.3}", shapes::median(cpu_times))),
                ("delta_bytes", bytes.to_string()),
                ("delta_bytes_per_node", (bytes / nodes.max(1)).to_string()),
            ],
        );
    }
    variants
        .iter()
        .enumerate()
        .map(|(k, &v)| shapes::cluster_policy(k, scale, v))
        .collect()
}

/// The manifest source's path: a whole new view with one pod relabelled,
/// which the hub diffs against what it holds. The view is the whole
/// cluster as objects, built here (after every other measurement, so that
/// it raises only this line's peak); its size is the bench's input.
fn view_diff(
    hub: &Hub,
    shape: Shape,
    scale: Scale,
    label: &str,
    cnps: Vec<palisade_apis::ClusterNetworkPolicy>,
) {
    let before = live();
    let mut state = shapes::cluster(shape, scale, cnps);
    let input = live() - before;
    let i = 4242 % scale.namespaces;
    let key = (shapes::ns_name(i), "pod-1".to_string());
    let at = state
        .pods
        .iter()
        .position(|p| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            ) == key
        })
        .expect("the shape has pod-1 in every namespace");
    state.pods[at] = shapes::pod(
        shape,
        i,
        1,
        i * 4 + 1,
        scale.nodes,
        shapes::default_app(shape, 3),
    );
    let (start, cpu) = (Instant::now(), cpu_ms());
    let published = hub.update(&state);
    let bytes = wire(&published);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let cpu = cpu_ms() - cpu;
    line_as(
        scale.name,
        label,
        "view_diff",
        &[
            ("ms", format!("{ms:.1}")),
            ("peak_mb", format!("{:.0}", peak_mb())),
            ("nodes_reached", published.len().to_string()),
            ("delta_bytes", bytes.to_string()),
            ("input_mb", format!("{:.0}", mb(input))),
            ("cpu_ms", format!("{cpu:.1}")),
        ],
    );
}

fn main() {
    // `cargo bench` adds its own flags (`--bench`); only words count.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if args.first().map(String::as_str) == Some("huge") {
        let rules = args.get(1).and_then(|n| n.parse().ok());
        huge::run(rules.unwrap_or(huge::RULES));
        return;
    }
    let shape = match args.first().map(String::as_str) {
        Some("antrea") | None => Shape::Antrea,
        Some("mixed") => Shape::Mixed,
        Some(other) => {
            eprintln!("unknown shape {other:?}: want antrea or mixed");
            std::process::exit(2);
        }
    };
    let scale = match args.get(1).map(String::as_str) {
        Some("small") | None => shapes::SMALL,
        Some("medium") => shapes::MEDIUM,
        Some("full") => shapes::FULL,
        Some(other) => {
            eprintln!("unknown scale {other:?}: want small, medium or full");
            std::process::exit(2);
        }
    };
    match args.get(2).map(String::as_str) {
        None => run(shape, scale, false),
        Some("cnp") if shape == Shape::Antrea => run(shape, scale, true),
        Some("kube") => kube_path::run(shape, scale),
        Some(other) => {
            eprintln!("unknown path {other:?}: want kube, cnp (antrea) or nothing");
            std::process::exit(2);
        }
    }
}
