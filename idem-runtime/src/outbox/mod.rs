//! The local message table (outbox): enqueue a message inside the caller's
//! own business transaction.

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
    tx: &mut Transaction<'static, DB>,
    topic: &str,
    msg_id: &str,
    payload: &serde_json::Value,
) -> Result<i64, Error> {
    let payload = serde_json::to_string(payload).map_err(Error::Serialization)?;
    Ok(DB::outbox_insert(tx, topic, msg_id, &payload).await?)
}

mod relay;
pub use relay::{Delivery, Relay, RelayHandle, RelayStats};
