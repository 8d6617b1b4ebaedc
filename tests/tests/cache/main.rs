//! The front cache (`idem-runtime/src/cache.rs`) on the real Redis: its
//! markers answering duplicates, its time bound on a faulty Redis, its
//! ttl, its metrics. One test binary, a module per file. Redis restarted
//! mid-run is `cache_outage.rs`, a binary of its own.

#[path = "../common"]
mod common {
    pub(crate) mod coupons;
}

mod bound;
mod marker;
mod metrics;
mod ttl;

use common::coupons::CouponState;
use idem_runtime::idempotent;
use sqlx::{Sqlite, Transaction};

/// "Deduct coupon `coupon_id`": the message of the bound and metrics
/// tests, on SQLite tables `coupon` and `deduction` of their own.
#[derive(Debug, Clone)]
struct Deduct {
    coupon_id: i64,
}

#[idempotent(
    key = "cache-deduct:{msg.coupon_id}",
    strategy = state_machine,
    table = "coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Sqlite>, msg: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
