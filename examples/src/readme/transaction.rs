//! README, "Inside the caller's transaction": a handler called on a
//! transaction the caller holds.

use super::state_machine::{DeductCoupon, deduct_coupon_for_order};
use idem_runtime::{CallerTx, Outcome};
use sqlx::PgPool;

// README: transaction
/// An HTTP handler placing an order: the order row and the coupon deduction commit together.
pub async fn place_order(pool: &PgPool, msg: &DeductCoupon) -> Result<Outcome<()>, idem_runtime::Error> {
    let mut tx = CallerTx::begin(pool).await?;
    sqlx::query("INSERT INTO readme_orders (id, status) VALUES ($1, 'PLACED')")
        .bind(msg.order_id).execute(tx.conn()?).await?;
    let outcome = deduct_coupon_for_order(&mut tx, msg).await?;  // runs in a savepoint of tx
    tx.commit().await?;                                          // the order and the deduction, or neither
    Ok(outcome)
}
// README: end
