//! A handler generic over the database.
#![allow(dead_code)]

use idem_runtime::{Backend, idempotent};
use sqlx::Transaction;

struct Ping {
    id: u64,
}

#[idempotent(key = "ping:{msg.id}", strategy = unique_insert, constraint = "ping_pkey")]
async fn ping<DB: Backend>(tx: &mut Transaction<'_, DB>, msg: &Ping) -> Result<u64, sqlx::Error> {
    let _ = tx;
    Ok(msg.id)
}

async fn on_sqlite(pool: &sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
    let _ = ping(pool, &Ping { id: 1 }).await?;
    Ok(())
}

async fn on_postgres(pool: &sqlx::PgPool) -> Result<(), idem_runtime::Error> {
    let _ = ping(pool, &Ping { id: 1 }).await?;
    Ok(())
}

fn main() {}
