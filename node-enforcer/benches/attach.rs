//! What one pod's attach costs the node, and why a burst of pod-ups
//! queued before pod-ups attached fast (issue 19.6). The kernel creates a
//! TCX link holding RTNL and waits out an RCU grace period before it
//! returns (`tcx_entry_sync()`), so every TCX attach on the node, ours and
//! every other link or address change, queues behind it: N pods attached
//! by links cost N times two grace periods, whatever the enforcer does
//! around them. A pod-up now attaches by clsact filters (no grace period)
//! and the interface is promoted to links when the node is quiet.
//!
//! Measured on real veths in a namespace of the bench's own, N pods
//! attached one after another as the reconciler does, by the enforcer's
//! own `BpfDatapath::attach`:
//! - `hook=fast`: `AttachMode::Fast`, what a pod-up does (filters);
//! - `hook=promote`: then each interface's promotion to links, as the
//!   reconciler does once the node is quiet (off the pod-up path);
//! - `hook=tcx`: `AttachMode::Tcx`, links at once;
//! - `hook=detach`: attached by links, then each detached as a pod-down
//!   does: each link's release waits out a grace period holding RTNL
//!   (`tcx_link_release`), so closing the two at once shares nothing;
//! - each with the kernel's `rcu_expedited` off and on (the node-wide knob
//!   that turns every grace period into an expedited one; the bench puts
//!   the value it found back).
//!
//! Root. `cargo bench -p node-enforcer --bench attach [-- pods=N]`
//! (default 20). Prints a table and
//! `bench=attach hook= rcu_expedited= pods= per_pod_p50_ms= per_pod_p99_ms= total_ms=`.

mod support;
use support::sh;

use std::time::Instant;

use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::{AttachMode, Datapath};

const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";

#[derive(Clone, Copy, PartialEq)]
enum Hook {
    Fast,
    Promote,
    Tcx,
    Detach,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Fast => "fast",
            Hook::Promote => "promote",
            Hook::Tcx => "tcx",
            Hook::Detach => "detach",
        }
    }
}

/// Puts the kernel's `rcu_expedited` back as it was, however the bench ends.
struct Expedited(String);

impl Expedited {
    fn set(on: bool) -> Expedited {
        let was = std::fs::read_to_string(RCU_EXPEDITED)
            .unwrap_or_else(|e| panic!("reading {RCU_EXPEDITED}: {e}"));
        std::fs::write(RCU_EXPEDITED, if on { "1" } else { "0" })
            .unwrap_or_else(|e| panic!("writing {RCU_EXPEDITED}: {e}"));
        Expedited(was.trim().to_string())
    }
}

impl Drop for Expedited {
    fn drop(&mut self) {
        let _ = std::fs::write(RCU_EXPEDITED, &self.0);
    }
}

/// Per-pod times in ms of `hook` for `pods` fresh veths in a namespace of
/// their own.
fn run(hook: Hook, pods: usize) -> Vec<f64> {
    let tag = format!("pattach{}{}", std::process::id(), hook.name());
    support::in_scratch_node(&tag, move |pins| {
        let batch: String = (0..pods)
                .map(|i| format!("link add pat{i} type veth peer name pat{i}p\nlink set pat{i} up\nlink set pat{i}p up\n"))
                .collect();
        sh(&["ip", "-batch", "-"], Some(&batch));
        let names: Vec<String> = (0..pods).map(|i| format!("pat{i}")).collect();
        let mode = match hook {
            Hook::Tcx | Hook::Detach => AttachMode::Tcx,
            Hook::Fast | Hook::Promote => AttachMode::Fast,
        };
        let mut dp = BpfDatapath::load(&pins).unwrap().with_attach_mode(mode);
        let attach: Vec<f64> = names
            .iter()
            .map(|n| {
                let ifindex = dp.ifindex(n).unwrap();
                let t = Instant::now();
                dp.attach(n, ifindex).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        let timed = |f: &mut dyn FnMut(&str)| -> Vec<f64> {
            names
                .iter()
                .map(|n| {
                    let t = Instant::now();
                    f(n);
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect()
        };
        match hook {
            Hook::Fast | Hook::Tcx => attach,
            Hook::Promote => timed(&mut |n| dp.promote(n).unwrap()),
            Hook::Detach => timed(&mut |n| {
                let ifindex = dp.ifindex(n).unwrap();
                dp.detach(n, ifindex).unwrap()
            }),
        }
    })
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let mut pods = 20usize;
    for a in std::env::args().skip(1) {
        if let Some(v) = a.strip_prefix("pods=") {
            pods = v.parse::<usize>().expect("pods=N").max(1);
        }
    }
    println!("attach: {pods} pods' two programs attached one after another on fresh veths (promote: then moved to links; detach: attached by links, then each detached as a pod-down does)");
    println!(
        "{:>7} {:>14} {:>15} {:>15} {:>9}",
        "hook", "rcu_expedited", "per_pod_p50_ms", "per_pod_p99_ms", "total_ms"
    );
    let mut lines = Vec::new();
    for hook in [Hook::Fast, Hook::Promote, Hook::Tcx, Hook::Detach] {
        for expedited in [false, true] {
            let knob = Expedited::set(expedited);
            let mut ms = run(hook, pods);
            drop(knob);
            let total: f64 = ms.iter().sum();
            ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let (p50, p99) = (quantile(&ms, 0.5), quantile(&ms, 0.99));
            let e = u8::from(expedited);
            println!(
                "{:>7} {:>14} {:>15.2} {:>15.2} {:>9.1}",
                hook.name(),
                e,
                p50,
                p99,
                total
            );
            lines.push(format!(
                "bench=attach hook={} rcu_expedited={e} pods={pods} per_pod_p50_ms={p50:.2} per_pod_p99_ms={p99:.2} total_ms={total:.1}",
                hook.name()
            ));
        }
    }
    for l in lines {
        println!("{l}");
    }
}
