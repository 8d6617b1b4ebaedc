//! The body written like ordinary sqlx code: the first parameter is the
//! transaction's connection, and queries run on `&mut *tx`. Called with a
//! pool, or inside a transaction the caller holds.
#![allow(dead_code)]

use idem_runtime::{CallerTx, Outcome, Source, idempotent};
use sqlx::{SqliteConnection, SqlitePool};

#[derive(serde::Serialize)]
struct Notice {
    msg_id: String,
}

#[idempotent(key = "notice:{n.msg_id}", strategy = record, biz_type = "notice")]
async fn send(tx: &mut SqliteConnection, n: &Notice) -> Result<i64, sqlx::Error> {
    let done = sqlx::query("INSERT INTO notice (msg_id) VALUES (?)")
        .bind(&n.msg_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE notice SET sent = 1 WHERE msg_id = ?")
        .bind(&n.msg_id)
        .execute(&mut *tx)
        .await?;
    Ok(done.last_insert_rowid())
}

async fn call_sites(pool: SqlitePool, n: Notice) -> Result<(), idem_runtime::Error> {
    let _: Outcome<i64> = send(&pool, &n).await?;
    let mut tx = CallerTx::begin(&pool).await?;
    let _: Outcome<i64> = send(&mut tx, &n).await?;
    let _: Outcome<i64> = send(Source::transaction(&mut tx), &n).await?;
    tx.commit().await?;
    Ok(())
}

fn main() {}
