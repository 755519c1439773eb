//! The reconciler's inputs on disk: the last plan and the pods the CNI
//! reported. With them a restarted enforcer recomputes the same desired
//! datapath and finds nothing to change (DESIGN invariant 6). Each file is
//! replaced atomically (write, fsync, rename), so a crash leaves the old or
//! the new version, never half of one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use palisade_proto::v1::{PlanSnapshot, PodPolicy};
use prost::Message;

use crate::desired::{PodKey, PodRuntime};

const PLAN_FILE: &str = "plan.pb";
const PODS_FILE: &str = "pods.json";

pub struct Checkpoint {
    dir: PathBuf,
}

/// What a previous process saved.
#[derive(Debug, Default, PartialEq)]
pub struct Saved {
    pub plan: Option<PlanSnapshot>,
    pub pods: BTreeMap<PodKey, PodRuntime>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedPod {
    namespace: String,
    name: String,
    #[serde(flatten)]
    runtime: PodRuntime,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("creating state directory {}: {e}", dir.display()))?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
        })
    }

    pub fn save_plan(
        &self,
        version: u64,
        plan: &BTreeMap<PodKey, PodPolicy>,
    ) -> Result<(), String> {
        let snapshot = PlanSnapshot {
            version,
            pods: plan.values().cloned().collect(),
            source_synced: true,
        };
        self.write(PLAN_FILE, &snapshot.encode_to_vec())
    }

    pub fn save_pods(&self, pods: &BTreeMap<PodKey, PodRuntime>) -> Result<(), String> {
        let list: Vec<SavedPod> = pods
            .iter()
            .map(|((namespace, name), runtime)| SavedPod {
                namespace: namespace.clone(),
                name: name.clone(),
                runtime: runtime.clone(),
            })
            .collect();
        let text = serde_json::to_vec_pretty(&list).map_err(|e| format!("encoding pods: {e}"))?;
        self.write(PODS_FILE, &text)
    }

    /// Reads what was saved. Missing files mean a first start; unreadable
    /// ones are an error naming the file, because starting without them
    /// would tear down enforcement that is still correct.
    pub fn load(&self) -> Result<Saved, String> {
        let mut saved = Saved::default();
        if let Some(bytes) = self.read(PLAN_FILE)? {
            saved.plan = Some(PlanSnapshot::decode(bytes.as_slice()).map_err(|e| {
                format!(
                    "{}: not a plan snapshot ({e}); move it away to start without it",
                    self.path(PLAN_FILE).display()
                )
            })?);
        }
        if let Some(bytes) = self.read(PODS_FILE)? {
            let list: Vec<SavedPod> = serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{}: {e}; move it away to start without it",
                    self.path(PODS_FILE).display()
                )
            })?;
            for p in list {
                saved.pods.insert((p.namespace, p.name), p.runtime);
            }
        }
        Ok(saved)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        match std::fs::read(self.path(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {}: {e}", self.path(name).display())),
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        let path = self.path(name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        result.map_err(|e| format!("writing {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
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
            },
        )]);
        cp.save_plan(9, &plan).unwrap();
        cp.save_pods(&pods).unwrap();
        let saved = Checkpoint::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(saved.plan.unwrap().version, 9);
        assert_eq!(saved.pods, pods);
    }

    #[test]
    fn corrupt_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PODS_FILE), b"{nope").unwrap();
        let err = Checkpoint::open(dir.path()).unwrap().load().unwrap_err();
        assert!(err.contains("pods.json"), "{err}");
        std::fs::remove_file(dir.path().join(PODS_FILE)).unwrap();
        std::fs::write(dir.path().join(PLAN_FILE), [0xff, 0xff, 0xff]).unwrap();
        let err = Checkpoint::open(dir.path()).unwrap().load().unwrap_err();
        assert!(err.contains("plan.pb"), "{err}");
    }
}
