//! The manifest directory the controller reads: one JSON file per object and
//! a `.revision` marker.
//!
//! The controller may read the directory at any moment, so every file is
//! replaced atomically (temp file + rename), and `.revision` is written last:
//! once the controller sees revision R, every object of R is already there.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::scenario::ObjectKey;

pub const REVISION_FILE: &str = ".revision";

pub struct Manifests {
    dir: PathBuf,
    revision: u64,
}

impl Manifests {
    /// Creates the directory; the first [`Manifests::publish`] writes revision 1.
    pub fn create(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir)
            .with_context(|| format!("creating manifest dir {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            revision: 0,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last published revision (0 before the first publish).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn write(&self, key: &ObjectKey, body: &Value) -> Result<()> {
        let text = serde_json::to_vec_pretty(body)?;
        write_atomic(&self.dir.join(file_name(key)), &text)
            .with_context(|| format!("writing the manifest of {key}"))
    }

    /// A Node object (`node_<name>.json`): not a kind scenarios write, the
    /// lab writes one per node.
    pub fn write_node(&self, body: &Value) -> Result<()> {
        let name = body["metadata"]["name"]
            .as_str()
            .context("a Node manifest without metadata.name")?;
        let text = serde_json::to_vec_pretty(body)?;
        write_atomic(&self.dir.join(format!("node_{name}.json")), &text)
            .with_context(|| format!("writing the manifest of node {name}"))
    }

    pub fn remove(&self, key: &ObjectKey) -> Result<()> {
        let path = self.dir.join(file_name(key));
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }

    /// Marks everything written so far as the next revision and returns it.
    /// No trailing newline: the marker is compared as a string.
    pub fn publish(&mut self) -> Result<u64> {
        let next = self.revision + 1;
        write_atomic(&self.dir.join(REVISION_FILE), next.to_string().as_bytes())
            .context("writing the manifest revision")?;
        self.revision = next;
        Ok(next)
    }
}

/// Kubernetes names cannot contain '_', so this is unambiguous.
fn file_name(key: &ObjectKey) -> String {
    match &key.namespace {
        Some(ns) => format!(
            "{}_{}_{}.json",
            key.kind.as_str().to_lowercase(),
            ns,
            key.name
        ),
        None => format!("{}_{}.json", key.kind.as_str().to_lowercase(), key.name),
    }
}

/// The temp name starts with '.' and does not end in `.json`, so a reader
/// listing `*.json` never sees a half-written file.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("manifest path has no file name")?;
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Kind;

    #[test]
    fn writes_objects_then_revision() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifests::create(dir.path()).unwrap();
        let key = ObjectKey {
            kind: Kind::NetworkPolicy,
            namespace: Some("x".into()),
            name: "deny".into(),
        };
        m.write(&key, &serde_json::json!({"kind": "NetworkPolicy"}))
            .unwrap();
        assert_eq!(m.publish().unwrap(), 1);
        assert_eq!(m.publish().unwrap(), 2);
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".revision", "networkpolicy_x_deny.json"]);
        assert_eq!(
            fs::read_to_string(dir.path().join(".revision")).unwrap(),
            "2"
        );
        m.remove(&key).unwrap();
        m.remove(&key).unwrap();
        assert!(!dir.path().join("networkpolicy_x_deny.json").exists());
    }
}
