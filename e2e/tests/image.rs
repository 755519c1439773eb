//! Palisade's image, as `scripts/image.sh` builds it from this tree (the
//! image that is shipped): what it holds, whom it runs as, how it is
//! tagged, how big it is, and that each binary runs in it.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::require_root;
use palisade_e2e::image::{ensure, repo_root, BuiltImage};

const BINARIES: [&str; 3] = ["palisade-controller", "palisade-enforcer", "palisade-cni"];
/// The binaries linked against the image's libraries; palisade-cni, which
/// runs on the node, is static.
const DYNAMIC: [&str; 2] = ["palisade-controller", "palisade-enforcer"];
/// What the image may weigh beyond its three binaries: libraries, CA
/// certificates, licences. A base image slipped in would exceed it.
const OVERHEAD_LIMIT: u64 = 8 << 20;

fn image() -> &'static BuiltImage {
    ensure().unwrap_or_else(|e| panic!("{e:#}"))
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .expect("podman runs");
    assert!(
        out.status.success(),
        "podman {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The image's root filesystem, mounted read-only for the test.
struct Mounted(PathBuf, String);

impl Mounted {
    fn new(reference: &str) -> Mounted {
        Mounted(
            PathBuf::from(podman(&["image", "mount", reference])),
            reference.to_string(),
        )
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["image", "unmount", &self.1])
            .output();
    }
}

/// Every path in the tree under `root`, relative, with `/` for files and
/// `@target` for symlinks, directories with a trailing slash.
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                out.insert(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&path).unwrap().display()
                ));
            } else if t.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &path, out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// The libraries ldd names for the dynamic release binaries on this machine.
fn libraries() -> BTreeSet<String> {
    let mut libs = BTreeSet::new();
    for b in DYNAMIC {
        let out = Command::new("ldd")
            .arg(repo_root().join("target/release").join(b))
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => libs.insert(path.to_string()),
                [path, ..] if path.starts_with('/') => libs.insert(path.to_string()),
                _ => false,
            };
        }
    }
    libs
}

#[test]
#[ignore = "needs root"]
fn the_image_holds_the_binaries_their_libraries_and_nothing_else() {
    require_root();
    let image = image();
    let mounted = Mounted::new(&image.reference);
    let root = &mounted.0;
    let files: BTreeSet<String> = tree(root)
        .into_iter()
        .filter(|p| !p.ends_with('/') && !p.contains(" -> "))
        .collect();
    let mut want: BTreeSet<String> = BINARIES
        .iter()
        .map(|b| format!("usr/local/bin/{b}"))
        .collect();
    for lib in libraries() {
        // The image keeps Debian's merged /usr: the file is where the
        // path resolves on this machine, and the path resolves there.
        let real = std::fs::canonicalize(&lib).unwrap();
        want.insert(
            real.display()
                .to_string()
                .trim_start_matches('/')
                .to_string(),
        );
        assert!(
            root.join(lib.trim_start_matches('/')).exists(),
            "{lib} does not resolve in the image"
        );
    }
    for f in [
        "etc/passwd",
        "etc/group",
        "etc/nsswitch.conf",
        "etc/ssl/certs/ca-certificates.crt",
        "usr/share/palisade/image-contents",
    ] {
        want.insert(f.to_string());
    }
    // Licences, where their paths resolve on this machine (libgcc-s1's doc
    // dir is a symlink to gcc-12-base's), and the paths resolve there.
    for doc in ["libc6", "libgcc-s1", "ca-certificates"] {
        let path = format!("/usr/share/doc/{doc}/copyright");
        let real = std::fs::canonicalize(&path).unwrap();
        want.insert(
            real.display()
                .to_string()
                .trim_start_matches('/')
                .to_string(),
        );
        assert!(
            root.join(path.trim_start_matches('/')).exists(),
            "{path} does not resolve in the image"
        );
    }
    assert_eq!(files, want, "the image's files");

    // The contents list names every file with its digest and the Debian
    // packages they came from.
    let contents = std::fs::read_to_string(root.join("usr/share/palisade/image-contents")).unwrap();
    let listed: BTreeSet<String> = contents
        .lines()
        .filter_map(|l| l.strip_prefix("file "))
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    let mut expected_listed = want.clone();
    expected_listed.remove("usr/share/palisade/image-contents");
    assert_eq!(listed, expected_listed);
    for l in contents.lines().filter_map(|l| l.strip_prefix("file ")) {
        let (digest, path) = l.split_once("  ").unwrap();
        let out = Command::new("sha256sum")
            .arg(root.join(path))
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with(digest),
            "{path}"
        );
    }
    for p in ["libc6", "libgcc-s1", "ca-certificates"] {
        assert!(contents.contains(&format!("package {p} ")), "{contents}");
    }

    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    assert!(!passwd.contains("/bin/sh"), "no user has a shell: {passwd}");
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash"] {
        assert!(!root.join(shell).exists(), "{shell} in the image");
    }
}

#[test]
#[ignore = "needs root"]
fn the_image_runs_as_the_non_root_user_and_carries_version_and_commit() {
    require_root();
    let image = image();
    assert_eq!(
        podman(&[
            "image",
            "inspect",
            "--format",
            "{{.Config.User}}",
            &image.reference
        ]),
        "65532:65532"
    );
    let version = env!("CARGO_PKG_VERSION");
    let chart = std::fs::read_to_string(repo_root().join("helm/palisade/Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("appVersion: \"{version}\"")),
        "the chart's appVersion is the workspace version {version}, the image's tag"
    );
    let commit = String::from_utf8(
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(repo_root())
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let (repository, tag) = image.reference.rsplit_once(':').unwrap();
    assert!(
        tag.starts_with(&format!("{version}-{}", commit.trim())),
        "{tag}"
    );
    let tags = podman(&[
        "image",
        "inspect",
        "--format",
        "{{.RepoTags}}",
        &image.reference,
    ]);
    assert!(tags.contains(&format!("{repository}:{version}")), "{tags}");
    assert!(tags.contains(&image.reference), "{tags}");
    let label = |l: &str| {
        podman(&[
            "image",
            "inspect",
            "--format",
            &format!("{{{{index .Labels \"{l}\"}}}}"),
            &image.reference,
        ])
    };
    assert_eq!(label("org.opencontainers.image.version"), version);
    assert!(tag.ends_with(&label("org.opencontainers.image.revision")));
}

#[test]
#[ignore = "needs root"]
fn the_image_is_its_binaries_and_a_few_megabytes() {
    require_root();
    let image = image();
    let mounted = Mounted::new(&image.reference);
    let binaries: u64 = BINARIES
        .iter()
        .map(|b| {
            std::fs::metadata(mounted.0.join("usr/local/bin").join(b))
                .unwrap()
                .len()
        })
        .sum();
    println!(
        "image_size_bytes={} binaries_bytes={binaries}",
        image.size_bytes
    );
    assert!(
        image.size_bytes < binaries + OVERHEAD_LIMIT,
        "the image is {} bytes, its binaries {binaries}: more than {OVERHEAD_LIMIT} bytes besides them",
        image.size_bytes
    );
}

/// Whether the ELF file at `path` names a program interpreter (PT_INTERP):
/// a dynamically linked program, which needs the C library it was linked
/// against, or a newer one, wherever it runs.
fn has_interpreter(path: &Path) -> bool {
    const PT_INTERP: u32 = 3;
    let elf = std::fs::read(path).unwrap();
    assert_eq!(
        &elf[..5],
        b"\x7fELF\x02",
        "{}: not a 64-bit ELF file",
        path.display()
    );
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == PT_INTERP
    })
}

/// palisade-cni runs on the node, outside the image, under the node's C
/// library (which may be older than the build machine's): it links none.
#[test]
#[ignore = "needs root"]
fn palisade_cni_is_static_and_the_others_use_the_images_libraries() {
    require_root();
    let mounted = Mounted::new(&image().reference);
    let bin = mounted.0.join("usr/local/bin");
    assert!(
        !has_interpreter(&bin.join("palisade-cni")),
        "palisade-cni in the image is dynamically linked"
    );
    for b in DYNAMIC {
        assert!(has_interpreter(&bin.join(b)), "{b}: expected dynamic");
    }
}

#[test]
#[ignore = "needs root"]
fn each_binary_runs_in_the_image() {
    require_root();
    let image = image();
    let run = |entrypoint: &str, args: &[&str]| {
        let mut cmd = Command::new("podman");
        cmd.args([
            "run",
            "--rm",
            "--pull=never",
            "--network=none",
            // podman's defaults exceed this machine's hard limits, which
            // root cannot raise (no CAP_SYS_RESOURCE).
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=1024:1024",
            "--entrypoint",
            entrypoint,
            &image.reference,
        ]);
        cmd.args(args);
        cmd.output().unwrap()
    };
    let version = env!("CARGO_PKG_VERSION");
    for b in ["palisade-controller", "palisade-enforcer"] {
        let out = run(&format!("/usr/local/bin/{b}"), &["--version"]);
        assert!(
            out.status.success(),
            "{b}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{b} {version}")
        );
    }
    // No arguments a CNI runtime would not give: it answers with usage.
    let out = run("/usr/local/bin/palisade-cni", &["health", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown flag --bogus"));
}
