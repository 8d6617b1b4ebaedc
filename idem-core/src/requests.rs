//! The seam of the HTTP `Idempotency-Key` entry point: the ledger of
//! requests in `idem_record`, which `idem_runtime::http` (crate
//! `idem-axum`) is written on, and another web framework's adapter can be.
//!
//! A request's row is the record `(key, scope)`; while the request runs its
//! `result` column holds the in-flight lease that claimed it, and once it is
//! answered, the stored answer. The protocol, per request, comes in two
//! forms.
//!
//! **In the handler's transaction**, where the database has it
//! ([`claims_in_transaction`]: PostgreSQL):
//!
//! 1. Begin the handler's transaction ([`Backend::begin`]) and
//!    [`claim_in`] it: [`Claim::Claimed`], the key is this transaction's
//!    (its transaction-scoped lock held; no row is written yet);
//!    [`Claim::Busy`], a concurrent request of the key holds it (answer
//!    409); [`Claim::Found`], as below ([`take_over_in`] for an expired
//!    lease).
//! 2. Run the handler, [`complete`] with the answer (the answered row
//!    inserted, or a taken-over row updated), commit. `false` from
//!    [`complete`]: a request of the key committed it meanwhile; roll
//!    back (answer 409: the retry finds the answer). A request that ends
//!    without an answer to keep rolls back, and nothing of it stays: no
//!    release, and no lease for a crash to leave behind.
//!
//! **Before the handler's transaction** (every database):
//!
//! 1. [`find`] the row. None: [`insert`] it with a fresh lease (`None` back:
//!    a concurrent request of the same key won; answer 409). Found with an
//!    answer of the same fingerprint: replay it. Found with an expired
//!    lease: [`take_over`] (`None` back: another transaction holds it).
//!    [`claim`] does the find and the insert in one call (on PostgreSQL in
//!    one statement).
//! 2. In the handler's transaction ([`Backend::begin`]): [`fence`] the row
//!    (still held by this lease, locked until the commit), run the handler,
//!    [`complete`] the row with the answer, commit. A `false` from either:
//!    the lease was taken over; roll back.
//! 3. A request that ends without an answer to keep (a 5xx, a panic, a
//!    dropped connection) [`release`]s its row, so that a retry runs.
//!
//! All functions are cancellation-safe in the sense of the store: a
//! dropped future leaves at most a row whose lease expires.

use crate::backend::Backend;
pub use crate::backend::{ClaimedRow, NewRecord};
use sha2::{Digest, Sha256};
use sqlx::{Pool, Transaction};

/// A request's row as [`find`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Found {
    /// Hex SHA-256 of the request that claimed the key.
    pub fingerprint: String,
    /// The in-flight lease, or the stored answer (`None`: neither).
    pub result: Option<String>,
    /// Whether the row's `expire_time` has passed.
    pub expired: bool,
}

/// The row of `key` in `scope`. Never waits on row locks.
pub async fn find<DB: Backend>(
    pool: &Pool<DB>,
    key: &str,
    scope: &str,
) -> Result<Option<Found>, sqlx::Error> {
    let row = DB::request_find(pool, key, scope).await?;
    Ok(row.map(|(fingerprint, result, expired)| Found {
        fingerprint,
        result,
        expired,
    }))
}

/// Inserts the in-flight row of `row` held by `lease`, unless the pair
/// exists: `Some` if this call inserted it.
pub async fn insert<DB: Backend>(
    pool: &Pool<DB>,
    row: &NewRecord<'_>,
    lease: &str,
) -> Result<Option<ClaimedRow>, sqlx::Error> {
    DB::request_insert(pool, row, lease).await
}

/// What [`claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The in-flight row is this call's, held by its lease.
    Claimed(ClaimedRow),
    /// The key has a row already (an answer, or another request's lease).
    Found(Found),
    /// Neither: a concurrent insert of the key committed in between; claim
    /// again to find it.
    Raced,
    /// [`claim_in`] only: no row, and a concurrent request of the key holds
    /// it (its in-flight row is not committed yet): answer 409.
    Busy,
}

/// Step 1 of the protocol in one call: [`insert`] the in-flight row of
/// `row` held by `lease` or, where the key has one, the row [`find`] reads.
/// On PostgreSQL one statement (one round trip, a new key and a replay
/// alike), whose commit does not wait for the WAL flush: a crash can lose
/// an in-flight row committed so, never an answer (the answer's
/// transaction updates the row and commits synchronously, flushing this
/// insert with it). Elsewhere [`find`], then [`insert`].
pub async fn claim<DB: Backend>(
    pool: &Pool<DB>,
    row: &NewRecord<'_>,
    lease: &str,
) -> Result<Claim, sqlx::Error> {
    Ok(match DB::request_claim(pool, row, lease).await? {
        Ok(claimed) => Claim::Claimed(claimed),
        Err(Some((fingerprint, result, expired))) => Claim::Found(Found {
            fingerprint,
            result,
            expired,
        }),
        Err(None) => Claim::Raced,
    })
}

/// Whether [`claim_in`] claims in the handler's transaction on `pool`'s
/// database (PostgreSQL); where it does not, [`claim`] before it.
pub fn claims_in_transaction<DB: Backend>(pool: &Pool<DB>) -> bool {
    DB::dialect_of_pool(pool).requests().claim_in.is_some()
}

/// Step 1 of the protocol in the handler's transaction `tx`, in one
/// statement: the row [`find`] reads, or where there is none, the key
/// claimed by `tx` ([`Claim::Claimed`]: the key's transaction-scoped lock,
/// held until `tx` ends; no row is written, [`complete`] inserts the
/// answered row of `row`). A concurrent request of the key, claimed and not
/// committed yet, is [`Claim::Busy`] at once, never waited for. `None`
/// where the database has no such claim ([`claims_in_transaction`] is
/// false): nothing was run.
///
/// After [`Claim::Found`], `tx` stays usable: claim again, or
/// [`take_over_in`] it.
pub async fn claim_in<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    row: &NewRecord<'_>,
) -> Result<Option<Claim>, sqlx::Error> {
    Ok(DB::request_claim_in(tx, row).await?.map(|c| match c {
        Ok(claimed) => Claim::Claimed(claimed),
        Err((_, Some((fingerprint, result, expired)))) => Claim::Found(Found {
            fingerprint,
            result,
            expired,
        }),
        Err((true, None)) => Claim::Busy,
        Err((false, None)) => Claim::Raced,
    }))
}

/// [`take_over`] in the handler's transaction `tx`, after [`claim_in`]
/// found an expired lease: the row stays locked until `tx` ends, and
/// reverts to the expired lease if it rolls back.
pub async fn take_over_in<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &str,
    scope: &str,
    old: &str,
    lease: &str,
    lease_secs: i64,
) -> Result<Option<ClaimedRow>, sqlx::Error> {
    DB::request_take_over_in(tx, key, scope, old, lease, lease_secs).await
}

/// Replaces the expired lease `old` by `lease` for `lease_secs`: `Some` if
/// it did; `None` when another transaction holds the row (never waits for
/// it) or the lease changed.
pub async fn take_over<DB: Backend>(
    pool: &Pool<DB>,
    key: &str,
    scope: &str,
    old: &str,
    lease: &str,
    lease_secs: i64,
) -> Result<Option<ClaimedRow>, sqlx::Error> {
    // In a transaction of its own.
    let mut tx = DB::begin(pool).await?;
    let taken = take_over_in(&mut tx, key, scope, old, lease, lease_secs).await?;
    match taken {
        Some(_) => tx.commit().await?,
        None => tx.rollback().await?,
    }
    Ok(taken)
}

/// In the handler's transaction: the row, still held by `lease`, locked
/// until the commit and its lease extended to `lease_secs`; true if it is.
pub async fn fence<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    row: ClaimedRow,
    key: &str,
    scope: &str,
    lease: &str,
    lease_secs: i64,
) -> Result<bool, sqlx::Error> {
    DB::request_fence(tx, row, key, scope, lease, lease_secs).await
}

/// In the handler's transaction: the stored `answer` of `record` in place
/// of `lease`, kept `ttl_secs`; true if the lease still held. A key
/// [`claim_in`] claimed ([`ClaimedRow::unwritten`]) gets its answered row
/// inserted here; true if the key had none (`false`: a request of the key
/// committed it since the claim, and `tx` must roll back). `record` is the
/// one the claim was made with (its `ttl_secs`, the lease's, is not used).
pub async fn complete<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    row: ClaimedRow,
    record: &NewRecord<'_>,
    lease: &str,
    answer: &str,
    ttl_secs: i64,
) -> Result<bool, sqlx::Error> {
    DB::request_complete(tx, row, record, lease, answer, ttl_secs).await
}

/// Deletes the in-flight row held by `lease` (a request that ended without
/// an answer to keep); true if it did.
pub async fn release<DB: Backend>(
    pool: &Pool<DB>,
    key: &str,
    scope: &str,
    lease: &str,
) -> Result<bool, sqlx::Error> {
    DB::request_release(pool, key, scope, lease).await
}

/// Whether a failed `COMMIT` may have landed: the connection died while it
/// ran. Such a request must not be released (its answer may be stored).
pub fn commit_outcome_unknown(e: &sqlx::Error) -> bool {
    crate::backend::classify::commit_outcome_unknown(e)
}

/// Makes `span`, the span an HTTP entry point runs one request in,
/// continue the trace of the request's W3C `traceparent` (and
/// `tracestate`) header, so that what the handler enqueues, and the
/// relay's and the consumers' spans after it, are in the caller's trace.
/// Call it before the span is first entered, in the span the request
/// arrives in: when that span has a valid trace context already (the
/// application's own HTTP tracing continued the header), `span` stays
/// under it. A missing or malformed header changes nothing.
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    crate::otel::requested(span, traceparent, tracestate);
}

/// The record key of a request: `http:` and the hex SHA-256 of the
/// caller's identity and the client's `Idempotency-Key` (its value, without
/// the quotes of the structured header), the identity length-prefixed so
/// that no two pairs collide. Fixed length whatever the identity, and no
/// client byte reaches the column. The layer keys its records with it, and
/// the operator's look-up (`idem request --key K --caller C`) finds them
/// with it.
///
/// ```
/// use idem_runtime::requests::record_key;
/// let k = record_key("alice", "order-1");
/// assert!(k.starts_with("http:") && k.len() == 5 + 64);
/// assert_ne!(k, record_key("bob", "order-1"));
/// assert_ne!(record_key("ab", "c"), record_key("a", "bc"));
/// ```
pub fn record_key(identity: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update((identity.len() as u64).to_be_bytes());
    h.update(identity.as_bytes());
    h.update(key.as_bytes());
    let digest = h.finalize();
    let mut text = String::with_capacity(5 + 2 * digest.len());
    text.push_str("http:");
    for b in digest.iter() {
        text.push_str(&format!("{b:02x}"));
    }
    text
}
