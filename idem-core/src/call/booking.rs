//! How a failed call ends: rolled back, or, when its relay books failures
//! in the call's transaction (see `FailureBook`, lease.rs), rolled
//! back to the savepoint just after the fenced update, the failure written
//! over the success mark and committed, the message's row held throughout.

use super::{CallState, CallTx, OutboxLease, fail};
use crate::backend::Backend;
use crate::error::Error;
use sqlx::Transaction;
use tracing::Span;

/// Opened just after a call's fenced outbox update when its relay books
/// failures in the call's transaction: a failure rolls back to it, keeping
/// the message's row locked, and writes the bookkeeping.
const BODY_SAVEPOINT: &str = "SAVEPOINT idem_call_body";
const BODY_ROLLBACK: &str = "ROLLBACK TO SAVEPOINT idem_call_body";

impl<DB: Backend> CallState<'_, DB> {
    /// When the relay books failures in the call's transaction: the
    /// savepoint a failure rolls back to, just after the fenced update.
    pub(super) async fn open_booking(&mut self, lease: &OutboxLease) -> Result<(), Error> {
        if crate::probe::broken(crate::probe::Break::FailureBooking) {
            return Ok(());
        }
        if lease.book.is_none() || !matches!(self.tx, CallTx::Own(_)) {
            return Ok(());
        }
        if let Err(e) = DB::exec(self.tx.tx(), BODY_SAVEPOINT).await {
            self.trace("aborted", || serde_json::json!({}));
            return Err(self.fail(Error::database(e)));
        }
        self.booking = true;
        Ok(())
    }

    /// Ends a call that failed with `err`: its failure booked in its own
    /// transaction when the relay asked for it (see [`book_failure`]),
    /// else rolled back. Returns `err`, recorded on the call's span.
    pub(super) async fn abort(self, err: Error) -> Error {
        let CallState {
            tx,
            span,
            lease,
            booking,
            ..
        } = self;
        match (tx, lease) {
            // A conflict is not booked: the relay runs the handler again
            // at once under the same attempt (see `CONFLICT_RERUNS`).
            // Nor is an outage: the relay gives the attempt back uncounted.
            (CallTx::Own(tx), Some(lease))
                if booking
                    && !crate::backend::classify::is_contention(&err)
                    && !(err.is_retryable() && err.is_outage()) =>
            {
                book_failure(tx, &lease, &err, &span).await
            }
            (tx, _) => tx.rollback().await,
        }
        fail(&span, err)
    }
}

/// A failed call's bookkeeping, in its own transaction, which still holds
/// the message's row (see `FailureBook`, lease.rs):
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
        format!("{}: {err:#}", err.kind()),
    );
    let at = crate::probe::now();
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
            crate::probe::of_lease("settle", lease, || {
                serde_json::json!({
                    "dead": dead,
                    "retryable": err.is_retryable(),
                    "applied": true,
                    "in_tx": true,
                    "at": at,
                })
            });
        }
        Ok(false) => {
            tracing::warn!(parent: span, "the failed call's bookkeeping found its outbox message changed; left to the relay");
            return;
        }
        Err(e) => {
            tracing::warn!(parent: span, error = %format_args!("{e:#}"), "the failed call's bookkeeping could not be written in its transaction; left to the relay");
            return;
        }
    }
    let at = crate::probe::now();
    let committed = tx.commit().await;
    let committed = crate::probe::after_commit(crate::probe::Commit::Settle, committed);
    crate::probe::of_lease("commit", lease, || {
        serde_json::json!({
            "outcome": match &committed {
                Ok(()) => "ok",
                Err(e) if crate::backend::classify::commit_outcome_unknown(e) => "lost_ack",
                Err(_) => "failed",
            },
            "dup": false,
            "at": at,
        })
    });
    match committed {
        Ok(()) => {
            book.wrote(dead);
        }
        Err(e) => {
            // Committed or not, the relay's bookkeeping finds out: its
            // fenced write, or the row already settled.
            tracing::warn!(parent: span, error = %format_args!("{e:#}"), "the failed call's bookkeeping did not confirm its commit; left to the relay");
        }
    }
}
