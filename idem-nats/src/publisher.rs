//! Outbox messages published to a stream, each confirmed by the stream's
//! ack.

use super::error::from_publish;
use super::{ORDERING_KEY_HEADER, TOPIC_HEADER};
use async_nats::jetstream::Context;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use idem_core::Backend;
use idem_core::outbox::forward::{self, Forward};
use idem_core::outbox::{Delivery, Headers, OutboxRow};
use idem_core::task::BoxFuture;
use idem_core::{Error, Outcome};
use serde::de::IgnoredAny;
use std::fmt;

/// Publishes outbox messages to JetStream: the relay as a forwarder.
///
/// Each message is published to the subject = its topic (or a fixed
/// [`subject`](Publisher::subject)) with `Nats-Msg-Id` = the outbox
/// `msg_id` (stable across every retry, so the stream's duplicate window
/// drops a republish inside it, and the consumer's key is stable after
/// it), `Content-Type: application/json` and the topic in the
/// `Idem-Topic` header. It returns only after the stream's publish ack:
/// the message is stored (on a quorum of the replicas).
///
/// The message's headers ([`OutboxRow::headers`]) are written as NATS
/// headers, its ordering key in the
/// [`ORDERING_KEY_HEADER`](crate::ORDERING_KEY_HEADER) header (the stream
/// orders nothing by it). Idem's own headers cannot be overwritten: a user
/// header named under `Idem-` or `Nats-` (in any case), or
/// `Content-Type`, is dropped with a warning; a name or value NATS cannot
/// carry is a permanent error. See
/// [headers and ordering keys](crate#headers-and-ordering-keys).
///
/// As a [`Relay`](idem_core::outbox::Relay) route ([`Publisher::route`]) it
/// answers `Ok(Outcome::Executed(()))` after the ack, and the relay marks
/// the outbox message `success`. A failure is a retryable or permanent
/// [`Error`] and the relay backs off or dead-letters the outbox message.
/// An ack lost after the stream stored the message (a time-out, a
/// connection or a stream leader gone) makes the relay publish it again,
/// and so does a relay that dies before marking the row: inside the
/// stream's duplicate window the server answers that ack with
/// `duplicate: true` and stores nothing; after it, the stream holds a
/// second copy with the same `Nats-Msg-Id`, and the consumer's idempotent
/// handler answers `Duplicate` (see the
/// [module documentation](super#the-duplicate-window-a-front-layer)).
/// A failure while the client is disconnected from every server is an
/// outage, which the relay does not count (see
/// [server restarts](super#server-restarts)).
///
/// ```no_run
/// use idem_runtime::nats::{self, Publisher};
/// use idem_runtime::outbox::{enqueue, Relay};
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let js = nats::connect("nats://127.0.0.1:4222").await?;
/// nats::Topology::new("ORDERS", "orders.>", "deduct").declare(&js).await?;
///
/// let mut tx = pool.begin().await?;
/// // … the business change …
/// let _msg = enqueue(&mut tx, "orders.deduct", "order-7", &serde_json::json!({ "coupon_id": 7 })).await?;
/// tx.commit().await?;
///
/// let publisher = Publisher::new(js.clone()).expected_stream("ORDERS");
/// let relay = Relay::new(pool).route("orders.deduct", publisher.route()).spawn();
/// // … or directly:
/// let ack = publisher.publish("orders.deduct", "order-8", br#"{"coupon_id":8}"#).await?;
/// assert_eq!(ack.stream, "ORDERS");
/// relay.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    js: Context,
    subject: Option<String>,
    expected_stream: Option<String>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("subject", &self.subject)
            .field("expected_stream", &self.expected_stream)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher on `js`. The ack wait is the context's request time-out
    /// (async-nats' default: 5 s); a time-out is a retryable error.
    pub fn new(js: Context) -> Self {
        Publisher {
            js,
            subject: None,
            expected_stream: None,
        }
    }

    /// A fixed subject instead of the topic.
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The stream that must store the message (`Nats-Expected-Stream`):
    /// another stream taking the subject makes the publish fail instead of
    /// landing there.
    pub fn expected_stream(mut self, stream: impl Into<String>) -> Self {
        self.expected_stream = Some(stream.into());
        self
    }

    /// Publishes one message and waits for the stream's ack. The ack says
    /// where it was stored, and `duplicate: true` when the stream already
    /// had a message with this `Nats-Msg-Id` inside its duplicate window
    /// (nothing new stored).
    pub async fn publish(
        &self,
        topic: &str,
        msg_id: &str,
        payload: &[u8],
    ) -> Result<PublishAck, Error> {
        self.send(topic, msg_id, payload, None, &Headers::new())
            .await
    }

    /// Publishes one message with its ordering key and headers (see
    /// [`Publisher`]) and waits for the stream's ack.
    async fn send(
        &self,
        topic: &str,
        msg_id: &str,
        payload: &[u8],
        ordering_key: Option<&str>,
        user: &Headers,
    ) -> Result<PublishAck, Error> {
        if msg_id.is_empty() {
            return Err(Error::InvalidMessage {
                topic: topic.to_owned(),
                msg_id: String::new(),
                reason: "empty msg_id: the consumer could not key it".to_owned(),
            });
        }
        let headers = header_map(topic, msg_id, user)?;
        let mut publish = PublishMessage::build()
            .payload(payload.to_vec().into())
            .headers(headers)
            .message_id(msg_id)
            .header(TOPIC_HEADER, topic)
            .header("Content-Type", "application/json");
        if let Some(key) = ordering_key {
            publish = publish.header(ORDERING_KEY_HEADER, text(topic, msg_id, key)?);
        }
        if let Some(stream) = &self.expected_stream {
            publish = publish.expected_stream(stream);
        }
        let subject = self.subject.as_deref().unwrap_or(topic).to_owned();
        let sent = async {
            self.js
                .send_publish(subject, publish)
                .await
                .map_err(from_publish)?
                .await
                .map_err(from_publish)
        };
        sent.await.map_err(|e| self.outage(e))
    }

    /// A retryable publish failure while the client is not connected to
    /// any server is an outage
    /// ([`Error::broker_unavailable`]): the relay does not count it.
    fn outage(&self, e: Error) -> Error {
        let down = self.js.client().connection_state() != async_nats::connection::State::Connected;
        if !down || !e.is_retryable() {
            return e;
        }
        match e {
            Error::Broker { source, .. } => Error::broker_unavailable("nats", source),
            e => e,
        }
    }

    /// This publisher as a [`Relay`](idem_core::outbox::Relay) route:
    /// `relay.route(topic, publisher.route())`. The payload is forwarded as
    /// stored (JSON text).
    #[allow(clippy::type_complexity)]
    pub fn route<DB: Backend>(
        &self,
    ) -> impl Fn(Delivery<DB>, IgnoredAny) -> BoxFuture<Result<Outcome<()>, Error>> + Send + Sync + 'static
    {
        forward::route(self)
    }
}

impl Forward for Publisher {
    fn system(&self) -> &'static str {
        "nats"
    }

    async fn forward(&self, message: &OutboxRow) -> Result<(), Error> {
        self.send(
            &message.topic,
            &message.msg_id,
            message.payload.as_bytes(),
            message.ordering_key.as_deref(),
            &message.headers,
        )
        .await
        .map(|_ack| ())
    }
}

/// Whether a user header named `name` is dropped: idem's own names
/// (`Idem-…`), the server's (`Nats-…`) and `Content-Type`, in any case.
pub(crate) fn reserved(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("idem-") || lower.starts_with("nats-") || lower == "content-type"
}

/// The user's headers but the [reserved] ones; idem's own are set over
/// them by [`Publisher::send`].
fn header_map(topic: &str, msg_id: &str, user: &Headers) -> Result<HeaderMap, Error> {
    let mut headers = HeaderMap::new();
    for (name, value) in user {
        if reserved(name) {
            tracing::warn!(header = %name, topic, msg_id, "a header named like idem's or the server's own is not carried");
            continue;
        }
        let name: HeaderName = name.parse().map_err(|e| {
            invalid(
                topic,
                msg_id,
                format!("the header name `{}`: {e}", name.escape_default()),
            )
        })?;
        headers.insert(name, text(topic, msg_id, value)?);
    }
    Ok(headers)
}

/// `value` as a header value, or a permanent error (a line break).
fn text(topic: &str, msg_id: &str, value: &str) -> Result<HeaderValue, Error> {
    value.parse().map_err(|e| {
        invalid(
            topic,
            msg_id,
            format!("the header value `{:.64}`: {e}", value.escape_default()),
        )
    })
}

fn invalid(topic: &str, msg_id: &str, reason: String) -> Error {
    Error::InvalidMessage {
        topic: topic.to_owned(),
        msg_id: msg_id.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn user_headers_but_reserved_ones_are_carried() {
        let user = headers(&[
            ("Tenant", "acme"),
            ("idem-topic", "forged"),
            ("Nats-Rollup", "all"),
            ("content-type", "text/plain"),
        ]);
        let map = header_map("orders", "m-1", &user).unwrap();
        assert_eq!(map.len(), 1);
        assert_eq!(map.get("Tenant").map(HeaderValue::as_str), Some("acme"));
    }

    #[test]
    fn headers_nats_cannot_carry_are_permanent_errors() {
        for bad in [
            headers(&[("a b", "v")]),
            headers(&[("a:b", "v")]),
            headers(&[("é", "v")]),
            headers(&[("a", "line\nbreak")]),
        ] {
            let e = header_map("orders", "m-1", &bad).unwrap_err();
            assert!(matches!(e, Error::InvalidMessage { .. }), "{e}");
            assert!(!e.is_retryable());
        }
        let e = text("orders", "m-1", "k\r").unwrap_err();
        assert!(matches!(e, Error::InvalidMessage { .. }), "{e}");
    }
}
