//! The local message table (outbox): enqueue a message inside the caller's
//! own business transaction, and a [`Relay`] that delivers it to its
//! `#[idempotent]` handler until it succeeds or is dead-lettered.
//!
//! ```
//! use idem_runtime::outbox::{enqueue, Enqueued, Relay};
//! use idem_runtime::{idempotent, Outcome};
//! use sqlx::{Sqlite, Transaction};
//!
//! #[derive(serde::Deserialize)]
//! struct Deduct { order_id: i64 }
//!
//! #[idempotent(key = "deduct:{m.order_id}", strategy = unique_insert, constraint = "deduction.order_id")]
//! async fn deduct(tx: &mut Transaction<'_, Sqlite>, m: &Deduct) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO deduction (order_id) VALUES (?)").bind(m.order_id).execute(&mut **tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! idem_runtime::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, paid INTEGER)").execute(&pool).await?;
//! sqlx::query("CREATE TABLE deduction (order_id INTEGER UNIQUE)").execute(&pool).await?;
//!
//! // "Order paid" and its "deduct coupon" message commit together.
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id, paid) VALUES (7, 1)").execute(&mut *tx).await?;
//! let msg = enqueue(&mut tx, "coupon.deduct", "order-7", &serde_json::json!({ "order_id": 7 })).await?;
//! assert!(msg.is_new());
//! tx.commit().await?;
//!
//! // The producer retrying after a lost commit acknowledgement: the same
//! // message again is "already enqueued", not an error, and not a second message.
//! let mut tx = pool.begin().await?;
//! let again = enqueue(&mut tx, "coupon.deduct", "order-7", &serde_json::json!({ "order_id": 7 })).await?;
//! assert_eq!(again, Enqueued::Already(msg.id()));
//! tx.commit().await?;
//!
//! let relay = Relay::new(pool.clone())
//!     .route("coupon.deduct", |d, m: Deduct| async move { deduct(d.source(), &m).await });
//! assert_eq!(relay.run_once().await?, 1);
//! let status: String = sqlx::query_scalar("SELECT status FROM idem_outbox").fetch_one(&pool).await?;
//! assert_eq!(status, "success");
//! # Ok(()) }
//! ```

mod enqueue;
pub(crate) mod mark;
mod notifier;
mod options;
mod relay;
pub use crate::backend::OutboxRow;
pub use crate::lease::OutboxLease;
pub use crate::status::Status;
pub use enqueue::{
    Enqueued, InTransaction, MAX_PAYLOAD_LEN, NOTIFY_CHANNEL, enqueue, enqueue_with,
    notify_on_enqueue, notify_on_enqueue_enabled,
};
pub use notifier::{
    DENSE as NOTIFIER_DENSE, GIVE_UP as NOTIFIER_GIVE_UP, MIN_GAP as NOTIFIER_MIN_GAP, NOTIFIER_APP,
};
pub(crate) use options::headers_of;
pub use options::{
    EnqueueOptions, Headers, MAX_DELAY, MAX_HEADER_NAME_LEN, MAX_HEADERS, MAX_HEADERS_LEN,
    MAX_ID_LEN,
};
pub use relay::forward;
pub use relay::{
    ATTEMPT_LOG_MAX, Delivery, DrainReport, LISTENER_APP, OnDeadHead, Relay, RelayHandle,
    RelaySettings, RelayStats, RelayStatsSnapshot, Settled, Settlement, StopReport, TopicLimit,
};
