//! A spawned relay's life: the schema it checks before its first claim,
//! the messages it has in flight (what a shutdown at a deadline abandons),
//! the back-off of its failing claims, and what its shutdown reports.

use super::{Inner, RelayStatsSnapshot};
use crate::Error;
use crate::backend::Backend;
use crate::backoff::{Backoff, FailureLog};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;

/// The longest wait between two claims while claims fail (or the poll
/// interval, if longer).
const MAX_CLAIM_BACKOFF: Duration = Duration::from_secs(5);

/// What a relay's [`shutdown_within`](super::RelayHandle::shutdown_within)
/// (or [`Relay::run_until`](super::Relay::run_until)) did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct StopReport {
    /// From the stop request to the relay's end.
    pub elapsed: Duration,
    /// Messages in flight (claimed, not yet settled) when the stop was
    /// asked that settled before the deadline.
    pub finished: usize,
    /// The ids of the messages whose handlers were still running (or
    /// waiting for a slot) at the deadline and were aborted, in id order.
    /// Nothing of theirs is lost: a handler's transaction that did not
    /// commit rolls back, and each message is claimed again (by this relay
    /// restarted, or another) once its lease runs out; the `#[idempotent]`
    /// handler acts once whatever the attempts.
    pub abandoned: Vec<i64>,
    /// What the relay counted since it started.
    pub stats: RelayStatsSnapshot,
}

/// The messages a relay has claimed and not yet settled.
#[derive(Debug, Default)]
pub(super) struct InFlight(Mutex<BTreeSet<i64>>);

impl InFlight {
    /// `ids` claimed: in flight until [`settled`](Self::settled).
    pub(super) fn claimed(&self, ids: impl IntoIterator<Item = i64>) {
        self.lock().extend(ids);
    }

    /// `ids` settled (or given back). A delivery aborted at a shutdown's
    /// deadline never gets here: its ids stay, for the report.
    pub(super) fn settled(&self, ids: &[i64]) {
        let mut set = self.lock();
        for id in ids {
            set.remove(id);
        }
    }

    /// The messages of deliveries aborted at a shutdown's deadline, in id
    /// order, forgotten (a relay spawned again from a clone of the same
    /// `Relay` starts with none).
    pub(super) fn abandon(&self) -> Vec<i64> {
        std::mem::take(&mut *self.lock()).into_iter().collect()
    }

    /// The messages in flight now, in id order.
    pub(super) fn ids(&self) -> Vec<i64> {
        self.lock().iter().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<i64>> {
        // A set of ids stays consistent through a panic.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a spawned relay's claims are failing (see [`FailureLog`]): a
/// warning when they start failing, with the error; an info line when
/// they succeed again; a back-off between the failing claims, from the
/// poll interval, doubling, capped at 5 s or the poll interval if longer.
pub(super) fn claim_health(poll: Duration) -> FailureLog {
    FailureLog::new(
        "outbox claims",
        Backoff::new(poll, poll.max(MAX_CLAIM_BACKOFF)),
    )
}

impl<DB: Backend> Inner<DB> {
    /// Checks the database's schema once per relay (see
    /// [`check_schema`](crate::check_schema)): a refusal is an
    /// [`Error::Config`]; any other error (the database unreachable) is
    /// returned as is, to be checked again.
    pub(super) async fn schema_checked(&self) -> Result<(), Error> {
        if self.schema_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        crate::check_schema(&self.pool).await?;
        self.schema_ok.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Before a spawned relay's first claim: its schema checked, waiting
    /// out an unreachable database (backing off, logged once). `Ok(false)`:
    /// stopped meanwhile; `Err`: refused (no idem tables, an older schema),
    /// which ends the relay with that error.
    pub(super) async fn schema_ready(
        &self,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, Error> {
        let mut health = FailureLog::new(
            "idem schema checks",
            Backoff::new(
                self.policy.poll_interval,
                self.policy.poll_interval.max(MAX_CLAIM_BACKOFF),
            ),
        );
        loop {
            if *stop.borrow() {
                return Ok(false);
            }
            match self.schema_checked().await {
                Ok(()) => {
                    health.succeeded();
                    return Ok(true);
                }
                Err(e @ Error::Config { .. }) => {
                    tracing::error!(error = %e, "the outbox relay refuses to start");
                    return Err(e);
                }
                Err(e) => health.failed(&e),
            }
            let wait = health.backoff().unwrap_or_default();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                changed = stop.changed() => if changed.is_err() { return Ok(false) },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlight, claim_health};
    use std::time::Duration;

    #[test]
    fn failing_claims_back_off_to_a_cap() {
        let mut h = claim_health(Duration::from_millis(100));
        assert_eq!(h.backoff(), None);
        let e = crate::Error::retryable("down");
        let waits: Vec<_> = (0..8)
            .map(|_| {
                h.failed(&e);
                h.backoff().unwrap().as_millis()
            })
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        h.succeeded();
        assert_eq!(h.backoff(), None);
        let slow = Duration::from_secs(10);
        let mut h = claim_health(slow);
        h.failed(&e);
        h.failed(&e);
        assert_eq!(h.backoff(), Some(slow), "never below the poll interval");
    }

    #[test]
    fn in_flight_keeps_what_was_not_settled() {
        let f = InFlight::default();
        f.claimed([3, 1, 2]);
        f.settled(&[1]);
        assert_eq!(f.ids(), [2, 3]);
        assert_eq!(f.abandon(), [2, 3]);
        assert!(f.ids().is_empty());
    }
}
