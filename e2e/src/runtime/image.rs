//! The lab's sandbox (pause) image, made here from bytes: nothing is pulled,
//! there is no registry. One layer holding the static pause program built
//! from `pause/pause.c`, an image config that runs it, a manifest and an
//! index, packed as an OCI image-layout tar archive, which `ctr images
//! import` reads. Everything is deterministic: the same program gives the
//! same digests, so a re-import is a no-op.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The reference the CRI plugin's `sandbox_image` names. A host with a dot
/// makes it a registry name of its own: never resolved to Docker Hub, and
/// never pulled as long as the image is present (the lab imports it before
/// the first sandbox).
pub const PAUSE_IMAGE: &str = "palisade.lab/pause:1";

/// The pause program, built by `build.rs` (static, stripped).
pub static PAUSE_PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pause"));

/// Where the program sits in the image, and what the image runs.
const ENTRYPOINT: &str = "pause";

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// containerd names an imported image after this annotation of the index.
const CONTAINERD_NAME: &str = "io.containerd.image.name";
const OCI_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// `sha256:<hex>` of `data`.
pub fn digest(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// The OCI name of this machine's architecture (the image must match the
/// platform containerd runs on, or it is not unpacked).
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// The image-layout archive of an image named `reference` whose only file
/// is `program`, run as its entrypoint.
pub fn archive(reference: &str, program: &[u8]) -> std::io::Result<Vec<u8>> {
    let layer = tar_of(&[(ENTRYPOINT, 0o755, program)])?;
    let layer_digest = digest(&layer);
    let config = json_bytes(&json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Entrypoint": [format!("/{ENTRYPOINT}")]},
        // An uncompressed layer's diff id is its own digest.
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }));
    let manifest = json_bytes(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer.len()}],
    }));
    let tag = reference.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = json_bytes(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {CONTAINERD_NAME: reference, OCI_REF_NAME: tag},
            "platform": {"architecture": oci_arch(), "os": "linux"},
        }],
    }));
    let layout = json_bytes(&json!({"imageLayoutVersion": "1.0.0"}));
    let blob = |data: &[u8]| format!("blobs/sha256/{}", &digest(data)["sha256:".len()..]);
    let (layer_path, config_path, manifest_path) = (blob(&layer), blob(&config), blob(&manifest));
    tar_of(&[
        ("oci-layout", 0o644, &layout),
        ("index.json", 0o644, &index),
        (&layer_path, 0o644, &layer),
        (&config_path, 0o644, &config),
        (&manifest_path, 0o644, &manifest),
    ])
}

fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a JSON value serializes")
}

/// A tar of regular files owned by root, dated 0 (reproducible).
fn tar_of(files: &[(&str, u32, &[u8])]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, mode, data) in files {
        let mut header = tar::Header::new_ustar();
        header.set_path(path)?;
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        builder.append(&header, *data)?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    fn entries(archive: &[u8]) -> BTreeMap<String, (u32, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let mut a = tar::Archive::new(archive);
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mode = e.header().mode().unwrap();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            out.insert(path, (mode, data));
        }
        out
    }

    fn blob<'a>(files: &'a BTreeMap<String, (u32, Vec<u8>)>, d: &str) -> &'a [u8] {
        let path = format!("blobs/sha256/{}", d.strip_prefix("sha256:").unwrap());
        let data = &files
            .get(&path)
            .unwrap_or_else(|| panic!("no blob {path}"))
            .1;
        assert_eq!(digest(data), d, "blob {path} does not match its digest");
        data
    }

    #[test]
    fn the_archive_is_a_consistent_image_layout() {
        let program = b"\x7fELF not really";
        let files = entries(&archive("palisade.lab/pause:1", program).unwrap());
        let layout: Value = serde_json::from_slice(&files["oci-layout"].1).unwrap();
        assert_eq!(layout["imageLayoutVersion"], "1.0.0");
        let index: Value = serde_json::from_slice(&files["index.json"].1).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(
            entry["annotations"][CONTAINERD_NAME],
            "palisade.lab/pause:1"
        );
        assert_eq!(entry["annotations"][OCI_REF_NAME], "1");
        assert_eq!(entry["platform"]["architecture"], oci_arch());
        let manifest_bytes = blob(&files, entry["digest"].as_str().unwrap());
        assert_eq!(entry["size"], manifest_bytes.len());
        let manifest: Value = serde_json::from_slice(manifest_bytes).unwrap();
        let config_bytes = blob(&files, manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(manifest["config"]["size"], config_bytes.len());
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let layer = blob(&files, layer_digest);
        assert_eq!(manifest["layers"][0]["size"], layer.len());
        let config: Value = serde_json::from_slice(config_bytes).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/pause");
        let rootfs = entries(layer);
        assert_eq!(rootfs.len(), 1);
        assert_eq!(rootfs["pause"], (0o755, program.to_vec()));
        assert_eq!(files.len(), 5, "{:?}", files.keys());
    }

    #[test]
    fn the_archive_is_reproducible_and_follows_the_program() {
        let a = archive(PAUSE_IMAGE, b"one").unwrap();
        assert_eq!(a, archive(PAUSE_IMAGE, b"one").unwrap());
        assert_ne!(a, archive(PAUSE_IMAGE, b"two").unwrap());
    }

    #[test]
    fn the_pause_program_is_a_static_executable() {
        assert_eq!(&PAUSE_PROGRAM[..4], b"\x7fELF");
        // No program interpreter: it runs in an image that holds nothing else.
        let text = String::from_utf8_lossy(PAUSE_PROGRAM);
        assert!(!text.contains("/lib64/ld-linux"), "dynamically linked");
    }

    #[test]
    fn digests_are_sha256() {
        assert_eq!(
            digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
