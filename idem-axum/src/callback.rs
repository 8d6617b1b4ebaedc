//! Third-party callbacks: the platform's HMAC-SHA256 signature over the
//! raw body, checked in constant time, a timestamp within a tolerance
//! (an old callback captured and sent again is refused even once its
//! idempotency record has expired), and the platform's serial — its event
//! or transaction id — as the idempotency key, validated before use. The
//! key is read from what the signature covers: a serial from a header the
//! platform does not sign is an explicit, named choice
//! ([`SerialFrom::UnsignedHeader`]).

use super::problem::Problem;
use super::refusal::{CallbackError, SerialCheck, SerialFrom, read_serial, unix_now};
use super::scheme::{SignatureScheme, Verified};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{KeyInit, Mac};
use std::sync::Arc;
use std::time::Duration;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How a platform signs its callbacks, and where its serial is.
///
/// The signature is `hex(hmac_sha256(secret, message))` in
/// [`signature_header`](Self::signature_header) (default `x-signature`),
/// where `message` is `"{timestamp}.{raw body}"` with the timestamp (Unix
/// seconds) sent in [`timestamp_header`](Self::timestamp_header) (default
/// `x-timestamp`), or the raw body alone
/// [`without_timestamp`](Self::without_timestamp). The timestamp is signed,
/// so it cannot be refreshed by whoever replays a captured callback; one
/// further than [`tolerance`](Self::tolerance) (default 5 min) from now, in
/// either direction, is refused.
///
/// | refused | status |
/// |---|---|
/// | signature or timestamp header missing, not hex, not a number | 400 |
/// | signature not the HMAC of this body (and timestamp) | 401 |
/// | timestamp outside the tolerance | 401 |
/// | serial missing, longer than [`MAX_SERIAL_LEN`](crate::MAX_SERIAL_LEN), not printable ASCII, or refused by the check | 400 |
///
/// Where the serial comes from decides what a replay of one captured
/// callback can do: see [`SerialFrom`].
#[derive(Clone)]
pub struct CallbackVerifier {
    secret: Arc<[u8]>,
    signature_header: HeaderName,
    timestamp_header: Option<HeaderName>,
    tolerance: Duration,
    serial: Option<(SerialFrom, SerialCheck)>,
}

impl std::fmt::Debug for CallbackVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackVerifier")
            .field("secret", &"…")
            .field("signature_header", &self.signature_header)
            .field("timestamp_header", &self.timestamp_header)
            .field("tolerance", &self.tolerance)
            .field("serial", &self.serial.as_ref().map(|s| &s.0))
            .finish()
    }
}

impl CallbackVerifier {
    /// Callbacks signed with `secret`, timestamped in `x-timestamp`, signed
    /// in `x-signature`, 5 minutes of tolerance, no serial.
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        CallbackVerifier {
            secret: secret.into().into(),
            signature_header: HeaderName::from_static("x-signature"),
            timestamp_header: Some(HeaderName::from_static("x-timestamp")),
            tolerance: Duration::from_secs(300),
            serial: None,
        }
    }

    /// The header carrying the signature.
    pub fn signature_header(mut self, name: HeaderName) -> Self {
        self.signature_header = name;
        self
    }

    /// The header carrying the signed timestamp.
    pub fn timestamp_header(mut self, name: HeaderName) -> Self {
        self.timestamp_header = Some(name);
        self
    }

    /// The platform signs the body alone and sends no timestamp: an old
    /// callback replayed is then told apart by its serial only, for as long
    /// as its record lives.
    pub fn without_timestamp(mut self) -> Self {
        self.timestamp_header = None;
        self
    }

    /// How far from now a timestamp may be, either way.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Where the serial is, and the platform's format for it (`check`
    /// answers why a serial is refused; with [`SerialFrom::BodyDigest`] it
    /// sees the digest). [`SignedCallback::serial`] is then always present.
    pub fn serial(mut self, from: SerialFrom, check: fn(&str) -> Result<(), String>) -> Self {
        self.serial = Some((from, check));
        self
    }

    fn mac(&self, timestamp: Option<i64>, body: &[u8]) -> HmacSha256 {
        let mut mac =
            <HmacSha256 as KeyInit>::new_from_slice(&self.secret).expect("HMAC takes any key");
        if let Some(ts) = timestamp {
            mac.update(ts.to_string().as_bytes());
            mac.update(b".");
        }
        mac.update(body);
        mac
    }

    /// The signature header's value for `body` signed at `timestamp` (the
    /// platform's side: for tests and simulators). `timestamp` is ignored
    /// [`without_timestamp`](Self::without_timestamp).
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        let ts = self.timestamp_header.as_ref().map(|_| timestamp);
        hex::encode(self.mac(ts, body).finalize().into_bytes())
    }

    /// The headers a platform sends with `body`, signed now.
    pub fn signed_headers(&self, body: &[u8]) -> Vec<(HeaderName, String)> {
        let now = unix_now();
        let mut h = vec![(self.signature_header.clone(), self.sign(now, body))];
        if let Some(name) = &self.timestamp_header {
            h.push((name.clone(), now.to_string()));
        }
        h
    }

    /// Checks the signature (and timestamp) of `body` against the clock.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Option<i64>, CallbackError> {
        self.verify_at(headers, body, unix_now())
    }

    /// The same at `now` (Unix seconds). Returns the signed timestamp.
    /// The header's syntax first (400), then the signature in constant time
    /// (401), and the timestamp's age only once it is known to be the
    /// platform's (401).
    pub fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Option<i64>, CallbackError> {
        let sig = headers
            .get(&self.signature_header)
            .ok_or(CallbackError::MissingSignature)?;
        let tag = std::str::from_utf8(sig.as_bytes())
            .ok()
            .and_then(|s| hex::decode(s.trim()).ok())
            .ok_or(CallbackError::MalformedSignature)?;
        let ts = match &self.timestamp_header {
            None => None,
            Some(name) => {
                let v = headers.get(name).ok_or(CallbackError::MissingTimestamp)?;
                let ts = std::str::from_utf8(v.as_bytes())
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or(CallbackError::MalformedTimestamp)?;
                Some(ts)
            }
        };
        // `verify_slice` compares in constant time.
        self.mac(ts, body)
            .verify_slice(&tag)
            .map_err(|_| CallbackError::BadSignature)?;
        if let Some(ts) = ts {
            let age = now.saturating_sub(ts);
            if age.unsigned_abs() > self.tolerance.as_secs() {
                return Err(CallbackError::StaleTimestamp { age_secs: age });
            }
        }
        Ok(ts)
    }

    /// The serial of a verified callback, per [`serial`](Self::serial)
    /// (`None` when the verifier names none); what [`SignedCallback`]
    /// does after [`verify`](Self::verify).
    pub fn serial_of(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Option<String>, CallbackError> {
        let Some((from, check)) = &self.serial else {
            return Ok(None);
        };
        read_serial(from, *check, headers, body).map(Some)
    }
}

/// The verifier as a [`SignatureScheme`]: [`verify_at`](Self::verify_at),
/// then [`serial_of`](Self::serial_of); the payload is the body.
impl SignatureScheme for CallbackVerifier {
    fn verify(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        now_unix_secs: i64,
    ) -> Result<Verified, CallbackError> {
        let timestamp = self.verify_at(headers, body, now_unix_secs)?;
        let serial = self.serial_of(headers, body)?;
        Ok(Verified::new(serial, timestamp, body.clone()))
    }
}

/// A callback whose signature (and timestamp) checked out, with its raw
/// body, its payload and its serial. An extractor: the scheme `V` comes from
/// the router's state (`V: FromRef<S>`): a [`CallbackVerifier`] by default,
/// a preset of [`scheme`](crate::scheme) (`SignedCallback<Stripe>`), or any
/// [`SignatureScheme`] behind a [`Scheme`](crate::scheme::Scheme).
/// Refused callbacks are answered (the scheme's
/// [`refused`](SignatureScheme::refused), by default a problem:
/// [`CallbackError`]) before the handler, and so before the database.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SignedCallback<V = CallbackVerifier> {
    /// The raw body, as signed.
    pub body: Bytes,
    /// The signed timestamp, unless the scheme has none.
    pub timestamp: Option<i64>,
    serial: Option<String>,
    payload: Bytes,
    scheme: V,
}

impl<V: SignatureScheme> SignedCallback<V> {
    /// The platform's serial, validated (present when the scheme names
    /// one: every preset, a [`CallbackVerifier`] given a
    /// [`serial`](CallbackVerifier::serial)): the idempotency key.
    pub fn serial(&self) -> &str {
        self.serial.as_deref().unwrap_or_default()
    }

    /// What the handler reads: the body, unless the scheme signs a part of
    /// it (see [`Verified::payload`]).
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The payload as JSON; `Err` is the 400 problem to answer.
    #[allow(clippy::result_large_err)]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Response> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            Problem::new(StatusCode::BAD_REQUEST, "Invalid body", e.to_string()).into_response()
        })
    }

    /// The answer the platform expects once the callback is booked (or
    /// found booked): the scheme's [`accepted`](SignatureScheme::accepted).
    pub fn accepted(&self) -> Response {
        self.scheme.accepted()
    }
}

/// Why [`SignedCallback`] refused a request: its answer is a problem
/// (`application/problem+json`), or the scheme's own; take
/// `Result<SignedCallback, CallbackRejection>` to answer in the
/// application's own format.
#[derive(Debug)]
#[non_exhaustive]
pub enum CallbackRejection {
    /// The body could not be read (over the body limit: 413).
    Body(BytesRejection),
    /// The signature, timestamp or serial was refused, answered with the
    /// problem of [`CallbackError`].
    Refused(CallbackError),
    /// The same, answered as the scheme's
    /// [`refused`](SignatureScheme::refused) chose.
    Answered {
        /// Why.
        error: CallbackError,
        /// The scheme's answer.
        answer: Response,
    },
}

impl CallbackRejection {
    /// Why the callback was refused, unless its body could not be read.
    pub fn error(&self) -> Option<&CallbackError> {
        match self {
            CallbackRejection::Body(_) => None,
            CallbackRejection::Refused(error) | CallbackRejection::Answered { error, .. } => {
                Some(error)
            }
        }
    }
}

impl IntoResponse for CallbackRejection {
    fn into_response(self) -> Response {
        match self {
            CallbackRejection::Body(r) => r.into_response(),
            CallbackRejection::Refused(e) => e.into_response(),
            CallbackRejection::Answered { answer, .. } => answer,
        }
    }
}

impl<S, V> FromRequest<S> for SignedCallback<V>
where
    S: Send + Sync,
    V: SignatureScheme + FromRef<S>,
{
    type Rejection = CallbackRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, CallbackRejection> {
        let scheme = V::from_ref(state);
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state)
            .await
            .map_err(CallbackRejection::Body)?;
        match scheme.verify(&headers, &body, unix_now()) {
            Ok(v) => Ok(SignedCallback {
                body,
                timestamp: v.timestamp,
                serial: v.serial,
                payload: v.payload,
                scheme,
            }),
            Err(error) => Err(match scheme.refused(&error) {
                None => CallbackRejection::Refused(error),
                Some(answer) => CallbackRejection::Answered { error, answer },
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::MAX_SERIAL_LEN;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(HeaderName, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(n.clone(), HeaderValue::try_from(v.as_str()).unwrap());
        }
        h
    }

    #[test]
    fn rfc4231_case_2() {
        // HMAC-SHA256("Jefe", "what do ya want for nothing?").
        let v = CallbackVerifier::new(b"Jefe".to_vec()).without_timestamp();
        assert_eq!(
            v.sign(0, b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn signed_timestamped_and_refused() {
        let v = CallbackVerifier::new(b"s3cret".to_vec());
        let body = br#"{"id":"ev_1"}"#;
        let ok = headers(&v.signed_headers(body));
        let ts = v.verify(&ok, body).unwrap().unwrap();
        // Another body, another secret: 401.
        assert_eq!(v.verify(&ok, b"{}"), Err(CallbackError::BadSignature));
        let other = CallbackVerifier::new(b"guess".to_vec());
        assert_eq!(other.verify(&ok, body), Err(CallbackError::BadSignature));
        // Old and future callbacks: 401, once the signature holds.
        let stale = v.verify_at(&ok, body, ts + 301).unwrap_err();
        assert_eq!(stale, CallbackError::StaleTimestamp { age_secs: 301 });
        assert_eq!(stale.status(), StatusCode::UNAUTHORIZED);
        assert!(v.verify_at(&ok, body, ts - 301).is_err());
        assert!(v.verify_at(&ok, body, ts + 300).is_ok());
        // A refreshed timestamp breaks the signature.
        let mut moved = ok.clone();
        moved.insert("x-timestamp", HeaderValue::from(ts + 1));
        assert_eq!(v.verify(&moved, body), Err(CallbackError::BadSignature));
        // Syntax: 400.
        let mut h = ok.clone();
        h.insert("x-signature", HeaderValue::from_static("zz"));
        assert_eq!(v.verify(&h, body), Err(CallbackError::MalformedSignature));
        h.remove("x-signature");
        assert_eq!(v.verify(&h, body), Err(CallbackError::MissingSignature));
        let mut h = ok.clone();
        h.insert("x-timestamp", HeaderValue::from_static("-5"));
        assert_eq!(v.verify(&h, body), Err(CallbackError::MalformedTimestamp));
        assert_eq!(
            CallbackError::MalformedTimestamp.status(),
            StatusCode::BAD_REQUEST
        );
    }

    /// A byte of the signature written with a sign (`+f` for `0f`, which
    /// `u8::from_str_radix` reads alike) is malformed: the one signature
    /// a body has is accepted in one spelling only, lower or upper case.
    /// (payments_fuzz's tampered signatures drew it.)
    #[test]
    fn a_signature_byte_with_a_sign_is_malformed() {
        let v = CallbackVerifier::new(b"s3cret".to_vec()).without_timestamp();
        // A body whose signature has a byte below 0x10 (a `0` to replace).
        let (body, good, at) = (0u32..)
            .find_map(|n| {
                let body = format!(r#"{{"n":{n}}}"#).into_bytes();
                let good = v.sign(0, &body);
                let at = (0..good.len()).step_by(2).find(|&i| &good[i..=i] == "0")?;
                Some((body, good, at))
            })
            .expect("some body");
        let header = |sig: &str| headers(&[(HeaderName::from_static("x-signature"), sig.into())]);
        assert_eq!(v.verify(&header(&good), &body), Ok(None));
        assert_eq!(v.verify(&header(&good.to_uppercase()), &body), Ok(None));
        for sign in ["+", "-"] {
            let tampered = format!("{}{sign}{}", &good[..at], &good[at + 1..]);
            assert_eq!(
                v.verify(&header(&tampered), &body),
                Err(CallbackError::MalformedSignature),
                "{tampered}"
            );
        }
    }

    #[test]
    fn serials() {
        fn evt(s: &str) -> Result<(), String> {
            s.starts_with("ev_")
                .then_some(())
                .ok_or_else(|| "not an event id".into())
        }
        let v = CallbackVerifier::new(b"k".to_vec()).serial(SerialFrom::JsonField("id"), evt);
        let h = HeaderMap::new();
        assert_eq!(
            v.serial_of(&h, br#"{"id":"ev_1"}"#).unwrap().as_deref(),
            Some("ev_1")
        );
        for bad in [
            r#"{"id":"x"}"#,
            r#"{"id":""}"#,
            r#"{"id":true}"#,
            r#"{}"#,
            "nope",
        ] {
            assert!(v.serial_of(&h, bad.as_bytes()).is_err(), "{bad}");
        }
        let long = format!(r#"{{"id":"ev_{}"}}"#, "9".repeat(200));
        assert!(v.serial_of(&h, long.as_bytes()).is_err());
        let v = CallbackVerifier::new(b"k".to_vec()).serial(
            SerialFrom::UnsignedHeader(HeaderName::from_static("x-event-id")),
            |_| Ok(()),
        );
        let mut h = HeaderMap::new();
        h.insert("x-event-id", HeaderValue::from_static("42"));
        assert_eq!(v.serial_of(&h, b"").unwrap().as_deref(), Some("42"));
        h.insert("x-event-id", HeaderValue::from_static("a b"));
        assert!(v.serial_of(&h, b"").is_err());
    }

    #[test]
    fn a_body_digest_ignores_unsigned_headers() {
        let v = CallbackVerifier::new(b"k".to_vec()).serial(SerialFrom::BodyDigest, |_| Ok(()));
        let body = br#"{"order":7}"#;
        let mut h = HeaderMap::new();
        let first = v.serial_of(&h, body).unwrap().unwrap();
        h.insert("x-event-id", HeaderValue::from_static("other"));
        assert_eq!(v.serial_of(&h, body).unwrap().unwrap(), first);
        // SHA-256("abc"), FIPS 180-2.
        assert_eq!(
            v.serial_of(&h, b"abc").unwrap().as_deref(),
            Some("sha256-ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert!(first.len() <= MAX_SERIAL_LEN);
        assert_ne!(v.serial_of(&h, br#"{"order":8}"#).unwrap().unwrap(), first);
    }
}
