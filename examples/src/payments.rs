//! # Third-party payment callbacks
//!
//! A payment platform tells the merchant that an order was paid by calling
//! the merchant back, and its retry policy is its safety net: **any answer
//! other than 200, and any connection time-out, makes it push the same
//! callback again**, whether or not the merchant already acted on it
//! (*Async Idempotency in Practice*, 02.3). So the callback endpoint runs
//! more than once per payment — one after the other when a response is
//! lost, side by side when the platform's pushes overlap — and must pay the
//! order exactly once and answer every repetition with success.
//!
//! The article's recipe for this entry point (05.2): **the platform's
//! payment serial as the idempotency key, plus the order's business state
//! as secondary verification**; and, since the serial comes from outside,
//! **validated for legitimacy** (04, risk 1) so that a crafted ID cannot
//! bypass or poison the idempotency logic. Here:
//!
//! 1. **Signature first.** The platform signs the raw request body with
//!    HMAC-SHA256 under a secret shared with the merchant and sends
//!    `X-Signature: hex(hmac_sha256(secret, body))`. The endpoint verifies it
//!    over the *raw bytes* (before parsing, in constant time with
//!    [`hmac::Mac::verify_slice`]) and answers 400 before anything touches
//!    the database. A forged or tampered callback never reaches the
//!    idempotency table.
//! 2. **Serial format.** A serial is `PAY` followed by exactly 20 ASCII
//!    digits (see [`check_serial`]). The `#[idempotent]` handler's
//!    `validate = validate_serial` rejects anything else (`../../x`, a
//!    10 KB string, lower case, control characters) as
//!    [`Error::InvalidKey`](idem_runtime::Error::InvalidKey), before its
//!    transaction begins: 400, nothing written.
//! 3. **Key and record.** [`apply_callback`] is an
//!    `#[idempotent(strategy = record)]` handler keyed
//!    `pay-callback:{serial}`. In one transaction it claims the record
//!    (`idem_record`, with a fingerprint of the whole callback), runs the
//!    body, and stores the body's [`Receipt`]; a repeated callback finds the
//!    record and gets the stored receipt back — the HTTP answer is 200 with
//!    byte-identical JSON (plus `X-Idempotent-Replay: true`). The same serial
//!    with another amount (or order) has another fingerprint:
//!    [`Error::KeyConflict`](idem_runtime::Error::KeyConflict), 409.
//! 4. **Secondary verification.** The body locks the order
//!    (`SELECT … FOR UPDATE`, same transaction), checks it against the
//!    callback (it exists, the amount matches, it is `PENDING_PAYMENT`),
//!    flips it `PENDING_PAYMENT → PAID` with a guarded `UPDATE` that must
//!    change exactly one row, and writes the payment ledger row. An order
//!    already `PAID` *by this serial* (possible only once the record has
//!    been archived) is answered from the ledger with the same receipt; an
//!    order paid by *another* serial is a double payment the merchant must
//!    not book: 409. The `record` and `state_machine` strategies cannot be
//!    combined in one attribute, so this check is written by hand — on the
//!    record's own transaction, which is what makes it a verification and
//!    not a race.
//!
//! ## Status codes
//!
//! | status | `code` | when |
//! |---|---|---|
//! | 200 | — ([`Receipt`]) | paid now, or a repetition (the stored receipt, byte for byte; `X-Idempotent-Replay: true`) |
//! | 400 | `BAD_SIGNATURE` | `X-Signature` missing, not hex, or not the HMAC of the raw body; nothing read from or written to the database |
//! | 400 | `BAD_REQUEST` | the body is not a callback (JSON `{serial, order_id, amount_cents, status}`) |
//! | 400 | `BAD_SERIAL` | the serial is not `PAY` + 20 digits ([`Error::InvalidKey`](idem_runtime::Error::InvalidKey)); nothing written |
//! | 409 | `SERIAL_REUSED` | the serial was used before with another payload ([`Error::KeyConflict`](idem_runtime::Error::KeyConflict)); nothing written |
//! | 409 | `ORDER_ALREADY_PAID` | the order is `PAID` by another serial: a second payment for one order, for a human (refund); nothing written |
//! | 409 | `ORDER_NOT_PAYABLE` | the order is in another state (`CANCELLED`) |
//! | 413 | — (axum's plain-text rejection) | the body is over [`MAX_BODY`] bytes; nothing read |
//! | 422 | `UNKNOWN_ORDER`, `AMOUNT_MISMATCH`, `UNSUPPORTED_STATUS` | the callback contradicts the merchant's order, or is not a success notification |
//! | 503 | `RETRY_LATER` | a retryable failure (lost connection, pool time-out, deadlock, commit outcome unknown): the platform's retry is safe |
//! | 500 | `INTERNAL` | anything else |
//!
//! Every error body but 413's is JSON [`ErrorBody`] `{"code": …, "message": …}`. The
//! platform retries every non-200 answer (that is its policy, not ours), so
//! a permanent 4xx only costs it its bounded retries; 409 for a double
//! payment deliberately keeps the conflict visible on the platform's side.
//!
//! ## Tables (PostgreSQL, created by [`migrate`])
//!
//! - `pay_orders (id, amount_cents, status, paid_serial, …)`: status
//!   `PENDING_PAYMENT`, `PAID` or `CANCELLED`; `paid_serial` is set exactly
//!   when the order is `PAID` (a check constraint).
//! - `pay_payments (serial PRIMARY KEY, order_id UNIQUE, amount_cents,
//!   paid_at)`: the payment ledger, one row per booked payment.
//! - idem's `idem_record` (`biz_type = 'payment_callback'`, `biz_no` = the
//!   order id).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{KeyInit, Mac};
use idem_runtime::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The callback endpoint's path.
pub const CALLBACK_PATH: &str = "/callbacks/payment";
/// The header carrying `hex(hmac_sha256(secret, raw_body))`.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// Set (`true`) on a 200 that replays the stored receipt of an earlier call.
pub const REPLAY_HEADER: &str = "x-idempotent-replay";
/// A serial's prefix.
pub const SERIAL_PREFIX: &str = "PAY";
/// The number of digits after the prefix.
pub const SERIAL_DIGITS: usize = 20;
/// The idempotency key's prefix (the key is `pay-callback:<serial>`).
pub const KEY_PREFIX: &str = "pay-callback:";
/// The largest callback body accepted, in bytes.
pub const MAX_BODY: usize = 16 * 1024;

/// An order awaiting its payment.
pub const PENDING_PAYMENT: &str = "PENDING_PAYMENT";
/// A paid order.
pub const PAID: &str = "PAID";
/// A cancelled order (cannot be paid).
pub const CANCELLED: &str = "CANCELLED";

// ---- the callback and the answers ------------------------------------------

/// A payment platform's callback: "order `order_id` was paid
/// `amount_cents` under `serial`". Unknown JSON fields are ignored (and not
/// part of the fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Callback {
    /// The platform's payment serial: `PAY` + 20 digits. The idempotency key.
    pub serial: String,
    /// The merchant's order.
    pub order_id: i64,
    /// The amount paid, in cents.
    pub amount_cents: i64,
    /// The payment's status; only `"SUCCESS"` is accepted.
    pub status: String,
}

impl Callback {
    /// A successful payment of `amount_cents` for `order_id` under `serial`.
    pub fn success(serial: impl Into<String>, order_id: i64, amount_cents: i64) -> Self {
        Callback {
            serial: serial.into(),
            order_id,
            amount_cents,
            status: "SUCCESS".into(),
        }
    }
}

/// The 200 answer: what was booked. Stored by the `record` strategy and
/// replayed, unchanged, to every repetition of the callback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Always `"SUCCESS"` (what payment platforms expect to read).
    pub result: String,
    /// The payment serial.
    pub serial: String,
    /// The order paid.
    pub order_id: i64,
    /// The amount booked, in cents.
    pub amount_cents: i64,
    /// The order's state after the payment: `"PAID"`.
    pub order_status: String,
    /// When the payment was booked (UTC, RFC 3339, microseconds).
    pub paid_at: String,
}

/// The body of every non-200 answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable machine-readable code (see the module's table).
    pub code: String,
    /// A human-readable explanation.
    pub message: String,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        code: code.into(),
        message: message.into(),
    };
    (status, axum::Json(body)).into_response()
}

// ---- validation of externally supplied data ---------------------------------

/// The serial format: `PAY` followed by exactly [`SERIAL_DIGITS`] ASCII
/// digits, e.g. `PAY00000000000000000042`. Anything else — path fragments,
/// over-long strings, other alphabets, control characters — is rejected.
pub fn check_serial(serial: &str) -> Result<(), String> {
    let shown: String = serial
        .chars()
        .take(40)
        .flat_map(char::escape_default)
        .collect();
    let Some(digits) = serial.strip_prefix(SERIAL_PREFIX) else {
        return Err(format!(
            "serial `{shown}` does not start with `{SERIAL_PREFIX}`"
        ));
    };
    if digits.len() != SERIAL_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "serial `{shown}` is not `{SERIAL_PREFIX}` followed by {SERIAL_DIGITS} digits"
        ));
    }
    Ok(())
}

/// The `validate` function of [`apply_callback`]: it receives the whole
/// derived key (`pay-callback:<serial>`), not the serial alone.
pub fn validate_serial(key: &str) -> Result<(), String> {
    match key.strip_prefix(KEY_PREFIX) {
        Some(serial) => check_serial(serial),
        None => Err(format!("key does not start with `{KEY_PREFIX}`")),
    }
}

/// The serial numbered `n`: `PAY` and `n` on 20 digits.
pub fn serial(n: u64) -> String {
    format!("{SERIAL_PREFIX}{n:0width$}", width = SERIAL_DIGITS)
}

/// `hex(hmac_sha256(secret, body))`: the value of [`SIGNATURE_HEADER`].
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Why a signature was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    /// No `X-Signature` header.
    Missing,
    /// The header is not (ASCII) hex.
    Malformed,
    /// Not the HMAC of this body under the shared secret.
    Mismatch,
}

impl std::fmt::Display for SignatureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SignatureError::Missing => "the X-Signature header is missing",
            SignatureError::Malformed => "the X-Signature header is not hex",
            SignatureError::Mismatch => "the signature does not match the body",
        })
    }
}

impl std::error::Error for SignatureError {}

/// Verifies `signature` (hex) as the HMAC-SHA256 of the raw `body` under
/// `secret`, comparing in constant time ([`Mac::verify_slice`]).
pub fn verify_signature(
    secret: &[u8],
    body: &[u8],
    signature: Option<&HeaderValue>,
) -> Result<(), SignatureError> {
    let sig = signature.ok_or(SignatureError::Missing)?;
    let sig = sig.to_str().map_err(|_| SignatureError::Malformed)?;
    let tag = hex::decode(sig.trim()).map_err(|_| SignatureError::Malformed)?;
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    mac.verify_slice(&tag).map_err(|_| SignatureError::Mismatch)
}

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

// ---- HTTP --------------------------------------------------------------------

#[derive(Clone)]
struct AppState {
    pool: PgPool,
    secret: Arc<[u8]>,
}

/// The service: `POST` [`CALLBACK_PATH`] (see the module's table of status
/// codes). `secret` is the HMAC key shared with the payment platform.
pub fn app(pool: PgPool, secret: impl Into<Vec<u8>>) -> Router {
    let state = AppState {
        pool,
        secret: secret.into().into(),
    };
    Router::new()
        .route(CALLBACK_PATH, post(callback))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// A callback turned away before the database: the answer's status, its
/// [`ErrorBody`] code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// 400 or 422.
    pub status: StatusCode,
    /// `BAD_SIGNATURE`, `BAD_REQUEST` or `UNSUPPORTED_STATUS`.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Rejection {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status,
            code,
            message: message.into(),
        }
    }
}

/// The endpoint's checks before anything touches the database, in order:
/// the signature over the raw `body` ([`verify_signature`]), the JSON
/// ([`Callback`]), and the status (`SUCCESS`). The serial's format is
/// checked next, by [`apply_callback`]'s `validate` ([`validate_serial`]).
pub fn parse_callback(
    secret: &[u8],
    body: &[u8],
    signature: Option<&HeaderValue>,
) -> Result<Callback, Rejection> {
    verify_signature(secret, body, signature)
        .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, "BAD_SIGNATURE", e.to_string()))?;
    let cb: Callback = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", e.to_string()))?;
    if cb.status != "SUCCESS" {
        let shown: String = cb
            .status
            .chars()
            .take(40)
            .flat_map(char::escape_default)
            .collect();
        return Err(Rejection::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "UNSUPPORTED_STATUS",
            format!("status `{shown}` is not SUCCESS"),
        ));
    }
    Ok(cb)
}

async fn callback(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    // 1. The signature, over the raw bytes, before anything else; the
    //    JSON; the status.
    let cb = match parse_callback(&app.secret, &body, headers.get(SIGNATURE_HEADER)) {
        Ok(cb) => cb,
        Err(r) => return error(r.status, r.code, r.message),
    };
    // 2. The serial's format (validate = …), the record, the order's state.
    match apply_callback(&app.pool, &cb).await {
        Ok(Outcome::Executed(r)) => (StatusCode::OK, axum::Json(r)).into_response(),
        Ok(Outcome::Duplicate(Some(r))) => (
            StatusCode::OK,
            [(REPLAY_HEADER, HeaderValue::from_static("true"))],
            axum::Json(r),
        )
            .into_response(),
        // The record strategy always stores the receipt: not reached.
        Ok(Outcome::Duplicate(None)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "duplicate without a stored receipt",
        ),
        Err(e) => error_response(&e),
    }
}

/// The HTTP answer for an error of [`apply_callback`].
pub fn error_response(e: &idem_runtime::Error) -> Response {
    use idem_runtime::Error as E;
    let msg = e.to_string();
    if e.is_retryable() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "RETRY_LATER", msg);
    }
    match e {
        E::InvalidKey { .. } => error(StatusCode::BAD_REQUEST, "BAD_SERIAL", msg),
        E::KeyConflict { .. } => error(StatusCode::CONFLICT, "SERIAL_REUSED", msg),
        E::IllegalState { .. } => error(StatusCode::CONFLICT, "ORDER_NOT_PAYABLE", msg),
        E::Handler { source, .. } => match source.downcast_ref::<PaymentError>() {
            Some(p) => {
                let (status, code) = match p {
                    PaymentError::UnknownOrder { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "UNKNOWN_ORDER")
                    }
                    PaymentError::AmountMismatch { .. } => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "AMOUNT_MISMATCH")
                    }
                    PaymentError::AlreadyPaid { .. } => {
                        (StatusCode::CONFLICT, "ORDER_ALREADY_PAID")
                    }
                    PaymentError::NotPayable { .. } => (StatusCode::CONFLICT, "ORDER_NOT_PAYABLE"),
                    PaymentError::SerialReused { .. } => (StatusCode::CONFLICT, "SERIAL_REUSED"),
                    PaymentError::Database(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
                };
                error(status, code, p.to_string())
            }
            None => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", msg),
        },
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", msg),
    }
}

// ---- schema ------------------------------------------------------------------

/// Creates idem's tables and the example's (`pay_orders`, `pay_payments`)
/// if they do not exist. Safe to run twice, and concurrently.
pub async fn migrate(pool: &PgPool) -> Result<(), idem_runtime::Error> {
    idem_runtime::migrate(pool).await?;
    let mut tx = pool.begin().await?;
    // Concurrent migrations wait for each other instead of racing on the
    // catalog.
    sqlx::query("SELECT pg_advisory_xact_lock(4242424243)")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pay_orders (
            id BIGINT PRIMARY KEY,
            amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
            status VARCHAR(32) NOT NULL DEFAULT 'PENDING_PAYMENT',
            paid_serial VARCHAR(32),
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT ck_pay_orders_status CHECK (status IN ('PENDING_PAYMENT', 'PAID', 'CANCELLED')),
            CONSTRAINT ck_pay_orders_paid CHECK ((status = 'PAID') = (paid_serial IS NOT NULL))
        )",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pay_payments (
            serial VARCHAR(32) PRIMARY KEY,
            order_id BIGINT NOT NULL REFERENCES pay_orders (id),
            amount_cents BIGINT NOT NULL,
            paid_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT uk_pay_payments_order UNIQUE (order_id)
        )",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Places an order awaiting a payment of `amount_cents`.
pub async fn create_order(pool: &PgPool, id: i64, amount_cents: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO pay_orders (id, amount_cents, status) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(amount_cents)
        .bind(PENDING_PAYMENT)
        .execute(pool)
        .await?;
    Ok(())
}

// ---- the simulated payment platform -----------------------------------------

/// One attempt of a delivery, as the platform saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// An HTTP answer with this status.
    Status(u16),
    /// No answer within the platform's time-out.
    TimedOut,
    /// The connection failed (refused, reset, …).
    Failed(String),
}

/// A callback the merchant acknowledged with 200.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Attempts made, the successful one included.
    pub attempts: u32,
    /// The final status: 200.
    pub status: u16,
    /// The final answer's body.
    pub body: String,
    /// Whether the final answer was a replay (`X-Idempotent-Replay: true`).
    pub replayed: bool,
    /// Every attempt, in order.
    pub history: Vec<Attempt>,
}

/// The platform gave up: no 200 within `1 + max_retries` attempts.
#[derive(Debug, Clone)]
pub struct GaveUp {
    /// Attempts made.
    pub attempts: u32,
    /// The last HTTP status received, if the last attempt got an answer.
    pub last_status: Option<u16>,
    /// The last answer's body, if any.
    pub last_body: Option<String>,
    /// Every attempt, in order.
    pub history: Vec<Attempt>,
}

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no 200 after {} attempts: {:?}",
            self.attempts, self.history
        )
    }
}

impl std::error::Error for GaveUp {}

/// A simulated third-party payment platform: it signs each callback with
/// the shared secret and POSTs it to the merchant, and — its retry policy —
/// pushes it again after any non-200 answer, a time-out or a connection
/// error, with exponential back-off, at most `max_retries` more times.
#[derive(Debug, Clone)]
pub struct Platform {
    /// The merchant's base URL, e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
    /// The HMAC key shared with the merchant.
    pub secret: Vec<u8>,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// How long one attempt may take (connect and answer).
    pub timeout: Duration,
    /// The wait before the first retry; doubled for each further one
    /// (capped at 32 times).
    pub backoff: Duration,
}

impl Platform {
    /// A platform calling `base_url`: 5 retries, 2 s time-out, 100 ms back-off.
    pub fn new(base_url: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        Platform {
            base_url: base_url.into(),
            secret: secret.into(),
            max_retries: 5,
            timeout: Duration::from_secs(2),
            backoff: Duration::from_millis(100),
        }
    }

    /// Delivers `callback` until the merchant answers 200 or the retries
    /// run out. Every attempt sends the same bytes with the same signature.
    pub async fn deliver(&self, callback: &Callback) -> Result<Delivered, GaveUp> {
        let body = serde_json::to_vec(callback).expect("a callback serializes");
        let signature = sign(&self.secret, &body);
        self.deliver_raw(body, &signature).await
    }

    /// Delivers a raw body under the given signature (to forge or tamper
    /// with callbacks in tests and demos).
    pub async fn deliver_raw(&self, body: Vec<u8>, signature: &str) -> Result<Delivered, GaveUp> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("an HTTP client without TLS builds");
        let url = format!("{}{CALLBACK_PATH}", self.base_url.trim_end_matches('/'));
        let mut history = Vec::new();
        let (mut last_status, mut last_body) = (None, None);
        for attempt in 1..=self.max_retries.saturating_add(1) {
            if attempt > 1 {
                let factor = 1u32 << (attempt - 2).min(5);
                tokio::time::sleep(self.backoff * factor).await;
            }
            let sent = client
                .post(&url)
                .timeout(self.timeout)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(SIGNATURE_HEADER, signature)
                .body(body.clone())
                .send()
                .await;
            // The answer's body is read under the same time-out.
            let answer = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let replayed = resp
                        .headers()
                        .get(REPLAY_HEADER)
                        .is_some_and(|v| v.as_bytes() == b"true");
                    resp.text().await.map(|text| (status, replayed, text))
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok((status, replayed, text)) => {
                    history.push(Attempt::Status(status));
                    if status == 200 {
                        return Ok(Delivered {
                            attempts: attempt,
                            status,
                            body: text,
                            replayed,
                            history,
                        });
                    }
                    (last_status, last_body) = (Some(status), Some(text));
                }
                Err(e) => {
                    history.push(if e.is_timeout() {
                        Attempt::TimedOut
                    } else {
                        Attempt::Failed(e.to_string())
                    });
                    (last_status, last_body) = (None, None);
                }
            }
        }
        Err(GaveUp {
            attempts: history.len() as u32,
            last_status,
            last_body,
            history,
        })
    }
}

// ---- a lossy network between the platform and the merchant -------------------

/// What happens to one request on its way through [`Faults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Delivered, answered.
    Pass,
    /// The handler runs to completion (it commits), then the answer is held
    /// back longer than the platform waits: the platform sees a time-out,
    /// the merchant has booked the payment. The lost-response case.
    LoseResponse,
    /// The handler runs to completion, then a gateway answers 503 instead.
    UnavailableAfter,
    /// A gateway answers 503 without calling the handler.
    UnavailableBefore,
}

/// A fault injector in front of the service (for tests and the demo,
/// never production): a script of faults for the first requests, then
/// faults drawn at the given rates.
#[derive(Debug, Clone)]
pub struct Faults(Arc<FaultsInner>);

#[derive(Debug)]
struct FaultsInner {
    script: Vec<Fault>,
    lose_rate: f64,
    unavailable_rate: f64,
    hold: Duration,
    seed: u64,
    seen: AtomicU64,
    counts: [AtomicU64; 4],
}

impl Faults {
    /// The first requests meet `script`, in order; later ones pass. A lost
    /// response is held back for `hold` (make it longer than the platform's
    /// time-out).
    pub fn script(script: impl IntoIterator<Item = Fault>, hold: Duration) -> Self {
        Self::new(script.into_iter().collect(), 0.0, 0.0, hold, 0)
    }

    /// Each request independently: a lost response with probability
    /// `lose_rate`, a 503 after the handler ran with `unavailable_rate`
    /// (a deterministic sequence from `seed`).
    pub fn random(lose_rate: f64, unavailable_rate: f64, hold: Duration, seed: u64) -> Self {
        Self::new(Vec::new(), lose_rate, unavailable_rate, hold, seed)
    }

    fn new(script: Vec<Fault>, lose: f64, unavailable: f64, hold: Duration, seed: u64) -> Self {
        Faults(Arc::new(FaultsInner {
            script,
            lose_rate: lose,
            unavailable_rate: unavailable,
            hold,
            seed,
            seen: AtomicU64::new(0),
            counts: Default::default(),
        }))
    }

    /// Wraps `app` so that every request goes through this injector.
    pub fn wrap(&self, app: Router) -> Router {
        app.layer(axum::middleware::from_fn_with_state(self.clone(), inject))
    }

    /// How many requests met each fault: `[Pass, LoseResponse,
    /// UnavailableAfter, UnavailableBefore]`.
    pub fn counts(&self) -> [u64; 4] {
        let c = &self.0.counts;
        [0, 1, 2, 3].map(|i| c[i].load(Ordering::Relaxed))
    }

    fn next(&self) -> Fault {
        let i = self.0.seen.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = self.0.script.get(i as usize) {
            return *f;
        }
        // splitmix64: a uniform draw in [0, 1) per request.
        let mut z = self
            .0
            .seed
            .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        if u < self.0.lose_rate {
            Fault::LoseResponse
        } else if u < self.0.lose_rate + self.0.unavailable_rate {
            Fault::UnavailableAfter
        } else {
            Fault::Pass
        }
    }
}

async fn inject(State(faults): State<Faults>, req: Request, next: Next) -> Response {
    let fault = faults.next();
    let index = match fault {
        Fault::Pass => 0,
        Fault::LoseResponse => 1,
        Fault::UnavailableAfter => 2,
        Fault::UnavailableBefore => 3,
    };
    faults.0.counts[index].fetch_add(1, Ordering::Relaxed);
    let unavailable = || {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "RETRY_LATER",
            "gateway unavailable",
        )
    };
    if fault == Fault::UnavailableBefore {
        return unavailable();
    }
    // The handler runs on its own task: it completes (and commits) even if
    // the platform hangs up while the answer is held back.
    let handled = tokio::spawn(next.run(req)).await;
    let response = match handled {
        Ok(r) => r,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", e.to_string()),
    };
    match fault {
        Fault::LoseResponse => {
            tokio::time::sleep(faults.0.hold).await;
            response
        }
        Fault::UnavailableAfter => unavailable(),
        _ => response,
    }
}
