//! The [`Consumer`] builder.

use super::channel::ConfirmChannel;
use super::fields::short;
use super::message::Message;
use super::worker::{Shared, Start, run};
use super::{Connector, ConsumerHandle};
use idem_core::backoff::Backoff;
use idem_core::consume::{self, Handling};
use idem_core::task::TaskHandle;
use idem_core::{Error, Outcome};
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Consumes a queue and runs an `#[idempotent]` handler for each delivery;
/// see the [module documentation](super) for the settlement rules.
///
/// The payload is parsed from the body as JSON into the handler's payload
/// type. Settings: prefetch (in-flight deliveries, default 16), attempts
/// (default 5), back-off (default 1 s doubling to 60 s).
///
/// ```no_run
/// use idem_runtime::amqp::{self, Consumer, Message};
/// use idem_runtime::{idempotent, Outcome};
/// use sqlx::{Sqlite, Transaction};
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Notice { user_id: i64 }
///
/// #[idempotent(key = "mq:{m.queue}:{m.message_id}", strategy = record, biz_type = "notice", fingerprint = [n])]
/// async fn notify(tx: &mut Transaction<'_, Sqlite>, m: &Message, n: &Notice) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO sent (user_id) VALUES (?)").bind(n.user_id).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
/// let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// amqp::Topology::new("notices").declare(&conn).await?;
/// let consumer = Consumer::new(conn, "notices", move |m: Message, n: Notice| {
///     let pool = pool.clone();
///     async move { notify(&pool, &m, &n).await }
/// })
/// .prefetch(8)
/// .max_attempts(4)
/// .backoff(std::time::Duration::from_millis(500), std::time::Duration::from_secs(30))
/// .spawn()
/// .await?;
/// // … on SIGTERM: stop consuming, finish in-flight deliveries, close.
/// consumer.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Consumer {
    connection: Connector,
    queue: String,
    retry_queue: String,
    consumer_tag: String,
    handling: Handling<Message>,
    prefetch: u16,
    max_attempts: u32,
    backoff: Backoff,
    outage_retry: Duration,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.queue)
            .field("retry_queue", &self.retry_queue)
            .field("consumer_tag", &self.consumer_tag)
            .field("subscribers", &self.handling.names())
            .field("prefetch", &self.prefetch)
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("outage_retry", &self.outage_retry)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer of `queue` running `handler(message, payload)` for each
    /// delivery. The handler returns what an `#[idempotent]` function
    /// returns; clone what it needs (the pool) into each call.
    pub fn new<P, F, Fut, T>(
        connection: impl Into<Connector>,
        queue: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Message, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        Consumer::with(
            connection.into(),
            queue.into(),
            Handling::One(consume::handler(handler)),
        )
    }

    /// A consumer of `queue` whose every delivery goes to **several
    /// handlers** (fan-out), each subscribed with
    /// [`subscribe`](Consumer::subscribe) and acting once in its own scope
    /// (its `biz_type`, state machine or constraint: the subscribers' keys
    /// must not meet).
    ///
    /// The subscribers of a delivery run one after the other, in the order
    /// subscribed, each call in a transaction of its own. The delivery is
    /// acknowledged when every one of them executed or answered
    /// `Duplicate`. If one fails, the others still run, and the delivery
    /// is retried (retry queue, back-off, dead letter, as for one
    /// handler): on the next attempt the subscribers that had acted answer
    /// `Duplicate` and the failed one acts. The recorded reason names the
    /// subscriber. One queue with several handlers, rather than a queue
    /// per handler: a message is settled once, and a failing handler never
    /// re-runs the others' effects.
    ///
    /// ```no_run
    /// use idem_runtime::amqp::{self, Consumer, Message};
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
    /// let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
    /// let (p1, p2) = (pool.clone(), pool.clone());
    /// let consumer = Consumer::fan_out(conn, "orders")
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
    pub fn fan_out(connection: impl Into<Connector>, queue: impl Into<String>) -> Self {
        Consumer::with(
            connection.into(),
            queue.into(),
            Handling::Fanned(Vec::new()),
        )
    }

    /// Subscribes `handler`, named `name`, to every delivery of a
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
        let of = format!("AMQP consumer of queue `{}`", self.queue);
        self.handling
            .subscribe(&of, name.into(), consume::handler(handler));
        self
    }

    fn with(connection: Connector, queue: String, handling: Handling<Message>) -> Self {
        Consumer {
            connection,
            retry_queue: format!("{queue}.retry"),
            queue,
            consumer_tag: String::new(),
            handling,
            prefetch: 16,
            max_attempts: 5,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            outage_retry: consume::OUTAGE_RETRY,
        }
    }

    /// Unacknowledged deliveries at once (`basic.qos`, default 16): the
    /// bound on handlers running concurrently.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// Attempts before a retryable failure is dead-lettered (default 5).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Delay after the first failed attempt, doubling up to `max` (default
    /// 1 s to 60 s).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// The longest pause between two tries of a handler that failed in an
    /// outage (its database down: [`Error::is_outage`]), run again in
    /// place without counting an attempt (default 1 s; the pauses start
    /// at 100 ms and double, jittered). See [`consume::through_outages`].
    pub fn outage_retry(mut self, max: Duration) -> Self {
        self.outage_retry = max.max(Duration::from_millis(1));
        self
    }

    /// The retry queue (default `{queue}.retry`, as [`Topology`](super::Topology) declares).
    pub fn retry_queue(mut self, name: impl Into<String>) -> Self {
        self.retry_queue = name.into();
        self
    }

    /// The consumer tag (default: generated by the broker).
    pub fn consumer_tag(mut self, tag: impl Into<String>) -> Self {
        self.consumer_tag = tag.into();
        self
    }

    /// Opens the channel, sets the prefetch, starts consuming and runs the
    /// consumer as a tokio task. Errors when the queue does not exist or the
    /// broker refuses the consumer.
    pub async fn spawn(self) -> Result<ConsumerHandle, Error> {
        let handler = self
            .handling
            .into_handler(&format!("AMQP consumer of queue `{}`", self.queue))?;
        short("queue", &self.queue)?;
        short("queue", &self.retry_queue)?;
        short("consumer tag", &self.consumer_tag)?;
        let start = Start {
            connector: self.connection.clone(),
            queue: self.queue.clone(),
            tag: self.consumer_tag.clone(),
            prefetch: self.prefetch,
        };
        let connection = self.connection.connection().await?;
        let (channel, consumer) = start.open(&connection).await?;
        let shared = Arc::new(Shared {
            retry: ConfirmChannel::new(self.connection.clone()),
            queue: self.queue,
            retry_queue: self.retry_queue,
            handler,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            outage_retry: self.outage_retry,
            stats: Arc::default(),
        });
        let s = shared.clone();
        let task = TaskHandle::spawn(move |stop| run(s, start, channel, consumer, stop));
        Ok(ConsumerHandle::new(task, shared))
    }
}
