//! `Idempotency-Key` requests: the policy of a route ([`Idempotency`]),
//! the request it reads ([`IdempotentRequest`]) and the call that runs the
//! handler's effects and stores its answer in one transaction
//! ([`RequestCall`]).

use super::key::{IdempotencyKey, KeyError, hex, record_key};
use super::problem::Problem;
use super::stored::{Held, Stored, lease_text};
use crate::backend::{Backend, NewRecord};
use crate::call::CallerTx;
use crate::error::Error;
use crate::strategy::MAX_TTL_SECS;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use sqlx::Pool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// | [`lease`](Self::lease) | 60 s | how long a request that died in flight (its process crashed) blocks its key with 409 |
/// | [`optional`](Self::optional) | required | a request without the header is 400, or, optional, runs without a record |
/// | [`policy`](Self::policy) | none | the URL documenting this policy: problem `type` and `Link: <…>; rel="describedby"` |
/// | [`max_answer`](Self::max_answer) | 1 MiB | the largest answer body kept for replays |
#[derive(Clone)]
pub struct Idempotency {
    scope: &'static str,
    identity: Arc<IdentityFn>,
    required: bool,
    ttl: Duration,
    lease: Duration,
    policy: Option<Arc<str>>,
    max_answer: usize,
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
    /// stays held whatever its age: that transaction locks the record.
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
    fn unavailable(&self, e: &sqlx::Error) -> Response {
        tracing::warn!(scope = self.scope, error = %e, "idempotent request: database failure");
        if crate::is_transient(e) || crate::error::commit_outcome_unknown(e) {
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

    /// A failure of the request's transaction ([`CallerTx`]'s errors):
    /// 503 for a lost commit acknowledgement and transient database
    /// errors, 500 otherwise (a transaction lost by a call inside it
    /// included: the handler went on after that call's error).
    fn failed(&self, e: &Error) -> Response {
        match e {
            Error::Database(e) | Error::CommitUnknown(e) => self.unavailable(e),
            other => {
                tracing::warn!(scope = self.scope, error = %other,
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

    /// Everything before the handler's effects:
    ///
    /// 1. the key (malformed, repeated: 400; missing: 400 unless
    ///    [`optional`](Self::optional)) and the caller (none: 401);
    /// 2. the record of `(caller, key)` in this scope, read without
    ///    waiting on locks: answered → the stored answer, replayed byte
    ///    for byte (`Idempotent-Replayed: true`); another method, path or
    ///    body → 422; in flight → 409; in flight past its lease → taken
    ///    over; none → an in-flight row written and committed now, so that
    ///    a concurrent duplicate sees it (409), never a second effect;
    /// 3. the handler's transaction, begun with the record locked and
    ///    fenced by this request's lease.
    ///
    /// `Err` is the answer to send as it is.
    pub async fn begin<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        req: &IdempotentRequest,
    ) -> Result<RequestCall<DB>, Response> {
        let key = match &req.key {
            Ok(Some(key)) => key,
            Ok(None) if self.required => {
                return Err(self.problem(
                    StatusCode::BAD_REQUEST,
                    "Idempotency-Key is missing",
                    KeyError::Missing.to_string(),
                ));
            }
            Ok(None) => {
                let tx = DB::begin(pool).await.map_err(|e| self.unavailable(&e))?;
                return Ok(RequestCall::new(pool, tx, None, self.clone()));
            }
            Err(e) => {
                return Err(self.problem(
                    StatusCode::BAD_REQUEST,
                    "Idempotency-Key is malformed",
                    e.to_string(),
                ));
            }
        };
        let Some(identity) = (self.identity)(&req.parts) else {
            return Err(self.problem(
                StatusCode::UNAUTHORIZED,
                "Unknown caller",
                "an Idempotency-Key belongs to a caller; this request names none".into(),
            ));
        };
        let held = HeldKey {
            key: record_key(&identity, key),
            lease: new_lease(),
        };
        let fp = req.fingerprint();
        self.claim(pool, &held, key, &fp).await?;
        // From here the key is this request's: a failure, or the request
        // cancelled, frees it (the call's drop).
        let mut call = RequestCall {
            pool: pool.clone(),
            tx: None,
            held: Some(held),
            policy: self.clone(),
        };
        let held = call.held.as_ref().expect("just set");
        let mut tx = DB::begin(pool).await.map_err(|e| self.unavailable(&e))?;
        let lease = lease_text(&held.lease);
        match DB::request_fence(&mut tx, &held.key, self.scope, &lease, self.lease_secs()).await {
            Ok(true) => {
                call.tx = Some(CallerTx::new(tx));
                Ok(call)
            }
            // Taken over after this request's lease ran out (it stalled
            // between the claim and here): the key is no longer ours.
            Ok(false) => {
                call.held = None;
                Err(self.in_flight())
            }
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    fn lease_secs(&self) -> i64 {
        self.lease.as_secs() as i64
    }

    fn in_flight(&self) -> Response {
        self.problem(
            StatusCode::CONFLICT,
            "A request with this Idempotency-Key is in progress",
            "the first request with this key has not finished; retry later".into(),
        )
    }

    /// Step 2 of [`begin`](Self::begin): `Ok` when this request holds the
    /// key (its in-flight row committed).
    async fn claim<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        held: &HeldKey,
        key: &IdempotencyKey,
        fp: &str,
    ) -> Result<(), Response> {
        let lease = lease_text(&held.lease);
        // Two rounds: a concurrent insert or take-over can win the first.
        for _ in 0..3 {
            let found = DB::request_find(pool, &held.key, self.scope)
                .await
                .map_err(|e| self.unavailable(&e))?;
            let Some((stored_fp, result, expired)) = found else {
                let row = NewRecord {
                    key: &held.key,
                    biz_type: self.scope,
                    biz_no: key.as_str(),
                    fingerprint: fp,
                    ttl_secs: self.lease_secs(),
                };
                if DB::request_insert(pool, &row, &lease)
                    .await
                    .map_err(|e| self.unavailable(&e))?
                {
                    return Ok(());
                }
                continue;
            };
            if stored_fp != fp {
                return Err(self.problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Idempotency-Key is already used",
                    "this key was used with another request (method, path or body); \
                     use a new key for a new request"
                        .into(),
                ));
            }
            match Held::of(result.as_deref()) {
                Held::Answer(stored) => {
                    return Err(stored.replay().unwrap_or_else(|| {
                        self.problem(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "Internal error",
                            "the stored answer of this key cannot be read".into(),
                        )
                    }));
                }
                Held::Lease(_) if !expired => return Err(self.in_flight()),
                Held::Lease(old) => {
                    // The request that held it died (or stalls past its
                    // lease before its transaction began): take it over.
                    // A row its handler's transaction still holds (alive,
                    // slower than its lease) is not waited for: false, and
                    // after the rounds 409 (on SQLite the take-over waits
                    // for the write lock, as every writer does).
                    if DB::request_take_over(
                        pool,
                        &held.key,
                        self.scope,
                        &lease_text(&old),
                        &lease,
                        self.lease_secs(),
                    )
                    .await
                    .map_err(|e| self.unavailable(&e))?
                    {
                        return Ok(());
                    }
                }
                Held::Foreign => {
                    return Err(self.problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Internal error",
                        format!(
                            "scope `{}` holds records that are not HTTP answers",
                            self.scope
                        ),
                    ));
                }
            }
        }
        Err(self.in_flight())
    }

    async fn release<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        held: &HeldKey,
    ) -> Result<bool, sqlx::Error> {
        DB::request_release(pool, &held.key, self.scope, &lease_text(&held.lease)).await
    }
}

/// A lease token unique to this process and moment.
fn new_lease() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}.{nanos}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The key a request holds: the record's key and this request's lease.
#[derive(Debug)]
struct HeldKey {
    key: String,
    lease: String,
}

/// A request of an `Idempotency-Key` route: its head, its body (read
/// whole, under axum's `DefaultBodyLimit`) and its key. An extractor; the
/// handler hands it to [`Idempotency::begin`].
#[derive(Debug)]
pub struct IdempotentRequest {
    parts: Parts,
    body: Bytes,
    key: Result<Option<IdempotencyKey>, KeyError>,
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
    /// [`fingerprint`](crate::fingerprint).
    pub fn fingerprint(&self) -> String {
        let target = self.parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let fp = Fingerprint {
            method: self.parts.method.as_str(),
            target,
            body_sha256: hex(&Sha256::digest(&self.body)),
        };
        crate::fingerprint(&fp).expect("strings serialize")
    }
}

/// A request that holds its key: the handler's transaction is open, the
/// record locked. Run the effects in [`tx`](Self::tx), then
/// [`finish`](Self::finish) with the answer (stored and committed with
/// them) or [`abandon`](Self::abandon) (rolled back, the key freed for a
/// retry). Dropped unfinished, it rolls back and frees the key.
///
/// The transaction is a [`CallerTx`]: an
/// [`#[idempotent]`](macro@crate::idempotent) handler runs inside it
/// (`handler(call.tx(), &args)`, under a savepoint), the request's own
/// statements on `call.tx().conn()?`, an outbox message with
/// [`enqueue`](crate::outbox::enqueue)`(call.tx().transaction()?, …)`;
/// all of them commit with the stored answer, or not at all.
#[derive(Debug)]
pub struct RequestCall<DB: Backend> {
    pool: Pool<DB>,
    tx: Option<CallerTx<DB>>,
    held: Option<HeldKey>,
    policy: Idempotency,
}

impl<DB: Backend> RequestCall<DB> {
    fn new(
        pool: &Pool<DB>,
        tx: sqlx::Transaction<'static, DB>,
        held: Option<HeldKey>,
        policy: Idempotency,
    ) -> Self {
        RequestCall {
            pool: pool.clone(),
            tx: Some(CallerTx::new(tx)),
            held,
            policy,
        }
    }

    /// The transaction the effects run in: pass it to `#[idempotent]`
    /// handlers, or take its connection ([`CallerTx::conn`]) or the
    /// transaction itself ([`CallerTx::transaction`]); do not commit it,
    /// [`finish`](Self::finish) does.
    pub fn tx(&mut self) -> &mut CallerTx<DB> {
        self.tx.as_mut().expect("present until finished")
    }

    /// Whether the request came with a key (an [`optional`](Idempotency::optional)
    /// route runs keyless requests without a record).
    pub fn is_keyed(&self) -> bool {
        self.held.is_some()
    }

    /// The transaction, lent to a handler behind the layer.
    pub(super) fn take_tx(&mut self) -> Option<CallerTx<DB>> {
        self.tx.take()
    }

    /// The transaction, back from the handler.
    pub(super) fn put_tx(&mut self, tx: CallerTx<DB>) {
        self.tx = Some(tx);
    }

    /// The route's policy.
    pub(super) fn policy(&self) -> &Idempotency {
        &self.policy
    }

    /// Stores `answer` with the key and commits it with the effects; the
    /// answer is then sent, and replayed byte for byte to every retry with
    /// the key until the policy's ttl. Any status can be kept (a 201, a
    /// 402 that a retry must not turn into a payment); what must not be
    /// kept goes through [`abandon`](Self::abandon).
    ///
    /// A failure answers 503 with `Retry-After` (a transient database
    /// error, or a lost commit acknowledgement: committed or not, a retry
    /// with the key is safe) or 500 (the answer cannot be kept, the
    /// transaction was lost by a call inside it
    /// ([`Error::TransactionLost`]), another database error). When nothing
    /// committed the key is freed; when the commit's outcome is unknown the
    /// record settles it: the stored answer, or the lease running out.
    pub async fn finish(mut self, answer: impl IntoResponse) -> Response {
        let mut tx = self.tx.take().expect("present until finished");
        let held = self.held.take();
        let policy = self.policy.clone();
        let (stored, now) = match Stored::capture(answer.into_response(), policy.max_answer).await {
            Ok(pair) => pair,
            Err(why) => {
                drop(tx);
                free(&self.pool, &self.policy, held).await;
                return policy.problem(StatusCode::INTERNAL_SERVER_ERROR, "Internal error", why);
            }
        };
        if let Some(h) = &held {
            let text = serde_json::to_string(&stored).expect("an answer serializes");
            let ttl = policy.ttl.as_secs() as i64;
            let done = match tx.transaction() {
                Ok(t) => {
                    DB::request_complete(t, &h.key, policy.scope, &lease_text(&h.lease), &text, ttl)
                        .await
                        .map_err(Error::database)
                }
                Err(e) => Err(e),
            };
            match done {
                Ok(true) => {}
                Ok(false) => return policy.in_flight(),
                Err(e) => {
                    drop(tx);
                    free(&self.pool, &self.policy, held).await;
                    return policy.failed(&e);
                }
            }
        }
        match tx.commit().await {
            Ok(()) => now,
            // Committed or not: the record settles it.
            Err(e @ Error::CommitUnknown(_)) => policy.failed(&e),
            // Nothing committed: the key is free for a retry.
            Err(e) => {
                free(&self.pool, &self.policy, held).await;
                policy.failed(&e)
            }
        }
    }

    /// Rolls the effects back, frees the key (a retry with it runs again)
    /// and sends `answer` without keeping it: for failures a retry may
    /// heal, or requests refused before any effect.
    pub async fn abandon(mut self, answer: impl IntoResponse) -> Response {
        if let Some(tx) = self.tx.take() {
            let _ = tx.rollback().await;
        }
        let held = self.held.take();
        free(&self.pool, &self.policy, held).await;
        answer.into_response()
    }
}

/// Frees a key held by a request that committed nothing. (A function of
/// its parts, not of the call: the call's future then needs no `Sync`.)
async fn free<DB: Backend>(pool: &Pool<DB>, policy: &Idempotency, held: Option<HeldKey>) {
    if let Some(h) = held
        && let Err(e) = policy.release(pool, &h).await
    {
        tracing::warn!(scope = policy.scope, error = %e,
            "idempotent request: the key stays held until its lease runs out");
    }
}

impl<DB: Backend> Drop for RequestCall<DB> {
    fn drop(&mut self) {
        // Cancelled (the client hung up and the server dropped the
        // handler): the transaction rolls back as it drops; free the key
        // in the background, or its lease frees it.
        drop(self.tx.take());
        if let Some(held) = self.held.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (pool, policy) = (self.pool.clone(), self.policy.clone());
            rt.spawn(async move {
                let _ = policy.release(&pool, &held).await;
            });
        }
    }
}
