//! Stripe: `Stripe-Signature: t=…,v1=…`.

use super::keyed::TimedHex;
use super::{SerialRule, SignatureHeader, SignatureScheme, Verified, any_serial};
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

    /// The header's spelling and the signed bytes' joint.
    const LAYOUT: TimedHex = TimedHex {
        header: Self::HEADER,
        items: ',',
        time: "t",
        tag: "v1",
        joint: b".",
    };

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
        Self::LAYOUT.parse(value)
    }

    /// Writes a `Stripe-Signature` value (lower-case hex).
    pub fn format_header(header: &SignatureHeader) -> String {
        Self::LAYOUT.format(header)
    }

    /// The header Stripe sends with `body` at `timestamp`, one `v1` per
    /// active secret (the platform's side: for simulators and tests).
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        Self::LAYOUT.sign(&self.secrets, timestamp, body)
    }
}

impl SignatureScheme for Stripe {
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
