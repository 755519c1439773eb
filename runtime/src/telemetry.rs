//! The process's tracer: set up once at start when a collector is
//! configured, absent otherwise. The spans each process makes
//! (`policy_controller::telemetry`, `node_enforcer::telemetry`) are built
//! on [`tracer`], so with tracing off there is no tracer, no span and no
//! allocation.

use std::sync::OnceLock;

use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SdkTracer;

use crate::otlp_export::{endpoint, Export, ExportConfig};

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// This process's tracer; None while tracing is off.
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// Exports this process's spans; keep it until the process ends and then
/// [`Telemetry::shutdown`] it, which sends what is still queued.
pub struct Telemetry {
    export: Export,
}

/// Starts exporting to `endpoint` (`http://HOST:PORT` or `https://...`) as
/// `config` says; the tracer is named after `config.service`. Must run
/// inside the tokio runtime, which carries the exporter's connection.
/// Nothing is contacted here: an unreachable collector only fails exports
/// later.
pub fn init(endpoint: &str, config: ExportConfig) -> Result<Telemetry, String> {
    let service = config.service;
    let export = Export::start(endpoint, config)?;
    if TRACER.set(export.tracer(service)).is_err() {
        return Err("tracing is already set up in this process".into());
    }
    Ok(Telemetry { export })
}

/// Tracing as the process was asked: `flag` (`--otlp-endpoint`), else the
/// standard `OTEL_EXPORTER_OTLP_ENDPOINT`; None when neither names a
/// collector. Traces are for operators, not for serving or enforcing
/// plans: a bad endpoint is reported and leaves tracing off rather than
/// the process down.
pub fn start(flag: Option<String>, config: ExportConfig) -> Option<Telemetry> {
    let otel_env = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
    let endpoint = endpoint(flag, otel_env)?;
    match init(&endpoint, config) {
        Ok(t) => {
            tracing::info!(otlp_endpoint = %endpoint, "exporting traces");
            Some(t)
        }
        Err(e) => {
            tracing::error!("traces are off: {e}");
            None
        }
    }
}

/// What a plan message (snapshot or delta) holds, for the attributes of
/// the controller's span that sends it and of the enforcer's that realizes
/// it: one list, so both ends name them alike.
pub struct PlanMessageInfo<'a> {
    pub node: &'a str,
    /// "snapshot" or "delta".
    pub kind: &'static str,
    pub version: u64,
    /// The version a delta applies to; 0 for a snapshot.
    pub base_version: u64,
    pub term: u64,
    /// Pods listed (snapshot) or upserted and removed (delta).
    pub pods: usize,
}

impl PlanMessageInfo<'_> {
    pub fn attributes(&self) -> [KeyValue; 6] {
        [
            KeyValue::new("palisade.node", self.node.to_string()),
            KeyValue::new("palisade.plan.kind", self.kind),
            KeyValue::new("palisade.plan.version", self.version as i64),
            KeyValue::new("palisade.plan.base_version", self.base_version as i64),
            KeyValue::new("palisade.plan.term", self.term as i64),
            KeyValue::new("palisade.plan.pods", self.pods as i64),
        ]
    }
}

impl Telemetry {
    /// Sends what is queued, waiting at most the configured shutdown
    /// timeout: a dead collector does not hold up the exit.
    pub async fn shutdown(self) {
        if let Err(e) = self.export.shutdown().await {
            tracing::warn!("flushing traces at shutdown: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp_export::test_config as config;

    /// One tracer per process: a bad endpoint sets none, the first good
    /// one sets it, and a second is refused.
    #[tokio::test]
    async fn a_bad_endpoint_leaves_tracing_off_and_a_second_setup_is_refused() {
        assert!(start(Some("collector:4317".into()), config()).is_none());
        assert!(tracer().is_none());
        let first = init("http://127.0.0.1:9", config()).expect("builds");
        assert!(tracer().is_some());
        let Err(e) = init("http://127.0.0.1:9", config()) else {
            panic!("a second tracer was set up");
        };
        assert_eq!(e, "tracing is already set up in this process");
        first.shutdown().await;
    }
}
