//! The `#[idempotent]` handler: the record, and the order's state as
//! secondary verification, in one transaction.

use super::protocol::{Payment, Receipt, validate_key};
use super::{PAID, PENDING_PAYMENT};
use idem_runtime::idempotent;
use sqlx::{Postgres, Transaction};

// ---- the idempotent handler --------------------------------------------------

/// What the secondary verification (the order's state) can reject. Any of
/// these rolls the whole transaction back, the idempotency record included,
/// so a later, corrected callback is not mistaken for a duplicate.
#[derive(Debug)]
pub enum PaymentError {
    /// No such order.
    UnknownOrder {
        /// The order id of the callback.
        order_id: i64,
    },
    /// The callback's amount is not the order's.
    AmountMismatch {
        /// The order.
        order_id: i64,
        /// The order's amount.
        expected: i64,
        /// The callback's amount.
        got: i64,
    },
    /// The order is already paid by another serial (or platform).
    AlreadyPaid {
        /// The order.
        order_id: i64,
        /// Who paid it: `<platform>:<serial>`.
        by_serial: String,
    },
    /// The order is neither awaiting payment nor paid.
    NotPayable {
        /// The order.
        order_id: i64,
        /// Its state.
        status: String,
    },
    /// The serial was booked before with another amount or order (seen
    /// from the ledger, once the idempotency record is gone).
    SerialReused {
        /// The serial.
        serial: String,
    },
    /// The database failed (retryable when transient).
    Database(sqlx::Error),
}

impl std::fmt::Display for PaymentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PaymentError::UnknownOrder { order_id } => write!(f, "no order {order_id}"),
            PaymentError::AmountMismatch {
                order_id,
                expected,
                got,
            } => write!(
                f,
                "order {order_id} costs {expected} cents, the callback says {got}"
            ),
            PaymentError::AlreadyPaid {
                order_id,
                by_serial,
            } => write!(f, "order {order_id} is already paid by serial {by_serial}"),
            PaymentError::NotPayable { order_id, status } => {
                write!(f, "order {order_id} is {status}, not {PENDING_PAYMENT}")
            }
            PaymentError::SerialReused { serial } => write!(
                f,
                "serial {serial} was booked before with another amount or order"
            ),
            PaymentError::Database(e) => write!(f, "database error: {e}"),
        }
    }
}

impl std::error::Error for PaymentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // idem finds the sqlx::Error in the chain and decides whether a
            // retry can help.
            PaymentError::Database(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for PaymentError {
    fn from(e: sqlx::Error) -> Self {
        PaymentError::Database(e)
    }
}

/// Books a verified payment once, whatever the number of deliveries.
///
/// Generated signature: `apply_payment(source: impl Into<Source<'_,
/// Postgres>>, p: &Payment) -> Result<Outcome<Receipt>, idem_runtime::Error>`.
/// The key `pay-callback:<platform>:<serial>` is validated
/// ([`validate_key`]) before the transaction begins. Then, in ONE
/// transaction: the idempotency record (a repeat answers
/// `Duplicate(Some(stored receipt))`, another payment under the same serial
/// `KeyConflict`), this body — the order's state as secondary verification,
/// the guarded `PENDING_PAYMENT → PAID` flip, the ledger row — the stored
/// receipt, the commit.
#[idempotent(
    key = "pay-callback:{p.platform}:{p.serial}",
    strategy = record,
    biz_type = "payment_callback",
    biz_no = p.order_id,
    validate = validate_key,
    ttl = "30d",
    fingerprint = [p],
)]
pub async fn apply_payment(
    tx: &mut Transaction<'_, Postgres>,
    p: &Payment,
) -> Result<Receipt, PaymentError> {
    let by = paid_by(p);
    // The order, locked: concurrent callbacks for the same order (other
    // serials, other platforms) queue here.
    let order: Option<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT amount_cents, status, paid_by FROM merchant_orders WHERE id = $1 FOR UPDATE",
    )
    .bind(p.order_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((amount, status, paid)) = order else {
        return Err(PaymentError::UnknownOrder {
            order_id: p.order_id,
        });
    };
    if status == PAID {
        return already_paid(tx, p, paid.unwrap_or_default()).await;
    }
    if status != PENDING_PAYMENT {
        return Err(PaymentError::NotPayable {
            order_id: p.order_id,
            status,
        });
    }
    if amount != p.amount_cents {
        return Err(PaymentError::AmountMismatch {
            order_id: p.order_id,
            expected: amount,
            got: p.amount_cents,
        });
    }
    // The guarded transition: exactly one row, or roll everything back.
    let flipped = sqlx::query(
        "UPDATE merchant_orders SET status = $1, paid_by = $2, updated_at = now() \
         WHERE id = $3 AND status = $4",
    )
    .bind(PAID)
    .bind(&by)
    .bind(p.order_id)
    .bind(PENDING_PAYMENT)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if flipped != 1 {
        return Err(PaymentError::NotPayable {
            order_id: p.order_id,
            status: format!("changed concurrently ({flipped} rows flipped)"),
        });
    }
    let paid_at: String = sqlx::query_scalar(
        r#"INSERT INTO merchant_payments (platform, serial, order_id, amount_cents)
           VALUES ($1, $2, $3, $4)
           RETURNING to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"#,
    )
    .bind(&p.platform)
    .bind(&p.serial)
    .bind(p.order_id)
    .bind(p.amount_cents)
    .fetch_one(&mut **tx)
    .await?;
    Ok(receipt(p, paid_at))
}

/// `<platform>:<serial>`: who paid an order (`merchant_orders.paid_by`).
pub fn paid_by(p: &Payment) -> String {
    format!("{}:{}", p.platform, p.serial)
}

/// A payment for an order already `PAID` (by `paid`): a second payment
/// unless it is this very one, found without its idempotency record (it
/// was archived): then the order's state is the proof the action happened,
/// and the answer the same receipt, rebuilt from the ledger.
async fn already_paid(
    tx: &mut Transaction<'_, Postgres>,
    p: &Payment,
    paid: String,
) -> Result<Receipt, PaymentError> {
    if paid != paid_by(p) {
        return Err(PaymentError::AlreadyPaid {
            order_id: p.order_id,
            by_serial: paid,
        });
    }
    let booked: (i64, i64, String) = sqlx::query_as(
        r#"SELECT order_id, amount_cents,
                  to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
             FROM merchant_payments WHERE platform = $1 AND serial = $2"#,
    )
    .bind(&p.platform)
    .bind(&p.serial)
    .fetch_one(&mut **tx)
    .await?;
    if (booked.0, booked.1) != (p.order_id, p.amount_cents) {
        return Err(PaymentError::SerialReused {
            serial: p.serial.clone(),
        });
    }
    Ok(receipt(p, booked.2))
}

fn receipt(p: &Payment, paid_at: String) -> Receipt {
    Receipt {
        platform: p.platform.clone(),
        serial: p.serial.clone(),
        order_id: p.order_id,
        amount_cents: p.amount_cents,
        order_status: PAID.into(),
        paid_at,
    }
}
