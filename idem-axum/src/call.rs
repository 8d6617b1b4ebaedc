//! A request's call, from the key claimed to the answer kept:
//! [`Idempotency::begin`] claims the key (the record's in-flight row,
//! committed) and opens the handler's transaction, fenced by the request's
//! lease; [`RequestCall`] runs the effects in it and ends with the answer
//! stored and committed with them, or with the key freed.

use super::key::{KeyError, record_key};
use super::policy::Idempotency;
use super::request::IdempotentRequest;
use super::stored::{Held, Stored, lease_text};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idem_core::Backend;
use idem_core::CallerTx;
use idem_core::Error;
use idem_core::requests::{self, Claim, ClaimedRow, Found, NewRecord};
use sqlx::Pool;
use std::sync::atomic::{AtomicU64, Ordering};

impl Idempotency {
    /// Everything before the handler's effects:
    ///
    /// 1. the key (malformed, repeated: 400; missing: 400 unless
    ///    [`optional`](Self::optional)) and the caller (none: 401);
    /// 2. the record of `(caller, key)` in this scope, read without
    ///    waiting on locks: answered → the stored answer, replayed byte
    ///    for byte (`Idempotent-Replayed: true`); another method, path or
    ///    body → 422; in flight → 409; in flight past its lease → taken
    ///    over; none → this request's in-flight row, so that a concurrent
    ///    duplicate answers 409, never runs a second effect;
    /// 3. the handler's transaction, the record held by this request.
    ///
    /// On PostgreSQL steps 2 and 3 are one: the key is claimed in the
    /// handler's transaction (one statement, no row written, no commit of
    /// its own: the key's transaction lock), its answered row inserted
    /// with the effects; a concurrent duplicate finds the key's
    /// transaction lock held and answers 409 without waiting. Elsewhere
    /// the in-flight row is committed first, and the handler's transaction
    /// begins with it locked and fenced by this request's lease.
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
        let mut held = HeldKey {
            key: record_key(&identity, key),
            biz_no: key.as_str().to_owned(),
            fingerprint: req.fingerprint(),
            lease: new_lease(),
            row: ClaimedRow {
                id: None,
                unwritten: false,
            },
            in_tx: false,
        };
        if requests::claims_in_transaction(pool) {
            let mut tx = DB::begin(pool).await.map_err(|e| self.unavailable(&e))?;
            // An answer sent from here (a replay, 409, 422) drops `tx`: it
            // rolls back, and nothing of this request stays.
            held.row = self.claim(Via::Tx(&mut tx), &held).await?;
            held.in_tx = true;
            return Ok(RequestCall::new(pool, tx, Some(held), self.clone()));
        }
        held.row = self.claim(Via::Pool(pool), &held).await?;
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
        match requests::fence(
            &mut tx,
            held.row,
            &held.key,
            self.scope,
            &lease,
            self.lease_secs(),
        )
        .await
        {
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

    /// Step 2 of [`begin`](Self::begin): `Ok` when this request holds the
    /// key, with the row it holds: its in-flight row committed (`via` the
    /// pool), or the key claimed in the handler's transaction (`via` it,
    /// on PostgreSQL; steps 2 and 3 in one: the row is written answered),
    /// or an expired lease taken over.
    async fn claim<DB: Backend>(
        &self,
        mut via: Via<'_, DB>,
        held: &HeldKey,
    ) -> Result<ClaimedRow, Response> {
        let lease = lease_text(&held.lease);
        let row = self.record(held);
        let fp = held.fingerprint.as_str();
        let unavailable = |e: sqlx::Error| self.unavailable(&e);
        // Three rounds: a concurrent insert or take-over can win the first.
        for _ in 0..3 {
            let claim = match &mut via {
                Via::Pool(pool) => Some(
                    requests::claim(pool, &row, &lease)
                        .await
                        .map_err(unavailable)?,
                ),
                Via::Tx(tx) => requests::claim_in(tx, &row).await.map_err(unavailable)?,
            };
            let found = match claim {
                Some(Claim::Claimed(claimed)) => return Ok(claimed),
                Some(Claim::Found(found)) => found,
                // A concurrent request of the key holds it (in its
                // transaction, not committed yet).
                Some(Claim::Busy) => return Err(self.in_flight()),
                // A request of the key committed in between: the next
                // round finds its row.
                Some(_) => continue,
                None => {
                    return Err(self.problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Internal error",
                        "this database has no claim in the handler's transaction".into(),
                    ));
                }
            };
            let old = self.judge(found, fp)?;
            // The request that held it died (or stalls past its lease
            // before its transaction began): take it over. A row its
            // handler's transaction still holds (alive, slower than its
            // lease) is not waited for: `None`, and after the rounds 409
            // (on SQLite the take-over waits for the write lock, as every
            // writer does).
            let (key, scope, secs) = (&held.key, self.scope, self.lease_secs());
            let taken = match &mut via {
                Via::Pool(pool) => requests::take_over(pool, key, scope, &old, &lease, secs).await,
                Via::Tx(tx) => requests::take_over_in(tx, key, scope, &old, &lease, secs).await,
            };
            if let Some(claimed) = taken.map_err(unavailable)? {
                return Ok(claimed);
            }
        }
        Err(self.in_flight())
    }

    /// The in-flight row of `held`.
    fn record<'a>(&self, held: &'a HeldKey) -> NewRecord<'a> {
        NewRecord {
            key: &held.key,
            biz_type: self.scope,
            biz_no: &held.biz_no,
            fingerprint: &held.fingerprint,
            ttl_secs: self.lease_secs(),
        }
    }

    /// What the row a claim found means for this request: `Err` the answer
    /// to send (the stored answer replayed, 409, 422, 500), `Ok` its
    /// expired lease, to take over.
    // `Err` is the answer to send, as from `begin`: moved once, to the client.
    #[allow(clippy::result_large_err)]
    fn judge(&self, found: Found, fp: &str) -> Result<String, Response> {
        let Found {
            fingerprint: stored_fp,
            result,
            expired,
            ..
        } = found;
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
            Held::Answer(stored) => Err(stored.replay().unwrap_or_else(|| {
                self.problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Internal error",
                    "the stored answer of this key cannot be read".into(),
                )
            })),
            Held::Lease(_) if !expired => Err(self.in_flight()),
            Held::Lease(old) => Ok(lease_text(&old)),
            Held::Foreign => Err(self.problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                format!(
                    "scope `{}` holds records that are not HTTP answers",
                    self.scope
                ),
            )),
        }
    }

    async fn release<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        held: &HeldKey,
    ) -> Result<bool, sqlx::Error> {
        requests::release(pool, &held.key, self.scope, &lease_text(&held.lease)).await
    }
}

/// Where a request claims its key: on the pool, committed before the
/// handler's transaction, or in that transaction.
enum Via<'a, DB: Backend> {
    Pool(&'a Pool<DB>),
    Tx(&'a mut sqlx::Transaction<'static, DB>),
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
    /// The client's `Idempotency-Key`, as the record keeps it.
    biz_no: String,
    /// The request's fingerprint (method, path, body).
    fingerprint: String,
    lease: String,
    /// The claimed row, once claimed.
    row: ClaimedRow,
    /// Claimed in the handler's transaction: its row, if any, goes with
    /// it (nothing to release).
    in_tx: bool,
}

/// A request that holds its key: the handler's transaction is open, the
/// record locked. Run the effects in [`tx`](Self::tx), then
/// [`finish`](Self::finish) with the answer (stored and committed with
/// them) or [`abandon`](Self::abandon) (rolled back, the key freed for a
/// retry). Dropped unfinished, it rolls back and frees the key.
///
/// The transaction is a [`CallerTx`]: an
/// [`#[idempotent]`](https://docs.rs/idem-runtime/latest/idem_runtime/attr.idempotent.html) handler runs inside it
/// (`handler(call.tx(), &args)`, under a savepoint), the request's own
/// statements on `call.tx().conn()?`, an outbox message with
/// [`enqueue`](idem_core::outbox::enqueue)`(call.tx().transaction()?, …)`;
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
                // Rolled back before the answer goes: its locks (the key's,
                // on PostgreSQL) are gone when the client retries.
                let _ = tx.rollback().await;
                free(&self.pool, &self.policy, held).await;
                return policy.problem(StatusCode::INTERNAL_SERVER_ERROR, "Internal error", why);
            }
        };
        if let Some(h) = &held {
            let text = serde_json::to_string(&stored).expect("an answer serializes");
            let ttl = policy.ttl.as_secs() as i64;
            let done = match tx.transaction() {
                Ok(t) => {
                    let lease = lease_text(&h.lease);
                    let record = policy.record(h);
                    requests::complete(t, h.row, &record, &lease, &text, ttl)
                        .await
                        .map_err(Error::from)
                }
                Err(e) => Err(e),
            };
            match done {
                Ok(true) => {}
                Ok(false) => return policy.in_flight(),
                Err(e) => {
                    let _ = tx.rollback().await;
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
        && !h.in_tx
        && let Err(e) = policy.release(pool, &h).await
    {
        tracing::warn!(scope = policy.scope, error = %format_args!("{e:#}"),
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
            && !held.in_tx
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (pool, policy) = (self.pool.clone(), self.policy.clone());
            rt.spawn(async move {
                let _ = policy.release(&pool, &held).await;
            });
        }
    }
}
