//! Standard Webhooks (Svix): `webhook-id`, `webhook-timestamp`,
//! `webhook-signature: v1,<base64>`.

use super::{
    SecretError, SignatureHeader, SignatureScheme, Verified, any_serial, base64_tag, header_str,
    unix_secs, within,
};
use crate::refusal::{CallbackError, SerialCheck, checked_serial};
use axum::body::Bytes;
use axum::http::HeaderMap;
use std::time::Duration;

/// The Standard Webhooks signatures (<https://www.standardwebhooks.com>),
/// as Svix and the platforms built on it send them.
///
/// Three headers: `webhook-id` (the message's id, the same on every
/// retry), `webhook-timestamp` (Unix seconds) and `webhook-signature`,
/// space-separated `v1,<base64>` entries (one per active secret; other
/// versions, `v1a` asymmetric signatures, ignored). Each `v1` is the base64
/// HMAC-SHA256 of `"{webhook-id}.{webhook-timestamp}.{raw body}"` under the
/// key the secret `whsec_<base64>` encodes. The timestamp within the
/// [`tolerance`](Self::tolerance), 300 s by default as in the standard's
/// libraries. The serial is `webhook-id`: a header, but a signed one.
#[derive(Debug, Clone)]
pub struct StandardWebhooks {
    secrets: super::Secrets,
    tolerance: Duration,
    check: SerialCheck,
}

/// The key a `whsec_<base64>` secret encodes (the prefix is optional).
fn key(secret: &str) -> Result<Vec<u8>, SecretError> {
    use base64::Engine as _;
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match engine.decode(b64) {
        Ok(k) if !k.is_empty() => Ok(k),
        Ok(_) => Err(SecretError("the secret is empty".into())),
        Err(e) => Err(SecretError(format!(
            "the secret is not whsec_ and base64: {e}"
        ))),
    }
}

impl StandardWebhooks {
    /// The message id's header (the serial).
    pub const ID: &'static str = "webhook-id";
    /// The timestamp's header.
    pub const TIMESTAMP: &'static str = "webhook-timestamp";
    /// The signatures' header.
    pub const SIGNATURE: &'static str = "webhook-signature";

    /// Messages signed with `secret`, `whsec_<base64>`.
    pub fn new(secret: &str) -> Result<Self, SecretError> {
        Ok(StandardWebhooks {
            secrets: super::Secrets::one(key(secret)?),
            tolerance: Duration::from_secs(300),
            check: any_serial,
        })
    }

    /// Another active secret: during a key roll, a message signed with any
    /// of them is accepted.
    pub fn secret(mut self, secret: &str) -> Result<Self, SecretError> {
        self.secrets.add(key(secret)?);
        Ok(self)
    }

    /// How far from now `webhook-timestamp` may be, either way.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The platform's format for `webhook-id`, beyond the common checks.
    pub fn serial_check(mut self, check: fn(&str) -> Result<(), String>) -> Self {
        self.check = check;
        self
    }

    /// Parses a `webhook-signature` value: every `v1,<base64>`, other
    /// versions skipped.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        let mut v1 = Vec::new();
        for entry in value.split(' ') {
            let (version, sig) = entry
                .split_once(',')
                .ok_or(CallbackError::MalformedSignature)?;
            if version == "v1" {
                v1.push(base64_tag(sig)?);
            }
        }
        if v1.is_empty() {
            return Err(CallbackError::MissingSignature);
        }
        Ok(SignatureHeader::new(None, v1))
    }

    /// Writes a `webhook-signature` value.
    pub fn format_header(header: &SignatureHeader) -> String {
        let entries: Vec<String> = header
            .signatures
            .iter()
            .map(|s| format!("v1,{}", super::base64(s)))
            .collect();
        entries.join(" ")
    }

    /// The `webhook-signature` value sent with message `id` and `body` at
    /// `timestamp`, one `v1` per active secret (the platform's side: for
    /// simulators and tests).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let ts = timestamp.to_string();
        let sigs = self
            .secrets
            .sign(&[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
        Self::format_header(&SignatureHeader::new(None, sigs))
    }
}

impl SignatureScheme for StandardWebhooks {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        let missing_id = || CallbackError::BadSerial("the webhook-id header is missing".into());
        let id = header_str(headers, Self::ID, missing_id(), missing_id())?;
        let ts = header_str(
            headers,
            Self::TIMESTAMP,
            CallbackError::MissingTimestamp,
            CallbackError::MalformedTimestamp,
        )?;
        let t = unix_secs(ts).ok_or(CallbackError::MalformedTimestamp)?;
        let value = header_str(
            headers,
            Self::SIGNATURE,
            CallbackError::MissingSignature,
            CallbackError::MalformedSignature,
        )?;
        let header = Self::parse_header(value)?;
        let signed = [id.as_bytes(), b".", ts.as_bytes(), b".", body];
        if !self.secrets.verify(&signed, &header.signatures) {
            return Err(CallbackError::BadSignature);
        }
        within(t, now_unix_secs, self.tolerance)?;
        let serial = checked_serial(id.to_owned(), self.check)?;
        Ok(Verified::new(Some(serial), Some(t), body.clone()))
    }
}
