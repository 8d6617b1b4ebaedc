//! WeChat Pay API v3 notifications: `Wechatpay-Timestamp`,
//! `Wechatpay-Nonce`, `Wechatpay-Signature`, `Wechatpay-Serial`, and a
//! resource encrypted with AES-256-GCM under the APIv3 key.

use super::{
    RsaKeys, SecretError, SignatureHeader, SignatureScheme, Verified, any_serial,
    base64_rsa_signature, header_str, unix_secs, within,
};
use crate::refusal::{CallbackError, SerialCheck, checked_serial};
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;

/// Where [`WeChatPay`] reads its serial: both are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeChatPaySerial {
    /// A top-level field of the decrypted resource, a string or an
    /// integer: `transaction_id` (the default) for payments, `refund_id`
    /// for refunds.
    Resource(&'static str),
    /// The notification's `id` (`EV-…`, in the body, outside the
    /// resource).
    NotificationId,
}

/// WeChat Pay's API v3 notifications (支付通知, 退款通知…).
///
/// Four headers: `Wechatpay-Timestamp` (Unix seconds), `Wechatpay-Nonce`,
/// `Wechatpay-Signature`, the base64 SHA256withRSA (PKCS#1 v1.5)
/// signature of `"{timestamp}\n{nonce}\n{raw body}\n"`, and
/// `Wechatpay-Serial`, the serial of the platform certificate or the id of
/// the WeChat Pay public key (`PUB_KEY_ID_…`) that signed: the key of that
/// name checks the signature, and [`key`](Self::key) adds another during a
/// rotation (a serial the preset does not hold is refused, 401).
/// `Wechatpay-Signature-Type`, when sent, must be
/// `WECHATPAY2-SHA256-RSA2048`. The timestamp within the
/// [`tolerance`](Self::tolerance), 5 minutes by default as in WeChat
/// Pay's own SDKs. WeChat Pay's signature probes
/// (`WECHATPAY/SIGNTEST/…`) are refused as they should be.
///
/// The body is JSON whose `resource` (`algorithm` `AEAD_AES_256_GCM`,
/// `ciphertext` in base64 with its tag, `nonce`, `associated_data`) is
/// decrypted with the merchant's 32-byte APIv3 key: the handler's
/// [`payload`](crate::SignedCallback::payload) is the decrypted JSON. The
/// serial is by default its `transaction_id`; [`serial`](Self::serial)
/// takes another field or the notification's `id`.
///
/// WeChat Pay stops retrying on a 2xx (body optional):
/// [`accepted`](SignatureScheme::accepted) answers 200 with no body, and a
/// refusal is 4xx with `{"code":"FAIL","message":"…"}`, as WeChat Pay
/// documents.
#[derive(Clone)]
pub struct WeChatPay {
    keys: RsaKeys,
    apiv3_key: Arc<[u8; 32]>,
    tolerance: Duration,
    serial: WeChatPaySerial,
    check: SerialCheck,
}

impl std::fmt::Debug for WeChatPay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeChatPay")
            .field("keys", &self.keys)
            .field("apiv3_key", &"…")
            .field("tolerance", &self.tolerance)
            .field("serial", &self.serial)
            .finish()
    }
}

impl WeChatPay {
    /// The timestamp's header.
    pub const TIMESTAMP: &'static str = "wechatpay-timestamp";
    /// The nonce's header.
    pub const NONCE: &'static str = "wechatpay-nonce";
    /// The signature's header.
    pub const SIGNATURE: &'static str = "wechatpay-signature";
    /// The header naming the key that signed.
    pub const SERIAL: &'static str = "wechatpay-serial";
    /// The signature type's header.
    pub const SIGNATURE_TYPE: &'static str = "wechatpay-signature-type";
    /// The one signature type of API v3.
    pub const RSA2048: &'static str = "WECHATPAY2-SHA256-RSA2048";
    /// The one resource algorithm of API v3.
    pub const AES_256_GCM: &'static str = "AEAD_AES_256_GCM";

    /// Notifications signed under the platform key `public_key` (PEM),
    /// named `serial` in `Wechatpay-Serial`, their resources encrypted
    /// with `apiv3_key` (32 bytes).
    pub fn new(serial: &str, public_key: &str, apiv3_key: &[u8]) -> Result<Self, SecretError> {
        let apiv3_key: [u8; 32] = apiv3_key.try_into().map_err(|_| {
            SecretError(format!(
                "the APIv3 key is {} bytes long, not 32",
                apiv3_key.len()
            ))
        })?;
        Ok(WeChatPay {
            keys: RsaKeys::one(serial, public_key)?,
            apiv3_key: Arc::new(apiv3_key),
            tolerance: Duration::from_secs(300),
            serial: WeChatPaySerial::Resource("transaction_id"),
            check: any_serial,
        })
    }

    /// Another platform key and its serial: during a rotation, a
    /// notification signed under any of them is accepted.
    pub fn key(mut self, serial: &str, public_key: &str) -> Result<Self, SecretError> {
        self.keys.add(serial, public_key)?;
        Ok(self)
    }

    /// How far from now `Wechatpay-Timestamp` may be, either way.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Where the serial is (by default the resource's `transaction_id`)
    /// and its format.
    pub fn serial(mut self, from: WeChatPaySerial, check: fn(&str) -> Result<(), String>) -> Self {
        self.serial = from;
        self.check = check;
        self
    }

    /// Parses a `Wechatpay-Signature` value: the standard base64 of one
    /// RSA signature, padded.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        Ok(SignatureHeader::new(
            None,
            vec![base64_rsa_signature(value)?],
        ))
    }

    /// Writes a `Wechatpay-Signature` value (the first signature).
    pub fn format_header(header: &SignatureHeader) -> String {
        let sig = header.signatures.first().map(|s| super::base64(s));
        sig.unwrap_or_default()
    }

    /// What WeChat Pay signs: `"{timestamp}\n{nonce}\n{body}\n"`.
    pub fn message(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(timestamp.len() + nonce.len() + body.len() + 3);
        for part in [timestamp.as_bytes(), nonce.as_bytes(), body] {
            m.extend_from_slice(part);
            m.push(b'\n');
        }
        m
    }

    /// The notification's `resource`, decrypted (its JSON, checked), and
    /// the notification's `id`.
    pub fn decrypt(&self, body: &[u8]) -> Result<(Bytes, Option<String>), CallbackError> {
        use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
        use base64::Engine as _;
        let bad = |why: &str| CallbackError::MalformedBody(why.to_owned());
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| bad("the body is not JSON"))?;
        let id = v.get("id").and_then(|i| i.as_str()).map(str::to_owned);
        let resource = v
            .get("resource")
            .ok_or_else(|| bad("the body has no `resource`"))?;
        let field = |name: &str| resource.get(name).and_then(|f| f.as_str());
        if field("algorithm") != Some(Self::AES_256_GCM) {
            return Err(bad("the resource is not AEAD_AES_256_GCM"));
        }
        let ciphertext = field("ciphertext")
            .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
            .ok_or_else(|| bad("the resource's `ciphertext` is not base64"))?;
        let nonce = field("nonce")
            .and_then(|n| aes_gcm::Nonce::try_from(n.as_bytes()).ok())
            .ok_or_else(|| bad("the resource's `nonce` is not 12 bytes"))?;
        let aad = field("associated_data").unwrap_or_default();
        let cipher = aes_gcm::Aes256Gcm::new(&(*self.apiv3_key).into());
        let payload = Payload {
            msg: &ciphertext,
            aad: aad.as_bytes(),
        };
        let plain = cipher
            .decrypt(&nonce, payload)
            .map_err(|_| bad("the resource does not decrypt under the APIv3 key"))?;
        serde_json::from_slice::<serde_json::Value>(&plain)
            .map_err(|_| bad("the decrypted resource is not JSON"))?;
        Ok((Bytes::from(plain), id))
    }
}

impl SignatureScheme for WeChatPay {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        let (missing, malformed) = (
            || CallbackError::MissingSignature,
            || CallbackError::MalformedSignature,
        );
        let ts = header_str(
            headers,
            Self::TIMESTAMP,
            CallbackError::MissingTimestamp,
            CallbackError::MalformedTimestamp,
        )?;
        let t = unix_secs(ts).ok_or(CallbackError::MalformedTimestamp)?;
        let nonce = header_str(headers, Self::NONCE, missing(), malformed())?;
        let serial = header_str(headers, Self::SERIAL, missing(), malformed())?;
        let value = header_str(headers, Self::SIGNATURE, missing(), malformed())?;
        let header = Self::parse_header(value)?;
        let kind = headers.get(Self::SIGNATURE_TYPE);
        if kind.is_some_and(|k| k.as_bytes() != Self::RSA2048.as_bytes()) {
            return Err(malformed());
        }
        let message = Self::message(ts, nonce, body);
        if !self.keys.knows(serial)
            || !self
                .keys
                .verify(Some(serial), &message, &header.signatures[0])
        {
            return Err(CallbackError::BadSignature);
        }
        within(t, now_unix_secs, self.tolerance)?;
        let (plain, id) = self.decrypt(body)?;
        let raw = match self.serial {
            WeChatPaySerial::NotificationId => {
                id.ok_or_else(|| CallbackError::BadSerial("the notification has no `id`".into()))?
            }
            WeChatPaySerial::Resource(field) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&plain).expect("checked by decrypt");
                match v.get(field) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                    _ => {
                        return Err(CallbackError::BadSerial(format!(
                            "the resource has no string or integer `{field}`"
                        )));
                    }
                }
            }
        };
        let serial = checked_serial(raw, self.check)?;
        Ok(Verified::new(Some(serial), Some(t), plain))
    }

    fn refused(&self, error: &CallbackError) -> Option<Response> {
        let body = serde_json::json!({ "code": "FAIL", "message": error.to_string() });
        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
        Some((error.status(), json, body.to_string()).into_response())
    }
}
