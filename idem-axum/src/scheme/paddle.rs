//! Paddle Billing: `Paddle-Signature: ts=…;h1=…`.

use super::{
    SerialRule, SignatureHeader, SignatureScheme, Verified, any_serial, header_str, hex_tag,
    unix_secs, within,
};
use crate::refusal::{CallbackError, SerialFrom};
use axum::body::Bytes;
use axum::http::HeaderMap;
use std::time::Duration;

/// Paddle Billing's notification signatures.
///
/// `Paddle-Signature: ts=<unix secs>;h1=<hex>[;h1=<hex>…]`: each `h1` is
/// the hex HMAC-SHA256 of `"{ts}:{raw body}"` under one of the notification
/// destination's secret keys (`pdl_ntfset_…`, used as it is). Other keys
/// of the header are ignored. `ts` within the
/// [`tolerance`](Self::tolerance), 5 s by default as in Paddle's own SDKs
/// (Paddle signs every retry anew). The serial is the notification's
/// `event_id` (`evt_…`), in the signed body.
#[derive(Debug, Clone)]
pub struct Paddle {
    secrets: super::Secrets,
    tolerance: Duration,
    serial: SerialRule,
}

impl Paddle {
    /// The header's name.
    pub const HEADER: &'static str = "paddle-signature";

    /// Notifications signed with the destination's `secret` (`pdl_ntfset_…`).
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Paddle {
            secrets: super::Secrets::one(secret.into()),
            tolerance: Duration::from_secs(5),
            serial: SerialRule(SerialFrom::JsonField("event_id"), any_serial),
        }
    }

    /// Another active secret: during a key roll, a callback signed with any
    /// of them is accepted.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secrets.add(secret.into());
        self
    }

    /// How far from now `ts` may be, either way.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Where the serial is (by default `event_id` in the body) and its format.
    pub fn serial(mut self, from: SerialFrom, check: fn(&str) -> Result<(), String>) -> Self {
        self.serial = SerialRule(from, check);
        self
    }

    /// Parses a `Paddle-Signature` value: `ts` once, every `h1`, other
    /// keys skipped.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        let mut t = None;
        let mut v1 = Vec::new();
        for item in value.split(';') {
            let (k, v) = item
                .split_once('=')
                .ok_or(CallbackError::MalformedSignature)?;
            match k {
                "ts" if t.is_some() => return Err(CallbackError::MalformedTimestamp),
                "ts" => t = Some(unix_secs(v).ok_or(CallbackError::MalformedTimestamp)?),
                "h1" => v1.push(hex_tag(v)?),
                _ => {}
            }
        }
        let t = t.ok_or(CallbackError::MissingTimestamp)?;
        if v1.is_empty() {
            return Err(CallbackError::MissingSignature);
        }
        Ok(SignatureHeader::new(Some(t), v1))
    }

    /// Writes a `Paddle-Signature` value (lower-case hex).
    pub fn format_header(header: &SignatureHeader) -> String {
        let mut s = format!("ts={}", header.timestamp.unwrap_or_default());
        for sig in &header.signatures {
            s.push_str(";h1=");
            s.push_str(&hex::encode(sig));
        }
        s
    }

    /// The header Paddle sends with `body` at `timestamp`, one `h1` per
    /// active secret (the platform's side: for simulators and tests).
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        let sigs = self.secrets.sign(&[t.as_bytes(), b":", body]);
        Self::format_header(&SignatureHeader::new(Some(timestamp), sigs))
    }
}

impl SignatureScheme for Paddle {
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
            .verify(&[ts.as_bytes(), b":", body], &header.signatures)
        {
            return Err(CallbackError::BadSignature);
        }
        within(t, now_unix_secs, self.tolerance)?;
        let serial = self.serial.read(headers, body)?;
        Ok(Verified::new(Some(serial), Some(t), body.clone()))
    }
}
