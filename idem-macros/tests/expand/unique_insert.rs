//! Expansion snapshot input: `strategy = unique_insert`.

#[idempotent(
    key = "pay:{cb.serial}",
    strategy = unique_insert,
    constraint = "payment.serial",
    validate = check_serial,
)]
async fn record_payment(tx: &mut Transaction<'_, Sqlite>, cb: &Callback) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payment (serial, amount) VALUES (?, ?)")
        .bind(&cb.serial)
        .bind(cb.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
