#![allow(dead_code)]

use idem_runtime::{idempotent, State};
use sqlx::{Sqlite, Transaction};

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

#[idempotent(
    key = "coupon-deduct:{msg.msg_id}",
    strategy = state_machine,
    table = "coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(msg: &DeductCoupon, tx: &mut Transaction<'_, Sqlite>) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn main() {}
