//! OTLP/gRPC span export, set up the same way by both binaries: a batch
//! processor with a bounded queue, so a slow or dead collector costs spans
//! (dropped, and logged by the SDK), never time on the path that made them.

use std::time::Duration;

use opentelemetry::trace::TracerProvider;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

/// The collector to export to: `--otlp-endpoint` (or its variable), else
/// the standard `OTEL_EXPORTER_OTLP_ENDPOINT`; None (tracing off) when
/// neither is set or both are empty.
pub fn endpoint(flag: Option<String>, otel_env: Option<String>) -> Option<String> {
    flag.filter(|s| !s.trim().is_empty())
        .or(otel_env.filter(|s| !s.trim().is_empty()))
        .map(|s| s.trim().to_string())
}

/// How one process exports.
pub struct ExportConfig {
    /// `service.name` of the resource.
    pub service: &'static str,
    /// Further resource attributes (the node, for an enforcer).
    pub attributes: Vec<KeyValue>,
    /// Ended spans waiting for export; more are dropped.
    pub max_queue: usize,
    /// Bound on one export call.
    pub export_timeout: Duration,
    /// Bound on the flush at shutdown.
    pub shutdown_timeout: Duration,
}

/// A running exporter; keep it until the process ends, then
/// [`Export::shutdown`] it.
pub struct Export {
    provider: SdkTracerProvider,
    shutdown_timeout: Duration,
}

impl Export {
    /// Starts exporting to `endpoint` (`http://HOST:PORT` or
    /// `https://...`). Must run inside the tokio runtime, which carries the
    /// exporter's connection. Nothing is contacted here: an unreachable
    /// collector only fails exports later.
    pub fn start(endpoint: &str, config: ExportConfig) -> Result<Export, String> {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(format!(
                "OTLP endpoint {endpoint:?}: expected http://HOST:PORT or https://HOST:PORT"
            ));
        }
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| format!("OTLP endpoint {endpoint:?}: {e}"))?;
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(config.max_queue)
                    .build(),
            )
            .build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(config.service)
            .with_attributes(config.attributes)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_resource(resource)
            .build();
        Ok(Export {
            provider,
            shutdown_timeout: config.shutdown_timeout,
        })
    }

    pub fn tracer(&self, name: &'static str) -> SdkTracer {
        self.provider.tracer(name)
    }

    /// Sends what is queued, waiting at most the shutdown timeout: a dead
    /// collector does not hold up the exit.
    pub async fn shutdown(self) -> Result<(), String> {
        let (provider, timeout) = (self.provider, self.shutdown_timeout);
        tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

/// A small, quick configuration for this crate's tests.
#[cfg(test)]
pub(crate) fn test_config() -> ExportConfig {
    ExportConfig {
        service: "test",
        attributes: Vec::new(),
        max_queue: 16,
        export_timeout: Duration::from_millis(100),
        shutdown_timeout: Duration::from_millis(100),
    }
}

#[cfg(test)]
mod tests {
    use super::test_config as config;
    use super::*;

    #[test]
    fn the_flag_wins_then_the_standard_variable_and_blank_is_off() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(endpoint(None, None), None);
        assert_eq!(endpoint(s(""), None), None);
        assert_eq!(endpoint(s("  "), s("http://b:4317")), s("http://b:4317"));
        assert_eq!(
            endpoint(s("http://a:4317"), s("http://b:4317")),
            s("http://a:4317")
        );
        assert_eq!(endpoint(None, s("http://b:4317")), s("http://b:4317"));
    }

    #[tokio::test]
    async fn a_malformed_endpoint_is_refused_with_its_name() {
        let Err(e) = Export::start("collector:4317", config()) else {
            panic!("an endpoint without a scheme was accepted");
        };
        assert!(e.contains("collector:4317"), "{e}");
        // Nothing listens there: building succeeds, the flush fails or
        // times out, and shutdown returns within its bound either way.
        let started = std::time::Instant::now();
        let export = Export::start("http://127.0.0.1:9", config()).expect("builds");
        let _ = export.shutdown().await;
        assert!(started.elapsed() < Duration::from_secs(5));
        // TLS to a collector with the system's roots.
        let export = Export::start("https://collector.example:4317", config()).expect("builds");
        let _ = export.shutdown().await;
    }
}
