//! The local message table (outbox): enqueue a message inside the caller's
//! own business transaction, and a [`Relay`] that delivers it to its
//! `#[idempotent]` handler until it succeeds or is dead-lettered.
//!
//! ```
//! use idem_runtime::outbox::{enqueue, Relay};
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
//! enqueue(&mut tx, "coupon.deduct", "order-7", &serde_json::json!({ "order_id": 7 })).await?;
//! tx.commit().await?;
//!
//! let relay = Relay::new(pool.clone())
//!     .route("coupon.deduct", |d, m: Deduct| async move { deduct(d.source(), &m).await });
//! assert_eq!(relay.run_once().await?, 1);
//! let status: String = sqlx::query_scalar("SELECT status FROM idem_outbox").fetch_one(&pool).await?;
//! assert_eq!(status, "success");
//! # Ok(()) }
//! ```

use crate::Error;
use crate::backend::Backend;
use sqlx::Transaction;

/// Status of an outbox message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting to be delivered (or re-delivered).
    Pending,
    /// Delivered: the handler's transaction committed.
    Success,
    /// Dead-lettered, with its reason in `last_error`.
    Failed,
}

impl Status {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Success => "success",
            Status::Failed => "failed",
        }
    }
}

/// Enqueues a message in `tx`, the caller's business transaction, so the
/// message commits or rolls back with the business change. Returns its id,
/// the value a relay passes to [`Source::outbox`](crate::Source::outbox).
///
/// `(topic, msg_id)` is unique: enqueueing the same message twice is an
/// error from the database, not a second message.
pub async fn enqueue<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    topic: &str,
    msg_id: &str,
    payload: &serde_json::Value,
) -> Result<i64, Error> {
    let payload = serde_json::to_string(payload).map_err(Error::Serialization)?;
    Ok(DB::outbox_insert(&mut **tx, topic, msg_id, &payload).await?)
}

pub mod admin;
mod relay;
pub use crate::backend::OutboxRow;
pub use relay::{Delivery, Relay, RelayHandle, RelaySettings, RelayStats};
