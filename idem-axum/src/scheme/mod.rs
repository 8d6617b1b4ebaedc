//! Callbacks signed the way payment and commerce platforms sign them: a
//! [`SignatureScheme`] per platform, each with key rotation (several
//! active secrets at once: a callback signed with any of them is
//! accepted), constant-time comparison, a tolerance where the platform
//! signs a timestamp, and the serial read from what the signature covers.
//!
//! | preset | header | what the signature covers | serial (the idempotency key) |
//! |---|---|---|---|
//! | [`Stripe`] | `Stripe-Signature: t=…,v1=…[,v1=…]` (other schemes, `v0`, ignored), hex HMAC-SHA256 | `"{t}.{raw body}"`; `t` within 300 s | the body's `id` (`evt_…`) |
//! | [`StandardWebhooks`] (Svix and the platforms on it) | `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64> [v1,<base64> …]` (other versions ignored) | `"{webhook-id}.{webhook-timestamp}.{raw body}"`, key: the base64 of `whsec_<base64>`; timestamp within 300 s | the `webhook-id` header: signed |
//! | [`GitHub`] | `X-Hub-Signature-256: sha256=<hex>` | the raw body only, no timestamp | the body's digest (`sha256-<hex>`): `X-GitHub-Delivery` is not signed |
//! | [`Shopify`] | `X-Shopify-Hmac-Sha256: <base64>` | the raw body only, no timestamp | the body's digest: `X-Shopify-Webhook-Id` and `X-Shopify-Event-Id` are not signed |
//! | [`Paddle`] (Billing) | `Paddle-Signature: ts=…;h1=…[;h1=…]` (other keys ignored) | `"{ts}:{raw body}"`; `ts` within 5 s (Paddle's own SDK's default) | the body's `event_id` (`evt_…`) |
//! | [`Alipay`] (asynchronous notifications) | none: the form's `sign` (base64 SHA256withRSA under Alipay's key), `sign_type=RSA2` | the form's parameters but `sign`, `sign_type` and empty ones, sorted, `k=v&…` (values decoded); no timestamp checked | the form's `notify_id` ([`serial`](Alipay::serial): `trade_no`…) |
//! | [`Adyen`] (standard notifications) | none: the item's `additionalData.hmacSignature`, base64 HMAC-SHA256 under the hex-decoded key | not the body: `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success` of the one `NotificationRequestItem`; no timestamp | `"{pspReference}:{eventCode}"` |
//! | [`WeChatPay`] (API v3) | `Wechatpay-Timestamp`, `Wechatpay-Nonce`, `Wechatpay-Signature` (base64 SHA256withRSA), `Wechatpay-Serial` (the platform key that signed) | `"{timestamp}\n{nonce}\n{raw body}\n"`; timestamp within 300 s; the body's `resource` decrypted (AES-256-GCM, the APIv3 key): the payload | the resource's `transaction_id` ([`serial`](WeChatPay::serial): the notification's `id`) |
//!
//! A platform that signs the body without a timestamp (GitHub, Shopify)
//! leaves a captured callback replayable at any time: its key then holds
//! for as long as its record lives, and the key must be the signed bytes
//! themselves, the body's digest, since the delivery headers are not
//! signed (see [`SerialFrom`]). A platform whose retries send the same
//! body with a new delivery id is then booked once; two events whose bodies
//! are byte for byte the same are one (GitHub's and Shopify's bodies carry
//! the resource's `id` and `updated_at`: [`serial`](GitHub::serial) can
//! name a field instead). Alipay signs a timestamp (`notify_time`) but its
//! retries keep it: its notifications are told apart by their serial only.
//!
//! The answers: 200 with no body, except Alipay's `success` (and `failure`
//! to a refusal, so that Alipay sends it again), Adyen's `[accepted]` and
//! WeChat Pay's refusals, `{"code":"FAIL","message":"…"}` with the status
//! below. Adyen signs only some fields of its item: the payload holds the
//! others too, unsigned (see [`Adyen`]).
//!
//! Each preset refuses, before the handler and so before the database:
//!
//! | refused | status |
//! |---|---|
//! | a signature or timestamp header missing, malformed (not the platform's syntax, not hex or base64, not Unix seconds) | 400 |
//! | no signature made with an active secret over these bytes | 401 |
//! | a signed timestamp outside the tolerance | 401 |
//! | a serial missing, longer than [`MAX_SERIAL_LEN`](crate::MAX_SERIAL_LEN), not printable ASCII, or refused by the check | 400 |
//! | a body not the platform's: Alipay's form (a name twice, not UTF-8), Adyen's JSON (not one `NotificationRequestItem`), WeChat Pay's `resource` (missing, not AES-256-GCM, not decrypted by the APIv3 key) | 400 |
//!
//! Rotating a secret: add the new one
//! ([`Stripe::secret`], on every HMAC preset, Adyen's included; [`Alipay::key`] and
//! [`WeChatPay::key`] for the platform's RSA public keys), roll the
//! platform over to it, then drop the old one once no callback signed with
//! it can still come (its tolerance, or its retries, later).
//!
//! ```
//! use axum::{Router, extract::FromRef, response::Response, routing::post};
//! use idem_runtime::http::SignedCallback;
//! use idem_runtime::http::scheme::Stripe;
//!
//! #[derive(Clone)]
//! struct App { stripe: Stripe }
//! impl FromRef<App> for Stripe {
//!     fn from_ref(a: &App) -> Self { a.stripe.clone() }
//! }
//!
//! // Only callbacks signed with one of the secrets, at most 5 minutes old.
//! async fn stripe_event(cb: SignedCallback<Stripe>) -> Response {
//!     // book under `cb.serial()` (the event's `evt_…` id), then:
//!     cb.accepted()
//! }
//!
//! // During a key roll: the current secret and the next one.
//! let stripe = Stripe::new("whsec_current").secret("whsec_next");
//! let app: Router = Router::new()
//!     .route("/stripe", post(stripe_event))
//!     .with_state(App { stripe });
//! # let _ = app;
//! ```

mod adyen;
mod alipay;
mod github;
mod keyed;
mod paddle;
mod shopify;
mod standard;
mod stripe;
mod wechat;

pub use adyen::Adyen;
pub use alipay::Alipay;
pub use github::GitHub;
pub use paddle::Paddle;
pub use shopify::Shopify;
pub use standard::StandardWebhooks;
pub use stripe::Stripe;
pub use wechat::{WeChatPay, WeChatPaySerial};

use crate::refusal::{CallbackError, SerialFrom};
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use hmac::{KeyInit, Mac};
use std::sync::Arc;
use std::time::Duration;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How a platform signs its callbacks: what [`SignedCallback`] checks
/// before the handler.
///
/// [`SignedCallback`]: crate::SignedCallback
pub trait SignatureScheme: Send + Sync + 'static {
    /// Checks the callback at `now_unix_secs`: its headers' syntax (400),
    /// its signature in constant time (401), its signed timestamp's age
    /// (401), then reads its serial from what the signature covers.
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError>;

    /// The answer the platform expects for a callback it need not send
    /// again: 200 with an empty body unless the platform asks for more.
    fn accepted(&self) -> Response {
        axum::http::StatusCode::OK.into_response()
    }

    /// The answer to a refused callback: `None` for the problem of
    /// [`CallbackError`] (400 or 401).
    fn refused(&self, error: &CallbackError) -> Option<Response> {
        let _ = error;
        None
    }
}

/// A callback that a [`SignatureScheme`] accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The serial, validated, read from what the signature covers (`None`
    /// only for a scheme that names none).
    pub serial: Option<String>,
    /// The signed timestamp, if the platform signs one.
    pub timestamp: Option<i64>,
    /// What the handler reads: the body, or the signed part of it.
    pub payload: Bytes,
}

impl Verified {
    /// A verified callback (for a [`SignatureScheme`] of one's own).
    pub fn new(serial: Option<String>, timestamp: Option<i64>, payload: Bytes) -> Self {
        Verified {
            serial,
            timestamp,
            payload,
        }
    }
}

/// Any [`SignatureScheme`], shared: for a state that chooses its scheme
/// at run time (`SignedCallback<Scheme>`, `Scheme: FromRef<S>`).
#[derive(Clone)]
pub struct Scheme(Arc<dyn SignatureScheme>);

impl Scheme {
    /// `scheme`, shared.
    pub fn new(scheme: impl SignatureScheme) -> Self {
        Scheme(Arc::new(scheme))
    }
}

impl std::fmt::Debug for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scheme(…)")
    }
}

impl SignatureScheme for Scheme {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        self.0.verify(headers, body, now_unix_secs)
    }

    fn accepted(&self) -> Response {
        self.0.accepted()
    }

    fn refused(&self, error: &CallbackError) -> Option<Response> {
        self.0.refused(error)
    }
}

/// A signature header, parsed: the signed timestamp, if the header carries
/// it, and the signatures (raw bytes, decoded from hex or base64). What a
/// preset's `parse_header` returns and its `format_header` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SignatureHeader {
    /// The signed timestamp (Unix seconds), where the header holds one.
    pub timestamp: Option<i64>,
    /// Every signature of the platform's current scheme, in order.
    pub signatures: Vec<Vec<u8>>,
}

impl SignatureHeader {
    /// A header of `signatures` at `timestamp`.
    pub fn new(timestamp: Option<i64>, signatures: Vec<Vec<u8>>) -> Self {
        SignatureHeader {
            timestamp,
            signatures,
        }
    }
}

/// A secret a preset cannot use: why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretError(String);

impl std::fmt::Display for SecretError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SecretError {}

/// The active secrets of a preset: any of them signs.
#[derive(Clone)]
struct Secrets(Vec<Arc<[u8]>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} secret(s)", self.0.len())
    }
}

impl Secrets {
    fn one(key: Vec<u8>) -> Self {
        Secrets(vec![key.into()])
    }

    fn add(&mut self, key: Vec<u8>) {
        self.0.push(key.into());
    }

    fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
        for p in parts {
            mac.update(p);
        }
        mac
    }

    /// The HMAC-SHA256 of `parts` under each secret, in order.
    fn sign(&self, parts: &[&[u8]]) -> Vec<Vec<u8>> {
        self.0
            .iter()
            .map(|k| Self::mac(k, parts).finalize().into_bytes().to_vec())
            .collect()
    }

    /// Whether one of `tags` is the HMAC of `parts` under one of the
    /// secrets: every pair compared, each in constant time.
    fn verify(&self, parts: &[&[u8]], tags: &[Vec<u8>]) -> bool {
        let mut ok = false;
        for key in &self.0 {
            let mac = Self::mac(key, parts);
            for tag in tags {
                ok |= mac.clone().verify_slice(tag).is_ok();
            }
        }
        ok
    }
}

/// Unix seconds: ASCII digits only (no sign, no space), as an `i64`.
fn unix_secs(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `timestamp` within `tolerance` of `now`, either way.
fn within(timestamp: i64, now: i64, tolerance: Duration) -> Result<(), CallbackError> {
    let age = now.saturating_sub(timestamp);
    if age.unsigned_abs() > tolerance.as_secs() {
        return Err(CallbackError::StaleTimestamp { age_secs: age });
    }
    Ok(())
}

/// A header's value as text, or `missing`/`malformed`.
fn header_str<'a>(
    headers: &'a HeaderMap,
    name: &str,
    missing: CallbackError,
    malformed: CallbackError,
) -> Result<&'a str, CallbackError> {
    let v = headers.get(name).ok_or(missing)?;
    std::str::from_utf8(v.as_bytes()).map_err(|_| malformed)
}

/// A 32-byte HMAC-SHA256 tag from hex, either case.
fn hex_tag(s: &str) -> Result<Vec<u8>, CallbackError> {
    hex::decode(s)
        .ok()
        .filter(|t| t.len() == 32)
        .ok_or(CallbackError::MalformedSignature)
}

/// A 32-byte HMAC-SHA256 tag from standard, padded base64.
fn base64_tag(s: &str) -> Result<Vec<u8>, CallbackError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .ok()
        .filter(|t| t.len() == 32)
        .ok_or(CallbackError::MalformedSignature)
}

/// An RSA signature from standard, padded base64: 1 to 1024 bytes (keys
/// up to 8192 bits).
fn base64_rsa_signature(s: &str) -> Result<Vec<u8>, CallbackError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .ok()
        .filter(|t| !t.is_empty() && t.len() <= 1024)
        .ok_or(CallbackError::MalformedSignature)
}

type RsaVerifyingKey = rsa::pkcs1v15::VerifyingKey<sha2::Sha256>;

/// The platform's RSA public keys (SHA256withRSA, PKCS#1 v1.5), each with
/// the id the platform names it by (WeChat Pay's `Wechatpay-Serial`; empty
/// where the platform names none): any of them signs.
#[derive(Clone)]
struct RsaKeys(Vec<(String, RsaVerifyingKey)>);

impl std::fmt::Debug for RsaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.0.iter().map(|(id, _)| id.as_str()).collect();
        write!(f, "{} public key(s) {ids:?}", self.0.len())
    }
}

impl RsaKeys {
    fn one(id: &str, key: &str) -> Result<Self, SecretError> {
        Ok(RsaKeys(vec![(id.to_owned(), rsa_public_key(key)?)]))
    }

    fn add(&mut self, id: &str, key: &str) -> Result<(), SecretError> {
        self.0.push((id.to_owned(), rsa_public_key(key)?));
        Ok(())
    }

    /// Whether `signature` is the SHA256withRSA signature of `message`
    /// under one of the keys (those named `id`, when given).
    fn verify(&self, id: Option<&str>, message: &[u8], signature: &[u8]) -> bool {
        use rsa::signature::Verifier as _;
        let Ok(sig) = rsa::pkcs1v15::Signature::try_from(signature) else {
            return false;
        };
        self.0
            .iter()
            .filter(|(name, _)| id.is_none_or(|id| id == name))
            .any(|(_, key)| key.verify(message, &sig).is_ok())
    }

    fn knows(&self, id: &str) -> bool {
        self.0.iter().any(|(name, _)| name == id)
    }
}

/// An RSA public key: PEM (`PUBLIC KEY`, X.509 SubjectPublicKeyInfo, or
/// `RSA PUBLIC KEY`, PKCS#1), or the bare base64 of the
/// SubjectPublicKeyInfo DER, as Alipay's console shows it.
fn rsa_public_key(text: &str) -> Result<RsaVerifyingKey, SecretError> {
    use rsa::pkcs1::DecodeRsaPublicKey as _;
    use rsa::pkcs8::DecodePublicKey as _;
    let text = text.trim();
    let key = if text.starts_with("-----BEGIN PUBLIC KEY-----") {
        rsa::PublicKey::from_public_key_pem(text).map_err(|e| e.to_string())
    } else if text.starts_with("-----BEGIN RSA PUBLIC KEY-----") {
        rsa::PublicKey::from_pkcs1_pem(text).map_err(|e| e.to_string())
    } else {
        use base64::Engine as _;
        let b64: String = text.split_ascii_whitespace().collect();
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| e.to_string())
            .and_then(|der| rsa::PublicKey::from_public_key_der(&der).map_err(|e| e.to_string()))
    };
    key.map(RsaVerifyingKey::new)
        .map_err(|e| SecretError(format!("not an RSA public key (PEM or base64 DER): {e}")))
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The default serial check: the common checks only.
fn any_serial(_: &str) -> Result<(), String> {
    Ok(())
}

/// Where a preset reads its serial, and the platform's format for it.
#[derive(Clone)]
struct SerialRule(SerialFrom, crate::refusal::SerialCheck);

impl std::fmt::Debug for SerialRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl SerialRule {
    fn read(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, CallbackError> {
        crate::refusal::read_serial(&self.0, self.1, headers, body)
    }
}

#[cfg(test)]
mod tests;
