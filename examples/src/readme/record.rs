//! README, "`strategy = record`": a notice sent once, its receipt stored
//! and replayed to duplicates.

use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

/// A notice to send.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notice {
    /// The message's id.
    pub msg_id: String,
    /// Whom to notify.
    pub user_id: i64,
    /// What to say.
    pub text: String,
}

/// What sending it answered: stored with the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The notice row written.
    pub notice_id: i64,
}

// README: record
#[idempotent(
    key = "notice:{msg.msg_id}",
    strategy = record,
    biz_type = "notice",        // required: the dedupe scope, 1–64 bytes of [A-Za-z0-9_.-]
    biz_no = msg.user_id,       // default: the key
    ttl = "7d",                 // expire_time = now + ttl; default 7d; 30s, 15m, 24h, 1d12h…
    fingerprint = [msg],        // default: every parameter (must be serde::Serialize)
)]
pub async fn send_notice(tx: &mut PgConnection, msg: &Notice) -> Result<Receipt, sqlx::Error> {
    let notice_id = sqlx::query_scalar("INSERT INTO readme_notice (user_id, text) VALUES ($1, $2) RETURNING id")
        .bind(msg.user_id).bind(&msg.text).fetch_one(&mut *tx).await?;
    Ok(Receipt { notice_id })
}
// Ok(Outcome::Executed(receipt)) the first time; Ok(Outcome::Duplicate(Some(receipt))) after.
// README: end
