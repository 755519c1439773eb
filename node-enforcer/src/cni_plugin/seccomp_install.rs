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

use std::path::{Path, PathBuf};

use serde_json::Value;

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

pub fn install(opts: &Options) -> Result<Vec<String>, InstallError> {
    let from = opts.from.display().to_string();
    let text = std::fs::read_to_string(&opts.from)
        .map_err(|e| InstallError::Io(format!("reading {from}: {e}")))?;
    check_profile(&text).map_err(|reason| InstallError::Config {
        path: from.clone(),
        reason,
    })?;
    let target = opts.dir.join(&opts.name);
    if std::fs::read(&target).ok().as_deref() == Some(text.as_bytes()) {
        return Ok(vec![format!("{}: unchanged", target.display())]);
    }
    let parent = target.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent)
        .map_err(|e| InstallError::Io(format!("creating {}: {e}", parent.display())))?;
    replace_atomically(&target, text.as_bytes(), 0o644)?;
    Ok(vec![format!("{}: installed", target.display())])
}

#[cfg(test)]
mod tests {
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
