//! What one pod's attach costs the node, and why a burst of pod-ups queues
//! (issue 19.6). The enforcer attaches its two programs to every pod's host
//! veth with TCX links (`BpfDatapath::attach`, the head of each chain: see
//! the datapath's module comment). The kernel creates a TCX link holding
//! RTNL and waits out an RCU grace period before it returns
//! (`tcx_entry_sync()`), so every attach on the node, ours and every other
//! link or address change, queues behind it: a burst of N pod-ups costs N
//! times two grace periods, whatever the enforcer does around them.
//!
//! Measured on real veths in a namespace of the bench's own, N pods
//! attached one after another as the reconciler does, with:
//! - `hook=tcx`: the enforcer's own `BpfDatapath::attach`;
//! - `hook=clsact`: the same two programs as legacy clsact/cls_bpf filters
//!   (no grace period on that path; what TCX's ordering guarantee costs);
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

use aya::programs::tc::{self, NlOptions, TcAttachOptions};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::EbpfLoader;
use node_enforcer::datapath::bpf::BpfDatapath;
use node_enforcer::datapath::Datapath;
use palisade_ebpf::{PROG_FROM_POD, PROG_TO_POD};

const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";

#[derive(Clone, Copy, PartialEq)]
enum Hook {
    Tcx,
    Clsact,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Tcx => "tcx",
            Hook::Clsact => "clsact",
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

/// Per-pod attach times in ms, for `pods` fresh veths in a namespace of
/// their own.
fn run(hook: Hook, pods: usize) -> Vec<f64> {
    let tag = format!("pattach{}{}", std::process::id(), hook.name());
    support::in_scratch_node(&tag, move |pins| {
        let batch: String = (0..pods)
                .map(|i| format!("link add pat{i} type veth peer name pat{i}p\nlink set pat{i} up\nlink set pat{i}p up\n"))
                .collect();
        sh(&["ip", "-batch", "-"], Some(&batch));
        let names: Vec<String> = (0..pods).map(|i| format!("pat{i}")).collect();
        match hook {
            Hook::Tcx => {
                let mut dp = BpfDatapath::load(&pins).unwrap();
                names
                    .iter()
                    .map(|n| {
                        let ifindex = dp.ifindex(n).unwrap();
                        let t = Instant::now();
                        dp.attach(n, ifindex).unwrap();
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect::<Vec<f64>>()
            }
            Hook::Clsact => {
                std::fs::create_dir_all(&pins).unwrap();
                let mut ebpf = EbpfLoader::new()
                    .default_map_pin_directory(&pins)
                    .load(palisade_ebpf::OBJECT)
                    .unwrap();
                for name in [PROG_FROM_POD, PROG_TO_POD] {
                    let p: &mut SchedClassifier =
                        ebpf.program_mut(name).unwrap().try_into().unwrap();
                    p.load().unwrap();
                }
                names
                    .iter()
                    .map(|n| {
                        let t = Instant::now();
                        // What a legacy attach is: the qdisc, then one
                        // filter per direction.
                        tc::qdisc_add_clsact(n).unwrap();
                        for (name, at) in [
                            (PROG_FROM_POD, TcAttachType::Ingress),
                            (PROG_TO_POD, TcAttachType::Egress),
                        ] {
                            let p: &mut SchedClassifier =
                                ebpf.program_mut(name).unwrap().try_into().unwrap();
                            let id = p
                                .attach_with_options(
                                    n,
                                    at,
                                    TcAttachOptions::Netlink(NlOptions {
                                        priority: 1,
                                        handle: 1.into(),
                                        ..NlOptions::default()
                                    }),
                                )
                                .unwrap();
                            // Kept attached until the namespace goes.
                            std::mem::forget(p.take_link(id).unwrap());
                        }
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect::<Vec<f64>>()
            }
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
    println!("attach: {pods} pods' two programs attached one after another on fresh veths");
    println!(
        "{:>7} {:>14} {:>15} {:>15} {:>9}",
        "hook", "rcu_expedited", "per_pod_p50_ms", "per_pod_p99_ms", "total_ms"
    );
    let mut lines = Vec::new();
    for hook in [Hook::Tcx, Hook::Clsact] {
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
