//! RocketMQ at both ends of an idempotent link: a [`Consumer`] in a
//! consumer group that runs an `#[idempotent]` handler for each message
//! and commits a message's offset only once the handler's transaction
//! committed (or found the effect done), and a [`Publisher`] that writes
//! outbox messages as a [`Relay`](idem_core::outbox::Relay) route. The
//! same shape as the RabbitMQ, NATS and Kafka entry points, on
//! [`rocketmq-client-rust`](rocketmq_client_rust) (RocketMQ's remoting
//! protocol, in Rust).
//!
//! ```text
//! producer tx ──enqueue──▶ idem_outbox ──Relay + Publisher──▶ topic ──consumer group──▶ Consumer ──▶ #[idempotent] handler
//!  (business change and        (IDEM_MSG_ID = outbox msg_id,      (offset committed only after the handler
//!   message commit together)    marked after SEND_OK)              committed or answered Duplicate)
//! ```
//!
//! This is the article's second source of duplicates: a broker master
//! crashes, the cluster fails over, the consumer had not committed its
//! offset, and the messages it had consumed are delivered again. Offsets
//! live on the broker, apart from the handler's database, so every crash,
//! rebalance or failover between a handler's commit and its offset's
//! commit redelivers. The handler's key is the article's `msgId + topic`
//! ([`Message::key`], `"rocketmq:{m.topic}:{m.msg_id}"` in a template),
//! the same on every copy, and its check in the database, inside the
//! handler's transaction, answers `Duplicate` to all of them.
//!
//! # The key
//!
//! [`Message::msg_id`] is, by default, the [`MSG_ID_PROPERTY`] property
//! (the outbox `msg_id` that [`Publisher`] writes, the same on a second
//! copy sent after a lost answer), else RocketMQ's message id (`UNIQ_KEY`,
//! which the producer's client gives once per message). Messages of other
//! producers can name a stable id of theirs with [`Consumer::key_from`]: a
//! property, the message's `KEYS` or a payload field. A message without an
//! id is a dead letter before any handler runs.
//!
//! # Settlement
//!
//! The consumer is RocketMQ's lite pull consumer with its automatic commit
//! off: it polls the messages of the queues the group assigned it, each
//! queue's messages go to a worker that runs them one at a time, in offset
//! order, and queues run side by side (up to [`Consumer::max_in_flight`]
//! handlers). A message's offset is recorded when it is settled and
//! committed to the broker every [`Consumer::commit_interval`] and when
//! the consumer stops: a queue's offset N is committed only when every
//! message before it is settled.
//!
//! | handler result | what the consumer does |
//! |---|---|
//! | `Ok(Executed)`, `Ok(Duplicate)` | records the offset |
//! | retryable `Err`, attempts left | runs it again in place after its back-off ([`Consumer::backoff`]) |
//! | retryable `Err`, the last attempt ([`Consumer::max_attempts`], default 16) | dead letter |
//! | non-retryable `Err`, unparsable payload, no message id | dead letter at once |
//! | an outage (the database down) or a commit whose outcome is unknown | runs again in place, uncounted, until the database answers ([`consume::through_outages`](idem_core::consume::through_outages)) |
//! | the member gone, or the queue given to another member, before the offset is committed | the queue's next owner reads the message again; the handler answers `Duplicate` if it had committed |
//!
//! A failed message is retried in place, as RocketMQ's own orderly
//! consumption does (`SUSPEND_CURRENT_QUEUE_A_MOMENT` until
//! `maxReconsumeTimes`, then the dead-letter queue): the lite pull
//! consumer has no `sendMessageBack` to the group's `%RETRY%` topic, and a
//! queue's offset cannot move past a message that is not settled. The
//! cost is that a failing message holds back the messages behind it in
//! its queue (only that queue) during its back-off.
//!
//! A dead letter is a copy of the message in the dead-letter topic
//! (default `%DLQ%{group}`, RocketMQ's own name for the group's
//! dead-letter queue), with its body, tag and properties
//! [`DEAD_REASON_PROPERTY`], [`DEAD_GROUP_PROPERTY`], the origin's topic,
//! queue and offset and the attempts; its offset is recorded once the
//! broker stored the copy. A copy that cannot be written is tried again,
//! the message kept unsettled: never lost, never dropped.
//! Where the broker does not create topics on a first send
//! (`autoCreateTopicEnable` off, the usual production setting), create
//! the dead-letter topic with the group: until it exists, its dead
//! letters are tried again and their queues wait.
//!
//! # Broker restarts and failovers
//!
//! The client finds the brokers through the name server and reconnects on
//! its own. While the master of a queue's broker group is down the
//! consumer pulls nothing new from it (handlers in flight finish, their
//! offsets wait), and the [`Publisher`]'s sends that no broker answers
//! are outages, which the outbox relay does not count against
//! `max_attempts`. When the master is back, the consumer reads from the
//! last committed offset: the messages settled but not committed are read
//! again and answered `Duplicate`.
//!
//! # Headers and ordering keys
//!
//! The headers an outbox message was enqueued with
//! ([`EnqueueOptions::header`](idem_core::outbox::EnqueueOptions::header))
//! become RocketMQ user properties under their own names; a handler reads
//! them with [`Message::property`] and [`Message::user_headers`]. Idem's
//! own properties win: a user header named under `IDEM_` (in any case) or
//! like one of RocketMQ's system properties (`KEYS`, `TAGS`, `UNIQ_KEY`,
//! `DELAY`, …, which the client refuses or the broker acts on) is dropped
//! with a warning, the message sent without it. A header RocketMQ cannot
//! carry (a name or value with the property separators `\u{1}` or
//! `\u{2}`) is a permanent error: the relay dead-letters the outbox
//! message rather than deliver it without the header.
//!
//! The ordering key selects the **queue**: a keyed message is sent to the
//! queue its key's hash picks among the topic's queues (RocketMQ's
//! `SelectMessageQueueByHash`, Java's `String.hashCode` modulo the queue
//! count, as a Java producer's ordered messages are), and carries the key
//! as its sharding key (`__SHARDINGKEY`) and in the
//! [`ORDERING_KEY_PROPERTY`] (`IDEM_ORDERING_KEY`) property, read with
//! [`Message::ordering_key`]. One queue is consumed by one worker, in
//! offset order, so a key's messages are handled one at a time, in order,
//! as long as the topic's queue count does not change. A message without
//! a key goes to the queue the client picks (round robin).
//!
//! # Example
//!
//! ```no_run
//! use idem_runtime::rocketmq::{Consumer, Message, Publisher};
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
//!     key = "rocketmq:{m.topic}:{m.msg_id}",
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
//! let namesrv = "127.0.0.1:9876";
//! // Producer side: the relay writes outbox messages to the topic.
//! let publisher = Publisher::connect(namesrv).await?.topic("coupon_deduct");
//! let relay = Relay::new(pool.clone()).route("coupon.deduct", publisher.route()).spawn();
//!
//! // Consumer side: one idempotent handler call per message.
//! let p = pool.clone();
//! let consumer = Consumer::new(namesrv, "deduct", "coupon_deduct", move |m: Message, d: Deduct| {
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

/// The RocketMQ client this crate is built on, re-exported so its types
/// (runtime, producer, errors) match.
pub use rocketmq_client_rust;

mod consumer;
mod error;
mod message;
mod publisher;
pub mod runtime;
mod settle;
mod shared;
mod worker;

pub use consumer::Consumer;
pub use idem_core::consume::ConsumerStats;
pub use message::{KeyFrom, Message};
pub use publisher::Publisher;

use idem_core::Error;
use rocketmq_client_rust::{ClientOptions, ClientRuntime, DefaultMQProducer};
use std::sync::Arc;
use std::time::Duration;

/// The property carrying a message's id: the outbox `msg_id` of a message
/// [`Publisher`] wrote, and the id of every dead letter.
pub const MSG_ID_PROPERTY: &str = "IDEM_MSG_ID";
/// The property carrying the outbox topic of a message [`Publisher`]
/// wrote.
pub const TOPIC_PROPERTY: &str = "IDEM_TOPIC";
/// The property carrying the ordering key an outbox message was enqueued
/// with (see [headers and ordering keys](self#headers-and-ordering-keys)).
pub const ORDERING_KEY_PROPERTY: &str = "IDEM_ORDERING_KEY";
/// On a dead letter: the attempts made.
pub const ATTEMPT_PROPERTY: &str = "IDEM_ATTEMPT";
/// On a dead letter: the topic the message was consumed from.
pub const ORIGIN_TOPIC_PROPERTY: &str = "IDEM_ORIGIN_TOPIC";
/// On a dead letter: the queue it was read from.
pub const ORIGIN_QUEUE_PROPERTY: &str = "IDEM_ORIGIN_QUEUE";
/// On a dead letter: its offset in that queue.
pub const ORIGIN_OFFSET_PROPERTY: &str = "IDEM_ORIGIN_OFFSET";
/// On a dead letter: why (the handler's error, or what was missing).
pub const DEAD_REASON_PROPERTY: &str = "IDEM_DEAD_REASON";
/// On a dead letter: the consumer group that gave up.
pub const DEAD_GROUP_PROPERTY: &str = "IDEM_DEAD_GROUP";

/// RocketMQ's own properties read here: the message id its producer's
/// client gives (`UNIQ_KEY`), its keys and its tag.
pub(crate) const UNIQ_KEY_PROPERTY: &str = "UNIQ_KEY";
pub(crate) const KEYS_PROPERTY: &str = "KEYS";
pub(crate) const TAGS_PROPERTY: &str = "TAGS";

/// A running [`Consumer`]: its counters and its graceful shutdown (see
/// [`consume::ConsumerHandle`](idem_core::consume::ConsumerHandle), which
/// it wraps). Dropping it stops the consumer, without waiting.
#[must_use = "dropping the handle stops the consumer"]
#[derive(Debug)]
pub struct ConsumerHandle(idem_core::consume::ConsumerHandle<Message>);

impl ConsumerHandle {
    idem_core::__consumer_handle_methods!();

    /// Graceful shutdown: it stops polling, lets each queue's worker
    /// finish the message in hand (the messages it had not started stay
    /// uncommitted: read again by the queue's next owner), commits the
    /// offsets settled and leaves the group.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.0.shutdown().await
    }
}

/// `f`, boxed: the client's futures nest deep enough that a caller's
/// future awaiting one inline overflows rustc's default query depth
/// (`recursion_limit`, 128) in the caller's crate. Boxed at every public
/// boundary, they cost the caller nothing to compile.
pub(crate) fn boxed<'a, T>(
    f: impl std::future::Future<Output = T> + Send + 'a,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>> {
    Box::pin(f)
}

/// A started producer in `group`, sends answered within `timeout`, the
/// client's own send retries off (the caller retries: a relay, or the
/// dead-letter loop).
pub(crate) async fn start_producer(
    runtime: Arc<ClientRuntime>,
    options: Option<ClientOptions>,
    namesrv: String,
    group: String,
    timeout: Duration,
) -> Result<DefaultMQProducer, Error> {
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let mut builder = DefaultMQProducer::builder(runtime);
    if let Some(o) = options {
        builder = builder.client_options(o);
    }
    let mut producer = builder
        .producer_group(group)
        .name_server_addr(namesrv)
        .send_msg_timeout(ms)
        .retry_times_when_send_failed(0)
        .build();
    boxed(producer.start())
        .await
        .map_err(|e| error::from_client("producer start", e))?;
    Ok(producer)
}
