//! The callback, its answers, and the checks of externally supplied data:
//! the serial's format, and the platform's signature (the runtime's
//! [`CallbackVerifier`], configured).

use super::{KEY_PREFIX, SERIAL_DIGITS, SERIAL_PREFIX, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use axum::http::HeaderName;
use idem_runtime::http::{CallbackVerifier, SerialFrom};
use serde::{Deserialize, Serialize};

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

/// The `validate` function of [`apply_callback`](super::apply_callback): it receives the whole
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

/// The merchant's check of the platform's callbacks, the runtime's
/// [`CallbackVerifier`]: `X-Signature: hex(hmac_sha256(secret,
/// "{X-Timestamp}.{raw body}"))`, compared in constant time; a timestamp
/// more than 5 minutes from now refused (an old callback sent again); the
/// serial read from the body's `serial` field and checked by
/// [`check_serial`] before anything touches the database.
pub fn verifier(secret: impl Into<Vec<u8>>) -> CallbackVerifier {
    CallbackVerifier::new(secret)
        .signature_header(HeaderName::from_static(SIGNATURE_HEADER))
        .timestamp_header(HeaderName::from_static(TIMESTAMP_HEADER))
        .tolerance(std::time::Duration::from_secs(300))
        .serial(SerialFrom::JsonField("serial"), check_serial)
}
