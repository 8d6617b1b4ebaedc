//! README, "The same code written by hand": what `#[idempotent]` generates
//! for [`deduct_coupon`](super::state_machine::deduct_coupon), written
//! with the public API (the pool and the delivery instead of the
//! generated function's `impl Into<Source>`).

use super::state_machine::DeductCoupon;
use idem_runtime::outbox::Delivery;
use idem_runtime::{Error, KeyBuilder, Outcome};
use sqlx::{PgPool, Postgres};

// README: by_hand
pub async fn deduct_coupon(pool: &PgPool, d: &Delivery<Postgres>, msg: &DeductCoupon)
    -> Result<Outcome<()>, Error>
{
    let illegal = |found: Option<&str>| Error::IllegalState {
        table: "readme_coupon", id: msg.coupon_id.to_string(),
        found: found.map(Into::into), expected: "UNUSED",
    };
    // 1. Key: each part encoded canonically, then percent-encoded (see Keys);
    //    non-empty parts, ≤ 128 bytes encoded, no control characters, and the
    //    `validate` function if given. (It names the call in its span.)
    let _key = KeyBuilder::new().lit("coupon-deduct:").part("d.topic", &d.topic)
        .lit(":").part("d.msg_id", &d.msg_id).finish(None)?;
    // 2. One transaction (SQLite: BEGIN IMMEDIATE, which takes the write lock).
    let mut tx = pool.begin().await?;
    // 3. An outbox message drives the call: mark it first, fenced by the
    //    delivery's lease; the row stays locked until the end. Not exactly one
    //    row: LeaseLost (another claim took it over) or OutboxMessage (missing,
    //    another topic, already finished; idem reads the row to tell), and
    //    nothing runs.
    let lease = d.lease();
    let marked = sqlx::query(
        "UPDATE idem_outbox SET status = 'success', updated_at = now(), lease_owner = NULL, \
         locked_until = NULL WHERE id = $1 AND topic = $2 AND status = 'pending' \
         AND lease_owner = $3 AND attempts = $4")
        .bind(lease.id()).bind(lease.topic()).bind(lease.owner()).bind(lease.attempt())
        .execute(&mut *tx).await?.rows_affected();
    if marked != 1 {
        return Err(Error::OutboxMessage { id: lease.id(), reason: "not held by this delivery".into() });
    }
    // 4. The state, read under a row lock, inside the transaction.
    let state: Option<String> =
        sqlx::query_scalar(r#"SELECT "status"::text FROM "readme_coupon" WHERE "id" = $1 FOR UPDATE"#)
            .bind(msg.coupon_id).fetch_optional(&mut *tx).await?;
    match state.as_deref() {
        Some("USED") => {                                 // already done
            tx.commit().await.map_err(Error::CommitUnknown)?;  // (the message is marked)
            return Ok(Outcome::Duplicate(None));
        }
        Some("UNUSED") => {}
        found => return Err(illegal(found)),              // drop = rollback
    }
    // 5. Your body, on the same transaction. An error rolls everything back.
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id).bind(msg.order_id).execute(&mut *tx).await
        .map_err(|e| Error::Handler { retryable: idem_runtime::is_transient(&e), source: e.into() })?;
    // 6. The guarded transition must change exactly one row, else roll back.
    let n = sqlx::query(r#"UPDATE "readme_coupon" SET "status" = $1 WHERE "id" = $2 AND "status" = $3"#)
        .bind("USED").bind(msg.coupon_id).bind("UNUSED").execute(&mut *tx).await?.rows_affected();
    if n != 1 { return Err(illegal(None)); }
    // 7. Commit. A connection failure here is `CommitUnknown` (retryable):
    //    the retry finds USED and answers Duplicate.
    tx.commit().await.map_err(Error::CommitUnknown)?;
    Ok(Outcome::Executed(()))
}
// README: end
