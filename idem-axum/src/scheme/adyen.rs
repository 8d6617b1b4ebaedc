//! Adyen's standard notifications: the item's
//! `additionalData.hmacSignature`.

use super::{SecretError, SignatureHeader, SignatureScheme, Verified, any_serial, base64_tag};
use crate::refusal::{CallbackError, SerialCheck, checked_serial};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// Adyen's standard webhooks (notifications: `AUTHORISATION`, `CAPTURE`,
/// `REFUND`…), JSON, signed with an HMAC key.
///
/// The signature is not over the body: each `NotificationRequestItem`
/// carries in `additionalData.hmacSignature` the base64 HMAC-SHA256, under
/// the hex-decoded HMAC key of the webhook, of its fields
/// `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success`
/// (an absent field empty, `value` and `currency` from `amount`). Adyen
/// sends one item per request: a body with none, or more than one, is
/// refused. Adyen signs no timestamp: a captured notification verifies for
/// as long as the key holds, and only its serial tells it apart.
///
/// The serial is `"{pspReference}:{eventCode}"`, both signed: Adyen's
/// retries of a notification carry the same pair, and the same payment's
/// other events (`CAPTURE` after `AUTHORISATION`) are booked on their own.
/// The handler's payload is the `NotificationRequestItem`: **only the
/// fields above are signed**, the others (`eventDate`, `reason`,
/// `paymentMethod`, `additionalData`…) are as Adyen sent them or as anyone
/// who replays the notification changed them.
///
/// Adyen stops retrying once it reads `[accepted]`:
/// [`accepted`](SignatureScheme::accepted) answers it (200); a refusal is
/// the problem of [`CallbackError`], and Adyen retries it.
#[derive(Debug, Clone)]
pub struct Adyen {
    secrets: super::Secrets,
    check: SerialCheck,
}

/// The key of an HMAC key in hex, as Adyen's Customer Area shows it.
fn key(hmac_key: &str) -> Result<Vec<u8>, SecretError> {
    match hex::decode(hmac_key.trim()) {
        Ok(k) if !k.is_empty() => Ok(k),
        Ok(_) => Err(SecretError("the HMAC key is empty".into())),
        Err(e) => Err(SecretError(format!("the HMAC key is not hex: {e}"))),
    }
}

impl Adyen {
    /// The answer Adyen expects once the notification is taken.
    pub const ACCEPTED: &'static str = "[accepted]";
    /// The signed fields, in order (`value` and `currency` are
    /// `amount`'s).
    pub const SIGNED_FIELDS: [&'static str; 8] = [
        "pspReference",
        "originalReference",
        "merchantAccountCode",
        "merchantReference",
        "value",
        "currency",
        "eventCode",
        "success",
    ];

    /// Notifications signed with `hmac_key` (hex).
    pub fn new(hmac_key: &str) -> Result<Self, SecretError> {
        Ok(Adyen {
            secrets: super::Secrets::one(key(hmac_key)?),
            check: any_serial,
        })
    }

    /// Another active HMAC key: during a key roll, a notification signed
    /// with any of them is accepted.
    pub fn secret(mut self, hmac_key: &str) -> Result<Self, SecretError> {
        self.secrets.add(key(hmac_key)?);
        Ok(self)
    }

    /// The format of the serial `"{pspReference}:{eventCode}"`, beyond the
    /// common checks.
    pub fn serial_check(mut self, check: fn(&str) -> Result<(), String>) -> Self {
        self.check = check;
        self
    }

    /// Parses an `hmacSignature` value: the standard base64 of 32 bytes,
    /// padded.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        Ok(SignatureHeader::new(None, vec![base64_tag(value)?]))
    }

    /// Writes an `hmacSignature` value (the first signature).
    pub fn format_header(header: &SignatureHeader) -> String {
        let sig = header.signatures.first().map(|s| super::base64(s));
        sig.unwrap_or_default()
    }

    /// What Adyen signs of a `NotificationRequestItem`: its
    /// [`SIGNED_FIELDS`](Self::SIGNED_FIELDS) joined with `:`, an absent
    /// one empty (a string as is, an integer or a boolean written out).
    pub fn signed_content(item: &Value) -> String {
        let amount = item.get("amount");
        let fields: Vec<String> = Self::SIGNED_FIELDS
            .iter()
            .map(|&name| {
                let v = match name {
                    "value" | "currency" => amount.and_then(|a| a.get(name)),
                    _ => item.get(name),
                };
                match v {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                    _ => String::new(),
                }
            })
            .collect();
        fields.join(":")
    }

    /// The `hmacSignature` of `item`, signed with the first key (the
    /// platform's side: for simulators and tests).
    pub fn sign(&self, item: &Value) -> String {
        let content = Self::signed_content(item);
        let sigs = self.secrets.sign(&[content.as_bytes()]);
        Self::format_header(&SignatureHeader::new(None, sigs))
    }

    /// The one `NotificationRequestItem` of a notification's body.
    pub fn item(body: &[u8]) -> Result<Value, CallbackError> {
        let bad = |why: &str| CallbackError::MalformedBody(why.to_owned());
        let v: Value = serde_json::from_slice(body).map_err(|_| bad("the body is not JSON"))?;
        let items = v
            .get("notificationItems")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("the body has no `notificationItems`"))?;
        match items.as_slice() {
            [one] => one
                .get("NotificationRequestItem")
                .filter(|i| i.is_object())
                .cloned()
                .ok_or_else(|| bad("the item has no `NotificationRequestItem`")),
            _ => Err(bad("the notification holds other than one item")),
        }
    }
}

impl SignatureScheme for Adyen {
    fn verify(
        &self,
        _headers: &HeaderMap,
        body: &Bytes,
        _now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        let item = Self::item(body)?;
        let sig = item
            .get("additionalData")
            .and_then(|d| d.get("hmacSignature"))
            .ok_or(CallbackError::MissingSignature)?
            .as_str()
            .ok_or(CallbackError::MalformedSignature)?;
        let header = Self::parse_header(sig)?;
        let content = Self::signed_content(&item);
        if !self
            .secrets
            .verify(&[content.as_bytes()], &header.signatures)
        {
            return Err(CallbackError::BadSignature);
        }
        let field = |name: &str| item.get(name).and_then(Value::as_str).unwrap_or_default();
        let (psp, event) = (field("pspReference"), field("eventCode"));
        if psp.is_empty() || event.is_empty() {
            return Err(CallbackError::BadSerial(
                "the item has no `pspReference` or no `eventCode`".into(),
            ));
        }
        let serial = checked_serial(format!("{psp}:{event}"), self.check)?;
        let payload = Bytes::from(item.to_string());
        Ok(Verified::new(Some(serial), None, payload))
    }

    fn accepted(&self) -> Response {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            Self::ACCEPTED,
        )
            .into_response()
    }
}
