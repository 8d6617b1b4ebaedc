//! Expansion snapshot input: `strategy = state_machine`.

#[idempotent(
    key = "coupon-deduct:{msg.msg_id}",
    strategy = state_machine,
    table = "coupon",
    id = msg.coupon_id,
    key_column = "deducted_by",
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Sqlite>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO deduction (coupon_id) VALUES (?)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
