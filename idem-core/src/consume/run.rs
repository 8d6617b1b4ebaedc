//! A handler's run: the payload parsed, the call in a task of its own (or
//! polled inline), a panic caught as a failed attempt.

use super::failure::{Failure, Verdict};
use crate::Error;
use crate::task::BoxFuture;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::task::{JoinError, JoinHandle};

/// A message an entry point hands to its handlers: all that the core
/// needs of it is its body.
pub trait Incoming: Send + 'static {
    /// The body: the payload, as JSON.
    fn body(&self) -> &[u8];

    /// The payload, parsed from the body.
    fn payload<P: DeserializeOwned>(&self) -> Result<P, serde_json::Error> {
        serde_json::from_slice(self.body())
    }
}

/// A handler as stored: parses the payload, then runs the call
/// (`Ok(true)`: executed, `Ok(false)`: duplicate).
pub type Handler<M> =
    Arc<dyn Fn(M) -> Result<BoxFuture<Result<bool, Error>>, serde_json::Error> + Send + Sync>;

/// The handler running `f(message, payload)`, with the payload parsed as `P`.
pub fn handler<M, P, F, Fut, T>(f: F) -> Handler<M>
where
    M: Incoming,
    P: DeserializeOwned + Send + 'static,
    F: Fn(M, P) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<crate::Outcome<T>, Error>> + Send + 'static,
    T: Send + 'static,
{
    Arc::new(move |m: M| {
        let payload: P = m.payload()?;
        let fut = f(m, payload);
        Ok(Box::pin(async move { fut.await.map(|o| o.is_executed()) }) as BoxFuture<_>)
    })
}

/// Parses the payload and starts the handler in a task of its own; an
/// unparsable payload is a failure no retry heals.
pub fn start<M>(
    handler: &Handler<M>,
    message: M,
) -> Result<JoinHandle<Result<bool, Error>>, Failure> {
    match handler(message) {
        // With OpenTelemetry, the handler's spans nest under the caller's
        // (a relay's delivery), in the trace it continues.
        #[cfg(feature = "opentelemetry")]
        Ok(fut) => Ok(tokio::spawn(tracing::Instrument::in_current_span(fut))),
        #[cfg(not(feature = "opentelemetry"))]
        Ok(fut) => Ok(tokio::spawn(fut)),
        Err(e) => Err(Failure::dead(unparsable(&e))),
    }
}

/// [`start`] without a task of its own, for a caller that runs each
/// message in a task already (the relay's deliveries): the handler is
/// polled in the caller's task, a panic caught as a failed attempt that a
/// retry may heal, as [`verdict`] reads a panicked task.
pub fn inline<M>(handler: &Handler<M>, message: M) -> Result<Inline, Failure> {
    match handler(message) {
        Ok(fut) => Ok(Inline(Some(fut))),
        Err(e) => Err(Failure::dead(unparsable(&e))),
    }
}

/// A handler run by [`inline`]; its output is the attempt's [`Verdict`].
pub struct Inline(Option<BoxFuture<Result<bool, Error>>>);

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline")
            .field("ended", &self.0.is_none())
            .finish()
    }
}

impl Future for Inline {
    type Output = Verdict;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        let Some(fut) = self.0.as_mut() else {
            return Poll::Ready(Err(Failure::retry("handler polled after it ended")));
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)));
        let verdict = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(Ok(executed))) => Ok(executed),
            Ok(Poll::Ready(Err(e))) => Err(Failure::of(&e)),
            Err(panic) => Err(Failure::retry(format!(
                "handler panicked: {}",
                panic_message(&*panic)
            ))),
        };
        // Never polled again; a panicked future is dropped here.
        self.0 = None;
        Poll::Ready(verdict)
    }
}

/// The message of a panic's payload (`panic!` gives a `&str` or a
/// `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic payload that is not a string")
}

/// What a handler's task came to: a panic is a failed attempt, which a
/// retry may heal.
pub fn verdict(joined: Result<Result<bool, Error>, JoinError>) -> Verdict {
    match joined {
        Ok(Ok(executed)) => Ok(executed),
        Ok(Err(e)) => Err(Failure::of(&e)),
        Err(join) => Err(Failure::retry(panicked(&join))),
    }
}

/// Starts the handler and waits for it: [`start`], then [`verdict`].
pub async fn run<M>(handler: &Handler<M>, message: M) -> Verdict {
    match start(handler, message) {
        Ok(task) => verdict(task.await),
        Err(failure) => Err(failure),
    }
}

/// Makes `span`, the span an entry point runs one broker delivery in,
/// continue the trace its message carries (the W3C `traceparent` and
/// `tracestate` in `headers`, as the outbox publishers send them), and
/// gives it OpenTelemetry's messaging attributes: `messaging.system`
/// (`system`, as `"rabbitmq"`), `messaging.destination.name`
/// (`destination`: the queue, subject, topic), `messaging.message.id` and
/// `messaging.operation.type` = `process`. Call it before the span is
/// first entered; without a valid `traceparent` the span keeps its parent.
///
/// A span that declares the fields `otel.name` (empty) and `otel.kind`
/// (`"consumer"`) is also named as the messaging conventions name it,
/// `process <destination>`:
///
/// ```
/// # fn f(headers: &idem_core::outbox::Headers) {
/// let span = tracing::info_span!(
///     "my_broker_delivery",
///     "otel.name" = tracing::field::Empty,
///     "otel.kind" = "consumer",
/// );
/// idem_core::consume::continue_trace(&span, headers, "my_broker", "orders", Some("m-1"));
/// # }
/// ```
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub fn continue_trace(
    span: &tracing::Span,
    headers: &crate::outbox::Headers,
    system: &'static str,
    destination: &str,
    message_id: Option<&str>,
) {
    crate::otel::consumed(span, headers, system, destination, message_id);
}

pub(super) fn unparsable(e: &serde_json::Error) -> String {
    format!("unparsable payload: {e}")
}

pub(super) fn panicked(join: &JoinError) -> String {
    format!("handler panicked: {join}")
}
