//! The [`Consumer`] builder.

use super::ConsumerHandle;
use super::context::Ctx;
use super::error;
use super::message::{KeyFrom, Message};
use super::shared::Shared;
use super::worker::run;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats, Handling, Running};
use idem_core::task::TaskHandle;
use idem_core::{Error, Outcome};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::producer::FutureProducer;
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A member of a Kafka consumer group running an `#[idempotent]` handler
/// for each record of a topic; see the [crate documentation](crate) for
/// the settlement rules.
///
/// The payload is parsed from the record's value as JSON into the
/// handler's payload type. Settings: handlers at once across partitions
/// (default 16; one at a time per partition, in offset order), where
/// the message id comes from (default the [`MSG_ID_HEADER`](crate::MSG_ID_HEADER)
/// header), attempts (default 5), back-off (1 s doubling to 60 s), the
/// retry topic (default `{topic}.retry`) and the dead-letter topic
/// (default `{topic}.dlt`), the offset commit interval (default 1 s).
/// Any librdkafka property can be set ([`set`](Consumer::set)).
///
/// ```no_run
/// use idem_runtime::kafka::{Consumer, Message, Topology};
/// use idem_runtime::idempotent;
/// use sqlx::{Sqlite, Transaction};
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Notice { user_id: i64 }
///
/// #[idempotent(key = "kafka:{m.topic}:{m.msg_id}", strategy = record, biz_type = "notice", fingerprint = [n])]
/// async fn notify(tx: &mut Transaction<'_, Sqlite>, m: &Message, n: &Notice) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO sent (user_id) VALUES (?)").bind(n.user_id).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
/// Topology::new("notices").partitions(6).declare("127.0.0.1:9092").await?;
/// let consumer = Consumer::new("127.0.0.1:9092", "notifier", "notices", move |m: Message, n: Notice| {
///     let pool = pool.clone();
///     async move { notify(&pool, &m, &n).await }
/// })
/// .max_in_flight(8)
/// .backoff(std::time::Duration::from_millis(500), std::time::Duration::from_secs(30))
/// .spawn()
/// .await?;
/// // … on SIGTERM: stop reading, finish the records in hand, commit.
/// consumer.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Consumer {
    brokers: String,
    group: String,
    topic: String,
    handling: Handling<Message>,
    key_from: KeyFrom,
    max_in_flight: usize,
    buffer: usize,
    max_attempts: u32,
    backoff: Backoff,
    retry_topic: Option<String>,
    dead_letter_topic: String,
    commit_interval: Duration,
    outage_retry: Duration,
    send_timeout: Duration,
    consumer_config: Vec<(String, String)>,
    producer_config: Vec<(String, String)>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("brokers", &self.brokers)
            .field("group", &self.group)
            .field("topic", &self.topic)
            .field("subscribers", &self.handling.names())
            .field("key_from", &self.key_from)
            .field("max_in_flight", &self.max_in_flight)
            .field("buffer", &self.buffer)
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("retry_topic", &self.retry_topic)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("commit_interval", &self.commit_interval)
            .field("outage_retry", &self.outage_retry)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A member of consumer group `group` on `brokers` (`host:port`, or
    /// several separated by commas) running `handler(message, payload)`
    /// for each record of `topic`. The handler returns what an
    /// `#[idempotent]` function returns; clone what it needs (the pool)
    /// into each call.
    pub fn new<P, F, Fut, T>(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Message, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        Consumer::with(
            brokers.into(),
            group.into(),
            topic.into(),
            Handling::One(consume::handler(handler)),
        )
    }

    /// A member of consumer group `group` whose every record goes to
    /// **several handlers** (fan-out), each subscribed with
    /// [`subscribe`](Consumer::subscribe) and acting once in its own
    /// scope (its `biz_type`, state machine or constraint: the
    /// subscribers' keys must not meet).
    ///
    /// The subscribers of a record run one after the other, in the order
    /// subscribed, each call in a transaction of its own. The record's
    /// offset is stored when every one of them executed or answered
    /// `Duplicate`. If one fails, the others still run and the record goes
    /// to the retry topic (back-off, attempts, dead letter, as for one
    /// handler): on its retry the subscribers that had acted answer
    /// `Duplicate` and the failed one acts.
    ///
    /// ```no_run
    /// use idem_runtime::kafka::{Consumer, Message};
    /// use idem_runtime::idempotent;
    /// use sqlx::{Sqlite, Transaction};
    ///
    /// #[derive(serde::Deserialize, serde::Serialize)]
    /// struct Order { id: i64 }
    ///
    /// #[idempotent(key = "stock:{o.id}", strategy = record, biz_type = "reserve_stock")]
    /// async fn reserve_stock(tx: &mut Transaction<'_, Sqlite>, o: &Order) -> Result<(), sqlx::Error> { Ok(()) }
    /// #[idempotent(key = "mail:{o.id}", strategy = record, biz_type = "order_mail")]
    /// async fn send_email(tx: &mut Transaction<'_, Sqlite>, o: &Order) -> Result<(), sqlx::Error> { Ok(()) }
    ///
    /// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
    /// let (p1, p2) = (pool.clone(), pool.clone());
    /// let consumer = Consumer::fan_out("127.0.0.1:9092", "order-effects", "orders")
    ///     .subscribe("reserve_stock", move |_m: Message, o: Order| {
    ///         let pool = p1.clone();
    ///         async move { reserve_stock(&pool, &o).await }
    ///     })
    ///     .subscribe("send_email", move |_m: Message, o: Order| {
    ///         let pool = p2.clone();
    ///         async move { send_email(&pool, &o).await }
    ///     })
    ///     .spawn()
    ///     .await?;
    /// # consumer.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn fan_out(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
    ) -> Self {
        Consumer::with(
            brokers.into(),
            group.into(),
            topic.into(),
            Handling::Fanned(Vec::new()),
        )
    }

    /// Subscribes `handler`, named `name`, to every record of a
    /// [`fan_out`](Consumer::fan_out) consumer.
    ///
    /// # Panics
    /// On a consumer built by [`new`](Consumer::new) (its one handler
    /// would silently be joined by another), or when a subscriber of that
    /// `name` exists already.
    pub fn subscribe<P, F, Fut, T>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Message, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let of = self.describe();
        self.handling
            .subscribe(&of, name.into(), consume::handler(handler));
        self
    }

    fn describe(&self) -> String {
        format!(
            "Kafka consumer of group `{}` on topic `{}`",
            self.group, self.topic
        )
    }

    fn with(brokers: String, group: String, topic: String, handling: Handling<Message>) -> Self {
        Consumer {
            retry_topic: Some(format!("{topic}.retry")),
            dead_letter_topic: format!("{topic}.dlt"),
            brokers,
            group,
            topic,
            handling,
            key_from: KeyFrom::default(),
            max_in_flight: 16,
            buffer: 8 << 20,
            max_attempts: 5,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            commit_interval: Duration::from_secs(1),
            outage_retry: consume::OUTAGE_RETRY,
            send_timeout: Duration::from_secs(10),
            consumer_config: Vec::new(),
            producer_config: Vec::new(),
        }
    }

    /// Where each record's message id, and so its key, comes from
    /// (default: the [`MSG_ID_HEADER`](crate::MSG_ID_HEADER) header, set
    /// by idem's [`Publisher`](crate::Publisher)). A record without one
    /// is dead-lettered before any handler runs.
    pub fn key_from(mut self, from: KeyFrom) -> Self {
        self.key_from = from;
        self
    }

    /// Handlers running at once, across partitions (default 16). Within a
    /// partition records run one at a time, in offset order.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Bytes of records (values, keys and headers, plus 256 per record) a
    /// partition may have read ahead of its handler before the consumer
    /// pauses fetching it, so that a slow partition holds back only
    /// itself (default 8 MiB; fetching resumes when a quarter is left).
    ///
    /// A pause makes librdkafka drop what it had fetched of the partition
    /// and fetch it again on the resume, up to `max.partition.fetch.bytes`
    /// (1 MiB by default): keep the buffer well above that. With a bound
    /// of 512 records instead, a backlog of small records was fetched
    /// again on every pause: `bench_kafka` ran at 0.56 of a plain consumer
    /// on 5,000 records per partition.
    pub fn buffer(mut self, bytes: usize) -> Self {
        self.buffer = bytes.max(1024);
        self
    }

    /// Attempts of a record whose handler fails with a retryable error,
    /// the first included (default 5): the last failure is a dead letter.
    /// `0`: no bound. An outage (the database down) is no attempt.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The delay before a failed record's next attempt, `base` after the
    /// first doubling up to `max` (default 1 s to 60 s).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// The topic a failed record is copied to for its next attempt
    /// (default `{topic}.retry`; the consumer reads it too), so that it
    /// does not hold back its partition.
    pub fn retry_topic(mut self, topic: impl Into<String>) -> Self {
        self.retry_topic = Some(topic.into());
        self
    }

    /// No retry topic: a failed record runs again in place after its
    /// back-off, holding back the records behind it in its partition
    /// (strict per-partition order, at the cost of a stalled partition
    /// while a record fails).
    pub fn retry_in_place(mut self) -> Self {
        self.retry_topic = None;
        self
    }

    /// The topic a dead letter is copied to, with its reason (default
    /// `{topic}.dlt`).
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = topic.into();
        self
    }

    /// How often the offsets of settled records are committed (default
    /// 1 s; and when the consumer stops or a partition is revoked). A
    /// crash loses at most this much of commits: the records are read
    /// again and their handlers answer `Duplicate`.
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.commit_interval = every.max(Duration::from_millis(10));
        self
    }

    /// The longest pause between two tries of a handler that failed in an
    /// outage (its database down), run again in place without counting
    /// an attempt (default 1 s; the pauses start at 100 ms and double).
    /// See [`consume::through_outages`].
    pub fn outage_retry(mut self, max: Duration) -> Self {
        self.outage_retry = max.max(Duration::from_millis(1));
        self
    }

    /// Sets a librdkafka property of the consumer
    /// (`session.timeout.ms`, `security.protocol`, …). Those the
    /// settlement rules rest on (`enable.auto.offset.store`, `group.id`)
    /// cannot be set.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.consumer_config.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka property of the producer that writes retry
    /// copies and dead letters.
    pub fn producer_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_config.push((key.into(), value.into()));
        self
    }

    fn consumer_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        for (k, v) in &self.consumer_config {
            c.set(k, v);
        }
        // The settlement rules: an offset is stored only once its record
        // is settled, and librdkafka commits what is stored.
        let interval = self.commit_interval.as_millis().to_string();
        c.set("group.id", &self.group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", interval)
            .set("enable.auto.offset.store", "false");
        c
    }

    /// Joins the group and runs the consumer as a tokio task. Errors when
    /// the configuration is refused, or no handler was subscribed.
    pub async fn spawn(self) -> Result<ConsumerHandle, Error> {
        let of = self.describe();
        if self.retry_topic.as_deref() == Some(self.topic.as_str())
            || self.dead_letter_topic == self.topic
        {
            return Err(Error::Config {
                reason: format!("{of}: the retry and dead-letter topics must not be the topic"),
            });
        }
        let config = self.consumer_config();
        let handler = self.handling.into_handler(&of)?;
        let consumer: StreamConsumer<Ctx> = config
            .create_with_context(Ctx::default())
            .map_err(error::config)?;
        let mut topics = vec![self.topic.as_str()];
        topics.extend(self.retry_topic.as_deref());
        consumer.subscribe(&topics).map_err(error::config)?;
        let producer: FutureProducer =
            crate::producer_config(&self.brokers, &self.producer_config, self.send_timeout)
                .create()
                .map_err(error::config)?;
        let stats = Arc::<ConsumerStats>::default();
        let info = Arc::new(Info {
            topic: self.topic.clone(),
            group: self.group.clone(),
            retry_topic: self.retry_topic.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
            stats: stats.clone(),
        });
        let shared = Arc::new(Shared {
            consumer,
            producer,
            topic: self.topic,
            group: self.group,
            retry_topic: self.retry_topic,
            dead_letter_topic: self.dead_letter_topic,
            key_from: self.key_from,
            handler,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            outage_retry: self.outage_retry,
            send_timeout: self.send_timeout,
            slots: Arc::new(Semaphore::new(self.max_in_flight)),
            buffer: self.buffer,
            stats,
        });
        let task = TaskHandle::spawn(move |stop| run(shared, stop));
        Ok(ConsumerHandle(consume::ConsumerHandle::new(task, info)))
    }
}

/// What a running consumer's handle knows of it.
pub(super) struct Info {
    pub(super) topic: String,
    pub(super) group: String,
    pub(super) retry_topic: Option<String>,
    pub(super) dead_letter_topic: String,
    pub(super) stats: Arc<ConsumerStats>,
}

impl Running for Info {
    fn stats(&self) -> &Arc<ConsumerStats> {
        &self.stats
    }

    fn describe(&self, f: &mut fmt::DebugStruct<'_, '_>) {
        f.field("topic", &self.topic)
            .field("group", &self.group)
            .field("retry_topic", &self.retry_topic)
            .field("dead_letter_topic", &self.dead_letter_topic);
    }
}
