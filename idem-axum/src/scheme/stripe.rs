//! Stripe: `Stripe-Signature: t=…,v1=…`.

use super::{
    SerialRule, SignatureHeader, SignatureScheme, Verified, any_serial, header_str, hex_tag,
    unix_secs, within,
};
use crate::refusal::{CallbackError, SerialFrom};
use axum::body::Bytes;
use axum::http::HeaderMap;
use std::time::Duration;

/// Stripe's webhook signatures.
///
/// `Stripe-Signature: t=<unix secs>,v1=<hex>[,v1=<hex>…]`: each `v1` is the
/// hex HMAC-SHA256 of `"{t}.{raw body}"` under one of the endpoint's
/// signing secrets (`whsec_…`, used as it is, the whole string: Stripe
/// sends one `v1` per active secret while one rolls). Other schemes (`v0`,
/// test-mode signatures) are ignored. `t` within the
/// [`tolerance`](Self::tolerance), 300 s by default as in Stripe's
/// libraries. The serial is the event's `id` (`evt_…`), in the signed body.
#[derive(Debug, Clone)]
pub struct Stripe {
    secrets: super::Secrets,
    tolerance: Duration,
    serial: SerialRule,
}

impl Stripe {
    /// The header's name.
    pub const HEADER: &'static str = "stripe-signature";

    /// Callbacks signed with the endpoint's `secret` (`whsec_…`).
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Stripe {
            secrets: super::Secrets::one(secret.into()),
            tolerance: Duration::from_secs(300),
            serial: SerialRule(SerialFrom::JsonField("id"), any_serial),
        }
    }

    /// Another active secret: during a key roll, a callback signed with any
    /// of them is accepted.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secrets.add(secret.into());
        self
    }

    /// How far from now `t` may be, either way.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Where the serial is (by default `id` in the body) and its format.
    pub fn serial(mut self, from: SerialFrom, check: fn(&str) -> Result<(), String>) -> Self {
        self.serial = SerialRule(from, check);
        self
    }

    /// Parses a `Stripe-Signature` value: `t` once, every `v1`, other
    /// schemes skipped.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        let mut t = None;
        let mut v1 = Vec::new();
        for item in value.split(',') {
            let (k, v) = item
                .split_once('=')
                .ok_or(CallbackError::MalformedSignature)?;
            match k {
                "t" if t.is_some() => return Err(CallbackError::MalformedTimestamp),
                "t" => t = Some(unix_secs(v).ok_or(CallbackError::MalformedTimestamp)?),
                "v1" => v1.push(hex_tag(v)?),
                _ => {}
            }
        }
        let t = t.ok_or(CallbackError::MissingTimestamp)?;
        if v1.is_empty() {
            return Err(CallbackError::MissingSignature);
        }
        Ok(SignatureHeader::new(Some(t), v1))
    }

    /// Writes a `Stripe-Signature` value (lower-case hex).
    pub fn format_header(header: &SignatureHeader) -> String {
        let mut s = format!("t={}", header.timestamp.unwrap_or_default());
        for sig in &header.signatures {
            s.push_str(",v1=");
            s.push_str(&hex::encode(sig));
        }
        s
    }

    /// The header Stripe sends with `body` at `timestamp`, one `v1` per
    /// active secret (the platform's side: for simulators and tests).
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        let sigs = self.secrets.sign(&[t.as_bytes(), b".", body]);
        Self::format_header(&SignatureHeader::new(Some(timestamp), sigs))
    }
}

impl SignatureScheme for Stripe {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        let value = header_str(
            headers,
            Self::HEADER,
            CallbackError::MissingSignature,
            CallbackError::MalformedSignature,
        )?;
        let header = Self::parse_header(value)?;
        let t = header.timestamp.unwrap_or_default();
        let ts = t.to_string();
        if !self
            .secrets
            .verify(&[ts.as_bytes(), b".", body], &header.signatures)
        {
            return Err(CallbackError::BadSignature);
        }
        within(t, now_unix_secs, self.tolerance)?;
        let serial = self.serial.read(headers, body)?;
        Ok(Verified::new(Some(serial), Some(t), body.clone()))
    }
}
