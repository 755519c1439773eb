//! What the tests of [`super::install`] and [`super::watch`] both start
//! from, written once so the two cannot drift apart: flannel's conflist on
//! a node, and the options installing into it; and how the tests see what
//! an install wrote.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::install::Options;

/// The enforcer's socket in [`node`]'s options.
pub(crate) const SOCKET: &str = "/run/palisade/cni.sock";

/// flannel's conflist, an interface plugin and portmap.
pub(crate) fn flannel() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "cbr0",
        "plugins": [
            {"type": "flannel", "delegate": {"hairpinMode": true}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
}

/// A conf dir (`net.d`) with `10-flannel.conflist` of `conf`, a bin dir
/// (`bin`) and a binary to install (`self`); `Options` installing into
/// them once (not watching), with a 10 s timeout and [`SOCKET`].
pub(crate) fn node(conf: &Value) -> (tempfile::TempDir, Options, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let conf_dir = dir.path().join("net.d");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        conf_dir.join("10-flannel.conflist"),
        serde_json::to_vec_pretty(conf).unwrap(),
    )
    .unwrap();
    let own = dir.path().join("self");
    std::fs::write(&own, b"binary").unwrap();
    let opts = Options {
        conf_dir,
        conf_file: None,
        bin_dir: Some(bin),
        enforcer_socket: SOCKET.into(),
        timeout_seconds: 10,
        watch: false,
    };
    (dir, opts, own)
}

/// Every file under `dir`, with its bytes.
pub(crate) fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(tree(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            out.push((path, bytes));
        }
    }
    out.sort();
    out
}
