//! W3C trace context in a message's headers (feature `opentelemetry`):
//! [`enqueue`](crate::outbox::enqueue) writes the current span's context as
//! `traceparent` (and `tracestate`), the relay's `outbox_delivery` span
//! continues it, a forwarding route's `outbox_publish` span (a child of the
//! delivery's) writes its own context into the headers the broker gets,
//! and a consumer's span continues that. A relay's batch has a span of its
//! own, linked to each of its messages' traces and linked from each of
//! their delivery spans.
//!
//! The spans are named and attributed per OpenTelemetry's messaging
//! conventions: `process <destination>` (kind `consumer`) for a delivery,
//! `send <topic>` (kind `producer`) for a publish, through the `otel.name`
//! and `otel.kind` fields `tracing-opentelemetry` reads.
//!
//! The headers are written and read here, by the W3C Trace Context format
//! (version `00`), whatever global propagator the application installed:
//! the messages stored in the outbox read the same in every process.

use crate::backend::OutboxRow;
use crate::outbox::Headers;
use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The W3C header carrying the trace and parent span ids.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The W3C header carrying the vendors' trace state.
pub(crate) const TRACESTATE: &str = "tracestate";

/// The current `tracing` span's context as W3C headers: `traceparent`, and
/// `tracestate` when not empty. `None` without a valid span context (no
/// span, or no OpenTelemetry layer).
pub(crate) fn current_headers() -> Option<(String, Option<String>)> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let state = sc.trace_state().header();
    Some((traceparent(sc), (!state.is_empty()).then_some(state)))
}

/// `headers` with the current span's context added, unless they carry a
/// `traceparent` already (the caller's own); `None` when nothing is added.
pub(crate) fn with_current(headers: &Headers) -> Option<Headers> {
    if headers.contains_key(TRACEPARENT) {
        return None;
    }
    let (parent, state) = current_headers()?;
    let mut headers = headers.clone();
    headers.insert(TRACEPARENT.to_owned(), parent);
    if let Some(state) = state {
        headers.entry(TRACESTATE.to_owned()).or_insert(state);
    }
    Some(headers)
}

fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8() & TraceFlags::SAMPLED.to_u8()
    )
}

/// The remote span context `headers` carry, if their `traceparent` is
/// valid.
pub(crate) fn extract(headers: &Headers) -> Option<SpanContext> {
    let mut parts = headers.get(TRACEPARENT)?.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four fields; a later version may add some.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !(hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2)) {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = headers
        .get(TRACESTATE)
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8()),
        true,
        state,
    );
    sc.is_valid().then_some(sc)
}

/// Makes `span` continue the trace `headers` carry (their `traceparent`),
/// if any; a no-op otherwise, or when `span` is disabled.
pub(crate) fn continue_trace(span: &tracing::Span, headers: &Headers) {
    if let Some(sc) = extract(headers) {
        // Errors: no OpenTelemetry layer, or a disabled span; either way
        // there is no trace to continue.
        let _ = span.set_parent(Context::new().with_remote_span_context(sc));
    }
}

/// The `messaging.system` of the relay's own spans.
const OUTBOX_SYSTEM: &str = "idem.outbox";

/// Names `span` as the messaging conventions name a span: its operation
/// and its destination (`process orders`). The span must declare the
/// field `otel.name` (as `tracing::field::Empty`).
fn name(span: &tracing::Span, operation: &str, destination: &str) {
    span.record("otel.name", format!("{operation} {destination}"));
}

/// The relay's span of one delivery: the trace of the enqueuing span, and
/// OpenTelemetry's messaging attributes.
pub(crate) fn delivery(span: &tracing::Span, row: &OutboxRow) {
    continue_trace(span, &row.headers);
    if span.is_disabled() {
        return;
    }
    name(span, "process", &row.topic);
    span.set_attribute("messaging.system", OUTBOX_SYSTEM);
    span.set_attribute("messaging.operation.type", "process");
    span.set_attribute("messaging.destination.name", row.topic.clone());
    span.set_attribute("messaging.message.id", row.msg_id.clone());
}

/// The span of a relay's batch (its handlers' one transaction and its
/// commit): linked to the trace of each of `rows`, as the messaging
/// conventions link a batch to its messages.
pub(crate) fn batch(span: &tracing::Span, rows: &[OutboxRow]) {
    if span.is_disabled() {
        return;
    }
    for row in rows {
        if let Some(sc) = extract(&row.headers) {
            span.add_link(sc);
        }
    }
    let topic = rows.first().map(|r| r.topic.as_str());
    let one_topic = topic.filter(|t| rows.iter().all(|r| r.topic == *t));
    name(span, "process", one_topic.unwrap_or("outbox"));
    span.set_attribute("messaging.system", OUTBOX_SYSTEM);
    span.set_attribute("messaging.operation.type", "process");
    if let Some(topic) = one_topic {
        span.set_attribute("messaging.destination.name", topic.to_owned());
    }
    let count = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    span.set_attribute("messaging.batch.message_count", count);
}

/// Links the delivery span `span` of a batch's message to the batch's
/// span.
pub(crate) fn in_batch(span: &tracing::Span, batch: &tracing::Span) {
    let cx = batch.context();
    let sc = cx.span().span_context().clone();
    span.add_link(sc);
}

/// The span of one publish by a forwarding route (a child of the current
/// span: the delivery's), and the message to publish: `message` with its
/// headers' trace context made that span's (`None`: `message` as it is,
/// there being no valid span).
pub(crate) fn sending(
    system: &'static str,
    message: &OutboxRow,
) -> (tracing::Span, Option<OutboxRow>) {
    let span = tracing::info_span!(
        "outbox_publish",
        topic = %message.topic,
        msg_id = %message.msg_id,
        "otel.name" = tracing::field::Empty,
        "otel.kind" = "producer",
    );
    if span.is_disabled() {
        return (span, None);
    }
    name(&span, "send", &message.topic);
    span.set_attribute("messaging.system", system);
    span.set_attribute("messaging.operation.type", "send");
    span.set_attribute("messaging.destination.name", message.topic.clone());
    span.set_attribute("messaging.message.id", message.msg_id.clone());
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return (span, None);
    }
    let mut traced = message.clone();
    traced
        .headers
        .insert(TRACEPARENT.to_owned(), traceparent(&sc));
    let state = sc.trace_state().header();
    if state.is_empty() {
        traced.headers.remove(TRACESTATE);
    } else {
        traced.headers.insert(TRACESTATE.to_owned(), state);
    }
    (span, Some(traced))
}

/// A broker delivery's span: the trace of the `traceparent` header its
/// message carries, and OpenTelemetry's messaging attributes.
pub(crate) fn consumed(
    span: &tracing::Span,
    headers: &Headers,
    system: &'static str,
    destination: &str,
    message_id: Option<&str>,
) {
    continue_trace(span, headers);
    if span.is_disabled() {
        return;
    }
    name(span, "process", destination);
    span.set_attribute("messaging.system", system);
    span.set_attribute("messaging.operation.type", "process");
    span.set_attribute("messaging.destination.name", destination.to_owned());
    if let Some(id) = message_id {
        span.set_attribute("messaging.message.id", id.to_owned());
    }
}

/// An HTTP request's span: the trace of the request's `traceparent`
/// header, unless the span it runs in (the application's own HTTP tracing)
/// already has a valid trace context, which it keeps.
pub(crate) fn requested(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    let enclosing = tracing::Span::current().context();
    if enclosing.span().span_context().is_valid() {
        return;
    }
    let Some(parent) = traceparent else { return };
    let mut headers = Headers::new();
    headers.insert(TRACEPARENT.to_owned(), parent.to_owned());
    if let Some(state) = tracestate {
        headers.insert(TRACESTATE.to_owned(), state.to_owned());
    }
    continue_trace(span, &headers);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(parent: &str) -> Headers {
        Headers::from([(TRACEPARENT.to_owned(), parent.to_owned())])
    }

    #[test]
    fn traceparent_round_trips() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut h = headers(parent);
        h.insert(TRACESTATE.to_owned(), "congo=t61rcWkgMzE".to_owned());
        let sc = extract(&h).expect("valid");
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(traceparent(&sc), parent);
        assert_eq!(sc.trace_state().header(), "congo=t61rcWkgMzE");
        let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        assert!(!extract(&headers(unsampled)).unwrap().is_sampled());
    }

    #[test]
    fn bad_traceparents_are_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
        ] {
            assert!(extract(&headers(bad)).is_none(), "{bad}");
        }
        assert!(extract(&Headers::new()).is_none());
        // A later version's extra fields are allowed.
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what";
        assert!(extract(&headers(later)).is_some());
    }

    #[test]
    fn no_span_no_headers() {
        assert!(current_headers().is_none());
        assert!(with_current(&Headers::new()).is_none());
    }
}
