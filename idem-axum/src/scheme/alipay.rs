//! Alipay's asynchronous notifications: a form signed in its `sign`
//! parameter, `sign_type=RSA2`.

use super::{
    RsaKeys, SecretError, SignatureHeader, SignatureScheme, Verified, any_serial,
    base64_rsa_signature,
};
use crate::refusal::{CallbackError, SerialCheck, checked_serial};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Alipay's asynchronous notifications (`notify_url`, 异步通知), signed
/// `sign_type=RSA2`.
///
/// The body is a form (`application/x-www-form-urlencoded`). Its `sign`
/// parameter is the base64 SHA256withRSA (PKCS#1 v1.5) signature, under
/// Alipay's private key, of the other parameters sorted by name, `sign`,
/// `sign_type` and the empty ones left out, joined `k=v&k=v` with their
/// values URL-decoded. It is checked with Alipay's public key (the bare
/// base64 of Alipay's console, or PEM); [`key`](Self::key) adds another
/// during a rotation. Only `RSA2` and UTF-8 (`charset`, when sent) are
/// accepted: the legacy `RSA` (SHA-1) and GBK forms are refused.
///
/// Alipay signs no header and checks no timestamp of its own: its
/// `notify_time` is signed, but its retries (over about 25 hours) are the
/// same notification, so a captured notification verifies for as long as
/// the key holds, and only its serial tells it apart. The serial is by
/// default `notify_id`, the notification's id; [`serial`](Self::serial)
/// names another signed parameter instead (`trade_no`: one booking per
/// trade, whatever its later notifications, `TRADE_SUCCESS` then
/// `TRADE_FINISHED`, say).
///
/// Alipay stops retrying once it reads the plain-text body `success`:
/// [`accepted`](SignatureScheme::accepted) answers it (200), and a refused
/// notification is answered `failure` (400 or 401: Alipay retries it).
/// The handler's payload is the form, as signed.
#[derive(Debug, Clone)]
pub struct Alipay {
    keys: RsaKeys,
    serial: &'static str,
    check: SerialCheck,
}

impl Alipay {
    /// The signature's parameter.
    pub const SIGN: &'static str = "sign";
    /// The signature type's parameter (`RSA2`).
    pub const SIGN_TYPE: &'static str = "sign_type";
    /// The answer Alipay expects once the notification is taken.
    pub const SUCCESS: &'static str = "success";
    /// The answer to a refused notification (Alipay sends it again).
    pub const FAILURE: &'static str = "failure";

    /// Notifications signed with `alipay_public_key` (the base64 of
    /// Alipay's console, or PEM).
    pub fn new(alipay_public_key: &str) -> Result<Self, SecretError> {
        Ok(Alipay {
            keys: RsaKeys::one("", alipay_public_key)?,
            serial: "notify_id",
            check: any_serial,
        })
    }

    /// Another of Alipay's public keys: during a rotation, a notification
    /// signed under any of them is accepted.
    pub fn key(mut self, alipay_public_key: &str) -> Result<Self, SecretError> {
        self.keys.add("", alipay_public_key)?;
        Ok(self)
    }

    /// The signed parameter holding the serial (by default `notify_id`;
    /// `trade_no`, `out_trade_no`…) and its format.
    pub fn serial(
        mut self,
        parameter: &'static str,
        check: fn(&str) -> Result<(), String>,
    ) -> Self {
        self.serial = parameter;
        self.check = check;
        self
    }

    /// Parses a `sign` value (URL-decoded): the standard base64 of one
    /// RSA signature, padded.
    pub fn parse_header(value: &str) -> Result<SignatureHeader, CallbackError> {
        Ok(SignatureHeader::new(
            None,
            vec![base64_rsa_signature(value)?],
        ))
    }

    /// Writes a `sign` value (the first signature, before URL-encoding).
    pub fn format_header(header: &SignatureHeader) -> String {
        let sig = header.signatures.first().map(|s| super::base64(s));
        sig.unwrap_or_default()
    }

    /// The form's parameters, URL-decoded, in the body's order: refused
    /// when a name comes twice, a value is not UTF-8, or `charset` is not
    /// UTF-8.
    pub fn parse_form(body: &[u8]) -> Result<Vec<(String, String)>, CallbackError> {
        let bad = |why: String| CallbackError::MalformedBody(why);
        let mut params: Vec<(String, String)> = Vec::new();
        for (name, value) in form_urlencoded::parse(body) {
            // form_urlencoded replaces bytes that are not UTF-8.
            if name.contains('\u{FFFD}') || value.contains('\u{FFFD}') {
                return Err(bad("the form is not UTF-8".into()));
            }
            if params.iter().any(|(n, _)| *n == name) {
                return Err(bad(format!("`{name}` is sent twice")));
            }
            params.push((name.into_owned(), value.into_owned()));
        }
        let charset = params.iter().find(|(n, _)| n == "charset");
        if let Some((_, cs)) = charset.filter(|(_, cs)| !cs.eq_ignore_ascii_case("utf-8")) {
            return Err(bad(format!("charset {cs}: only utf-8 is accepted")));
        }
        Ok(params)
    }

    /// What Alipay signs: the parameters but `sign`, `sign_type` and the
    /// empty ones, sorted by name, joined `k=v&k=v`.
    pub fn signed_content(params: &[(String, String)]) -> String {
        let mut signed: Vec<&(String, String)> = params
            .iter()
            .filter(|(n, v)| n != Self::SIGN && n != Self::SIGN_TYPE && !v.is_empty())
            .collect();
        signed.sort();
        let pairs: Vec<String> = signed.iter().map(|(n, v)| format!("{n}={v}")).collect();
        pairs.join("&")
    }
}

impl SignatureScheme for Alipay {
    fn verify(
        &self,
        _headers: &HeaderMap,
        body: &Bytes,
        _now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        let params = Self::parse_form(body)?;
        let get = |name: &str| params.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let sign = get(Self::SIGN).ok_or(CallbackError::MissingSignature)?;
        let header = Self::parse_header(sign)?;
        if get(Self::SIGN_TYPE).is_some_and(|t| t != "RSA2") {
            return Err(CallbackError::MalformedSignature);
        }
        let content = Self::signed_content(&params);
        if !self
            .keys
            .verify(None, content.as_bytes(), &header.signatures[0])
        {
            return Err(CallbackError::BadSignature);
        }
        let serial = get(self.serial).filter(|v| !v.is_empty()).ok_or_else(|| {
            CallbackError::BadSerial(format!("the form has no `{}`", self.serial))
        })?;
        let serial = checked_serial(serial.clone(), self.check)?;
        Ok(Verified::new(Some(serial), None, body.clone()))
    }

    fn accepted(&self) -> Response {
        plain(StatusCode::OK, Self::SUCCESS)
    }

    fn refused(&self, error: &CallbackError) -> Option<Response> {
        Some(plain(error.status(), Self::FAILURE))
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}
