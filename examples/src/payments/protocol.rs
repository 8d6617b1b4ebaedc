//! The callback, its answers, and the checks of externally supplied data:
//! the serial's format and the HMAC signature.

use super::{KEY_PREFIX, SERIAL_DIGITS, SERIAL_PREFIX};
use axum::http::HeaderValue;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

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

/// `hex(hmac_sha256(secret, body))`: the value of [`SIGNATURE_HEADER`](super::SIGNATURE_HEADER).
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
