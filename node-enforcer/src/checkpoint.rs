//! The reconciler's inputs on disk: the last plan and the pods the CNI
//! reported. With them a restarted enforcer recomputes the same desired
//! datapath and finds nothing to change (DESIGN invariant 6).
//!
//! Each file is framed: a magic, the payload's length and its SHA-1, so a
//! truncated, empty or damaged file is told apart from a valid one (a
//! protobuf truncated at a field boundary still decodes). Files are replaced
//! atomically: a temp file unique to this process, fsync, rename, fsync of
//! the directory. A damaged file is not fatal and is never read as "nothing
//! enforced": it is reported, and the enforcer rebuilds what it lost from
//! the kernel (see `reconciler::recover`).
//!
//! The plan names every peer address of the node's policies: the directory
//! is 0700 and the files 0600, the temp file created so ([`crate::private`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use palisade_proto::v1::{PlanSnapshot, PodPolicy};
use prost::Message;
use sha1::{Digest, Sha1};

use crate::desired::{PodKey, PodRuntime};

const PLAN_FILE: &str = "plan.pb";
const PODS_FILE: &str = "pods.json";
/// The highest leadership term applied, apart from the plan: a plan that
/// could not be saved takes plan.pb with it, and the term must stay.
const TERM_FILE: &str = "term";
const MAGIC: &[u8; 8] = b"PALCKP01";
const HEADER: usize = 8 + 8 + 20;

#[derive(Clone)]
pub struct Checkpoint {
    dir: PathBuf,
}

/// What a previous process saved.
#[derive(Debug, Default, PartialEq)]
pub struct Saved {
    pub plan: Option<PlanSnapshot>,
    pub pods: BTreeMap<PodKey, PodRuntime>,
    /// The term file's term (0: none); see [`Saved::highest_term`].
    pub term: u64,
    /// Files that were present but unusable, each named with its problem.
    pub damage: Vec<String>,
}

impl Saved {
    /// The highest leadership term a previous process applied, from the
    /// term file or the plan (one written before the term file existed).
    pub fn highest_term(&self) -> u64 {
        self.term.max(self.plan.as_ref().map_or(0, |p| p.term))
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedPod {
    namespace: String,
    name: String,
    #[serde(flatten)]
    runtime: PodRuntime,
}

/// What is wrong with a framed file's bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("empty")]
    Empty,
    #[error("{0} bytes, shorter than its header")]
    ShorterThanHeader(usize),
    /// Not written by this code (or before framing existed).
    #[error("not a Palisade checkpoint (bad magic)")]
    BadMagic,
    /// Cut short or grown: the length in the header is not the payload's.
    #[error("truncated or padded: {payload} payload bytes, header says {header}")]
    Length { payload: usize, header: u64 },
    /// The payload is not what was written (a flipped bit).
    #[error("checksum mismatch")]
    ChecksumMismatch,
}

/// Why a checkpoint file that is there cannot be used. `load` names the
/// file and treats it as missing; never an empty plan.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A whole frame whose payload does not decode as a plan.
    #[error("not a plan snapshot: {0}")]
    Plan(#[source] prost::DecodeError),
    /// A whole frame whose payload does not decode as the pods.
    #[error("{0}")]
    Pods(#[source] serde_json::Error),
    /// A whole frame whose payload is not a term (8 bytes).
    #[error("not a term: {0} payload bytes, 8 expected")]
    Term(usize),
}

/// Why the checkpoint could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The directory or a file of it: `action` ("reading", "writing",
    /// "restricting", "creating state directory") on `path`.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding pods: {0}")]
    EncodePods(#[source] serde_json::Error),
}

impl CheckpointError {
    fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| CheckpointError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Frames a payload so that any truncation or corruption is detected.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha1::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// The payload of a framed file, or what is wrong with it.
pub fn unframe(bytes: &[u8]) -> Result<&[u8], FrameError> {
    if bytes.is_empty() {
        return Err(FrameError::Empty);
    }
    if bytes.len() < HEADER {
        return Err(FrameError::ShorterThanHeader(bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len {
        return Err(FrameError::Length {
            payload: payload.len(),
            header: len,
        });
    }
    if Sha1::digest(payload).as_slice() != &bytes[16..HEADER] {
        return Err(FrameError::ChecksumMismatch);
    }
    Ok(payload)
}

/// The plan as a [`PlanSnapshot`]'s encoding, written field by field from
/// the held entries: building the message would copy every rule first (a
/// policy of 100,000 rules, on the reconciler's thread).
fn encode_plan(version: u64, term: u64, plan: &BTreeMap<PodKey, PodPolicy>) -> Vec<u8> {
    use prost::encoding;
    let mut buf = Vec::new();
    if version != 0 {
        encoding::uint64::encode(1, &version, &mut buf);
    }
    for pod in plan.values() {
        encoding::message::encode(2, pod, &mut buf);
    }
    // Only synced snapshots are ever applied, so only they are saved. A
    // trace ends with the realization that was checkpointed: no context.
    encoding::bool::encode(3, &true, &mut buf);
    if term != 0 {
        encoding::uint64::encode(4, &term, &mut buf);
    }
    buf
}

impl Checkpoint {
    /// Creates the directory (0700), or tightens it and the files in it to
    /// 0700 and 0600 if an older version left them wider, saying so.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        let had = crate::private::dir(dir)
            .map_err(CheckpointError::io("creating state directory", dir))?;
        crate::private::log_tightened("the state directory", dir, had);
        for name in [PLAN_FILE, PODS_FILE, TERM_FILE] {
            let path = dir.join(name);
            let had = crate::private::tighten_file(&path)
                .map_err(CheckpointError::io("restricting", &path))?;
            crate::private::log_tightened("a checkpoint file", &path, had);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `term`: the highest leadership term applied, so a restart still
    /// refuses plans from a deposed controller.
    pub fn save_plan(
        &self,
        version: u64,
        term: u64,
        plan: &BTreeMap<PodKey, PodPolicy>,
    ) -> Result<(), CheckpointError> {
        self.write(PLAN_FILE, &encode_plan(version, term, plan))
    }

    /// Saves the highest leadership term applied on its own, so that it
    /// outlives a plan.pb removed by [`Checkpoint::forget_plan`].
    pub fn save_term(&self, term: u64) -> Result<(), CheckpointError> {
        self.write(TERM_FILE, &term.to_le_bytes())
    }

    /// Removes plan.pb, durably: after a plan that could not be saved, a
    /// restart must find no plan (and hold what the datapath enforces)
    /// rather than an older one. An unlink needs no free space.
    pub fn forget_plan(&self) -> Result<(), CheckpointError> {
        let path = self.path(PLAN_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(CheckpointError::io("removing", &path)(e)),
        }
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(CheckpointError::io("removing", &path))
    }

    pub fn save_pods(&self, pods: &BTreeMap<PodKey, PodRuntime>) -> Result<(), CheckpointError> {
        let list: Vec<SavedPod> = pods
            .iter()
            .map(|((namespace, name), runtime)| SavedPod {
                namespace: namespace.clone(),
                name: name.clone(),
                runtime: runtime.clone(),
            })
            .collect();
        let text = serde_json::to_vec_pretty(&list).map_err(CheckpointError::EncodePods)?;
        self.write(PODS_FILE, &text)
    }

    /// Reads what was saved. Missing files mean nothing was saved; damaged
    /// ones are listed in `damage` and treated as missing. Only an I/O error
    /// on the directory itself is an error.
    pub fn load(&self) -> Result<Saved, CheckpointError> {
        let mut saved = Saved::default();
        if let Some(bytes) = self.read(PLAN_FILE)? {
            match decode_plan(&bytes) {
                Ok(plan) => saved.plan = Some(plan),
                Err(e) => saved.damage.push(format!(
                    "checkpoint {} is damaged ({e}); starting without a plan and keeping what the datapath enforces",
                    self.path(PLAN_FILE).display()
                )),
            }
        }
        if let Some(bytes) = self.read(TERM_FILE)? {
            match decode_term(&bytes) {
                Ok(term) => saved.term = term,
                Err(e) => saved.damage.push(format!(
                    "checkpoint {} is damaged ({e}); the plan's term is the highest known",
                    self.path(TERM_FILE).display()
                )),
            }
        }
        if let Some(bytes) = self.read(PODS_FILE)? {
            match decode_pods(&bytes) {
                Ok(list) => {
                    for p in list {
                        saved.pods.insert((p.namespace, p.name), p.runtime);
                    }
                }
                Err(e) => saved.damage.push(format!(
                    "checkpoint {} is damaged ({e}); pods are rebuilt from the kernel's interfaces",
                    self.path(PODS_FILE).display()
                )),
            }
        }
        Ok(saved)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
        match std::fs::read(self.path(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CheckpointError::io("reading", &self.path(name))(e)),
        }
    }

    fn write(&self, name: &str, payload: &[u8]) -> Result<(), CheckpointError> {
        let path = self.path(name);
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut f = crate::private::create_new(&tmp)?;
            f.write_all(&frame(payload))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            // The rename is durable only once the directory is.
            std::fs::File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(CheckpointError::io("writing", &path))
    }
}

fn decode_plan(bytes: &[u8]) -> Result<PlanSnapshot, Damage> {
    PlanSnapshot::decode(unframe(bytes)?).map_err(Damage::Plan)
}

fn decode_term(bytes: &[u8]) -> Result<u64, Damage> {
    let payload = unframe(bytes)?;
    let raw: [u8; 8] = payload
        .try_into()
        .map_err(|_| Damage::Term(payload.len()))?;
    Ok(u64::from_le_bytes(raw))
}

fn decode_pods(bytes: &[u8]) -> Result<Vec<SavedPod>, Damage> {
    serde_json::from_slice(unframe(bytes)?).map_err(Damage::Pods)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_plan_is_encoded_as_the_snapshot_message_would_be() {
        let pod = |name: &str| PodPolicy {
            pod: Some(palisade_proto::v1::PodRef {
                namespace: "x".into(),
                name: name.into(),
            }),
            ingress: Some(Default::default()),
            ..Default::default()
        };
        let plan: BTreeMap<PodKey, PodPolicy> = ["a", "b"]
            .into_iter()
            .map(|n| (("x".to_string(), n.to_string()), pod(n)))
            .collect();
        for (version, term) in [(0, 0), (7, 0), (7, 3)] {
            let message = PlanSnapshot {
                version,
                term,
                pods: plan.values().cloned().collect(),
                source_synced: true,
                trace_context: Default::default(),
            };
            assert_eq!(
                super::encode_plan(version, term, &plan),
                message.encode_to_vec()
            );
        }
    }

    use super::*;
    use crate::compile::Prefix;
    use palisade_proto::v1::PodRef;

    #[test]
    fn saves_and_loads_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(cp.load().unwrap(), Saved::default(), "first start");
        let key = ("x".to_string(), "a".to_string());
        let plan = BTreeMap::from([(
            key.clone(),
            PodPolicy {
                pod: Some(PodRef {
                    namespace: "x".into(),
                    name: "a".into(),
                }),
                policies: vec!["x/p".into()],
                ..Default::default()
            },
        )]);
        let pods = BTreeMap::from([(
            key,
            PodRuntime {
                container_id: "c1".into(),
                netns: "/run/netns/a".into(),
                host_interfaces: vec!["veth1".into()],
                ips: vec![Prefix::from_ip("10.0.0.1".parse().unwrap(), 32)],
                ifindexes: BTreeMap::from([("veth1".to_string(), 7)]),
                mode: None,
            },
        )]);
        cp.save_plan(9, 0, &plan).unwrap();
        cp.save_pods(&pods).unwrap();
        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(saved.plan.unwrap().version, 9);
        assert_eq!(saved.pods, pods);
    }

    #[test]
    fn damaged_files_are_named_and_never_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let plan = BTreeMap::from([(
            ("x".to_string(), "a".to_string()),
            PodPolicy {
                pod: Some(PodRef {
                    namespace: "x".into(),
                    name: "a".into(),
                }),
                policies: vec!["x/p".into(), "x/q".into()],
                ..Default::default()
            },
        )]);
        cp.save_plan(3, 0, &plan).unwrap();
        let whole = std::fs::read(dir.path().join(PLAN_FILE)).unwrap();
        // Every truncation (including at a protobuf field boundary, which
        // decodes as a smaller valid plan), an empty file, and a flipped bit.
        let mut damaged: Vec<Vec<u8>> = (0..whole.len()).map(|n| whole[..n].to_vec()).collect();
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        damaged.push(flipped);
        for bytes in damaged {
            std::fs::write(dir.path().join(PLAN_FILE), &bytes).unwrap();
            std::fs::write(dir.path().join(PODS_FILE), &bytes[..bytes.len() / 2]).unwrap();
            let saved = cp.load().unwrap();
            assert_eq!(saved.plan, None, "{} bytes read as a plan", bytes.len());
            assert!(saved.pods.is_empty());
            assert!(
                saved.damage.iter().any(|d| d.contains("plan.pb")),
                "{:?}",
                saved.damage
            );
            assert!(
                saved.damage.iter().any(|d| d.contains("pods.json")),
                "{:?}",
                saved.damage
            );
        }
        // A file from before framing is damage too, not a plan.
        std::fs::write(
            dir.path().join(PLAN_FILE),
            PlanSnapshot::default().encode_to_vec(),
        )
        .unwrap();
        assert_eq!(cp.load().unwrap().plan, None);
        // No temp file is left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn each_damage_is_told_by_its_kind_with_the_text_it_had() {
        let whole = frame(b"payload");
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let cases: [(&[u8], FrameError, &str); 4] = [
            (b"", FrameError::Empty, "empty"),
            (
                &whole[..10],
                FrameError::ShorterThanHeader(10),
                "10 bytes, shorter than its header",
            ),
            (
                &whole[..whole.len() - 1],
                FrameError::Length {
                    payload: 6,
                    header: 7,
                },
                "truncated or padded: 6 payload bytes, header says 7",
            ),
            (&flipped, FrameError::ChecksumMismatch, "checksum mismatch"),
        ];
        for (bytes, kind, text) in cases {
            let e = unframe(bytes).unwrap_err();
            assert_eq!((&e, e.to_string().as_str()), (&kind, text));
        }
        let mut foreign = whole.clone();
        foreign[0] = b'X';
        assert_eq!(unframe(&foreign), Err(FrameError::BadMagic));
        assert_eq!(
            FrameError::BadMagic.to_string(),
            "not a Palisade checkpoint (bad magic)"
        );

        // A whole frame that is not a plan keeps the decoder's error.
        let e = decode_plan(&frame(b"\xff")).unwrap_err();
        assert!(matches!(e, Damage::Plan(_)), "{e:?}");
        assert!(e.to_string().starts_with("not a plan snapshot: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn an_io_failure_names_the_action_and_path_and_keeps_the_cause() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("f");
        std::fs::write(&file, "").unwrap();
        let dir = file.join("state");
        let e = Checkpoint::open(&dir).err().expect("a file is in the way");
        let CheckpointError::Io {
            action,
            path,
            source,
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!((*action, path), ("creating state directory", &dir));
        assert_eq!(
            e.to_string(),
            format!("creating state directory {}: {source}", dir.display())
        );
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn the_term_outlives_a_forgotten_plan() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        cp.save_plan(5, 3, &BTreeMap::new()).unwrap();
        assert_eq!(cp.load().unwrap().highest_term(), 3, "from the plan");
        cp.save_term(4).unwrap();
        cp.forget_plan().unwrap();
        cp.forget_plan().unwrap(); // already gone: fine
        let saved = cp.load().unwrap();
        assert_eq!((saved.plan, saved.term), (None, 4));
        assert!(saved.damage.is_empty(), "{:?}", saved.damage);

        std::fs::write(dir.path().join(TERM_FILE), frame(b"1234")).unwrap();
        let saved = cp.load().unwrap();
        assert_eq!(saved.term, 0);
        assert!(
            saved
                .damage
                .iter()
                .any(|d| d.contains("term") && d.contains("not a term: 4 payload bytes")),
            "{:?}",
            saved.damage
        );
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Issue 18: plan.pb and pods.json were 0644 in a 0755 directory, so
    /// any local user could read every peer address of the node's policies.
    #[test]
    fn state_is_root_only_after_a_save_a_replacement_and_in_an_old_wide_dir() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let cp = Checkpoint::open(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "a new state directory");
        let pods = BTreeMap::new();
        cp.save_plan(1, 1, &BTreeMap::new()).unwrap();
        cp.save_pods(&pods).unwrap();
        for f in [PLAN_FILE, PODS_FILE] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f} after a save");
        }
        // A replacement is a new file renamed over the old: 0600 too.
        cp.save_plan(2, 1, &BTreeMap::new()).unwrap();
        cp.save_pods(&pods).unwrap();
        for f in [PLAN_FILE, PODS_FILE] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f} after a replacement");
        }
        assert_eq!(cp.load().unwrap().plan.unwrap().version, 2);

        // What an older version left: a 0755 directory of 0644 files.
        let old = root.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in [PLAN_FILE, PODS_FILE] {
            std::fs::write(old.join(f), frame(b"")).unwrap();
            std::fs::set_permissions(old.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let cp = Checkpoint::open(&old).unwrap();
        assert_eq!(mode(&old), 0o700, "an old directory is tightened at start");
        for f in [PLAN_FILE, PODS_FILE] {
            assert_eq!(mode(&old.join(f)), 0o600, "old {f} tightened at start");
        }
        // A stale temp file of this pid, left world-writable: the save must
        // not reuse it (opening it would keep its mode).
        let stale = old.join(format!(".{PLAN_FILE}.{}.tmp", std::process::id()));
        std::fs::write(&stale, "stale").unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o666)).unwrap();
        cp.save_plan(3, 1, &BTreeMap::new()).unwrap();
        assert_eq!(mode(&old.join(PLAN_FILE)), 0o600);
        assert!(!stale.exists());
    }
}
