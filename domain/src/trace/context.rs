//! The W3C trace context of a span as the two header values an event carries. A leaf: it
//! knows spans and the propagator, not events, so `event.rs` can stamp a new event with it.

use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `traceparent` header name.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The `tracestate` header name.
pub(crate) const TRACESTATE: &str = "tracestate";

/// `traceparent` and `tracestate` (an empty `tracestate` is none).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TraceHeaders {
    pub(crate) traceparent: Option<String>,
    pub(crate) tracestate: Option<String>,
}

impl Injector for TraceHeaders {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.traceparent = Some(value),
            TRACESTATE => self.tracestate = Some(value).filter(|v| !v.is_empty()),
            _ => {}
        }
    }
}

/// The trace context of `span`, or `None` when the span is disabled or not traced.
pub(crate) fn span_headers(span: &tracing::Span) -> Option<TraceHeaders> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut headers = TraceHeaders::default();
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    Some(headers)
}
