//! Outbox messages written to a stream with `XADD`, each confirmed by
//! Redis's reply (the new entry's id).

use super::commands::{self, manager};
use super::error::from_redis;
use super::{
    CONTENT_TYPE_FIELD, HEADER_FIELD_PREFIX, MSG_ID_FIELD, ORDERING_KEY_FIELD, PAYLOAD_FIELD,
    TOPIC_FIELD,
};
use idem_core::Backend;
use idem_core::outbox::forward::{self, Forward};
use idem_core::outbox::{Delivery, Headers, OutboxRow};
use idem_core::task::BoxFuture;
use idem_core::{Error, Outcome};
use redis::aio::ConnectionManager;
use serde::de::IgnoredAny;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Publishes outbox messages to Redis Streams: the relay as a forwarder.
///
/// Each message is written with `XADD stream [MAXLEN ~ n] * msg_id <id>
/// payload <json> topic <topic> content_type application/json` to the
/// stream = its topic (or a fixed [`stream`](Publisher::stream), or the
/// topic behind a [`prefix`](Publisher::prefix)). The `msg_id` field is
/// the outbox `msg_id`, stable across every retry: the consumer's key.
/// It returns only after Redis answered with the entry's id.
///
/// A message with an ordering key has the field `ordering_key`
/// ([`ORDERING_KEY_FIELD`](crate::ORDERING_KEY_FIELD)) too (Redis orders
/// nothing by it), and each of its headers ([`OutboxRow::headers`]) is
/// the field `h.<name>`
/// ([`HEADER_FIELD_PREFIX`](crate::HEADER_FIELD_PREFIX)), after idem's
/// own: the prefix keeps a header from ever replacing `msg_id`, `topic`
/// or any other field idem writes. See
/// [headers and ordering keys](crate#headers-and-ordering-keys).
///
/// As a [`Relay`](idem_core::outbox::Relay) route ([`Publisher::route`]) it
/// answers `Ok(Outcome::Executed(()))` after that reply, and the relay
/// marks the outbox message `success`. A reply lost after Redis wrote
/// the entry (the connection dropped, a time-out, a relay that dies
/// before marking the row) makes the relay write it again: a second
/// entry with the same `msg_id`, which the consumer's handler answers
/// `Duplicate`. Redis that cannot be reached (refused, dropped, no answer
/// within the response time-out, 5 s, or still loading its data) is an
/// [outage](idem_core::Error::is_outage), which the relay does not count
/// against `max_attempts`; a command Redis refuses (the key holding
/// another type) is a permanent error. The connection is made at the
/// first publish and reconnects on its own.
///
/// ```no_run
/// use idem_runtime::redis_streams::{self, Publisher};
/// use idem_runtime::outbox::{enqueue, Relay};
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let redis = redis_streams::client("redis://127.0.0.1:6379/")?;
///
/// let mut tx = pool.begin().await?;
/// // … the business change …
/// let _msg = enqueue(&mut tx, "orders", "order-7", &serde_json::json!({ "coupon_id": 7 })).await?;
/// tx.commit().await?;
///
/// let publisher = Publisher::new(redis).max_len(1_000_000);
/// let relay = Relay::new(pool).route("orders", publisher.route()).spawn();
/// // … or directly:
/// let entry_id = publisher.publish("orders", "order-8", br#"{"coupon_id":8}"#).await?;
/// # let _ = entry_id;
/// relay.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    client: redis::Client,
    conn: Arc<OnceCell<ConnectionManager>>,
    stream: Option<String>,
    prefix: String,
    max_len: Option<usize>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("stream", &self.stream)
            .field("prefix", &self.prefix)
            .field("max_len", &self.max_len)
            .field("connected", &self.conn.initialized())
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher on `client` (see [`client`](super::client)).
    pub fn new(client: redis::Client) -> Self {
        Publisher {
            client,
            conn: Arc::new(OnceCell::new()),
            stream: None,
            prefix: String::new(),
            max_len: None,
        }
    }

    /// A fixed stream instead of the topic.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// The stream is `{prefix}{topic}` (default no prefix); ignored with a
    /// fixed [`stream`](Self::stream).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Trims the stream to about `n` entries on every write (`MAXLEN ~
    /// n`; default no trimming). Entries not yet consumed are trimmed
    /// too: see the [module documentation](super#stream-length).
    pub fn max_len(mut self, n: usize) -> Self {
        self.max_len = Some(n.max(1));
        self
    }

    /// The stream a message of `topic` is written to.
    pub fn stream_of(&self, topic: &str) -> String {
        match &self.stream {
            Some(s) => s.clone(),
            None => format!("{}{topic}", self.prefix),
        }
    }

    /// Writes one message and returns its entry id, once Redis answered.
    pub async fn publish(
        &self,
        topic: &str,
        msg_id: &str,
        payload: &[u8],
    ) -> Result<String, Error> {
        self.send(topic, msg_id, payload, None, &Headers::new())
            .await
    }

    /// Writes one message with its ordering key and headers (see
    /// [`Publisher`]); its entry id, once Redis answered.
    async fn send(
        &self,
        topic: &str,
        msg_id: &str,
        payload: &[u8],
        ordering_key: Option<&str>,
        user: &Headers,
    ) -> Result<String, Error> {
        if msg_id.is_empty() {
            return Err(Error::InvalidMessage {
                topic: topic.to_owned(),
                msg_id: String::new(),
                reason: "empty msg_id: the consumer could not key it".to_owned(),
            });
        }
        let conn = self
            .conn
            .get_or_try_init(|| manager(&self.client, Some(Duration::from_secs(5))))
            .await?;
        let names: Vec<String> = user
            .keys()
            .map(|name| format!("{HEADER_FIELD_PREFIX}{name}"))
            .collect();
        let fields = entry_fields(topic, msg_id, payload, ordering_key, user, &names);
        commands::add(
            &mut conn.clone(),
            &self.stream_of(topic),
            self.max_len,
            &fields,
        )
        .await
        .map_err(|e| from_redis("XADD", e))
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
        "redis"
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
        .map(|_id| ())
    }
}

/// An entry's fields: idem's own, then each header under its field name
/// in `names` (`h.<name>`, in the headers' order).
fn entry_fields<'a>(
    topic: &'a str,
    msg_id: &'a str,
    payload: &'a [u8],
    ordering_key: Option<&'a str>,
    user: &'a Headers,
    names: &'a [String],
) -> Vec<(&'a str, &'a [u8])> {
    let mut fields: Vec<(&str, &[u8])> = vec![
        (MSG_ID_FIELD, msg_id.as_bytes()),
        (PAYLOAD_FIELD, payload),
        (TOPIC_FIELD, topic.as_bytes()),
        (CONTENT_TYPE_FIELD, b"application/json"),
    ];
    if let Some(key) = ordering_key {
        fields.push((ORDERING_KEY_FIELD, key.as_bytes()));
    }
    for (name, value) in names.iter().zip(user.values()) {
        fields.push((name.as_str(), value.as_bytes()));
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_prefixed_fields_after_idems() {
        let user: Headers = [("msg_id", "forged"), ("tenant", "acme")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let names: Vec<String> = user.keys().map(|n| format!("h.{n}")).collect();
        let f = entry_fields("orders", "m-1", b"{}", Some("k-1"), &user, &names);
        let f: Vec<(&str, &str)> = f
            .iter()
            .map(|(n, v)| (*n, std::str::from_utf8(v).unwrap()))
            .collect();
        assert_eq!(
            f,
            [
                ("msg_id", "m-1"),
                ("payload", "{}"),
                ("topic", "orders"),
                ("content_type", "application/json"),
                ("ordering_key", "k-1"),
                ("h.msg_id", "forged"),
                ("h.tenant", "acme"),
            ]
        );
    }
}
