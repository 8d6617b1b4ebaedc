//! README, "`strategy = state_machine`": the coupon deduction, keyed by
//! the outbox delivery, and the same transition bound to its order
//! (`key_column`).

use serde::{Deserialize, Serialize};

/// The "deduct coupon" message's payload: neither its topic nor its id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeductCoupon {
    /// The coupon to deduct.
    pub coupon_id: i64,
    /// The order it pays for.
    pub order_id: i64,
}

// README: state_machine
use idem_runtime::outbox::Delivery;
use idem_runtime::{idempotent, State};
use sqlx::{PgConnection, Postgres};

#[derive(Clone, Copy, State)]           // stored as "UNUSED", "USED"
enum CouponState { Unused, Used }

#[idempotent(
    key = "coupon-deduct:{d.topic}:{d.msg_id}",   // checked at compile time
    strategy = state_machine,
    table = "readme_coupon",            // validated identifiers, never runtime strings
    id = msg.coupon_id,                 // the entity this call acts on
    state_column = "status",            // default "status"; id_column defaults to "id"
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct_coupon(tx: &mut PgConnection, d: &Delivery<Postgres>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    // Only the mutation. The attribute did the locked read, and does the
    // guarded transition, the outbox update and the commit.
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id).bind(msg.order_id)
        .execute(&mut *tx).await?;
    Ok(())
}
// README: end

// README: key_column
#[idempotent(
    key = "coupon-deduct:{msg.order_id}",
    strategy = state_machine,
    table = "readme_coupon", id = msg.coupon_id,
    key_column = "used_by",             // VARCHAR(128) or wider, NULL until used
    from = CouponState::Unused, to = CouponState::Used,
)]
pub async fn deduct_coupon_for_order(tx: &mut PgConnection, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id).bind(msg.order_id)
        .execute(&mut *tx).await?;
    Ok(())
}
// README: end
