#![allow(dead_code)]

use idem_runtime::idempotent;
use sqlx::{Sqlite, Transaction};

#[derive(serde::Serialize)]
struct PayOrder {
    order_no: String,
    amount_cents: i64,
}

#[idempotent(key = "pay:{msg.order_no}", strategy = record, biz_type = "payment", ttl = "3600")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, msg: &PayOrder) -> Result<i64, sqlx::Error> {
    let id: i64 = sqlx::query_scalar("INSERT INTO payment (order_no, amount) VALUES (?, ?) RETURNING id")
        .bind(&msg.order_no)
        .bind(msg.amount_cents)
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}

fn main() {}
