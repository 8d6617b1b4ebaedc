//! One idempotent call: its transaction, its strategy, its outcome.
//!
//! The code `#[idempotent]` generates makes two calls, whatever the
//! strategy; the order of the protocol is written here, once:
//!
//! 1. [`Call::open`]: the front cache (feature `redis`), then BEGIN, the
//!    fenced outbox update when an outbox message drives the call, then the
//!    strategy's guard. A duplicate commits and is answered
//!    ([`Open::Done`]); otherwise the body runs on [`Call::tx`].
//! 2. [`Call::finish`]: the strategy's bookkeeping for the body's result
//!    (transition, stored result, savepoint or constraint match), then the
//!    commit and the cache marker.
//!
//! Dropping a `Call` without finishing it rolls its transaction back.

mod cache_marker;
mod caller;
mod outcome;
mod source;
mod strategy;

pub use caller::CallerTx;
pub(crate) use caller::{BARE_BATCH_UNDONE, SharedTx};
pub use outcome::Outcome;
use source::Conn;
pub use source::{OutboxLease, Source};

pub(crate) use cache_marker::{replay_marker, replay_of};
pub use strategy::Strategy;
pub(crate) use strategy::sealed::Sealed;
pub(crate) use strategy::{Settled, Verdict};

use crate::backend::{Backend, StateSql};
use crate::error::{BoxError, Error};
use crate::state::EntityIdValue;
use sqlx::Transaction;
use tracing::Span;

/// What [`Call::open`] found.
#[derive(Debug)]
pub enum Open<'c, DB: Backend, G, T> {
    /// A first delivery: run the body on [`Call::tx`], then
    /// [`Call::finish`].
    Run(Call<'c, DB, G>),
    /// Answered before the body (a duplicate, by the front cache or by the
    /// strategy's guard; already committed).
    Done(Outcome<T>),
}

/// An idempotent call in progress: an open transaction on which the guard,
/// the body and the bookkeeping run, and what the guard found (`G`). Rolls
/// back when dropped unfinished.
#[derive(Debug)]
pub struct Call<'c, DB: Backend, G = ()> {
    pub(crate) state: CallState<'c, DB>,
    guard: G,
}

/// The transaction a call runs in.
#[derive(Debug)]
pub(crate) enum CallTx<'c, DB: Backend> {
    /// Its own: committed at the end.
    Own(Transaction<'static, DB>),
    /// The caller's ([`CallerTx`]), under a savepoint: released at the end,
    /// and the caller commits (or not).
    Caller(caller::Lent<'c, DB>),
}

impl<DB: Backend> CallTx<'_, DB> {
    /// The transaction the guard, the body and the bookkeeping run on.
    pub(crate) fn tx(&mut self) -> &mut Transaction<'static, DB> {
        match self {
            CallTx::Own(tx) => tx,
            CallTx::Caller(lent) => lent.tx(),
        }
    }

    /// The same, shared.
    pub(crate) fn tx_ref(&self) -> &Transaction<'static, DB> {
        match self {
            CallTx::Own(tx) => tx,
            CallTx::Caller(lent) => lent.tx_ref(),
        }
    }

    fn nested(&self) -> bool {
        matches!(self, CallTx::Caller(_))
    }

    /// Commits its own transaction, or releases the savepoint.
    async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            CallTx::Own(tx) => tx.commit().await,
            CallTx::Caller(lent) => lent.release().await,
        }
    }

    /// Rolls its own transaction back, or back to the savepoint. Failures
    /// leave nothing behind: the server rolls back a transaction whose
    /// connection is gone, and a caller's transaction that could not roll
    /// back to the savepoint is lost as a whole.
    async fn rollback(self) {
        match self {
            CallTx::Own(tx) => {
                let _ = tx.rollback().await;
            }
            #[cfg(feature = "testing")]
            CallTx::Caller(lent) if lent.shared() && crate::testing::broken_batch_savepoints() => {
                let _ = lent.release().await;
            }
            CallTx::Caller(lent) => lent.roll_back().await,
        }
    }
}

/// What a call carries whatever its guard found.
#[derive(Debug)]
pub(crate) struct CallState<'c, DB: Backend> {
    /// The call's own transaction, or the caller's, a savepoint deeper.
    pub(crate) tx: CallTx<'c, DB>,
    pub(crate) key: String,
    span: Span,
    strategy: &'static str,
    #[cfg(feature = "redis")]
    scope: &'static str,
    #[cfg(feature = "redis")]
    cache: Option<crate::cache::RedisCache>,
    /// In a relay batch: where the marker goes, to be written after the
    /// batch's commit.
    #[cfg(feature = "redis")]
    deferred: Option<std::sync::Arc<std::sync::Mutex<Vec<caller::DeferredMarker>>>>,
    /// When the marker must be gone by: its record's expiry (see
    /// [`Call::bound_marker`]); `None`: the cache's TTL.
    #[cfg(feature = "redis")]
    marker_not_after: Option<std::time::Instant>,
    /// In a relay batch: the batch's list of messages to mark `success`,
    /// and this call's message, added when the call ends well.
    batch_mark: Option<(std::sync::Arc<std::sync::Mutex<Vec<i64>>>, i64)>,
    /// The driving outbox message's lease, if an outbox message drives
    /// the call (the conformance trace names it; a failure booked in the
    /// call's transaction is fenced by it).
    lease: Option<Box<OutboxLease>>,
    /// A failure is booked in this transaction (see `FailureBook`,
    /// backend/types.rs): [`BODY_SAVEPOINT`] is open just after the fenced
    /// update (or, when the guard ran it, just after the guard).
    booking: bool,
    /// The fenced outbox update is left to the strategy's guard, which
    /// folds it into its first statement (see [`Call::mark_in_guard`]).
    mark_in_guard: bool,
    /// The fenced update found the message not held by this delivery:
    /// the call ends with nothing more written (dropped: rolled back).
    fence_refused: bool,
}

/// Opened just after a call's fenced outbox update when its relay books
/// failures in the call's transaction: a failure rolls back to it, keeping
/// the message's row locked, and writes the bookkeeping.
const BODY_SAVEPOINT: &str = "SAVEPOINT idem_call_body";
const BODY_ROLLBACK: &str = "ROLLBACK TO SAVEPOINT idem_call_body";

impl<DB: Backend> CallState<'_, DB> {
    /// Records a protocol event of the driving outbox message in the
    /// conformance trace (feature `testing`).
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    fn trace(&self, kind: &str, fields: impl FnOnce() -> serde_json::Value) {
        #[cfg(feature = "testing")]
        if let Some(lease) = &self.lease {
            crate::testing::trace::of_lease(kind, lease, fields);
        }
    }
}

impl<'c, DB: Backend> Call<'c, DB> {
    /// Everything before the body: the front cache's answer (never asked
    /// when an outbox message drives the call: its status must be
    /// updated), BEGIN and the fenced outbox update (see [`OutboxLease`]),
    /// then the strategy's guard. A duplicate commits here.
    pub async fn open<S, T>(
        source: Source<'c, DB>,
        key: String,
        spec: &S,
        span: Span,
    ) -> Result<Open<'c, DB, S::Guard, T>, Error>
    where
        S: Strategy<DB, T>,
    {
        // Never asked when an outbox message drives the call. Only the
        // cache field is borrowed across the await: a source on the
        // caller's connection is `Send` but not `Sync`.
        #[cfg(feature = "redis")]
        let marker = match (&source.outbox, &source.cache) {
            (None, Some(cache)) => cache.get(spec.scope(), &key).await,
            _ => None,
        };
        #[cfg(not(feature = "redis"))]
        let marker: Option<String> = None;
        if let Some(marker) = marker
            && let Some(stored) = spec.cached(&marker, &span)
        {
            cache_duplicate(&key, &span);
            return Ok(Open::Done(Outcome::Duplicate(stored)));
        }
        let mut call = Call::begin(source, key, S::NAME, spec.scope(), span, S::FOLDS_MARK).await?;
        match spec.guard(&mut call).await {
            Ok(Verdict::Run(guard)) => {
                call.state
                    .trace("guard", || serde_json::json!({ "done": false }));
                if call.state.mark_in_guard
                    && let Some(lease) = call.state.lease.take()
                {
                    let opened = call.open_booking(&lease).await;
                    call.state.lease = Some(lease);
                    opened?;
                }
                Ok(Open::Run(call.with_guard(guard)))
            }
            Ok(Verdict::Duplicate { stored, marker }) => {
                call.state
                    .trace("guard", || serde_json::json!({ "done": true }));
                call.duplicate(stored, marker).await.map(Open::Done)
            }
            // The folded fenced update refused: as in `begin`, nothing
            // more is written (the error is recorded already).
            Err(e) if call.state.fence_refused => Err(e),
            Err(e) => {
                // The state check failed (a statement error, a lost
                // connection): the call's transaction aborts.
                call.state.trace("aborted", || serde_json::json!({}));
                Err(call.abort(e).await)
            }
        }
    }

    /// Begins the call's transaction. When an outbox message drives the
    /// call, marks it `success` first, fenced by its lease: a message that
    /// is not held by this delivery fails the call before anything runs.
    #[allow(unused_variables)]
    async fn begin(
        source: Source<'c, DB>,
        key: String,
        strategy: &'static str,
        scope: &'static str,
        span: Span,
        folds: bool,
    ) -> Result<Self, Error> {
        span.record("key", key.as_str());
        #[cfg(feature = "redis")]
        let mut deferred = None;
        let mut batch_marks = None;
        let tx = match source.conn {
            Conn::Pool(pool) => match DB::begin(pool).await {
                Ok(tx) => CallTx::Own(tx),
                Err(e) => {
                    trace_aborted(source.outbox.as_ref());
                    return Err(fail(&span, Error::database(e)));
                }
            },
            // A savepoint in the caller's transaction. Dropped unfinished
            // (a cancelled call), it rolls back to the savepoint before the
            // caller's next statement, so the caller's transaction never
            // keeps half a call.
            Conn::Caller(caller) => match caller.lend().await {
                Ok(lent) => CallTx::Caller(lent),
                Err(e) => {
                    trace_aborted(source.outbox.as_ref());
                    return Err(fail(&span, e));
                }
            },
            // The same, in a relay batch's shared transaction, locked for
            // the call.
            Conn::Shared(shared) => {
                #[cfg(feature = "redis")]
                {
                    deferred = Some(shared.markers.clone());
                }
                batch_marks = Some(shared.marks.clone());
                // Never waited for: the handlers of a batch run one at a
                // time, so the only holder can be another call of the same
                // delivery (a call inside a call), which would wait forever.
                let Ok(locked) = shared.tx.clone().try_lock_owned() else {
                    let err = Error::OutboxMessage {
                        id: source.outbox.as_ref().map_or(0, OutboxLease::id),
                        reason:
                            "another call of this delivery holds the relay batch's transaction: \
                                 one call per delivery runs on its `source()`"
                                .into(),
                    };
                    return Err(fail(&span, err));
                };
                let home = caller::Home::Shared(locked);
                match caller::Lent::open(home).await {
                    Ok(lent) => CallTx::Caller(lent),
                    Err(e) => {
                        trace_aborted(source.outbox.as_ref());
                        return Err(fail(&span, e));
                    }
                }
            }
        };
        let mut call = Call {
            state: CallState {
                tx,
                key,
                span,
                strategy,
                #[cfg(feature = "redis")]
                scope,
                #[cfg(feature = "redis")]
                cache: source.cache,
                #[cfg(feature = "redis")]
                deferred,
                #[cfg(feature = "redis")]
                marker_not_after: None,
                batch_mark: None,
                lease: source.outbox.clone().map(Box::new),
                booking: false,
                mark_in_guard: false,
                fence_refused: false,
            },
            guard: (),
        };
        match (&source.outbox, batch_marks) {
            // In a relay batch, which locked its messages when it renewed
            // their leases: marked with the others at the batch's end, if
            // the call ends well.
            (Some(lease), Some(marks)) => {
                let taken = marks.lock().is_ok_and(|m| m.contains(&lease.id));
                if taken {
                    return Err(call.fail(Error::OutboxMessage {
                        id: lease.id,
                        reason: "the message is `success`, not pending".into(),
                    }));
                }
                call.state.batch_mark = Some((marks, lease.id));
            }
            // The guard runs the fenced update in its first statement:
            // one round trip fewer (PostgreSQL's state machine).
            (Some(_), None)
                if folds
                    && matches!(call.state.tx, CallTx::Own(_))
                    && DB::dialect(call.state.tx.tx_ref())
                        .sql()
                        .mark_with
                        .is_some() =>
            {
                call.state.mark_in_guard = true;
            }
            // On failure the transaction rolls back when `call` drops.
            (Some(lease), None) => {
                call.mark_outbox(lease).await?;
                call.open_booking(lease).await?;
            }
            (None, _) => {}
        }
        Ok(call)
    }

    /// The fenced outbox update: exactly one row, or the call fails.
    async fn mark_outbox(&mut self, lease: &OutboxLease) -> Result<(), Error> {
        let marked = DB::outbox_success(self.state.tx.tx(), lease).await;
        self.marked(lease, marked).await
    }

    /// The state machine's locking read; when the call left the fenced
    /// outbox update to the guard (see
    /// [`Strategy::FOLDS_MARK`](Strategy::FOLDS_MARK)),
    /// both in one statement, and a refused update fails the call as in
    /// [`Call::begin`].
    pub(crate) async fn lock_state(
        &mut self,
        sql: &StateSql,
        id: &EntityIdValue,
    ) -> Result<Option<(String, Option<String>)>, Error> {
        let folded = match (self.state.mark_in_guard, self.state.lease.as_deref()) {
            (true, Some(lease)) => DB::mark_lock_state(self.state.tx.tx(), sql, lease, id).await,
            _ => {
                return DB::lock_state(self.state.tx.tx(), sql, id)
                    .await
                    .map_err(Error::database);
            }
        };
        match folded {
            Ok((1, found)) => {
                self.state
                    .trace("fenced_update", || serde_json::json!({ "held": true }));
                Ok(found)
            }
            refused => {
                let lease = self.state.lease.clone().expect("matched above");
                let n = refused.map(|(n, _)| u64::try_from(n).unwrap_or(0));
                self.marked(&lease, n).await.map(|()| None)
            }
        }
    }

    /// What the fenced outbox update came to (`marked`: the rows it
    /// changed): `Ok` if it held, the call's error otherwise (recorded on
    /// its span; the message's state read to tell why).
    async fn marked(
        &mut self,
        lease: &OutboxLease,
        marked: Result<u64, sqlx::Error>,
    ) -> Result<(), Error> {
        if marked.as_ref().is_ok_and(|n| *n != 1) || marked.is_err() {
            self.state.fence_refused = true;
        }
        match &marked {
            Ok(n) => {
                let held = *n == 1;
                self.state
                    .trace("fenced_update", || serde_json::json!({ "held": held }));
            }
            Err(_) => self.state.trace("aborted", || serde_json::json!({})),
        }
        match marked {
            Ok(1) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(self.fail(Error::database(e))),
        }
        let found = DB::outbox_state(self.state.tx.tx(), lease.id)
            .await
            .map_err(|e| self.fail(Error::database(e)))?;
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

    /// When the relay books failures in the call's transaction: the
    /// savepoint a failure rolls back to, just after the fenced update.
    async fn open_booking(&mut self, lease: &OutboxLease) -> Result<(), Error> {
        #[cfg(feature = "testing")]
        if crate::testing::broken_failure_booking() {
            return Ok(());
        }
        if lease.book.is_none() || !matches!(self.state.tx, CallTx::Own(_)) {
            return Ok(());
        }
        if let Err(e) = DB::exec(self.state.tx.tx(), BODY_SAVEPOINT).await {
            self.state.trace("aborted", || serde_json::json!({}));
            return Err(self.fail(Error::database(e)));
        }
        self.state.booking = true;
        Ok(())
    }

    fn with_guard<G>(self, guard: G) -> Call<'c, DB, G> {
        Call {
            state: self.state,
            guard,
        }
    }
}

impl<'c, DB: Backend, G> Call<'c, DB, G> {
    /// The transaction the body runs in.
    pub fn tx(&mut self) -> &mut Transaction<'static, DB> {
        self.state.tx.tx()
    }

    /// The call's key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// Everything after the body: the strategy's bookkeeping for its
    /// result, then the commit. A body error rolls everything back (except
    /// a `unique_insert` duplicate, which commits).
    pub async fn finish<S, T, E>(self, spec: &S, body: Result<T, E>) -> Result<Outcome<T>, Error>
    where
        S: Strategy<DB, T, Guard = G>,
        E: Into<BoxError>,
    {
        let (mut call, guard) = self.take_guard();
        // The body ran (its write, whether it then failed or not).
        call.state.trace("effect", || serde_json::json!({}));
        match spec
            .settle(&mut call, guard, body.map_err(Into::into))
            .await
        {
            Ok(Settled::Executed { value, marker }) => {
                call.state
                    .trace("transition", || serde_json::json!({ "ok": true }));
                call.commit("executed", marker).await?;
                Ok(Outcome::Executed(value))
            }
            Ok(Settled::Duplicate) => call.duplicate(None, None).await,
            Err(e) => {
                // The state check failed (a statement error, a lost
                // connection): the call's transaction aborts.
                call.state.trace("aborted", || serde_json::json!({}));
                Err(call.abort(e).await)
            }
        }
    }

    fn take_guard(self) -> (Call<'c, DB>, G) {
        let call = Call {
            state: self.state,
            guard: (),
        };
        (call, self.guard)
    }

    /// Ends a call whose action already happened: commits (the driving
    /// outbox message, if any, was marked at the start), re-warming the
    /// cache with `marker` (the record strategy's fingerprint and result).
    /// Answers `Duplicate(stored)`.
    async fn duplicate<T>(
        self,
        stored: Option<T>,
        marker: Option<String>,
    ) -> Result<Outcome<T>, Error> {
        let layer = match self.state.strategy {
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
        let (cache, key, scope, deferred, not_after) = (
            self.state.cache.take(),
            std::mem::take(&mut self.state.key),
            self.state.scope,
            self.state.deferred.take(),
            self.state.marker_not_after,
        );
        #[cfg(feature = "testing")]
        let traced = self.state.lease.take();
        let CallState {
            tx,
            span,
            batch_mark,
            ..
        } = self.state;
        let nested = tx.nested();
        #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
        let at = trace_now!();
        let committed = tx.commit().await;
        #[cfg(feature = "testing")]
        let committed = match committed {
            Ok(()) if !nested && crate::testing::lose_ack() => {
                Err(crate::testing::lost_ack_error())
            }
            other => other,
        };
        #[cfg(feature = "testing")]
        if let (Some(lease), false) = (&traced, nested) {
            let result = match &committed {
                Ok(()) => "ok",
                Err(e) if crate::error::commit_outcome_unknown(e) => "lost_ack",
                Err(_) => "failed",
            };
            crate::testing::trace::of_lease(
                "commit",
                lease,
                || serde_json::json!({ "outcome": result, "dup": outcome == "duplicate", "at": at }),
            );
        }
        match committed {
            Ok(()) => {
                if let Some((marks, id)) = batch_mark
                    && let Ok(mut marks) = marks.lock()
                {
                    marks.push(id);
                }
                span.record("outcome", outcome);
                tracing::debug!(parent: &span, outcome, "idempotent call finished");
                crate::metrics::call(outcome);
                // Only now, after the commit: the marker of a rolled-back
                // call would skip the action forever. A call inside the
                // caller's transaction leaves none: its commit is not ours
                // to see.
                // A call in a relay batch leaves its marker to the relay,
                // which writes it after the batch's commit.
                // Its TTL stops at its record's expiry, if it has one.
                #[cfg(feature = "redis")]
                if let Some(cache) = cache {
                    let marker = crate::cache::Marker {
                        value: marker.unwrap_or_else(|| cache_marker::PLAIN_MARKER.to_owned()),
                        not_after,
                    };
                    if !nested {
                        cache.put(scope, &key, &marker).await;
                        #[cfg(feature = "testing")]
                        if let Some(lease) = &traced {
                            crate::testing::trace::of_lease("marker", lease, || {
                                serde_json::json!({})
                            });
                        }
                    } else if let Some(deferred) = deferred
                        && let Ok(mut markers) = deferred.lock()
                    {
                        markers.push(caller::DeferredMarker {
                            cache,
                            scope,
                            key,
                            marker,
                        });
                    }
                }
                Ok(())
            }
            // Releasing a savepoint commits nothing: a failure there leaves
            // the caller's transaction to roll back, not an unknown commit.
            Err(e) if nested => Err(fail(&span, Error::database(e))),
            Err(e) if crate::error::commit_outcome_unknown(&e) => {
                Err(fail(&span, Error::CommitUnknown(e)))
            }
            Err(e) => Err(fail(&span, Error::database(e))),
        }
    }

    async fn abort(self, err: Error) -> Error {
        let CallState {
            tx,
            span,
            lease,
            booking,
            ..
        } = self.state;
        match (tx, lease) {
            (CallTx::Own(tx), Some(lease)) if booking => {
                book_failure(tx, &lease, &err, &span).await
            }
            (tx, _) => tx.rollback().await,
        }
        fail(&span, err)
    }

    fn fail(&self, err: Error) -> Error {
        fail(&self.state.span, err)
    }
}

/// Records, for the conformance trace, that the call driven by `lease`
/// aborted before its transaction did anything (feature `testing`).
#[cfg_attr(not(feature = "testing"), allow(unused_variables))]
fn trace_aborted(lease: Option<&OutboxLease>) {
    #[cfg(feature = "testing")]
    if let Some(lease) = lease {
        crate::testing::trace::of_lease("aborted", lease, || serde_json::json!({}));
    }
}

/// A failed call's bookkeeping, in its own transaction, which still holds
/// the message's row (see `FailureBook` (backend/types.rs)):
/// back to [`BODY_SAVEPOINT`], the failure written over the call's own
/// success mark, and the commit. If any of it fails, the transaction rolls
/// back and the relay writes the failure itself, as before.
async fn book_failure<DB: Backend>(
    mut tx: Transaction<'static, DB>,
    lease: &OutboxLease,
    err: &Error,
    span: &Span,
) {
    let Some(book) = lease.book.as_ref() else {
        return;
    };
    let (dead, reason) = book.decide(
        lease.attempt,
        err.is_retryable(),
        format!("{}: {err}", err.kind()),
    );
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    let at = trace_now!();
    let written = async {
        DB::exec(&mut tx, BODY_ROLLBACK).await?;
        DB::outbox_settle_failure_in(
            &mut tx,
            true,
            lease.id,
            &lease.owner,
            lease.attempt,
            dead,
            book.delay_secs,
            &reason,
        )
        .await
    }
    .await;
    match written {
        Ok(true) => {
            trace_event!(of_lease("settle", lease, || serde_json::json!({
                "dead": dead,
                "retryable": err.is_retryable(),
                "applied": true,
                "in_tx": true,
                "at": at,
            })));
        }
        Ok(false) => {
            tracing::warn!(parent: span, "the failed call's bookkeeping found its outbox message changed; left to the relay");
            return;
        }
        Err(e) => {
            tracing::warn!(parent: span, error = %e, "the failed call's bookkeeping could not be written in its transaction; left to the relay");
            return;
        }
    }
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    let at = trace_now!();
    let committed = tx.commit().await;
    #[cfg(feature = "testing")]
    let committed = crate::testing::after_commit(crate::testing::Kind::Settle, committed);
    trace_event!(of_lease("commit", lease, || serde_json::json!({
        "outcome": match &committed {
            Ok(()) => "ok",
            Err(e) if crate::error::commit_outcome_unknown(e) => "lost_ack",
            Err(_) => "failed",
        },
        "dup": false,
        "at": at,
    })));
    match committed {
        Ok(()) => {
            book.wrote(dead);
        }
        Err(e) => {
            // Committed or not, the relay's bookkeeping finds out: its
            // fenced write, or the row already settled.
            tracing::warn!(parent: span, error = %e, "the failed call's bookkeeping did not confirm its commit; left to the relay");
        }
    }
}

fn cache_duplicate(key: &str, span: &Span) {
    span.record("key", key);
    span.record("outcome", "duplicate");
    crate::metrics::duplicate("cache");
    tracing::debug!(parent: span, layer = "cache", "duplicate stopped by the front cache");
}

fn fail(span: &Span, err: Error) -> Error {
    span.record("outcome", err.kind());
    crate::metrics::error(&err);
    tracing::debug!(parent: span, error = %err, retryable = err.is_retryable(), "idempotent call failed");
    err
}
