//! W3C trace context across processes (R-OPS-1): one API call is one trace.
//!
//! The context travels in the `traceparent` (and `tracestate`) headers of every bus
//! request, in each stored event's metadata (consumers read the store, not NATS), and in
//! the headers of the relay's JetStream publish. The propagator is the global one, which
//! `atasira` sets to W3C trace context only when it exports spans
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`); otherwise these functions add and take nothing.

use std::collections::BTreeMap;

use opentelemetry::global;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header (and event metadata key) that carries the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The longest trace header value taken from a caller (`traceparent`, `tracestate`,
/// `baggage`): a longer one is ignored, so no caller can make the context that every
/// event, bus request and relayed notification then carries large (R-ARCH-15).
pub const MAX_TRACE_HEADER: usize = 512;

/// A trace header value short enough to take.
fn bounded(value: &str) -> Option<&str> {
    (value.len() <= MAX_TRACE_HEADER).then_some(value)
}

struct Sink<F: FnMut(&str, String)>(F);

impl<F: FnMut(&str, String)> Injector for Sink<F> {
    fn set(&mut self, key: &str, value: String) {
        (self.0)(key, value);
    }
}

struct Carrier<'a, M>(&'a M);

impl Extractor for Carrier<'_, BTreeMap<String, String>> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str).and_then(bounded)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

impl Extractor for Carrier<'_, serde_json::Value> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(serde_json::Value::as_str).and_then(bounded)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default()
    }
}

/// Calls `set` with each header of the current span's trace context (none when spans are
/// not exported).
pub fn inject(set: impl FnMut(&str, String)) {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let mut sink = Sink(set);
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut sink));
}

/// Makes `span` a child of the caller whose context `headers` carry (bus requests).
pub fn follow_headers(span: &tracing::Span, headers: &BTreeMap<String, String>) {
    follow(span, &Carrier(headers));
}

/// Makes `span` a child of the command that appended an event, from its metadata.
pub fn follow_event(span: &tracing::Span, metadata: &serde_json::Value) {
    follow(span, &Carrier(metadata));
}

/// Links `span` to the command that appended an event (a batch has one parent, the first
/// event's; the others are links).
pub fn link_event(span: &tracing::Span, metadata: &serde_json::Value) {
    let cx = global::get_text_map_propagator(|p| p.extract(&Carrier(metadata)));
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        span.add_link(sc);
    }
}

fn follow(span: &tracing::Span, carrier: &dyn Extractor) {
    let cx = global::get_text_map_propagator(|p| p.extract(carrier));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}
