#![allow(dead_code)]

use idem_runtime::idempotent;
use sqlx::{Sqlite, Transaction};

struct CreatePayment {
    order_id: i64,
    coupon_code: Option<String>,
}

#[idempotent(key = "payment:{msg.order_id}:{msg.coupon_code}", strategy = unique_insert, constraint = "payment.order_id")]
async fn create_payment(tx: &mut Transaction<'_, Sqlite>, msg: &CreatePayment) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payment (order_id) VALUES (?)")
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn main() {}
