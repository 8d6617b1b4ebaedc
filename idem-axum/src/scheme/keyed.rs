//! The steps the HMAC presets share. Stripe and Paddle send one header of
//! a signed time and one hex tag per active secret, over
//! `"{time}<joint>{raw body}"`; they differ only in its spelling
//! ([`TimedHex`]). GitHub and Shopify sign the raw body alone
//! ([`body_signed`]).

use super::{
    Secrets, SerialRule, SignatureHeader, Verified, header_str, hex_tag, unix_secs, within,
};
use crate::refusal::CallbackError;
use axum::body::Bytes;
use axum::http::HeaderMap;
use std::time::Duration;

/// How a preset spells its `<time>=<secs><items><tag>=<hex>…` header:
/// Stripe's `t=…,v1=…`, Paddle's `ts=…;h1=…`.
pub(super) struct TimedHex {
    /// The header's name.
    pub(super) header: &'static str,
    /// Between two items: `,` or `;`.
    pub(super) items: char,
    /// The signed time's key: `t` or `ts`.
    pub(super) time: &'static str,
    /// A signature's key: `v1` or `h1`; other keys are skipped.
    pub(super) tag: &'static str,
    /// Between the time and the body in the signed bytes: `.` or `:`.
    pub(super) joint: &'static [u8],
}

impl TimedHex {
    /// The time once, every tag, other keys skipped.
    pub(super) fn parse(&self, value: &str) -> Result<SignatureHeader, CallbackError> {
        let mut t = None;
        let mut tags = Vec::new();
        for item in value.split(self.items) {
            let (k, v) = item
                .split_once('=')
                .ok_or(CallbackError::MalformedSignature)?;
            if k == self.time {
                if t.is_some() {
                    return Err(CallbackError::MalformedTimestamp);
                }
                t = Some(unix_secs(v).ok_or(CallbackError::MalformedTimestamp)?);
            } else if k == self.tag {
                tags.push(hex_tag(v)?);
            }
        }
        let t = t.ok_or(CallbackError::MissingTimestamp)?;
        if tags.is_empty() {
            return Err(CallbackError::MissingSignature);
        }
        Ok(SignatureHeader::new(Some(t), tags))
    }

    /// The header's value (lower-case hex).
    pub(super) fn format(&self, header: &SignatureHeader) -> String {
        let mut s = format!("{}={}", self.time, header.timestamp.unwrap_or_default());
        for sig in &header.signatures {
            s.push(self.items);
            s.push_str(self.tag);
            s.push('=');
            s.push_str(&hex::encode(sig));
        }
        s
    }

    /// The header the platform sends with `body` at `timestamp`, one tag
    /// per secret.
    pub(super) fn sign(&self, secrets: &Secrets, timestamp: i64, body: &[u8]) -> String {
        let t = timestamp.to_string();
        let sigs = secrets.sign(&[t.as_bytes(), self.joint, body]);
        self.format(&SignatureHeader::new(Some(timestamp), sigs))
    }

    /// The header's syntax, a tag by one of the `secrets`, the time within
    /// `tolerance` of `now`, then the serial.
    pub(super) fn verify(
        &self,
        secrets: &Secrets,
        tolerance: Duration,
        serial: &SerialRule,
        headers: &HeaderMap,
        body: &Bytes,
        now: i64,
    ) -> Result<Verified, CallbackError> {
        let value = header_str(
            headers,
            self.header,
            CallbackError::MissingSignature,
            CallbackError::MalformedSignature,
        )?;
        let header = self.parse(value)?;
        let t = header.timestamp.unwrap_or_default();
        let ts = t.to_string();
        if !secrets.verify(&[ts.as_bytes(), self.joint, body], &header.signatures) {
            return Err(CallbackError::BadSignature);
        }
        within(t, now, tolerance)?;
        let serial = serial.read(headers, body)?;
        Ok(Verified::new(Some(serial), Some(t), body.clone()))
    }
}

/// A preset over the raw body alone, no time (GitHub, Shopify): the header
/// `name` read by `parse`, a tag by one of the `secrets`, then the serial.
pub(super) fn body_signed(
    name: &str,
    parse: fn(&str) -> Result<SignatureHeader, CallbackError>,
    secrets: &Secrets,
    serial: &SerialRule,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Verified, CallbackError> {
    let value = header_str(
        headers,
        name,
        CallbackError::MissingSignature,
        CallbackError::MalformedSignature,
    )?;
    let header = parse(value)?;
    if !secrets.verify(&[body], &header.signatures) {
        return Err(CallbackError::BadSignature);
    }
    let serial = serial.read(headers, body)?;
    Ok(Verified::new(Some(serial), None, body.clone()))
}
