//! What goes wrong reading the source, typed, and as the hub keeps it.
//!
//! Every message reads as it always has (operators, tests and the docs
//! match on them); [`SourceError::metric_label`] sorts them into the kinds
//! the `palisade_controller_source_errors` metric counts.

use std::fmt;
use std::path::PathBuf;

use super::validate::{joined, FieldError, KindError};

/// A problem reading the source; while there is one, the last good view
/// stays in force.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// One document (1-based, in the order of the text) could not be used.
    #[error("document {document}: {problem}")]
    Document {
        document: usize,
        /// Boxed: an object's problem is large, and errors travel far.
        #[source]
        problem: Box<DocumentError>,
    },
    /// A file's content could not be used.
    #[error("{}: {problem}", path.display())]
    File {
        path: PathBuf,
        #[source]
        problem: Box<SourceError>,
    },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// The task reading the manifest directory failed (it panicked).
    #[error("manifest reader failed: {0}")]
    Reader(#[source] tokio::task::JoinError),
    /// An object the API server served that cannot be read (a known field
    /// of another shape than ours). `kept`: a version read before stays in
    /// force.
    #[error("{error}{}", if *kept { "; its previous version stays in force" } else { "" })]
    Unreadable {
        #[source]
        error: super::cluster_network_policy::Unreadable,
        kept: bool,
    },
    /// A watch of the API server failed; it is retried with backoff.
    #[error("watching {kind}: {cause}")]
    Watch {
        /// The kind watched, as the watch names it ("Pods").
        kind: &'static str,
        #[source]
        cause: kube::runtime::watcher::Error,
    },
}

/// Why one document could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("invalid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("invalid YAML: {0}")]
    Yaml(#[source] serde_yaml::Error),
    #[error(transparent)]
    Object(#[from] ObjectError),
}

/// Why an object of a document (or an item of a list in it) could not be
/// used. `at` is where it sits in the document ("", "[2]: ", "items[0]: ").
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("{at}expected an object, found {found}")]
    NotAnObject { at: String, found: &'static str },
    #[error("{at}{field}: expected a string, found {found}")]
    NotAString {
        at: String,
        field: String,
        found: &'static str,
    },
    #[error("{at}apiVersion is missing")]
    NoApiVersion { at: String },
    #[error("{at}kind is missing")]
    NoKind { at: String },
    #[error("{at}items: expected a sequence, found {found}")]
    ItemsNotASequence { at: String, found: &'static str },
    /// An (apiVersion, kind) the API server would not serve.
    #[error("{at}{object}: {cause}")]
    Kind {
        at: String,
        /// The object as errors name it ("NetworkPolicy web/deny").
        object: String,
        #[source]
        cause: KindError,
    },
    /// An object the API server would refuse: every bad field.
    #[error("{at}{object}: {}", joined(.errors))]
    Invalid {
        at: String,
        object: String,
        errors: Vec<FieldError>,
    },
}

impl SourceError {
    /// Every label [`SourceError::metric_label`] gives, so that the metric
    /// shows each kind, at zero while there is none.
    pub const METRIC_LABELS: [&'static str; 7] = [
        "parse",
        "malformed",
        "unknown_kind",
        "invalid",
        "io",
        "reader",
        "watch",
    ];

    /// The kind of problem, for the `kind` label of
    /// `palisade_controller_source_errors`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SourceError::Document { problem, .. } => problem.metric_label(),
            SourceError::File { problem, .. } => problem.metric_label(),
            SourceError::Io { .. } => "io",
            SourceError::Reader(_) => "reader",
            SourceError::Watch { .. } => "watch",
            // Not what the API is known to admit: as a refused manifest.
            SourceError::Unreadable { .. } => "invalid",
        }
    }
}

impl DocumentError {
    fn metric_label(&self) -> &'static str {
        match self {
            DocumentError::Json(_) | DocumentError::Yaml(_) => "parse",
            DocumentError::Object(e) => e.metric_label(),
        }
    }
}

impl ObjectError {
    fn metric_label(&self) -> &'static str {
        match self {
            ObjectError::Kind { .. } => "unknown_kind",
            ObjectError::Invalid { .. } => "invalid",
            ObjectError::NotAnObject { .. }
            | ObjectError::NotAString { .. }
            | ObjectError::NoApiVersion { .. }
            | ObjectError::NoKind { .. }
            | ObjectError::ItemsNotASequence { .. } => "malformed",
        }
    }
}

/// A source's problem as the hub keeps and shows it: its message, and its
/// kind for the metric. Sources publish these (a value that can be compared
/// and cloned, which an I/O error cannot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceProblem {
    /// One of [`SourceError::METRIC_LABELS`].
    pub kind: &'static str,
    pub message: String,
}

impl SourceProblem {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        SourceProblem {
            kind,
            message: message.into(),
        }
    }
}

impl From<&SourceError> for SourceProblem {
    fn from(e: &SourceError) -> Self {
        SourceProblem::new(e.metric_label(), e.to_string())
    }
}

impl fmt::Display for SourceProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::parse_objects;

    fn label(text: &str) -> &'static str {
        parse_objects(text).unwrap_err().metric_label()
    }

    #[test]
    fn each_problem_has_its_kind() {
        assert_eq!(label("{"), "parse");
        assert_eq!(label("a: [\n"), "parse");
        assert_eq!(label("- 1\n"), "malformed");
        assert_eq!(label("kind: Pod\n"), "malformed");
        assert_eq!(label("apiVersion: v1\nkind: Podd\n"), "unknown_kind");
        assert_eq!(
            label("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: 5\n"),
            "invalid"
        );
        let io = SourceError::Io {
            path: "/nope".into(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let file = SourceError::File {
            path: "a.yaml".into(),
            problem: Box::new(parse_objects("{").unwrap_err()),
        };
        assert_eq!((io.metric_label(), file.metric_label()), ("io", "parse"));
        for e in [&io, &file] {
            let problem = SourceProblem::from(e);
            assert_eq!(problem.to_string(), e.to_string());
            assert!(SourceError::METRIC_LABELS.contains(&problem.kind));
        }
    }

    #[test]
    fn causes_are_kept() {
        use std::error::Error;
        let e = parse_objects("{").unwrap_err();
        let json = e.source().and_then(Error::source).expect("serde's error");
        assert!(json.is::<serde_json::Error>());
        let e = parse_objects("apiVersion: v1\nkind: Podd\n").unwrap_err();
        let kind = e
            .source()
            .and_then(Error::source)
            .expect("the kind's error");
        assert!(kind.is::<KindError>());
    }
}
