//! Compiles the TC programs in `c/` with clang into `$OUT_DIR`: the
//! enforcer's `palisade.bpf.o`, a test build of it that reads headers by
//! copy, the verdict benchmark's `bench.bpf.o`, and the conntrack cleanup's
//! `ct_explain.bpf.o`; and turns the sizes the programs share with user
//! space (`c/lib/sizes.h`, and `c/ct_explain.bpf.c`'s own) into Rust
//! constants (`$OUT_DIR/sizes.rs`), and the verdict kinds
//! (`c/lib/reasons.h`), the flow log's counters, kinds and modes, and the
//! conntrack cleanup's answers likewise (`ENUMS`).

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
/// Where the sizes shared with Rust live: every one in `c/lib/sizes.h` but
/// the conntrack cleanup's batch, which stays with its program (whose
/// licence differs); and the Rust file generated from them.
const SIZES_SOURCES: &[&str] = &["c/lib/sizes.h", "c/ct_explain.bpf.c"];
const SIZES_RS: &str = "sizes.rs";
/// The enums shared with Rust, as (header, enum, Rust file generated from
/// it, the Rust type of its constants: the width of the field that carries
/// them): the verdict kinds (why a packet passed or dropped), the flow
/// log's counters, its event kinds and modes, the conntrack cleanup's
/// answers, and the DNS capture's counters and record kinds.
const ENUMS: &[(&str, &str, &str, &str)] = &[
    ("c/lib/reasons.h", "pal_stat", "reasons.rs", "u32"),
    ("c/palisade.h", "pal_flow_stat", "flow_stats.rs", "u32"),
    ("c/palisade.h", "pal_flow_kind", "flow_kinds.rs", "u8"),
    (
        "c/palisade.h",
        "pal_flow_log_mode",
        "flow_log_modes.rs",
        "u32",
    ),
    ("c/ct_explain.bpf.c", "pal_ct_answer", "ct_answers.rs", "u8"),
    ("c/palisade.h", "pal_dns_stat", "dns_stats.rs", "u32"),
    (
        "c/palisade.h",
        "pal_dns_frame_kind",
        "dns_frame_kinds.rs",
        "u8",
    ),
];
/// Only these defines are shared: the rest of a header is the programs'.
const SHARED_PREFIX: &str = "PAL_";
const INSTALL_HINT: &str = "install them with `apt-get install clang libbpf-dev` \
     (or point the CLANG environment variable at a clang that can target bpf)";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE_DIR}");
    println!("cargo:rerun-if-env-changed=CLANG");

    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let sizes: Vec<Shared> = SIZES_SOURCES
        .iter()
        .flat_map(|s| shared_defines(s))
        .collect();
    write_rust(
        &SIZES_SOURCES.join(" and "),
        &sizes,
        "u32",
        &out.join(SIZES_RS),
    );
    for (header, name, rs, ty) in ENUMS {
        write_rust(header, &shared_enum(header, name), ty, &out.join(rs));
    }
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

/// A constant shared with Rust: its Rust name, its value (an expression C
/// and Rust read alike) and its doc, the C comment that goes with it.
struct Shared {
    name: String,
    value: String,
    doc: Vec<String>,
}

/// Every `#define PAL_<NAME> <value>` of `header`, with the comment right
/// above it (no blank line between) or after it on its line as its doc.
/// A value may use decimal literals, PAL_ names defined before it,
/// parentheses, `+`, `*` and `<<`: what means the same in C and in Rust.
fn shared_defines(header: &str) -> Vec<Shared> {
    let text = std::fs::read_to_string(header)
        .unwrap_or_else(|e| fail(&format!("could not read {header}: {e}")));
    let mut shared: Vec<Shared> = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with("/*") {
            doc = block_comment(header, trimmed, &mut lines);
            continue;
        }
        let Some(rest) = trimmed.strip_prefix("#define ") else {
            doc.clear();
            continue;
        };
        let rest = rest.trim_start();
        let Some(name) = rest.strip_prefix(SHARED_PREFIX) else {
            doc.clear();
            continue;
        };
        let (definition, trailing) = match name.find("/*") {
            Some(at) => (&name[..at], Some(&name[at..])),
            None => (name, None),
        };
        let (name, value) = definition
            .trim()
            .split_once(char::is_whitespace)
            .unwrap_or_else(|| {
                fail(&format!(
                    "{header}:{}: {SHARED_PREFIX}{name} has no value",
                    n + 1
                ))
            });
        if let Some(t) = trailing {
            if !t.contains("*/") {
                fail(&format!(
                    "{header}:{}: a trailing comment must end on its line",
                    n + 1
                ));
            }
            doc = comment_text(&[t.to_owned()]);
        }
        let value = rust_value(value.trim(), &shared)
            .unwrap_or_else(|e| fail(&format!("{header}:{}: {SHARED_PREFIX}{name}: {e}", n + 1)));
        shared.push(Shared {
            name: name.to_owned(),
            value,
            doc: std::mem::take(&mut doc),
        });
    }
    shared
}

/// The constants of `enum <name>` in `header`, one a line (`NAME = 3,` or
/// `NAME,`: the one before plus one), each with the comment right above it
/// or after it on its line as its doc.
fn shared_enum(header: &str, name: &str) -> Vec<Shared> {
    let text = std::fs::read_to_string(header)
        .unwrap_or_else(|e| fail(&format!("could not read {header}: {e}")));
    let opening = format!("enum {name} {{");
    let mut lines = text.lines().enumerate();
    if !lines.any(|(_, l)| l.trim() == opening) {
        fail(&format!("{header}: no `{opening}` line"));
    }
    let mut shared: Vec<Shared> = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut next: u64 = 0;
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim();
        if trimmed == "};" {
            return shared;
        }
        if trimmed.is_empty() {
            doc.clear();
            continue;
        }
        if trimmed.starts_with("/*") {
            doc = block_comment(header, trimmed, &mut lines);
            continue;
        }
        let at = |what: &str| -> ! { fail(&format!("{header}:{}: {what}", n + 1)) };
        let (entry, trailing) = match trimmed.find("/*") {
            Some(i) if trimmed.ends_with("*/") => (&trimmed[..i], Some(&trimmed[i..])),
            Some(_) => at("a trailing comment must end on its line"),
            None => (trimmed, None),
        };
        if let Some(t) = trailing {
            doc = comment_text(&[t.to_owned()]);
        }
        let entry = entry.trim().trim_end_matches(',').trim();
        let (constant, value) = match entry.split_once('=') {
            Some((c, v)) => {
                let v = v.trim();
                if !v.chars().all(|c| c.is_ascii_digit()) {
                    at(&format!("`{v}`: only plain decimal values"));
                }
                (
                    c.trim(),
                    v.parse().unwrap_or_else(|_| at("value out of range")),
                )
            }
            None => (entry, next),
        };
        if constant.is_empty()
            || !constant
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            at(&format!("`{trimmed}` is not one constant"));
        }
        next = value + 1;
        shared.push(Shared {
            name: constant.to_owned(),
            value: value.to_string(),
            doc: std::mem::take(&mut doc),
        });
    }
    fail(&format!("{header}: `{opening}` is not closed"))
}

/// The text of the block comment that opens on `first` and closes on it
/// or on a later line of `lines` (which it consumes), one entry a line.
fn block_comment<'a>(
    header: &str,
    first: &str,
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
) -> Vec<String> {
    let mut comment = vec![first.to_owned()];
    while !comment.last().is_some_and(|l| l.contains("*/")) {
        match lines.next() {
            Some((_, l)) => comment.push(l.trim().to_owned()),
            None => fail(&format!("{header}: a comment is not closed")),
        }
    }
    comment_text(&comment)
}

/// The text of a C block comment, one entry a line.
fn comment_text(lines: &[String]) -> Vec<String> {
    let mut text: Vec<String> = lines
        .iter()
        .map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("/*").unwrap_or(l);
            let l = l.strip_suffix("*/").unwrap_or(l);
            let l = l.trim();
            l.strip_prefix('*').unwrap_or(l).trim().to_owned()
        })
        .collect();
    while text.first().is_some_and(|l| l.is_empty()) {
        text.remove(0);
    }
    while text.last().is_some_and(|l| l.is_empty()) {
        text.pop();
    }
    text
}

/// The C expression `value` in Rust: the same tokens, each PAL_ name
/// without its prefix; an error for any token outside the common subset.
fn rust_value(value: &str, known: &[Shared]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if rest[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`{value}`: only plain decimal literals"));
            }
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else if c.is_ascii_alphabetic() || c == '_' {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let ident = &rest[..end];
            let name = ident
                .strip_prefix(SHARED_PREFIX)
                .filter(|n| known.iter().any(|k| k.name == *n))
                .ok_or_else(|| format!("`{ident}` is not a {SHARED_PREFIX} name defined above"))?;
            out.push_str(name);
            rest = &rest[end..];
        } else if let Some(r) = rest.strip_prefix("<<") {
            out.push_str("<<");
            rest = r;
        } else if "()+* ".contains(c) {
            out.push(c);
            rest = &rest[1..];
        } else {
            return Err(format!("`{value}`: `{c}` may mean another thing in Rust"));
        }
    }
    if out.trim().is_empty() {
        return Err("no value".to_owned());
    }
    Ok(without_outer_parens(&out).to_owned())
}

/// `(a * b)` as `a * b`: C wants the parentheses around a macro's value,
/// Rust warns of them around a constant's.
fn without_outer_parens(value: &str) -> &str {
    let Some(inner) = value.strip_prefix('(').and_then(|v| v.strip_suffix(')')) else {
        return value;
    };
    let mut depth = 0i32;
    for c in inner.chars() {
        depth += match c {
            '(' => 1,
            ')' => -1,
            _ => 0,
        };
        if depth < 0 {
            return value; // `(a) * (b)`: the parentheses are not one pair
        }
    }
    inner
}

/// Writes `shared` as `pub const NAME: <ty> = value;` lines, each with its
/// doc, into `path`; left alone when unchanged, so nothing downstream
/// rebuilds for nothing.
fn write_rust(sources: &str, shared: &[Shared], ty: &str, path: &Path) {
    let mut rs =
        format!("// Generated by palisade-ebpf's build.rs from {sources}: edit the C, not this.\n");
    for s in shared {
        rs.push('\n');
        for line in &s.doc {
            if line.is_empty() {
                rs.push_str("///\n");
            } else {
                rs.push_str(&format!("/// {line}\n"));
            }
        }
        rs.push_str(&format!("pub const {}: {ty} = {};\n", s.name, s.value));
    }
    if std::fs::read_to_string(path).ok().as_deref() == Some(rs.as_str()) {
        return;
    }
    std::fs::write(path, rs)
        .unwrap_or_else(|e| fail(&format!("could not write {}: {e}", path.display())));
}

fn fail(msg: &str) -> ! {
    panic!("palisade-ebpf: {msg}");
}
