//! The Helm chart as the real Helm library renders it (helm/check/render.py,
//! which installs it into a stand-in API server and records what Helm
//! sends), for running its pods here.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The repository's chart, next to this crate.
pub fn default_chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/palisade")
}

/// The renderer that comes with `chart` (`helm/check/render.py` beside
/// `helm/palisade`).
fn renderer(chart: &Path) -> PathBuf {
    chart
        .parent()
        .unwrap_or(Path::new("."))
        .join("check/render.py")
}

/// Every object Helm would create for `values` (a values document; a
/// values file's contents), in the namespace `palisade-system`.
pub fn render(chart: &Path, values: &Value, scratch: &Path) -> Result<Vec<Value>> {
    let file = scratch.join(format!("values-{}.json", std::process::id()));
    let file = unique(&file);
    std::fs::write(&file, serde_json::to_vec_pretty(values)?)
        .with_context(|| format!("writing {}", file.display()))?;
    let result = render_file(chart, Some(&file));
    let _ = std::fs::remove_file(&file);
    result
}

/// [`render`] of a values file (None: the chart's defaults).
pub fn render_file(chart: &Path, values: Option<&Path>) -> Result<Vec<Value>> {
    let script = renderer(chart);
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg(chart);
    if let Some(v) = values {
        cmd.arg("--values").arg(v);
    }
    let out = cmd
        .output()
        .with_context(|| format!("running python3 {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("ModuleNotFoundError") {
        bail!("rendering the chart needs helm-sdkpy and PyYAML (scripts/setup.sh installs them):\n{stderr}");
    }
    if !out.status.success() {
        bail!(
            "Helm refused the chart {} with {}: {}",
            chart.display(),
            values.map_or("its default values".to_string(), |v| v
                .display()
                .to_string()),
            stderr.trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).context("render.py prints JSON lines"))
        .collect()
}

/// A file name no other thread of this process is using.
fn unique(base: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    base.with_extension(format!("{n}.json"))
}

/// `repository:tag` split as the chart's `image.repository` and
/// `image.tag` take it (the tag follows the last colon after the last
/// slash; a registry port is not a tag).
pub fn split_image(reference: &str) -> Result<(&str, &str)> {
    let name_start = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[name_start..].rfind(':') {
        Some(i) => {
            let at = name_start + i;
            Ok((&reference[..at], &reference[at + 1..]))
        }
        None => bail!("image {reference:?} has no tag (the chart needs repository and tag)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_split_at_the_tag() {
        assert_eq!(
            split_image("ghcr.io/palisade/palisade:0.1.0-abc").unwrap(),
            ("ghcr.io/palisade/palisade", "0.1.0-abc")
        );
        assert_eq!(
            split_image("localhost:5000/p:1").unwrap(),
            ("localhost:5000/p", "1")
        );
        assert!(split_image("localhost:5000/p").is_err());
    }
}
