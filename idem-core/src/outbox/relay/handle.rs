//! A running relay's handle and its counters.

use super::Inner;
use crate::backend::Backend;
use crate::task::TaskHandle;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one relay, since it started.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Claim transactions run, empty ones included: with
    /// [`claimed`](Self::claimed), what claiming costs per message.
    pub claims: AtomicU64,
    /// Messages claimed (each claim is one attempt), recovered ones
    /// included.
    pub claimed: AtomicU64,
    /// Claimed messages that still had a lease owner: their previous
    /// lease had expired with nobody settling them (a crashed relay, a
    /// handler's bookkeeping that could not be written). Each one waited
    /// out a whole lease.
    pub reclaimed: AtomicU64,
    /// Claims whose commit failed with the outcome unknown (a lost
    /// acknowledgement: I/O error, closed connection during `COMMIT`).
    /// Only claims that chose rows count: an empty claim leases nothing.
    pub lost_claims: AtomicU64,
    /// Claims rolled back by a conflict with a concurrent transaction (a
    /// deadlock, a serialization failure, a Galera certification failure
    /// against a claim on another node), each claimed again at once (see
    /// the relay's claim spread, which makes them rare).
    pub claim_conflicts: AtomicU64,
    /// Messages read back after a lost claim (its commit had landed) and
    /// delivered at once, as claimed: no attempt burnt, no lease waited.
    pub recovered: AtomicU64,
    /// Attempts whose handler executed the action.
    pub executed: AtomicU64,
    /// Attempts answered `Duplicate`: the action had already happened.
    pub duplicates: AtomicU64,
    /// Failed attempts put back to `pending` for a retry. A handler whose
    /// commit failed with the outcome unknown is a failed attempt too; if
    /// that commit had in fact landed (the message is `success`), nothing
    /// is put back: it counts in `stale` and `landed`, not here. A handler
    /// that failed after its call marked the message counts here: that
    /// success is undone and the message retried.
    pub retried: AtomicU64,
    /// Messages dead-lettered (`failed`).
    pub dead_lettered: AtomicU64,
    /// Failed attempts whose bookkeeping found the message no longer
    /// pending under this delivery's lease (already a success, or
    /// re-leased), and relay-side success marks that found the same.
    pub stale: AtomicU64,
    /// Of the `stale` failed attempts, those whose message was a
    /// `success` although the handler reported its commit's outcome
    /// unknown (`CommitUnknown`, a lost acknowledgement): the commit had
    /// landed. No other failure is read back so.
    pub landed: AtomicU64,
    /// Batches committed (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub batches: AtomicU64,
    /// Batches whose commit failed: outcome unknown (each message read
    /// back), or refused or lost (each message delivered again, alone).
    pub lost_batches: AtomicU64,
    /// Handlers run again at once, under the same attempt, after losing a
    /// conflict with a concurrent transaction (a deadlock, a lock wait that
    /// timed out): per message, or for the message of a batch whose
    /// handler lost it (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub conflict_reruns: AtomicU64,
    /// Notifications for one of the relay's topics its listener received
    /// (see [`Relay::push_wakeup`](super::Relay::push_wakeup)); each woke
    /// the relay, or found it already awake.
    pub push_wakeups: AtomicU64,
    /// Times the relay's listener lost its connection or failed to
    /// connect (and reconnected, with back-off); polling covered the gap.
    pub listener_failures: AtomicU64,
}

/// The counters of [`RelayStats`] read at one moment, as plain numbers
/// (to log, to serialize for a dashboard, to compare two moments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
            claims: self.claims.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            lost_claims: self.lost_claims.load(Ordering::Relaxed),
            claim_conflicts: self.claim_conflicts.load(Ordering::Relaxed),
            recovered: self.recovered.load(Ordering::Relaxed),
            executed: self.executed.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            landed: self.landed.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            lost_batches: self.lost_batches.load(Ordering::Relaxed),
            conflict_reruns: self.conflict_reruns.load(Ordering::Relaxed),
            push_wakeups: self.push_wakeups.load(Ordering::Relaxed),
            listener_failures: self.listener_failures.load(Ordering::Relaxed),
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
}

impl<DB: Backend> StatsView for Inner<DB> {
    fn stats(&self) -> &RelayStats {
        &self.stats
    }
}

/// A running relay. Dropping it stops the relay as
/// [`shutdown`](Self::shutdown) does, without waiting.
#[must_use = "dropping the handle stops the relay"]
pub struct RelayHandle {
    pub(super) task: TaskHandle<()>,
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
    pub async fn shutdown(self) {
        let _ = self.task.shutdown().await;
    }

    /// The relay's counters.
    pub fn stats(&self) -> &RelayStats {
        self.relay.stats()
    }
}
