//! The CNI error result (spec section "Error") and the codes palisade-cni uses.

use serde::Serialize;

/// The version an error is reported in when the network config gave none we
/// support: the runtime decodes errors without regard to version, so any
/// well-formed one does.
pub const FALLBACK_ERROR_VERSION: &str = "1.0.0";

/// Error codes. 1-99 are reserved by the CNI spec; 100+ are ours.
pub mod code {
    /// The config's cniVersion is one this plugin does not speak.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A required CNI_* variable (or K8S_* key in CNI_ARGS) is missing or malformed.
    pub const INVALID_ENV: u32 = 4;
    /// stdin is not valid JSON or a field has the wrong type.
    pub const DECODE: u32 = 6;
    /// The config decodes but cannot be acted on (e.g. no prevResult on ADD).
    pub const INVALID_CONFIG: u32 = 7;
    /// The enforcer could not be reached in time; the runtime may retry.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The enforcer answered and refused the request.
    pub const ENFORCER_REJECTED: u32 = 100;
    /// CHECK found the enforcer's view of the pod differs from prevResult.
    pub const CHECK_MISMATCH: u32 = 101;
    /// A fault inside the plugin itself.
    pub const INTERNAL: u32 = 999;
}

/// A CNI error. `msg` names the problem; `details` carries what a human needs
/// to fix it (the underlying error, the socket path, the offending value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
    /// Filled in by `run` once the config's version is known.
    pub cni_version: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorJson<'a> {
    cni_version: &'a str,
    code: u32,
    msg: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    details: &'a str,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
            cni_version: None,
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }

    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE, msg)
    }

    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }

    /// The JSON the runtime reads from stdout when the plugin exits non-zero.
    pub fn to_json(&self) -> String {
        let body = ErrorJson {
            cni_version: self
                .cni_version
                .as_deref()
                .unwrap_or(FALLBACK_ERROR_VERSION),
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        };
        // Serializing a struct of strings and an integer cannot fail; the
        // fallback keeps the "never panic" promise without an unwrap.
        serde_json::to_string(&body).unwrap_or_else(|_| {
            format!(
                r#"{{"cniVersion":"{FALLBACK_ERROR_VERSION}","code":{},"msg":"palisade-cni failed"}}"#,
                self.code
            )
        })
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

/// An error and all its sources, because tonic's transport error alone says
/// only "transport error" and the cause (ENOENT, ECONNREFUSED) is what an
/// operator needs.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Some layers repeat their source's text in their own; skip echoes.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
