//! One attempt of one message: the handler run under a renewed lease,
//! then the bookkeeping (success, retry with back-off, or dead letter).

use super::{Delivery, Inner, Settled, Settlement};
use crate::backend::{Backend, OutboxRow, OutboxState};
use crate::consume::{self, Failure, Next, Verdict};
use crate::lease::OutboxLease;
use crate::status::Status;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The waits before each try of a bookkeeping write (fenced, so safe to
/// repeat) whose statement or connection failed: a lost acknowledgement
/// must not leave its message to wait out its lease. The first retry is
/// immediate (on another connection; the failed one is gone), so that it
/// is confirmed before a retried message is due again.
const BOOKKEEPING_WAITS: [Duration; 4] = [
    Duration::ZERO,
    Duration::ZERO,
    Duration::from_millis(20),
    Duration::from_millis(100),
];

/// After [`BOOKKEEPING_WAITS`], a bookkeeping write that keeps failing
/// with a transient error (the database is failing over: connections
/// refused, then a read-only standby, `25006`) is tried again every
/// `200 ms × 2ⁿ`, at most every [`OUTAGE_WAIT_MAX`], for as long as half
/// the lease lasts: a failover of a few seconds must not leave the
/// attempt to wait out its lease.
/// The shortest wait between two renewals of a running handler's lease
/// (the heartbeat renews every third of a lease, but no more often).
pub(super) const HEARTBEAT_MIN: Duration = Duration::from_millis(10);

const OUTAGE_WAIT_FIRST: Duration = Duration::from_millis(200);
const OUTAGE_WAIT_MAX: Duration = Duration::from_secs(1);

/// How many times in a row the per-message path runs a handler again at
/// once, under the same lease and attempt, after it lost a conflict with a
/// concurrent transaction (a deadlock, a serialization failure, a lock
/// wait that timed out: the database rolled it back, and the retry is what
/// the database asks for). After that the failure is booked as any other.
pub(super) const CONFLICT_RERUNS: u32 = 8;

/// A handler that took its delivery's source `takes` times: twice or more
/// is a misuse (see [`Delivery::source`]), a failure that is not retried,
/// whatever the handler answered.
pub(super) fn one_call_per_delivery(takes: u32, result: Verdict) -> Verdict {
    if takes < 2 {
        return result;
    }
    let answered = match &result {
        Ok(_) => "it answered Ok".to_owned(),
        Err(f) => format!("it failed: {}", f.reason),
    };
    Err(Failure::dead(format!(
        "misuse: the handler took its delivery's source() {takes} times, and one delivery \
             runs one call (the first marks the message, so a later one cannot be part of it); \
             to run several handlers for one message, subscribe each with Relay::subscribe \
             ({answered})"
    )))
}

impl<DB: Backend> Inner<DB> {
    /// One attempt of one message, claimed under the lease owner `owner`,
    /// and its bookkeeping.
    pub(super) async fn deliver(&self, row: OutboxRow, owner: Arc<str>) {
        let i = self;
        let (id, attempts) = (row.id, row.attempts);
        let span = tracing::info_span!(
            "outbox_delivery",
            id,
            topic = %row.topic,
            msg_id = %row.msg_id,
            attempts,
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        crate::otel::delivery(&span, &row);
        let Some(route) = i.routing.routes.get(&row.topic).cloned() else {
            // Not claimable: claims filter on the routed topics.
            return;
        };
        let delay = i
            .policy
            .backoff
            .jittered(u32::try_from(attempts).unwrap_or(0), id);
        let lease = OutboxLease::new(id, row.topic.clone(), &*owner, attempts)
            .with_book(i.policy.max_attempts, delay.as_secs_f64())
            .enqueued(row.enqueued_ago());
        let mut reruns = 0;
        let started = tokio::time::Instant::now();
        let (takes, result) = loop {
            let takes = Arc::new(AtomicU32::new(0));
            let delivery = Delivery::new(i.pool.clone(), row.clone(), lease.clone(), takes.clone());
            let result = match consume::inline(&route, delivery) {
                Err(failure) => Err(failure),
                Ok(handler) => {
                    // The handler's spans (its `idempotent` call) nest
                    // under the delivery, in the trace it continues.
                    #[cfg(feature = "opentelemetry")]
                    let handler = tracing::Instrument::instrument(handler, span.clone());
                    self.heartbeat(&lease, handler, &span).await
                }
            };
            let takes = takes.load(Ordering::Relaxed);
            if result.as_ref().is_err_and(|f| f.conflict)
                && takes < 2
                && reruns < CONFLICT_RERUNS
                && self.still_held(&lease).await
            {
                // Lost a deadlock (or a lock wait) to a concurrent
                // transaction, which rolled the call back whole: run
                // again at once under the same lease, no attempt burnt.
                reruns += 1;
                i.stats.conflict_reruns.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(parent: &span, reruns, "outbox handler lost a conflict; running it again at once");
                continue;
            }
            break (takes, result);
        };
        let result = one_call_per_delivery(takes, result);
        let ran = started.elapsed();
        self.settle(&lease, &owner, takes > 0, result, ran, &span)
            .await;
    }

    /// Whether the message `lease` holds is still pending under it: the
    /// failed call left nothing (a call that committed marked it `success`;
    /// one that booked its failure released the lease).
    async fn still_held(&self, lease: &OutboxLease) -> bool {
        match DB::outbox_state_pool(&self.pool, lease.id()).await {
            Ok(Some(s)) => {
                s.status == Status::Pending
                    && s.attempts == lease.attempt()
                    && s.lease_owner.as_deref() == Some(lease.owner())
            }
            _ => false,
        }
    }

    /// The bookkeeping of one attempt of the message `lease` holds, whose
    /// handler came to `result` (`marked`: it marked the message itself)
    /// after running for `ran`.
    pub(super) async fn settle(
        &self,
        lease: &OutboxLease,
        owner: &str,
        marked: bool,
        result: Verdict,
        ran: Duration,
        span: &tracing::Span,
    ) {
        if !marked {
            // The relay's own path (the handler did not take its source, as
            // a publisher's): its run and its answer, for the trace.
            crate::probe::of_lease("effect", lease, || serde_json::json!({}));
            crate::probe::of_lease(
                "transition",
                lease,
                || serde_json::json!({ "ok": result.is_ok() }),
            );
        }
        // A failure `book_outage` gives back uncounted: its retry is
        // labelled `outage` in the metrics (also in the rare case where
        // the message's own call had marked it and it is booked as any
        // failure).
        let outage = matches!(&result, Err(f) if f.outage && f.retryable && !f.commit_unknown);
        let settlement = self.book(lease, owner, marked, result, span).await;
        crate::metrics::outbox_settled(lease, settlement, outage, ran);
        let i = self;
        tracing::debug!(parent: span, ?settlement, "outbox attempt settled");
        if let Some(hook) = &i.on_settled {
            hook(&Settled {
                id: lease.id(),
                topic: lease.topic(),
                attempt: lease.attempt(),
                settlement,
            });
        }
    }

    /// The bookkeeping itself, and what came of it.
    async fn book(
        &self,
        lease: &OutboxLease,
        owner: &str,
        marked: bool,
        result: Verdict,
        span: &tracing::Span,
    ) -> Settlement {
        let i = self;
        match result {
            Ok(executed) => self.book_success(lease, marked, executed, span).await,
            // Only a handler that marked its message in its transaction can
            // have landed a success: another's unknown commit is retried
            // (its call answers Duplicate if it had committed).
            Err(f) if f.commit_unknown && marked && self.landed_traced(lease).await => {
                // The handler's commit, whose acknowledgement was lost,
                // landed: the message is a success. Nothing to retry.
                i.stats.stale.fetch_add(1, Ordering::Relaxed);
                i.stats.landed.fetch_add(1, Ordering::Relaxed);
                Settlement::Landed
            }
            // Booked by the handler's call in its own transaction, which
            // held the row throughout (see `FailureBook`).
            Err(_) if let Some(dead) = lease.book.as_ref().and_then(|b| b.written()) => {
                let counter = if dead {
                    crate::metrics::outbox_dead_letter(lease.topic());
                    &i.stats.dead_lettered
                } else {
                    crate::metrics::outbox_retry(lease.topic());
                    &i.stats.retried
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::info!(parent: span, dead, "outbox attempt failed; its call booked the failure in its transaction");
                match dead {
                    true => Settlement::DeadLettered,
                    false => Settlement::Retried,
                }
            }
            Err(f)
                if f.outage
                    && f.retryable
                    && !f.commit_unknown
                    && !crate::probe::broken(crate::probe::Break::OutageCounted) =>
            {
                match self.book_outage(lease, owner, &f.reason, span).await {
                    Some(settlement) => settlement,
                    None => self.book_failure(lease, owner, marked, f, span).await,
                }
            }
            Err(failure) => self.book_failure(lease, owner, marked, failure, span).await,
        }
    }

    /// An attempt that failed in an outage (the broker or the database
    /// could not be reached: [`crate::Error::is_outage`]), given back
    /// uncounted: pending again after [`Relay::outage_retry`](super::Relay::outage_retry)
    /// (jittered), `attempts` restored. `None` when the message is not
    /// pending under this lease (its own call marked it `success` before
    /// failing): booked as any failure then.
    async fn book_outage(
        &self,
        lease: &OutboxLease,
        owner: &str,
        reason: &str,
        span: &tracing::Span,
    ) -> Option<Settlement> {
        let i = self;
        let (id, attempts) = (lease.id(), lease.attempt());
        let full = i.policy.outage_retry;
        let delay = crate::backoff::Backoff::new(full, full).jittered(1, id);
        let reason: String = format!("outage (attempt not counted): {reason}")
            .chars()
            .take(2000)
            .collect();
        // Its topic's next claims wait as long (see `gate`).
        i.gates.close(lease.topic(), delay);
        let at = crate::probe::now();
        let released = self
            .fenced(
                id,
                || DB::outbox_release(&i.pool, id, owner, attempts, delay.as_secs_f64(), &reason),
                |s| {
                    s.status == Status::Pending
                        && s.lease_owner.is_none()
                        && s.attempts == attempts - 1
                },
            )
            .await;
        if matches!(released, Ok(false))
            && let Ok(Some(s)) = DB::outbox_state_pool(&i.pool, id).await
            && s.status == Status::Success
        {
            return None;
        }
        crate::probe::of_lease("settle", lease, || {
            serde_json::json!({
                "dead": false,
                "retryable": true,
                "outage": true,
                "applied": matches!(released, Ok(true)),
                "error": released.is_err(),
                "at": at,
            })
        });
        if let Err(e) = &released
            && crate::backend::classify::is_transient(e)
        {
            // Written before the relay's next claim once the database
            // answers (see `unreleased`): not counted by a re-claim.
            i.keep_release(lease, owner, delay.as_secs_f64(), &reason);
        }
        if matches!(released, Ok(true)) {
            i.stats.outages.fetch_add(1, Ordering::Relaxed);
            i.stats.retried.fetch_add(1, Ordering::Relaxed);
            crate::metrics::outbox_retry(lease.topic());
            tracing::info!(parent: span, %reason, retry_in = ?delay, "outbox attempt failed in an outage; not counted, will retry");
            return Some(Settlement::Retried);
        }
        Some(self.failure_settled(lease.topic(), released, false, &reason, delay, span))
    }

    /// A handler that ended well: counted, and the message marked `success`
    /// unless its call marked it in its own transaction.
    async fn book_success(
        &self,
        lease: &OutboxLease,
        marked: bool,
        executed: bool,
        span: &tracing::Span,
    ) -> Settlement {
        let i = self;
        let (id, attempts) = (lease.id(), lease.attempt());
        let counter = if executed {
            &i.stats.executed
        } else {
            &i.stats.duplicates
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let done = match executed {
            true => Settlement::Executed,
            false => Settlement::Duplicate,
        };
        // A handler given its outbox source marked the message in
        // its own transaction; for any other, the relay marks it.
        if marked {
            return done;
        }
        {
            let at = crate::probe::now();
            let mark = self.fenced(
                id,
                || async {
                    crate::outbox::mark::after_handler(&i.pool, lease)
                        .await
                        .map(|n| n == 1)
                },
                |s| s.status == Status::Success && s.attempts == attempts,
            );
            let mark = mark.await;
            crate::probe::of_lease("relay_mark", lease, || {
                serde_json::json!({
                    "applied": matches!(mark, Ok(true)),
                    "error": mark.is_err(),
                    "at": at,
                })
            });
            match mark {
                Ok(true) => done,
                Ok(false) => {
                    i.stats.stale.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(parent: span, "outbox message no longer held by this delivery; its current holder settles it");
                    Settlement::Stale
                }
                Err(e) => {
                    tracing::warn!(parent: span, error = %format_args!("{e:#}"), "could not confirm outbox success; the lease will expire and the retry will be a duplicate");
                    Settlement::Unrecorded
                }
            }
        }
    }

    /// A failed attempt the relay books itself: a retry after the
    /// back-off, or a dead letter, fenced by the attempt's lease.
    async fn book_failure(
        &self,
        lease: &OutboxLease,
        owner: &str,
        marked: bool,
        failure: Failure,
        span: &tracing::Span,
    ) -> Settlement {
        let i = self;
        let (id, attempts) = (lease.id(), lease.attempt());
        let commit_unknown = failure.commit_unknown;
        let retryable = failure.retryable;
        let attempt = u32::try_from(attempts).unwrap_or(0);
        let max = u32::try_from(i.policy.max_attempts).unwrap_or(u32::MAX);
        let (dead, reason) = match failure.next(attempt, max, "attempts") {
            Next::Dead(reason) => (true, reason),
            Next::Retry(reason) => (false, reason),
        };
        let delay = i.policy.backoff.jittered(attempt, id);
        let reason: String = reason.chars().take(2000).collect();
        let status = if dead {
            Status::Failed
        } else {
            Status::Pending
        };
        // First as a pending message this attempt holds; if it is
        // not, over a `success` this attempt's own call marked (the
        // handler failed after its call committed, or took its
        // source twice): never absorbed as a success, which would
        // leave the handler's remaining effect undone. A success
        // that a lost acknowledgement hid was settled above.
        crate::probe::before_failure_booking().await;
        let at = crate::probe::now();
        let mut settled = Ok(false);
        let mut over_success = false;
        // Never over a success when the handler's commit outcome is
        // unknown (its read-back failed): that success may be the
        // commit's own, and writing over it would dead-letter, on the
        // last attempt, a message whose effect is done (the model's
        // finding 3). The message is then left as it is: `success`,
        // or pending under this lease until it runs out.
        let overs: &[bool] = match commit_unknown && marked {
            true => &[false],
            false => &[false, true],
        };
        for &over in overs {
            over_success = over;
            settled = self
                .fenced(
                    id,
                    || {
                        DB::outbox_settle_failure(
                            &i.pool,
                            over,
                            id,
                            owner,
                            attempts,
                            dead,
                            delay.as_secs_f64(),
                            &reason,
                        )
                    },
                    |s| s.status == status && s.lease_owner.is_none() && s.attempts == attempts,
                )
                .await;
            if !matches!(settled, Ok(false)) {
                break;
            }
        }
        crate::probe::of_lease("settle", lease, || {
            serde_json::json!({
                "dead": dead,
                "retryable": retryable,
                "applied": matches!(settled, Ok(true)),
                "over_success": over_success && matches!(settled, Ok(true)),
                "error": settled.is_err(),
                "at": at,
            })
        });
        if over_success && matches!(settled, Ok(true)) {
            tracing::warn!(parent: span, %reason, "the handler failed after its call marked the outbox message `success`; the success is undone so that the message runs again");
        }
        self.failure_settled(lease.topic(), settled, dead, &reason, delay, span)
    }

    /// What the relay's booking of a failed attempt of a message of
    /// `topic` came to.
    fn failure_settled(
        &self,
        topic: &str,
        settled: Result<bool, sqlx::Error>,
        dead: bool,
        reason: &str,
        delay: Duration,
        span: &tracing::Span,
    ) -> Settlement {
        let i = self;
        match settled {
            Ok(true) if dead => {
                i.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                crate::metrics::outbox_dead_letter(topic);
                tracing::warn!(parent: span, %reason, "outbox message dead-lettered");
                Settlement::DeadLettered
            }
            Ok(true) => {
                i.stats.retried.fetch_add(1, Ordering::Relaxed);
                crate::metrics::outbox_retry(topic);
                tracing::info!(parent: span, %reason, retry_in = ?delay, "outbox attempt failed; will retry");
                Settlement::Retried
            }
            Ok(false) => {
                // Settled by another attempt (a relay that took the
                // message over after this lease ran out).
                i.stats.stale.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(parent: span, %reason, "outbox message no longer held by this delivery; its failure is left to its current holder");
                Settlement::Stale
            }
            Err(e) => {
                // The lease expires and the message is retried.
                tracing::warn!(parent: span, error = %format_args!("{e:#}"), "could not record the failed attempt");
                Settlement::Unrecorded
            }
        }
    }

    /// [`landed`](Self::landed), traced.
    async fn landed_traced(&self, lease: &OutboxLease) -> bool {
        let success = self.landed(lease.id()).await;
        crate::probe::of_lease(
            "landed",
            lease,
            || serde_json::json!({ "success": success }),
        );
        success
    }

    /// Whether message `id` is a `success` (read on a fresh connection,
    /// with the bookkeeping's retries).
    async fn landed(&self, id: i64) -> bool {
        if crate::probe::read_back_fails() {
            return false;
        }
        let read = self.fenced(
            id,
            || async {
                let state = DB::outbox_state_pool(&self.pool, id).await?;
                Ok(state.is_some_and(|s| s.status == Status::Success))
            },
            |_| false,
        );
        read.await.unwrap_or(false)
    }

    /// Runs `write`, a bookkeeping update fenced by the lease (true: it
    /// changed the row), again after an error, a few times, and after a
    /// transient error (a failover) for as long as half the lease lasts
    /// (see [`OUTAGE_WAIT_FIRST`]). When a try failed with the outcome
    /// unknown and a later one finds nothing to change (or every try
    /// failed), the row is read: `landed` tells whether it is in the state
    /// the write leaves (an earlier try committed).
    async fn fenced<F, Fut>(
        &self,
        id: i64,
        write: F,
        landed: impl Fn(&OutboxState) -> bool,
    ) -> Result<bool, sqlx::Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<bool, sqlx::Error>>,
    {
        let mut unknown = false;
        let mut last: Option<sqlx::Error> = None;
        let outage_ends = tokio::time::Instant::now() + self.policy.lease / 2;
        for tries in 0.. {
            let wait = match BOOKKEEPING_WAITS.get(tries) {
                Some(wait) => *wait,
                None => {
                    let more = u32::try_from(tries - BOOKKEEPING_WAITS.len()).unwrap_or(u32::MAX);
                    let wait = OUTAGE_WAIT_FIRST
                        .saturating_mul(2u32.saturating_pow(more))
                        .min(OUTAGE_WAIT_MAX);
                    let transient = last
                        .as_ref()
                        .is_some_and(crate::backend::classify::is_transient);
                    if !transient || tokio::time::Instant::now() + wait > outage_ends {
                        break;
                    }
                    wait
                }
            };
            tokio::time::sleep(wait).await;
            match write().await {
                Ok(true) => return Ok(true),
                Ok(false) if !unknown => return Ok(false),
                Ok(false) => {
                    let state = DB::outbox_state_pool(&self.pool, id).await?;
                    return Ok(state.as_ref().is_some_and(&landed));
                }
                Err(e) => {
                    // A database error is the statement's refusal: nothing
                    // changed. A lost connection (or a session ended
                    // under it) may have committed.
                    unknown |= crate::backend::classify::commit_outcome_unknown(&e);
                    last = Some(e);
                }
            }
        }
        // Every try failed; if one may have committed, a read tells.
        if unknown
            && let Ok(Some(state)) = DB::outbox_state_pool(&self.pool, id).await
            && landed(&state)
        {
            return Ok(true);
        }
        Err(last.expect("at least one try"))
    }

    /// Runs a handler to its end, renewing its message's lease every third
    /// of the lease meanwhile (the handler keeps running while a renewal
    /// is in flight).
    async fn heartbeat<F: Future + Unpin>(
        &self,
        lease: &OutboxLease,
        mut handler: F,
        span: &tracing::Span,
    ) -> F::Output {
        let i = self;
        let every = (i.policy.lease / 3).max(HEARTBEAT_MIN);
        let ids = [lease.id()];
        let tick = tokio::time::sleep(every);
        tokio::pin!(tick);
        loop {
            tokio::select! {
                done = &mut handler => return done,
                _ = &mut tick => {}
            }
            let renew =
                DB::renew_leases(&i.pool, lease.owner(), &ids, i.policy.lease.as_secs_f64());
            tokio::pin!(renew);
            let renewed = tokio::select! {
                done = &mut handler => return done,
                renewed = &mut renew => renewed,
            };
            match renewed {
                Ok(n) => {
                    crate::probe::of_lease(
                        "renew",
                        lease,
                        || serde_json::json!({ "renewed": n == 1 }),
                    );
                    crate::metrics::lease_renewals(n)
                }
                Err(e) => {
                    crate::probe::of_lease(
                        "renew",
                        lease,
                        || serde_json::json!({ "renewed": false, "error": true }),
                    );
                    tracing::warn!(parent: span, error = %format_args!("{e:#}"), "could not renew the lease of a running handler")
                }
            }
            tick.as_mut().reset(tokio::time::Instant::now() + every);
        }
    }
}
