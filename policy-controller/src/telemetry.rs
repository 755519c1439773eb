//! Traces of policy changes, exported over OTLP/gRPC when an endpoint is
//! configured, and off otherwise: no tracer, no span, no allocation, and
//! plan messages carry an empty trace context.
//!
//! The controller's side of a trace:
//! - `policy change`: one publication of plans (a view of the manifests, or
//!   a batch of watch events) that changed at least one node's plan;
//! - `plan version`, its child: one node's new plan version;
//! - `send plan`, child of the `plan version` it sends: one snapshot or
//!   delta handed to one enforcer's stream; its context travels in the
//!   message's `trace_context`, and the enforcer's `realize plan` is its
//!   child;
//! - `report state` and `get pod plan`: unary calls from an enforcer, each
//!   the child of the enforcer span named in the call's gRPC metadata.
//!
//! Export never holds up a plan: ended spans go to the SDK's bounded batch
//! queue (dropped, and logged once, when the collector cannot keep up) and
//! are sent from its own thread.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};
use palisade_runtime::otlp_export::ExportConfig;
use palisade_runtime::telemetry::{tracer, PlanMessageInfo};
use palisade_runtime::trace_context;

pub const SERVICE_NAME: &str = "palisade-controller";

/// Spans waiting for export at most; past it new ones are dropped.
const MAX_QUEUE: usize = 4096;
/// One export call to the collector, connection included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// What a shutdown waits for the last spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// How the controller exports, for [`palisade_runtime::telemetry::start`].
pub fn export_config() -> ExportConfig {
    ExportConfig {
        service: SERVICE_NAME,
        attributes: Vec::new(),
        max_queue: MAX_QUEUE,
        export_timeout: EXPORT_TIMEOUT,
        shutdown_timeout: SHUTDOWN_TIMEOUT,
    }
}

/// The span that published one node's plan version, for the sends of that
/// version to join its trace. Empty when tracing is off. Not part of the
/// plan: two plans compare equal whatever their traces.
#[derive(Clone, Debug, Default)]
pub struct PlanTrace(Option<SpanContext>);

impl PartialEq for PlanTrace {
    fn eq(&self, _: &PlanTrace) -> bool {
        true
    }
}

/// One publication of plans; see the module doc. Inert when tracing is off.
/// Its span is made only once a node's plan changes, with the time of
/// [`PolicyChange::start`]: a publication that changed nothing leaves no
/// trace.
pub struct PolicyChange(Option<Pending>);

struct Pending {
    tracer: &'static SdkTracer,
    started: SystemTime,
    source: &'static str,
    changes: usize,
    cx: OnceCell<Context>,
}

impl Pending {
    fn cx(&self) -> &Context {
        self.cx.get_or_init(|| {
            let t = self.tracer;
            let span = t
                .span_builder("policy change")
                .with_kind(SpanKind::Internal)
                .with_start_time(self.started)
                .with_attributes([
                    KeyValue::new("palisade.source", self.source),
                    KeyValue::new("palisade.source.changes", self.changes as i64),
                ])
                .start(t);
            Context::new().with_span(span)
        })
    }
}

impl PolicyChange {
    /// `source`: what produced it ("view" or "changes"); `changes`: how
    /// many object changes it holds (0 for a whole view).
    pub fn start(source: &'static str, changes: usize) -> PolicyChange {
        PolicyChange::start_in(tracer(), source, changes)
    }

    fn start_in(
        tracer: Option<&'static SdkTracer>,
        source: &'static str,
        changes: usize,
    ) -> PolicyChange {
        PolicyChange(tracer.map(|tracer| Pending {
            tracer,
            started: SystemTime::now(),
            source,
            changes,
            cx: OnceCell::new(),
        }))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Records `node`'s new plan `version` as a `plan version` child span;
    /// `pods` (pods upserted, pods removed) is computed only when tracing
    /// is on.
    pub fn node_plan(
        &self,
        node: &str,
        version: u64,
        pods: impl FnOnce() -> (usize, usize),
    ) -> PlanTrace {
        let Some(p) = &self.0 else {
            return PlanTrace::default();
        };
        let (upserted, removed) = pods();
        let mut span = p
            .tracer
            .span_builder("plan version")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("palisade.node", node.to_string()),
                KeyValue::new("palisade.plan.version", version as i64),
                KeyValue::new("palisade.plan.pods_upserted", upserted as i64),
                KeyValue::new("palisade.plan.pods_removed", removed as i64),
            ])
            .start_with_context(p.tracer, p.cx());
        let sc = span.span_context().clone();
        span.end();
        PlanTrace(Some(sc))
    }

    /// Ends the span, if any plan changed; `revision`: the source revision
    /// published.
    pub fn finish(self, revision: u64, nodes_changed: usize) {
        let Some(cx) = self.0.and_then(|p| p.cx.into_inner()) else {
            return;
        };
        let span = cx.span();
        span.set_attribute(KeyValue::new("palisade.source.revision", revision as i64));
        span.set_attribute(KeyValue::new(
            "palisade.nodes_changed",
            nodes_changed as i64,
        ));
        span.end();
    }
}

/// A `send plan` span: one snapshot or delta handed to one enforcer's
/// stream. Inert when tracing is off.
pub struct PlanSend(Option<Span>);

impl PlanSend {
    /// Starts the span as a child of the span that published the version
    /// (a root when none did, e.g. a node's empty first plan).
    pub fn start(parent: &PlanTrace, info: PlanMessageInfo<'_>) -> PlanSend {
        PlanSend::start_in(tracer(), parent, info)
    }

    fn start_in(
        tracer: Option<&'static SdkTracer>,
        parent: &PlanTrace,
        info: PlanMessageInfo<'_>,
    ) -> PlanSend {
        PlanSend(tracer.map(|t| {
            let parent = match &parent.0 {
                Some(sc) => Context::new().with_remote_span_context(sc.clone()),
                None => Context::new(),
            };
            t.span_builder("send plan")
                .with_kind(SpanKind::Producer)
                .with_attributes(info.attributes())
                .start_with_context(t, &parent)
        }))
    }

    /// The message's `trace_context`: this span, for the enforcer's
    /// realization to be its child. Empty when tracing is off.
    pub fn context_map(&self) -> HashMap<String, String> {
        match &self.0 {
            Some(span) => trace_context::to_map(
                &Context::new().with_remote_span_context(span.span_context().clone()),
            ),
            None => HashMap::new(),
        }
    }

    /// Ends the span; `sent`: whether the stream took the message.
    pub fn finish(self, sent: bool) {
        if let Some(mut span) = self.0 {
            if !sent {
                span.set_status(Status::error("the enforcer's stream is gone"));
            }
            span.end();
        }
    }
}

/// The span of a unary call from an enforcer (`report state`, `get pod
/// plan`): the child of the enforcer span its metadata names. None when
/// tracing is off or the call names no parent (an enforcer without
/// tracing): a call nobody traced starts no trace here.
pub struct CallSpan(Option<Span>);

impl CallSpan {
    pub fn start(
        name: &'static str,
        metadata: &tonic::metadata::MetadataMap,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> CallSpan {
        CallSpan::start_in(tracer(), name, metadata, attributes)
    }

    fn start_in(
        tracer: Option<&'static SdkTracer>,
        name: &'static str,
        metadata: &tonic::metadata::MetadataMap,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> CallSpan {
        let Some(t) = tracer else {
            return CallSpan(None);
        };
        let Some(parent) = trace_context::from_metadata(metadata) else {
            return CallSpan(None);
        };
        CallSpan(Some(
            t.span_builder(name)
                .with_kind(SpanKind::Server)
                .with_attributes(attributes())
                .start_with_context(t, &parent),
        ))
    }

    /// Ends the span with the call's outcome.
    pub fn finish<T>(self, result: &Result<T, tonic::Status>) {
        if let Some(mut span) = self.0 {
            match result {
                Ok(_) => span.set_status(Status::Ok),
                Err(s) => {
                    span.set_status(Status::error(format!("{:?}: {}", s.code(), s.message())))
                }
            }
            span.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary never configures an endpoint: every helper must be
    /// inert, and plan messages carry nothing.
    #[test]
    fn without_an_endpoint_nothing_is_traced_or_carried() {
        assert!(tracer().is_none());
        let change = PolicyChange::start("view", 3);
        assert!(!change.is_on());
        let mut computed = false;
        let trace = change.node_plan("n1", 7, || {
            computed = true;
            (1, 0)
        });
        assert!(!computed, "nothing is computed for a span nobody records");
        assert_eq!(trace.0, None);
        change.finish(1, 1);
        let send = PlanSend::start(
            &trace,
            PlanMessageInfo {
                node: "n1",
                kind: "delta",
                version: 7,
                base_version: 6,
                term: 0,
                pods: 1,
            },
        );
        assert!(send.context_map().is_empty());
        send.finish(true);
        // Even a call that names a parent starts nothing.
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let call = CallSpan::start("report state", &md, || panic!("no attributes when off"));
        assert!(call.0.is_none());
        call.finish(&Ok::<(), tonic::Status>(()));
    }

    fn attr(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    /// The controller's spans chain as the enforcer and the reports expect:
    /// policy change → plan version → send plan, whose context is what the
    /// message carries; a report naming an enforcer span in its metadata
    /// becomes that span's child.
    #[test]
    fn spans_chain_from_the_change_to_the_send_and_the_report() {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let t: &'static SdkTracer = Box::leak(Box::new(provider.tracer("test")));

        let change = PolicyChange::start_in(Some(t), "changes", 2);
        let trace = change.node_plan("n1", 7, || (2, 1));
        change.finish(5, 1);
        let send = PlanSend::start_in(
            Some(t),
            &trace,
            PlanMessageInfo {
                node: "n1",
                kind: "delta",
                version: 7,
                base_version: 6,
                term: 3,
                pods: 3,
            },
        );
        let carried = send.context_map();
        send.finish(true);
        let remote = trace_context::from_map(&carried).expect("the send's context is carried");

        // The enforcer's span, as a child of the send, names itself in the
        // report's metadata.
        let enforcer = Context::new().with_remote_span_context(SpanContext::new(
            remote.span().span_context().trace_id(),
            opentelemetry::trace::SpanId::from_hex("0102030405060708").unwrap(),
            opentelemetry::trace::TraceFlags::SAMPLED,
            true,
            Default::default(),
        ));
        let mut md = tonic::metadata::MetadataMap::new();
        trace_context::inject_metadata(&enforcer, &mut md);
        let call = CallSpan::start_in(Some(t), "report state", &md, || {
            vec![KeyValue::new("palisade.node", "n1")]
        });
        call.finish(&Err::<(), _>(tonic::Status::unavailable("not leader")));
        // A publication that changed no plan leaves no span.
        PolicyChange::start_in(Some(t), "view", 0).finish(6, 0);
        // Without a parent in the metadata, a call starts nothing.
        let orphan = CallSpan::start_in(Some(t), "report state", &Default::default(), Vec::new);
        assert!(orphan.0.is_none());

        let spans = exporter.get_finished_spans().unwrap();
        let by_name = |n: &str| {
            spans
                .iter()
                .find(|s| s.name == n)
                .unwrap_or_else(|| panic!("no {n} span in {spans:#?}"))
        };
        let (root, version, sent, report) = (
            by_name("policy change"),
            by_name("plan version"),
            by_name("send plan"),
            by_name("report state"),
        );
        let trace_id = root.span_context.trace_id();
        for s in [version, sent, report] {
            assert_eq!(s.span_context.trace_id(), trace_id, "{}", s.name);
        }
        assert_eq!(version.parent_span_id, root.span_context.span_id());
        assert_eq!(sent.parent_span_id, version.span_context.span_id());
        assert_eq!(
            remote.span().span_context().span_id(),
            sent.span_context.span_id(),
            "the message carries the send span"
        );
        assert_eq!(report.parent_span_id.to_string(), "0102030405060708");
        assert_eq!(
            attr(version, "palisade.plan.pods_upserted").as_deref(),
            Some("2")
        );
        assert_eq!(attr(sent, "palisade.plan.term").as_deref(), Some("3"));
        assert_eq!(attr(root, "palisade.source.revision").as_deref(), Some("5"));
        assert!(matches!(report.status, Status::Error { .. }));
        assert_eq!(spans.len(), 4);
    }
}
