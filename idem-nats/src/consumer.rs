//! The [`Consumer`] builder, and what only its running handle tells.

use super::ConsumerHandle;
use super::error::from_consumer;
use super::message::Message;
use super::worker::{Shared, run};
use async_nats::jetstream::Context;
use async_nats::jetstream::consumer::PullConsumer;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, Handling};
use idem_core::task::TaskHandle;
use idem_core::{Error, Outcome};
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Pulls from a durable JetStream consumer and runs an `#[idempotent]`
/// handler for each delivery; see the [module documentation](super) for
/// the settlement rules.
///
/// The payload is parsed from the body as JSON into the handler's payload
/// type. Settings: handlers at once (default 16), back-off of nak'd
/// deliveries (default 1 s doubling to 60 s), in-progress acks (default a
/// third of the consumer's `ack_wait`), the dead-letter subject (default
/// none: terminate only). The bound on deliveries is the consumer's
/// `max_deliver`, read from the server.
///
/// ```no_run
/// use idem_runtime::nats::{self, Consumer, Message, Topology};
/// use idem_runtime::{idempotent, Outcome};
/// use sqlx::{Sqlite, Transaction};
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Notice { user_id: i64 }
///
/// #[idempotent(key = "mq:{m.stream}:{m.message_id}", strategy = record, biz_type = "notice", fingerprint = [n])]
/// async fn notify(tx: &mut Transaction<'_, Sqlite>, m: &Message, n: &Notice) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO sent (user_id) VALUES (?)").bind(n.user_id).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
/// let js = nats::connect("nats://127.0.0.1:4222").await?;
/// let t = Topology::new("NOTICES", "notices.>", "notify");
/// t.declare(&js).await?;
/// let consumer = Consumer::new(js, "NOTICES", "notify", move |m: Message, n: Notice| {
///     let pool = pool.clone();
///     async move { notify(&pool, &m, &n).await }
/// })
/// .max_in_flight(8)
/// .backoff(std::time::Duration::from_millis(500), std::time::Duration::from_secs(30))
/// .dead_letter_subject(&t.dead_letter_subject)
/// .spawn()
/// .await?;
/// // … on SIGTERM: stop pulling, finish in-flight deliveries.
/// consumer.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Consumer {
    js: Context,
    stream: String,
    consumer: String,
    handling: Handling<Message>,
    max_in_flight: usize,
    backoff: Backoff,
    progress: Progress,
    pull_wait: Duration,
    dead_letter_subject: Option<String>,
    outage_retry: Duration,
}

/// How often a running handler's delivery is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// A third of the consumer's `ack_wait`.
    Auto,
    Every(Duration),
    Off,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("stream", &self.stream)
            .field("consumer", &self.consumer)
            .field("subscribers", &self.handling.names())
            .field("max_in_flight", &self.max_in_flight)
            .field("backoff", &self.backoff)
            .field("progress", &self.progress)
            .field("pull_wait", &self.pull_wait)
            .field("dead_letter_subject", &self.dead_letter_subject)
            .field("outage_retry", &self.outage_retry)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer of the durable pull consumer `consumer` on `stream`
    /// running `handler(message, payload)` for each delivery. The handler
    /// returns what an `#[idempotent]` function returns; clone what it
    /// needs (the pool) into each call.
    pub fn new<P, F, Fut, T>(
        js: Context,
        stream: impl Into<String>,
        consumer: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Message, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        Consumer::with(
            js,
            stream.into(),
            consumer.into(),
            Handling::One(consume::handler(handler)),
        )
    }

    /// A consumer of the durable pull consumer `consumer` on `stream`
    /// whose every delivery goes to **several handlers** (fan-out), each
    /// subscribed with [`subscribe`](Consumer::subscribe) and acting once
    /// in its own scope (its `biz_type`, state machine or constraint: the
    /// subscribers' keys must not meet).
    ///
    /// The subscribers of a delivery run one after the other, in the order
    /// subscribed, each call in a transaction of its own (under one
    /// in-progress ack). The delivery is acknowledged when every one of
    /// them executed or answered `Duplicate`. If one fails, the others
    /// still run and the delivery is nak'd for a redelivery (back-off,
    /// `max_deliver`, dead letter, as for one handler): on it the
    /// subscribers that had acted answer `Duplicate` and the failed one
    /// acts. The recorded reason names the subscriber.
    ///
    /// ```no_run
    /// use idem_runtime::nats::{self, Consumer, Message};
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
    /// let js = nats::connect("nats://127.0.0.1:4222").await?;
    /// let (p1, p2) = (pool.clone(), pool.clone());
    /// let consumer = Consumer::fan_out(js, "ORDERS", "order-effects")
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
    pub fn fan_out(js: Context, stream: impl Into<String>, consumer: impl Into<String>) -> Self {
        Consumer::with(
            js,
            stream.into(),
            consumer.into(),
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
        let of = self.describe();
        self.handling
            .subscribe(&of, name.into(), consume::handler(handler));
        self
    }

    fn describe(&self) -> String {
        format!(
            "NATS consumer `{}` of stream `{}`",
            self.consumer, self.stream
        )
    }

    fn with(js: Context, stream: String, consumer: String, handling: Handling<Message>) -> Self {
        Consumer {
            js,
            stream,
            consumer,
            handling,
            max_in_flight: 16,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            progress: Progress::Auto,
            pull_wait: Duration::from_secs(2),
            dead_letter_subject: None,
            outage_retry: consume::OUTAGE_RETRY,
        }
    }

    /// Handlers running at once (default 16); the consumer never pulls
    /// more deliveries than it has free slots for.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// The nak delay after the first failed attempt, doubling up to `max`
    /// (default 1 s to 60 s).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// Sends an in-progress ack (`+WPI`) every `every` while a handler
    /// runs, so a slow handler's delivery is not handed to another
    /// consumer when `ack_wait` runs out (default: a third of the
    /// consumer's `ack_wait`). `None` turns them off.
    pub fn progress_every(mut self, every: Option<Duration>) -> Self {
        self.progress = match every {
            Some(d) if !d.is_zero() => Progress::Every(d),
            _ => Progress::Off,
        };
        self
    }

    /// The longest pause between two tries of a handler that failed in an
    /// outage (its database down: [`Error::is_outage`]), run again in
    /// place, the delivery kept with in-progress acks, without a nak that
    /// the server would count against `max_deliver` (default 1 s; the
    /// pauses start at 100 ms and double, jittered). With in-progress acks
    /// turned off ([`progress_every`](Self::progress_every)`(None)`), an
    /// outage longer than `ack_wait` costs deliveries. See
    /// [`consume::through_outages`].
    pub fn outage_retry(mut self, max: Duration) -> Self {
        self.outage_retry = max.max(Duration::from_millis(1));
        self
    }

    /// How long one pull request waits for messages before it is made
    /// again (default 2 s). A pull request lost with its server (a leader
    /// killed) costs at most this plus 5 s.
    pub fn pull_wait(mut self, wait: Duration) -> Self {
        self.pull_wait = wait.max(Duration::from_millis(100));
        self
    }

    /// Where a dead letter is copied (published and stored, as
    /// [`Topology`](super::Topology)'s `dead_letter_subject`) before the
    /// delivery is terminated (default: none; terminate only).
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    /// Looks the consumer up (its `ack_wait` and `max_deliver`) and runs
    /// it as a tokio task. Errors when the stream or consumer does not
    /// exist, or the server does not answer.
    pub async fn spawn(self) -> Result<ConsumerHandle, Error> {
        let of = self.describe();
        let handler = self.handling.into_handler(&of)?;
        let pull: PullConsumer = self
            .js
            .get_consumer_from_stream(&self.consumer, &self.stream)
            .await
            .map_err(|e| from_consumer("consumer info", e))?;
        let config = &pull.cached_info().config;
        let progress = match self.progress {
            Progress::Auto if !config.ack_wait.is_zero() => Some(config.ack_wait / 3),
            Progress::Auto | Progress::Off => None,
            Progress::Every(d) => Some(d),
        };
        let shared = Arc::new(Shared {
            js: self.js,
            stream: self.stream,
            consumer: self.consumer,
            handler,
            max_deliver: u32::try_from(config.max_deliver).unwrap_or(0),
            backoff: self.backoff,
            progress,
            pull_wait: self.pull_wait,
            max_in_flight: self.max_in_flight,
            dead_letter_subject: self.dead_letter_subject,
            outage_retry: self.outage_retry,
            stats: Arc::default(),
        });
        let s = shared.clone();
        let task = TaskHandle::spawn(move |stop| run(s, pull, stop));
        Ok(ConsumerHandle(idem_core::consume::ConsumerHandle::new(
            task, shared,
        )))
    }
}

/// What only a NATS consumer's handle tells.
impl ConsumerHandle {
    /// The bound on deliveries read from the server (`0`: unbounded).
    pub fn max_deliver(&self) -> u32 {
        self.0.running::<Shared>().max_deliver
    }

    /// The in-progress ack interval in use (`None`: off).
    pub fn progress_every(&self) -> Option<Duration> {
        self.0.running::<Shared>().progress
    }
}
