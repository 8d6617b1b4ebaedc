//! How a call that ends well ends, executed or a duplicate: its one commit
//! point (or, inside the caller's transaction, the savepoint's release),
//! the lost acknowledgement a probe may inject there, the relay
//! batch's mark, and the front cache's marker, written only once
//! committed. A failed call ends in `booking.rs`.

use super::{CallState, Outcome, fail};
use crate::backend::Backend;
use crate::error::Error;

impl<DB: Backend> CallState<'_, DB> {
    /// Ends a call whose action already happened: commits (the driving
    /// outbox message, if any, was marked at the start), re-warming the
    /// cache with `marker` (the record strategy's fingerprint and result).
    /// Answers `Duplicate(stored)`.
    pub(super) async fn duplicate<T>(
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

    /// The call's one commit point (see the module documentation):
    /// `outcome` names it in the logs and metrics, `marker` is the front
    /// cache's, written once committed.
    pub(super) async fn commit(
        mut self,
        outcome: &'static str,
        marker: Option<String>,
    ) -> Result<(), Error> {
        // A failure here is ambiguous: the server may have committed and
        // the acknowledgement been lost. Report it as such; a retry is safe.
        let traced = self.lease.take();
        let CallState {
            tx,
            key,
            span,
            front,
            batch_mark,
            ..
        } = self;
        let nested = tx.nested();
        let at = crate::probe::now();
        let committed = tx.commit().await;
        // Releasing a savepoint commits nothing: no acknowledgement to lose.
        let committed = match nested {
            true => committed,
            false => crate::probe::after_commit(crate::probe::Commit::Call, committed),
        };
        if let (Some(lease), false) = (&traced, nested) {
            let result = match &committed {
                Ok(()) => "ok",
                Err(e) if crate::backend::classify::commit_outcome_unknown(e) => "lost_ack",
                Err(_) => "failed",
            };
            crate::probe::of_lease(
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
                // to see. A call in a relay batch leaves its marker to the
                // relay, which writes it after the batch's commit. Its TTL
                // stops at its record's expiry, if it has one.
                let wrote = front.committed(key, marker, nested).await;
                if let (true, Some(lease)) = (wrote, &traced) {
                    crate::probe::of_lease("marker", lease, || serde_json::json!({}));
                }
                Ok(())
            }
            // Releasing a savepoint commits nothing: a failure there leaves
            // the caller's transaction to roll back, not an unknown commit.
            Err(e) if nested => Err(fail(&span, Error::database(e))),
            Err(e) if crate::backend::classify::commit_outcome_unknown(&e) => {
                Err(fail(&span, Error::CommitUnknown(e)))
            }
            Err(e) => Err(fail(&span, Error::database(e))),
        }
    }
}
