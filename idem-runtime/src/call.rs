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
use sha2::{Digest, Sha256};
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
/// [`Source::outbox`], and the message is marked `success` in the same
/// transaction as the handler's effects.
#[derive(Debug)]
pub struct Source<'a, DB: Backend> {
    pool: &'a Pool<DB>,
    outbox_id: Option<i64>,
    #[cfg(feature = "redis")]
    cache: Option<crate::cache::RedisCache>,
}

impl<'a, DB: Backend> Source<'a, DB> {
    /// A call driven by the outbox message with primary key `message_id`.
    pub fn outbox(pool: &'a Pool<DB>, message_id: i64) -> Self {
        Source {
            outbox_id: Some(message_id),
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
            outbox_id: None,
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
    /// The business type stored with the record.
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

/// The fingerprint of a payload: hex SHA-256 of its canonical JSON (object
/// keys sorted), so field order and map order do not matter.
pub fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String, Error> {
    let value = serde_json::to_value(payload).map_err(Error::Serialization)?;
    let text = serde_json::to_string(&value).map_err(Error::Serialization)?;
    let digest = Sha256::digest(text.as_bytes());
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

const SAVEPOINT: &str = "SAVEPOINT idem_unique_insert";
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT idem_unique_insert";
const RELEASE: &str = "RELEASE SAVEPOINT idem_unique_insert";

/// An idempotent call in progress: an open transaction on which the guard,
/// the body and the bookkeeping run. Rolls back when dropped unfinished.
#[derive(Debug)]
pub struct Call<DB: Backend> {
    tx: Transaction<'static, DB>,
    key: String,
    outbox_id: Option<i64>,
    span: Span,
    strategy: &'static str,
    /// The record strategy's business type (set by the guard).
    biz_type: &'static str,
    #[cfg(feature = "redis")]
    cache: Option<crate::cache::RedisCache>,
}

impl<DB: Backend> Call<DB> {
    /// The front cache's answer, before any database work: `true` when a
    /// marker says the action already happened. Never consulted when an
    /// outbox message drives the call (its status must be updated).
    pub async fn cache_hit(source: &Source<'_, DB>, key: &str, span: &Span) -> bool {
        Self::cache_lookup(source, key, span).await.is_some()
    }

    /// Like [`Call::cache_hit`], for the record strategy: the stored result.
    pub async fn cache_replay<T: DeserializeOwned>(
        source: &Source<'_, DB>,
        key: &str,
        span: &Span,
    ) -> Option<T> {
        let text = Self::cache_lookup(source, key, span).await?;
        serde_json::from_str(&text).ok()
    }

    #[allow(unused_variables)]
    async fn cache_lookup(source: &Source<'_, DB>, key: &str, span: &Span) -> Option<String> {
        #[cfg(feature = "redis")]
        if source.outbox_id.is_none()
            && let Some(cache) = &source.cache
            && let Some(marker) = cache.get(key).await
        {
            span.record("key", key);
            span.record("outcome", "duplicate");
            crate::metrics::duplicate("cache");
            tracing::debug!(parent: span, layer = "cache", "duplicate stopped by the front cache");
            return Some(marker);
        }
        None
    }

    /// Begins the call's transaction.
    pub async fn begin(
        source: Source<'_, DB>,
        key: String,
        strategy: &'static str,
        span: Span,
    ) -> Result<Self, Error> {
        span.record("key", key.as_str());
        let tx = match DB::begin(source.pool).await {
            Ok(tx) => tx,
            Err(e) => return Err(fail(&span, Error::Database(e))),
        };
        Ok(Call {
            tx,
            key,
            outbox_id: source.outbox_id,
            span,
            strategy,
            biz_type: "",
            #[cfg(feature = "redis")]
            cache: source.cache,
        })
    }

    /// The transaction the body runs in.
    pub fn tx(&mut self) -> &mut Transaction<'static, DB> {
        &mut self.tx
    }

    /// The call's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Ends a call whose action already happened: marks the driving outbox
    /// message (if any) and commits. Answers `Duplicate(stored)`.
    pub async fn duplicate<T>(self, stored: Option<T>) -> Result<Outcome<T>, Error> {
        self.duplicate_marked(stored, None).await
    }

    /// Ends a record-strategy duplicate, re-warming the cache with the
    /// stored result.
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

    #[allow(unused_variables)]
    async fn commit(mut self, outcome: &'static str, marker: Option<String>) -> Result<(), Error> {
        if let Some(id) = self.outbox_id
            && let Err(e) = DB::outbox_success(&mut self.tx, id).await
        {
            return Err(fail(&self.span, Error::Database(e)));
        }
        // A failure here is ambiguous: the server may have committed and
        // the acknowledgement been lost. Report it as such; a retry is safe.
        #[cfg(feature = "redis")]
        let (cache, key) = (self.cache.take(), std::mem::take(&mut self.key));
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
                    cache.put(&key, marker.as_deref().unwrap_or("1")).await;
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
        for ident in [sm.table, sm.id_column, sm.state_column] {
            if !crate::backend::is_identifier(ident) {
                return Err(self.fail(Error::permanent(format!(
                    "`{ident}` is not a valid SQL identifier"
                ))));
            }
        }
        Ok(DB::dialect(&self.tx).state_sql(sm.table, sm.id_column, sm.state_column))
    }

    /// Reads the entity's state under a row lock. `Ok(true)`: the entity is
    /// already in `to` (a duplicate). `Ok(false)`: it is in `from`, run the
    /// body. Any other state, or no entity: an illegal-state error, and the
    /// transaction is rolled back.
    pub async fn state_guard(&mut self, sm: &StateMachine, sql: &StateSql) -> Result<bool, Error> {
        let found = DB::lock_state(&mut self.tx, sql, &sm.id)
            .await
            .map_err(|e| self.fail(Error::Database(e)))?;
        match found.as_deref() {
            Some(s) if s == sm.to => Ok(true),
            Some(s) if s == sm.from => Ok(false),
            _ => Err(self.fail(Error::IllegalState {
                table: sm.table,
                id: sm.id.to_string(),
                found,
                expected: sm.from,
            })),
        }
    }

    /// After the body: the guarded transition must change exactly one row,
    /// then the outbox update and the commit.
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
        match DB::transition(&mut self.tx, sql, &sm.id, sm.from, sm.to).await {
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
    /// run the body. `Ok(Some(stored))`: the key exists with the same
    /// fingerprint, a duplicate (the stored result, if the first call
    /// produced one). A different fingerprint is a [`Error::KeyConflict`].
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
            Some(text) => serde_json::from_str(&text)
                .map(|v| Some((Some(v), Some(text))))
                .map_err(|e| self.fail(Error::Serialization(e))),
            None => Ok(Some((None, None))),
        }
    }

    /// After the body: stores its serialized result in the record, then the
    /// outbox update and the commit.
    pub async fn record_finish<T: Serialize, E: Into<BoxError>>(
        mut self,
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
        self.commit("executed", Some(text)).await?;
        Ok(Outcome::Executed(value))
    }

    // ---- unique_insert ----------------------------------------------------

    /// Opens the savepoint the body's insert runs under.
    pub async fn unique_guard(&mut self) -> Result<(), Error> {
        DB::exec(&mut self.tx, SAVEPOINT)
            .await
            .map_err(|e| self.fail(Error::Database(e)))
    }

    /// After the body: a unique violation anywhere in its error is a
    /// duplicate (rolled back to the savepoint, the outer transaction goes
    /// on to the outbox update and commits); any other error rolls
    /// everything back.
    pub async fn unique_finish<T, E: Into<BoxError>>(
        mut self,
        body: Result<T, E>,
    ) -> Result<Outcome<T>, Error> {
        match body {
            Ok(v) => {
                if let Err(e) = DB::exec(&mut self.tx, RELEASE).await {
                    return Err(self.abort(Error::Database(e)).await);
                }
                self.commit("executed", None).await?;
                Ok(Outcome::Executed(v))
            }
            Err(e) => {
                let e: BoxError = e.into();
                let unique = find_sqlx(&*e).is_some_and(
                    |s| matches!(s, sqlx::Error::Database(d) if d.is_unique_violation()),
                );
                if !unique {
                    return Err(self.abort(Error::from_handler(e)).await);
                }
                if let Err(e) = DB::exec(&mut self.tx, ROLLBACK_TO).await {
                    return Err(self.abort(Error::Database(e)).await);
                }
                self.duplicate(None).await
            }
        }
    }
}

fn fail(span: &Span, err: Error) -> Error {
    span.record("outcome", err.kind());
    crate::metrics::error(&err);
    tracing::debug!(parent: span, error = %err, retryable = err.is_retryable(), "idempotent call failed");
    err
}
