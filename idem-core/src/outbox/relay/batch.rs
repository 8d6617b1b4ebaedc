//! Batched commits (see [`Relay::commit_batch`]): the handlers of one
//! claimed chunk run one after the other in one transaction, each under a
//! savepoint of its own, and the chunk commits once.
//!
//! - **Leases.** The batch transaction first renews the leases of all its
//!   messages, which locks their rows until it ends: claims skip locked
//!   rows (`SKIP LOCKED`; SQLite's write lock is held from `BEGIN
//!   IMMEDIATE`), so no other relay takes a message of a running batch,
//!   however long the batch lasts. Only the messages it renewed as this
//!   claim's attempt run in the batch; any other is delivered alone after
//!   it, on the per-message path (fenced by its lease there).
//! - **Statements per message.** A call opens its savepoint (one name for
//!   all, never released: the batch's commit ends them) and leaves its
//!   message's success mark to the batch, which marks every message whose
//!   call ended well in one `UPDATE` before its commit (fenced by the lease
//!   owner all the same; a count that does not match commits nothing).
//!   A message then costs its handler's statements and one `SAVEPOINT`.
//! - **A failing or panicking handler** rolls back to its savepoint (its
//!   lent transaction goes back to the batch, rolled back to the
//!   savepoint, also when its task unwinds), and its message is not
//!   marked; the batch goes on, and its failure bookkeeping (back-off,
//!   dead letter) is written after the batch's commit, on the pool,
//!   exactly as on the per-message path. A call inside another call of
//!   the same delivery, both on its `source()`, fails at once with
//!   [`Error::OutboxMessage`] (waiting for the batch's transaction would
//!   wait forever).
//! - **The commit.** Acknowledged: every message is settled as its
//!   handler answered, and the cache markers of its calls are written.
//!   Outcome unknown (a lost acknowledgement): each message whose handler
//!   succeeded is read back, a `success` (the commit landed) or retried
//!   like a per-message attempt whose commit outcome is unknown (the retry
//!   answers `Duplicate` if it had landed after all). Refused, or the
//!   transaction lost (a savepoint that could not be opened or rolled
//!   back to): nothing committed, and every message
//!   of the batch is delivered again on the per-message path, under the
//!   same leases.
//! - **Contention.** A conflict with a concurrent transaction (a
//!   deadlock, a serialization failure, a lock-wait time-out:
//!   [`contended`]) is the batch's, never a message's failure. Raised by a
//!   handler's own statement (`Failure::conflict`), the batch stops at
//!   that handler, whose savepoint undid its call: the handlers before it
//!   commit (releasing the rows the other transaction waits for), and that
//!   message and those after it go on the per-message path at once. A
//!   batch that did not commit because of one (or whose transaction the
//!   database rolled back whole, as MariaDB does on a deadlock) is the
//!   refused case above. Either way under the same leases, no back-off,
//!   no attempt burnt, and the relay halves its batch size ([`Adaptive`]);
//!   each clean commit adds one back, up to `commit_batch`. On PostgreSQL
//!   a batch waits for a row lock at most `Relay::batch_lock_wait` (20 ms
//!   by default, `SET LOCAL lock_timeout`): a waiting batch holds the rows
//!   of all its earlier handlers, so waits between batches grow convoys,
//!   and PostgreSQL finds a deadlock among them only after its
//!   `deadlock_timeout` (1 s). On the per-message path a handler that lost
//!   a conflict runs again at once under the same attempt
//!   (`CONFLICT_RERUNS`); the batches' short waits make them, not the
//!   lone message, the usual loser of a deadlock between the two.

use super::Inner;
use super::attempt::one_call_per_delivery;
use super::delivery::Delivery;
use crate::backend::{Backend, OutboxRow};
use crate::call::{BARE_BATCH_UNDONE, CallerTx, SharedTx};
use crate::consume::{self, Failure, Verdict};
use crate::error::Error;
use crate::lease::OutboxLease;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// The batch size in force (AIMD): halved when a batch meets contention,
/// one more after each claim whose batches all committed cleanly, up to
/// `commit_batch`. At one, the messages go on the per-message path, and
/// batches of two are tried again only after `probe` clean claims in a
/// row, a wait that doubles each time the try meets contention again (up
/// to [`PROBE_MAX`]) and starts over once batches commit cleanly.
#[derive(Debug, Default)]
pub(super) struct Adaptive {
    /// The size in force; 0: `commit_batch` itself (never shrunk yet).
    limit: AtomicUsize,
    shrinks: AtomicU64,
    /// Batches committed cleanly in a row (see [`TRUST_AFTER`]).
    clean: AtomicU32,
    /// Clean claims at size one before batches are tried again (0: 1).
    probe: AtomicU32,
    /// Clean claims at size one so far.
    waited: AtomicU32,
}

/// The most clean claims at size one before batches are tried again.
const PROBE_MAX: u32 = 64;

/// See [`Relay::batch_lock_wait`].
pub(super) const DEFAULT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// After this many batches in a row commit cleanly, the relay runs its
/// batches without a savepoint per call (one round trip less per message,
/// and on PostgreSQL no subtransaction per call: more than 64 in one
/// transaction slow every snapshot of the server). A call that fails in
/// such a batch undoes the batch: its messages go one by one at once, and
/// batches take savepoints again until trust is earned back.
pub(super) const TRUST_AFTER: u32 = 4;

impl Adaptive {
    /// The size in force, `max` being `commit_batch`.
    pub(super) fn limit(&self, max: usize) -> usize {
        match self.limit.load(Ordering::Relaxed) {
            0 => max.max(1),
            n => n.clamp(1, max.max(1)),
        }
    }

    /// Contention: halves the size (at least 1).
    fn shrink(&self, max: usize) {
        self.distrust();
        if crate::probe::broken(crate::probe::Break::AdaptiveBatching) {
            return;
        }
        let was = self
            .limit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                let now = if n == 0 { max.max(1) } else { n };
                Some((now / 2).max(1))
            })
            .unwrap_or(0);
        if was == 2 || was == 3 {
            // Batches of two met contention again: wait twice as long at
            // one before the next try.
            let _ = self
                .probe
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                    Some(p.max(1).saturating_mul(2).min(PROBE_MAX))
                });
            self.waited.store(0, Ordering::Relaxed);
        }
        self.shrinks.fetch_add(1, Ordering::Relaxed);
    }

    /// A claim at size one whose messages lost no conflict: after enough
    /// of them ([`Adaptive`]), batches of two again.
    fn clean_alone(&self, max: usize) {
        let waited = self.waited.fetch_add(1, Ordering::Relaxed) + 1;
        if waited >= self.probe.load(Ordering::Relaxed).max(1) {
            self.waited.store(0, Ordering::Relaxed);
            self.grow(max);
        }
    }

    /// Whether batches run without savepoints now: only at the full size
    /// (while contention keeps it smaller, a conflict would undo a whole
    /// batch without them, instead of stopping it at the loser).
    pub(super) fn trusted(&self) -> bool {
        self.clean.load(Ordering::Relaxed) >= TRUST_AFTER && self.limit.load(Ordering::Relaxed) == 0
    }

    /// A batch that did not commit cleanly: savepoints again.
    fn distrust(&self) {
        self.clean.store(0, Ordering::Relaxed);
    }

    /// A clean commit: one more towards trust (see [`TRUST_AFTER`]).
    fn count_clean(&self) {
        let _ = self
            .clean
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(1))
            });
    }

    /// A claim's batches all clean: one more, up to `max`. Once per claim,
    /// not per batch: a claim runs many batches at once, and growing by
    /// each would undo a halving within the claim after it.
    fn grow(&self, max: usize) {
        if self.limit(max) >= 2 {
            // Batches commit cleanly: contention has passed.
            self.probe.store(0, Ordering::Relaxed);
        }
        let _ = self
            .limit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| match n {
                0 => None,
                n if n >= max => Some(0),
                n => Some(n + 1),
            });
    }

    /// How many times contention halved the size.
    pub(super) fn shrinks(&self) -> u64 {
        self.shrinks.load(Ordering::Relaxed)
    }
}

/// The reason of the batch commit the probe's injected
/// conflict refused.
const INJECTED_CONFLICT: &str = "injected fault: the batch's commit lost a deadlock";

/// Whether a batch's transaction failed for a conflict with a concurrent
/// transaction: a deadlock or a serialization failure
/// (`crate::backend::classify::is_conflict`: PostgreSQL `40P01`, `40001`;
/// MariaDB/MySQL `1213`, `1020`, `1614`) or a lock wait that timed out
/// (PostgreSQL `55P03`, MariaDB/MySQL `1205`). Nothing of it committed.
pub(super) fn contended(e: &Error) -> bool {
    if let Error::TransactionLost { reason } = e
        && reason == INJECTED_CONFLICT
    {
        return true;
    }
    crate::backend::classify::find_sqlx(e).is_some_and(|s| {
        crate::backend::classify::is_conflict(s) || crate::backend::classify::is_lock_wait(s)
    })
}

/// What the handlers of a batch came to before its end.
struct BatchRun {
    /// The messages whose handlers ran to their end.
    ran: Vec<Ran>,
    /// Those to deliver one by one after the batch: the handler that lost
    /// a conflict, and those not run yet.
    rest: Vec<OutboxRow>,
    /// Why the batch's transaction was lost, if it was.
    lost: Option<String>,
    /// Whether a handler lost a conflict.
    conflict: bool,
}

/// One message of a batch, once its handler ran.
struct Ran {
    row: OutboxRow,
    lease: OutboxLease,
    /// Whether the handler took its outbox source (its success mark is in
    /// the batch's transaction).
    marked: bool,
    result: Verdict,
    /// How long its handler ran.
    ran: Duration,
    span: tracing::Span,
}

impl<DB: Backend> Inner<DB> {
    /// A permit to open one transaction: a batch's, or a message's
    /// delivered alone. A batched relay keeps at most `concurrency /
    /// commit_batch` open at once (at least one), as many as batches of the
    /// full size take: when contention shrinks the batches, or sends their
    /// messages one by one, more of them do not mean more transactions
    /// queueing on the same hot rows and pool connections.
    async fn open_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let i = self;
        let open = i.batching.open.get_or_init(|| {
            let n = (i.policy.concurrency / i.batching.commit_batch.max(1)).max(1);
            Arc::new(tokio::sync::Semaphore::new(n))
        });
        open.clone().acquire_owned().await.ok()
    }

    /// Delivers one claim's `rows` in batches of
    /// [`commit_batch`](Relay::commit_batch) messages, the batches at once.
    pub(super) async fn deliver_batches(self: &Arc<Self>, rows: Vec<OutboxRow>, owner: Arc<str>) {
        let i = self;
        let max = i.batching.commit_batch;
        let n = i.batching.adaptive.limit(max);
        let shrinks = i.batching.adaptive.shrinks();
        let claimed = tokio::time::Instant::now();
        let mut runs = JoinSet::new();
        if n <= 1 {
            // Contention shrank the batches to one message: a batch of one
            // is a message alone, and the per-message path is cheaper.
            let reruns = i.stats.conflict_reruns();
            for row in rows {
                let (me, owner) = (self.clone(), owner.clone());
                runs.spawn(async move { me.deliver_alone(row, owner, claimed).await });
            }
            while runs.join_next().await.is_some() {}
            if i.stats.conflict_reruns() == reruns {
                i.batching.adaptive.clean_alone(max);
            }
            return;
        }
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            let chunk: Vec<_> = rows.by_ref().take(n).collect();
            let (me, owner) = (self.clone(), owner.clone());
            runs.spawn(async move { me.deliver_batch(chunk, owner).await });
        }
        while runs.join_next().await.is_some() {}
        if i.batching.adaptive.shrinks() == shrinks {
            i.batching.adaptive.grow(max);
        }
    }

    /// Delivers a message of a claim alone, once a transaction may open
    /// (see [`open_permit`](Self::open_permit)); its lease renewed first if
    /// that took a third of a lease since the claim.
    async fn deliver_alone(&self, row: OutboxRow, owner: Arc<str>, claimed: tokio::time::Instant) {
        let open = self.open_permit().await;
        if claimed.elapsed() < self.policy.lease / 3 {
            let _open = open;
            self.deliver(row, owner).await;
        } else {
            drop(open);
            self.deliver_renewed(row, owner).await;
        }
    }

    /// One batch: its handlers in one transaction, committed once, then
    /// the bookkeeping of each message.
    async fn deliver_batch(self: &Arc<Self>, rows: Vec<OutboxRow>, owner: Arc<str>) {
        let i = self;
        let open = self.open_permit().await;
        let (shared, held) = match self.open_batch(&owner, &rows).await {
            Ok(opened) => opened,
            Err(e) => {
                if let Some(first) = rows.first() {
                    crate::probe::emit(
                        "batch_open",
                        0,
                        &first.topic,
                        0,
                        &owner,
                        || serde_json::json!({ "renewed": [], "begun": false }),
                    );
                }
                if contended(&e) {
                    i.batching.adaptive.shrink(i.batching.commit_batch);
                }
                tracing::warn!(error = %format_args!("{e:#}"), messages = rows.len(), "could not begin an outbox batch; delivering its messages one by one");
                drop(open);
                return self.deliver_each(rows, owner).await;
            }
        };
        // The messages whose lease the batch renewed as this claim's
        // attempt, and so locked: those run in it. Any other (its row
        // locked by this relay's lease renewal at that moment, or its
        // lease lost) is delivered alone after the batch, where its
        // handler's update is fenced by its lease.
        let (rows, alone): (Vec<_>, Vec<_>) = rows
            .into_iter()
            .partition(|r| held.contains(&(r.id, r.attempts)));
        let span = tracing::info_span!(
            parent: None,
            "outbox_batch",
            messages = rows.len(),
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        crate::otel::batch(&span, &rows);
        let BatchRun {
            ran,
            rest,
            lost,
            conflict,
        } = self.run_batch(rows, &owner, &shared, &span).await;
        if conflict {
            i.batching.adaptive.shrink(i.batching.commit_batch);
        }
        let ending = self.end_batch(&shared, &owner, &ran, lost);
        let committed = tracing::Instrument::instrument(ending, span).await;
        // The batch's transaction has ended.
        drop(open);
        self.after_batch(&shared, committed, ran, rest, conflict, &owner)
            .await;
        self.deliver_each(alone, owner).await;
    }

    /// Runs the handlers of `rows` in the batch's transaction, one after
    /// the other, until one loses a conflict or the transaction is lost;
    /// `batch` is the batch's span.
    async fn run_batch(
        &self,
        rows: Vec<OutboxRow>,
        owner: &Arc<str>,
        shared: &SharedTx<DB>,
        batch: &tracing::Span,
    ) -> BatchRun {
        let mut ran = Vec::with_capacity(rows.len());
        let mut rows = rows.into_iter();
        let (mut lost, mut conflicted) = (None, None);
        for row in rows.by_ref() {
            if let Some(r) = self.run_in_batch(row, owner, shared, batch).await {
                if r.result.as_ref().is_err_and(|f| f.conflict) {
                    // A deadlock or a lock wait met by the handler's own
                    // statement, under its savepoint: the batch's
                    // contention, not the message's failure. The batch
                    // stops here; what ran before commits (releasing its
                    // locks), the rest goes one by one at once.
                    tracing::debug!(parent: &r.span, error = ?r.result, "a handler in an outbox batch lost a conflict");
                    conflicted = Some(r.row);
                } else {
                    ran.push(r);
                }
            }
            if let Some(reason) = shared.lost().await {
                lost = Some(reason);
                break;
            }
            if conflicted.is_some() {
                break;
            }
        }
        let conflict = conflicted.is_some();
        // What goes one by one after the batch (once its commit released
        // their rows, which its lease renewal locked): the message whose
        // handler lost a conflict, and those not run yet.
        let rest: Vec<OutboxRow> = conflicted.into_iter().chain(rows).collect();
        BatchRun {
            ran,
            rest,
            lost,
            conflict,
        }
    }

    /// Ends the batch's transaction: its marks and bookkeeping, and the
    /// commit (or the reason it was lost), traced.
    async fn end_batch(
        &self,
        shared: &SharedTx<DB>,
        owner: &Arc<str>,
        ran: &[Ran],
        lost: Option<String>,
    ) -> Result<(), Error> {
        let at = crate::probe::now();
        let committed = match lost {
            Some(reason) => Err(Error::TransactionLost { reason }),
            None => {
                // Only the messages whose handlers ended well are marked:
                // a handler that failed after its call ended keeps its
                // message pending, to run again.
                let ok: Vec<i64> = ran
                    .iter()
                    .filter(|r| r.result.is_ok())
                    .map(|r| r.lease.id())
                    .collect();
                let failed: Vec<(&OutboxLease, &Failure)> = ran
                    .iter()
                    .filter_map(|r| r.result.as_ref().err().map(|f| (&r.lease, f)))
                    .collect();
                self.finish_batch(shared, owner, &ok, &failed).await
            }
        };
        if let Some(first) = ran.first() {
            let outcome = match &committed {
                Ok(()) => "ok",
                Err(Error::CommitUnknown(_)) => "lost_ack",
                Err(Error::TransactionLost { reason })
                    if reason.starts_with("the batch marked") =>
                {
                    "short"
                }
                Err(_) => "failed",
            };
            crate::probe::emit(
                "batch_commit",
                0,
                first.lease.topic(),
                0,
                owner,
                || serde_json::json!({ "outcome": outcome, "at": at }),
            );
        }
        committed
    }

    /// What the batch's end comes to for each message: its bookkeeping
    /// after a commit, or every message again one by one.
    async fn after_batch(
        self: &Arc<Self>,
        shared: &SharedTx<DB>,
        committed: Result<(), Error>,
        ran: Vec<Ran>,
        rest: Vec<OutboxRow>,
        conflict: bool,
        owner: &Arc<str>,
    ) {
        let i = self;
        match committed {
            Ok(()) => {
                i.stats.batches.fetch_add(1, Ordering::Relaxed);
                if !conflict {
                    i.batching.adaptive.count_clean();
                }
                if ran.iter().any(|r| r.result.is_err()) {
                    // Committed, but not clean: a call failed (under its
                    // savepoint). Savepoints stay on.
                    i.batching.adaptive.distrust();
                }
                shared.cache_markers.write().await;
                for r in ran {
                    self.settle(&r.lease, owner, r.marked, r.result, r.ran, &r.span)
                        .await;
                }
                self.deliver_each(rest, owner.clone()).await;
            }
            Err(Error::CommitUnknown(error)) => {
                i.stats.lost_batches.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, messages = ran.len(), "an outbox batch's commit outcome is unknown; reading back its messages");
                for r in ran {
                    // A success mark in the batch: its commit's outcome
                    // is unknown, like a per-message handler's.
                    let result = match r.result {
                        Ok(_) if r.marked => Err(Failure {
                            commit_unknown: true,
                            ..Failure::retry(format!(
                                "commit outcome unknown: the batch's commit failed: {error}"
                            ))
                        }),
                        other => other,
                    };
                    self.settle(&r.lease, owner, r.marked, result, r.ran, &r.span)
                        .await;
                }
                self.deliver_each(rest, owner.clone()).await;
            }
            Err(e) if contended(&e) => {
                // A conflict (a hot row): nothing of the batch committed.
                // Its messages one by one at once, under the same lease,
                // and smaller batches from now on.
                i.stats.lost_batches.fetch_add(1, Ordering::Relaxed);
                if !conflict {
                    // (A handler's conflict halved it already.)
                    i.batching.adaptive.shrink(i.batching.commit_batch);
                }
                tracing::debug!(error = %format_args!("{e:#}"), messages = ran.len(), commit_batch_now = i.batching.adaptive.limit(i.batching.commit_batch), "an outbox batch lost a conflict; delivering its messages one by one and halving the batch size");
                let again: Vec<_> = ran.into_iter().map(|r| r.row).chain(rest).collect();
                self.deliver_each(again, owner.clone()).await;
            }
            Err(Error::TransactionLost { reason }) if reason == BARE_BATCH_UNDONE => {
                // A call failed in a batch without savepoints: nothing of
                // it committed. Every message again, one by one at once,
                // under the same lease; savepoints again from now on.
                i.stats.lost_batches.fetch_add(1, Ordering::Relaxed);
                i.batching.adaptive.distrust();
                tracing::debug!(
                    messages = ran.len(),
                    "a call failed in an outbox batch without savepoints; delivering its messages one by one"
                );
                let again: Vec<_> = ran.into_iter().map(|r| r.row).chain(rest).collect();
                self.deliver_each(again, owner.clone()).await;
            }
            Err(e) => {
                // Nothing of the batch committed: every message again,
                // one by one, under the same lease.
                i.stats.lost_batches.fetch_add(1, Ordering::Relaxed);
                i.batching.adaptive.distrust();
                tracing::warn!(error = %format_args!("{e:#}"), "an outbox batch did not commit; delivering its messages one by one");
                let again: Vec<_> = ran.into_iter().map(|r| r.row).chain(rest).collect();
                self.deliver_each(again, owner.clone()).await;
            }
        }
    }

    /// Ends a batch whose handlers all ran: the success marks of the
    /// messages whose calls ended well, in one statement, the failure
    /// bookkeeping of those whose handlers failed, then the commit. The
    /// rows are locked since the batch renewed their leases, so the marks
    /// cannot miss one (if they did all the same, nothing commits), and no
    /// other relay can claim a failed message before its failure is
    /// recorded (see `FailureBook`): a batch slower than its leases never
    /// runs a message past `max_attempts`.
    async fn finish_batch(
        &self,
        shared: &SharedTx<DB>,
        owner: &str,
        ok: &[i64],
        failed: &[(&OutboxLease, &Failure)],
    ) -> Result<(), Error> {
        let mut tx = shared.take().await;
        tx.undo_dropped_call().await?;
        let mut marks = shared.take_marks();
        marks.retain(|id| ok.contains(id));
        let marked = crate::outbox::mark::batch(tx.transaction()?, owner, &marks).await?;
        if marked != marks.len() as u64 {
            return Err(Error::TransactionLost {
                reason: format!(
                    "the batch marked {marked} of its {} messages whose calls ended well",
                    marks.len()
                ),
            });
        }
        let mut booked = Vec::with_capacity(failed.len());
        let failed = if crate::probe::broken(crate::probe::Break::FailureBooking) {
            &[]
        } else {
            failed
        };
        // An outage's attempt is given back by the relay, uncounted.
        for (lease, f) in failed.iter().filter(|(_, f)| !f.outage) {
            let Some(book) = lease.book.as_ref() else {
                continue;
            };
            let (dead, reason) = book.decide(lease.attempt(), f.retryable, f.reason.clone());
            let written = DB::outbox_settle_failure_in(
                tx.transaction()?,
                false,
                lease.id(),
                owner,
                lease.attempt(),
                dead,
                book.delay_secs,
                &reason,
            )
            .await?;
            if written {
                booked.push((book, dead));
            }
        }
        commit(tx).await?;
        // In the trace, the batch's end (`batch_commit`) carries them.
        for (book, dead) in booked {
            book.wrote(dead);
        }
        Ok(())
    }

    /// Begins a batch's transaction and renews (and so locks) its
    /// messages' leases in it; returns the renewed `(id, attempts)`.
    async fn open_batch(
        &self,
        owner: &str,
        rows: &[OutboxRow],
    ) -> Result<(SharedTx<DB>, Vec<(i64, i32)>), Error> {
        let i = self;
        let mut tx = CallerTx::begin(&i.pool).await?;
        if crate::probe::broken(crate::probe::Break::BatchLeases) {
            // The control: every message taken as held, nothing locked.
            let held = rows.iter().map(|r| (r.id, r.attempts)).collect();
            return Ok((SharedTx::new(tx, !self.batching.adaptive.trusted()), held));
        }
        if DB::dialect(tx.transaction()?) == crate::Dialect::Postgres {
            // A batch that waits holds its earlier handlers' rows: a short
            // wait is a conflict (see `Relay::batch_lock_wait`).
            let ms = i.batching.lock_wait.as_millis().max(1);
            let bound = format!("SET LOCAL lock_timeout = '{ms}ms'");
            DB::execute_on(&mut **tx.transaction()?, &bound).await?;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let renewed =
            DB::renew_leases_in(tx.transaction()?, owner, &ids, i.policy.lease.as_secs_f64())
                .await?;
        if let Some(first) = rows.first() {
            let ids: Vec<i64> = renewed.iter().map(|(id, _)| *id).collect();
            crate::probe::emit(
                "batch_open",
                0,
                &first.topic,
                0,
                owner,
                || serde_json::json!({ "renewed": ids }),
            );
        }
        crate::metrics::lease_renewals(renewed.len() as u64);
        Ok((
            SharedTx::new(tx, !self.batching.adaptive.trusted()),
            renewed,
        ))
    }

    /// Delivers `rows` each on its own, on the per-message path (side by
    /// side), each after its lease is renewed: the batch before them may have outlived their
    /// leases, and a message another relay claimed meanwhile must not run
    /// here too. A message whose lease is not renewed (claimed by another
    /// relay, or settled) is left to its holder; one whose renewal failed
    /// waits out its lease.
    async fn deliver_each(self: &Arc<Self>, rows: Vec<OutboxRow>, owner: Arc<str>) {
        // Side by side: the batch held one handler slot per message, which
        // would sit idle while the messages ran in turn.
        let mut each = JoinSet::new();
        for row in rows {
            let (me, owner) = (self.clone(), owner.clone());
            each.spawn(async move { me.deliver_renewed(row, owner).await });
        }
        while each.join_next().await.is_some() {}
    }

    /// Delivers `row` on the per-message path once its lease is renewed
    /// (see [`deliver_each`](Self::deliver_each)).
    async fn deliver_renewed(&self, row: OutboxRow, owner: Arc<str>) {
        let _open = self.open_permit().await;
        let lease = self.policy.lease.as_secs_f64();
        let renewed = DB::renew_held(&self.pool, &owner, row.id, lease).await;
        crate::probe::emit(
            "renew",
            row.id,
            &row.topic,
            row.attempts,
            &owner,
            || serde_json::json!({ "renewed": matches!(renewed, Ok(true)), "error": renewed.is_err() }),
        );
        match renewed {
            Ok(true) => self.deliver(row, owner).await,
            Ok(false) => {
                self.stats.stale.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    id = row.id,
                    "outbox message no longer held by this claim; left to its holder"
                );
            }
            Err(e) => {
                tracing::warn!(id = row.id, error = %format_args!("{e:#}"), "could not renew an outbox message's lease; it is retried once the lease runs out");
            }
        }
    }

    /// Runs one message's handler in the batch's transaction `shared`, its
    /// span linked to the batch's span `batch`.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    async fn run_in_batch(
        &self,
        row: OutboxRow,
        owner: &Arc<str>,
        shared: &SharedTx<DB>,
        batch: &tracing::Span,
    ) -> Option<Ran> {
        let i = self;
        let (id, attempts) = (row.id, row.attempts);
        let span = tracing::info_span!(
            "outbox_delivery",
            id,
            topic = %row.topic,
            msg_id = %row.msg_id,
            attempts,
            batch = true,
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        {
            crate::otel::delivery(&span, &row);
            crate::otel::in_batch(&span, batch);
        }
        // Not claimable otherwise: claims filter on the routed topics.
        let route = i.routing.routes.get(&row.topic).cloned()?;
        let takes = Arc::new(AtomicU32::new(0));
        let delay = i
            .policy
            .backoff
            .jittered(u32::try_from(attempts).unwrap_or(0), id);
        let lease = OutboxLease::new(id, row.topic.clone(), &**owner, attempts)
            .with_book(i.policy.max_attempts, delay.as_secs_f64())
            .enqueued(row.enqueued_ago());
        let mut delivery = Delivery::new(i.pool.clone(), row.clone(), lease.clone(), takes.clone());
        delivery.batch = Some(shared.clone());
        // A panicking handler is a failed attempt: its task unwinds,
        // which rolls its call back to the savepoint and hands the batch's
        // transaction back.
        let started = tokio::time::Instant::now();
        let run = consume::run(&route, delivery);
        // The handler's spans nest under the delivery (its task is started
        // in the current span).
        #[cfg(feature = "opentelemetry")]
        let run = tracing::Instrument::instrument(run, span.clone());
        let result = run.await;
        let ran = started.elapsed();
        let takes = takes.load(Ordering::Relaxed);
        Some(Ran {
            row,
            lease,
            marked: takes > 0,
            result: one_call_per_delivery(takes, result),
            ran,
            span,
        })
    }
}

/// Commits a batch's transaction (under the probe's lost
/// acknowledgements, [`Commit::Batch`](crate::probe::Commit::Batch)).
async fn commit<DB: Backend>(tx: CallerTx<DB>) -> Result<(), Error> {
    if crate::probe::batch_conflict() {
        // Rolled back (dropped), as the loser of a deadlock is.
        drop(tx);
        return Err(Error::TransactionLost {
            reason: INJECTED_CONFLICT.to_owned(),
        });
    }
    crate::probe::after_commit(crate::probe::Commit::Batch, tx.commit().await)
}
