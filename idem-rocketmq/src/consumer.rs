//! The [`Consumer`] builder.

use super::ConsumerHandle;
use super::error;
use super::message::{KeyFrom, Message};
use super::shared::Shared;
use super::worker::run;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats, Handling, Running};
use idem_core::task::TaskHandle;
use idem_core::{Error, Outcome};
use rocketmq_client_rust::{ClientOptions, ClientRuntime, DefaultLitePullConsumer};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A member of a RocketMQ consumer group running an `#[idempotent]`
/// handler for each message of a topic; see the [crate
/// documentation](crate) for the settlement rules.
///
/// The payload is parsed from the message's body as JSON into the
/// handler's payload type. Settings: handlers at once across queues
/// (default 16; one at a time per queue, in offset order), where the
/// message id comes from (default the outbox id, else RocketMQ's message
/// id), attempts (default 16, RocketMQ's own `maxReconsumeTimes`),
/// back-off (1 s doubling to 60 s), the dead-letter topic (default
/// `%DLQ%{group}`), the offset commit interval (default 1 s).
///
/// ```no_run
/// use idem_runtime::rocketmq::{Consumer, Message};
/// use idem_runtime::idempotent;
/// use sqlx::{Sqlite, Transaction};
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Notice { user_id: i64 }
///
/// #[idempotent(key = "rocketmq:{m.topic}:{m.msg_id}", strategy = record, biz_type = "notice", fingerprint = [n])]
/// async fn notify(tx: &mut Transaction<'_, Sqlite>, m: &Message, n: &Notice) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO sent (user_id) VALUES (?)").bind(n.user_id).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
/// let consumer = Consumer::new("127.0.0.1:9876", "notifier", "notices", move |m: Message, n: Notice| {
///     let pool = pool.clone();
///     async move { notify(&pool, &m, &n).await }
/// })
/// .max_in_flight(8)
/// .spawn()
/// .await?;
/// // … on SIGTERM: stop reading, finish the messages in hand, commit.
/// consumer.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Consumer {
    namesrv: String,
    group: String,
    topic: String,
    tags: String,
    handling: Handling<Message>,
    key_from: KeyFrom,
    max_in_flight: usize,
    buffer: usize,
    max_attempts: u32,
    backoff: Backoff,
    dead_letter_topic: String,
    commit_interval: Duration,
    outage_retry: Duration,
    send_timeout: Duration,
    runtime: Option<Arc<ClientRuntime>>,
    options: Option<ClientOptions>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("namesrv", &self.namesrv)
            .field("group", &self.group)
            .field("topic", &self.topic)
            .field("tags", &self.tags)
            .field("subscribers", &self.handling.names())
            .field("key_from", &self.key_from)
            .field("max_in_flight", &self.max_in_flight)
            .field("buffer", &self.buffer)
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("commit_interval", &self.commit_interval)
            .field("outage_retry", &self.outage_retry)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A member of consumer group `group`, through the name server(s) at
    /// `namesrv` (`host:port`, several separated by `;`), running
    /// `handler(message, payload)` for each message of `topic`. The
    /// handler returns what an `#[idempotent]` function returns; clone
    /// what it needs (the pool) into each call.
    pub fn new<P, F, Fut, T>(
        namesrv: impl Into<String>,
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
            namesrv.into(),
            group.into(),
            topic.into(),
            Handling::One(consume::handler(handler)),
        )
    }

    /// A member of consumer group `group` whose every message goes to
    /// **several handlers** (fan-out), each subscribed with
    /// [`subscribe`](Consumer::subscribe) and acting once in its own
    /// scope (its `biz_type`, state machine or constraint: the
    /// subscribers' keys must not meet).
    ///
    /// The subscribers of a message run one after the other, in the order
    /// subscribed, each in a transaction of its own; the message's offset
    /// is committed when every one of them executed or answered
    /// `Duplicate`. If one fails, the others still run and the message
    /// runs again after its back-off: the subscribers that had acted
    /// answer `Duplicate` and the failed one acts.
    ///
    /// ```no_run
    /// use idem_runtime::rocketmq::{Consumer, Message};
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
    /// let consumer = Consumer::fan_out("127.0.0.1:9876", "order-effects", "orders")
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
        namesrv: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
    ) -> Self {
        Consumer::with(
            namesrv.into(),
            group.into(),
            topic.into(),
            Handling::Fanned(Vec::new()),
        )
    }

    /// Subscribes `handler`, named `name`, to every message of a
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
            "RocketMQ consumer of group `{}` on topic `{}`",
            self.group, self.topic
        )
    }

    fn with(namesrv: String, group: String, topic: String, handling: Handling<Message>) -> Self {
        Consumer {
            dead_letter_topic: format!("%DLQ%{group}"),
            namesrv,
            group,
            topic,
            tags: "*".to_owned(),
            handling,
            key_from: KeyFrom::default(),
            max_in_flight: 16,
            buffer: 1024,
            max_attempts: 16,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            commit_interval: Duration::from_secs(1),
            outage_retry: consume::OUTAGE_RETRY,
            send_timeout: Duration::from_secs(3),
            runtime: None,
            options: None,
        }
    }

    /// Only the messages with these tags (RocketMQ's subscription
    /// expression, such as `"paid || refunded"`; default `*`, all).
    pub fn tags(mut self, expression: impl Into<String>) -> Self {
        self.tags = expression.into();
        self
    }

    /// Where each message's id, and so its key, comes from (default:
    /// [`KeyFrom::msg_id`]). A message without one is dead-lettered
    /// before any handler runs.
    pub fn key_from(mut self, from: KeyFrom) -> Self {
        self.key_from = from;
        self
    }

    /// Handlers running at once, across queues (default 16). Within a
    /// queue messages run one at a time, in offset order.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Messages a queue may have read ahead of its handler before the
    /// consumer pauses pulling it, so that a slow queue holds back only
    /// itself (default 1,024; pulling resumes when a quarter is left).
    pub fn buffer(mut self, messages: usize) -> Self {
        self.buffer = messages.max(4);
        self
    }

    /// Attempts of a message whose handler fails with a retryable error,
    /// the first included (default 16, RocketMQ's `maxReconsumeTimes`):
    /// the last failure is a dead letter. `0`: no bound. An outage (the
    /// database down) is no attempt.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The delay before a failed message's next attempt, `base` after the
    /// first doubling up to `max` (default 1 s to 60 s).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// The topic a dead letter is written to, with its reason (default
    /// `%DLQ%{group}`, RocketMQ's own dead-letter topic of the group).
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = topic.into();
        self
    }

    /// How often the offsets of settled messages are committed to the
    /// broker (default 1 s; and when the consumer stops). A crash loses
    /// at most this much of commits: the messages are read again and
    /// their handlers answer `Duplicate`.
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.commit_interval = every.max(Duration::from_millis(10));
        self
    }

    /// The longest pause between two tries of a handler that failed in an
    /// outage (its database down), run again in place without counting
    /// an attempt (default 1 s). See [`consume::through_outages`].
    pub fn outage_retry(mut self, max: Duration) -> Self {
        self.outage_retry = max.max(Duration::from_millis(1));
        self
    }

    /// Runs the consumer's RocketMQ clients on the application's own
    /// client runtime (default: [`runtime::shared`](crate::runtime::shared)).
    pub fn client_runtime(mut self, runtime: Arc<ClientRuntime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The RocketMQ clients' options (route and heartbeat intervals, TLS,
    /// …; the name server is the consumer's whatever they say), for the
    /// consumer and its dead-letter producer. RocketMQ's defaults refresh
    /// a topic's route from the name server every 30 s: a consumer learns
    /// of a dead or restarted master that late.
    pub fn client_options(mut self, options: ClientOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// Joins the group and runs the consumer as a tokio task. Errors when
    /// the configuration is refused, the name server cannot be reached,
    /// or no handler was subscribed.
    pub async fn spawn(self) -> Result<ConsumerHandle, Error> {
        let of = self.describe();
        if self.dead_letter_topic == self.topic {
            return Err(Error::Config {
                reason: format!("{of}: the dead-letter topic must not be the topic"),
            });
        }
        let handler = self.handling.into_handler(&of)?;
        let runtime = match self.runtime {
            Some(r) => r,
            None => crate::runtime::shared()?,
        };
        let mut builder = DefaultLitePullConsumer::builder(runtime.clone());
        if let Some(o) = self.options.clone() {
            builder = builder.client_options(o);
        }
        let consumer = builder
            .consumer_group(self.group.clone())
            .name_server_addr(self.namesrv.clone())
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .auto_commit(false)
            .poll_timeout_millis(200)
            // A pull parked at the broker holds a shutdown for its whole
            // suspension (20 s by default): 2 s.
            .broker_suspend_max_time_millis(2000)
            .consumer_timeout_millis_when_suspend(5000)
            .build()
            .map_err(|e| error::config("consumer configuration", e))?;
        crate::boxed(consumer.subscribe_with_expression(&self.topic, &self.tags))
            .await
            .map_err(|e| error::config("subscribe", e))?;
        crate::boxed(consumer.start())
            .await
            .map_err(|e| error::from_client("consumer start", e))?;
        let group = format!("{}-dlq", self.group);
        let producer = crate::start_producer(
            runtime,
            self.options,
            self.namesrv,
            group,
            self.send_timeout,
        )
        .await?;
        let stats = Arc::<ConsumerStats>::default();
        let info = Arc::new(Info {
            topic: self.topic.clone(),
            group: self.group.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
            stats: stats.clone(),
        });
        let shared = Arc::new(Shared {
            consumer,
            producer,
            topic: self.topic,
            group: self.group,
            dead_letter_topic: self.dead_letter_topic,
            key_from: self.key_from,
            handler,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            outage_retry: self.outage_retry,
            send_timeout: self.send_timeout,
            commit_interval: self.commit_interval,
            slots: Arc::new(Semaphore::new(self.max_in_flight)),
            buffer: self.buffer,
            settled: Default::default(),
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
            .field("dead_letter_topic", &self.dead_letter_topic);
    }
}
