//! The two handlers under test: the article's fault version, by hand, and
//! an `#[idempotent(strategy = state_machine)]` handler.

use super::sql::sql;
use idem_runtime::outbox::Delivery;
use idem_runtime::{Backend, Error, Outcome, State, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{Any, Transaction};

/// The lifecycle of a coupon, stored as `UNUSED` / `USED` in its `status`
/// column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
pub enum CouponState {
    Unused,
    Used,
}

/// The message an order enqueues: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeductCoupon {
    /// The message id.
    pub msg_id: String,
    /// The order.
    pub order_id: i64,
    /// The coupon to deduct.
    pub coupon_id: i64,
}

// ---- the #[idempotent] handler ---------------------------------------------

/// Deducts a coupon, once, however many times and however concurrently the
/// message (or a copy of it) is delivered.
///
/// The body only writes the ledger row. The attribute wraps it: `SELECT
/// status … FOR UPDATE` (SQLite: `BEGIN IMMEDIATE`), `Duplicate` if the
/// coupon is already `USED`, the body, then `UPDATE example_idem_coupon SET
/// status = 'USED' WHERE id = ? AND status = 'UNUSED'` (which must change
/// one row), the outbox message marked `success`, and the commit — one
/// transaction.
#[idempotent(
    key = "coupon-deduct:{msg.msg_id}",
    strategy = state_machine,
    table = "example_idem_coupon", id = msg.coupon_id, state_column = "status",
    from = CouponState::Unused, to = CouponState::Used,
)]
pub async fn deduct_coupon(
    tx: &mut Transaction<'_, Any>,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    let dialect = <Any as Backend>::conn_dialect(&**tx);
    sqlx::query(sql(
        dialect,
        "INSERT INTO example_idem_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---- the article's fault version, by hand --------------------------------------

/// The article's "production fault version" as a relay handler: the state
/// check runs outside the transaction ("Query OUTSIDE transaction!
/// Concurrent retries read stale snapshot"), so two deliveries of one
/// order running at once both read `UNUSED` and both deduct.
pub async fn consume_coupon_msg_fault_version(
    d: &Delivery<Any>,
    msg: &DeductCoupon,
) -> Result<Outcome<()>, Error> {
    let pool = d.pool();
    let dialect = <Any as Backend>::pool_dialect(pool);

    // Query OUTSIDE the transaction.
    let status: String = sqlx::query_scalar(sql(
        dialect,
        "SELECT status FROM example_fault_coupon WHERE id = ?",
    ))
    .bind(msg.coupon_id)
    .fetch_one(pool)
    .await?;
    if status != CouponState::Unused.as_str() {
        // "Duplicate message, coupon already deducted": the relay marks
        // the message delivered.
        return Ok(Outcome::Duplicate(None));
    }

    // ERROR: the business operation is separated from the state check.
    let mut tx = pool.begin().await?;
    sqlx::query(sql(
        dialect,
        "INSERT INTO example_fault_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        dialect,
        "UPDATE example_fault_coupon SET status = ? WHERE id = ?",
    ))
    .bind(CouponState::Used.as_str())
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        dialect,
        "UPDATE idem_outbox SET status = 'success' WHERE id = ?",
    ))
    .bind(d.message().id)
    .execute(&mut *tx)
    .await?;
    // On a server, the proxy loses this acknowledgement; on SQLite, the
    // `testing` hook does, exactly as for idempotent calls. Either way the
    // commit failed as far as this handler knows, and it says so: the
    // relay retries the message if it is still pending.
    idem_runtime::testing::commit(tx)
        .await
        .map_err(Error::CommitUnknown)?;
    Ok(Outcome::Executed(()))
}

/// One handler under test, with its own tables and outbox topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// The article's fault version.
    FaultVersion,
    /// The `#[idempotent]` handler.
    Idempotent,
}

impl Handler {
    /// Its name in the output.
    pub fn title(self) -> &'static str {
        match self {
            Handler::FaultVersion => "fault version",
            Handler::Idempotent => "#[idempotent]",
        }
    }

    /// Its outbox topic.
    pub fn topic(self) -> &'static str {
        match self {
            Handler::FaultVersion => "example.coupon-deduct.fault",
            Handler::Idempotent => "example.coupon-deduct.idem",
        }
    }

    /// The prefix of its tables: `<prefix>_coupon`, `_order`, `_deduction`.
    pub fn tables(self) -> &'static str {
        match self {
            Handler::FaultVersion => "example_fault",
            Handler::Idempotent => "example_idem",
        }
    }
}
