//! GitHub: `X-Hub-Signature-256: sha256=<hex>`.

use super::keyed::body_signed;
use super::{SerialRule, SignatureHeader, SignatureScheme, Verified, any_serial, hex_tag};
use crate::refusal::{CallbackError, SerialFrom};
use axum::body::Bytes;
use axum::http::HeaderMap;

/// GitHub's webhook signatures.
///
/// `X-Hub-Signature-256: sha256=<hex>`, the hex HMAC-SHA256 of the raw body
/// under the webhook's secret. GitHub signs no timestamp: a captured
/// delivery verifies at any time, and only its key tells it apart. The
/// delivery's id (`X-GitHub-Delivery`) is not signed, so the serial is by
/// default the body's digest ([`SerialFrom::BodyDigest`]): the same signed
/// body is one key whatever headers come with it, GitHub's redeliveries
/// (the same body) included. [`serial`](Self::serial) can name a field of
/// the body instead.
#[derive(Debug, Clone)]
pub struct GitHub {
    secrets: super::Secrets,
    serial: SerialRule,
}

impl GitHub {
    /// The header's name.
    pub const HEADER: &'static str = "x-hub-signature-256";

    /// Deliveries signed with the webhook's `secret`.
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        GitHub {
            secrets: super::Secrets::one(secret.into()),
            serial: SerialRule(SerialFrom::BodyDigest, any_serial),
        }
    }

    /// Another active secret: during a key roll, a delivery signed with
    /// any of them is accepted.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secrets.add(secret.into());
        self
    }

    /// Where the serial is (by default the body's digest) and its format.
    pub fn serial(mut self, from: SerialFrom, check: fn(&str) -> Result<(), String>) -> Self {
        self.serial = SerialRule(from, check);
        self
    }

    /// Parses an `X-Hub-Signature-256` value: `sha256=` and 64 hex digits.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        let sig = value
            .strip_prefix("sha256=")
            .ok_or(CallbackError::MalformedSignature)?;
        Ok(SignatureHeader::new(None, vec![hex_tag(sig)?]))
    }

    /// Writes an `X-Hub-Signature-256` value (the first signature).
    pub fn format_header(header: &SignatureHeader) -> String {
        let sig = header.signatures.first().map(hex::encode);
        format!("sha256={}", sig.unwrap_or_default())
    }

    /// The header GitHub sends with `body`, signed with the first secret
    /// (the platform's side: for simulators and tests).
    pub fn sign(&self, body: &[u8]) -> String {
        let sigs = self.secrets.sign(&[body]);
        Self::format_header(&SignatureHeader::new(None, sigs))
    }
}

impl SignatureScheme for GitHub {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        _now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        body_signed(
            Self::HEADER,
            Self::parse_header,
            &self.secrets,
            &self.serial,
            headers,
            body,
        )
    }
}
