//! `strategy = record`: every option, a serializable result that is stored
//! and replayed, on PostgreSQL.
#![allow(dead_code)]

use idem_runtime::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};

#[derive(Serialize)]
struct PayOrder {
    order_no: String,
    amount_cents: i64,
    note: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(
    key = "pay:{msg.order_no}",
    strategy = record,
    biz_type = "payment",
    biz_no = msg.order_no,
    ttl = "1d12h",
    fingerprint = [msg.order_no, msg.amount_cents],
)]
async fn pay(tx: &mut Transaction<'_, Postgres>, msg: &PayOrder) -> Result<Receipt, sqlx::Error> {
    let payment_id: i64 =
        sqlx::query_scalar("INSERT INTO payment (order_no, amount) VALUES ($1, $2) RETURNING id")
            .bind(&msg.order_no)
            .bind(msg.amount_cents)
            .fetch_one(&mut **tx)
            .await?;
    Ok(Receipt { payment_id })
}

/// Defaults: the whole payload (every parameter) is fingerprinted, the
/// handler's name is the biz type, the key is the biz number.
#[idempotent(key = "refund:{order_no}:{attempt}", strategy = record, biz_type = "refund")]
async fn refund(
    tx: &mut Transaction<'_, Postgres>,
    order_no: &str,
    attempt: u8,
    reason: String,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO refund (order_no, reason) VALUES ($1, $2)")
        .bind(order_no)
        .bind(reason)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn caller(pool: &PgPool, msg: &PayOrder) -> Result<Option<i64>, idem_runtime::Error> {
    let receipt: Outcome<Receipt> = pay(pool, msg).await?;
    let _ = refund(pool, "o-1", 1, "damaged".into()).await?;
    Ok(receipt.into_value().map(|r| r.payment_id))
}

fn main() {}
