//! W3C trace context (`traceparent`, `tracestate`) between the controller and
//! the enforcers, written and read by one implementation on both sides.
//!
//! Two carriers: real gRPC metadata for unary calls (`ReportState`,
//! `GetPodPlan`), and the `trace_context` map of `PlanSnapshot` and
//! `PlanDelta` for the plan stream, whose metadata exists only once, at its
//! start, while each message comes from a different controller span.
//!
//! Whatever is read here comes from the other process and is not trusted to
//! be well formed: a missing, oversized or malformed value gives no context
//! (`None`), never an error, so a bad trace header cannot stop a plan or a
//! report.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// Longer values are ignored: a traceparent is 55 characters, and W3C asks
/// vendors to keep a tracestate within 512.
pub const MAX_VALUE_LEN: usize = 1024;

/// The carrier map for a plan message: empty when `cx` holds no valid span
/// (tracing off), so an untraced message costs nothing on the wire.
pub fn to_map(cx: &Context) -> HashMap<String, String> {
    let mut map = HashMap::new();
    if has_span(cx) {
        TraceContextPropagator::new().inject_context(cx, &mut NonEmpty(&mut map));
    }
    map
}

/// The remote parent a plan message names; None when it names none or the
/// value does not parse.
pub fn from_map(map: &HashMap<String, String>) -> Option<Context> {
    extract(&Bounded(MapCarrier(map)))
}

/// Adds `cx`'s traceparent (and tracestate) to a request's metadata;
/// nothing when `cx` holds no valid span.
pub fn inject_metadata(cx: &Context, metadata: &mut MetadataMap) {
    if has_span(cx) {
        TraceContextPropagator::new()
            .inject_context(cx, &mut NonEmpty(&mut MetadataWriter(metadata)));
    }
}

/// The remote parent a request's metadata names; None when it names none
/// or the value does not parse.
pub fn from_metadata(metadata: &MetadataMap) -> Option<Context> {
    extract(&Bounded(MetadataReader(metadata)))
}

fn has_span(cx: &Context) -> bool {
    cx.span().span_context().is_valid()
}

fn extract(carrier: &dyn Extractor) -> Option<Context> {
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), carrier);
    has_span(&cx).then_some(cx)
}

/// Skips empty values (an empty tracestate is the same as none).
struct NonEmpty<'a, I: Injector>(&'a mut I);

impl<I: Injector> Injector for NonEmpty<'_, I> {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            self.0.set(key, value);
        }
    }
}

/// Reads only the two trace fields, and only when they are of sane size.
struct Bounded<E: Extractor>(E);

impl<E: Extractor> Extractor for Bounded<E> {
    fn get(&self, key: &str) -> Option<&str> {
        if key != TRACEPARENT && key != TRACESTATE {
            return None;
        }
        self.0.get(key).filter(|v| v.len() <= MAX_VALUE_LEN)
    }

    fn keys(&self) -> Vec<&str> {
        [TRACEPARENT, TRACESTATE]
            .into_iter()
            .filter(|k| self.get(k).is_some())
            .collect()
    }
}

struct MapCarrier<'a>(&'a HashMap<String, String>);

impl Extractor for MapCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct MetadataWriter<'a>(&'a mut MetadataMap);

impl Injector for MetadataWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only lowercase ASCII names and printable
        // values; anything else is dropped rather than sent mangled.
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct MetadataReader<'a>(&'a MetadataMap);

impl Extractor for MetadataReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        // A value that is not visible ASCII cannot be a trace header.
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    fn remote(sampled: bool, state: &str) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            flags,
            true,
            state.parse::<TraceState>().unwrap(),
        );
        Context::new().with_remote_span_context(sc)
    }

    fn ids(cx: &Context) -> (TraceId, SpanId, bool, String) {
        let span = cx.span();
        let sc = span.span_context();
        (
            sc.trace_id(),
            sc.span_id(),
            sc.is_sampled(),
            sc.trace_state().header(),
        )
    }

    #[test]
    fn a_context_survives_the_plan_message_map() {
        let cx = remote(true, "vendor=x");
        let map = to_map(&cx);
        assert_eq!(
            map.get(TRACEPARENT).map(String::as_str),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(map.get(TRACESTATE).map(String::as_str), Some("vendor=x"));
        let back = from_map(&map).expect("a valid traceparent gives a context");
        assert_eq!(ids(&back), ids(&cx));
        assert!(back.span().span_context().is_remote());
    }

    #[test]
    fn a_context_survives_grpc_metadata() {
        let cx = remote(false, "");
        let mut md = MetadataMap::new();
        inject_metadata(&cx, &mut md);
        assert!(
            md.get(TRACESTATE).is_none(),
            "an empty tracestate is not sent"
        );
        let back = from_metadata(&md).expect("a valid traceparent gives a context");
        assert_eq!(ids(&back), ids(&cx));
        assert!(!back.span().span_context().is_sampled(), "the flag travels");
    }

    #[test]
    fn no_span_means_nothing_written_and_nothing_read() {
        assert!(to_map(&Context::new()).is_empty());
        let mut md = MetadataMap::new();
        inject_metadata(&Context::new(), &mut md);
        assert!(md.is_empty());
        assert!(from_map(&HashMap::new()).is_none());
        assert!(from_metadata(&MetadataMap::new()).is_none());
    }

    #[test]
    fn garbage_is_ignored_not_trusted() {
        let dashes = "-".repeat(100_000);
        // A later version may add fields, which the propagator accepts: only
        // the size bound refuses this one.
        let padded = format!(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-{}",
            "a".repeat(MAX_VALUE_LEN)
        );
        let bad = [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "zz-🙂-🙂-🙂",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            dashes.as_str(),
            padded.as_str(),
        ];
        for v in bad {
            let map = HashMap::from([(TRACEPARENT.to_string(), v.to_string())]);
            assert!(from_map(&map).is_none(), "{v:?} gave a context");
            let mut md = MetadataMap::new();
            if let Ok(value) = MetadataValue::try_from(v) {
                md.insert(TRACEPARENT, value);
            }
            assert!(from_metadata(&md).is_none(), "{v:?} gave a context");
        }
        // Not visible ASCII: unreadable as text, so no context.
        let mut md = MetadataMap::new();
        md.insert(
            TRACEPARENT,
            MetadataValue::try_from(&b"00-\xff"[..])
                .unwrap_or_else(|_| MetadataValue::from_static("x")),
        );
        assert!(from_metadata(&md).is_none());
    }

    #[test]
    fn an_oversized_tracestate_is_dropped_but_the_parent_kept() {
        let mut map = to_map(&remote(true, "a=b"));
        map.insert(
            TRACESTATE.into(),
            format!("a={}", "b".repeat(MAX_VALUE_LEN)),
        );
        let back = from_map(&map).expect("the traceparent still parses");
        assert_eq!(back.span().span_context().trace_state().header(), "");
        // A malformed tracestate likewise leaves the parent.
        map.insert(TRACESTATE.into(), "=,=,not a state".into());
        assert!(from_map(&map).is_some());
    }

    #[test]
    fn only_the_trace_fields_are_read() {
        let mut map = to_map(&remote(true, ""));
        map.insert("baggage".into(), "secret=1".into());
        let carrier = Bounded(MapCarrier(&map));
        assert_eq!(carrier.keys(), vec![TRACEPARENT]);
        assert_eq!(carrier.get("baggage"), None);
    }
}
