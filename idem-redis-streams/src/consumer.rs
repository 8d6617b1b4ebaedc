//! The [`Consumer`] builder, and what only its running handle tells.

use super::ConsumerHandle;
use super::commands::{create_group, manager};
use super::error::from_redis;
use super::message::Message;
use super::shared::Shared;
use super::worker::run;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, Handling};
use idem_core::task::TaskHandle;
use idem_core::{Error, Outcome};
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Where a consumer group created by [`Consumer::spawn`] starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// Every entry the stream holds (`XGROUP CREATE … 0`), the default:
    /// nothing written before the group existed is skipped, and an
    /// entry already handled elsewhere answers `Duplicate`.
    #[default]
    Beginning,
    /// Only entries written after the group was created (`$`).
    New,
}

impl Start {
    fn id(self) -> &'static str {
        match self {
            Start::Beginning => "0",
            Start::New => "$",
        }
    }
}

/// Reads a stream in a consumer group and runs an `#[idempotent]`
/// handler for each entry; see the [module documentation](super) for the
/// settlement rules.
///
/// The payload is parsed from the entry's `payload` field as JSON into
/// the handler's payload type. Settings: handlers at once (default 16),
/// tries of a failing handler (default 5) and their back-off (default
/// 1 s doubling to 60 s), the idle time after which a pending entry is
/// claimed (default 30 s), the dead-letter stream (default
/// `{stream}:dlq`), the consumer's name (default `{hostname}-{pid}`).
///
/// ```no_run
/// use idem_runtime::redis_streams::{self, Consumer, Message, Start};
/// use idem_runtime::{idempotent, Outcome};
/// use sqlx::{Sqlite, Transaction};
/// use std::time::Duration;
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Notice { user_id: i64 }
///
/// #[idempotent(key = "rs:{m.stream}:{m.msg_id}", strategy = record, biz_type = "notice", fingerprint = [n])]
/// async fn notify(tx: &mut Transaction<'_, Sqlite>, m: &Message, n: &Notice) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO sent (user_id) VALUES (?)").bind(n.user_id).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
/// let redis = redis_streams::client("redis://127.0.0.1:6379/")?;
/// let consumer = Consumer::new(redis, "notices", "notify", move |m: Message, n: Notice| {
///     let pool = pool.clone();
///     async move { notify(&pool, &m, &n).await }
/// })
/// .start(Start::New)
/// .max_in_flight(8)
/// .max_attempts(5)
/// .backoff(Duration::from_millis(500), Duration::from_secs(30))
/// .claim_after(Duration::from_secs(60))
/// .spawn()
/// .await?;
/// // … on SIGTERM: stop reading, finish in-flight entries.
/// consumer.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Consumer {
    client: redis::Client,
    stream: String,
    group: String,
    name: String,
    handling: Handling<Message>,
    start: Start,
    key_field: String,
    payload_field: String,
    max_in_flight: usize,
    max_attempts: u32,
    max_deliveries: u32,
    backoff: Backoff,
    claim_after: Duration,
    dead_letter_stream: String,
    outage_retry: Duration,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("name", &self.name)
            .field("subscribers", &self.handling.names())
            .field("start", &self.start)
            .field("key_field", &self.key_field)
            .field("payload_field", &self.payload_field)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_attempts", &self.max_attempts)
            .field("max_deliveries", &self.max_deliveries)
            .field("backoff", &self.backoff)
            .field("claim_after", &self.claim_after)
            .field("dead_letter_stream", &self.dead_letter_stream)
            .field("outage_retry", &self.outage_retry)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer of `stream` in the group `group` running
    /// `handler(message, payload)` for each entry. The handler returns
    /// what an `#[idempotent]` function returns; clone what it needs (the
    /// pool) into each call.
    pub fn new<P, F, Fut, T>(
        client: redis::Client,
        stream: impl Into<String>,
        group: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Message, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        Consumer::with(
            client,
            stream.into(),
            group.into(),
            Handling::One(consume::handler(handler)),
        )
    }

    /// A consumer of `stream` in the group `group` whose every entry goes
    /// to **several handlers** (fan-out), each subscribed with
    /// [`subscribe`](Consumer::subscribe) and acting once in its own scope
    /// (its `biz_type`, state machine or constraint: the subscribers' keys
    /// must not meet).
    ///
    /// The subscribers of an entry run one after the other, in the order
    /// subscribed, each call in a transaction of its own. The entry is
    /// acknowledged when every one of them executed or answered
    /// `Duplicate`. If one fails, the others still run and the entry is
    /// tried again (back-off, `max_attempts`, dead letter, as for one
    /// handler): on that try the subscribers that had acted answer
    /// `Duplicate` and the failed one acts. The recorded reason names the
    /// subscriber.
    ///
    /// ```no_run
    /// use idem_runtime::redis_streams::{self, Consumer, Message};
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
    /// let redis = redis_streams::client("redis://127.0.0.1:6379/")?;
    /// let (p1, p2) = (pool.clone(), pool.clone());
    /// let consumer = Consumer::fan_out(redis, "orders", "order-effects")
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
        client: redis::Client,
        stream: impl Into<String>,
        group: impl Into<String>,
    ) -> Self {
        Consumer::with(
            client,
            stream.into(),
            group.into(),
            Handling::Fanned(Vec::new()),
        )
    }

    /// Subscribes `handler`, named `name`, to every entry of a
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
            "Redis Streams consumer group `{}` of stream `{}`",
            self.group, self.stream
        )
    }

    fn with(
        client: redis::Client,
        stream: String,
        group: String,
        handling: Handling<Message>,
    ) -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "idem".to_owned());
        Consumer {
            client,
            dead_letter_stream: format!("{stream}:dlq"),
            stream,
            group,
            name: format!("{host}-{}", std::process::id()),
            handling,
            start: Start::default(),
            key_field: super::MSG_ID_FIELD.to_owned(),
            payload_field: super::PAYLOAD_FIELD.to_owned(),
            max_in_flight: 16,
            max_attempts: 5,
            max_deliveries: 10,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            claim_after: Duration::from_secs(30),
            outage_retry: consume::OUTAGE_RETRY,
        }
    }

    /// This consumer's name in the group (default `{hostname}-{pid}`;
    /// two consumers of one group in one process need names of their
    /// own). Names need not be stable: a consumer's entries left pending
    /// are claimed by whichever consumer of the group runs `XAUTOCLAIM`
    /// first.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where the group starts when [`spawn`](Self::spawn) creates it
    /// (default [`Start::Beginning`]); a group that exists keeps its
    /// position.
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// The field the message's id (the key) is read from (default
    /// [`MSG_ID_FIELD`](super::MSG_ID_FIELD), what [`Publisher`](super::Publisher) writes).
    pub fn key_field(mut self, name: impl Into<String>) -> Self {
        self.key_field = name.into();
        self
    }

    /// The field the payload is read from (default
    /// [`PAYLOAD_FIELD`](super::PAYLOAD_FIELD)).
    pub fn payload_field(mut self, name: impl Into<String>) -> Self {
        self.payload_field = name.into();
        self
    }

    /// Handlers running at once (default 16); the consumer never reads or
    /// claims more entries than it has free slots for.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Tries of a handler that fails with a retryable error before the
    /// entry is dead-lettered (default 5; at least 1). An outage is no
    /// try.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The times an entry may be handed out (read, then claimed from
    /// consumers that died holding it) before a claim dead-letters it
    /// without running it (default 10; `0`: no bound).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }

    /// The pause after the first failed try, doubling up to `max`
    /// (default 1 s to 60 s).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// How long an entry stays pending, unacknowledged and not kept by
    /// its holder, before a consumer claims it with `XAUTOCLAIM` (default
    /// 30 s; at least 100 ms). Longer than a pause in which a live
    /// consumer cannot reach Redis to keep its entries (their handlers
    /// would then run twice at once; harmless, a `Duplicate`, but work).
    pub fn claim_after(mut self, idle: Duration) -> Self {
        self.claim_after = idle.max(Duration::from_millis(100));
        self
    }

    /// The stream dead letters are written to (default `{stream}:dlq`).
    pub fn dead_letter_stream(mut self, stream: impl Into<String>) -> Self {
        self.dead_letter_stream = stream.into();
        self
    }

    /// The longest pause between two tries of a handler that failed in an
    /// outage (its database down: [`Error::is_outage`]), run again in
    /// place without counting a try (default 1 s; the pauses start at
    /// 100 ms and double, jittered). See [`consume::through_outages`].
    pub fn outage_retry(mut self, max: Duration) -> Self {
        self.outage_retry = max.max(Duration::from_millis(1));
        self
    }

    /// Connects, creates the group if it is missing (`XGROUP CREATE …
    /// MKSTREAM`, from [`start`](Self::start)), and runs the consumer as a
    /// tokio task. Errors when Redis cannot be reached or refuses.
    pub async fn spawn(self) -> Result<ConsumerHandle, Error> {
        let of = self.describe();
        let handler = self.handling.into_handler(&of)?;
        let tick = (self.claim_after / 3).clamp(Duration::from_millis(50), Duration::from_secs(2));
        let mut conn = manager(&self.client, Some(Duration::from_secs(5))).await?;
        let reader = manager(&self.client, Some(tick + Duration::from_secs(5))).await?;
        create_group(&mut conn, &self.stream, &self.group, self.start.id())
            .await
            .map_err(|e| from_redis("XGROUP CREATE", e))?;
        let shared = Arc::new(Shared {
            conn,
            stream: self.stream,
            group: self.group,
            name: self.name,
            handler,
            key_field: self.key_field,
            payload_field: self.payload_field,
            max_attempts: self.max_attempts,
            max_deliveries: self.max_deliveries,
            backoff: self.backoff,
            claim_after: self.claim_after,
            tick,
            max_in_flight: self.max_in_flight,
            dead_letter_stream: self.dead_letter_stream,
            outage_retry: self.outage_retry,
            in_flight: Default::default(),
            claimed: Default::default(),
            stats: Arc::default(),
        });
        let s = shared.clone();
        let task = TaskHandle::spawn(move |stop| run(s, reader, stop));
        Ok(ConsumerHandle(idem_core::consume::ConsumerHandle::new(
            task, shared,
        )))
    }
}

/// What only a Redis Streams consumer's handle tells.
impl ConsumerHandle {
    /// The consumer's name in its group.
    pub fn name(&self) -> &str {
        &self.0.running::<Shared>().name
    }

    /// Entries this consumer claimed with `XAUTOCLAIM` (from consumers
    /// that died, or stopped, holding them).
    pub fn claimed(&self) -> u64 {
        self.0.running::<Shared>().claimed.load(Ordering::Relaxed)
    }

    /// The dead-letter stream.
    pub fn dead_letter_stream(&self) -> &str {
        &self.0.running::<Shared>().dead_letter_stream
    }
}
