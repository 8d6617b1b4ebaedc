//! The fenced outbox update, when an outbox message drives the call: its
//! `success` mark in the call's transaction, held only by the delivery
//! whose lease it carries (see [`OutboxLease`]), alone or folded into the
//! state machine's locking read; and what a refused update means.

use super::{CallState, OutboxLease};
use crate::backend::{Backend, StateSql};
use crate::error::Error;
use crate::state::EntityIdValue;

impl<DB: Backend> CallState<'_, DB> {
    /// The fenced outbox update: exactly one row, or the call fails.
    pub(super) async fn mark_outbox(&mut self, lease: &OutboxLease) -> Result<(), Error> {
        let marked = crate::outbox::mark::in_call(self.tx.tx(), lease).await;
        self.marked(lease, marked).await
    }

    /// The state machine's locking read; when the call left the fenced
    /// outbox update to the guard (see
    /// [`Strategy::FOLDS_MARK`](super::Strategy::FOLDS_MARK)),
    /// both in one statement, and a refused update fails the call as in
    /// [`Call::begin`].
    pub(crate) async fn lock_state(
        &mut self,
        sql: &StateSql,
        id: &EntityIdValue,
    ) -> Result<Option<(String, Option<String>)>, Error> {
        let folded = match (self.mark_in_guard, self.lease.as_deref()) {
            (true, Some(lease)) => {
                crate::outbox::mark::with_state_lock(self.tx.tx(), sql, lease, id).await
            }
            _ => {
                return DB::lock_state(self.tx.tx(), sql, id)
                    .await
                    .map_err(Error::database);
            }
        };
        match folded {
            Ok((1, found)) => {
                self.trace("fenced_update", || serde_json::json!({ "held": true }));
                Ok(found)
            }
            refused => {
                let lease = self.lease.clone().expect("matched above");
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
            self.fence_refused = true;
        }
        match &marked {
            Ok(n) => {
                let held = *n == 1;
                self.trace("fenced_update", || serde_json::json!({ "held": held }));
            }
            Err(_) => self.trace("aborted", || serde_json::json!({})),
        }
        match marked {
            Ok(1) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(self.fail(Error::database(e))),
        }
        let found = DB::outbox_state(self.tx.tx(), lease.id)
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
}
