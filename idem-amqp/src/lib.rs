//! RabbitMQ (AMQP 0-9-1) at both ends of an idempotent link: a [`Consumer`]
//! that runs an `#[idempotent]` handler for each delivery, and a
//! [`Publisher`] that forwards outbox messages to an exchange as a
//! [`Relay`](idem_core::outbox::Relay) route.
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
//! | `Err` in an outage (the handler's database unreachable: [`Error::is_outage`](idem_core::Error::is_outage), or its commit's outcome unknown) | no attempt: the handler runs again in place, after 100 ms doubling to [`Consumer::outage_retry`] (default 1 s), until the database is back; then settled by that run's result. Never a dead letter |
//!
//! [`Topology::declare`] creates the queues and exchanges this needs.
//!
//! # Broker restarts
//!
//! Build the [`Publisher`] and the [`Consumer`] on a [`Connector`]
//! (`Connector::new(uri).topology(t)`) and a broker restart (SIGTERM or
//! SIGKILL, a network cut, missed heartbeats) stops neither, and
//! dead-letters nothing:
//!
//! - the connector dials again, at most once per back-off delay (100 ms
//!   doubling to 5 s, jittered; [`Connector::backoff`]), redeclares its
//!   topologies, and counts and logs the reconnect
//!   ([`Connector::reconnects`]);
//! - while the broker is down, a publish fails at once with
//!   [`Error::broker_unavailable`](idem_core::Error::broker_unavailable),
//!   an [outage](idem_core::Error::is_outage): the outbox relay puts the
//!   message back to pending after
//!   [`Relay::outage_retry`](idem_core::outbox::Relay::outage_retry) with
//!   its attempts unchanged, so `max_attempts` is spent only on real
//!   failures;
//! - the consumer waits for the connector's next connection (no busy loop)
//!   and consumes again; a delivery it had not acknowledged on the dead
//!   connection is redelivered by the broker and answered `Duplicate` if
//!   its handler had committed. It also notices a channel that closed
//!   without its delivery stream ending (checked every second), and gives
//!   a settlement (ack, reject, a retry's confirmed publish) 30 s before
//!   leaving the delivery to the broker's redelivery;
//! - a *database* restart under the consumer is no attempt either: each
//!   delivery whose handler failed in the outage waits in place and runs
//!   again (see the table above; `ConsumerStats::outage_waits` counts the
//!   tries), so the deliveries in hand drain within about
//!   [`Consumer::outage_retry`] of the database's return.
//!
//! Which errors are an outage: every connection-level one (an I/O error,
//! a refused dial, missed heartbeats, a closed connection or channel, the
//! broker's `CONNECTION_FORCED` on shutdown). A channel-level refusal (a
//! missing exchange or queue, a nack, an unroutable message) counts as an
//! attempt. On a fixed `Arc<Connection>` (what [`connect`] returns) nothing
//! dials again: the consumer stops with its connection, and every publish
//! keeps failing as an outage until the process is restarted.
//!
//! # Headers and ordering keys
//!
//! The headers an outbox message was enqueued with
//! ([`EnqueueOptions::header`](idem_core::outbox::EnqueueOptions::header))
//! become AMQP message headers, each a long-string value under its own
//! name; a handler reads them with [`Message::header`] and
//! [`Message::user_headers`], and they travel with a retry through the retry
//! queue. Idem's own headers win: a user header named under
//! [`IDEM_HEADER_PREFIX`] (`x-idem-`, in any case) is not carried, and
//! neither are the names RabbitMQ itself interprets (`CC`, `BCC`,
//! `x-death`, `x-first-death-…`, `x-last-death-…`); each such header is
//! dropped with a warning, the message is published without it.
//!
//! RabbitMQ has no per-key order beyond a queue's own FIFO, so the
//! ordering key does nothing on the broker: it is carried in the
//! [`ORDERING_KEY_HEADER`] header (`x-idem-ordering-key`), read with
//! [`Message::ordering_key`]. The relay still hands a key's messages to
//! the publisher one at a time, in order.
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

mod channel;
mod connector;
mod consumer;
mod error;
mod fields;
mod message;
mod publisher;
mod retry;
mod topology;
mod worker;

pub use connector::Connector;
pub use consumer::Consumer;
pub(crate) use error::from_lapin;
pub use idem_core::consume::ConsumerStats;
pub use message::Message;
pub use publisher::Publisher;
pub use topology::Topology;

/// A running [`Consumer`]: its counters and its graceful shutdown (see
/// [`consume::ConsumerHandle`](idem_core::consume::ConsumerHandle)).
pub type ConsumerHandle = idem_core::consume::ConsumerHandle<Message>;

use idem_core::Error;
use lapin::{Connection, ConnectionProperties};
use std::sync::Arc;

/// The header counting the attempts failed so far (set by the consumer on
/// each republish to the retry queue).
pub const ATTEMPTS_HEADER: &str = "x-idem-attempts";
/// The header keeping the original routing key across the retry queue.
pub const ROUTING_KEY_HEADER: &str = "x-idem-routing-key";
/// The header keeping the original exchange across the retry queue.
pub const EXCHANGE_HEADER: &str = "x-idem-exchange";
/// The header carrying the outbox topic of a message sent by [`Publisher`].
pub const TOPIC_HEADER: &str = "x-idem-topic";
/// The header carrying the ordering key an outbox message was enqueued
/// with (see [headers and ordering keys](self#headers-and-ordering-keys)).
pub const ORDERING_KEY_HEADER: &str = "x-idem-ordering-key";
/// The prefix of idem's own headers ([`TOPIC_HEADER`],
/// [`ATTEMPTS_HEADER`], …): a user header under it (in any case) is not
/// carried by [`Publisher`].
pub const IDEM_HEADER_PREFIX: &str = "x-idem-";

/// Connects to a broker (`amqp://user:pass@host:5672/%2f`) on the current
/// tokio runtime. The connection closes when the last `Arc` is dropped.
pub async fn connect(uri: &str) -> Result<Arc<Connection>, Error> {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .map(Arc::new)
        .map_err(|e| from_lapin("connect", e))
}
