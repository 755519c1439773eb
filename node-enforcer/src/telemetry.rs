//! Traces of plan realization, exported over OTLP/gRPC when an endpoint is
//! configured, and off otherwise (no tracer, no span, nothing added to
//! the calls to the controller).
//!
//! The enforcer's side of a trace:
//! - `realize plan`: applying one snapshot or delta, the child of the
//!   controller's `send plan` span named in the message's `trace_context`
//!   (a message without one starts no trace here);
//! - the `ReportState` call that reports that realization carries this
//!   span in its gRPC metadata, so the controller's `report state` span is
//!   its child: controller → enforcer → controller in one trace;
//! - `fetch pod plan`: an on-demand `GetPodPlan`, a root span whose context
//!   the call carries.
//!
//! Export never holds up the datapath: ended spans go to the SDK's bounded
//! batch queue (dropped, and logged once, when the collector cannot keep
//! up) and are sent from its own thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};
use palisade_runtime::otlp_export::ExportConfig;
use palisade_runtime::telemetry::{tracer, PlanMessageInfo};
use palisade_runtime::trace_context;
use tonic::metadata::MetadataMap;

pub const SERVICE_NAME: &str = "palisade-enforcer";
/// The resource attribute naming the node (OpenTelemetry's Kubernetes
/// convention), so one node's spans can be told from another's.
pub const NODE_ATTRIBUTE: &str = "k8s.node.name";

/// Spans waiting for export at most; past it new ones are dropped.
const MAX_QUEUE: usize = 2048;
/// One export call to the collector, connection included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// What a shutdown waits for the last spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// How node `node`'s enforcer exports, for
/// [`palisade_runtime::telemetry::start`].
pub fn export_config(node: &str) -> ExportConfig {
    ExportConfig {
        service: SERVICE_NAME,
        attributes: vec![KeyValue::new(NODE_ATTRIBUTE, node.to_string())],
        max_queue: MAX_QUEUE,
        export_timeout: EXPORT_TIMEOUT,
        shutdown_timeout: SHUTDOWN_TIMEOUT,
    }
}

/// A `realize plan` span. Inert when tracing is off or the message names
/// no parent.
pub struct Realize(Option<Span>);

impl Realize {
    /// `trace_context`: the message's, naming the controller's send span.
    pub fn start(trace_context: &HashMap<String, String>, info: PlanMessageInfo<'_>) -> Realize {
        Realize::start_in(tracer(), trace_context, info)
    }

    fn start_in(
        tracer: Option<&'static SdkTracer>,
        trace_context: &HashMap<String, String>,
        info: PlanMessageInfo<'_>,
    ) -> Realize {
        let Some(t) = tracer else {
            return Realize(None);
        };
        let Some(parent) = trace_context::from_map(trace_context) else {
            return Realize(None);
        };
        Realize(Some(
            t.span_builder("realize plan")
                .with_kind(SpanKind::Consumer)
                .with_attributes(info.attributes())
                .start_with_context(t, &parent),
        ))
    }

    /// This span as a parent for the report of the realization.
    pub fn context(&self) -> Option<Context> {
        let span = self.0.as_ref()?;
        Some(Context::new().with_remote_span_context(span.span_context().clone()))
    }

    /// Ends the span: `Ok(version)` applied, or why it was refused.
    pub fn finish(self, result: &Result<u64, impl std::fmt::Display>) {
        if let Some(mut span) = self.0 {
            match result {
                Ok(_) => {
                    span.set_attribute(KeyValue::new("palisade.result", "ok"));
                    span.set_status(Status::Ok);
                }
                Err(e) => {
                    span.set_attribute(KeyValue::new("palisade.result", "error"));
                    span.set_status(Status::error(e.to_string()));
                }
            }
            span.end();
        }
    }
}

/// The realization the next report describes, shared by the plan stream
/// (which sets it before handing a message to the reconciler, so it is
/// there before any state the message produces) and the reporter.
#[derive(Clone, Default)]
pub struct ReportParent(Arc<Mutex<Option<(u64, Context)>>>);

impl ReportParent {
    /// Plan `version` is being realized under `cx`. Nothing when there is
    /// no span (tracing off, or an untraced message): the lock is not even
    /// taken.
    pub fn realizing(&self, version: u64, cx: Option<Context>) {
        if let Some(cx) = cx {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((version, cx));
        }
    }

    /// Names the realization of `realized_version` in a report's metadata,
    /// when that realization was traced.
    pub fn inject(&self, realized_version: u64, metadata: &mut MetadataMap) {
        if tracer().is_none() {
            return;
        }
        self.inject_traced(realized_version, metadata);
    }

    fn inject_traced(&self, realized_version: u64, metadata: &mut MetadataMap) {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((version, cx)) = held.as_ref() {
            if *version == realized_version {
                trace_context::inject_metadata(cx, metadata);
            }
        }
    }
}

/// A `fetch pod plan` span, whose context the `GetPodPlan` call carries.
/// Inert when tracing is off.
pub struct Fetch(Option<Span>);

impl Fetch {
    pub fn start(node: &str, pod: &(String, String)) -> Fetch {
        Fetch(tracer().map(|t| {
            t.span_builder("fetch pod plan")
                .with_kind(SpanKind::Client)
                .with_attributes([
                    KeyValue::new("palisade.node", node.to_string()),
                    KeyValue::new("palisade.pod", format!("{}/{}", pod.0, pod.1)),
                ])
                .start(t)
        }))
    }

    pub fn inject(&self, metadata: &mut MetadataMap) {
        if let Some(span) = &self.0 {
            let cx = Context::new().with_remote_span_context(span.span_context().clone());
            trace_context::inject_metadata(&cx, metadata);
        }
    }

    pub fn finish<T>(self, result: &Result<T, impl std::fmt::Display>) {
        if let Some(mut span) = self.0 {
            match result {
                Ok(_) => span.set_status(Status::Ok),
                Err(e) => span.set_status(Status::error(e.to_string())),
            }
            span.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId};

    fn send_span() -> SpanContext {
        SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            Default::default(),
        )
    }

    fn info() -> PlanMessageInfo<'static> {
        PlanMessageInfo {
            node: "n1",
            kind: "delta",
            version: 8,
            base_version: 7,
            term: 2,
            pods: 1,
        }
    }

    /// This test binary never configures an endpoint: a traced message
    /// starts nothing and the report carries nothing.
    #[test]
    fn without_an_endpoint_nothing_is_traced_or_carried() {
        assert!(tracer().is_none());
        let map = trace_context::to_map(&Context::new().with_remote_span_context(send_span()));
        let realize = Realize::start(&map, info());
        assert!(realize.context().is_none());
        let parent = ReportParent::default();
        parent.realizing(8, realize.context());
        realize.finish(&Ok::<_, String>(8));
        assert!(parent.0.lock().unwrap().is_none());
        let mut md = MetadataMap::new();
        parent.inject(8, &mut md);
        assert!(md.is_empty());
        let fetch = Fetch::start("n1", &("x".into(), "a".into()));
        fetch.inject(&mut md);
        assert!(md.is_empty());
        fetch.finish(&Ok::<(), String>(()));
    }

    /// The realization is the child of the controller's send span, and
    /// the report of that version (only that version) names it.
    #[test]
    fn a_realization_joins_the_senders_trace_and_its_report_names_it() {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let t: &'static SdkTracer = Box::leak(Box::new(provider.tracer("test")));

        let map = trace_context::to_map(&Context::new().with_remote_span_context(send_span()));
        // No context in the message, no span.
        assert!(Realize::start_in(Some(t), &HashMap::new(), info())
            .0
            .is_none());
        let realize = Realize::start_in(Some(t), &map, info());
        let parent = ReportParent::default();
        parent.realizing(8, realize.context());
        realize.finish(&Err::<u64, _>("out of sequence"));

        let mut md = MetadataMap::new();
        parent.inject_traced(7, &mut md);
        assert!(md.is_empty(), "a report of another version names nothing");
        parent.inject_traced(8, &mut md);
        let named = trace_context::from_metadata(&md).expect("the report names the realization");

        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.name, "realize plan");
        assert_eq!(span.span_context.trace_id(), send_span().trace_id());
        assert_eq!(span.parent_span_id, send_span().span_id());
        assert_eq!(
            named.span().span_context().span_id(),
            span.span_context.span_id()
        );
        assert!(matches!(span.status, Status::Error { .. }));
        assert!(span
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "palisade.result" && kv.value.as_str() == "error"));
    }
}
