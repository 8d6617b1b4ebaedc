//! The request of an `Idempotency-Key` route ([`IdempotentRequest`]): its
//! head, its body read whole, its key, and the fingerprint that tells two
//! requests with one key apart.

use super::key::{IdempotencyKey, KeyError};
use super::problem::Problem;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// A request of an `Idempotency-Key` route: its head, its body (read
/// whole, under axum's `DefaultBodyLimit`) and its key. An extractor; the
/// handler hands it to [`Idempotency::begin`](crate::Idempotency::begin).
#[derive(Debug)]
pub struct IdempotentRequest {
    pub(super) parts: Parts,
    body: Bytes,
    pub(super) key: Result<Option<IdempotencyKey>, KeyError>,
}

impl<S: Send + Sync> FromRequest<S> for IdempotentRequest {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (parts, body) = req.into_parts();
        let head = head_of(&parts);
        let body = Bytes::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(IdempotentRequest::new(head, body))
    }
}

/// A copy of a request's head (`Parts` is not `Clone`).
pub(super) fn head_of(parts: &Parts) -> Parts {
    let mut head = Request::new(()).into_parts().0;
    head.method = parts.method.clone();
    head.uri = parts.uri.clone();
    head.version = parts.version;
    head.headers = parts.headers.clone();
    head.extensions = parts.extensions.clone();
    head
}

#[derive(Serialize)]
struct Fingerprint<'a> {
    method: &'a str,
    target: &'a str,
    body_sha256: String,
}

impl IdempotentRequest {
    /// The request of `parts` and its whole `body`.
    pub(super) fn new(parts: Parts, body: Bytes) -> Self {
        let key = IdempotencyKey::from_headers(&parts.headers);
        IdempotentRequest { parts, body, key }
    }

    /// The request's head.
    pub fn parts(&self) -> &Parts {
        &self.parts
    }

    /// The raw body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The key, when the header is present and well formed.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref().ok().and_then(Option::as_ref)
    }

    /// The body as JSON; a 400 problem when it is not `T`.
    #[allow(clippy::result_large_err)]
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Response> {
        serde_json::from_slice(&self.body).map_err(|e| {
            Problem::new(StatusCode::BAD_REQUEST, "Invalid body", e.to_string()).into_response()
        })
    }

    /// What makes two requests with one key the same request: method,
    /// target (path and query) and the body's bytes, through
    /// [`fingerprint`](idem_core::fingerprint).
    pub fn fingerprint(&self) -> String {
        let target = self.parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let fp = Fingerprint {
            method: self.parts.method.as_str(),
            target,
            body_sha256: hex::encode(Sha256::digest(&self.body)),
        };
        idem_core::fingerprint(&fp).expect("strings serialize")
    }
}
