//! A running relay's handle and its counters.

use super::{Inner, StopReport};
use crate::Error;
use crate::backend::Backend;
use crate::metrics::{self, Metered};
use crate::task::{TaskError, TaskHandle, TaskStatus};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counters of one relay, since it started. Each one also counts in the
/// `metrics` facade's `idem_relay_<name>_total` (see [`crate::metrics`]).
#[derive(Debug)]
pub struct RelayStats {
    /// Claim transactions run, empty ones included: with
    /// [`claimed`](Self::claimed), what claiming costs per message.
    pub(crate) claims: Metered,
    /// Messages claimed (each claim is one attempt), recovered ones
    /// included.
    pub(crate) claimed: Metered,
    /// Claimed messages that still had a lease owner: their previous
    /// lease had expired with nobody settling them (a crashed relay, a
    /// handler's bookkeeping that could not be written). Each one waited
    /// out a whole lease.
    pub(crate) reclaimed: Metered,
    /// Claims whose commit failed with the outcome unknown (a lost
    /// acknowledgement: I/O error, closed connection during `COMMIT`).
    /// Only claims that chose rows count: an empty claim leases nothing.
    pub(crate) lost_claims: Metered,
    /// Claims rolled back by a conflict with a concurrent transaction (a
    /// deadlock, a serialization failure, a Galera certification failure
    /// against a claim on another node), each claimed again at once (see
    /// the relay's claim spread, which makes them rare).
    pub(crate) claim_conflicts: Metered,
    /// Messages read back after a lost claim (its commit had landed) and
    /// delivered at once, as claimed: no attempt burnt, no lease waited.
    pub(crate) recovered: Metered,
    /// Attempts whose handler executed the action.
    pub(crate) executed: Metered,
    /// Attempts answered `Duplicate`: the action had already happened.
    pub(crate) duplicates: Metered,
    /// Failed attempts put back to `pending` for a retry. A handler whose
    /// commit failed with the outcome unknown is a failed attempt too; if
    /// that commit had in fact landed (the message is `success`), nothing
    /// is put back: it counts in `stale` and `landed`, not here. A handler
    /// that failed after its call marked the message counts here: that
    /// success is undone and the message retried.
    pub(crate) retried: Metered,
    /// Of the `retried` attempts, those that failed in an outage (the
    /// broker or the database could not be reached:
    /// [`Error::is_outage`](crate::Error::is_outage)) and were given back
    /// uncounted, their `attempts` restored.
    pub(crate) outages: Metered,
    /// Messages dead-lettered (`failed`).
    pub(crate) dead_lettered: Metered,
    /// Failed attempts whose bookkeeping found the message no longer
    /// pending under this delivery's lease (already a success, or
    /// re-leased), and relay-side success marks that found the same.
    pub(crate) stale: Metered,
    /// Of the `stale` failed attempts, those whose message was a
    /// `success` although the handler reported its commit's outcome
    /// unknown (`CommitUnknown`, a lost acknowledgement): the commit had
    /// landed. No other failure is read back so.
    pub(crate) landed: Metered,
    /// Batches committed (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub(crate) batches: Metered,
    /// Batches whose commit failed: outcome unknown (each message read
    /// back), or refused or lost (each message delivered again, alone).
    pub(crate) lost_batches: Metered,
    /// Handlers run again at once, under the same attempt, after losing a
    /// conflict with a concurrent transaction (a deadlock, a lock wait that
    /// timed out): per message, or for the message of a batch whose
    /// handler lost it (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub(crate) conflict_reruns: Metered,
    /// Notifications for one of the relay's topics its listener received
    /// (see [`Relay::push_wakeup`](super::Relay::push_wakeup)); each woke
    /// the relay, or found it already awake.
    pub(crate) push_wakeups: Metered,
    /// Times the relay's listener lost its connection or failed to
    /// connect (and reconnected, with back-off); polling covered the gap.
    pub(crate) listener_failures: Metered,
}

impl Default for RelayStats {
    fn default() -> Self {
        RelayStats {
            claims: Metered::new(metrics::RELAY_CLAIMS),
            claimed: Metered::new(metrics::RELAY_CLAIMED),
            reclaimed: Metered::new(metrics::RELAY_RECLAIMED),
            lost_claims: Metered::new(metrics::RELAY_LOST_CLAIMS),
            claim_conflicts: Metered::new(metrics::RELAY_CLAIM_CONFLICTS),
            recovered: Metered::new(metrics::RELAY_RECOVERED),
            executed: Metered::new(metrics::RELAY_EXECUTED),
            duplicates: Metered::new(metrics::RELAY_DUPLICATES),
            retried: Metered::new(metrics::RELAY_RETRIED),
            outages: Metered::new(metrics::RELAY_OUTAGES),
            dead_lettered: Metered::new(metrics::RELAY_DEAD_LETTERED),
            stale: Metered::new(metrics::RELAY_STALE),
            landed: Metered::new(metrics::RELAY_LANDED),
            batches: Metered::new(metrics::RELAY_BATCHES),
            lost_batches: Metered::new(metrics::RELAY_LOST_BATCHES),
            conflict_reruns: Metered::new(metrics::RELAY_CONFLICT_RERUNS),
            push_wakeups: Metered::new(metrics::RELAY_PUSH_WAKEUPS),
            listener_failures: Metered::new(metrics::RELAY_LISTENER_FAILURES),
        }
    }
}

impl RelayStats {
    /// Claim transactions run, empty ones included: with
    /// [`claimed`](Self::claimed), what claiming costs per message.
    pub fn claims(&self) -> u64 {
        self.claims.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Messages claimed (each claim is one attempt), recovered ones
    /// included.
    pub fn claimed(&self) -> u64 {
        self.claimed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Claimed messages that still had a lease owner: their previous
    /// lease had expired with nobody settling them (a crashed relay, a
    /// handler's bookkeeping that could not be written). Each one waited
    /// out a whole lease.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Claims whose commit failed with the outcome unknown (a lost
    /// acknowledgement: I/O error, closed connection during `COMMIT`).
    /// Only claims that chose rows count: an empty claim leases nothing.
    pub fn lost_claims(&self) -> u64 {
        self.lost_claims.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Claims rolled back by a conflict with a concurrent transaction (a
    /// deadlock, a serialization failure, a Galera certification failure
    /// against a claim on another node), each claimed again at once (see
    /// the relay's claim spread, which makes them rare).
    pub fn claim_conflicts(&self) -> u64 {
        self.claim_conflicts
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Messages read back after a lost claim (its commit had landed) and
    /// delivered at once, as claimed: no attempt burnt, no lease waited.
    pub fn recovered(&self) -> u64 {
        self.recovered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attempts whose handler executed the action.
    pub fn executed(&self) -> u64 {
        self.executed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attempts answered `Duplicate`: the action had already happened.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Failed attempts put back to `pending` for a retry. A handler whose
    /// commit failed with the outcome unknown is a failed attempt too; if
    /// that commit had in fact landed (the message is `success`), nothing
    /// is put back: it counts in `stale` and `landed`, not here. A handler
    /// that failed after its call marked the message counts here: that
    /// success is undone and the message retried.
    pub fn retried(&self) -> u64 {
        self.retried.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Of the [`retried`](Self::retried) attempts, those that failed in an
    /// outage and were given back uncounted (see
    /// [`Relay::outage_retry`](super::Relay::outage_retry)).
    pub fn outages(&self) -> u64 {
        self.outages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Messages dead-lettered (`failed`).
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Failed attempts whose bookkeeping found the message no longer
    /// pending under this delivery's lease (already a success, or
    /// re-leased), and relay-side success marks that found the same.
    pub fn stale(&self) -> u64 {
        self.stale.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Of the `stale` failed attempts, those whose message was a
    /// `success` although the handler reported its commit's outcome
    /// unknown (`CommitUnknown`, a lost acknowledgement): the commit had
    /// landed. No other failure is read back so.
    pub fn landed(&self) -> u64 {
        self.landed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Batches committed (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub fn batches(&self) -> u64 {
        self.batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Batches whose commit failed: outcome unknown (each message read
    /// back), or refused or lost (each message delivered again, alone).
    pub fn lost_batches(&self) -> u64 {
        self.lost_batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Handlers run again at once, under the same attempt, after losing a
    /// conflict with a concurrent transaction (a deadlock, a lock wait that
    /// timed out): per message, or for the message of a batch whose
    /// handler lost it (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub fn conflict_reruns(&self) -> u64 {
        self.conflict_reruns
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notifications for one of the relay's topics its listener received
    /// (see [`Relay::push_wakeup`](super::Relay::push_wakeup)); each woke
    /// the relay, or found it already awake.
    pub fn push_wakeups(&self) -> u64 {
        self.push_wakeups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Times the relay's listener lost its connection or failed to
    /// connect (and reconnected, with back-off); polling covered the gap.
    pub fn listener_failures(&self) -> u64 {
        self.listener_failures
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The counters of [`RelayStats`] read at one moment, as plain numbers
/// (to log, to serialize for a dashboard, to compare two moments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RelayStatsSnapshot {
    /// See [`RelayStats::claims`].
    pub claims: u64,
    /// See [`RelayStats::claimed`].
    pub claimed: u64,
    /// See [`RelayStats::reclaimed`].
    pub reclaimed: u64,
    /// See [`RelayStats::lost_claims`].
    pub lost_claims: u64,
    /// See [`RelayStats::claim_conflicts`].
    pub claim_conflicts: u64,
    /// See [`RelayStats::recovered`].
    pub recovered: u64,
    /// See [`RelayStats::executed`].
    pub executed: u64,
    /// See [`RelayStats::duplicates`].
    pub duplicates: u64,
    /// See [`RelayStats::retried`].
    pub retried: u64,
    /// See [`RelayStats::outages`].
    pub outages: u64,
    /// See [`RelayStats::dead_lettered`].
    pub dead_lettered: u64,
    /// See [`RelayStats::stale`].
    pub stale: u64,
    /// See [`RelayStats::landed`].
    pub landed: u64,
    /// See [`RelayStats::batches`].
    pub batches: u64,
    /// See [`RelayStats::lost_batches`].
    pub lost_batches: u64,
    /// See [`RelayStats::conflict_reruns`].
    pub conflict_reruns: u64,
    /// See [`RelayStats::push_wakeups`].
    pub push_wakeups: u64,
    /// See [`RelayStats::listener_failures`].
    pub listener_failures: u64,
}

impl RelayStats {
    /// Every counter, read now (each read on its own: counters moving
    /// meanwhile may be a few counts apart).
    pub fn snapshot(&self) -> RelayStatsSnapshot {
        RelayStatsSnapshot {
            claims: self.claims(),
            claimed: self.claimed(),
            reclaimed: self.reclaimed(),
            lost_claims: self.lost_claims(),
            claim_conflicts: self.claim_conflicts(),
            recovered: self.recovered(),
            executed: self.executed(),
            duplicates: self.duplicates(),
            retried: self.retried(),
            outages: self.outages(),
            dead_lettered: self.dead_lettered(),
            stale: self.stale(),
            landed: self.landed(),
            batches: self.batches(),
            lost_batches: self.lost_batches(),
            conflict_reruns: self.conflict_reruns(),
            push_wakeups: self.push_wakeups(),
            listener_failures: self.listener_failures(),
        }
    }
}

impl RelayStatsSnapshot {
    /// What was counted between `earlier` and this snapshot.
    pub fn since(&self, earlier: &RelayStatsSnapshot) -> RelayStatsSnapshot {
        RelayStatsSnapshot {
            claims: self.claims.saturating_sub(earlier.claims),
            claimed: self.claimed.saturating_sub(earlier.claimed),
            reclaimed: self.reclaimed.saturating_sub(earlier.reclaimed),
            lost_claims: self.lost_claims.saturating_sub(earlier.lost_claims),
            claim_conflicts: self.claim_conflicts.saturating_sub(earlier.claim_conflicts),
            recovered: self.recovered.saturating_sub(earlier.recovered),
            executed: self.executed.saturating_sub(earlier.executed),
            duplicates: self.duplicates.saturating_sub(earlier.duplicates),
            retried: self.retried.saturating_sub(earlier.retried),
            outages: self.outages.saturating_sub(earlier.outages),
            dead_lettered: self.dead_lettered.saturating_sub(earlier.dead_lettered),
            stale: self.stale.saturating_sub(earlier.stale),
            landed: self.landed.saturating_sub(earlier.landed),
            batches: self.batches.saturating_sub(earlier.batches),
            lost_batches: self.lost_batches.saturating_sub(earlier.lost_batches),
            conflict_reruns: self.conflict_reruns.saturating_sub(earlier.conflict_reruns),
            push_wakeups: self.push_wakeups.saturating_sub(earlier.push_wakeups),
            listener_failures: self
                .listener_failures
                .saturating_sub(earlier.listener_failures),
        }
    }
}

impl<DB: Backend> Inner<DB> {
    pub(super) fn stats_owner(self: &Arc<Self>) -> Arc<dyn StatsView> {
        self.clone()
    }
}

pub(super) trait StatsView: Send + Sync {
    fn stats(&self) -> &RelayStats;

    /// The messages claimed and not yet settled, in id order.
    fn in_flight(&self) -> Vec<i64>;

    /// After an abort: the messages it abandoned, forgotten.
    fn abandon(&self) -> Vec<i64>;
}

impl<DB: Backend> StatsView for Inner<DB> {
    fn stats(&self) -> &RelayStats {
        &self.stats
    }

    fn in_flight(&self) -> Vec<i64> {
        self.in_flight.ids()
    }

    fn abandon(&self) -> Vec<i64> {
        self.in_flight.abandon()
    }
}

/// A running relay. Dropping it stops the relay as
/// [`shutdown`](Self::shutdown) does, without waiting.
#[must_use = "dropping the handle stops the relay"]
pub struct RelayHandle {
    pub(super) task: TaskHandle<Result<(), Error>>,
    pub(super) relay: Arc<dyn StatsView>,
}

impl fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayHandle")
            .field("task", &self.task)
            .field("stats", self.relay.stats())
            .finish()
    }
}

impl RelayHandle {
    /// Stops claiming, waits for the messages in flight, and returns.
    /// (While the database is failing over, an attempt's bookkeeping is
    /// retried for up to half the lease, so the wait can be that long.)
    ///
    /// A relay that had ended by itself (its schema refused, a panic) is
    /// logged at error level here, with the reason: `shutdown` returns
    /// nothing, for the many callers written before the relay could fail.
    /// To get the failure as a `Result`, with a report and a bound on the
    /// wait, use [`shutdown_within`](Self::shutdown_within).
    pub async fn shutdown(self) {
        match self.task.shutdown().await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the outbox relay had failed"),
            Err(e) => tracing::error!(
                panic = %TaskError::from_join(e),
                "the outbox relay's task had panicked"
            ),
        }
    }

    /// Stops claiming, waits at most `deadline` for the messages in flight
    /// to settle, then aborts the handlers still running (or waiting for a
    /// slot), and reports what finished and what was abandoned.
    ///
    /// Nothing is lost by the abort: a handler's transaction that did not
    /// commit rolls back, and the abandoned messages are claimed again (by
    /// this relay restarted, or another) once their leases run out, where
    /// the `#[idempotent]` handler acts once whatever the attempts. What an
    /// outage left to give back is given back only if the relay stopped
    /// before the deadline; otherwise those leases run out as well.
    ///
    /// An `Err` if the relay had ended by itself: with its error (a
    /// refused schema: [`TaskError::Failed`]) or its panic
    /// ([`TaskError::Panicked`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # idem_runtime::migrate(&pool).await?;
    /// use idem_runtime::{outbox::Relay, Outcome};
    /// use std::time::Duration;
    /// let relay = Relay::new(pool)
    ///     .route("mail.send", |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) })
    ///     .spawn();
    /// // … on SIGTERM, with the orchestrator's grace period in mind:
    /// let report = relay.shutdown_within(Duration::from_secs(20)).await?;
    /// println!("{} finished, abandoned {:?}", report.finished, report.abandoned);
    /// # Ok(()) }
    /// ```
    pub async fn shutdown_within(self, deadline: Duration) -> Result<StopReport, TaskError> {
        let RelayHandle { task, relay } = self;
        let started = Instant::now();
        let in_flight = relay.in_flight().len();
        let ended = task.shutdown_within(deadline).await?;
        let abandoned = match ended {
            Some(Ok(())) => Vec::new(),
            Some(Err(e)) => return Err(TaskError::Failed(e)),
            // Aborted: what it had not settled stays in the set.
            None => relay.abandon(),
        };
        Ok(StopReport {
            elapsed: started.elapsed(),
            finished: in_flight.saturating_sub(abandoned.len()),
            abandoned,
            stats: relay.stats().snapshot(),
        })
    }

    /// Stops the relay gracefully (as [`shutdown`](Self::shutdown), without
    /// waiting) once `signal` completes: see
    /// [`Relay::spawn_until`](super::Relay::spawn_until).
    pub fn stop_on<S>(self, signal: S) -> Self
    where
        S: Future + Send + 'static,
    {
        self.task.stop_on(signal);
        self
    }

    /// Asks the relay to stop (claim nothing more, finish what is in
    /// flight) without waiting: [`status`](Self::status) says
    /// [`TaskStatus::Stopping`], then [`TaskStatus::Stopped`].
    pub fn stop(&self) {
        self.task.stop();
    }

    /// Where the relay stands: running, stopping, stopped, or how it ended
    /// by itself (failed with its error, panicked with its message). For a
    /// readiness probe: [`TaskStatus::is_running`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # idem_runtime::migrate(&pool).await?;
    /// use idem_runtime::{outbox::Relay, task::TaskStatus, Outcome};
    /// let relay = Relay::new(pool)
    ///     .route("mail.send", |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) })
    ///     .spawn();
    /// let ready = relay.status().is_running(); // the probe's answer
    /// assert!(ready);
    /// relay.stop();
    /// relay.finished().await;
    /// assert_eq!(relay.status(), TaskStatus::Stopped);
    /// # Ok(()) }
    /// ```
    pub fn status(&self) -> TaskStatus {
        self.task.status()
    }

    /// Whether the relay's task has ended (stopped, failed or panicked).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until the relay's task has ended, without asking it to stop.
    pub async fn finished(&self) {
        self.task.finished().await;
    }

    /// The relay's counters.
    pub fn stats(&self) -> &RelayStats {
        self.relay.stats()
    }
}
