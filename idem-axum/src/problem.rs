//! Error answers as problem details (RFC 9457, `application/problem+json`),
//! the form the draft's examples use, with a `Link` to the documentation
//! of the service's idempotency policy when it publishes one.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// An error answer: status, a short title, what happened.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// A short summary, the same for every occurrence.
    pub title: &'static str,
    /// What happened this time.
    pub detail: String,
    /// The documentation of the policy (the problem's `type` and a
    /// `Link: <…>; rel="describedby"`).
    pub policy: Option<Arc<str>>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem without a policy link.
    pub fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            status,
            title,
            detail: detail.into(),
            policy: None,
            retry_after: None,
        }
    }

    pub(crate) fn with_policy(mut self, policy: &Option<Arc<str>>) -> Self {
        self.policy = policy.clone();
        self
    }

    pub(crate) fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "type": self.policy.as_deref().unwrap_or("about:blank"),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut resp = (self.status, body.to_string()).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(link) = self
            .policy
            .as_deref()
            .and_then(|p| HeaderValue::try_from(format!("<{p}>; rel=\"describedby\"")).ok())
        {
            headers.insert(header::LINK, link);
        }
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
