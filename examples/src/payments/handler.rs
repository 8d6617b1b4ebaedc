//! The `#[idempotent]` handler: the record, and the order's state as
//! secondary verification, in one transaction.

use super::protocol::{Callback, Receipt, validate_serial};
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
    /// The order is already paid by another serial.
    AlreadyPaid {
        /// The order.
        order_id: i64,
        /// The serial that paid it.
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

/// Books a payment callback once, whatever the number of deliveries.
///
/// Generated signature: `apply_callback(source: impl Into<Source<'_,
/// Postgres>>, cb: &Callback) -> Result<Outcome<Receipt>, idem_runtime::Error>`.
/// The key `pay-callback:<serial>` is validated ([`validate_serial`]) before
/// the transaction begins. Then, in ONE transaction: the idempotency record
/// (a repeat answers `Duplicate(Some(stored receipt))`, another payload
/// under the same serial `KeyConflict`), this body — the order's state as
/// secondary verification, the guarded `PENDING_PAYMENT → PAID` flip, the
/// ledger row — the stored receipt, the commit.
#[idempotent(
    key = "pay-callback:{cb.serial}",
    strategy = record,
    biz_type = "payment_callback",
    biz_no = cb.order_id,
    validate = validate_serial,
    ttl = "30d",
    fingerprint = [cb],
)]
pub async fn apply_callback(
    tx: &mut Transaction<'_, Postgres>,
    cb: &Callback,
) -> Result<Receipt, PaymentError> {
    // The order, locked: concurrent callbacks for the same order (other
    // serials) queue here.
    let order: Option<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT amount_cents, status, paid_serial FROM pay_orders WHERE id = $1 FOR UPDATE",
    )
    .bind(cb.order_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((amount, status, paid_serial)) = order else {
        return Err(PaymentError::UnknownOrder {
            order_id: cb.order_id,
        });
    };
    if status == PAID {
        let by_serial = paid_serial.unwrap_or_default();
        if by_serial != cb.serial {
            return Err(PaymentError::AlreadyPaid {
                order_id: cb.order_id,
                by_serial,
            });
        }
        // Paid by this very serial, yet no idempotency record (it was
        // archived): the order's state is the proof the action happened.
        // Answer with the same receipt, rebuilt from the ledger.
        let booked: (i64, i64, String) = sqlx::query_as(
            r#"SELECT order_id, amount_cents,
                      to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                 FROM pay_payments WHERE serial = $1"#,
        )
        .bind(&cb.serial)
        .fetch_one(&mut **tx)
        .await?;
        if (booked.0, booked.1) != (cb.order_id, cb.amount_cents) {
            return Err(PaymentError::SerialReused {
                serial: cb.serial.clone(),
            });
        }
        return Ok(receipt(cb, booked.2));
    }
    if status != PENDING_PAYMENT {
        return Err(PaymentError::NotPayable {
            order_id: cb.order_id,
            status,
        });
    }
    if amount != cb.amount_cents {
        return Err(PaymentError::AmountMismatch {
            order_id: cb.order_id,
            expected: amount,
            got: cb.amount_cents,
        });
    }
    // The guarded transition: exactly one row, or roll everything back.
    let flipped = sqlx::query(
        "UPDATE pay_orders SET status = $1, paid_serial = $2, updated_at = now() \
         WHERE id = $3 AND status = $4",
    )
    .bind(PAID)
    .bind(&cb.serial)
    .bind(cb.order_id)
    .bind(PENDING_PAYMENT)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if flipped != 1 {
        return Err(PaymentError::NotPayable {
            order_id: cb.order_id,
            status: format!("changed concurrently ({flipped} rows flipped)"),
        });
    }
    let paid_at: String = sqlx::query_scalar(
        r#"INSERT INTO pay_payments (serial, order_id, amount_cents) VALUES ($1, $2, $3)
           RETURNING to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"#,
    )
    .bind(&cb.serial)
    .bind(cb.order_id)
    .bind(cb.amount_cents)
    .fetch_one(&mut **tx)
    .await?;
    Ok(receipt(cb, paid_at))
}

fn receipt(cb: &Callback, paid_at: String) -> Receipt {
    Receipt {
        result: "SUCCESS".into(),
        serial: cb.serial.clone(),
        order_id: cb.order_id,
        amount_cents: cb.amount_cents,
        order_status: PAID.into(),
        paid_at,
    }
}
