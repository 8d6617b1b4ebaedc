//! RabbitMQ (AMQP 0-9-1) at both ends of an idempotent link: a [`Consumer`]
//! that runs an `#[idempotent]` handler for each delivery, and a
//! [`Publisher`] that forwards outbox messages to an exchange as a
//! [`Relay`](crate::outbox::Relay) route.
//!
//! The pieces compose into the article's MQ consumption link
//! ("msgId + topic as idempotent key"):
//!
//! ```text
//! producer tx ──enqueue──▶ idem_outbox ──Relay + Publisher──▶ exchange ──▶ queue ──Consumer──▶ #[idempotent] handler
//!  (business change and         (message_id = outbox msg_id,             (ack only after the handler
//!   message commit together)     persistent, publisher confirm)           committed or answered Duplicate)
//! ```
//!
//! Every hop is at-least-once, so every hop can duplicate: a lost publisher
//! confirm republishes, a consumer that dies before its ack gets the
//! message redelivered. The AMQP `message_id` is the outbox `msg_id`, stable
//! across all of these, so the consumer's key `"{queue}:{message_id}"`
//! ([`Message::key`]) is stable too and the handler answers `Duplicate`.
//!
//! # Consumer settlement
//!
//! | handler result | what the consumer does |
//! |---|---|
//! | `Ok(Executed)`, `Ok(Duplicate)` | `basic.ack` |
//! | retryable `Err`, attempts left | republish to the retry queue with a per-message TTL (back-off) and `x-idem-attempts`, then ack; the TTL dead-letters it back to the main queue |
//! | retryable `Err`, last attempt | `basic.reject(requeue=false)`: the broker routes it to the queue's dead-letter exchange |
//! | non-retryable `Err`, unparsable payload, no `message_id` | `basic.reject(requeue=false)`: dead-letter exchange |
//! | the consumer dies before settling | the broker redelivers (`redelivered = true`); the handler answers `Duplicate` if it had committed |
//!
//! [`Topology::declare`] creates the queues and exchanges this needs.
//!
//! # Retries: a delay queue, not `nack(requeue=true)`
//!
//! A plain requeue redelivers at once, to the head of the queue, without
//! counting: a failing message spins. Instead a failed attempt is
//! republished (publisher-confirmed, `mandatory`) to the retry queue with
//! `expiration` = the back-off (`base · 2^(attempt-1)`, capped) and
//! `x-idem-attempts` = the attempts failed so far; only then is the
//! original acked. The retry queue has no consumer; its
//! `x-dead-letter-exchange` (the default exchange) with
//! `x-dead-letter-routing-key` = the queue sends the copy back when the TTL
//! expires. The original routing key and exchange travel in
//! `x-idem-routing-key` / `x-idem-exchange`, so [`Message`] shows them
//! unchanged. At `max_attempts` the delivery is rejected to the
//! dead-letter exchange (it keeps `x-idem-attempts` = `max_attempts - 1`,
//! the broker adds `x-death` with reason `rejected`).
//!
//! Limits, by design: a classic queue expires messages only at its head,
//! so a short delay queued behind a long one waits for it (at most the
//! back-off cap). If the republish fails (retry queue missing, broker
//! refusing), the delivery is requeued in place after the delay without
//! advancing its count. A process that crashes *while* handling a message
//! gets it redelivered without a count either; bound that with a quorum
//! queue's `x-delivery-limit`. If the ack after a successful republish is
//! lost, both copies reach the handler, which is idempotent: one effect.
//!
//! # Example
//!
//! ```no_run
//! use idem_runtime::amqp::{self, Consumer, Message, Publisher, Topology};
//! use idem_runtime::outbox::Relay;
//! use idem_runtime::{idempotent, Outcome, State};
//! use sqlx::{Sqlite, SqlitePool, Transaction};
//!
//! #[derive(Clone, Copy, State)]
//! enum CouponState { Unused, Used }
//!
//! #[derive(serde::Deserialize)]
//! struct Deduct { coupon_id: i64 }
//!
//! #[idempotent(
//!     key = "mq:{m.queue}:{m.message_id}",
//!     strategy = state_machine,
//!     table = "coupon", id = d.coupon_id,
//!     from = CouponState::Unused, to = CouponState::Used,
//! )]
//! async fn deduct(tx: &mut Transaction<'_, Sqlite>, m: &Message, d: &Deduct) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)").bind(d.coupon_id).execute(&mut **tx).await?;
//!     Ok(())
//! }
//!
//! # async fn run(pool: SqlitePool) -> Result<(), idem_runtime::Error> {
//! let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! Topology::new("coupon.deduct").bind("orders", "coupon.deduct").declare(&conn).await?;
//!
//! // Producer side: the relay forwards outbox messages to the exchange.
//! let relay = Relay::new(pool.clone())
//!     .route("coupon.deduct", Publisher::new(conn.clone(), "orders").route())
//!     .spawn();
//!
//! // Consumer side: one idempotent handler call per delivery.
//! let p = pool.clone();
//! let consumer = Consumer::new(conn.clone(), "coupon.deduct", move |m: Message, d: Deduct| {
//!     let pool = p.clone();
//!     async move { deduct(&pool, &m, &d).await }
//! })
//! .prefetch(32)
//! .spawn()
//! .await?;
//! // …
//! consumer.shutdown().await?;
//! relay.shutdown().await;
//! # Ok(()) }
//! ```

/// The AMQP client this module is built on, re-exported so its types
/// (`Connection`, `BasicProperties`, options) match the ones used here.
pub use lapin;

use crate::backend::Backend;
use crate::outbox::Delivery;
use crate::{Error, Outcome};
use futures_util::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use serde::de::{DeserializeOwned, IgnoredAny};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

/// The header counting the failed attempts before this delivery (set on
/// each republish to the retry queue).
pub const ATTEMPTS_HEADER: &str = "x-idem-attempts";
/// The header keeping the original routing key across the retry queue.
pub const ROUTING_KEY_HEADER: &str = "x-idem-routing-key";
/// The header keeping the original exchange across the retry queue.
pub const EXCHANGE_HEADER: &str = "x-idem-exchange";
/// The header carrying the outbox topic of a message sent by [`Publisher`].
pub const TOPIC_HEADER: &str = "x-idem-topic";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Handler =
    Arc<dyn Fn(Message) -> Result<BoxFuture<Result<bool, Error>>, serde_json::Error> + Send + Sync>;

// ---- errors -----------------------------------------------------------------

/// A failed AMQP operation, as the source of an [`Error`].
#[derive(Debug)]
struct AmqpError {
    op: &'static str,
    source: lapin::Error,
}

impl fmt::Display for AmqpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AMQP {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for AmqpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Maps a lapin error to idem's [`Error`]: retryable when the connection
/// or channel failed (I/O, missed heartbeats, closed channel, broker
/// shutdown, a missing queue or exchange that a deployment may still
/// create), permanent when retrying cannot help (access refused,
/// `PRECONDITION_FAILED` — a declaration with other arguments —, message
/// too large, protocol or authentication errors).
pub fn from_lapin(op: &'static str, e: lapin::Error) -> Error {
    let permanent = match e.kind() {
        ErrorKind::ProtocolError(p) => match p.kind() {
            AMQPErrorKind::Soft(s) => matches!(
                s,
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::PRECONDITIONFAILED
                    | AMQPSoftError::CONTENTTOOLARGE
            ),
            AMQPErrorKind::Hard(h) => matches!(
                h,
                AMQPHardError::INVALIDPATH
                    | AMQPHardError::SYNTAXERROR
                    | AMQPHardError::COMMANDINVALID
                    | AMQPHardError::NOTALLOWED
                    | AMQPHardError::NOTIMPLEMENTED
            ),
        },
        ErrorKind::InvalidProtocolVersion(_)
        | ErrorKind::ParsingError(_)
        | ErrorKind::SerialisationError(_)
        | ErrorKind::AuthProviderError(_)
        | ErrorKind::NoDefaultRuntime
        | ErrorKind::FutureCompleted => true,
        _ => false,
    };
    let err = AmqpError { op, source: e };
    if permanent {
        Error::permanent(err)
    } else {
        Error::retryable(err)
    }
}

/// An AMQP short string (at most 255 bytes), or a permanent error.
fn short(what: &str, s: &str) -> Result<ShortString, Error> {
    ShortString::try_new(s).map_err(|e| {
        Error::permanent(format!(
            "{what} `{s:.64}…` is not an AMQP short string: {e}"
        ))
    })
}

/// Connects to a broker (`amqp://user:pass@host:5672/%2f`) on the current
/// tokio runtime. The connection closes when the last `Arc` is dropped.
pub async fn connect(uri: &str) -> Result<Arc<Connection>, Error> {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .map(Arc::new)
        .map_err(|e| from_lapin("connect", e))
}

// ---- a channel in confirm mode, reopened after a failure ---------------------

/// A publishing channel in confirm mode, opened lazily and reopened when it
/// was closed (a channel-level error such as publishing to a missing
/// exchange closes it).
struct ConfirmChannel {
    connection: Arc<Connection>,
    channel: Mutex<Option<Channel>>,
}

impl ConfirmChannel {
    fn new(connection: Arc<Connection>) -> Self {
        ConfirmChannel {
            connection,
            channel: Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<Channel, Error> {
        let mut slot = self.channel.lock().await;
        if let Some(ch) = slot.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let ch = self
            .connection
            .create_channel()
            .await
            .map_err(|e| from_lapin("channel.open", e))?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| from_lapin("confirm.select", e))?;
        *slot = Some(ch.clone());
        Ok(ch)
    }

    /// Publishes and waits for the broker's confirm. `Ok` only when the
    /// broker acknowledged the message and (with `mandatory`) routed it to
    /// at least one queue.
    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), Error> {
        let ex = short("exchange", exchange)?;
        let rk = short("routing key", routing_key)?;
        let ch = self.get().await?;
        let confirm = ch
            .basic_publish(
                ex,
                rk,
                BasicPublishOptions {
                    mandatory,
                    immediate: false,
                },
                body,
                properties,
            )
            .await
            .map_err(|e| from_lapin("basic.publish", e))?
            .await
            .map_err(|e| from_lapin("publisher confirm", e))?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(Error::retryable(format!(
                "unroutable: exchange `{exchange}` has no queue bound for routing key `{routing_key}` ({} {})",
                returned.reply_code, returned.reply_text
            ))),
            Confirmation::Nack(_) => Err(Error::retryable(format!(
                "the broker refused the message (publisher nack) on exchange `{exchange}`"
            ))),
            Confirmation::NotRequested => Err(Error::retryable(
                "publisher confirms are not enabled on the channel",
            )),
        }
    }

    async fn close(&self) {
        if let Some(ch) = self.channel.lock().await.take()
            && ch.status().connected()
        {
            let _ = ch.close(200, "OK".into()).await;
        }
    }
}

// ---- topology ---------------------------------------------------------------

/// The queues and exchanges of one consumed queue: the queue itself (its
/// rejected messages dead-letter to `dead_letter_exchange`), a retry queue
/// whose expired messages dead-letter back to the queue, and a
/// dead-letter exchange with its dead-letter queue. All durable.
///
/// Declaring is idempotent: the same declaration twice is a no-op, from
/// any number of processes. A queue that already exists with *other*
/// arguments (for example declared earlier without a dead-letter exchange)
/// makes the broker answer `PRECONDITION_FAILED`, a permanent [`Error`]:
/// delete it, or set the dead-letter exchange through a policy.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::amqp::{self, Topology};
/// let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let t = Topology::new("coupon.deduct").bind("orders", "coupon.deduct");
/// assert_eq!(t.retry_queue, "coupon.deduct.retry");
/// assert_eq!(t.dead_letter_queue, "coupon.deduct.dlq");
/// t.declare(&conn).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The consumed queue.
    pub queue: String,
    /// Where failed attempts wait for their back-off (`{queue}.retry`).
    pub retry_queue: String,
    /// The queue's dead-letter exchange (`{queue}.dlx`, direct).
    pub dead_letter_exchange: String,
    /// The queue that keeps dead letters (`{queue}.dlq`), bound to the
    /// dead-letter exchange with its own name as routing key.
    pub dead_letter_queue: String,
    /// `(exchange, routing key)` bindings of the queue; each exchange is
    /// declared durable, of type `topic`.
    pub bindings: Vec<(String, String)>,
}

impl Topology {
    /// The topology of `queue`, with the default names.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Topology {
            retry_queue: format!("{queue}.retry"),
            dead_letter_exchange: format!("{queue}.dlx"),
            dead_letter_queue: format!("{queue}.dlq"),
            queue,
            bindings: Vec::new(),
        }
    }

    /// Binds the queue to `exchange` (declared durable, type `topic`) with
    /// `routing_key`.
    pub fn bind(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.bindings.push((exchange.into(), routing_key.into()));
        self
    }

    /// Declares everything on a channel of its own, then closes it.
    pub async fn declare(&self, connection: &Connection) -> Result<(), Error> {
        let ch = connection
            .create_channel()
            .await
            .map_err(|e| from_lapin("channel.open", e))?;
        let result = self.declare_on(&ch).await;
        if ch.status().connected() {
            let _ = ch.close(200, "OK".into()).await;
        }
        result
    }

    async fn declare_on(&self, ch: &Channel) -> Result<(), Error> {
        let durable_exchange = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let queue = short("queue", &self.queue)?;
        let retry = short("queue", &self.retry_queue)?;
        let dlx = short("exchange", &self.dead_letter_exchange)?;
        let dlq = short("queue", &self.dead_letter_queue)?;

        ch.exchange_declare(
            dlx.clone(),
            lapin::ExchangeKind::Direct,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .map_err(|e| from_lapin("exchange.declare (dead-letter exchange)", e))?;
        ch.queue_declare(
            dlq.clone(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| from_lapin("queue.declare (dead-letter queue)", e))?;
        ch.queue_bind(
            dlq.clone(),
            dlx.clone(),
            dlq.clone(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| from_lapin("queue.bind (dead-letter queue)", e))?;

        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            long(&self.dead_letter_exchange),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            long(&self.dead_letter_queue),
        );
        ch.queue_declare(queue.clone(), QueueDeclareOptions::durable(), args)
            .await
            .map_err(|e| from_lapin("queue.declare", e))?;

        // Expired retries go back through the default exchange, which
        // routes by queue name.
        let mut args = FieldTable::default();
        args.insert("x-dead-letter-exchange".into(), long(""));
        args.insert("x-dead-letter-routing-key".into(), long(&self.queue));
        ch.queue_declare(retry, QueueDeclareOptions::durable(), args)
            .await
            .map_err(|e| from_lapin("queue.declare (retry queue)", e))?;

        for (exchange, routing_key) in &self.bindings {
            let ex = short("exchange", exchange)?;
            ch.exchange_declare(
                ex.clone(),
                lapin::ExchangeKind::Topic,
                durable_exchange,
                FieldTable::default(),
            )
            .await
            .map_err(|e| from_lapin("exchange.declare", e))?;
            ch.queue_bind(
                queue.clone(),
                ex,
                short("routing key", routing_key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| from_lapin("queue.bind", e))?;
        }
        Ok(())
    }
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

// ---- consumer -----------------------------------------------------------------

/// One delivery, as the handler sees it. Its fields can be used in a key
/// template: `key = "mq:{m.queue}:{m.message_id}"`.
///
/// It serializes as its identity (`queue`, `message_id`) only, so a
/// `record` handler's default fingerprint stays the same across
/// redeliveries and retries (which change `redelivered`, `attempt` and the
/// properties).
#[derive(Debug, Clone)]
pub struct Message {
    /// The queue it was consumed from.
    pub queue: String,
    /// The AMQP `message_id` property (never empty: a delivery without one
    /// is dead-lettered before any handler runs).
    pub message_id: String,
    /// The routing key it was published with (kept across the retry
    /// queue).
    pub routing_key: String,
    /// The exchange it was published to (kept across the retry queue).
    pub exchange: String,
    /// The broker's redelivered flag: an earlier delivery of this copy was
    /// not acknowledged (a consumer died, or its channel closed).
    pub redelivered: bool,
    /// This attempt, from 1; retries through the retry queue increment it.
    pub attempt: u32,
    /// The payload.
    pub body: Vec<u8>,
    /// All AMQP properties, headers included.
    pub properties: BasicProperties,
}

impl Message {
    /// The idempotency key material: `"{queue}:{message_id}"`, what the
    /// template `"{m.queue}:{m.message_id}"` derives.
    pub fn key(&self) -> String {
        format!("{}:{}", self.queue, self.message_id)
    }
}

impl serde::Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Message", 2)?;
        st.serialize_field("queue", &self.queue)?;
        st.serialize_field("message_id", &self.message_id)?;
        st.end()
    }
}

/// Counters of one consumer, since it started.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Deliveries received.
    pub received: AtomicU64,
    /// Acknowledged after the handler executed the action.
    pub executed: AtomicU64,
    /// Acknowledged after the handler answered `Duplicate`.
    pub duplicates: AtomicU64,
    /// Failed attempts requeued for a retry (through the retry queue, or
    /// requeued in place when the retry queue could not take them).
    pub retried: AtomicU64,
    /// Rejected to the dead-letter exchange: non-retryable, unparsable,
    /// without `message_id`, or out of attempts.
    pub dead_lettered: AtomicU64,
    /// Deliveries whose ack/nack/reject could not be sent (channel or
    /// connection gone): the broker redelivers them.
    pub settle_failed: AtomicU64,
}

impl ConsumerStats {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Consumes a queue and runs an `#[idempotent]` handler for each delivery;
/// see the [module documentation](self) for the settlement rules.
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
    connection: Arc<Connection>,
    queue: String,
    retry_queue: String,
    consumer_tag: String,
    handler: Handler,
    prefetch: u16,
    max_attempts: u32,
    backoff_base: Duration,
    backoff_max: Duration,
}

impl Consumer {
    /// A consumer of `queue` running `handler(message, payload)` for each
    /// delivery. The handler returns what an `#[idempotent]` function
    /// returns; clone what it needs (the pool) into each call.
    pub fn new<P, F, Fut, T>(
        connection: Arc<Connection>,
        queue: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Message, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let queue = queue.into();
        let handler: Handler = Arc::new(move |m: Message| {
            let payload: P = serde_json::from_slice(&m.body)?;
            let fut = handler(m, payload);
            Ok(Box::pin(async move { fut.await.map(|o| o.is_executed()) }) as BoxFuture<_>)
        });
        Consumer {
            connection,
            retry_queue: format!("{queue}.retry"),
            queue,
            consumer_tag: String::new(),
            handler,
            prefetch: 16,
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
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
        self.backoff_base = base;
        self.backoff_max = max.max(base);
        self
    }

    /// The retry queue (default `{queue}.retry`, as [`Topology`] declares).
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
        let queue = short("queue", &self.queue)?;
        short("queue", &self.retry_queue)?;
        let tag = short("consumer tag", &self.consumer_tag)?;
        let channel = self
            .connection
            .create_channel()
            .await
            .map_err(|e| from_lapin("channel.open", e))?;
        let started = async {
            channel
                .basic_qos(self.prefetch, BasicQosOptions::default())
                .await
                .map_err(|e| from_lapin("basic.qos", e))?;
            channel
                .basic_consume(
                    queue,
                    tag,
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| from_lapin("basic.consume", e))
        }
        .await;
        let consumer = match started {
            Ok(c) => c,
            Err(e) => {
                if channel.status().connected() {
                    let _ = channel.close(200, "OK".into()).await;
                }
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            retry: ConfirmChannel::new(self.connection.clone()),
            queue: self.queue,
            retry_queue: self.retry_queue,
            handler: self.handler,
            max_attempts: self.max_attempts,
            backoff_base: self.backoff_base,
            backoff_max: self.backoff_max,
            stats: Arc::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(shared.clone(), channel, consumer, stopped));
        Ok(ConsumerHandle { stop, task, shared })
    }
}

/// A running [`Consumer`]. Dropping it stops the consumer as
/// [`ConsumerHandle::shutdown`] does, without waiting.
#[must_use = "dropping the handle stops the consumer"]
pub struct ConsumerHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), Error>>,
    shared: Arc<Shared>,
}

impl ConsumerHandle {
    /// The consumer's counters (still readable after
    /// [`shutdown`](ConsumerHandle::shutdown), where they are final).
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.shared.stats.clone()
    }

    /// Whether the consumer stopped (shut down, or its channel failed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Graceful shutdown: cancels the subscription (no new deliveries),
    /// waits for the handlers in flight and their acknowledgements, then
    /// closes the consumer's channels (the broker requeues anything
    /// prefetched but not started). The connection stays open. An error if
    /// the consumer had stopped because its channel or connection failed.
    pub async fn shutdown(self) -> Result<(), Error> {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(Error::retryable(format!("consumer task failed: {e}"))),
        }
    }
}

struct Shared {
    queue: String,
    retry_queue: String,
    handler: Handler,
    retry: ConfirmChannel,
    max_attempts: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    stats: Arc<ConsumerStats>,
}

async fn run(
    shared: Arc<Shared>,
    channel: Channel,
    mut consumer: lapin::Consumer,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut tasks = JoinSet::new();
    let mut failure = None;
    loop {
        tokio::select! {
            biased;
            // A stop request, or the handle was dropped.
            _ = stop.changed() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    let s = shared.clone();
                    tasks.spawn(async move { s.process(delivery).await });
                }
                Some(Err(e)) => {
                    tracing::warn!(queue = %shared.queue, error = %e, "AMQP consumer failed; stopping");
                    failure = Some(from_lapin("basic.consume", e));
                    break;
                }
                // Cancelled by the broker (the queue was deleted).
                None => break,
            },
        }
    }
    if channel.status().connected() {
        let _ = channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
            .await;
    }
    // In-flight handlers finish and settle their deliveries.
    while tasks.join_next().await.is_some() {}
    if channel.status().connected() {
        let _ = channel.close(200, "OK".into()).await;
    }
    shared.retry.close().await;
    failure.map_or(Ok(()), Err)
}

enum Verdict {
    Done { executed: bool },
    Retry(String),
    Dead(String),
}

impl Shared {
    async fn process(&self, d: AmqpDelivery) {
        ConsumerStats::bump(&self.stats.received);
        let failed_before = header_u32(&d.properties, ATTEMPTS_HEADER).unwrap_or(0);
        let attempt = failed_before.saturating_add(1);
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .filter(|s| !s.is_empty());
        let span = tracing::info_span!(
            "amqp_delivery",
            queue = %self.queue,
            message_id = message_id.as_deref().unwrap_or(""),
            attempt,
            redelivered = d.redelivered,
        );
        async move {
            let verdict = match message_id {
                None => Verdict::Dead(
                    "no message_id property: the delivery cannot be made idempotent".into(),
                ),
                Some(message_id) => self.handle(&d, message_id, attempt).await,
            };
            self.settle(d, verdict, attempt).await;
        }
        .instrument(span)
        .await
    }

    async fn handle(&self, d: &AmqpDelivery, message_id: String, attempt: u32) -> Verdict {
        let message = Message {
            queue: self.queue.clone(),
            message_id,
            routing_key: header_str(&d.properties, ROUTING_KEY_HEADER)
                .unwrap_or_else(|| d.routing_key.to_string()),
            exchange: header_str(&d.properties, EXCHANGE_HEADER)
                .unwrap_or_else(|| d.exchange.to_string()),
            redelivered: d.redelivered,
            attempt,
            body: d.data.clone(),
            properties: d.properties.clone(),
        };
        let fut = match (self.handler)(message) {
            Ok(fut) => fut,
            Err(e) => return Verdict::Dead(format!("unparsable payload: {e}")),
        };
        // A panicking handler is a failed attempt, not a dead consumer.
        match tokio::spawn(fut).await {
            Ok(Ok(executed)) => Verdict::Done { executed },
            Ok(Err(e)) if e.is_retryable() => Verdict::Retry(format!("{}: {e}", e.kind())),
            Ok(Err(e)) => Verdict::Dead(format!("{}: {e}", e.kind())),
            Err(join) => Verdict::Retry(format!("handler panicked: {join}")),
        }
    }

    async fn settle(&self, d: AmqpDelivery, verdict: Verdict, attempt: u32) {
        let stats = &self.stats;
        match verdict {
            Verdict::Done { executed } => match d.acker.ack(BasicAckOptions::default()).await {
                Ok(true) => ConsumerStats::bump(if executed {
                    &stats.executed
                } else {
                    &stats.duplicates
                }),
                other => self.settle_failed("ack", other),
            },
            Verdict::Retry(reason) if attempt >= self.max_attempts => {
                let reason = format!("gave up after {attempt} attempts: {reason}");
                self.dead_letter(&d, &reason).await;
            }
            Verdict::Retry(reason) => self.retry(d, attempt, &reason).await,
            Verdict::Dead(reason) => self.dead_letter(&d, &reason).await,
        }
    }

    async fn dead_letter(&self, d: &AmqpDelivery, reason: &str) {
        match d.acker.reject(BasicRejectOptions { requeue: false }).await {
            Ok(true) => {
                ConsumerStats::bump(&self.stats.dead_lettered);
                crate::metrics::mq_dead_letter();
                tracing::warn!(%reason, "AMQP delivery dead-lettered");
            }
            other => self.settle_failed("reject", other),
        }
    }

    /// Republishes the delivery to the retry queue with a per-message TTL,
    /// then acks the original. The TTL dead-letters it back to the queue.
    async fn retry(&self, d: AmqpDelivery, attempt: u32, reason: &str) {
        let delay = backoff(self.backoff_base, self.backoff_max, attempt);
        let properties = retry_properties(&d, attempt, delay);
        let published = self
            .retry
            .publish("", &self.retry_queue, true, &d.data, properties)
            .await;
        match published {
            Ok(()) => match d.acker.ack(BasicAckOptions::default()).await {
                Ok(true) => {
                    ConsumerStats::bump(&self.stats.retried);
                    crate::metrics::mq_retry();
                    tracing::info!(%reason, retry_in = ?delay, "AMQP delivery failed; retry scheduled");
                }
                // The copy in the retry queue and the redelivered original
                // both reach the idempotent handler: one effect.
                other => self.settle_failed("ack", other),
            },
            Err(e) => {
                // The retry queue is missing or the broker is failing:
                // requeue in place after the delay (holding one prefetch
                // slot meanwhile). The attempt count does not advance.
                tracing::warn!(%reason, error = %e, retry_in = ?delay, "could not schedule the retry; requeueing in place");
                tokio::time::sleep(delay).await;
                match d
                    .acker
                    .nack(BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    })
                    .await
                {
                    Ok(true) => {
                        ConsumerStats::bump(&self.stats.retried);
                        crate::metrics::mq_retry();
                    }
                    other => self.settle_failed("nack", other),
                }
            }
        }
    }

    fn settle_failed(&self, op: &str, result: lapin::Result<bool>) {
        ConsumerStats::bump(&self.stats.settle_failed);
        match result {
            Err(e) => {
                tracing::warn!(op, error = %e, "could not settle the delivery; the broker will redeliver it")
            }
            Ok(_) => {
                tracing::warn!(
                    op,
                    "channel closed before settling; the broker will redeliver it"
                )
            }
        }
    }
}

/// The properties of a retry copy: the original's, with the attempt count,
/// the original routing key and exchange, a TTL of `delay`, persistent.
/// Earlier dead-lettering history (`x-death`…) is dropped: the broker adds
/// its own when the TTL expires.
fn retry_properties(d: &AmqpDelivery, attempt: u32, delay: Duration) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(old) = d.properties.headers() {
        for (k, v) in old.inner() {
            let k_str = k.as_str();
            if !(k_str.starts_with("x-death")
                || k_str.starts_with("x-first-death")
                || k_str.starts_with("x-last-death"))
            {
                headers.insert(k.clone(), v.clone());
            }
        }
    }
    headers.insert(
        ATTEMPTS_HEADER.into(),
        AMQPValue::LongInt(i32::try_from(attempt).unwrap_or(i32::MAX)),
    );
    if !headers.contains_key(ROUTING_KEY_HEADER) {
        headers.insert(ROUTING_KEY_HEADER.into(), long(d.routing_key.as_str()));
    }
    if !headers.contains_key(EXCHANGE_HEADER) {
        headers.insert(EXCHANGE_HEADER.into(), long(d.exchange.as_str()));
    }
    let ttl_ms = delay.as_millis().max(1).to_string();
    d.properties
        .clone()
        .with_headers(headers)
        .with_expiration(ttl_ms.as_str().into())
        .with_delivery_mode(2)
}

fn header(props: &BasicProperties, name: &str) -> Option<AMQPValue> {
    props.headers().as_ref()?.inner().get(name).cloned()
}

/// An integer header of any AMQP integer type.
fn header_u32(props: &BasicProperties, name: &str) -> Option<u32> {
    let n: i128 = match header(props, name)? {
        AMQPValue::ShortShortInt(v) => v.into(),
        AMQPValue::ShortShortUInt(v) => v.into(),
        AMQPValue::ShortInt(v) => v.into(),
        AMQPValue::ShortUInt(v) => v.into(),
        AMQPValue::LongInt(v) => v.into(),
        AMQPValue::LongUInt(v) => v.into(),
        AMQPValue::LongLongInt(v) => v.into(),
        _ => return None,
    };
    u32::try_from(n).ok()
}

fn header_str(props: &BasicProperties, name: &str) -> Option<String> {
    match header(props, name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// `base * 2^(attempt-1)`, capped at `max`. No jitter: the retry queue
/// expires messages in order (a classic queue only expires its head), so
/// equal delays keep it first-in first-out.
fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(max)
}

// ---- publisher ----------------------------------------------------------------

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
/// As a [`Relay`](crate::outbox::Relay) route ([`Publisher::route`]) it
/// answers `Ok(Outcome::Executed(()))` after the confirm, and the relay
/// marks the outbox message `success` (its fallback update, outside any
/// handler transaction: there is no database work to join). A failure is a
/// retryable or permanent [`Error`] and the relay backs off or
/// dead-letters the outbox message. A confirm lost after the broker took
/// the message (connection drop) makes the relay publish it again: the
/// copy has the same `message_id`, and the consumer's idempotent handler
/// answers `Duplicate`.
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
/// enqueue(&mut tx, "coupon.deduct", "order-7", &serde_json::json!({ "coupon_id": 7 })).await?;
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
}

impl Publisher {
    /// A publisher to `exchange` (`""`: the default exchange, which routes
    /// by queue name). Its channel opens at the first publish and reopens
    /// after a failure.
    pub fn new(connection: Arc<Connection>, exchange: impl Into<String>) -> Self {
        Publisher {
            channel: Arc::new(ConfirmChannel::new(connection)),
            exchange: exchange.into(),
            routing_key: None,
            mandatory: true,
        }
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
        if msg_id.is_empty() {
            return Err(Error::permanent(
                "empty msg_id: the consumer could not key it",
            ));
        }
        let mut headers = FieldTable::default();
        headers.insert(TOPIC_HEADER.into(), long(topic));
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
            )
            .await
    }

    /// This publisher as a [`Relay`](crate::outbox::Relay) route:
    /// `relay.route(topic, publisher.route())`. The payload is forwarded as
    /// stored (JSON text).
    #[allow(clippy::type_complexity)]
    pub fn route<DB: Backend>(
        &self,
    ) -> impl Fn(Delivery<DB>, IgnoredAny) -> BoxFuture<Result<Outcome<()>, Error>> + Send + Sync + 'static
    {
        let publisher = self.clone();
        move |delivery: Delivery<DB>, _: IgnoredAny| {
            let publisher = publisher.clone();
            Box::pin(async move {
                let m = delivery.message();
                publisher
                    .publish(&m.topic, &m.msg_id, m.payload.as_bytes())
                    .await?;
                Ok(Outcome::Executed(()))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let (b, m) = (Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(backoff(b, m, 1), Duration::from_millis(100));
        assert_eq!(backoff(b, m, 2), Duration::from_millis(200));
        assert_eq!(backoff(b, m, 4), Duration::from_millis(800));
        assert_eq!(backoff(b, m, 5), m);
        assert_eq!(backoff(b, m, u32::MAX), m);
    }

    #[test]
    fn headers_of_any_integer_type() {
        for v in [
            AMQPValue::LongInt(3),
            AMQPValue::LongLongInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::LongUInt(3),
        ] {
            let mut h = FieldTable::default();
            h.insert(ATTEMPTS_HEADER.into(), v);
            let p = BasicProperties::default().with_headers(h);
            assert_eq!(header_u32(&p, ATTEMPTS_HEADER), Some(3));
        }
        let mut h = FieldTable::default();
        h.insert(ATTEMPTS_HEADER.into(), AMQPValue::LongInt(-1));
        let p = BasicProperties::default().with_headers(h);
        assert_eq!(header_u32(&p, ATTEMPTS_HEADER), None);
        assert_eq!(
            header_u32(&BasicProperties::default(), ATTEMPTS_HEADER),
            None
        );
    }

    #[test]
    fn retry_copy_keeps_origin_and_drops_death_history() {
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::LongInt(1));
        h.insert("trace-id".into(), long("t-1"));
        let mut d = AmqpDelivery::mock(
            1,
            "orders".into(),
            "coupon.deduct".into(),
            false,
            b"{}".to_vec(),
        );
        d.properties = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(h);
        let p = retry_properties(&d, 2, Duration::from_millis(1500));
        assert_eq!(p.expiration().as_ref().map(|s| s.as_str()), Some("1500"));
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
        assert_eq!(header_u32(&p, ATTEMPTS_HEADER), Some(2));
        assert_eq!(
            header_str(&p, ROUTING_KEY_HEADER).as_deref(),
            Some("coupon.deduct")
        );
        assert_eq!(header_str(&p, EXCHANGE_HEADER).as_deref(), Some("orders"));
        assert_eq!(header_str(&p, "trace-id").as_deref(), Some("t-1"));
        assert!(header(&p, "x-death").is_none());
        // A second retry keeps the first origin.
        let mut d2 = AmqpDelivery::mock(2, "".into(), "q".into(), false, b"{}".to_vec());
        d2.properties = p;
        let p2 = retry_properties(&d2, 3, Duration::from_millis(10));
        assert_eq!(
            header_str(&p2, ROUTING_KEY_HEADER).as_deref(),
            Some("coupon.deduct")
        );
        assert_eq!(header_u32(&p2, ATTEMPTS_HEADER), Some(3));
    }

    #[test]
    fn message_key_and_identity_serialization() {
        let m = Message {
            queue: "q".into(),
            message_id: "m-1".into(),
            routing_key: "rk".into(),
            exchange: "ex".into(),
            redelivered: true,
            attempt: 3,
            body: b"{}".to_vec(),
            properties: BasicProperties::default(),
        };
        assert_eq!(m.key(), "q:m-1");
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"queue":"q","message_id":"m-1"}"#
        );
    }
}
