//! What the benchmarks on real veths share: a command that must succeed,
//! and a scratch node (a network namespace and a pin root of its own).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `args`, feeding it `stdin` if given; panics unless it succeeds.
pub fn sh(args: &[&str], stdin: Option<&str>) {
    let mut c = Command::new(args[0]);
    c.args(&args[1..]);
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{args:?}: {status}");
}

/// Runs `f` on a thread inside a fresh network namespace named `tag`, given
/// a pin root under bpffs named for it; the namespace and the pin root go
/// afterwards, whatever `f` did.
pub fn in_scratch_node<T: Send + 'static>(
    tag: &str,
    f: impl FnOnce(PathBuf) -> T + Send + 'static,
) -> T {
    sh(&["ip", "netns", "add", tag], None);
    let pins = Path::new("/sys/fs/bpf").join(format!("palisade-bench-{tag}"));
    let path = format!("/run/netns/{tag}");
    let out = std::thread::spawn({
        let pins = pins.clone();
        move || {
            let netns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f(pins)
        }
    })
    .join();
    let _ = Command::new("ip").args(["netns", "del", tag]).status();
    let _ = std::fs::remove_dir_all(&pins);
    out.expect("bench run")
}
