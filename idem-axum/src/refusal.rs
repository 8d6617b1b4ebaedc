//! The vocabulary every callback scheme speaks: why a callback is refused
//! ([`CallbackError`]), where its serial is ([`SerialFrom`]), and how a
//! serial is read and validated. A leaf below the verifier
//! ([`CallbackVerifier`](crate::CallbackVerifier)) and the presets
//! ([`scheme`](crate::scheme)), which both use it.

use super::problem::Problem;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::{SystemTime, UNIX_EPOCH};

/// A platform's serial format: why a serial is refused.
pub(crate) type SerialCheck = fn(&str) -> Result<(), String>;

/// The longest serial accepted, in bytes.
pub const MAX_SERIAL_LEN: usize = 128;

/// Where the callback's key is read: its serial.
///
/// The key must come from the signed bytes. A callback captured once (from a
/// log, a proxy, a misrouted delivery) can be sent again as it is, and only
/// what the signature covers cannot be changed on the way: a key read
/// anywhere else lets the same signed bytes be booked once per value.
///
/// What common platforms sign, and so where their key is (as their
/// documentation describes it at the time of writing). Each has a preset
/// in [`scheme`](crate::scheme) that checks the platform's own header and
/// reads its serial there; this verifier's own format is
/// [`CallbackVerifier`](crate::CallbackVerifier)'s.
///
/// | platform | preset | signature | what it covers | the event's id | serial |
/// |---|---|---|---|---|---|
/// | Stripe | [`Stripe`](crate::scheme::Stripe) | `Stripe-Signature: t=…,v1=…`, hex HMAC-SHA256 | `"{t}.{raw body}"`: timestamp and body | `id` in the body (`evt_…`) | [`JsonField("id")`](Self::JsonField) |
/// | Standard Webhooks (Svix) | [`StandardWebhooks`](crate::scheme::StandardWebhooks) | `webhook-signature: v1,…`, base64 HMAC-SHA256 | `"{webhook-id}.{webhook-timestamp}.{raw body}"` | the `webhook-id` header, signed | `webhook-id` |
/// | GitHub | [`GitHub`](crate::scheme::GitHub) | `X-Hub-Signature-256: sha256=…`, hex HMAC-SHA256 | the raw body only, no timestamp | the `X-GitHub-Delivery` header, not signed | [`BodyDigest`](Self::BodyDigest) |
/// | Shopify | [`Shopify`](crate::scheme::Shopify) | `X-Shopify-Hmac-Sha256`, base64 HMAC-SHA256 | the raw body only, no timestamp | the `X-Shopify-Webhook-Id` and `X-Shopify-Event-Id` headers, not signed | [`BodyDigest`](Self::BodyDigest) |
/// | Paddle Billing | [`Paddle`](crate::scheme::Paddle) | `Paddle-Signature: ts=…;h1=…`, hex HMAC-SHA256 | `"{ts}:{raw body}"`: timestamp and body | `event_id` in the body (`evt_…`) | [`JsonField("event_id")`](Self::JsonField) |
/// | Alipay (asynchronous notifications) | [`Alipay`](crate::scheme::Alipay) | the form's `sign`, base64 SHA256withRSA (`sign_type=RSA2`) | the form's parameters, sorted, but `sign`, `sign_type` and empty ones | `notify_id` in the form, signed (`trade_no`: the trade's) | `notify_id` |
/// | WeChat Pay API v3 | [`WeChatPay`](crate::scheme::WeChatPay) | `Wechatpay-Signature`, base64 SHA256withRSA, under the key `Wechatpay-Serial` names | `"{Wechatpay-Timestamp}\n{Wechatpay-Nonce}\n{raw body}\n"` | `id` in the body (`EV-…`); the payment's `transaction_id` in the encrypted `resource`, both signed | `transaction_id`, decrypted |
/// | Adyen (standard notifications) | [`Adyen`](crate::scheme::Adyen) | `additionalData.hmacSignature` inside the notification item, base64 HMAC-SHA256 | not the body: a `:`-joined list of the item's fields (`pspReference`, `originalReference`, `merchantAccountCode`, `merchantReference`, amount value and currency, `eventCode`, `success`) | `pspReference` with `eventCode`, both signed | `"{pspReference}:{eventCode}"` |
///
/// A body signed without a timestamp can be replayed at any time: its key
/// then holds for as long as its record lives (see
/// [`without_timestamp`](crate::CallbackVerifier::without_timestamp)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SerialFrom {
    /// A top-level field of the JSON body, a string or an integer: signed
    /// with the body.
    JsonField(&'static str),
    /// `sha256-` and the lower-case hex SHA-256 of the raw body: for a
    /// platform that signs the body alone and names its deliveries in a
    /// header it does not sign. The same signed body is the same key
    /// whatever header comes with it, and whatever timestamp (a platform's
    /// retry, signed anew, included). Two callbacks whose bodies are byte
    /// for byte the same are one: a platform whose retries change the body
    /// needs [`JsonField`](Self::JsonField) instead.
    BodyDigest,
    /// A header **the signature does not cover**. Whoever holds one signed
    /// callback can send it again with another value in this header, within
    /// the tolerance (without a timestamp: at any time), and each value is
    /// booked: only for an endpoint whose callers are authenticated by other
    /// means too (mutual TLS, a private network), when the platform's body
    /// holds no id and is not unique per event. The name says so, in the
    /// code that chooses it.
    UnsignedHeader(HeaderName),
}

/// Why a callback was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallbackError {
    /// No signature header.
    MissingSignature,
    /// The signature header is not hex.
    MalformedSignature,
    /// Not the HMAC of this body (and timestamp) under the secret.
    BadSignature,
    /// No timestamp header.
    MissingTimestamp,
    /// The timestamp is not Unix seconds.
    MalformedTimestamp,
    /// The timestamp is further from now than the tolerance.
    StaleTimestamp {
        /// Seconds between the timestamp and now (negative: ahead).
        age_secs: i64,
    },
    /// The serial is missing or refused: why.
    BadSerial(String),
    /// The signed body is not what the platform sends (not its form, not
    /// its JSON, an encrypted resource missing or not its algorithm): why.
    MalformedBody(String),
}

impl std::fmt::Display for CallbackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallbackError::MissingSignature => f.write_str("the signature header is missing"),
            CallbackError::MalformedSignature => f.write_str("the signature header is not hex"),
            CallbackError::BadSignature => f.write_str("the signature does not match the body"),
            CallbackError::MissingTimestamp => f.write_str("the timestamp header is missing"),
            CallbackError::MalformedTimestamp => {
                f.write_str("the timestamp header is not a number of Unix seconds")
            }
            CallbackError::StaleTimestamp { age_secs } if *age_secs >= 0 => {
                write!(
                    f,
                    "the callback was signed {age_secs} s ago, beyond the tolerance"
                )
            }
            CallbackError::StaleTimestamp { age_secs } => write!(
                f,
                "the callback is dated {} s ahead, beyond the tolerance",
                -age_secs
            ),
            CallbackError::BadSerial(why) => write!(f, "bad serial: {why}"),
            CallbackError::MalformedBody(why) => write!(f, "malformed body: {why}"),
        }
    }
}

impl std::error::Error for CallbackError {}

impl CallbackError {
    /// 400 for what is malformed, 401 for what fails authentication.
    pub fn status(&self) -> StatusCode {
        match self {
            CallbackError::BadSignature | CallbackError::StaleTimestamp { .. } => {
                StatusCode::UNAUTHORIZED
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// A stable code for the problem's title.
    pub fn title(&self) -> &'static str {
        match self {
            CallbackError::MissingSignature | CallbackError::MalformedSignature => {
                "Malformed signature"
            }
            CallbackError::BadSignature => "Bad signature",
            CallbackError::MissingTimestamp | CallbackError::MalformedTimestamp => {
                "Malformed timestamp"
            }
            CallbackError::StaleTimestamp { .. } => "Stale callback",
            CallbackError::BadSerial(_) => "Bad serial",
            CallbackError::MalformedBody(_) => "Malformed body",
        }
    }
}

impl IntoResponse for CallbackError {
    fn into_response(self) -> Response {
        Problem::new(self.status(), self.title(), self.to_string()).into_response()
    }
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The serial `from` names, validated: what every scheme with a
/// [`SerialFrom`] reads.
pub(crate) fn read_serial(
    from: &SerialFrom,
    check: SerialCheck,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, CallbackError> {
    let bad = |why: String| CallbackError::BadSerial(why);
    let raw = match from {
        SerialFrom::BodyDigest => {
            format!(
                "sha256-{}",
                hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body))
            )
        }
        SerialFrom::UnsignedHeader(name) => {
            let v = headers
                .get(name)
                .ok_or_else(|| bad(format!("the {name} header is missing")))?;
            String::from_utf8(v.as_bytes().to_vec())
                .map_err(|_| bad("the serial is not printable ASCII".into()))?
        }
        SerialFrom::JsonField(field) => {
            let v: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| bad(format!("the body is not JSON: {e}")))?;
            match v.get(*field) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                Some(_) => return Err(bad(format!("`{field}` is not a string or an integer"))),
                None => return Err(bad(format!("the body has no `{field}`"))),
            }
        }
    };
    checked_serial(raw, check)
}

/// `raw` as a serial: 1 to [`MAX_SERIAL_LEN`] bytes of printable ASCII,
/// accepted by `check`.
pub(crate) fn checked_serial(raw: String, check: SerialCheck) -> Result<String, CallbackError> {
    let bad = |why: String| CallbackError::BadSerial(why);
    if raw.is_empty() || raw.len() > MAX_SERIAL_LEN {
        return Err(bad(format!(
            "the serial is {} bytes long; 1 to {MAX_SERIAL_LEN} are accepted",
            raw.len()
        )));
    }
    if !raw.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(bad("the serial is not printable ASCII".into()));
    }
    check(&raw).map_err(bad)?;
    Ok(raw)
}
