//! W3C trace context on events: the sender's span context travels in the CloudEvent
//! extensions `traceparent` and `tracestate`, so one distributed trace covers a change from
//! the side that noticed it to the side that applied it (see `docs/observability.md`).
//!
//! Without an OpenTelemetry layer in the tracing subscriber (no exporter configured) spans
//! have no OpenTelemetry context: nothing is injected and extracting is a no-op.

pub(crate) mod context;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use context::{TRACEPARENT, TRACESTATE};

use crate::event::Event;

struct EventView<'a>(&'a Event);

impl Extractor for EventView<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.0.traceparent.as_deref(),
            TRACESTATE => self.0.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        [TRACEPARENT, TRACESTATE]
            .into_iter()
            .filter(|k| self.get(k).is_some())
            .collect()
    }
}

/// The remote context an event carries (empty when it carries none or an invalid one).
pub fn extract(event: &Event) -> opentelemetry::Context {
    if event.traceparent.is_none() {
        return opentelemetry::Context::new();
    }
    TraceContextPropagator::new().extract(&EventView(event))
}

/// Makes `span` a child of the trace context the event carries. Call it right after creating
/// the span, before it is first entered.
pub fn set_parent(span: &tracing::Span, event: &Event) {
    if span.is_disabled() || event.traceparent.is_none() {
        return;
    }
    let cx = extract(event);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Fills the object fields an [`event_span!`] declares and makes the span a child of the
/// trace context the event carries. Not for direct use.
#[doc(hidden)]
pub fn adopt(span: &tracing::Span, event: &Event) {
    if span.is_disabled() {
        return;
    }
    if let Some(r) = &event.resource {
        span.record("object.kind", r.kind.as_str());
        span.record("object.namespace", r.namespace.as_str());
        span.record("object.name", r.name.as_str());
    }
    set_parent(span, event);
    record_ids(span, event);
}

/// Records `trace_id` and `span_id` on the span, so log lines inside it (JSON logs carry the
/// current span's fields) can be joined with the trace: the span's own ids when tracing is
/// on, else the trace id the event carries from the peer.
fn record_ids(span: &tracing::Span, event: &Event) {
    let own = span.context().span().span_context().clone();
    if own.is_valid() {
        span.record("trace_id", own.trace_id().to_string());
        span.record("span_id", own.span_id().to_string());
        return;
    }
    let remote = extract(event).span().span_context().clone();
    if remote.is_valid() {
        span.record("trace_id", remote.trace_id().to_string());
    }
}

/// A span about one event on the stream: a trace root in `tracing` terms (not a child of the
/// long-lived session span), continuing the trace the event carries if any. Fields: the
/// event's type and id, the object's kind, namespace and name (never the payload), plus
/// the extra fields given. Heartbeats (`ping`, `pong`) get `DEBUG` spans, which are not
/// exported.
#[macro_export]
macro_rules! event_span {
    ($name:literal, $event:expr $(, $($field:tt)+)?) => {{
        let event: &$crate::Event = $event;
        let span = if matches!(event.ty, $crate::EventType::Ping | $crate::EventType::Pong) {
            ::tracing::debug_span!(parent: None, $name,
                "event.type" = event.ty.verb(), "event.id" = %event.id,
                "object.kind" = ::tracing::field::Empty,
                "object.namespace" = ::tracing::field::Empty,
                "object.name" = ::tracing::field::Empty,
                trace_id = ::tracing::field::Empty,
                span_id = ::tracing::field::Empty
                $(, $($field)+)?)
        } else {
            ::tracing::info_span!(parent: None, $name,
                "event.type" = event.ty.verb(), "event.id" = %event.id,
                "object.kind" = ::tracing::field::Empty,
                "object.namespace" = ::tracing::field::Empty,
                "object.name" = ::tracing::field::Empty,
                trace_id = ::tracing::field::Empty,
                span_id = ::tracing::field::Empty
                $(, $($field)+)?)
        };
        $crate::trace::adopt(&span, event);
        span
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventType, Payload};
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn untraced_events_carry_no_context() {
        let e = Event::new("src", EventType::Ping, Payload::None);
        assert_eq!(e.traceparent, None);
        assert_eq!(e.tracestate, None);
        assert!(!extract(&e).span().span_context().is_valid());
    }

    #[test]
    fn context_travels_through_the_cloud_event() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let sender = tracing::info_span!("sender");
            let event = sender.in_scope(|| Event::new("src", EventType::Ping, Payload::None));
            let tp = event.traceparent.clone().expect("traceparent injected");
            let sent = sender.context().span().span_context().clone();
            assert!(tp.contains(&sent.trace_id().to_string()), "{tp}");
            assert!(tp.contains(&sent.span_id().to_string()), "{tp}");

            let decoded = Event::from_cloud_event(event.to_cloud_event()).unwrap();
            assert_eq!(decoded.traceparent, event.traceparent);
            let receiver = tracing::info_span!("receiver");
            set_parent(&receiver, &decoded);
            let got = receiver.context().span().span_context().clone();
            assert_eq!(got.trace_id(), sent.trace_id());
            assert_ne!(got.span_id(), sent.span_id());
        });
    }

    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_log_lines_inside_an_event_span_carry_the_trace_id() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(move || out.clone()),
            );
        tracing::subscriber::with_default(subscriber, || {
            let sender = tracing::info_span!("sender");
            let event = sender.in_scope(|| Event::new("src", EventType::Ping, Payload::None));
            let trace_id = sender
                .context()
                .span()
                .span_context()
                .trace_id()
                .to_string();
            let mut decoded = Event::from_cloud_event(event.to_cloud_event()).unwrap();
            decoded.ty = EventType::Create;
            let span = crate::event_span!("receive", &decoded);
            span.in_scope(|| tracing::info!("applied"));
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            assert!(
                text.contains(&format!("\"trace_id\":\"{trace_id}\"")),
                "{text}"
            );
            assert!(text.contains("\"span_id\":\""), "{text}");
        });
    }
}
