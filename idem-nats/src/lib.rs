//! NATS JetStream at both ends of an idempotent link: a [`Consumer`] that
//! pulls from a durable consumer and runs an `#[idempotent]` handler for
//! each delivery, and a [`Publisher`] that forwards outbox messages to a
//! stream as a [`Relay`](idem_core::outbox::Relay) route. The same shape as
//! the RabbitMQ adapter (`amqp`, feature `amqp`).
//!
//! ```text
//! producer tx ──enqueue──▶ idem_outbox ──Relay + Publisher──▶ stream ──pull consumer──▶ Consumer ──▶ #[idempotent] handler
//!  (business change and         (Nats-Msg-Id = outbox msg_id,        (ack only after the handler
//!   message commit together)     stream's publish ack awaited)        committed or answered Duplicate)
//! ```
//!
//! Every hop is at-least-once, so every hop can duplicate: a publish ack
//! lost republishes, a consumer (or the server holding the consumer's
//! state) that dies before the ack is recorded hands the message out
//! again. `Nats-Msg-Id` is the outbox `msg_id`, stable across all of these,
//! so the handler's key `"{stream}:{message_id}"` ([`Message::key`]) is
//! stable too and the handler answers `Duplicate`.
//!
//! # The key: `Nats-Msg-Id`, not the stream sequence
//!
//! A delivery carries two identities: its stream sequence and its
//! `Nats-Msg-Id` header. The sequence is unique per *stored copy*: it
//! keys a redelivery of that copy, but a republish the duplicate window
//! did not catch (after the window, or after the stream lost it in a
//! failover) is a new copy with a new sequence, and a key on it would act
//! twice. The `Nats-Msg-Id` is the publisher's id of the *message* (the
//! outbox `msg_id` when [`Publisher`] sent it), the same on every copy.
//! So the key is built from it, and a delivery without one is a dead
//! letter before any handler runs. [`Message::stream_sequence`] is there
//! for logs.
//!
//! # Consumer settlement
//!
//! | handler result | what the consumer does |
//! |---|---|
//! | `Ok(Executed)`, `Ok(Duplicate)` | `+ACK`, confirmed by the server (double ack); an ack not confirmed counts in `settle_failed` and the server delivers the message again |
//! | retryable `Err`, deliveries left | `-NAK` with a delay (`base · 2^(delivered-1)`, capped): the server delivers it again after the delay |
//! | retryable `Err`, the `max_deliver`-th delivery | dead letter |
//! | non-retryable `Err`, unparsable payload, no `Nats-Msg-Id` | dead letter at once |
//! | the handler still running | `+WPI` (in progress) every third of `ack_wait`, so `ack_wait` never runs out under it |
//! | the consumer dies before settling | after `ack_wait` the server delivers it again (`delivered` + 1); the handler answers `Duplicate` if it had committed |
//!
//! A dead letter is copied to the [dead-letter
//! subject](Consumer::dead_letter_subject) when one is set (the original
//! headers and payload, plus `Idem-Dead-Stream`, `-Consumer`, `-Subject`,
//! `-Sequence`, `-Delivered` and `-Reason`), the copy confirmed by its
//! stream's ack, and then terminated (`+TERM`: never delivered again). A
//! copy that cannot be stored leaves the delivery nak'd instead, so it is
//! not lost while deliveries remain. [`Topology::declare`] creates the
//! stream, a dead-letter stream and the durable consumer.
//!
//! # Bounded deliveries
//!
//! The bound is the consumer's `max_deliver`, which the server enforces
//! and which counts *every* delivery: nak'd ones, ones whose `ack_wait`
//! ran out, ones to a consumer that died. The consumer reads it at
//! [`spawn`](Consumer::spawn) and dead-letters a retryable failure on
//! the last delivery. Past it the server stops delivering the message on
//! its own (and publishes a `MAX_DELIVERIES` advisory), without a dead
//! letter: that happens only when the last delivery never reached a
//! handler's answer (a crash, a handler outliving `ack_wait` without
//! progress acks) or its dead-letter copy could not be stored. The
//! message stays in the stream either way.
//!
//! # The duplicate window: a front layer
//!
//! A stream remembers each `Nats-Msg-Id` for its `duplicate_window`
//! (default 2 minutes) and answers a publish of a known id with the first
//! copy's ack and `duplicate: true`, storing nothing. That makes most
//! republishes (a lost publish ack, a relay restarted before it marked
//! the outbox row) free. It is not the authority:
//!
//! - the window is fixed: a retry after it (a relay that backed off for
//!   longer, an outbox row requeued by an operator, a restore) stores a
//!   second copy;
//! - the window is per stream: the same message sent to two streams, or
//!   replayed from a dead-letter stream, is not caught;
//! - a republish inside the window is *silently dropped*, even if its
//!   payload differs: the window can hide a mistake, never report it;
//! - the ids are kept in memory on the stream's servers; a stream that is
//!   recreated, or restored from a backup, starts with an empty window.
//!
//! So the consumer never relies on it: its handler's key is the same
//! `Nats-Msg-Id`, checked in the database in the handler's transaction
//! (the record, or the entity's state), and a copy that got past the
//! window answers `Duplicate` there.
//!
//! # Server restarts
//!
//! The client ([`connect`]) reconnects on its own, with its own back-off
//! (async-nats' default: growing delays with jitter, without end), to any
//! server it knows; the [`Consumer`] keeps pulling (a failed pull waits at
//! most 1 s before the next) and the stream and its durable consumer are
//! on the server's store. While no server is reachable, a publish whose
//! ack does not come (a time-out, a broken pipe) fails with
//! [`Error::broker_unavailable`](idem_core::Error::broker_unavailable),
//! an [outage](idem_core::Error::is_outage) that the outbox relay does not
//! count against `max_attempts`: the message is due again after
//! [`Relay::outage_retry`](idem_core::outbox::Relay::outage_retry) with its
//! attempts unchanged. A publish failure while the client is connected (a
//! stream missing, a stream leader being elected, a time-out of a live
//! server) counts as an attempt. A publish the client buffered while
//! disconnected and sent after the reconnect is dropped by the stream's
//! duplicate window when the relay has published it again meanwhile.
//!
//! A *database* outage under the consumer (the handler's database
//! restarting: [`Error::is_outage`](idem_core::Error::is_outage), or a
//! commit whose outcome is unknown) costs no delivery: the handler runs
//! again in place, after 100 ms doubling to [`Consumer::outage_retry`]
//! (default 1 s), with the delivery kept by in-progress acks, until the
//! database is back; no nak, which the server would count against
//! `max_deliver`, and never a dead letter. With in-progress acks off
//! ([`Consumer::progress_every`]`(None)`) an outage longer than `ack_wait`
//! costs a delivery per `ack_wait`. A consumer stopped during the outage
//! naks what it holds (counted by the server, still no dead letter).
//!
//! # Headers and ordering keys
//!
//! The headers an outbox message was enqueued with
//! ([`EnqueueOptions::header`](idem_core::outbox::EnqueueOptions::header))
//! become NATS message headers under their own names; a handler reads
//! them with [`Message::header`] and [`Message::user_headers`], and a dead
//! letter's copy keeps them. Idem's own headers win: a user header named
//! under `Idem-` or the server's `Nats-` (in any case: `Nats-Msg-Id`,
//! `Nats-Expected-Stream`, `Nats-Rollup`, … would change what the
//! stream does), or `Content-Type`, is dropped with a warning and the
//! message published without it. A header NATS cannot carry (a name with
//! a space, a `:` or a non-ASCII character, a value with a line break) is
//! a permanent error: the relay dead-letters the outbox message rather
//! than deliver it without the header.
//!
//! JetStream orders a stream by sequence and has no per-key order of its
//! own (a subject per key is its way), so the ordering key does nothing on
//! the server: it is carried in the [`ORDERING_KEY_HEADER`]
//! (`Idem-Ordering-Key`) header, read with [`Message::ordering_key`].
//! The relay still publishes a key's messages one at a time, in order.
//!
//! # Example
//!
//! ```no_run
//! use idem_runtime::nats::{self, Consumer, Message, Publisher, Topology};
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
//!     key = "mq:{m.stream}:{m.message_id}",
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
//! let js = nats::connect("nats://127.0.0.1:4222").await?;
//! let t = Topology::new("COUPONS", "coupon.deduct", "deduct").max_deliver(5);
//! t.declare(&js).await?;
//!
//! // Producer side: the relay forwards outbox messages to the stream.
//! let relay = Relay::new(pool.clone())
//!     .route("coupon.deduct", Publisher::new(js.clone()).route())
//!     .spawn();
//!
//! // Consumer side: one idempotent handler call per delivery.
//! let p = pool.clone();
//! let consumer = Consumer::new(js.clone(), "COUPONS", "deduct", move |m: Message, d: Deduct| {
//!     let pool = p.clone();
//!     async move { deduct(&pool, &m, &d).await }
//! })
//! .dead_letter_subject(&t.dead_letter_subject)
//! .spawn()
//! .await?;
//! // …
//! consumer.shutdown().await?;
//! relay.shutdown().await;
//! # Ok(()) }
//! ```

/// The NATS client this module is built on, re-exported so its types
/// (`Client`, `HeaderMap`, `jetstream::Context`, configurations) match
/// the ones used here.
pub use async_nats;

mod consumer;
mod error;
mod message;
mod publisher;
mod topology;
mod worker;

pub use consumer::Consumer;
pub use idem_core::consume::ConsumerStats;
pub use message::Message;
pub use publisher::Publisher;
pub use topology::Topology;

/// A running [`Consumer`]: its counters, its settings and its graceful
/// shutdown (see
/// [`consume::ConsumerHandle`](idem_core::consume::ConsumerHandle), which it
/// wraps). Dropping it stops the consumer, without waiting.
#[must_use = "dropping the handle stops the consumer"]
#[derive(Debug)]
pub struct ConsumerHandle(idem_core::consume::ConsumerHandle<Message>);

impl ConsumerHandle {
    idem_core::__consumer_handle_methods!();

    /// Graceful shutdown: it stops pulling, waits for the handlers in
    /// flight and their acknowledgements, and naks what it took but did
    /// not start. See
    /// [`consume::ConsumerHandle::shutdown`](idem_core::consume::ConsumerHandle::shutdown).
    pub async fn shutdown(self) -> Result<(), Error> {
        self.0.shutdown().await
    }
}

use async_nats::jetstream::Context;
use idem_core::Error;

/// The header carrying the outbox topic of a message sent by [`Publisher`].
pub const TOPIC_HEADER: &str = "Idem-Topic";
/// The header carrying the ordering key an outbox message was enqueued
/// with (see [headers and ordering keys](self#headers-and-ordering-keys)).
pub const ORDERING_KEY_HEADER: &str = "Idem-Ordering-Key";
/// On a dead letter: the stream the message was consumed from.
pub const DEAD_STREAM_HEADER: &str = "Idem-Dead-Stream";
/// On a dead letter: the durable consumer that gave up.
pub const DEAD_CONSUMER_HEADER: &str = "Idem-Dead-Consumer";
/// On a dead letter: the subject the message was published to.
pub const DEAD_SUBJECT_HEADER: &str = "Idem-Dead-Subject";
/// On a dead letter: its sequence in the stream it was consumed from.
pub const DEAD_SEQUENCE_HEADER: &str = "Idem-Dead-Sequence";
/// On a dead letter: the deliveries it had.
pub const DEAD_DELIVERED_HEADER: &str = "Idem-Dead-Delivered";
/// On a dead letter: why (the handler's error, or what was missing).
pub const DEAD_REASON_HEADER: &str = "Idem-Dead-Reason";

/// Connects to `servers` (one URL, or several separated by commas: the
/// nodes of a cluster; the client also learns the others from the
/// server) and returns its JetStream context. The client reconnects on
/// its own, to any node, for as long as it lives.
pub async fn connect(servers: &str) -> Result<Context, Error> {
    let addrs = servers
        .split(',')
        .map(|s| s.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error::permanent("connect", e))?;
    let client = async_nats::connect(addrs)
        .await
        .map_err(|e| error::retryable("connect", e))?;
    Ok(async_nats::jetstream::new(client))
}
