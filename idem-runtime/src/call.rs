//! One idempotent call: its transaction, its strategy guard, its outcome.
//!
//! The code `#[idempotent]` generates drives a [`Call`] in a fixed order:
//! key (already checked) → [`Call::begin`] → strategy guard → the user's body
//! on [`Call::tx`] → strategy finish, outbox update, commit. Dropping a
//! `Call` without finishing it rolls its transaction back.

use crate::backend::{Backend, NewRecord, StateSql};
use crate::error::{BoxError, Error, find_sqlx};
use crate::state::EntityIdValue;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Pool, Transaction};
use tracing::Span;

/// What an idempotent call did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// The body ran and its effects committed; here is its value.
    Executed(T),
    /// The action had already happened: the body did not run and nothing
    /// changed. This is a success. The `record` strategy returns the
    /// stored result of the call that executed; the others return `None`.
    Duplicate(Option<T>),
}

impl<T> Outcome<T> {
    /// True for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }

    /// True for [`Outcome::Executed`].
    pub fn is_executed(&self) -> bool {
        matches!(self, Outcome::Executed(_))
    }

    /// The value: the body's for `Executed`, the stored one for a replayed
    /// `Duplicate`.
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::Executed(v) => Some(v),
            Outcome::Duplicate(v) => v,
        }
    }
}

/// Where a call gets its connection, and which outbox message (if any)
/// drives it.
///
/// A plain `&Pool` converts into a `Source`, so a handler is called as
/// `handler(&pool, args…)`. A relay delivering an outbox message passes
/// [`Source::outbox`] with the delivery's [`OutboxLease`], and the message
/// is marked `success` in the same transaction as the handler's effects.
#[derive(Debug)]
pub struct Source<'a, DB: Backend> {
    pool: &'a Pool<DB>,
    outbox: Option<OutboxLease>,
    #[cfg(feature = "redis")]
    cache: Option<crate::cache::RedisCache>,
}

/// One delivery's hold on one outbox message: the message, its topic, and
/// the lease token the claim wrote (owner and attempt number).
///
/// A call driven by an outbox message ([`Source::outbox`]) first marks the
/// message `success` in its own transaction, fenced by this token: the
/// update must find the message pending, of this topic, and still held by
/// this very claim. Otherwise nothing runs and the call fails:
/// [`Error::LeaseLost`] (retryable) when another claim took the message
/// over, [`Error::OutboxMessage`] (not retryable) when it does not exist,
/// belongs to another topic or is already finished. The row stays locked
/// until the call commits or rolls back, so on PostgreSQL and MariaDB no
/// other relay can claim it meanwhile (claims skip locked rows), however
/// long the handler runs; on SQLite the call's write lock does the same.
///
/// A [`Relay`](crate::outbox::Relay) hands one out with every delivery
/// ([`Delivery::source`](crate::outbox::Delivery::source)); build one by
/// hand only in a relay of your own, from the row your claim returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxLease {
    pub(crate) id: i64,
    pub(crate) topic: String,
    pub(crate) owner: String,
    pub(crate) attempt: i32,
}

impl OutboxLease {
    /// The lease of message `id` of `topic`, claimed by `owner` as attempt
    /// number `attempt` (the row's `lease_owner` and `attempts`).
    pub fn new(id: i64, topic: impl Into<String>, owner: impl Into<String>, attempt: i32) -> Self {
        OutboxLease {
            id,
            topic: topic.into(),
            owner: owner.into(),
            attempt,
        }
    }

    /// The message's primary key.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The message's topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The lease owner (the relay).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The attempt number the claim wrote.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
}

impl<'a, DB: Backend> Source<'a, DB> {
    /// A call driven by the outbox message that `lease` holds.
    pub fn outbox(pool: &'a Pool<DB>, lease: OutboxLease) -> Self {
        Source {
            outbox: Some(lease),
            ..Source::from(pool)
        }
    }

    /// Puts the Redis front cache in front of the database for this call
    /// (feature `redis`). See [`cache`](crate::cache).
    #[cfg(feature = "redis")]
    pub fn cache(mut self, cache: &crate::cache::RedisCache) -> Self {
        self.cache = Some(cache.clone());
        self
    }
}

impl<'a, DB: Backend> From<&'a Pool<DB>> for Source<'a, DB> {
    fn from(pool: &'a Pool<DB>) -> Self {
        Source {
            pool,
            outbox: None,
            #[cfg(feature = "redis")]
            cache: None,
        }
    }
}

/// The `state_machine` strategy's parameters, as the attribute gave them.
#[derive(Debug)]
pub struct StateMachine {
    /// The entity's table.
    pub table: &'static str,
    /// Its id column.
    pub id_column: &'static str,
    /// Its state column.
    pub state_column: &'static str,
    /// The column the transition writes the call's key into (`key_column`),
    /// binding the transition to the message that made it.
    pub key_column: Option<&'static str>,
    /// The entity id of this call.
    pub id: EntityIdValue,
    /// The state the transition starts from.
    pub from: &'static str,
    /// The state it ends in.
    pub to: &'static str,
}

/// The `record` strategy's parameters.
#[derive(Debug)]
pub struct Record {
    /// The business type stored with the record: the scope of its key.
    pub biz_type: &'static str,
    /// The business document number (defaults to the key).
    pub biz_no: Option<String>,
    /// Seconds until the record may be archived: 1 ..= [`MAX_TTL_SECS`].
    pub ttl_secs: i64,
    /// Hex SHA-256 of the canonical JSON of the payload.
    pub fingerprint: String,
}

/// The longest record ttl: 3650 days. Longer would reach past what the
/// databases store (MariaDB's year 9999) for no benefit.
pub const MAX_TTL_SECS: i64 = 3650 * 86_400;

pub use crate::fingerprint::fingerprint;

const SAVEPOINT: &str = "SAVEPOINT idem_unique_insert";
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT idem_unique_insert";
const RELEASE: &str = "RELEASE SAVEPOINT idem_unique_insert";

/// An idempotent call in progress: an open transaction on which the guard,
/// the body and the bookkeeping run. Rolls back when dropped unfinished.
#[derive(Debug)]
pub struct Call<DB: Backend> {
    tx: Transaction<'static, DB>,
    key: String,
    span: Span,
    strategy: &'static str,
    /// The record strategy's business type (set by the guard).
    biz_type: &'static str,
    #[cfg(feature = "redis")]
    scope: &'static str,
    #[cfg(feature = "redis")]
    cache: Option<crate::cache::RedisCache>,
}

impl<DB: Backend> Call<DB> {
    /// The front cache's answer, before any database work: `true` when a
    /// marker of this handler's `scope` says the action already happened.
    /// Never consulted when an outbox message drives the call (its status
    /// must be updated).
    pub async fn cache_hit(
        source: &Source<'_, DB>,
        scope: &'static str,
        key: &str,
        span: &Span,
    ) -> bool {
        let hit = Self::cache_lookup(source, scope, key, span).await.is_some();
        if hit {
            Self::cache_duplicate(key, span);
        }
        hit
    }

    /// Like [`Call::cache_hit`], for the record strategy: the stored result,
    /// only when the marker carries this call's payload fingerprint. A
    /// marker of another payload falls through to the database, which
    /// answers [`Error::KeyConflict`].
    pub async fn cache_replay<T: DeserializeOwned>(
        source: &Source<'_, DB>,
        rec: &Record,
        key: &str,
        span: &Span,
    ) -> Option<T> {
        let marker = Self::cache_lookup(source, rec.biz_type, key, span).await?;
        let Some(text) = replay_of(&marker, &rec.fingerprint) else {
            crate::metrics::cache_mismatch();
            tracing::debug!(parent: span, "cache marker of another payload; asking the database");
            return None;
        };
        let value = serde_json::from_str(text).ok()?;
        Self::cache_duplicate(key, span);
        Some(value)
    }

    fn cache_duplicate(key: &str, span: &Span) {
        span.record("key", key);
        span.record("outcome", "duplicate");
        crate::metrics::duplicate("cache");
        tracing::debug!(parent: span, layer = "cache", "duplicate stopped by the front cache");
    }

    #[allow(unused_variables)]
    async fn cache_lookup(
        source: &Source<'_, DB>,
        scope: &'static str,
        key: &str,
        span: &Span,
    ) -> Option<String> {
        #[cfg(feature = "redis")]
        if source.outbox.is_none()
            && let Some(cache) = &source.cache
        {
            return cache.get(scope, key).await;
        }
        None
    }

    /// Begins the call's transaction. When an outbox message drives the
    /// call, marks it `success` first, fenced by its lease (see
    /// [`OutboxLease`]): a message that is not held by this delivery fails
    /// the call before anything runs.
    #[allow(unused_variables)]
    pub async fn begin(
        source: Source<'_, DB>,
        key: String,
        strategy: &'static str,
        scope: &'static str,
        span: Span,
    ) -> Result<Self, Error> {
        span.record("key", key.as_str());
        let tx = match DB::begin(source.pool).await {
            Ok(tx) => tx,
            Err(e) => return Err(fail(&span, Error::Database(e))),
        };
        let mut call = Call {
            tx,
            key,
            span,
            strategy,
            biz_type: "",
            #[cfg(feature = "redis")]
            scope,
            #[cfg(feature = "redis")]
            cache: source.cache,
        };
        if let Some(lease) = &source.outbox {
            // On failure the transaction rolls back when `call` drops.
            call.mark_outbox(lease).await?;
        }
        Ok(call)
    }

    /// The fenced outbox update: exactly one row, or the call fails.
    async fn mark_outbox(&mut self, lease: &OutboxLease) -> Result<(), Error> {
        match DB::outbox_success(&mut self.tx, lease).await {
            Ok(1) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(self.fail(Error::Database(e))),
        }
        let found = DB::outbox_state(&mut self.tx, lease.id)
            .await
            .map_err(|e| self.fail(Error::Database(e)))?;
        let err = match found {
            None => Error::OutboxMessage {
                id: lease.id,
                reason: "no such outbox message".into(),
            },
            Some(row) if row.topic != lease.topic => Error::OutboxMessage {
                id: lease.id,
                reason: format!(
                    "the message belongs to topic `{}`, not `{}`",
                    row.topic, lease.topic
                ),
            },
            Some(row)
                if row.lease_owner.as_deref() != Some(lease.owner.as_str())
                    || row.attempts != lease.attempt =>
            {
                Error::LeaseLost {
                    id: lease.id,
                    holder: row.lease_owner,
                    attempt: row.attempts,
                }
            }
            Some(row) => Error::OutboxMessage {
                id: lease.id,
                reason: format!("the message is `{}`, not pending", row.status),
            },
        };
        Err(self.fail(err))
    }

    /// The transaction the body runs in.
    pub fn tx(&mut self) -> &mut Transaction<'static, DB> {
        &mut self.tx
    }

    /// The call's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Ends a call whose action already happened: commits (the driving
    /// outbox message, if any, was marked at the start). Answers
    /// `Duplicate(stored)`.
    pub async fn duplicate<T>(self, stored: Option<T>) -> Result<Outcome<T>, Error> {
        self.duplicate_marked(stored, None).await
    }

    /// Ends a record-strategy duplicate, re-warming the cache with the
    /// stored result (`marker`: fingerprint and result).
    pub async fn duplicate_replay<T>(
        self,
        stored: Option<T>,
        marker: Option<String>,
    ) -> Result<Outcome<T>, Error> {
        self.duplicate_marked(stored, marker).await
    }

    async fn duplicate_marked<T>(
        self,
        stored: Option<T>,
        marker: Option<String>,
    ) -> Result<Outcome<T>, Error> {
        let layer = match self.strategy {
            "state_machine" => "domain_state",
            other => other,
        };
        crate::metrics::duplicate(layer);
        self.commit("duplicate", marker).await?;
        Ok(Outcome::Duplicate(stored))
    }

    #[allow(unused_variables, unused_mut)]
    async fn commit(mut self, outcome: &'static str, marker: Option<String>) -> Result<(), Error> {
        // A failure here is ambiguous: the server may have committed and
        // the acknowledgement been lost. Report it as such; a retry is safe.
        #[cfg(feature = "redis")]
        let (cache, key, scope) = (self.cache.take(), std::mem::take(&mut self.key), self.scope);
        let Call { tx, span, .. } = self;
        let committed = tx.commit().await;
        #[cfg(feature = "testing")]
        let committed = match committed {
            Ok(()) if crate::testing::lose_ack() => Err(crate::testing::lost_ack_error()),
            other => other,
        };
        match committed {
            Ok(()) => {
                span.record("outcome", outcome);
                tracing::debug!(parent: &span, outcome, "idempotent call finished");
                crate::metrics::call(outcome);
                // Only now, after the commit: the marker of a rolled-back
                // call would skip the action forever.
                #[cfg(feature = "redis")]
                if let Some(cache) = cache {
                    let marker = marker.as_deref().unwrap_or(PLAIN_MARKER);
                    cache.put(scope, &key, marker).await;
                }
                Ok(())
            }
            Err(e @ sqlx::Error::Database(_)) => Err(fail(&span, Error::Database(e))),
            Err(e) => Err(fail(&span, Error::CommitUnknown(e))),
        }
    }

    async fn abort(self, err: Error) -> Error {
        // Rollback failures leave nothing behind: the server rolls back a
        // transaction whose connection is gone.
        let _ = self.tx.rollback().await;
        fail(&self.span, err)
    }

    fn fail(&self, err: Error) -> Error {
        fail(&self.span, err)
    }

    // ---- state_machine ----------------------------------------------------

    /// Renders the state machine's statements for this call's database
    /// (identifiers checked again; the macro checked them at compile time).
    pub fn state_sql(&self, sm: &StateMachine) -> Result<StateSql, Error> {
        for ident in [sm.table, sm.id_column, sm.state_column]
            .into_iter()
            .chain(sm.key_column)
        {
            if !crate::backend::is_identifier(ident) {
                return Err(self.fail(Error::permanent(format!(
                    "`{ident}` is not a valid SQL identifier"
                ))));
            }
        }
        Ok(DB::dialect(&self.tx).state_sql(sm.table, sm.id_column, sm.state_column, sm.key_column))
    }

    /// Reads the entity's state under a row lock. `Ok(true)`: the entity is
    /// already in `to` (a duplicate; with `key_column`, only when that
    /// column holds this call's key). `Ok(false)`: it is in `from`, run the
    /// body. Any other state, no entity, or `to` reached under another key:
    /// an illegal-state error, and the transaction is rolled back.
    pub async fn state_guard(&mut self, sm: &StateMachine, sql: &StateSql) -> Result<bool, Error> {
        let found = DB::lock_state(&mut self.tx, sql, &sm.id)
            .await
            .map_err(|e| self.fail(Error::Database(e)))?;
        let illegal = |found: Option<String>| Error::IllegalState {
            table: sm.table,
            id: sm.id.to_string(),
            found,
            expected: sm.from,
        };
        match found {
            Some((s, by)) if s == sm.to => match (sm.key_column, by) {
                (None, _) => Ok(true),
                (Some(_), Some(k)) if k == self.key => Ok(true),
                (Some(col), by) => {
                    let by = by.map_or_else(|| "NULL".to_string(), |k| format!("`{k}`"));
                    Err(self.fail(illegal(Some(format!(
                        "{s}` under another key ({col} = {by}, this call's key is `{}`",
                        self.key
                    )))))
                }
            },
            Some((s, _)) if s == sm.from => Ok(false),
            found => Err(self.fail(illegal(found.map(|(s, _)| s)))),
        }
    }

    /// After the body: the guarded transition must change exactly one row,
    /// then the commit.
    pub async fn state_finish<T, E: Into<BoxError>>(
        mut self,
        sm: &StateMachine,
        sql: &StateSql,
        body: Result<T, E>,
    ) -> Result<Outcome<T>, Error> {
        let value = match body {
            Ok(v) => v,
            Err(e) => return Err(self.abort(Error::from_handler(e.into())).await),
        };
        let key = sm.key_column.map(|_| self.key.clone());
        match DB::transition(&mut self.tx, sql, &sm.id, sm.from, sm.to, key.as_deref()).await {
            Ok(1) => {}
            Ok(_) => {
                // The row was locked in `from`: only the body can have
                // moved it (or deleted it) since.
                let err = Error::IllegalState {
                    table: sm.table,
                    id: sm.id.to_string(),
                    found: Some(format!(
                        "changed by the handler body (no longer `{}`)",
                        sm.from
                    )),
                    expected: sm.from,
                };
                return Err(self.abort(err).await);
            }
            Err(e) => return Err(self.abort(Error::Database(e)).await),
        }
        self.commit("executed", None).await?;
        Ok(Outcome::Executed(value))
    }

    // ---- record -----------------------------------------------------------

    /// Writes the idempotency record before the body. `Ok(None)`: claimed,
    /// run the body. `Ok(Some(stored))`: the key exists in this `biz_type`
    /// with the same fingerprint, a duplicate (the stored result, if the
    /// first call produced one, and the cache marker to re-warm). A
    /// different fingerprint is a [`Error::KeyConflict`].
    pub async fn record_guard<T: DeserializeOwned>(
        &mut self,
        rec: &Record,
    ) -> Result<Option<(Option<T>, Option<String>)>, Error> {
        let biz_no = rec.biz_no.as_deref().unwrap_or(&self.key);
        if rec.biz_type.len() > 64 || biz_no.len() > 128 {
            return Err(self.fail(Error::InvalidKey {
                key: self.key.clone(),
                reason: "biz_type must be at most 64 bytes and biz_no at most 128".into(),
            }));
        }
        if !(1..=MAX_TTL_SECS).contains(&rec.ttl_secs) {
            return Err(self.fail(Error::Config {
                reason: format!(
                    "record ttl of {} s is out of bounds: 1 s ..= {MAX_TTL_SECS} s (3650 days)",
                    rec.ttl_secs
                ),
            }));
        }
        self.biz_type = rec.biz_type;
        let row = NewRecord {
            key: &self.key,
            biz_type: rec.biz_type,
            biz_no,
            fingerprint: &rec.fingerprint,
            ttl_secs: rec.ttl_secs,
        };
        let claimed = DB::claim_record(&mut self.tx, &row).await;
        match claimed {
            Ok(true) => return Ok(None),
            Ok(false) => {}
            Err(e) => return Err(self.fail(Error::Database(e))),
        }
        let stored = match DB::fetch_record(&mut self.tx, rec.biz_type, &self.key).await {
            Ok(Some(s)) => s,
            // Claim lost but no row: the other writer's row vanished between
            // the two statements (archived). Transient.
            Ok(None) => return Err(self.fail(Error::retryable("idempotency record vanished"))),
            Err(e) => return Err(self.fail(Error::Database(e))),
        };
        if stored.fingerprint != rec.fingerprint {
            return Err(self.fail(Error::KeyConflict {
                key: self.key.clone(),
            }));
        }
        match stored.result {
            Some(text) => match serde_json::from_str(&text) {
                Ok(v) => {
                    let marker = replay_marker(&rec.fingerprint, &text);
                    Ok(Some((Some(v), Some(marker))))
                }
                Err(e) => Err(self.fail(Error::Serialization(e))),
            },
            None => Ok(Some((None, None))),
        }
    }

    /// After the body: stores its serialized result in the record, then the
    /// commit.
    pub async fn record_finish<T: Serialize, E: Into<BoxError>>(
        mut self,
        rec: &Record,
        body: Result<T, E>,
    ) -> Result<Outcome<T>, Error> {
        let value = match body {
            Ok(v) => v,
            Err(e) => return Err(self.abort(Error::from_handler(e.into())).await),
        };
        let text = match serde_json::to_string(&value) {
            Ok(t) => t,
            Err(e) => return Err(self.abort(Error::Serialization(e)).await),
        };
        let key = self.key.clone();
        if let Err(e) = DB::store_result(&mut self.tx, self.biz_type, &key, &text).await {
            return Err(self.abort(Error::Database(e)).await);
        }
        let marker = replay_marker(&rec.fingerprint, &text);
        self.commit("executed", Some(marker)).await?;
        Ok(Outcome::Executed(value))
    }

    // ---- unique_insert ----------------------------------------------------

    /// Opens the savepoint the body's insert runs under.
    pub async fn unique_guard(&mut self) -> Result<(), Error> {
        DB::exec(&mut self.tx, SAVEPOINT)
            .await
            .map_err(|e| self.fail(Error::Database(e)))
    }

    /// After the body: a violation of `constraint` (the unique constraint
    /// that identifies the action) anywhere in its error is a duplicate
    /// (rolled back to the savepoint, the outer transaction commits); any
    /// other error, another unique violation included, rolls everything
    /// back.
    pub async fn unique_finish<T, E: Into<BoxError>>(
        mut self,
        body: Result<T, E>,
        constraint: &'static str,
    ) -> Result<Outcome<T>, Error> {
        let e: BoxError = match body {
            Ok(v) => {
                if let Err(e) = DB::exec(&mut self.tx, RELEASE).await {
                    return Err(self.abort(Error::Database(e)).await);
                }
                self.commit("executed", None).await?;
                return Ok(Outcome::Executed(v));
            }
            Err(e) => e.into(),
        };
        let violation = find_sqlx(&*e).and_then(|s| match s {
            sqlx::Error::Database(d) if d.is_unique_violation() => Some(&**d),
            _ => None,
        });
        let Some(violation) = violation else {
            return Err(self.abort(Error::from_handler(e)).await);
        };
        if let Err(e) = DB::exec(&mut self.tx, ROLLBACK_TO).await {
            return Err(self.abort(Error::Database(e)).await);
        }
        let dialect = DB::dialect(&self.tx);
        let hit = crate::unique::violated(dialect, violation);
        let matched = crate::unique::matches(&hit, constraint, &mut self.tx).await;
        match matched {
            Ok(true) => self.duplicate(None).await,
            Ok(false) => {
                let err = Error::Handler {
                    retryable: false,
                    source: format!(
                        "unique violation of {hit}, not of the action's constraint \
                         `{constraint}`, so not a duplicate: {e}"
                    )
                    .into(),
                };
                Err(self.abort(err).await)
            }
            Err(db) => Err(self.abort(Error::Database(db)).await),
        }
    }
}

/// The cache marker of a call without a stored result.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
const PLAIN_MARKER: &str = "1";

/// The cache marker of a record-strategy call: its payload fingerprint and
/// its stored result, so that a cache hit answers only what the database
/// would (`<fingerprint>:<result JSON>`).
fn replay_marker(fingerprint: &str, result: &str) -> String {
    format!("{fingerprint}:{result}")
}

/// The stored result in a marker, if the marker carries `fingerprint`.
fn replay_of<'m>(marker: &'m str, fingerprint: &str) -> Option<&'m str> {
    marker
        .strip_prefix(fingerprint)
        .and_then(|rest| rest.strip_prefix(':'))
}

fn fail(span: &Span, err: Error) -> Error {
    span.record("outcome", err.kind());
    crate::metrics::error(&err);
    tracing::debug!(parent: span, error = %err, retryable = err.is_retryable(), "idempotent call failed");
    err
}

#[cfg(test)]
mod tests {
    use super::{replay_marker, replay_of};

    #[test]
    fn replay_markers_answer_only_their_own_payload() {
        let fp = "ab".repeat(32);
        let m = replay_marker(&fp, r#"{"channel":"sms"}"#);
        assert_eq!(replay_of(&m, &fp), Some(r#"{"channel":"sms"}"#));
        assert_eq!(replay_of(&m, &"cd".repeat(32)), None);
        // A marker written before fingerprints were stored: no answer.
        assert_eq!(replay_of(r#"{"channel":"sms"}"#, &fp), None);
        assert_eq!(replay_of("", &fp), None);
    }
}
