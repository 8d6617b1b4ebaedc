//! Outbox messages written to RocketMQ, each marked published only once
//! the broker answered `SEND_OK`.

use super::error::{self, from_client};
use super::message::{field_text, reserved};
use super::{MSG_ID_PROPERTY, ORDERING_KEY_PROPERTY, TOPIC_PROPERTY};
use idem_core::Backend;
use idem_core::outbox::forward::{self, Forward};
use idem_core::outbox::{Delivery, Headers, OutboxRow};
use idem_core::task::BoxFuture;
use idem_core::{Error, Outcome};
use rocketmq_client_rust::{
    ClientOptions, ClientRuntime, DefaultMQProducer, MessageQueueSelector,
    SelectMessageQueueByHash, SendResult, SendStatus,
};
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::message::MessageQueue;
use serde::de::IgnoredAny;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Writes outbox messages to RocketMQ as a [`Relay`](idem_core::outbox::Relay)
/// route: each message's `msg_id` in the [`MSG_ID_PROPERTY`] property (the
/// consumer's key, the same on every copy) and as its `KEYS` (indexed by
/// the broker: an operator finds it by id), the outbox topic in
/// [`TOPIC_PROPERTY`], the payload as the body. The outbox row is marked
/// published only after the broker stored the message (`SEND_OK`); a send
/// the broker did not answer is an outage, which the relay does not count
/// as an attempt, and a copy written before a lost answer is answered
/// `Duplicate` by the consumer.
///
/// The message's headers ([`OutboxRow::headers`]) become user properties.
/// Idem's own cannot be overwritten: a header named under `IDEM_` (in any
/// case) or like a RocketMQ system property (`KEYS`, `TAGS`, `DELAY`, …)
/// is dropped with a warning; one RocketMQ cannot carry (the separators
/// `\u{1}`, `\u{2}`) is a permanent error. A message with an ordering
/// key is sent to the queue the key's hash selects (so a key's messages
/// share a queue, in order), with the key as its sharding key and in
/// [`ORDERING_KEY_PROPERTY`](crate::ORDERING_KEY_PROPERTY). See
/// [headers and ordering keys](crate#headers-and-ordering-keys).
///
/// ```no_run
/// use idem_runtime::rocketmq::Publisher;
/// use idem_runtime::outbox::Relay;
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
/// let publisher = Publisher::connect("127.0.0.1:9876").await?;
/// let relay = Relay::new(pool).route("coupon.deduct", publisher.topic("coupon_deduct").route()).spawn();
/// # relay.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    producer: Arc<DefaultMQProducer>,
    topic: Option<String>,
    tag: Option<String>,
    keys_field: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("topic", &self.topic)
            .field("tag", &self.tag)
            .field("keys_field", &self.keys_field)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher through the name server(s) at `namesrv` (`host:port`,
    /// several separated by `;`), in producer group `idem-outbox`, on the
    /// process's [shared client runtime](crate::runtime::shared).
    pub async fn connect(namesrv: impl Into<String>) -> Result<Self, Error> {
        Publisher::connect_with(namesrv, "idem-outbox", None, crate::runtime::shared()?).await
    }

    /// A publisher in producer group `group`, with the client's `options`
    /// (its route and heartbeat intervals, TLS, …; the name server is
    /// `namesrv` whatever they say) on the application's own client
    /// runtime. Its send time-out is 3 s and the client's own send
    /// retries are off: the relay retries.
    pub async fn connect_with(
        namesrv: impl Into<String>,
        group: impl Into<String>,
        options: Option<ClientOptions>,
        runtime: Arc<ClientRuntime>,
    ) -> Result<Self, Error> {
        let timeout = Duration::from_secs(3);
        let producer =
            crate::start_producer(runtime, options, namesrv.into(), group.into(), timeout).await?;
        Ok(Publisher::with_producer(producer))
    }

    /// A publisher on a producer the application made and started.
    pub fn with_producer(producer: DefaultMQProducer) -> Self {
        Publisher {
            producer: Arc::new(producer),
            topic: None,
            tag: None,
            keys_field: None,
            timeout: Duration::from_secs(3),
        }
    }

    /// Publishes every message to this RocketMQ topic instead of its
    /// outbox topic (RocketMQ topic names allow letters, digits, `_`, `-`
    /// and `%`: an outbox topic such as `coupon.deduct` needs one).
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// The tag every message carries (a consumer can subscribe to tags).
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// The message's `KEYS` from a payload field (default: its `msg_id`).
    pub fn keys_field(mut self, name: impl Into<String>) -> Self {
        self.keys_field = Some(name.into());
        self
    }

    /// How long a send waits for the broker's answer (default 3 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(100));
        self
    }

    /// Sends one message and waits for the broker to store it; returns
    /// RocketMQ's message id. The id must not be empty.
    pub async fn publish(
        &self,
        topic: &str,
        msg_id: &str,
        payload: &[u8],
    ) -> Result<String, Error> {
        self.send(topic, msg_id, payload, None, &Headers::new())
            .await
    }

    /// Sends one message with its ordering key and headers (see
    /// [`Publisher`]) and waits for the broker to store it.
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
        let key = self
            .keys_field
            .as_deref()
            .and_then(|f| field_text(payload, f))
            .unwrap_or_else(|| msg_id.to_owned());
        let to = self.topic.as_deref().unwrap_or(topic);
        let properties = properties(topic, msg_id, ordering_key, user)?;
        let message = outgoing(
            to,
            self.tag.as_deref(),
            &key,
            payload,
            &properties,
            ordering_key,
        )?;
        let sent = match ordering_key {
            Some(key) => self.send_to_key(message, key).await,
            None => {
                let timeout = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
                crate::boxed(self.producer.send_with_timeout(message, timeout)).await
            }
        };
        match sent.map_err(|e| from_client("send", e))? {
            Some(r) if r.send_status == SendStatus::SendOk => {
                Ok(r.msg_id.map(|id| id.to_string()).unwrap_or_default())
            }
            Some(r) => Err(error::not_stored(r.send_status)),
            None => Err(error::not_stored("no send result")),
        }
    }

    /// Sends `message` to the queue the hash of `key` selects.
    async fn send_to_key(
        &self,
        message: Message,
        key: &str,
    ) -> rocketmq_client_rust::ClientResult<Option<SendResult>> {
        let timeout = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let select = |queues: &[MessageQueue], m: &Message, key: &String| {
            SelectMessageQueueByHash.select(queues, m, key)
        };
        crate::boxed(self.producer.send_with_selector_timeout(
            message,
            select,
            key.to_owned(),
            timeout,
        ))
        .await
    }

    /// Shuts the producer down (it is shared by every clone of this
    /// publisher: call it once the relays using it stopped).
    pub async fn shutdown(&self) {
        let mut producer = (*self.producer).clone();
        crate::boxed(async move { producer.shutdown().await }).await;
    }

    /// The relay route that forwards each outbox message.
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
        "rocketmq"
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
        .map(|_| ())
    }
}

/// A message's properties: idem's own, then the user's but the
/// [reserved] ones.
fn properties<'a>(
    topic: &'a str,
    msg_id: &'a str,
    ordering_key: Option<&'a str>,
    user: &'a Headers,
) -> Result<Vec<(&'a str, &'a str)>, Error> {
    let mut out = vec![(MSG_ID_PROPERTY, msg_id), (TOPIC_PROPERTY, topic)];
    if let Some(key) = ordering_key {
        out.push((ORDERING_KEY_PROPERTY, key));
    }
    for (name, value) in user {
        if reserved(name) {
            tracing::warn!(header = %name, topic, msg_id, "a header named like idem's or RocketMQ's own property is not carried");
            continue;
        }
        let separator = |s: &str| s.contains(['\u{1}', '\u{2}']);
        if separator(name) || separator(value) {
            return Err(Error::InvalidMessage {
                topic: topic.to_owned(),
                msg_id: msg_id.to_owned(),
                reason: format!(
                    "the header `{}` contains RocketMQ's property separator \\u{{1}} or \\u{{2}}",
                    name.escape_default()
                ),
            });
        }
        out.push((name.as_str(), value.as_str()));
    }
    Ok(out)
}

/// A message to `topic` with `body`, its `KEYS`, a tag, properties and a
/// sharding key.
pub(crate) fn outgoing(
    topic: &str,
    tag: Option<&str>,
    key: &str,
    body: &[u8],
    properties: &[(&str, &str)],
    sharding_key: Option<&str>,
) -> Result<Message, Error> {
    let mut b = Message::builder().topic(topic).body_slice(body).key(key);
    if let Some(t) = tag {
        b = b.tags(t);
    }
    if let Some(k) = sharding_key {
        b = b.sharding_key(k);
    }
    for (k, v) in properties {
        b = b.raw_property(*k, *v).map_err(|e| invalid(topic, e))?;
    }
    b.build().map_err(|e| invalid(topic, e))
}

fn invalid(topic: &str, e: impl fmt::Display) -> Error {
    Error::InvalidMessage {
        topic: topic.to_owned(),
        msg_id: String::new(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idems_properties_win_and_separators_are_refused() {
        let user: Headers = [
            ("tenant", "acme"),
            ("IDEM_MSG_ID", "forged"),
            ("idem_topic", "forged"),
            ("KEYS", "forged"),
            ("DELAY", "3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let p = properties("orders", "m-1", Some("order-42"), &user).unwrap();
        assert_eq!(
            p,
            [
                (MSG_ID_PROPERTY, "m-1"),
                (TOPIC_PROPERTY, "orders"),
                (ORDERING_KEY_PROPERTY, "order-42"),
                ("tenant", "acme"),
            ]
        );
        let m = outgoing("t", None, "k", b"{}", &p, Some("order-42")).unwrap();
        assert_eq!(m.property("tenant"), Some("acme"));
        assert_eq!(m.property("__SHARDINGKEY"), Some("order-42"));
        let bad: Headers = [("a".to_owned(), "x\u{1}y".to_owned())].into();
        let e = properties("orders", "m-1", None, &bad).unwrap_err();
        assert!(matches!(e, Error::InvalidMessage { .. }), "{e}");
    }
}
