//! Relay routes that forward each message to a broker: what the AMQP and
//! the NATS `Publisher::route` are, each publisher supplying only how it
//! publishes one message.

use super::Delivery;
use crate::backend::{Backend, OutboxRow};
use crate::task::BoxFuture;
use crate::{Error, Outcome};
use serde::de::IgnoredAny;
use std::future::Future;

/// A publisher a relay route can forward to.
pub trait Forward: Clone + Send + Sync + 'static {
    /// Publishes one outbox message, its payload as stored (JSON text),
    /// and waits for the broker's confirmation that it has it.
    fn forward(&self, message: &OutboxRow) -> impl Future<Output = Result<(), Error>> + Send;

    /// The broker, as OpenTelemetry's `messaging.system` names it
    /// (`rabbitmq`, `kafka`): an attribute of the publish spans (feature
    /// `opentelemetry`). Default `"unknown"`.
    fn system(&self) -> &'static str {
        "unknown"
    }
}

/// The route forwarding each message to `publisher`: `Executed` once the
/// broker confirmed it. The relay then marks the message `success` itself
/// (there is no database work for the route to join); a failure is
/// retried or dead-lettered as any handler's.
///
/// With the feature `opentelemetry`, each publish runs in a span
/// `outbox_publish` (named `send <topic>` for OpenTelemetry, of kind
/// `producer`), a child of the delivery's, and the message the publisher
/// gets carries that span's context in its `traceparent` and `tracestate`
/// headers: a consumer's span is the publish's child, in the trace of the
/// span the message was enqueued in.
#[allow(clippy::type_complexity)]
pub fn route<DB: Backend, P: Forward>(
    publisher: &P,
) -> impl Fn(Delivery<DB>, IgnoredAny) -> BoxFuture<Result<Outcome<()>, Error>> + Send + Sync + 'static
{
    let publisher = publisher.clone();
    move |delivery: Delivery<DB>, _: IgnoredAny| {
        let publisher = publisher.clone();
        Box::pin(async move {
            #[cfg(feature = "opentelemetry")]
            {
                let message = delivery.message();
                let (span, traced) = crate::otel::sending(publisher.system(), message);
                let sent = publisher.forward(traced.as_ref().unwrap_or(message));
                tracing::Instrument::instrument(sent, span).await?;
            }
            #[cfg(not(feature = "opentelemetry"))]
            publisher.forward(delivery.message()).await?;
            Ok(Outcome::Executed(()))
        })
    }
}
