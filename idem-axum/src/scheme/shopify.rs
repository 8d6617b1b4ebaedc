//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`.

use super::keyed::body_signed;
use super::{SerialRule, SignatureHeader, SignatureScheme, Verified, any_serial, base64_tag};
use crate::refusal::{CallbackError, SerialFrom};
use axum::body::Bytes;
use axum::http::HeaderMap;

/// Shopify's webhook signatures.
///
/// `X-Shopify-Hmac-Sha256: <base64>`, the base64 HMAC-SHA256 of the raw
/// body under the app's client secret. Shopify signs no timestamp: a
/// captured webhook verifies at any time, and only its key tells it
/// apart. Its ids (`X-Shopify-Webhook-Id`, `X-Shopify-Event-Id`) are
/// headers it does not sign, so the serial is by default the body's digest
/// ([`SerialFrom::BodyDigest`]): Shopify's retries resend the same body.
/// [`serial`](Self::serial) can name a field of the body instead (for
/// orders: `admin_graphql_api_id` changes with the resource, not the event).
#[derive(Debug, Clone)]
pub struct Shopify {
    secrets: super::Secrets,
    serial: SerialRule,
}

impl Shopify {
    /// The header's name.
    pub const HEADER: &'static str = "x-shopify-hmac-sha256";

    /// Webhooks signed with the app's client `secret`.
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Shopify {
            secrets: super::Secrets::one(secret.into()),
            serial: SerialRule(SerialFrom::BodyDigest, any_serial),
        }
    }

    /// Another active secret: during a key roll, a webhook signed with
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

    /// Parses an `X-Shopify-Hmac-Sha256` value: the standard base64 of 32 bytes, padded.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        Ok(SignatureHeader::new(None, vec![base64_tag(value)?]))
    }

    /// Writes an `X-Shopify-Hmac-Sha256` value (the first signature).
    pub fn format_header(header: &SignatureHeader) -> String {
        let sig = header.signatures.first().map(|s| super::base64(s));
        sig.unwrap_or_default()
    }

    /// The header Shopify sends with `body`, signed with the first secret
    /// (the platform's side: for simulators and tests).
    pub fn sign(&self, body: &[u8]) -> String {
        let sigs = self.secrets.sign(&[body]);
        Self::format_header(&SignatureHeader::new(None, sigs))
    }
}

impl SignatureScheme for Shopify {
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
