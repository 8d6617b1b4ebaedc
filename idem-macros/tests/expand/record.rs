//! Expansion snapshot input: `strategy = record`.

#[idempotent(
    key = "notice:{n.msg_id}",
    strategy = record,
    biz_type = "notice",
    biz_no = n.user_id,
    ttl = "7d",
    fingerprint = [n.user_id, n.text],
)]
async fn send_notice(tx: &mut Transaction<'_, Sqlite>, n: &Notice) -> Result<Receipt, sqlx::Error> {
    sqlx::query("INSERT INTO sent (user_id, text) VALUES (?, ?)")
        .bind(n.user_id)
        .bind(&n.text)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt { channel: "sms".into() })
}
