//! Redis Streams at both ends of an idempotent link: a [`Consumer`] that
//! reads a stream in a consumer group and runs an `#[idempotent]`
//! handler for each entry, and a [`Publisher`] that forwards outbox
//! messages to a stream as a [`Relay`](idem_core::outbox::Relay) route.
//! The same shape as the NATS and Kafka adapters (`nats`, `kafka`).
//!
//! ```text
//! producer tx ──enqueue──▶ idem_outbox ──Relay + Publisher──▶ stream ──XREADGROUP──▶ Consumer ──▶ #[idempotent] handler
//!  (business change and       (XADD … msg_id <outbox msg_id>,          (XACK only after the handler
//!   message commit together)   marked once Redis answered its id)      committed or answered Duplicate)
//! ```
//!
//! Every hop is at-least-once, so every hop can duplicate: an `XADD`
//! whose reply is lost is written again by the relay (a second entry, a
//! new entry id), a consumer that dies between its commit and its `XACK`
//! leaves the entry pending, and another consumer claims it. The entry's
//! `msg_id` field is the outbox `msg_id`, the same on every copy, so the
//! handler's key `"{stream}:{msg_id}"` ([`Message::key`]) is stable and
//! the handler answers `Duplicate`.
//!
//! # The key: the `msg_id` field, not the entry id
//!
//! An entry id (`1700000000000-0`) is unique per stored *copy*: a message
//! written twice has two. The `msg_id` field is the publisher's id of the
//! *message*. So the key is built from it ([`MSG_ID_FIELD`], or another
//! field named by [`Consumer::key_field`]), and an entry without one is a
//! dead letter before any handler runs. [`Message::entry_id`] is there
//! for logs.
//!
//! # Consumer settlement
//!
//! | handler result | what the consumer does |
//! |---|---|
//! | `Ok(Executed)`, `Ok(Duplicate)` | `XACK` (an `XACK` that fails leaves the entry pending: it is claimed after `claim_after` and answered `Duplicate`) |
//! | retryable `Err`, tries left | the handler runs again in place after a back-off (`base · 2^(attempt-1)`, capped), the entry kept pending and its own |
//! | retryable `Err`, the `max_attempts`-th try | dead letter |
//! | non-retryable `Err`, unparsable payload, no `msg_id` | dead letter at once |
//! | an outage (the database down, a commit whose outcome is unknown) | no try: the handler runs again in place until the database is back, never a dead letter |
//! | the consumer dies before `XACK` | the entry stays pending; after [`claim_after`](Consumer::claim_after) idle, a consumer of the group claims it with `XAUTOCLAIM` and runs it again: `Duplicate` if it had committed |
//! | handed out more than [`max_deliveries`](Consumer::max_deliveries) times | dead letter without running (consumers keep dying on it) |
//!
//! A dead letter is copied to the [dead-letter
//! stream](Consumer::dead_letter_stream) (default `{stream}:dlq`) with
//! `XADD`: the entry's fields, plus [`DEAD_REASON_FIELD`],
//! [`DEAD_STREAM_FIELD`], [`DEAD_ENTRY_ID_FIELD`], [`DEAD_GROUP_FIELD`],
//! [`DEAD_CONSUMER_FIELD`] and [`DEAD_DELIVERED_FIELD`]; only once Redis
//! answered that `XADD` is the entry acknowledged. A copy that cannot be
//! written leaves the entry pending: it is claimed again, nothing is
//! dropped. (An `XACK` lost after the copy was written makes a second
//! copy when the entry is claimed again: the same `entry_id` field.)
//!
//! # Counting tries, not deliveries
//!
//! Redis counts how many times a pending entry was handed out (its
//! delivery count, in `XPENDING`): by `XREADGROUP`, then by every claim.
//! That count also grows for reasons that are no failed try: a consumer
//! stopped by a deploy, an `XACK` lost in a Redis restart. So failed
//! tries are counted by the consumer making them, in place (the handler
//! runs again after its back-off, the entry held meanwhile, up to
//! [`max_attempts`](Consumer::max_attempts)), and the delivery count,
//! read with `XPENDING` for each claimed entry, only bounds the entries
//! that consumers keep dying on ([`max_deliveries`](Consumer::max_deliveries),
//! default 10). A consumer that dies in the middle of a handler's tries
//! starts the count again on the consumer that claims the entry.
//!
//! # Claims: a dead consumer's entries
//!
//! Entries a consumer read and did not acknowledge stay in the group's
//! pending list, its name on them. Every consumer runs `XAUTOCLAIM` with
//! [`claim_after`](Consumer::claim_after) (default 30 s) as the minimum
//! idle time, every third of it, and handles what it claimed as it
//! handles new entries. A consumer keeps the entries it holds from being
//! claimed while their handlers run (an outage waited out, a back-off)
//! with `XCLAIM … JUSTID` on them, every third of `claim_after`, which
//! resets their idle time and leaves their delivery counts unchanged
//! (the Redis counterpart of an in-progress ack). A consumer started
//! again under the same name finds its own old entries the same way.
//!
//! # Redis restarts, and persistence
//!
//! Both connections (a blocking one for `XREADGROUP`, one for the other
//! commands) are [`ConnectionManager`](redis::aio::ConnectionManager)s,
//! which reconnect on their own. While Redis is down, a read fails and is
//! tried again after a second (counted in
//! [`ConsumerStats::pull_failures`]); an `XACK` that fails leaves the
//! entry pending, claimed once Redis is back. A publish while Redis is
//! down fails with [`Error::broker_unavailable`](idem_core::Error::broker_unavailable),
//! an [outage](idem_core::Error::is_outage) that the outbox relay does not
//! count against `max_attempts`.
//!
//! What survives a restart is what Redis kept on disk. With the
//! append-only file on (`appendonly yes`, and `appendfsync always` for
//! not a write lost; `everysec` loses up to a second of them) the
//! stream, its groups and their pending lists come back, and the
//! consumers go on. A Redis that keeps nothing on disk loses them all:
//! the outbox marked its messages published once Redis answered, so the
//! entries not yet consumed are **lost**: run the stream on a Redis with
//! persistence. The consumer answers a read's `NOGROUP` (the group, or
//! the stream, gone) by creating the group again, from the start of the
//! stream (`0`, whatever [`Start`] said: the entries written after the
//! loss are all to be read, and a re-read one answers `Duplicate`).
//!
//! A *database* outage under the consumer (the handler's database
//! restarting: [`Error::is_outage`](idem_core::Error::is_outage), or a
//! commit whose outcome is unknown) costs no try: the handler runs again
//! in place, after 100 ms doubling to [`Consumer::outage_retry`] (default
//! 1 s), until the database is back, the entry held; never a dead letter.
//!
//! # Stream length
//!
//! [`Publisher::max_len`] trims the stream (`MAXLEN ~ n`). Trimming
//! deletes the oldest entries whether a group has read them or not: an
//! entry trimmed before it was consumed is lost, and one trimmed while
//! pending is dropped from the pending list by the next `XAUTOCLAIM`.
//! Size `n` for the longest backlog the consumers may have.
//!
//! # Headers and ordering keys
//!
//! A stream entry has fields, not headers: each header an outbox message
//! was enqueued with
//! ([`EnqueueOptions::header`](idem_core::outbox::EnqueueOptions::header))
//! becomes the field `h.<name>` ([`HEADER_FIELD_PREFIX`]), its value the
//! header's. No field [`Publisher`] or a dead letter writes starts with
//! `h.`, so a header can never replace one of them (a header named
//! `msg_id` is the field `h.msg_id`; the `msg_id` field stays the outbox
//! `msg_id`). A handler reads them with [`Message::header`] and
//! [`Message::user_headers`]; a dead letter keeps them.
//!
//! Redis orders a stream by entry id and has no per-key order of its own,
//! so the ordering key does nothing on the server: it is carried in the
//! [`ORDERING_KEY_FIELD`] field (`ordering_key`), read with
//! [`Message::ordering_key`]. The relay still writes a key's messages one
//! at a time, in order.
//!
//! # Example
//!
//! ```no_run
//! use idem_runtime::redis_streams::{self, Consumer, Message, Publisher};
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
//!     key = "rs:{m.stream}:{m.msg_id}",
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
//! let redis = redis_streams::client("redis://127.0.0.1:6379/")?;
//!
//! // Producer side: the relay forwards outbox messages to the stream
//! // named by their topic.
//! let relay = Relay::new(pool.clone())
//!     .route("coupon.deduct", Publisher::new(redis.clone()).route())
//!     .spawn();
//!
//! // Consumer side: one idempotent handler call per entry.
//! let p = pool.clone();
//! let consumer = Consumer::new(redis, "coupon.deduct", "deduct", move |m: Message, d: Deduct| {
//!     let pool = p.clone();
//!     async move { deduct(&pool, &m, &d).await }
//! })
//! .max_attempts(5)
//! .spawn()
//! .await?;
//! // …
//! consumer.shutdown().await?;
//! relay.shutdown().await;
//! # Ok(()) }
//! ```

/// The Redis client this module is built on, re-exported so its types
/// (`Client`, `aio::ConnectionManager`, `RedisError`) match the ones used
/// here.
pub use redis;

mod commands;
mod consumer;
mod error;
mod message;
mod publisher;
mod settle;
mod shared;
mod worker;

pub use consumer::{Consumer, Start};
pub use idem_core::consume::ConsumerStats;
pub use message::Message;
pub use publisher::Publisher;

use idem_core::Error;

/// The field carrying the message's id (the outbox `msg_id`): the key.
pub const MSG_ID_FIELD: &str = "msg_id";
/// The field carrying the payload (JSON).
pub const PAYLOAD_FIELD: &str = "payload";
/// The field carrying the outbox topic of a message sent by [`Publisher`].
pub const TOPIC_FIELD: &str = "topic";
/// The field carrying the payload's content type (`application/json`).
pub const CONTENT_TYPE_FIELD: &str = "content_type";
/// The field carrying the ordering key an outbox message was enqueued
/// with (see [headers and ordering keys](self#headers-and-ordering-keys)).
pub const ORDERING_KEY_FIELD: &str = "ordering_key";
/// The prefix of the fields carrying a message's headers: header `tenant`
/// is the field `h.tenant`.
pub const HEADER_FIELD_PREFIX: &str = "h.";
/// On a dead letter: why (the handler's error, or what was missing).
pub const DEAD_REASON_FIELD: &str = "reason";
/// On a dead letter: the stream it was read from.
pub const DEAD_STREAM_FIELD: &str = "stream";
/// On a dead letter: its entry id in that stream.
pub const DEAD_ENTRY_ID_FIELD: &str = "entry_id";
/// On a dead letter: the consumer group that gave up.
pub const DEAD_GROUP_FIELD: &str = "group";
/// On a dead letter: the consumer that gave up.
pub const DEAD_CONSUMER_FIELD: &str = "consumer";
/// On a dead letter: the times Redis had handed it out.
pub const DEAD_DELIVERED_FIELD: &str = "delivered";

/// A running [`Consumer`]: its counters, its settings and its graceful
/// shutdown (see
/// [`consume::ConsumerHandle`](idem_core::consume::ConsumerHandle), which it
/// wraps). Dropping it stops the consumer, without waiting.
#[must_use = "dropping the handle stops the consumer"]
#[derive(Debug)]
pub struct ConsumerHandle(idem_core::consume::ConsumerHandle<Message>);

impl ConsumerHandle {
    idem_core::__consumer_handle_methods!();

    /// Graceful shutdown: it stops reading and claiming, and waits for
    /// the handlers in flight and their `XACK`s (a handler waiting out an
    /// outage or a back-off stops waiting; its entry stays pending, to be
    /// claimed). See
    /// [`consume::ConsumerHandle::shutdown`](idem_core::consume::ConsumerHandle::shutdown).
    pub async fn shutdown(self) -> Result<(), Error> {
        self.0.shutdown().await
    }
}

/// A client of the Redis at `url` (`redis://host:port/db`,
/// `rediss://…`, `redis+unix:///path`): no connection is made until a
/// [`Consumer`] spawns or a [`Publisher`] publishes. Errors on a URL
/// that cannot be parsed.
pub fn client(url: &str) -> Result<redis::Client, Error> {
    redis::Client::open(url).map_err(|e| error::from_redis("open", e))
}
