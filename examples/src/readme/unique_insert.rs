//! README, "`strategy = unique_insert`": a payment recorded once, the
//! platform's serial checked before anything runs.

use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

/// A payment platform's callback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Callback {
    /// The platform's payment serial: `PAY` and digits.
    pub serial: String,
    /// Cents.
    pub amount: i64,
}

// README: unique_insert
#[idempotent(key = "pay:{cb.serial}", strategy = unique_insert,
             constraint = "uk_readme_payment_serial", validate = check_serial)]
pub async fn record_payment(tx: &mut PgConnection, cb: &Callback) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_payment (serial, amount) VALUES ($1, $2)")
        .bind(&cb.serial).bind(cb.amount).execute(&mut *tx).await?;
    Ok(())
}

fn check_serial(key: &str) -> Result<(), String> {   // called with the whole key
    match key.strip_prefix("pay:PAY") {
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err(format!("`{key}` is not pay:PAY followed by digits")),
    }
}
// README: end
