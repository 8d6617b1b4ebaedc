//! The merchant's vocabulary: one [`Payment`] whatever the platform, its
//! answers, and the formats of the platforms' serials (the checks the
//! presets run before anything touches the database).

use super::KEY_PREFIX;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// Stripe, in keys and in the ledger's `platform` column.
pub const STRIPE: &str = "stripe";
/// Alipay.
pub const ALIPAY: &str = "alipay";
/// WeChat Pay.
pub const WECHATPAY: &str = "wechatpay";

// ---- the payment and the answers -------------------------------------------

/// What a verified success notification says, read from the platform's
/// signed payload: "order `order_id` was paid `amount_cents` under the
/// platform's `serial`". The idempotency key is the platform and its
/// serial; the whole payment is the record's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// [`STRIPE`], [`ALIPAY`] or [`WECHATPAY`].
    pub platform: String,
    /// The platform's serial as its preset read it: Stripe's event id
    /// (`evt_…`), Alipay's `trade_no`, WeChat Pay's `transaction_id`.
    pub serial: String,
    /// The merchant's order.
    pub order_id: i64,
    /// The amount paid, in cents (fen: the orders are priced in CNY).
    pub amount_cents: i64,
}

/// What was booked: stored by the `record` strategy and replayed, unchanged,
/// to every repetition of the callback (the body of Stripe's and WeChat
/// Pay's 200; Alipay reads `success` instead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The platform that notified.
    pub platform: String,
    /// Its serial.
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

/// The body of the service's own refusals (WeChat Pay's documented
/// failure shape, `{"code":…,"message":…}`; Stripe and Alipay only read
/// the status, or that the body is not `success`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable machine-readable code (see the module's table).
    pub code: String,
    /// A human-readable explanation.
    pub message: String,
}

/// A verified callback turned away before the database: the answer's
/// status, its [`ErrorBody`] code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// 400 or 422.
    pub status: StatusCode,
    /// `BAD_REQUEST`, `UNSUPPORTED_STATUS`, `OTHER_MERCHANT` or
    /// `AMOUNT_MISMATCH`.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Rejection {
    /// A 400 `BAD_REQUEST`: the signed payload is not what the platform
    /// documents.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Rejection::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    /// A 422: the payload is well-formed but not a payment of ours.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Rejection::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Rejection {
            status,
            code,
            message,
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        error(self.status, self.code, self.message)
    }
}

/// An error answer: `status` with an [`ErrorBody`].
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        code: code.into(),
        message: message.into(),
    };
    (status, axum::Json(body)).into_response()
}

/// At most 40 characters of `text`, escaped: what a message may echo of an
/// input.
pub(super) fn shown(text: &str) -> String {
    text.chars()
        .take(40)
        .flat_map(char::escape_default)
        .collect()
}

// ---- the platforms' serials --------------------------------------------------

/// Stripe's event ids: `evt_` and 1 to 64 ASCII letters and digits.
pub fn check_stripe_serial(serial: &str) -> Result<(), String> {
    match serial.strip_prefix("evt_") {
        Some(rest)
            if (1..=64).contains(&rest.len())
                && rest.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "`{}` is not a Stripe event id (evt_ and 1 to 64 letters or digits)",
            shown(serial)
        )),
    }
}

/// Alipay's `trade_no` and WeChat Pay's `transaction_id`: 16 to 32 ASCII
/// digits.
pub fn check_digits_serial(serial: &str) -> Result<(), String> {
    if (16..=32).contains(&serial.len()) && serial.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(());
    }
    Err(format!("`{}` is not 16 to 32 ASCII digits", shown(serial)))
}

/// The `validate` function of [`apply_payment`](super::apply_payment): the
/// whole key, `pay-callback:<platform>:<serial>`, checked again before the
/// transaction begins.
pub fn validate_key(key: &str) -> Result<(), String> {
    let Some(rest) = key.strip_prefix(KEY_PREFIX) else {
        return Err(format!("key does not start with `{KEY_PREFIX}`"));
    };
    match rest.split_once(':') {
        Some((STRIPE, serial)) => check_stripe_serial(serial),
        Some((ALIPAY | WECHATPAY, serial)) => check_digits_serial(serial),
        _ => Err(format!("`{}` names no platform", shown(rest))),
    }
}

/// The `n`-th serial of `platform`, as the simulated platform numbers them:
/// `evt_` and `n` on 24 digits for Stripe, `2026` (Alipay) or `4200`
/// (WeChat Pay) and `n` on 24 digits.
pub fn serial(platform: &str, n: u64) -> String {
    match platform {
        STRIPE => format!("evt_{n:024}"),
        ALIPAY => format!("2026{n:024}"),
        _ => format!("4200{n:024}"),
    }
}
