//! Compiles the TC programs in `c/` with clang into `$OUT_DIR`: the
//! enforcer's `palisade.bpf.o`, a test build of it that reads headers by
//! copy, the verdict benchmark's `bench.bpf.o`, and the conntrack cleanup's
//! `ct_explain.bpf.o`.

use std::env;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Everything the objects are compiled from: the programs in `c/` and the
/// headers in `c/lib/`. Cargo scans a directory for any change, so a header
/// added later reruns the build without being listed here.
const SOURCE_DIR: &str = "c";
/// (source, object in `$OUT_DIR`, extra clang flags) of every object.
const OBJECTS: &[(&str, &str, &[&str])] = &[
    ("c/palisade.bpf.c", "palisade.bpf.o", &[]),
    // Test build: every header read through header_at's paged-data
    // fallback, which BPF_PROG_TEST_RUN's linear skbs never reach.
    (
        "c/palisade.bpf.c",
        "palisade-headers-by-copy.bpf.o",
        &["-DHEADERS_BY_COPY=1"],
    ),
    ("c/bench.bpf.c", "bench.bpf.o", &[]),
    ("c/ct_explain.bpf.c", "ct_explain.bpf.o", &[]),
];
const INSTALL_HINT: &str = "install them with `apt-get install clang libbpf-dev` \
     (or point the CLANG environment variable at a clang that can target bpf)";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE_DIR}");
    println!("cargo:rerun-if-env-changed=CLANG");

    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let flags = common_flags();

    check_toolchain(&clang, &flags);

    for (source, object, extra) in OBJECTS {
        let mut flags = flags.clone();
        flags.extend(extra.iter().map(|f| f.to_string()));
        compile(&clang, &flags, source, &out.join(object));
    }
}

fn compile(clang: &str, flags: &[String], source: &str, object: &Path) {
    let output = Command::new(clang)
        .args(flags)
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(object)
        .output()
        .unwrap_or_else(|e| fail(&format!("could not run `{clang}`: {e}")));
    if !output.status.success() {
        fail(&format!(
            "`{clang}` failed to compile {source}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        println!("cargo:warning={line}");
    }
}

fn common_flags() -> Vec<String> {
    let mut flags: Vec<String> = ["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // <linux/types.h> pulls <asm/types.h>, which Debian keeps under the
    // multiarch directory of the build host.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned());
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    if Path::new(&multiarch).is_dir() {
        flags.push(format!("-I{multiarch}"));
    }
    flags
}

/// Turns "clang missing" and "libbpf headers missing" into one clear message
/// instead of a wall of compiler errors.
fn check_toolchain(clang: &str, flags: &[String]) {
    let version = Command::new(clang).arg("--version").output();
    match version {
        Ok(o) if o.status.success() => {}
        Ok(_) | Err(_) => fail(&format!(
            "`{clang}` was not found or does not run; clang and the libbpf headers are needed \
             to build the eBPF programs: {INSTALL_HINT}"
        )),
    }

    let mut child = Command::new(clang)
        .args(flags)
        .args(["-E", "-x", "c", "-o", "/dev/null", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("could not run `{clang}`: {e}")));
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(b"#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n")
        .unwrap_or_else(|e| fail(&format!("could not write to `{clang}`: {e}")));
    let probe = child
        .wait_with_output()
        .unwrap_or_else(|e| fail(&format!("could not run `{clang}`: {e}")));
    if !probe.status.success() {
        fail(&format!(
            "the BPF headers (bpf/bpf_helpers.h, linux/bpf.h) are missing: {INSTALL_HINT}\n{}",
            String::from_utf8_lossy(&probe.stderr)
        ));
    }
}

fn fail(msg: &str) -> ! {
    panic!("palisade-ebpf: {msg}");
}
