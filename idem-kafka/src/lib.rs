//! Kafka at both ends of an idempotent link: a [`Consumer`] in a consumer
//! group that runs an `#[idempotent]` handler for each record and commits
//! a record's offset only once the handler's transaction committed (or
//! found the effect done), and a [`Publisher`] that writes outbox messages
//! with the idempotent producer as a [`Relay`](idem_core::outbox::Relay)
//! route. The same shape as the RabbitMQ and NATS entry points.
//!
//! ```text
//! producer tx ──enqueue──▶ idem_outbox ──Relay + Publisher──▶ topic ──consumer group──▶ Consumer ──▶ #[idempotent] handler
//!  (business change and        (Idem-Msg-Id = outbox msg_id,       (offset stored only after the handler
//!   message commit together)    acks=all, idempotent producer)      committed or answered Duplicate)
//! ```
//!
//! Kafka's consumer redelivers by design: offsets are committed apart from
//! the handler's database, so a member that committed its transaction
//! but not yet the offset (a crash, a rebalance that moved its partition,
//! a broker failover) has its records read again by the partition's next
//! owner. A producer that lost an acknowledgement writes a second copy.
//! The handler's key is the message's id, the same on every copy, and
//! its check in the database, inside the handler's transaction, answers
//! `Duplicate` to all of them.
//!
//! # The key
//!
//! [`Message::msg_id`] comes from the [`MSG_ID_HEADER`] header by
//! default: the outbox `msg_id` that [`Publisher`] writes, stable across
//! every copy. Records of other producers name it with
//! [`Consumer::key_from`]: a header or a payload field of theirs, or, as
//! an explicit choice, the offset ([`KeyFrom::offset`], whose
//! documentation says why a producer retry breaks it). The template
//! `"kafka:{m.topic}:{m.msg_id}"` ([`Message::key`]) keys the handler. A
//! record without an id is a dead letter before any handler runs.
//!
//! # Settlement
//!
//! Each assigned partition has a worker that runs its records one at a
//! time, in offset order; partitions run side by side (up to
//! [`Consumer::max_in_flight`] handlers). A record's offset is *stored*
//! when it is settled, and librdkafka commits what is stored every
//! [`Consumer::commit_interval`], on a revocation and when the consumer
//! stops: offset N is committed only when every record before it in the
//! partition is settled, never before.
//!
//! | handler result | what the consumer does |
//! |---|---|
//! | `Ok(Executed)`, `Ok(Duplicate)` | stores the offset |
//! | retryable `Err`, attempts left | copies the record to the retry topic (default `{topic}.retry`) with its next attempt and when it is due, confirmed by the broker, then stores the offset: the partition goes on |
//! | retryable `Err`, the last attempt ([`Consumer::max_attempts`]) | dead letter |
//! | non-retryable `Err`, unparsable payload, no message id | dead letter at once |
//! | an outage (the database down) or a commit whose outcome is unknown | runs again in place, uncounted, until the database answers ([`consume::through_outages`](idem_core::consume::through_outages)) |
//! | the partition revoked, or the member gone, before the offset is stored | the next owner reads the record again; the handler answers `Duplicate` if it had committed |
//!
//! A dead letter is a copy of the record in the dead-letter topic
//! (default `{topic}.dlt`), with the original headers, value and key and
//! [`DEAD_REASON_HEADER`], [`DEAD_GROUP_HEADER`], the origin's topic,
//! partition and offset and the attempts; its offset is stored once the
//! broker confirmed the copy. A copy (retry or dead letter) that cannot be
//! written is tried again, the record kept unsettled, for as long as the
//! partition is this member's: never lost, never dropped.
//!
//! The retry topic is read by the same consumer. A copy waits there until
//! it is due (its back-off, [`Consumer::backoff`]), holding back the
//! copies behind it in its retry partition only. Copies keep the record's
//! key, so one key's retries stay in one retry partition; per-key order
//! is given up for the record that failed (it runs after the records
//! that followed it). [`Consumer::retry_in_place`] keeps strict order
//! instead, at the cost of a partition stalled while a record fails.
//!
//! # Broker restarts and failovers
//!
//! librdkafka reconnects on its own, to any broker it knows. While none
//! answers, the consumer reads nothing, handlers in flight finish, a
//! retry copy waits (tried again, the record unsettled), and the
//! commit of stored offsets is retried. The [`Publisher`]'s sends that
//! no broker acknowledges within its time-out are outages, which the
//! outbox relay does not count against `max_attempts`.
//!
//! # Headers and ordering keys
//!
//! The headers an outbox message was enqueued with
//! ([`EnqueueOptions::header`](idem_core::outbox::EnqueueOptions::header))
//! become Kafka record headers under their own names, UTF-8 values; a
//! handler reads them with [`Message::header`] (bytes),
//! [`Message::header_text`] and [`Message::user_headers`], and a retry
//! copy and a dead letter keep them. Idem's own headers win: they are
//! written first (a reader taking a name's first header gets idem's), and
//! a user header named under `Idem-` or `content-type` (in any case) is
//! dropped with a warning, the record written without it.
//!
//! The ordering key is the **record key** of the message: a key's
//! messages land on one partition, where the consumer runs them one at a
//! time, in order (and the relay publishes them one at a time, in
//! order). It is also carried in the [`ORDERING_KEY_HEADER`]
//! (`Idem-Ordering-Key`) header, read with [`Message::ordering_key`]. A
//! message without one gets the key [`Publisher::key_field`] or
//! [`Publisher::key_with`] names, else its `msg_id`.
//!
//! # Example
//!
//! ```no_run
//! use idem_runtime::kafka::{Consumer, Message, Publisher, Topology};
//! use idem_runtime::outbox::Relay;
//! use idem_runtime::{idempotent, State};
//! use sqlx::{Sqlite, SqlitePool, Transaction};
//!
//! #[derive(Clone, Copy, State)]
//! enum CouponState { Unused, Used }
//!
//! #[derive(serde::Deserialize)]
//! struct Deduct { coupon_id: i64 }
//!
//! #[idempotent(
//!     key = "kafka:{m.topic}:{m.msg_id}",
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
//! let brokers = "127.0.0.1:9092";
//! Topology::new("coupon.deduct").partitions(6).declare(brokers).await?;
//!
//! // Producer side: the relay writes outbox messages to the topic,
//! // one coupon's messages to one partition.
//! let publisher = Publisher::new(brokers)?.key_field("coupon_id");
//! let relay = Relay::new(pool.clone()).route("coupon.deduct", publisher.route()).spawn();
//!
//! // Consumer side: one idempotent handler call per record.
//! let p = pool.clone();
//! let consumer = Consumer::new(brokers, "deduct", "coupon.deduct", move |m: Message, d: Deduct| {
//!     let pool = p.clone();
//!     async move { deduct(&pool, &m, &d).await }
//! })
//! .spawn()
//! .await?;
//! // …
//! consumer.shutdown().await?;
//! relay.shutdown().await;
//! # Ok(()) }
//! ```

/// The Kafka client this crate is built on (librdkafka, bundled),
/// re-exported so its types (`ClientConfig`, messages, errors) match.
pub use rdkafka;

mod consumer;
mod context;
mod error;
mod message;
mod publisher;
mod settle;
mod shared;
mod topology;
mod worker;

pub use consumer::Consumer;
pub use idem_core::consume::ConsumerStats;
pub use message::{KeyFrom, Message};
pub use publisher::Publisher;
pub use topology::Topology;

use idem_core::Error;
use rdkafka::ClientConfig;

/// The header carrying a message's id: the outbox `msg_id` of a record
/// [`Publisher`] wrote, and the id of every retry copy and dead letter.
pub const MSG_ID_HEADER: &str = "Idem-Msg-Id";
/// The header carrying the outbox topic of a record [`Publisher`] wrote.
pub const TOPIC_HEADER: &str = "Idem-Topic";
/// The header carrying the ordering key an outbox message was enqueued
/// with, also its record key (see
/// [headers and ordering keys](self#headers-and-ordering-keys)).
pub const ORDERING_KEY_HEADER: &str = "Idem-Ordering-Key";
/// On a retry copy and a dead letter: the attempt it is (retry) or was
/// (dead letter), from 1.
pub const ATTEMPT_HEADER: &str = "Idem-Attempt";
/// On a retry copy: when it is due, in milliseconds since the Unix epoch.
pub const NOT_BEFORE_HEADER: &str = "Idem-Not-Before";
/// On a retry copy: why the last attempt failed.
pub const RETRY_REASON_HEADER: &str = "Idem-Retry-Reason";
/// On a retry copy and a dead letter: the topic the message was first
/// consumed from.
pub const ORIGIN_TOPIC_HEADER: &str = "Idem-Origin-Topic";
/// On a retry copy and a dead letter: the partition of its first copy.
pub const ORIGIN_PARTITION_HEADER: &str = "Idem-Origin-Partition";
/// On a retry copy and a dead letter: the offset of its first copy.
pub const ORIGIN_OFFSET_HEADER: &str = "Idem-Origin-Offset";
/// On a dead letter: why (the handler's error, or what was missing).
pub const DEAD_REASON_HEADER: &str = "Idem-Dead-Reason";
/// On a dead letter: the consumer group that gave up.
pub const DEAD_GROUP_HEADER: &str = "Idem-Dead-Group";

/// A running [`Consumer`]: its counters and its graceful shutdown (see
/// [`consume::ConsumerHandle`](idem_core::consume::ConsumerHandle), which
/// it wraps). Dropping it stops the consumer, without waiting.
#[must_use = "dropping the handle stops the consumer"]
#[derive(Debug)]
pub struct ConsumerHandle(idem_core::consume::ConsumerHandle<Message>);

impl ConsumerHandle {
    idem_core::__consumer_handle_methods!();

    /// Graceful shutdown: it stops reading, lets each partition's worker
    /// finish the record in hand (the records it had not started stay
    /// unsettled: read again by the partition's next owner), then leaves
    /// the group, committing the offsets stored.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.0.shutdown().await
    }
}

/// The idempotent producer's configuration: `extra` first, then what the
/// publishing rules rest on; a send waits `timeout` for the broker's
/// acknowledgement unless `extra` says otherwise.
pub(crate) fn producer_config(
    brokers: &str,
    extra: &[(String, String)],
    timeout: std::time::Duration,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("message.timeout.ms", timeout.as_millis().to_string());
    for (k, v) in extra {
        c.set(k, v);
    }
    c.set("enable.idempotence", "true").set("acks", "all");
    c
}
