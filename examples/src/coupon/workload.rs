//! The workload: orders, each committed with its deduction message, and
//! the producer retries.

use super::BoxError;
use super::args::Args;
use super::handlers::{CouponState, DeductCoupon, Handler};
use super::sql::{sql, table_sql};
use idem_runtime::Dialect;
use idem_runtime::State;
use sqlx::AnyPool;

pub(super) const SCHEMA: &[&str] = &[
    "DROP TABLE IF EXISTS {t}_deduction",
    "DROP TABLE IF EXISTS {t}_order",
    "DROP TABLE IF EXISTS {t}_coupon",
    "CREATE TABLE {t}_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
    "CREATE TABLE {t}_order (id BIGINT PRIMARY KEY, coupon_id BIGINT NOT NULL)",
    // No key: a double deduction must be able to show up as a second row.
    "CREATE TABLE {t}_deduction (
        coupon_id BIGINT NOT NULL,
        order_id BIGINT NOT NULL,
        msg_id VARCHAR(64) NOT NULL
    )",
    "CREATE INDEX {t}_deduction_coupon ON {t}_deduction (coupon_id)",
];

/// Order-placing tasks per handler.
pub(super) const PRODUCERS: i64 = 4;

/// Whether the producer of `order` published its message a second time.
/// A golden-ratio sequence: the same orders for both handlers, spread
/// evenly, `rate` of them.
fn producer_retried(order: i64, rate: f64) -> bool {
    (order as f64 * 0.618_033_988_749_895).fract() < rate
}

/// Fresh tables for `h` and its coupons, then the orders, placed by
/// [`PRODUCERS`] tasks at once. Returns the number of messages.
pub(super) async fn place_orders(
    pool: &AnyPool,
    dialect: Dialect,
    h: Handler,
    opts: &Args,
) -> Result<i64, BoxError> {
    // On one connection: on SQLite, a pooled connection that read the
    // tables before they were dropped could still see them.
    let mut conn = pool.acquire().await?;
    for stmt in SCHEMA {
        sqlx::query(table_sql(dialect, h, stmt))
            .execute(&mut *conn)
            .await?;
    }
    drop(conn);
    sqlx::query(sql(dialect, "DELETE FROM idem_outbox WHERE topic = ?"))
        .bind(h.topic())
        .execute(pool)
        .await?;

    let mut tx = pool.begin().await?;
    for coupon_id in 1..=opts.orders {
        sqlx::query(table_sql(
            dialect,
            h,
            "INSERT INTO {t}_coupon (id, status) VALUES (?, ?)",
        ))
        .bind(coupon_id)
        .bind(CouponState::Unused.as_str())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;

    let mut producers = tokio::task::JoinSet::new();
    for first in 1..=PRODUCERS.min(opts.orders) {
        let (pool, orders, rate) = (pool.clone(), opts.orders, opts.redelivery_rate);
        producers.spawn(async move {
            let mut messages = 0;
            for order_id in (first..=orders).step_by(PRODUCERS as usize) {
                messages += place_order(&pool, dialect, h, order_id, rate).await?;
            }
            Ok::<i64, BoxError>(messages)
        });
    }
    let mut messages = 0;
    while let Some(placed) = producers.join_next().await {
        messages += placed??;
    }
    Ok(messages)
}

/// One order: the order row and its deduction message commit in one
/// transaction. A producer retry enqueues the message again, under
/// another id. Returns the number of messages enqueued.
async fn place_order(
    pool: &AnyPool,
    dialect: Dialect,
    h: Handler,
    order_id: i64,
    redelivery_rate: f64,
) -> Result<i64, BoxError> {
    let msg = DeductCoupon {
        msg_id: format!("order-{order_id}"),
        order_id,
        coupon_id: order_id,
    };
    let mut tx = pool.begin().await?;
    sqlx::query(table_sql(
        dialect,
        h,
        "INSERT INTO {t}_order (id, coupon_id) VALUES (?, ?)",
    ))
    .bind(msg.order_id)
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?;
    let payload = serde_json::to_value(&msg)?;
    let _ = idem_runtime::outbox::enqueue(&mut tx, h.topic(), &msg.msg_id, &payload).await?;
    tx.commit().await?;
    if !producer_retried(order_id, redelivery_rate) {
        return Ok(1);
    }

    // The producer did not trust its first publication and sent the
    // message again, under a new id.
    let again = DeductCoupon {
        msg_id: format!("order-{order_id}-retry"),
        ..msg
    };
    let mut tx = pool.begin().await?;
    let payload = serde_json::to_value(&again)?;
    let _ = idem_runtime::outbox::enqueue(&mut tx, h.topic(), &again.msg_id, &payload).await?;
    tx.commit().await?;
    Ok(2)
}
