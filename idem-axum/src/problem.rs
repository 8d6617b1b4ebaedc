//! Error answers as problem details (RFC 9457, `application/problem+json`),
//! the form the draft's examples use, with a `Link` to the documentation
//! of the service's idempotency policy when it publishes one.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_core::Error;
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

/// A handler's error as its answer, so that `?` works in a handler that
/// returns `Result<_, Problem>` (a raw query on the request's transaction,
/// an `#[idempotent]` call, an `enqueue`):
///
/// - a failure a retry can heal ([`Error::is_retryable`]: a lost
///   connection, an unknown commit outcome, a deadlock, a lost
///   transaction) is `503` with `Retry-After: 1` (a retry with the same
///   key is safe);
/// - the entity in another state ([`Error::IllegalState`]) or a key or
///   message id reused with another payload is `409`;
/// - an invalid key or message, derived from the request, is `422`;
/// - anything else is `500`.
///
/// The answer says what kind of failure it was, never the database's or
/// the handler's own message (which may hold a table name or a customer's
/// data): that is logged, with its causes, at `warn`.
impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        tracing::warn!(error = %format_args!("{e:#}"), kind = e.kind().as_str(), "idempotent request failed");
        let (status, title, detail) = match &e {
            _ if e.is_retryable() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again",
                "a temporary failure; a retry with the same key is safe",
            ),
            Error::IllegalState { .. } => (
                StatusCode::CONFLICT,
                "Conflict",
                "the resource is not in a state this request applies to",
            ),
            Error::KeyConflict { .. } | Error::MessageConflict { .. } => (
                StatusCode::CONFLICT,
                "Conflict",
                "this key was already used with another payload",
            ),
            Error::InvalidKey { .. } | Error::InvalidMessage { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid request",
                "the request does not make a valid key or message",
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "the request could not be completed",
            ),
        };
        let problem = Problem::new(status, title, format!("{detail} ({})", e.kind()));
        match status {
            StatusCode::SERVICE_UNAVAILABLE => problem.retry_after(1),
            _ => problem,
        }
    }
}

/// A query's error as an answer, as idem's [`Error`] would be (see
/// `From<Error>`): `503` when transient.
impl From<sqlx::Error> for Problem {
    fn from(e: sqlx::Error) -> Self {
        Problem::from(Error::from(e))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status(e: Error) -> (StatusCode, Option<u64>, String) {
        let p = Problem::from(e);
        (p.status, p.retry_after, p.detail)
    }

    #[test]
    fn an_error_answers_by_its_kind_without_its_message() {
        let io = || sqlx::Error::Io(std::io::Error::other("secret table idem_x"));
        let (s, retry, detail) = status(Error::CommitUnknown(io()));
        assert_eq!((s, retry), (StatusCode::SERVICE_UNAVAILABLE, Some(1)));
        assert!(!detail.contains("secret"), "{detail}");
        let (s, retry, _) = status(Error::from(io()));
        assert_eq!((s, retry), (StatusCode::SERVICE_UNAVAILABLE, Some(1)));
        let illegal = Error::IllegalState {
            table: "orders",
            id: "7".into(),
            found: Some("PAID".into()),
            expected: "UNPAID",
        };
        assert_eq!(status(illegal).0, StatusCode::CONFLICT);
        let conflict = Error::KeyConflict { key: "k".into() };
        assert_eq!(status(conflict).0, StatusCode::CONFLICT);
        let invalid = Error::InvalidKey {
            key: "k".into(),
            reason: "too long".into(),
        };
        assert_eq!(status(invalid).0, StatusCode::UNPROCESSABLE_ENTITY);
        let (s, retry, detail) = status(Error::permanent("customer 42's card"));
        assert_eq!((s, retry), (StatusCode::INTERNAL_SERVER_ERROR, None));
        assert!(!detail.contains("42"), "{detail}");
        assert!(detail.ends_with("(handler)"), "{detail}");
    }
}
