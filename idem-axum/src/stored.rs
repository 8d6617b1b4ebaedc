//! The answer kept with a key: status, headers and body, byte for byte.

use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::{Deserialize, Serialize};

/// Set (`true`) on an answer replayed from the store.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Text when it is UTF-8, hex otherwise: readable in the table, exact in
/// the replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Octets {
    Text(String),
    Hex(String),
}

impl Octets {
    fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(s) => Octets::Text(s.to_owned()),
            Err(_) => Octets::Hex(hex::encode(bytes)),
        }
    }

    fn bytes(&self) -> Option<Vec<u8>> {
        match self {
            Octets::Text(s) => Some(s.as_bytes().to_vec()),
            // Two digits a byte, either case; a sign (`+f`) is refused.
            Octets::Hex(h) => hex::decode(h).ok(),
        }
    }
}

/// The stored form of an answer (the `result` column, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Stored {
    status: u16,
    headers: Vec<(String, Octets)>,
    body: Octets,
}

/// Headers that describe one connection or one transfer, not the answer:
/// never stored (axum sets `content-length` again from the body).
fn per_transfer(name: &HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
        header::DATE,
        header::UPGRADE,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == IDEMPOTENT_REPLAYED
}

impl Stored {
    /// Reads `resp`'s body (at most `limit` bytes): the stored form, and
    /// the same answer rebuilt to be sent now.
    pub(super) async fn capture(resp: Response, limit: usize) -> Result<(Self, Response), String> {
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
            format!("the answer's body could not be kept (limit {limit} bytes): {e}")
        })?;
        let stored = Stored {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .filter(|(n, _)| !per_transfer(n))
                .map(|(n, v)| (n.as_str().to_owned(), Octets::of(v.as_bytes())))
                .collect(),
            body: Octets::of(&bytes),
        };
        Ok((stored, Response::from_parts(parts, Body::from(bytes))))
    }

    /// The stored answer, as first sent, marked `Idempotent-Replayed: true`.
    pub(super) fn replay(&self) -> Option<Response> {
        let mut resp = Response::new(Body::from(Bytes::from(self.body.bytes()?)));
        *resp.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = resp.headers_mut();
        for (name, value) in &self.headers {
            let name = HeaderName::try_from(name.as_str()).ok()?;
            let value = HeaderValue::from_bytes(&value.bytes()?).ok()?;
            headers.append(name, value);
        }
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Some(resp)
    }
}

/// What a record's `result` column holds for a request.
#[derive(Debug)]
pub(super) enum Held {
    /// In flight: the lease of the request running it.
    Lease(String),
    /// Answered.
    Answer(Box<Stored>),
    /// Anything else (a row of another strategy under the same scope).
    Foreign,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseText {
    lease: String,
}

/// The `result` text of an in-flight row.
pub(super) fn lease_text(lease: &str) -> String {
    serde_json::to_string(&LeaseText {
        lease: lease.to_owned(),
    })
    .expect("a string serializes")
}

impl Held {
    pub(super) fn of(result: Option<&str>) -> Self {
        let Some(text) = result else {
            return Held::Foreign;
        };
        if let Ok(l) = serde_json::from_str::<LeaseText>(text) {
            return Held::Lease(l.lease);
        }
        match serde_json::from_str::<Stored>(text) {
            Ok(s) => Held::Answer(Box::new(s)),
            Err(_) => Held::Foreign,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    #[tokio::test]
    async fn round_trip_byte_for_byte() {
        let body: Vec<u8> = vec![0, 159, 146, 150, b'x'];
        let mut resp = (StatusCode::CREATED, body.clone()).into_response();
        resp.headers_mut()
            .append("x-a", HeaderValue::from_static("1"));
        resp.headers_mut()
            .append("x-a", HeaderValue::from_static("2"));
        resp.headers_mut()
            .append("x-bin", HeaderValue::from_bytes(&[0xff, b'a']).unwrap());
        let (stored, now) = Stored::capture(resp, 1024).await.unwrap();
        assert_eq!(now.status(), StatusCode::CREATED);
        let text = serde_json::to_string(&stored).unwrap();
        let back: Stored = serde_json::from_str(&text).unwrap();
        assert!(matches!(Held::of(Some(&text)), Held::Answer(_)));
        let replayed = back.replay().unwrap();
        assert_eq!(replayed.status(), StatusCode::CREATED);
        let a: Vec<_> = replayed.headers().get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert_eq!(replayed.headers()["x-bin"].as_bytes(), &[0xff, b'a']);
        assert_eq!(replayed.headers()[IDEMPOTENT_REPLAYED], "true");
        let got = axum::body::to_bytes(replayed.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&got[..], &body[..]);
    }

    #[tokio::test]
    async fn too_large_is_refused() {
        let resp = vec![b'x'; 100].into_response();
        assert!(Stored::capture(resp, 10).await.is_err());
    }

    #[test]
    fn lease_and_foreign() {
        assert!(matches!(Held::of(Some(&lease_text("t1"))), Held::Lease(l) if l == "t1"));
        assert!(matches!(Held::of(None), Held::Foreign));
        assert!(matches!(Held::of(Some("{\"x\":1}")), Held::Foreign));
    }
}
