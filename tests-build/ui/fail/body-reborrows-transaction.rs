//! `&mut *tx` on a `&mut Transaction` parameter is not an executor in
//! sqlx; the error says what to write instead.
use idem_runtime::idempotent;
use sqlx::{Postgres, Transaction};

struct Notice {
    msg_id: String,
}

#[idempotent(key = "notice:{n.msg_id}", strategy = record, biz_type = "notice")]
async fn send(tx: &mut Transaction<'_, Postgres>, n: &Notice) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO notice (msg_id) VALUES ($1)")
        .bind(&n.msg_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

fn main() {}
