//! The consumer core every entry point shares, and the seam a new one is
//! written on: the outbox relay, the RabbitMQ consumer (`idem-amqp`), the
//! NATS JetStream consumer (`idem-nats`) and the Kafka consumer
//! (`idem-kafka`) are built on it, and so is an SQS or in-house queue
//! consumer written outside these crates.
//!
//! Each entry point has its own message type (the relay's `Delivery`, an
//! AMQP, a NATS or a Kafka `Message`), its own topology and its own way to
//! settle a message (mark the outbox row; ack, retry queue or reject; ack,
//! nak or term; the offset stored, after a copy to the retry or
//! dead-letter topic), but one handler shape, one way to run it and one reading of
//! what it came to:
//!
//! - a [`Handler`] parses the payload of the message's body ([`Incoming`];
//!   an unparsable one is a failure that no retry heals) and runs the
//!   `#[idempotent]` call, answering whether it executed or was a
//!   duplicate ([`handler`] makes one of a closure);
//! - it runs in a task of its own ([`run`], or [`start`] then [`verdict`]),
//!   so that a panic is a failed attempt and not a dead consumer;
//! - one give-up rule ([`Failure::next`]) says what a failed attempt comes
//!   to: a retry, or a dead letter once no retry heals it or it was the
//!   last attempt allowed; [`settle`] applies it through the broker's
//!   [`Settle`];
//! - an attempt that failed in an outage (the database down:
//!   [`Failure::outage`]) is no attempt: [`through_outages`] runs the
//!   handler again in place until the outage ends, and an outage is never
//!   a dead letter;
//! - a fan-out ([`fan_out`], [`Handling`]) makes one handler of several
//!   subscribers: one message, several handlers, each acting once in its
//!   own scope;
//! - the consumer runs as a [`TaskHandle`](crate::task::TaskHandle) behind a
//!   [`ConsumerHandle`] and counts in [`ConsumerStats`].
//!
//! # An entry point written on the seam
//!
//! A consumer of an in-process queue, complete: the message type, how the
//! "broker" settles, and the loop. A real broker's crate adds its
//! connection, its topology and the key it takes from the delivery.
//!
//! ```
//! use idem_runtime::consume::{self, Incoming, Settle};
//! use idem_runtime::{idempotent, Outcome};
//! use serde::{Deserialize, Serialize};
//! use sqlx::{Sqlite, SqlitePool, Transaction};
//! use std::sync::Mutex;
//!
//! /// A delivery of the queue: an id the key is made of, and a JSON body.
//! struct Delivery { id: String, body: Vec<u8> }
//!
//! impl Incoming for Delivery {
//!     fn body(&self) -> &[u8] { &self.body }
//! }
//!
//! /// How the queue settles one delivery (here: it writes down what it did).
//! struct Queue<'a> { log: &'a Mutex<Vec<String>> }
//!
//! impl Settle for Queue<'_> {
//!     async fn ack(&self, executed: bool) {
//!         self.log.lock().unwrap().push(format!("ack executed={executed}"));
//!     }
//!     async fn retry(&self, reason: &str) {
//!         self.log.lock().unwrap().push(format!("retry: {reason}"));
//!     }
//!     async fn dead_letter(&self, reason: &str) {
//!         self.log.lock().unwrap().push(format!("dead: {reason}"));
//!     }
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Points { user: i64, points: i64 }
//!
//! #[idempotent(key = "points:{id}", strategy = record, biz_type = "points")]
//! async fn add_points(tx: &mut Transaction<'_, Sqlite>, id: &str, p: &Points) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE wallet SET points = points + ? WHERE user = ?")
//!         .bind(p.points).bind(p.user).execute(&mut **tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePool::connect("sqlite::memory:").await?;
//! idem_runtime::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE wallet (user INTEGER PRIMARY KEY, points INTEGER)").execute(&pool).await?;
//! sqlx::query("INSERT INTO wallet VALUES (1, 0)").execute(&pool).await?;
//!
//! // The handler: the payload parsed, the idempotent call run.
//! let p = pool.clone();
//! let handler = consume::handler(move |d: Delivery, points: Points| {
//!     let pool = p.clone();
//!     async move { add_points(&pool, &d.id, &points).await }
//! });
//!
//! // The loop: each delivery run in a task of its own, then settled by the
//! // one give-up rule (attempt 1 of at most 5). The same delivery twice,
//! // as a broker redelivers after a lost ack, then an unparsable one.
//! let log = Mutex::new(Vec::new());
//! let queue = Queue { log: &log };
//! for (id, body) in [("d-1", r#"{"user":1,"points":5}"#), ("d-1", r#"{"user":1,"points":5}"#), ("d-2", "{")] {
//!     let delivery = Delivery { id: id.into(), body: body.into() };
//!     let verdict = consume::run(&handler, delivery).await;
//!     consume::settle(&queue, verdict, 1, 5, "deliveries").await;
//! }
//!
//! let points: i64 = sqlx::query_scalar("SELECT points FROM wallet WHERE user = 1").fetch_one(&pool).await?;
//! assert_eq!(points, 5, "acted once");
//! let log = log.into_inner().unwrap();
//! assert_eq!(log[..2], ["ack executed=true", "ack executed=false"]);
//! assert!(log[2].starts_with("dead: unparsable payload"), "{}", log[2]);
//! # Ok(()) }
//! ```

mod failure;
mod fan_out;
mod handle;
mod outage;
mod run;
mod settle;
mod stats;

pub use failure::{Failure, Next, Verdict};
pub use fan_out::{Handling, Subscriber, add, fan_out};
pub use handle::{ConsumerHandle, ConsumerStopReport, Running};
pub use outage::{OUTAGE_RETRY, through_outages};
#[cfg(feature = "opentelemetry")]
pub use run::continue_trace;
pub use run::{Handler, Incoming, Inline, handler, inline, run, start, verdict};
pub use settle::{Settle, settle};
pub use stats::{ConsumerStats, Counter};

/// Counts a broker delivery scheduled for a later attempt (an AMQP retry
/// queue, a JetStream nak with a delay) in `idem_mq_retries_total`.
pub fn count_retry() {
    crate::metrics::mq_retry();
}

/// Counts a broker delivery dead-lettered (an AMQP reject to the
/// dead-letter exchange, a JetStream `+TERM`) in
/// `idem_mq_dead_letters_total`.
pub fn count_dead_letter() {
    crate::metrics::mq_dead_letter();
}
