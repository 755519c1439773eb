//! Palisade's image as `scripts/image.sh` builds it from this tree, built
//! once per process and shared (the script itself skips an image that is
//! already this build, so test binaries after the first pay only for
//! staging).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};

/// What image.sh reports.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// `repository:VERSION-COMMIT`.
    pub reference: String,
    pub id: String,
    pub size_bytes: u64,
    /// Whether this call built it (false: it was already this build).
    pub built: bool,
}

/// The repository root (the workspace).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e is in the workspace")
        .to_path_buf()
}

/// The image `scripts/image.sh` tags `REPOSITORY:VERSION`: the chart's
/// `image.repository` (the one home of it) and this workspace's version.
pub fn default_reference() -> String {
    let values = repo_root().join("helm/palisade/values.yaml");
    let repository = std::fs::read_to_string(&values)
        .ok()
        .and_then(|t| serde_yaml::from_str::<serde_yaml::Value>(&t).ok())
        .and_then(|v| v["image"]["repository"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("{} names no image.repository", values.display()));
    format!("{repository}:{}", env!("CARGO_PKG_VERSION"))
}

/// Builds (or finds) the image of this tree, once per process.
pub fn ensure() -> Result<&'static BuiltImage> {
    static IMAGE: OnceLock<Result<BuiltImage, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("building the image: {e}"))
}

/// The version the upgrade test names its second image of this tree.
pub const NEXT_VERSION_SUFFIX: &str = "next";

/// This tree's image built as the next version (`VERSION-next`): the same
/// binaries under another version's tags and label, once per process.
pub fn ensure_next() -> Result<&'static BuiltImage> {
    static IMAGE: OnceLock<Result<BuiltImage, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let version = format!("{}-{NEXT_VERSION_SUFFIX}", env!("CARGO_PKG_VERSION"));
            build_with(&["--version", &version]).map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map_err(|e| anyhow!("building the next version's image: {e}"))
}

fn build() -> Result<BuiltImage> {
    build_with(&[])
}

fn build_with(args: &[&str]) -> Result<BuiltImage> {
    let script = repo_root().join("scripts/image.sh");
    let out = Command::new(&script)
        .args(args)
        .current_dir(repo_root())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}{}",
            script.display(),
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse(&stdout)
}

/// The key=value lines image.sh ends with.
pub fn parse(stdout: &str) -> Result<BuiltImage> {
    let get = |key: &str| {
        stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .ok_or_else(|| anyhow!("image.sh printed no {key}= line:\n{stdout}"))
    };
    Ok(BuiltImage {
        reference: get("image")?,
        id: get("id")?,
        size_bytes: get("size_bytes")?
            .parse()
            .context("image.sh's size_bytes")?,
        built: get("built")? == "yes",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_last_lines() {
        let b = parse("noise\nimage=r:1-abc\nid=sha\nsize_bytes=12\nbuilt=no\n").unwrap();
        assert_eq!(b.reference, "r:1-abc");
        assert_eq!(b.size_bytes, 12);
        assert!(!b.built);
        assert!(parse("image=x\n").is_err());
    }
}
