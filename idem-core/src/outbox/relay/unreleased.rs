//! Attempts that failed in an outage and whose release could not be
//! written: the database was down longer than the bookkeeping's retries.
//!
//! Left alone, such a message waits out its lease and the next claim
//! counts it again (a claim increments `attempts`): every outage longer
//! than the bookkeeping's retries would spend an attempt of each message
//! in flight, and a few of them would dead-letter a healthy message. So
//! the relay keeps each one (its lease, in memory) and writes its release
//! before each of its claims once the database answers again: fenced by
//! the lease owner and the attempt, as the first try was, it restores the
//! attempt unless another relay took the message over meanwhile (which
//! counts it, as any take-over of an expired lease does) or the message
//! was settled.
//!
//! A claim that began before such an attempt failed (it waited for a
//! connection through the outage) can still take the message once the
//! database is back, its lease run out: that claim counts the attempt the
//! release was to give back. So each claim's rows are matched against the
//! kept releases as soon as it returns, and the outage attempt of a
//! message taken that way is taken back under the claim's own lease (its
//! owner and attempt the fence), the claim running it as the next one.

use super::Inner;
use super::claim::Batch;
use crate::backend::{Backend, OutboxRow};
use crate::lease::OutboxLease;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// One release to write again.
#[derive(Debug)]
struct Release {
    lease: OutboxLease,
    owner: String,
    delay_secs: f64,
    reason: String,
}

/// The releases a relay still has to write (see the [module](self)).
#[derive(Debug, Default)]
pub(super) struct Unreleased {
    kept: Mutex<Vec<Release>>,
}

impl Unreleased {
    fn take(&self) -> Vec<Release> {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes the kept releases of the messages among `rows` whose claim
    /// came right after the kept attempt (its attempt the next one): the
    /// claim took them over from the outage attempt and nobody else did.
    fn take_reclaimed(&self, rows: &[OutboxRow]) -> Vec<Release> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (taken, left) = std::mem::take(&mut *kept).into_iter().partition(|r| {
            rows.iter()
                .any(|row| row.id == r.lease.id() && row.attempts == r.lease.attempt() + 1)
        });
        *kept = left;
        taken
    }

    fn put_back(&self, left: Vec<Release>) {
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(left);
    }
}

impl<DB: Backend> Inner<DB> {
    /// Keeps the release of the outage attempt `lease` (owner `owner`),
    /// which could not be written, for [`release_kept`](Self::release_kept).
    pub(super) fn keep_release(
        &self,
        lease: &OutboxLease,
        owner: &str,
        delay_secs: f64,
        reason: &str,
    ) {
        self.unreleased.put_back(vec![Release {
            lease: lease.clone(),
            owner: owner.to_owned(),
            delay_secs,
            reason: reason.to_owned(),
        }]);
    }

    /// Writes the kept releases, oldest first, until one fails with a
    /// transient error (the database is still down: the rest wait for the
    /// next round). Run before each claim, which waits while any is left
    /// (`false`): a claim that got through just after a release failed (the
    /// database coming back between the two) would take the message over
    /// its run-out lease and count the attempt.
    pub(super) async fn release_kept(&self) -> bool {
        let kept = self.unreleased.take();
        if kept.is_empty() {
            return true;
        }
        let mut left = Vec::new();
        for r in kept {
            if !left.is_empty() {
                left.push(r);
                continue;
            }
            let (id, attempts) = (r.lease.id(), r.lease.attempt());
            let released =
                DB::outbox_release(&self.pool, id, &r.owner, attempts, r.delay_secs, &r.reason)
                    .await;
            crate::probe::of_lease("settle", &r.lease, || {
                serde_json::json!({
                    "dead": false,
                    "retryable": true,
                    "outage": true,
                    "applied": matches!(released, Ok(true)),
                    "error": released.is_err(),
                    "at": crate::probe::now(),
                })
            });
            match released {
                Ok(true) => {
                    self.stats.outages.fetch_add(1, Ordering::Relaxed);
                    self.stats.retried.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::outbox_retry(r.lease.topic());
                    tracing::info!(
                        id,
                        attempts,
                        "outbox attempt that failed in an outage given back after the outage; not counted"
                    );
                }
                // Taken over by another relay, or settled: its holder
                // settles it.
                Ok(false) => {}
                Err(e) if crate::backend::classify::is_transient(&e) => left.push(r),
                Err(e) => {
                    tracing::warn!(id, error = %format_args!("{e:#}"), "could not give back an outbox attempt that failed in an outage; its lease runs out and the next claim counts it");
                }
            }
        }
        let written = left.is_empty();
        self.unreleased.put_back(left);
        written
    }
}

impl<DB: Backend> Inner<DB> {
    /// Takes back the outage attempt of each message of `batch` that its
    /// claim took over from an outage attempt of this relay whose release
    /// is still kept (see the [module](self)): the claim keeps the message
    /// and runs it as the attempt the outage left (`attempts - 1`), and the
    /// kept release, whose fence the claim moved, is dropped. A message
    /// whose attempt cannot be taken back is delivered with it counted.
    pub(super) async fn uncount_reclaimed(&self, mut batch: Batch) -> Batch {
        if crate::probe::broken(crate::probe::Break::ReclaimCounted) {
            return batch;
        }
        for r in self.unreleased.take_reclaimed(&batch.rows) {
            let id = r.lease.id();
            let Some(row) = batch.rows.iter_mut().find(|row| row.id == id) else {
                continue;
            };
            match DB::outbox_uncount(&self.pool, id, &batch.owner, row.attempts).await {
                Ok(true) => {
                    row.attempts -= 1;
                    self.stats.outages.fetch_add(1, Ordering::Relaxed);
                    self.stats.retried.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::outbox_retry(&row.topic);
                    tracing::info!(
                        id,
                        attempts = row.attempts,
                        "outbox attempt that failed in an outage taken back by the claim that took its message over; not counted"
                    );
                }
                // Not held by this claim after all: its delivery is fenced.
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(id, error = %format_args!("{e:#}"), reason = %r.reason, "could not take back an outbox attempt that failed in an outage; counted");
                }
            }
        }
        batch
    }
}
