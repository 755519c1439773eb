//! The lab's cluster: a directory of manifests instead of an API server.
//!
//! The writer (the e2e lab) replaces object files first and writes the
//! revision file [`REVISION_FILE`] last. Every scan therefore reads the
//! revision *before* the objects: having read revision N, the objects read
//! afterwards are at least as new as N, so a published marker never claims
//! more than the state holds. Other consumers (plan versions, `policy wait`)
//! may rely on that. The writer should also replace each file atomically
//! (write a dotfile, which scans skip, then rename it into place); a scan
//! that meets a half-written file would otherwise see a truncated manifest.
//!
//! Scans poll every [`POLL_INTERVAL`]. Polling compares the full contents, so
//! it does not depend on mtime granularity or on inotify working through
//! ConfigMap symlink swaps, and a lab directory is small.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use super::{parse_objects, SourceError, SourceProblem};
use crate::cluster::ClusterState;

/// Written last by the writer; its trimmed content becomes the state's marker.
pub const REVISION_FILE: &str = ".revision";
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Reads the directory once: the marker, then every manifest file.
pub fn load_dir(dir: &Path) -> Result<ClusterState, SourceError> {
    let snapshot = Snapshot::read(dir)?;
    snapshot.build().map_err(|mut errors| errors.remove(0))
}

/// Watches `dir` until `tx` has no receivers left.
///
/// `tx` gets `Some(state)` after every scan whose marker or file contents
/// differ from the last scan and which parsed cleanly. `errors` holds one line
/// per problem of the latest scan (a file that does not parse, an unreadable
/// directory) and is emptied when a scan is clean again. While there are
/// errors `tx` keeps its previous value: a typo in one file must not withdraw
/// the policies everything is already enforcing.
pub async fn run(
    dir: PathBuf,
    tx: watch::Sender<Option<ClusterState>>,
    errors: watch::Sender<Vec<SourceProblem>>,
) {
    run_with_interval(dir, POLL_INTERVAL, tx, errors).await
}

/// [`run`] with another polling interval.
pub async fn run_with_interval(
    dir: PathBuf,
    interval: Duration,
    tx: watch::Sender<Option<ClusterState>>,
    errors: watch::Sender<Vec<SourceProblem>>,
) {
    let mut last: Option<Snapshot> = None;
    // Problems of the last snapshot that was read; shown again once a
    // transient read failure clears and the contents turn out unchanged.
    let mut build_errors: Vec<SourceProblem> = Vec::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if tx.is_closed() {
            return;
        }
        let read_dir = dir.clone();
        let read = tokio::task::spawn_blocking(move || Snapshot::read(&read_dir)).await;
        let snapshot = match read {
            Ok(Ok(snapshot)) => snapshot,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the manifest directory");
                set_errors(&errors, vec![SourceProblem::from(&e)]);
                continue;
            }
            Err(join) => {
                // Only a panic in the reader gets here; keep serving the old
                // state rather than taking the controller down.
                tracing::error!(error = %join, "manifest reader failed");
                set_errors(
                    &errors,
                    vec![SourceProblem::from(&SourceError::Reader(join))],
                );
                continue;
            }
        };
        if last.as_ref() != Some(&snapshot) {
            match snapshot.build() {
                Ok(state) => {
                    tracing::info!(
                        marker = %state.marker,
                        namespaces = state.namespaces.len(),
                        pods = state.pods.len(),
                        policies = state.policies.len(),
                        services = state.services.len(),
                        endpoint_slices = state.endpoint_slices.len(),
                        cluster_policies = state.cluster_policies.len(),
                        nodes = state.nodes.len(),
                        "manifests loaded"
                    );
                    build_errors.clear();
                    tx.send_replace(Some(state));
                }
                Err(problems) => {
                    build_errors = problems.iter().map(SourceProblem::from).collect();
                    for problem in &build_errors {
                        tracing::warn!(%problem, "manifests rejected; keeping the previous state");
                    }
                }
            }
            last = Some(snapshot);
        }
        set_errors(&errors, build_errors.clone());
    }
}

fn set_errors(errors: &watch::Sender<Vec<SourceProblem>>, new: Vec<SourceProblem>) {
    errors.send_if_modified(|current| {
        if *current == new {
            false
        } else {
            *current = new;
            true
        }
    });
}

/// Everything one scan read, compared whole to decide whether to publish.
#[derive(Debug, PartialEq)]
struct Snapshot {
    marker: String,
    files: Vec<(PathBuf, String)>,
}

impl Snapshot {
    fn read(dir: &Path) -> Result<Self, SourceError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| SourceError::Io { path, error }
        };
        // First, before any object file: see the module docs.
        let revision = dir.join(REVISION_FILE);
        let marker = match std::fs::read_to_string(&revision) {
            Ok(text) => text.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io(&revision)(e)),
        };

        let mut paths = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let wanted = !name.starts_with('.')
                && path
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| EXTENSIONS.contains(&e));
            // `metadata` follows symlinks, so a mounted ConfigMap (whose
            // entries link into `..data/`) reads like a plain directory.
            if wanted && std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                paths.push(path);
            }
        }
        paths.sort();

        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            match std::fs::read_to_string(&path) {
                Ok(text) => files.push((path, text)),
                // Removed between listing and reading: it is simply gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Ok(Snapshot { marker, files })
    }

    /// The state, or every file's problem (not just the first, so one fix
    /// round is enough).
    fn build(&self) -> Result<ClusterState, Vec<SourceError>> {
        let mut objects = Vec::new();
        let mut problems = Vec::new();
        for (path, text) in &self.files {
            match parse_objects(text) {
                Ok(parsed) => objects.extend(parsed),
                Err(problem) => problems.push(SourceError::File {
                    path: path.clone(),
                    problem: Box::new(problem),
                }),
            }
        }
        if problems.is_empty() {
            Ok(ClusterState::from_objects(objects, self.marker.clone()))
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";
    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {containers: [{name: c, image: i}]}\n";
    const BAD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: q, namespace: a}\nspec: 5\n";

    /// As the lab writes: a dotfile (ignored by scans) renamed into place, so
    /// no scan sees a half-written file.
    fn write(dir: &Path, name: &str, text: &str) {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, dir.join(name)).unwrap();
    }

    fn names(state: &ClusterState) -> Vec<String> {
        let ns = state
            .namespaces
            .iter()
            .map(|n| n.metadata.name.clone().unwrap());
        let pods = state.pods.iter().map(|p| p.metadata.name.clone().unwrap());
        ns.chain(pods).collect()
    }

    #[test]
    fn load_dir_reads_marker_and_manifest_files_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REVISION_FILE), "  rev-7\n").unwrap();
        std::fs::write(dir.path().join("10-ns.yaml"), NS).unwrap();
        std::fs::write(dir.path().join("20-pod.yml"), POD).unwrap();
        std::fs::write(
            dir.path().join("30-pod.json"),
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#,
        )
        .unwrap();
        // Neither a manifest extension nor visible: both ignored, even broken.
        std::fs::write(dir.path().join("notes.txt"), "{{{").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "{{{").unwrap();
        std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();

        let state = load_dir(dir.path()).unwrap();
        assert_eq!(state.marker, "rev-7");
        assert_eq!(names(&state), ["a", "j", "p"]);

        std::fs::remove_file(dir.path().join(REVISION_FILE)).unwrap();
        assert_eq!(load_dir(dir.path()).unwrap().marker, "");
    }

    #[test]
    fn load_dir_errors_name_the_file_and_document() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.yaml"), format!("{NS}---\n{BAD}")).unwrap();
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("bad.yaml: document 2: Pod a/q: spec: "),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = load_dir(&missing).unwrap_err().to_string();
        assert!(err.contains("nope"), "{err}");
    }

    async fn next_state(rx: &mut watch::Receiver<Option<ClusterState>>) -> ClusterState {
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("no state published in time")
            .unwrap();
        rx.borrow_and_update().clone().expect("published None")
    }

    async fn wait_errors(
        rx: &mut watch::Receiver<Vec<SourceProblem>>,
        done: impl Fn(&[SourceProblem]) -> bool,
    ) -> Vec<SourceProblem> {
        let got = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|e| done(e)))
            .await
            .expect("errors did not reach the expected value in time")
            .unwrap();
        got.clone()
    }

    #[tokio::test]
    async fn run_publishes_changes_keeps_state_on_bad_file_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        write(&path, "ns.yaml", NS);
        write(&path, REVISION_FILE, "1");

        let (tx, mut rx) = watch::channel(None);
        let (etx, mut erx) = watch::channel(Vec::new());
        let task = tokio::spawn(run_with_interval(
            path.clone(),
            Duration::from_millis(10),
            tx,
            etx,
        ));

        let state = next_state(&mut rx).await;
        assert_eq!(
            (state.marker.as_str(), names(&state)),
            ("1", vec!["a".into()])
        );

        // A bad file: an error naming it, and the good state stays.
        write(&path, "pods.yaml", BAD);
        write(&path, REVISION_FILE, "2");
        let errors = wait_errors(&mut erx, |e| !e.is_empty()).await;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].kind, "invalid");
        assert!(
            errors[0]
                .message
                .contains("pods.yaml: document 1: Pod a/q: spec: "),
            "{errors:?}"
        );
        // The scan that reported the error is the one that saw the bad file,
        // and it published no state; later scans see the same contents.
        assert!(!rx.has_changed().unwrap());
        assert_eq!(rx.borrow().as_ref().unwrap().marker, "1");

        // Fixed: the new state is published and the error withdrawn.
        write(&path, "pods.yaml", POD);
        write(&path, REVISION_FILE, "3");
        let state = loop {
            let state = next_state(&mut rx).await;
            if state.marker == "3" {
                break state;
            }
        };
        assert_eq!(names(&state), ["a", "p"]);
        wait_errors(&mut erx, |e| e.is_empty()).await;

        // Dropping the receiver ends the loop.
        drop(rx);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("run did not stop")
            .unwrap();
    }

    #[tokio::test]
    async fn run_does_not_republish_unchanged_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        write(&path, "ns.yaml", NS);
        let (tx, mut rx) = watch::channel(None);
        let (etx, _erx) = watch::channel(Vec::new());
        let task = tokio::spawn(run_with_interval(
            path.clone(),
            Duration::from_millis(5),
            tx,
            etx,
        ));
        next_state(&mut rx).await;
        // Rewriting identical bytes is not a change; the marker file is.
        write(&path, "ns.yaml", NS);
        write(&path, REVISION_FILE, "x");
        let state = next_state(&mut rx).await;
        assert_eq!(state.marker, "x");
        task.abort();
    }
}
