//! `palisade-cni install-seccomp`: puts the enforcer's seccomp profile where
//! the kubelet looks for Localhost profiles (`<root-dir>/seccomp/`), as the
//! DaemonSet's init container does before the enforcer's container is
//! created (the runtime reads the file then).
//!
//! The profile is checked before it is written: a file the runtime cannot
//! parse would stop the enforcer's container from being created, with an
//! error far from its cause. The file is replaced atomically and left
//! alone when it already holds the same bytes; profiles are never removed
//! (a pod of the previous version may still restart with its own).
//!
//! A name the chart makes from the content (`…-<first 16 hex digits of its
//! sha256>.json`) is held to it: `helm upgrade` changes the ConfigMap in
//! place, so a pod of the previous version whose init containers run again
//! (its sandbox recreated mid-rollout) reads the next version's profile,
//! which must not land under its name. Then the node's file is kept if it
//! is the name's own, and otherwise nothing is written and the install
//! fails. Any other name takes whatever `--from` holds.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::install::{replace_atomically, InstallError};

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The profile to install.
    pub from: PathBuf,
    /// The kubelet's seccomp directory as mounted here.
    pub dir: PathBuf,
    /// Where in `dir`: the pod's `localhostProfile`, a relative path.
    pub name: String,
}

pub fn parse_args(args: &[String]) -> Result<Options, InstallError> {
    let (mut from, mut dir, mut name) = (None, None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .cloned()
            .ok_or_else(|| InstallError::Usage(format!("{flag} needs a value")));
        match flag.as_str() {
            "--from" => from = Some(PathBuf::from(value?)),
            "--dir" => dir = Some(PathBuf::from(value?)),
            "--name" => name = Some(value?),
            other => {
                return Err(InstallError::Usage(format!(
                    "unknown flag {other} (known: --from FILE, --dir DIR, --name RELATIVE_PATH)"
                )))
            }
        }
    }
    let missing = |f: &str| InstallError::Usage(format!("install-seccomp needs {f}"));
    let name = name.ok_or_else(|| missing("--name"))?;
    // The API's rule for localhostProfile: a descending relative path.
    if name.starts_with('/') || name.split('/').any(|c| c.is_empty() || c == "..") {
        return Err(InstallError::Usage(format!(
            "--name {name:?} must be a descending relative path (as a pod's localhostProfile)"
        )));
    }
    Ok(Options {
        from: from.ok_or_else(|| missing("--from"))?,
        dir: dir.ok_or_else(|| missing("--dir"))?,
        name,
    })
}

/// Why `text` is not a profile the runtimes read (the OCI runtime spec's
/// LinuxSeccomp: defaultAction and a list of syscall rules, each with names
/// and an action), if it is not.
pub fn check_profile(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let action = v["defaultAction"]
        .as_str()
        .ok_or("no defaultAction string")?;
    if !action.starts_with("SCMP_ACT_") {
        return Err(format!(
            "defaultAction {action:?} is not an SCMP_ACT_ action"
        ));
    }
    let rules = v["syscalls"].as_array().ok_or("no syscalls list")?;
    for (i, rule) in rules.iter().enumerate() {
        let names = rule["names"]
            .as_array()
            .filter(|n| !n.is_empty() && n.iter().all(Value::is_string))
            .ok_or_else(|| format!("syscalls[{i}].names is not a list of names"))?;
        if !rule["action"]
            .as_str()
            .is_some_and(|a| a.starts_with("SCMP_ACT_"))
        {
            return Err(format!(
                "syscalls[{i}] ({}) has no SCMP_ACT_ action",
                names[0]
            ));
        }
    }
    Ok(())
}

/// How many hex digits of the sha256 the chart puts in the name
/// (`sha256sum | trunc 16`).
const NAME_DIGEST_LEN: usize = 16;

/// The digest a content-addressed name carries: its file name ends in
/// `-<16 lowercase hex>.json`.
fn named_digest(name: &str) -> Option<&str> {
    let file = name.rsplit('/').next()?;
    let (_, hex) = file.strip_suffix(".json")?.rsplit_once('-')?;
    let is_digest = hex.len() == NAME_DIGEST_LEN
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    is_digest.then_some(hex)
}

/// `bytes`' digest as the chart's names show it.
fn short_digest(bytes: &[u8]) -> String {
    let mut hex = format!("{:x}", Sha256::digest(bytes));
    hex.truncate(NAME_DIGEST_LEN);
    hex
}

pub fn install(opts: &Options) -> Result<Vec<String>, InstallError> {
    let from = opts.from.display().to_string();
    let text = std::fs::read_to_string(&opts.from)
        .map_err(|e| InstallError::Io(format!("reading {from}: {e}")))?;
    let target = opts.dir.join(&opts.name);
    if let Some(expected) = named_digest(&opts.name) {
        let found = short_digest(text.as_bytes());
        if found != expected {
            // Before the profile check: this content is not installed here
            // whether or not it parses.
            return keep_own(&target, expected, &from, &found);
        }
    }
    check_profile(&text).map_err(|reason| InstallError::Config {
        path: from.clone(),
        reason,
    })?;
    if std::fs::read(&target).ok().as_deref() == Some(text.as_bytes()) {
        return Ok(vec![format!("{}: unchanged", target.display())]);
    }
    let parent = target.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent)
        .map_err(|e| InstallError::Io(format!("creating {}: {e}", parent.display())))?;
    replace_atomically(&target, text.as_bytes(), 0o644)?;
    Ok(vec![format!("{}: installed", target.display())])
}

/// `from` holds another profile (`found`) than `target`'s name says
/// (`expected`): the ConfigMap, changed by an upgrade. The node's file is
/// this pod's version's profile if an earlier run installed it, and is
/// then kept; else this version's profile is nowhere to be had.
fn keep_own(
    target: &Path,
    expected: &str,
    from: &str,
    found: &str,
) -> Result<Vec<String>, InstallError> {
    let on_node = match std::fs::read(target) {
        Ok(bytes) => {
            let own = short_digest(&bytes);
            if own == expected {
                return Ok(vec![format!(
                    "{}: kept; {from} now holds another profile (sha256 {found}…), \
                     this pod's version's is on the node",
                    target.display()
                )]);
            }
            format!("holds sha256 {own}…")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "is missing".to_string(),
        Err(e) => format!("cannot be read ({e})"),
    };
    Err(InstallError::ProfileMismatch {
        target: target.display().to_string(),
        expected: expected.to_string(),
        from: from.to_string(),
        found: found.to_string(),
        on_node,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_fixtures::tree;
    use super::*;

    const PROFILE: &str = r#"{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "syscalls": [{"names": ["read", "bpf"], "action": "SCMP_ACT_ALLOW"}]}"#;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn installs_once_then_leaves_the_same_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("p.json");
        std::fs::write(&src, PROFILE).unwrap();
        let opts = parse_args(&args(&[
            "--from",
            src.to_str().unwrap(),
            "--dir",
            dir.path().join("seccomp").to_str().unwrap(),
            "--name",
            "palisade/enforcer-1.json",
        ]))
        .unwrap();
        let first = install(&opts).unwrap();
        assert!(first[0].ends_with("installed"), "{first:?}");
        let target = dir.path().join("seccomp/palisade/enforcer-1.json");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), PROFILE);
        assert!(install(&opts).unwrap()[0].ends_with("unchanged"));
    }

    #[test]
    fn a_broken_profile_is_refused_before_anything_is_written() {
        assert!(check_profile(PROFILE).is_ok());
        for (bad, why) in [
            ("{", "not valid JSON"),
            (r#"{"syscalls": []}"#, "defaultAction"),
            (r#"{"defaultAction": "ALLOW", "syscalls": []}"#, "SCMP_ACT_"),
            (r#"{"defaultAction": "SCMP_ACT_ERRNO"}"#, "syscalls"),
            (
                r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": [], "action": "SCMP_ACT_ALLOW"}]}"#,
                "names",
            ),
            (
                r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"]}]}"#,
                "read",
            ),
        ] {
            let e = check_profile(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("p.json");
        std::fs::write(&src, "{}").unwrap();
        let opts = Options {
            from: src.clone(),
            dir: dir.path().join("seccomp"),
            name: "p.json".into(),
        };
        let e = install(&opts).unwrap_err().to_string();
        assert!(e.contains(src.to_str().unwrap()), "{e}");
        assert!(!dir.path().join("seccomp").exists());
    }

    /// The next chart version's profile: one more call allowed.
    const NEXT: &str = r#"{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "syscalls": [{"names": ["read", "write", "bpf"], "action": "SCMP_ACT_ALLOW"}]}"#;

    /// The chart's name for a profile of `text`.
    fn chart_name(text: &str) -> String {
        format!("palisade/enforcer-{}.json", short_digest(text.as_bytes()))
    }

    /// A node's seccomp dir and a ConfigMap file holding `from`, the
    /// options installing it under `name`.
    fn node(from: &str, name: &str) -> (tempfile::TempDir, Options) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("enforcer.json");
        std::fs::write(&src, from).unwrap();
        let opts = Options {
            from: src,
            dir: dir.path().join("seccomp"),
            name: name.into(),
        };
        (dir, opts)
    }

    #[test]
    fn only_a_name_ending_in_16_lowercase_hex_digits_is_content_addressed() {
        assert_eq!(
            named_digest("palisade/enforcer-0123456789abcdef.json"),
            Some("0123456789abcdef")
        );
        assert_eq!(
            named_digest("-0123456789abcdef.json"),
            Some("0123456789abcdef")
        );
        for name in [
            "palisade/enforcer-1.json",
            "enforcer-0123456789ABCDEF.json",
            "enforcer-0123456789abcde.json",
            "enforcer-0123456789abcdef0.json",
            "enforcer-0123456789abcdeg.json",
            "enforcer-0123456789abcdef.yaml",
            "enforcer0123456789abcdef.json",
            "a-0123456789abcdef.json/enforcer.json",
        ] {
            assert_eq!(named_digest(name), None, "{name}");
        }
        // Any content under such a name, as before.
        let (_dir, opts) = node(NEXT, "palisade/enforcer-0123456789ABCDEF.json");
        assert!(install(&opts).unwrap()[0].ends_with(": installed"));
        assert_eq!(
            std::fs::read_to_string(opts.dir.join(&opts.name)).unwrap(),
            NEXT
        );
    }

    /// The name as the chart makes it (`sha256sum | trunc 16` of the
    /// shipped file) takes that file, and replaces a damaged one; the same
    /// name does not take another profile.
    #[test]
    fn a_content_addressed_name_takes_the_content_it_names_and_no_other() {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../helm/palisade/files/enforcer-seccomp.json");
        let out = std::process::Command::new("sha256sum")
            .arg(&shipped)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let name = format!(
            "palisade/enforcer-{}.json",
            &String::from_utf8_lossy(&out.stdout)[..16]
        );
        let text = std::fs::read_to_string(&shipped).unwrap();
        let (_dir, opts) = node(&text, &name);
        let target = opts.dir.join(&name);
        assert!(install(&opts).unwrap()[0].ends_with(": installed"));
        assert!(install(&opts).unwrap()[0].ends_with(": unchanged"));
        std::fs::write(&target, "{").unwrap();
        assert!(install(&opts).unwrap()[0].ends_with(": installed"));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), text);

        let (_dir, opts) = node(PROFILE, &name);
        let err = install(&opts).unwrap_err();
        assert!(matches!(err, InstallError::ProfileMismatch { .. }), "{err}");
        assert!(!opts.dir.exists());
    }

    /// An old pod's init container run again mid-upgrade: the ConfigMap
    /// holds the next version's profile, the node still its own.
    #[test]
    fn another_versions_profile_leaves_this_versions_file_on_the_node() {
        let name = chart_name(PROFILE);
        let (_dir, opts) = node(PROFILE, &name);
        install(&opts).unwrap();
        std::fs::write(&opts.from, NEXT).unwrap();
        let target = opts.dir.join(&name);
        let before = tree(&opts.dir);

        let done = install(&opts).unwrap();
        let want = format!(
            "{}: kept; {} now holds another profile (sha256 {}…), \
             this pod's version's is on the node",
            target.display(),
            opts.from.display(),
            short_digest(NEXT.as_bytes())
        );
        assert_eq!(done, [want]);
        assert_eq!(tree(&opts.dir), before);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), PROFILE);
    }

    /// The same, on a node without this version's profile: nothing is
    /// written, not even the directory, and the error says why.
    #[test]
    fn another_versions_profile_is_not_installed_where_this_versions_is_missing() {
        let name = chart_name(PROFILE);
        let (_dir, opts) = node(NEXT, &name);
        let err = install(&opts).unwrap_err();
        let target = opts.dir.join(&name);
        assert_eq!(
            err,
            InstallError::ProfileMismatch {
                target: target.display().to_string(),
                expected: short_digest(PROFILE.as_bytes()),
                from: opts.from.display().to_string(),
                found: short_digest(NEXT.as_bytes()),
                on_node: "is missing".into(),
            }
        );
        let e = err.to_string();
        for part in [
            target.to_str().unwrap(),
            opts.from.to_str().unwrap(),
            &short_digest(PROFILE.as_bytes()),
            &short_digest(NEXT.as_bytes()),
            "is missing",
            "the ConfigMap was changed by an upgrade of the chart",
            "nothing written",
        ] {
            assert!(e.contains(part), "{part:?} not in {e}");
        }
        assert!(!opts.dir.exists());
    }

    /// A node file under this version's name that is not its profile:
    /// another version's (as the install before this check wrote it) or
    /// damaged. It is left as it is, and the install fails naming its hash.
    #[test]
    fn another_versions_profile_is_not_installed_over_a_file_of_other_content() {
        let name = chart_name(PROFILE);
        for on_node in [NEXT, "{"] {
            let (_dir, opts) = node(NEXT, &name);
            let target = opts.dir.join(&name);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(&target, on_node).unwrap();
            let before = tree(&opts.dir);

            let err = install(&opts).unwrap_err();
            let InstallError::ProfileMismatch {
                on_node: found_on_node,
                ..
            } = &err
            else {
                panic!("{on_node}: {err}");
            };
            let want = format!("holds sha256 {}…", short_digest(on_node.as_bytes()));
            assert_eq!(found_on_node, &want, "{on_node}");
            assert!(err.to_string().contains(target.to_str().unwrap()), "{err}");
            assert_eq!(tree(&opts.dir), before, "{on_node}");
        }
    }

    #[test]
    fn names_must_descend() {
        for name in ["/abs.json", "../up.json", "a//b.json", "a/../b.json"] {
            let e = parse_args(&args(&["--from", "f", "--dir", "d", "--name", name])).unwrap_err();
            assert!(e.to_string().contains("descending"), "{name}: {e}");
        }
        assert!(parse_args(&args(&["--from", "f", "--dir", "d"]))
            .unwrap_err()
            .to_string()
            .contains("--name"));
    }
}
