//! The idempotency policy of a route ([`Idempotency`]): its settings and
//! the problem answers it gives. How a request claims its key under it is
//! the request call's ([`Idempotency::begin`], in `call.rs`).

use super::problem::Problem;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use idem_core::Error;
use idem_core::MAX_TTL_SECS;
use std::sync::Arc;
use std::time::Duration;

type IdentityFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// The idempotency policy of one route (or a group of routes sharing a
/// key space): its scope, whose keys they are, how long an answer is kept
/// and how long a request in flight holds its key.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | scope | — | the record's `biz_type`: 1 to 64 bytes of `[A-Za-z0-9_.-]`; keys of two scopes never meet |
/// | identity | — | the caller a key belongs to, from the request's head (an API key, an account id); `None` answers 401 |
/// | [`ttl`](Self::ttl) | 24 h | how long after the answer the key is remembered; after that the same key is a new request |
/// | [`lease`](Self::lease) | 60 s | how long a request that died in flight (its process crashed) blocks its key with 409; on PostgreSQL nothing of it stays |
/// | [`optional`](Self::optional) | required | a request without the header is 400, or, optional, runs without a record |
/// | [`policy`](Self::policy) | none | the URL documenting this policy: problem `type` and `Link: <…>; rel="describedby"` |
/// | [`max_answer`](Self::max_answer) | 1 MiB | the largest answer body kept for replays |
#[derive(Clone)]
pub struct Idempotency {
    pub(super) scope: &'static str,
    pub(super) identity: Arc<IdentityFn>,
    pub(super) required: bool,
    pub(super) ttl: Duration,
    lease: Duration,
    policy: Option<Arc<str>>,
    pub(super) max_answer: usize,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("scope", &self.scope)
            .field("required", &self.required)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("policy", &self.policy)
            .field("max_answer", &self.max_answer)
            .finish_non_exhaustive()
    }
}

impl Idempotency {
    /// The policy of the routes whose keys live in `scope`, the keys of
    /// each caller apart (`identity` reads it from the request's head).
    ///
    /// # Panics
    /// When `scope` is not 1 to 64 bytes of `[A-Za-z0-9_.-]` (a
    /// programming error, like an invalid route path).
    pub fn new(
        scope: &'static str,
        identity: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        assert!(
            (1..=64).contains(&scope.len())
                && scope
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)),
            "idempotency scope `{scope}` must be 1 to 64 bytes of [A-Za-z0-9_.-]"
        );
        Idempotency {
            scope,
            identity: Arc::new(identity),
            required: true,
            ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(60),
            policy: None,
            max_answer: 1 << 20,
        }
    }

    /// How long an answer is replayed after it was given.
    ///
    /// # Panics
    /// Outside 1 s ..= 3650 days.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        assert!(
            (1..=MAX_TTL_SECS as u64).contains(&ttl.as_secs()),
            "idempotency ttl must be between 1 s and 3650 days"
        );
        self.ttl = ttl;
        self
    }

    /// How long a request in flight holds its key before another request
    /// with that key may take it over (a crash mid-request must not block
    /// the key forever). While the handler's transaction is open the key
    /// stays held whatever its age: that transaction locks the record. On
    /// PostgreSQL, which claims the key in the handler's transaction, a
    /// request that died leaves no row to take over; the lease only bounds
    /// rows that a process claiming before its transaction left.
    ///
    /// # Panics
    /// Outside 1 s ..= 1 day.
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(
            (1..=86_400).contains(&lease.as_secs()),
            "idempotency lease must be between 1 s and 1 day"
        );
        self.lease = lease;
        self
    }

    /// A request without the header runs without a record (no replay,
    /// no conflict detection) instead of being refused with 400.
    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }

    /// The URL of the document that publishes this policy (the draft asks
    /// servers to publish their expiry): linked from every problem answer.
    pub fn policy(mut self, url: impl Into<String>) -> Self {
        self.policy = Some(url.into().into());
        self
    }

    /// The largest answer body kept for replays (a larger one is answered
    /// 500 and its effects rolled back).
    pub fn max_answer(mut self, bytes: usize) -> Self {
        self.max_answer = bytes;
        self
    }

    /// The scope (the records' `biz_type`).
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    pub(super) fn problem(
        &self,
        status: StatusCode,
        title: &'static str,
        detail: String,
    ) -> Response {
        Problem::new(status, title, detail)
            .with_policy(&self.policy)
            .into_response()
    }

    /// A database failure: 503 with `Retry-After` when a retry can heal
    /// it (a retry with the same key is always safe), 500 otherwise.
    pub(super) fn unavailable(&self, e: &sqlx::Error) -> Response {
        tracing::warn!(scope = self.scope, error = %format_args!("{e:#}"), "idempotent request: database failure");
        if idem_core::is_transient(e) || idem_core::requests::commit_outcome_unknown(e) {
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again",
                "the database is unavailable; a retry with the same key is safe",
            )
            .with_policy(&self.policy)
            .retry_after(1)
            .into_response()
        } else {
            self.problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "the request could not be recorded".into(),
            )
        }
    }

    /// A failure of the request's transaction ([`CallerTx`](idem_core::CallerTx)'s errors):
    /// 503 for a lost commit acknowledgement and transient database
    /// errors, 500 otherwise (a transaction lost by a call inside it
    /// included: the handler went on after that call's error).
    pub(super) fn failed(&self, e: &Error) -> Response {
        match e {
            Error::Database(e) | Error::CommitUnknown(e) => self.unavailable(e),
            other => {
                tracing::warn!(scope = self.scope, error = %format_args!("{other:#}"),
                    "idempotent request: the answer could not be committed");
                self.problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Internal error",
                    "the request's transaction could not be committed; \
                     nothing was kept, a retry with the same key runs again"
                        .into(),
                )
            }
        }
    }

    pub(super) fn lease_secs(&self) -> i64 {
        self.lease.as_secs() as i64
    }

    pub(super) fn in_flight(&self) -> Response {
        self.problem(
            StatusCode::CONFLICT,
            "A request with this Idempotency-Key is in progress",
            "the first request with this key has not finished; retry later".into(),
        )
    }
}
