#![allow(dead_code)]

use idem_runtime::idempotent;
use sqlx::{Sqlite, Transaction};

struct Callback {
    serial: String,
    amount: i64,
}

#[idempotent(key = "pay:{cb.serial}", strategy = unique_insert)]
async fn record_payment(tx: &mut Transaction<'_, Sqlite>, cb: &Callback) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payment (serial, amount) VALUES (?, ?)")
        .bind(&cb.serial)
        .bind(cb.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn main() {}
