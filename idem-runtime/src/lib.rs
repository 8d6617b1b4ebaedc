//! # idem: idempotent async message handlers, by construction
//!
//! Retries are how asynchronous pipelines heal — an outbox poller re-runs a
//! handler after a lost commit acknowledgement, a broker redelivers after a
//! failover, a payment platform repeats its callback — so every handler
//! runs more than once sooner or later. idem makes the correct handler the
//! only one you can write: [`#[idempotent]`](macro@idempotent) generates the
//! key derivation, the state check, your mutation and the outbox status
//! update as **one database transaction**, and misuse does not compile.
//!
//! ```
//! use idem_runtime::{idempotent, Outcome, State};
//! use sqlx::{Sqlite, SqlitePool, Transaction};
//!
//! #[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
//! enum CouponState { Unused, Used }
//!
//! struct DeductCoupon { msg_id: String, coupon_id: i64, order_id: i64 }
//!
//! #[idempotent(
//!     key = "coupon-deduct:{msg.msg_id}",
//!     strategy = state_machine,
//!     table = "coupon", id = msg.coupon_id, state_column = "status",
//!     from = CouponState::Unused, to = CouponState::Used,
//! )]
//! async fn deduct(tx: &mut Transaction<'_, Sqlite>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
//!         .bind(msg.coupon_id).bind(msg.order_id)
//!         .execute(&mut **tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePool::connect("sqlite::memory:").await?;
//! idem_runtime::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)").execute(&pool).await?;
//! sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)").execute(&pool).await?;
//! sqlx::query("INSERT INTO coupon VALUES (7, 'UNUSED')").execute(&pool).await?;
//!
//! let msg = DeductCoupon { msg_id: "m-1".into(), coupon_id: 7, order_id: 42 };
//! assert_eq!(deduct(&pool, &msg).await?, Outcome::Executed(()));
//! // The retry after a lost acknowledgement: no second deduction.
//! assert_eq!(deduct(&pool, &msg).await?, Outcome::Duplicate(None));
//! let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM deduction").fetch_one(&pool).await?;
//! assert_eq!(n, 1);
//! # Ok(()) }
//! ```
//!
//! The [`guide`] explains every strategy, every attribute option and the
//! same code written by hand, one chapter per module.
//!
//! ## What the crate root holds
//! - The attribute and what handlers name: [`idempotent`](macro@idempotent),
//!   [`State`], [`EntityId`] (with [`EntityIdValue`], for your own id
//!   newtypes), [`KeyPart`], [`Outcome`], [`Source`], [`CallerTx`] (calls
//!   inside a transaction the caller holds),
//!   [`Error`], [`BoxError`], [`Result`], [`is_transient`], and [`Backend`]
//!   (sealed) for handlers generic over the database, with the [`Dialect`]
//!   it speaks.
//! - Keys built by hand, for code that needs a handler's key outside the
//!   handler (to look its record up, to enqueue the message that will carry
//!   it): [`KeyBuilder`] applies the encoding and the checks the attribute's
//!   templates get, [`check_key`] and [`Validator`] check a finished key,
//!   [`escape_part`] encodes one part, [`MAX_KEY_LEN`] bounds the result.
//! - The database side: [`migrate`], [`SCHEMA_VERSION`], [`MAX_TTL_SECS`],
//!   [`fingerprint`] (the record strategy's payload hash), and the modules
//!   [`outbox`], [`archive`], [`shard`] (several databases, the record
//!   always beside the entity's data), [`pooler`] (behind pgbouncer in
//!   transaction mode: unnamed statements, autocommit statements in
//!   transactions), [`cache`] (feature `redis`), [`amqp`] (feature `amqp`),
//!   `nats` (feature `nats`), `kafka` (feature `kafka`), `rocketmq`
//!   (feature `rocketmq`), `redis_streams` (feature `redis-streams`),
//!   `consume` (the consumer handle and counters the brokers share;
//!   features `amqp`, `nats`, `kafka`, `rocketmq`, `redis-streams`), `http` (feature
//!   `axum`), `testing` (feature `testing`).
//!
//! What only the generated code calls (the call protocol, the strategies'
//! specs) is in a hidden `__private` module and is not API; the stores
//! behind [`Backend`] are sealed and not reachable at all. A delivery's
//! lease is [`outbox::OutboxLease`], beside the relay that hands it out.
//!
//! ## Cargo features
//! - `sqlite` (default): the embedded backend, no server needed.
//! - `postgres`, `mysql` (MariaDB and MySQL): the server backends.
//! - `any`: handlers on `sqlx::Any`, the database chosen at run time by URL.
//! - `uuid`: UUIDs as key parts and entity ids.
//! - `redis`: the Redis front cache ([`cache`]), never the source of truth.
//! - `amqp`: the RabbitMQ consumption adapter (one handler or a fan-out
//!   of several per queue) and outbox publisher.
//! - `nats`: the NATS JetStream consumption adapter (one handler or a
//!   fan-out) and outbox publisher.
//! - `kafka`: the Kafka consumer-group adapter (one handler or a fan-out;
//!   offsets committed only after the handler's transaction; retry and
//!   dead-letter topics) and outbox publisher on the idempotent producer;
//!   builds librdkafka from source (a C compiler and `make`).
//! - `rocketmq`: the RocketMQ consumer-group adapter (one handler or a
//!   fan-out; the article's `{topic}:{msgId}` key; offsets committed only
//!   after the handler's transaction; dead letters in `%DLQ%{group}`) and
//!   outbox publisher, on `rocketmq-client-rust`.
//! - `redis-streams`: the Redis Streams consumer-group adapter (one
//!   handler or a fan-out; `XACK` only after the handler's transaction,
//!   a dead consumer's entries taken over with `XAUTOCLAIM`, a
//!   dead-letter stream) and outbox publisher on `XADD`.
//! - `axum`: the HTTP entry points ([`http`]): `Idempotency-Key` requests,
//!   by hand or behind a tower layer, their `#[idempotent]` calls and
//!   outbox messages in the request's transaction, and signed third-party
//!   callbacks, for axum 0.8.
//! - `opentelemetry`: W3C trace context in the outbox: [`outbox::enqueue`]
//!   stores the current `tracing` span's OpenTelemetry context (through
//!   `tracing-opentelemetry`) as `traceparent`/`tracestate` headers, and the
//!   relay's `outbox_delivery` span continues it, the broker publishers send
//!   their publish span's context, and the RabbitMQ, NATS, Kafka, RocketMQ and
//!   Redis Streams consumers' spans continue that (see [`guide::operating`]).
//! - `testing`: fault injection (lost commit acknowledgements) for tests and demos.
//!
//! ## Crates
//! This crate is a facade: the core (`idem-core`: the call protocol, the
//! outbox, the relay and the seams), its operations (`idem-ops`: [`migrate`], the
//! [`archive`]r and the operator's [`outbox::admin`] queries, written on
//! the core's public API) and one crate per entry point
//! (`idem-amqp`, `idem-nats`, `idem-kafka`, `idem-rocketmq`, `idem-redis-streams`,
//! `idem-axum`, `idem-redis`), each built only
//! on the core's public seams ([`consume`], [`outbox::forward`],
//! [`requests`], [`front`]) and re-exported here under its feature. A new
//! entry point is a crate of the same shape: see [`consume`] for one
//! written from scratch.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(inline)]
pub use idem_core::*;
#[doc(inline)]
pub use idem_ops::{
    Operable, SCHEMA_VERSION, TABLES, archive, existing_tables, migrate, schema, time, timestamp,
};

/// The local message table (outbox): [`enqueue`](outbox::enqueue) a
/// message inside the caller's own business transaction, and a
/// [`Relay`](outbox::Relay) delivers it to its `#[idempotent]` handler
/// until it succeeds or is dead-lettered; the operator's queries in
/// [`admin`](outbox::admin).
///
/// The core's [`idem_core::outbox`] documents it in full, with an example.
pub mod outbox {
    #[doc(inline)]
    pub use idem_core::outbox::*;
    #[doc(inline)]
    pub use idem_ops::admin;
}

#[cfg(feature = "amqp")]
#[doc(inline)]
pub use idem_amqp as amqp;
#[cfg(feature = "axum")]
#[doc(inline)]
pub use idem_axum as http;
#[cfg(feature = "kafka")]
#[doc(inline)]
pub use idem_kafka as kafka;
#[cfg(feature = "nats")]
#[doc(inline)]
pub use idem_nats as nats;
#[cfg(feature = "redis")]
#[doc(inline)]
pub use idem_redis as cache;
#[cfg(feature = "redis-streams")]
#[doc(inline)]
pub use idem_redis_streams as redis_streams;
#[cfg(feature = "rocketmq")]
#[doc(inline)]
pub use idem_rocketmq as rocketmq;
#[doc(inline)]
pub use idem_shard as shard;
#[cfg(feature = "testing")]
#[doc(inline)]
pub use idem_testing as testing;

pub mod guide;

/// Makes an async handler idempotent.
///
/// ```text
/// #[idempotent(key = "template:{param.field}", strategy = state_machine | record | unique_insert, …)]
/// async fn handler(tx: &mut sqlx::Transaction<'_, DB>, params…) -> Result<T, E>
/// // or, the body then written like ordinary sqlx code (`.execute(&mut *tx)`):
/// async fn handler(tx: &mut sqlx::PgConnection, params…) -> Result<T, E>
/// ```
///
/// The first parameter is the call's transaction, as a `&mut Transaction`
/// (queries on `&mut **tx`) or as its connection, `&mut PgConnection`,
/// `&mut MySqlConnection`, `&mut SqliteConnection` or `&mut AnyConnection`
/// (queries on `&mut *tx`). Writing `&mut *tx` on a `&mut Transaction` is a
/// compile error that says which to write.
///
/// generates
///
/// ```text
/// async fn handler(source: impl Into<Source<'_, DB>>, params…) -> Result<Outcome<T>, idem_runtime::Error>
/// ```
///
/// (the source: `&pool`; [`Source::outbox`] for a relay's delivery; or
/// `&mut tx` for a [`CallerTx`], a transaction the caller holds)
/// which runs, in ONE transaction: key derivation and checks → the outbox
/// message's status update, fenced by the delivery's lease (when called
/// with [`Source::outbox`]) → the strategy's guard → your body on the
/// transaction → the strategy's bookkeeping → commit. A duplicate never runs the body and
/// answers `Ok(Outcome::Duplicate(_))`. Body errors (`E: Into<BoxError>`)
/// roll everything back and come back as [`Error::Handler`], retryable when
/// they carry a transient `sqlx::Error`.
///
/// # Options
///
/// | option | strategies | value | default |
/// |---|---|---|---|
/// | `key` | all (required) | `"text:{param}:{param.field.0}"`; `{{` `}}` are literal braces; text after a placeholder starts with a separator (see [`KeyBuilder`]) | — |
/// | `strategy` | all (required) | `state_machine`, `record`, `unique_insert` | — |
/// | `validate` | all | path to `fn(&str) -> Result<(), E: Display>`, called with the whole derived key | none |
/// | `table` | state_machine (required) | SQL identifier, or `schema.table` | — |
/// | `id` | state_machine (required) | a parameter or one of its fields ([`EntityId`]) | — |
/// | `id_column` | state_machine | SQL identifier | `"id"` |
/// | `state_column` | state_machine | SQL identifier | `"status"` |
/// | `key_column` | state_machine | SQL identifier: the guarded transition also writes the call's key there, so another key finding the entity already in `to` is [`Error::IllegalState`], not a duplicate | none |
/// | `from`, `to` | state_machine (required) | variants of one [`State`] enum | — |
/// | `biz_type` | record (required) | 1 to 64 bytes of `[A-Za-z0-9_.-]`: the scope of deduplication (the record table is unique on (biz_type, key)); no default, since a renamed function would silently change it | — |
/// | `biz_no` | record | a parameter or one of its fields ([`KeyPart`]) | the key |
/// | `ttl` | record | a duration in idem's [one grammar](crate::guide::attributes#durations) (`30s`, `15m`, `24h`, `7d`, `1d 12h`; never a bare number), whole seconds from 1 second to `3650d` (ten years) | `7d` |
/// | `fingerprint` | record | `[param, param.field]`, each `serde::Serialize` | every parameter |
/// | `constraint` | unique_insert (required) | the unique constraint or index whose violation means Duplicate: a SQL identifier, or on SQLite (whose inline constraints have no name) `table.column`; a violation of any other unique constraint is an error | — |
///
/// # `state_machine`
///
/// The example in the [crate documentation](crate). Written by hand, the
/// generated code is:
///
/// ```text
/// key = KeyBuilder…finish(validate)?                    // InvalidKey: nothing runs
/// BEGIN                                                 // SQLite: BEGIN IMMEDIATE
/// [UPDATE idem_outbox SET status = 'success' WHERE id = ? AND topic = ?
///    AND status = 'pending' AND lease_owner = ? AND attempts = ?]  // must change 1 row, else
///                                                       // ROLLBACK, LeaseLost / OutboxMessage
/// SELECT status FROM coupon WHERE id = ? FOR UPDATE     // SQLite: no FOR UPDATE (write lock held)
///   = to    → COMMIT, Duplicate(None)
///   = from  → go on
///   other   → ROLLBACK, IllegalState
/// <your body>                                           // Err → ROLLBACK, Handler
/// UPDATE coupon SET status = to WHERE id = ? AND status = from   // must change 1 row
/// COMMIT                                                // connection lost → CommitUnknown
/// ```
///
/// # `record`
///
/// ```
/// use idem_runtime::{idempotent, Error, Outcome};
/// use serde::{Deserialize, Serialize};
/// use sqlx::{Sqlite, Transaction};
///
/// #[derive(Serialize)]
/// struct Notice { msg_id: String, user_id: i64, text: String }
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Receipt { channel: String }
///
/// #[idempotent(key = "notice:{n.msg_id}", strategy = record, biz_type = "notice", biz_no = n.user_id, ttl = "7d")]
/// async fn send_notice(tx: &mut Transaction<'_, Sqlite>, n: &Notice) -> Result<Receipt, sqlx::Error> {
///     sqlx::query("INSERT INTO sent (user_id, text) VALUES (?, ?)")
///         .bind(n.user_id).bind(&n.text).execute(&mut **tx).await?;
///     Ok(Receipt { channel: "sms".into() })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE sent (user_id INTEGER, text TEXT)").execute(&pool).await?;
///
/// let n = Notice { msg_id: "m-9".into(), user_id: 5, text: "shipped".into() };
/// let first = send_notice(&pool, &n).await?;
/// assert_eq!(first, Outcome::Executed(Receipt { channel: "sms".into() }));
/// // A duplicate gets the stored result back.
/// assert_eq!(send_notice(&pool, &n).await?, Outcome::Duplicate(Some(Receipt { channel: "sms".into() })));
/// // The same key with another payload is a conflict, and nothing runs.
/// let other = Notice { text: "cancelled".into(), ..n };
/// assert!(matches!(send_notice(&pool, &other).await, Err(Error::KeyConflict { .. })));
/// # Ok(()) }
/// ```
///
/// Written by hand:
///
/// ```text
/// BEGIN
/// INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time)
///   VALUES (?, ?, ?, ?, now, now + ttl)
///   ON CONFLICT (idempotency_key, biz_type) DO NOTHING   // MariaDB: INSERT IGNORE
///   -- unique per (biz_type, key): handlers sharing a key template keep a record each;
///   -- a concurrent insert of the same pair waits here on the unique index
///   0 rows → SELECT fingerprint, result … (MariaDB: LOCK IN SHARE MODE)
///            same fingerprint → COMMIT, Duplicate(stored)
///            other           → ROLLBACK, KeyConflict
/// <your body>
/// UPDATE idem_record SET result = <json> WHERE idempotency_key = ? AND biz_type = ?
/// COMMIT
/// ```
///
/// # `unique_insert`
///
/// ```
/// use idem_runtime::{idempotent, Outcome};
/// use sqlx::{Sqlite, Transaction};
///
/// struct Callback { serial: String, amount: i64 }
///
/// // `validate` receives the whole derived key ("pay:<serial>").
/// fn check_serial(key: &str) -> Result<(), String> {
///     let serial = key.strip_prefix("pay:").unwrap_or(key);
///     if serial.len() == 12 && serial.bytes().all(|b| b.is_ascii_digit()) { Ok(()) }
///     else { Err(format!("`{serial}` is not a 12-digit payment serial")) }
/// }
///
/// #[idempotent(key = "pay:{cb.serial}", strategy = unique_insert, constraint = "payment.serial", validate = check_serial)]
/// async fn record_payment(tx: &mut Transaction<'_, Sqlite>, cb: &Callback) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO payment (serial, amount) VALUES (?, ?)")
///         .bind(&cb.serial).bind(cb.amount).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE payment (serial TEXT PRIMARY KEY, amount INTEGER)").execute(&pool).await?;
///
/// let cb = Callback { serial: "202611300001".into(), amount: 1999 };
/// assert_eq!(record_payment(&pool, &cb).await?, Outcome::Executed(()));
/// assert_eq!(record_payment(&pool, &cb).await?, Outcome::Duplicate(None));
/// let forged = Callback { serial: "../../admin".into(), amount: 1 };
/// assert!(record_payment(&pool, &forged).await.unwrap_err().to_string().contains("payment serial"));
/// # Ok(()) }
/// ```
///
/// Written by hand: `BEGIN; [outbox update]; SAVEPOINT s; <your body>` — a
/// violation of `constraint` in the body's error → `ROLLBACK TO SAVEPOINT
/// s`, `COMMIT`, `Duplicate(None)`; any other error, another unique
/// violation included → `ROLLBACK`; success → `RELEASE SAVEPOINT s`,
/// `COMMIT`. (`[outbox update]`: the fenced update shown for
/// `state_machine`, when an outbox message drives the call.)
///
/// # Compile-time checks
///
/// Unknown, repeated or misplaced options; unknown strategies and
/// `strategy = token` (one-time tokens do not exist on async links); empty
/// templates, templates without placeholders, unbalanced braces,
/// placeholders naming no parameter, two placeholders with no text between
/// them, text after a placeholder that starts with a character a key part
/// may contain (`[A-Za-z0-9-._~%]`); a `record` without `biz_type`, a
/// `unique_insert` without `constraint`; a `ttl` outside 1 s to 3650 d;
/// non-`async` functions; invalid SQL identifiers; `from`/`to` of different
/// enums; placeholder types without a stable encoding ([`KeyPart`]).
pub use idem_macros::idempotent;

/// Derives [`State`] for a field-less enum (`#[state(rename = "...")]` on a
/// variant overrides its stored name).
pub use idem_macros::State;
