//! Flow logs: the datapath's flow events (`pal_flow_events`, one per new
//! flow or dropped packet, never for established or reply packets) written
//! as JSON lines.
//!
//! - `mode`: the `--flow-log` setting and what the datapath is told
//!   (`config`).
//! - `reader`: the ring buffer, read as the kernel signals it.
//! - `knowledge`: what the enforcer knows about pods and plans, refreshed
//!   from its own dump and checkpoint.
//! - `annotate`: pure, event + knowledge → record; `deciding` finds the plan
//!   rule that decided an allowed flow; `record` is the JSON line, whose
//!   time `rfc3339` maps from the datapath's monotonic clock.
//! - `writer`: a bounded queue to the output, so a slow output drops
//!   (and counts) lines instead of stalling the reader.
//! - `counters` and `stats`: what metrics export.
//!
//! The rate limit lives in the datapath (`flow_admit` in ebpf/c/lib/flow_events.h):
//! events over it never reach the ring buffer, so a flood costs user space
//! nothing.

pub mod annotate;
pub mod config;
pub mod counters;
pub mod deciding;
pub mod knowledge;
pub mod mode;
pub mod reader;
pub mod record;
pub mod rfc3339;
pub mod stats;
pub mod writer;

use std::path::{Path, PathBuf};

pub use mode::FlowLogMode;

/// The enforcer's flow log flags.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: FlowLogMode,
    /// Events per second for the whole node; the burst is the same.
    pub rate_per_sec: u32,
    /// `-` for stdout, else a file appended to.
    pub path: String,
    pub node: String,
    pub pin_root: PathBuf,
    pub state_dir: PathBuf,
}

/// The most events per second `--flow-log-rate` takes: beyond it the
/// writer could not keep up anyway, and lines would only be dropped later.
pub const MAX_RATE: u32 = 1_000_000;

/// Why the flow log could not be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum FlowLogError {
    #[error("--flow-log-rate {0} is above {MAX_RATE} events per second")]
    Rate(u32),
    /// A pinned flow map could not be opened, read or written: `what`
    /// ("flow log config ", "flow events ", or nothing) and its pin.
    #[error("{what}{}: {source}", path.display())]
    Map {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: aya::maps::MapError,
    },
    /// The output (`--flow-log-path`) could not be opened or restricted.
    #[error("--flow-log-path {path}: {source}")]
    Output {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FlowLogError {
    /// Names a failure of the map pinned at `path`.
    fn map<'a>(what: &'static str, path: &'a Path) -> impl Fn(aya::maps::MapError) -> Self + 'a {
        move |source| FlowLogError::Map {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

pub fn check_rate(rate: u32) -> Result<(), FlowLogError> {
    if rate > MAX_RATE {
        return Err(FlowLogError::Rate(rate));
    }
    Ok(())
}

/// Tells the datapath the mode and rate (every start, so a restart with
/// other flags takes effect), opens the output and starts the reader and
/// writer tasks. The reader runs in every mode: staged policies' events
/// are logged even with `--flow-log off`.
pub async fn start(options: Options, handle: crate::handle::Handle) -> Result<(), FlowLogError> {
    check_rate(options.rate_per_sec)?;
    config::write(&options.pin_root, options.mode, options.rate_per_sec)?;
    let output = writer::open(&options.path).await?;
    let lines = writer::spawn(output, writer::QUEUE);
    let ring = reader::open(&options.pin_root)?;
    let source = knowledge::Source::new(handle, options.node.clone(), &options.state_dir);
    tracing::info!(
        mode = %options.mode,
        rate_per_sec = options.rate_per_sec,
        path = %options.path,
        "flow log"
    );
    tokio::spawn(reader::run(ring, source, lines));
    Ok(())
}

/// The pin path of a flow map under the enforcer's pin root.
pub fn pin(pin_root: &Path, name: &str) -> PathBuf {
    pin_root.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_failure_names_its_flag_or_pin_and_keeps_its_cause() {
        let rate = check_rate(MAX_RATE + 1).unwrap_err();
        assert!(matches!(rate, FlowLogError::Rate(_)));
        assert_eq!(
            rate.to_string(),
            format!(
                "--flow-log-rate {} is above {MAX_RATE} events per second",
                MAX_RATE + 1
            )
        );
        check_rate(MAX_RATE).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let e = config::write(dir.path(), FlowLogMode::Deny, 10).unwrap_err();
        let FlowLogError::Map { path, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(path, &pin(dir.path(), palisade_ebpf::MAP_FLOW_CONFIG));
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("flow log config {}: ", path.display())),
            "{text}"
        );
        assert!(std::error::Error::source(&e).is_some());

        let out = dir.path().display().to_string();
        let e = writer::open(&out).await.err().expect("a directory");
        assert!(matches!(e, FlowLogError::Output { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("--flow-log-path {out}: ")),
            "{e}"
        );
    }
}
