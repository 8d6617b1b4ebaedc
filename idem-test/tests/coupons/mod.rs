//! The coupon handlers the SQLite tests share: the README's
//! `state_machine` handler, the article's fault version (its check outside
//! the transaction), one writing its effect through a second pool; and the
//! panic message of a failed `assert_acts_once`.

#![allow(dead_code)]

use idem_runtime::{Outcome, State, idempotent};
use idem_test::Report;
use sqlx::{SqliteConnection, SqlitePool};

#[derive(Clone, Copy, State)]
pub(crate) enum CouponState {
    Unused,
    Used,
}

/// The README's quick-start handler.
#[idempotent(
    key = "coupon-deduct:{order_id}",
    strategy = state_machine,
    table = "coupon", id = coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
pub(crate) async fn deduct_coupon(
    tx: &mut SqliteConnection,
    coupon_id: i64,
    order_id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(coupon_id)
        .bind(order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The article's fault version: the coupon's status read outside the
/// transaction.
pub(crate) async fn fault_version(
    pool: SqlitePool,
    coupon: i64,
    order: i64,
) -> Result<Outcome<()>, sqlx::Error> {
    let status: String = sqlx::query_scalar("SELECT status FROM coupon WHERE id = ?")
        .bind(coupon)
        .fetch_one(&pool)
        .await?;
    if status != "UNUSED" {
        return Ok(Outcome::Duplicate(None)); // "coupon already deducted"
    }
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(coupon)
        .bind(order)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE coupon SET status = 'USED' WHERE id = ?")
        .bind(coupon)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Outcome::Executed(()))
}

/// The panic message of `report.assert_acts_once()`.
pub(crate) fn panic_message(report: &Report) -> String {
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report.assert_acts_once()));
    let payload = caught.expect_err("assert_acts_once must panic");
    payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
}

/// A `state_machine` handler whose effect goes through a second pool (here
/// another database), outside the call's transaction.
#[idempotent(
    key = "coupon-deduct:{order_id}",
    strategy = state_machine,
    table = "coupon", id = coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
pub(crate) async fn deduct_through_second_pool(
    tx: &mut SqliteConnection,
    ledger: &SqlitePool,
    coupon_id: i64,
    order_id: i64,
) -> Result<(), sqlx::Error> {
    // Wrong: committed on its own, whatever becomes of the call.
    sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(coupon_id)
        .bind(order_id)
        .execute(ledger)
        .await?;
    sqlx::query("SELECT 1").execute(&mut *tx).await?;
    Ok(())
}
