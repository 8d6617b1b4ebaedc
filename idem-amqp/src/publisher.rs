//! Outbox messages forwarded to an exchange, publisher-confirmed.

use super::Connector;
use super::channel::{ConfirmChannel, DEFAULT_CONFIRM_TIMEOUT};
use super::fields::{long, short};
use super::{IDEM_HEADER_PREFIX, ORDERING_KEY_HEADER, TOPIC_HEADER};
use idem_core::Backend;
use idem_core::outbox::forward::{self, Forward};
use idem_core::outbox::{Delivery, Headers, OutboxRow};
use idem_core::task::BoxFuture;
use idem_core::{Error, Outcome};
use lapin::BasicProperties;
use lapin::types::FieldTable;
use serde::de::IgnoredAny;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Publishes outbox messages to an exchange: the relay as a forwarder.
///
/// Each message is published with routing key = its topic (or a fixed
/// [`routing_key`](Publisher::routing_key)), AMQP `message_id` = the outbox
/// `msg_id` (stable across every retry, so the consumer's key is stable),
/// `content_type` `application/json`, the topic in the `type` property and
/// the `x-idem-topic` header, persistent (`delivery_mode` 2), `mandatory`
/// (an unroutable message is an error, not a silent drop). It returns only
/// after the broker's publisher confirm.
///
/// The message's headers ([`OutboxRow::headers`]) are written as AMQP
/// headers with long-string values, its ordering key in the
/// [`ORDERING_KEY_HEADER`](crate::ORDERING_KEY_HEADER) header (RabbitMQ
/// orders nothing by it). Idem's own headers cannot be overwritten: a user
/// header under [`IDEM_HEADER_PREFIX`](crate::IDEM_HEADER_PREFIX)
/// (`x-idem-`, in any case), or one RabbitMQ interprets (`CC`, `BCC`,
/// `x-death`, `x-first-death-…`, `x-last-death-…`), is dropped with a
/// warning; a header name longer than 255 bytes is a permanent error. See
/// [headers and ordering keys](crate#headers-and-ordering-keys).
///
/// As a [`Relay`](idem_core::outbox::Relay) route ([`Publisher::route`]) it
/// answers `Ok(Outcome::Executed(()))` after the confirm, and the relay
/// marks the outbox message `success` (its fallback update, outside any
/// handler transaction: there is no database work to join). A failure is a
/// retryable or permanent [`Error`] and the relay backs off or
/// dead-letters the outbox message. A confirm lost after the broker took
/// the message (connection drop) makes the relay publish it again: the
/// copy has the same `message_id`, and the consumer's idempotent handler
/// answers `Duplicate`.
///
/// # Broker restarts
///
/// Built on a [`Connector::new`], the publisher survives a broker restart:
/// while the connection is down each publish fails at once with
/// [`Error::broker_unavailable`], an outage, which the relay does not
/// count against `max_attempts` (the message is due again after
/// [`Relay::outage_retry`](idem_core::outbox::Relay::outage_retry), its
/// attempts unchanged); the connector dials again with back-off,
/// redeclares its topology, and the next publish goes through. On a fixed
/// `Arc<Connection>` nothing dials again: every publish keeps failing
/// (uncounted) until the process is restarted.
///
/// ```no_run
/// use idem_runtime::amqp::{self, Publisher};
/// use idem_runtime::outbox::{enqueue, Relay};
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// amqp::Topology::new("coupon.deduct").bind("orders", "coupon.deduct").declare(&conn).await?;
///
/// let mut tx = pool.begin().await?;
/// // … the business change …
/// let _msg = enqueue(&mut tx, "coupon.deduct", "order-7", &serde_json::json!({ "coupon_id": 7 })).await?;
/// tx.commit().await?;
///
/// let publisher = Publisher::new(conn.clone(), "orders");
/// let relay = Relay::new(pool).route("coupon.deduct", publisher.route()).spawn();
/// // … or directly:
/// publisher.publish("coupon.deduct", "order-8", br#"{"coupon_id":8}"#).await?;
/// relay.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    channel: Arc<ConfirmChannel>,
    exchange: String,
    routing_key: Option<String>,
    mandatory: bool,
    confirm_timeout: Duration,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("mandatory", &self.mandatory)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher to `exchange` (`""`: the default exchange, which routes
    /// by queue name) over `connection`: a [`Connector`] (dialled again
    /// after the broker restarted) or a fixed `Arc<Connection>`. Its
    /// channel opens at the first publish and reopens after a failure.
    pub fn new(connection: impl Into<Connector>, exchange: impl Into<String>) -> Self {
        Publisher {
            channel: Arc::new(ConfirmChannel::new(connection.into())),
            exchange: exchange.into(),
            routing_key: None,
            mandatory: true,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        }
    }

    /// How long a publish may wait for the broker, its channel's opening
    /// and the broker's confirm included (default 10 s). A confirm that
    /// never comes (a broker killed, or a connection lost without being
    /// closed, which the heartbeats tell only after a minute or more) is
    /// then an outage: the relay puts the message back without counting
    /// the attempt and publishes it again on a new channel; the broker may
    /// have taken the first copy, which the consumer's `#[idempotent]`
    /// handler answers as a duplicate.
    pub fn confirm_timeout(mut self, within: Duration) -> Self {
        self.confirm_timeout = within;
        self
    }

    /// A fixed routing key instead of the topic.
    pub fn routing_key(mut self, key: impl Into<String>) -> Self {
        self.routing_key = Some(key.into());
        self
    }

    /// Whether an unroutable message is an error (default `true`). With
    /// `false`, the broker confirms and drops a message no queue takes.
    pub fn mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// Publishes one message and waits for the broker's confirm.
    pub async fn publish(&self, topic: &str, msg_id: &str, payload: &[u8]) -> Result<(), Error> {
        self.send(topic, msg_id, payload, None, &Headers::new())
            .await
    }

    /// Publishes one message with its ordering key and headers (see
    /// [`Publisher`]) and waits for the broker's confirm.
    async fn send(
        &self,
        topic: &str,
        msg_id: &str,
        payload: &[u8],
        ordering_key: Option<&str>,
        user: &Headers,
    ) -> Result<(), Error> {
        if msg_id.is_empty() {
            return Err(Error::InvalidMessage {
                topic: topic.to_owned(),
                msg_id: String::new(),
                reason: "empty msg_id: the consumer could not key it".to_owned(),
            });
        }
        let headers = field_table(topic, ordering_key, user)?;
        let properties = BasicProperties::default()
            .with_message_id(short("msg_id", msg_id)?)
            .with_type(short("topic", topic)?)
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let routing_key = self.routing_key.as_deref().unwrap_or(topic);
        self.channel
            .publish(
                &self.exchange,
                routing_key,
                self.mandatory,
                payload,
                properties,
                self.confirm_timeout,
            )
            .await
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
        "rabbitmq"
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
    }
}

/// Whether a user header named `name` is dropped: idem's own names
/// (`x-idem-…`) and the ones RabbitMQ interprets, in any case.
pub(crate) fn reserved(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with(IDEM_HEADER_PREFIX)
        || lower.starts_with("x-first-death-")
        || lower.starts_with("x-last-death-")
        || matches!(lower.as_str(), "cc" | "bcc" | "x-death")
}

/// A message's headers: the user's but the [reserved] ones, then idem's
/// own over them.
fn field_table(
    topic: &str,
    ordering_key: Option<&str>,
    user: &Headers,
) -> Result<FieldTable, Error> {
    let mut headers = FieldTable::default();
    for (name, value) in user {
        if reserved(name) {
            tracing::warn!(header = %name, topic, "a header named like idem's or RabbitMQ's own is not carried");
            continue;
        }
        headers.insert(short("header name", name)?, long(value));
    }
    headers.insert(TOPIC_HEADER.into(), long(topic));
    if let Some(key) = ordering_key {
        headers.insert(ORDERING_KEY_HEADER.into(), long(key));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::header_str;

    #[test]
    fn user_headers_are_carried_and_never_replace_idems() {
        let user: Headers = [
            ("tenant", "acme"),
            ("x-idem-topic", "forged"),
            ("X-Idem-Attempts", "9"),
            ("CC", "elsewhere"),
            ("x-request-id", "r-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let table = field_table("orders", Some("order-42"), &user).unwrap();
        let p = BasicProperties::default().with_headers(table);
        assert_eq!(header_str(&p, "tenant").as_deref(), Some("acme"));
        assert_eq!(header_str(&p, "x-request-id").as_deref(), Some("r-1"));
        assert_eq!(header_str(&p, TOPIC_HEADER).as_deref(), Some("orders"));
        assert_eq!(
            header_str(&p, ORDERING_KEY_HEADER).as_deref(),
            Some("order-42")
        );
        for dropped in ["X-Idem-Attempts", "CC"] {
            assert_eq!(header_str(&p, dropped), None, "{dropped}");
        }
        assert_eq!(p.headers().as_ref().unwrap().inner().len(), 4);
        let long_name = [("n".repeat(256), String::new())].into_iter().collect();
        assert!(field_table("orders", None, &long_name).is_err());
    }
}
