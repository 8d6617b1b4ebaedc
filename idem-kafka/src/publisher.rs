//! Outbox messages written to Kafka by the idempotent producer, each
//! confirmed by the broker.

use super::error::{self, from_kafka};
use super::message::reserved;
use super::{MSG_ID_HEADER, ORDERING_KEY_HEADER, TOPIC_HEADER};
use idem_core::Backend;
use idem_core::outbox::forward::{self, Forward};
use idem_core::outbox::{Delivery, Headers, OutboxRow};
use idem_core::task::BoxFuture;
use idem_core::{Error, Outcome};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;
use serde::de::IgnoredAny;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Publishes outbox messages to Kafka: the relay as a producer.
///
/// The producer is librdkafka's idempotent producer
/// (`enable.idempotence=true`, `acks=all`): its own retries of a send
/// (a lost response, a leader moving) never store a second copy, and the
/// records of one partition keep their order. Each message is written to
/// the topic = its outbox topic (or a fixed [`topic`](Publisher::topic))
/// with:
///
/// - the record key: the message's ordering key when it has one (so a
///   key's messages go to one partition, in order), else from the
///   message (default its `msg_id`; name the entity with
///   [`key_field`](Publisher::key_field) or
///   [`key_with`](Publisher::key_with) so that one entity's messages go
///   to one partition, in order);
/// - the headers [`MSG_ID_HEADER`] (the outbox `msg_id`: the consumer's
///   key, the same on every copy), [`TOPIC_HEADER`],
///   `content-type: application/json` and, with an ordering key,
///   [`ORDERING_KEY_HEADER`](crate::ORDERING_KEY_HEADER); then the
///   message's own headers ([`OutboxRow::headers`]), but any named under
///   `Idem-` or `content-type` (in any case), which are dropped with a
///   warning: idem's own cannot be overwritten (see
///   [headers and ordering keys](crate#headers-and-ordering-keys)).
///
/// It returns only after the broker acknowledged the write (from every
/// in-sync replica). As a [`Relay`](idem_core::outbox::Relay) route
/// ([`Publisher::route`]) it answers `Ok(Outcome::Executed(()))` then, and
/// the relay marks the outbox message `success`. An acknowledgement lost
/// after the broker stored the record (a time-out, a relay that dies
/// before marking the row) makes the relay publish it again: a second
/// copy with the same `msg_id`, which the consumer's handler answers
/// `Duplicate`. No broker answering within the send time-out (default
/// 10 s) is an [outage](idem_core::Error::is_outage), which the relay
/// does not count against `max_attempts`; a record the broker can never
/// take (too large, not authorized) is a permanent error.
///
/// ```no_run
/// use idem_runtime::kafka::{Publisher, Topology};
/// use idem_runtime::outbox::{enqueue, Relay};
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// Topology::new("orders").partitions(6).declare("127.0.0.1:9092").await?;
///
/// let mut tx = pool.begin().await?;
/// // … the business change …
/// enqueue(&mut tx, "orders", "order-7-paid", &serde_json::json!({ "order_id": 7 })).await?;
/// tx.commit().await?;
///
/// // One order's messages in one partition, in order.
/// let publisher = Publisher::new("127.0.0.1:9092")?.key_field("order_id");
/// let relay = Relay::new(pool).route("orders", publisher.route()).spawn();
/// # relay.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    producer: Arc<RwLock<FutureProducer>>,
    brokers: String,
    config: Arc<Vec<(String, String)>>,
    topic: Option<String>,
    key: RecordKey,
    timeout: Duration,
}

/// A function naming a message's record key.
type KeyFn = Arc<dyn Fn(&OutboxRow) -> Option<String> + Send + Sync>;

/// Where a record's key comes from.
#[derive(Clone)]
enum RecordKey {
    MsgId,
    Field(String),
    With(KeyFn),
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = match &self.key {
            RecordKey::MsgId => "msg_id".to_owned(),
            RecordKey::Field(name) => format!("payload field `{name}`"),
            RecordKey::With(_) => "a function".to_owned(),
        };
        f.debug_struct("Publisher")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("key", &key)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher on `brokers` (`host:port`, or several separated by
    /// commas). Errors when librdkafka refuses the configuration.
    pub fn new(brokers: impl Into<String>) -> Result<Self, Error> {
        Publisher::with_config(brokers, std::iter::empty::<(String, String)>())
    }

    /// A publisher with librdkafka properties of its own
    /// (`security.protocol`, `linger.ms`, `message.timeout.ms`, …). The
    /// idempotent producer's `enable.idempotence` and `acks` cannot be
    /// changed.
    pub fn with_config<K: Into<String>, V: Into<String>>(
        brokers: impl Into<String>,
        config: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, Error> {
        let brokers = brokers.into();
        let config: Vec<(String, String)> = config
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let timeout = Duration::from_secs(10);
        let producer = crate::producer_config(&brokers, &config, timeout)
            .create()
            .map_err(error::config)?;
        Ok(Publisher {
            producer: Arc::new(RwLock::new(producer)),
            brokers,
            config: Arc::new(config),
            topic: None,
            key: RecordKey::MsgId,
            timeout,
        })
    }

    /// A fixed topic instead of the outbox topic.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// The record key from a field of the JSON payload (a top-level name,
    /// or a JSON pointer such as `"/order/id"`; a string or a number):
    /// the entity the message is about, so that its messages share a
    /// partition and keep their order. A payload without it is sent with
    /// its `msg_id` as the key.
    pub fn key_field(mut self, name: impl Into<String>) -> Self {
        self.key = RecordKey::Field(name.into());
        self
    }

    /// The record key from the outbox message, by `f` (`None`: its
    /// `msg_id`).
    pub fn key_with(
        mut self,
        f: impl Fn(&OutboxRow) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = RecordKey::With(Arc::new(f));
        self
    }

    /// How long a send may wait for the broker's acknowledgement before
    /// it is an outage (default 10 s): librdkafka's `message.timeout.ms`,
    /// unless [`with_config`](Publisher::with_config) set that.
    ///
    /// # Errors
    /// When librdkafka refuses the configuration.
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, Error> {
        self.timeout = timeout.max(Duration::from_millis(100));
        let producer = crate::producer_config(&self.brokers, &self.config, self.timeout)
            .create()
            .map_err(error::config)?;
        self.producer = Arc::new(RwLock::new(producer));
        Ok(self)
    }

    /// Writes one record and waits for the broker's acknowledgement;
    /// answers the partition and offset it was stored at.
    pub async fn publish(
        &self,
        topic: &str,
        msg_id: &str,
        key: Option<&str>,
        payload: &[u8],
    ) -> Result<(i32, i64), Error> {
        let headers = record_headers(topic, msg_id, None, &Headers::new());
        self.send(topic, msg_id, key, payload, headers).await
    }

    /// Writes one record with `headers` (see [`record_headers`]) and waits
    /// for the broker's acknowledgement.
    async fn send(
        &self,
        topic: &str,
        msg_id: &str,
        key: Option<&str>,
        payload: &[u8],
        headers: OwnedHeaders,
    ) -> Result<(i32, i64), Error> {
        if msg_id.is_empty() {
            return Err(Error::InvalidMessage {
                topic: topic.to_owned(),
                msg_id: String::new(),
                reason: "empty msg_id: the consumer could not key it".to_owned(),
            });
        }
        let to = self.topic.as_deref().unwrap_or(topic);
        let record = FutureRecord::to(to)
            .payload(payload)
            .key(key.unwrap_or(msg_id))
            .headers(headers);
        let producer = self.producer();
        match producer.send(record, Timeout::After(self.timeout)).await {
            Ok(delivery) => Ok((delivery.partition, delivery.offset)),
            Err((e, _)) => Err(self.failed(&producer, e)),
        }
    }

    fn producer(&self) -> FutureProducer {
        self.producer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `e` as an [`Error`]; a producer that failed fatally (its
    /// idempotence broken: a sequence the broker refused) is replaced,
    /// and the send is retryable.
    fn failed(&self, producer: &FutureProducer, e: rdkafka::error::KafkaError) -> Error {
        if let Some((code, reason)) = producer.client().fatal_error() {
            tracing::error!(?code, %reason, "Kafka producer failed fatally; making a new one");
            if let Ok(fresh) =
                crate::producer_config(&self.brokers, &self.config, self.timeout).create()
            {
                *self.producer.write().unwrap_or_else(|p| p.into_inner()) = fresh;
            }
            return Error::broker(
                "kafka",
                format!("producer failed fatally ({code:?}): {reason}"),
                true,
            );
        }
        from_kafka("publish", e)
    }

    /// The record key of `message`.
    fn key_of(&self, message: &OutboxRow) -> Option<String> {
        match &self.key {
            RecordKey::MsgId => None,
            RecordKey::Field(name) => crate::message::KeyFrom::field(name.clone()).id_of(
                &[],
                message.payload.as_bytes(),
                0,
                0,
            ),
            RecordKey::With(f) => f(message),
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
        "kafka"
    }

    async fn forward(&self, message: &OutboxRow) -> Result<(), Error> {
        let key = match &message.ordering_key {
            Some(key) => Some(key.clone()),
            None => self.key_of(message),
        };
        let ordering_key = message.ordering_key.as_deref();
        let headers = record_headers(
            &message.topic,
            &message.msg_id,
            ordering_key,
            &message.headers,
        );
        self.send(
            &message.topic,
            &message.msg_id,
            key.as_deref(),
            message.payload.as_bytes(),
            headers,
        )
        .await
        .map(|_| ())
    }
}

/// A record's headers: idem's own first, then the user's but the
/// [reserved] ones.
fn record_headers(
    topic: &str,
    msg_id: &str,
    ordering_key: Option<&str>,
    user: &Headers,
) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(4 + user.len())
        .insert(Header {
            key: MSG_ID_HEADER,
            value: Some(msg_id),
        })
        .insert(Header {
            key: TOPIC_HEADER,
            value: Some(topic),
        })
        .insert(Header {
            key: "content-type",
            value: Some("application/json"),
        });
    if let Some(key) = ordering_key {
        headers = headers.insert(Header {
            key: ORDERING_KEY_HEADER,
            value: Some(key),
        });
    }
    for (name, value) in user {
        if reserved(name) {
            tracing::warn!(header = %name, topic, msg_id, "a header named like idem's own is not carried");
            continue;
        }
        headers = headers.insert(Header {
            key: name.as_str(),
            value: Some(value.as_str()),
        });
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers as _;

    #[test]
    fn idems_headers_come_first_and_reserved_user_ones_are_dropped() {
        let user: Headers = [
            ("tenant", "acme"),
            ("Idem-Msg-Id", "forged"),
            ("idem-topic", "forged"),
            ("Content-Type", "text/plain"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let h = record_headers("orders", "m-1", Some("order-42"), &user);
        let all: Vec<(String, String)> = h
            .iter()
            .map(|h| {
                let v = String::from_utf8(h.value.unwrap_or_default().to_vec()).unwrap();
                (h.key.to_owned(), v)
            })
            .collect();
        let expect = [
            (MSG_ID_HEADER, "m-1"),
            (TOPIC_HEADER, "orders"),
            ("content-type", "application/json"),
            (ORDERING_KEY_HEADER, "order-42"),
            ("tenant", "acme"),
        ];
        let expect: Vec<(String, String)> = expect
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(all, expect);
        assert_eq!(record_headers("t", "m", None, &Headers::new()).count(), 3);
    }
}
