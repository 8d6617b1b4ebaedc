//! Paddle Billing: `Paddle-Signature: ts=…;h1=…`.

use super::keyed::TimedHex;
use super::{SerialRule, SignatureHeader, SignatureScheme, Verified, any_serial};
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

    /// The header's spelling and the signed bytes' joint.
    const LAYOUT: TimedHex = TimedHex {
        header: Self::HEADER,
        items: ';',
        time: "ts",
        tag: "h1",
        joint: b":",
    };

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
        Self::LAYOUT.parse(value)
    }

    /// Writes a `Paddle-Signature` value (lower-case hex).
    pub fn format_header(header: &SignatureHeader) -> String {
        Self::LAYOUT.format(header)
    }

    /// The header Paddle sends with `body` at `timestamp`, one `h1` per
    /// active secret (the platform's side: for simulators and tests).
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        Self::LAYOUT.sign(&self.secrets, timestamp, body)
    }
}

impl SignatureScheme for Paddle {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        Self::LAYOUT.verify(
            &self.secrets,
            self.tolerance,
            &self.serial,
            headers,
            body,
            now_unix_secs,
        )
    }
}
