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
//!
//! Beside the protocol: what it asks of a strategy (`strategy.rs`; the
//! three implementations are `crate::strategy`'s), the fenced outbox
//! update (`fence.rs`), the commit point (`commit.rs`), how a failed call
//! ends (`booking.rs`), the caller's transaction a call may run in
//! (`caller.rs`) and where a call comes from (`source.rs`): `Call`'s own
//! methods are all here, and the steps (the fenced update, the commit,
//! the booking of a failure, the cache marker) are methods of the
//! `CallState` they work on, in their files.

mod booking;
mod cache_marker;
mod caller;
mod commit;
mod fence;
mod front;
mod outcome;
mod source;
mod strategy;

pub(crate) use crate::lease::OutboxLease;
pub use caller::CallerTx;
pub(crate) use caller::{BARE_BATCH_UNDONE, SharedTx};
pub use outcome::Outcome;
use source::Conn;
pub use source::Source;

pub(crate) use cache_marker::{replay_marker, replay_of};
pub use strategy::Strategy;
pub(crate) use strategy::sealed::Sealed;
pub(crate) use strategy::{Booked, Guarded};

use crate::backend::Backend;
use crate::error::{BoxError, Error};
use sqlx::Transaction;
use tracing::Span;

/// What [`Call::open`] found.
// `Run` is the path of every first delivery and is taken apart at once by
// the expansion: boxing it would cost an allocation per call to save a
// few bytes on the stack of a duplicate.
#[allow(clippy::large_enum_variant)]
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
            CallTx::Caller(lent)
                if lent.shared() && crate::probe::broken(crate::probe::Break::BatchSavepoints) =>
            {
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
    /// The front cache's marker, written after the commit.
    front: front::MarkerHook,
    /// In a relay batch: the batch's list of messages to mark `success`,
    /// and this call's message, added when the call ends well.
    batch_mark: Option<(std::sync::Arc<std::sync::Mutex<Vec<i64>>>, i64)>,
    /// The driving outbox message's lease, if an outbox message drives
    /// the call (the conformance trace names it; a failure booked in the
    /// call's transaction is fenced by it).
    lease: Option<Box<OutboxLease>>,
    /// A failure is booked in this transaction (see `FailureBook`,
    /// backend/types.rs): `BODY_SAVEPOINT` (booking.rs) is open just after
    /// the fenced update (or, when the guard ran it, just after the guard).
    booking: bool,
    /// The fenced outbox update is left to the strategy's guard, which
    /// folds it into its first statement (see [`CallState::lock_state`]).
    mark_in_guard: bool,
    /// The fenced update found the message not held by this delivery:
    /// the call ends with nothing more written (dropped: rolled back).
    fence_refused: bool,
}

impl<DB: Backend> CallState<'_, DB> {
    /// Records a protocol event of the driving outbox message in the
    /// conformance trace (see [`crate::probe`]).
    fn trace(&self, kind: &str, fields: impl FnOnce() -> serde_json::Value) {
        if let Some(lease) = &self.lease {
            crate::probe::of_lease(kind, lease, fields);
        }
    }

    /// `err`, recorded on the call's span (see [`fail`]).
    fn fail(&self, err: Error) -> Error {
        fail(&self.span, err)
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
        let marker = match &source.outbox {
            None => source.cache.lookup(spec.scope(), &key).await,
            Some(_) => None,
        };
        if let Some(marker) = marker
            && let Some(stored) = spec.cached(&marker, &span)
        {
            cache_duplicate(&key, &span);
            return Ok(Open::Done(Outcome::Duplicate(stored)));
        }
        let mut call = Call::begin(source, key, S::NAME, spec.scope(), span, S::FOLDS_MARK).await?;
        match spec.guard(&mut call).await {
            Ok(Guarded::Run(guard)) => {
                call.state
                    .trace("guard", || serde_json::json!({ "done": false }));
                if call.state.mark_in_guard
                    && let Some(lease) = call.state.lease.take()
                {
                    let opened = call.state.open_booking(&lease).await;
                    call.state.lease = Some(lease);
                    opened?;
                }
                Ok(Open::Run(call.with_guard(guard)))
            }
            Ok(Guarded::Duplicate { stored, marker }) => {
                call.state
                    .trace("guard", || serde_json::json!({ "done": true }));
                call.state.duplicate(stored, marker).await.map(Open::Done)
            }
            // The folded fenced update refused: as in `begin`, nothing
            // more is written (the error is recorded already).
            Err(e) if call.state.fence_refused => Err(e),
            Err(e) => {
                // The state check failed (a statement error, a lost
                // connection): the call's transaction aborts.
                call.state.trace("aborted", || serde_json::json!({}));
                Err(call.state.abort(e).await)
            }
        }
    }

    /// Begins the call's transaction. When an outbox message drives the
    /// call, marks it `success` first, fenced by its lease: a message that
    /// is not held by this delivery fails the call before anything runs.
    async fn begin(
        source: Source<'c, DB>,
        key: String,
        strategy: &'static str,
        scope: &'static str,
        span: Span,
        folds: bool,
    ) -> Result<Self, Error> {
        span.record("key", key.as_str());
        let mut batch = None;
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
                batch = Some(shared.cache_markers.clone());
                batch_marks = Some(shared.success_marks.clone());
                lend_shared(&shared, source.outbox.as_ref(), &span).await?
            }
        };
        let call = Call {
            state: CallState {
                tx,
                key,
                span,
                strategy,
                front: front::MarkerHook::new(source.cache, scope, batch),
                batch_mark: None,
                lease: source.outbox.clone().map(Box::new),
                booking: false,
                mark_in_guard: false,
                fence_refused: false,
            },
            guard: (),
        };
        call.fence_outbox(source.outbox.as_ref(), batch_marks, folds)
            .await
    }

    /// When an outbox message drives the call: its `success` mark, fenced
    /// by its lease (or, in a relay batch, left to the batch's end). On
    /// failure the transaction rolls back as the call drops.
    async fn fence_outbox(
        mut self,
        outbox: Option<&OutboxLease>,
        batch_marks: Option<std::sync::Arc<std::sync::Mutex<Vec<i64>>>>,
        folds: bool,
    ) -> Result<Self, Error> {
        match (outbox, batch_marks) {
            // In a relay batch, which locked its messages when it renewed
            // their leases: marked with the others at the batch's end, if
            // the call ends well.
            (Some(lease), Some(marks)) => {
                let taken = marks.lock().is_ok_and(|m| m.contains(&lease.id));
                if taken {
                    return Err(self.fail(Error::OutboxMessage {
                        id: lease.id,
                        reason: "the message is `success`, not pending".into(),
                    }));
                }
                self.state.batch_mark = Some((marks, lease.id));
            }
            // The guard runs the fenced update in its first statement:
            // one round trip fewer (PostgreSQL's state machine).
            (Some(_), None)
                if folds
                    && matches!(self.state.tx, CallTx::Own(_))
                    && DB::dialect(self.state.tx.tx_ref())
                        .sql()
                        .mark_with
                        .is_some() =>
            {
                self.state.mark_in_guard = true;
            }
            (Some(lease), None) => {
                self.state.mark_outbox(lease).await?;
                self.state.open_booking(lease).await?;
            }
            (None, _) => {}
        }
        Ok(self)
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
            Ok(Booked::Executed { value, marker }) => {
                call.state
                    .trace("transition", || serde_json::json!({ "ok": true }));
                call.state.commit("executed", marker).await?;
                Ok(Outcome::Executed(value))
            }
            Ok(Booked::Duplicate) => call.state.duplicate(None, None).await,
            Err(e) => {
                // The state check failed (a statement error, a lost
                // connection): the call's transaction aborts.
                call.state.trace("aborted", || serde_json::json!({}));
                Err(call.state.abort(e).await)
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

    fn fail(&self, err: Error) -> Error {
        self.state.fail(err)
    }
}

/// The call's savepoint in a relay batch's shared transaction, locked for
/// the call. Never waited for: the handlers of a batch run one at a time,
/// so the only holder can be another call of the same delivery (a call
/// inside a call), which would wait forever.
async fn lend_shared<'c, DB: Backend>(
    shared: &caller::SharedTx<DB>,
    outbox: Option<&OutboxLease>,
    span: &Span,
) -> Result<CallTx<'c, DB>, Error> {
    let Ok(locked) = shared.tx.clone().try_lock_owned() else {
        let err = Error::OutboxMessage {
            id: outbox.map_or(0, OutboxLease::id),
            reason: "another call of this delivery holds the relay batch's transaction: \
                     one call per delivery runs on its `source()`"
                .into(),
        };
        return Err(fail(span, err));
    };
    match caller::Lent::open(caller::Home::Shared(locked)).await {
        Ok(lent) => Ok(CallTx::Caller(lent)),
        Err(e) => {
            trace_aborted(outbox);
            Err(fail(span, e))
        }
    }
}

/// Records, for the conformance trace, that the call driven by `lease`
/// aborted before its transaction did anything (see [`crate::probe`]).
fn trace_aborted(lease: Option<&OutboxLease>) {
    if let Some(lease) = lease {
        crate::probe::of_lease("aborted", lease, || serde_json::json!({}));
    }
}

fn cache_duplicate(key: &str, span: &Span) {
    span.record("key", key);
    span.record("outcome", "duplicate");
    crate::metrics::duplicate("cache");
    tracing::debug!(parent: span, layer = "cache", "duplicate stopped by the front cache");
}

fn fail(span: &Span, err: Error) -> Error {
    span.record("outcome", err.kind().as_str());
    crate::metrics::error(&err);
    tracing::debug!(parent: span, error = %format_args!("{err:#}"), retryable = err.is_retryable(), "idempotent call failed");
    err
}
