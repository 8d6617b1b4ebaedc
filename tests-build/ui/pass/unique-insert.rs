//! `strategy = unique_insert`, on MariaDB/MySQL, with an `sqlx::Result`
//! alias as the return type.
#![allow(dead_code)]

use idem_runtime::idempotent;
use sqlx::{MySql, MySqlPool, Transaction};

struct SendNotice {
    user_id: u64,
    notice_id: String,
}

#[idempotent(key = "notice:{msg.user_id}:{msg.notice_id}", strategy = unique_insert, constraint = "notice_user_notice")]
async fn send_notice(tx: &mut Transaction<'_, MySql>, msg: &SendNotice) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO notice (user_id, notice_id) VALUES (?, ?)")
        .bind(msg.user_id)
        .bind(&msg.notice_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn caller(pool: &MySqlPool) -> Result<(), idem_runtime::Error> {
    let msg = SendNotice { user_id: 7, notice_id: "welcome".into() };
    let _ = send_notice(pool, &msg).await?;
    Ok(())
}

fn main() {}
