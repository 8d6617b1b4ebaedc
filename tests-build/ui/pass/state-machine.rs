//! `strategy = state_machine`: every option, an `i64` and a `String` entity
//! id, renamed states, and the call sites (plain pool and outbox source).
#![allow(dead_code)]

use idem_runtime::{Outcome, Source, State, idempotent};
use sqlx::{Sqlite, SqlitePool, Transaction};

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    #[state(rename = "DEDUCTED")]
    Used,
    PartlyRefunded,
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
async fn deduct(tx: &mut Transaction<'_, Sqlite>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum OrderState {
    Paid,
    Shipped,
}

/// Owned parameters, a text id, a schema-qualified table, custom columns,
/// a `pub` handler and a non-unit result.
#[idempotent(
    key = "order-ship:{order_no}:{carrier}",
    strategy = state_machine,
    table = "shop.orders",
    id = order_no,
    id_column = "order_no",
    state_column = "order_state",
    key_column = "ship_key",
    from = OrderState::Paid,
    to = OrderState::Shipped,
)]
pub async fn ship(
    tx: &mut Transaction<'_, sqlx::Postgres>,
    order_no: String,
    carrier: u32,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let done = sqlx::query("INSERT INTO shipment (order_no, carrier) VALUES ($1, $2)")
        .bind(&order_no)
        .bind(carrier as i64)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected())
}

fn assert_send<T: Send>(t: T) -> T {
    t
}

async fn relay(pool: &SqlitePool, msg: &DeductCoupon) -> Result<bool, idem_runtime::Error> {
    let first: Outcome<()> = assert_send(deduct(pool, msg)).await?;
    let lease = idem_runtime::outbox::OutboxLease::new(17, "coupon.deduct", "relay-1", 1);
    let again = deduct(Source::outbox(pool, lease), msg).await?;
    Ok(first.is_executed() && again.is_duplicate())
}

fn main() {}
