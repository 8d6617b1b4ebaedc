//! The relay at work: [`Relay::run_once`](super::Relay::run_once), [`Relay::drain`](super::Relay::drain) and the
//! spawned relay's loop, which claims while it has room and hands what it
//! claimed to its one dispatch point.

use super::claim::{Batch, CONFLICT_RETRIES, Round};
use super::lifecycle::claim_health;
use super::{Inner, RelayStatsSnapshot, wake};
use crate::Error;
use crate::backend::{Backend, OutboxRow};
use crate::backoff::FailureLog;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

/// The shortest lease with which a relay claims messages ahead of its free
/// handler slots (see [`Relay::batch_size`](super::Relay::batch_size)).
const AHEAD_MIN_LEASE: Duration = Duration::from_secs(1);

/// What a [`Relay::drain`](super::Relay::drain) did.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct DrainReport {
    /// Rounds that claimed messages.
    pub rounds: u64,
    /// How long it took.
    pub elapsed: Duration,
    /// What the relay counted meanwhile.
    pub stats: RelayStatsSnapshot,
}

impl<DB: Backend> Inner<DB> {
    /// See [`Relay::run_once`](super::Relay::run_once).
    pub(super) async fn run_once(self: &Arc<Self>) -> Result<usize, Error> {
        self.schema_checked().await?;
        if !self.release_kept().await {
            // The database is not back yet: claim nothing this round.
            return Ok(0);
        }
        let batch = self.claim_up_to(self.policy.concurrency as i64).await?;
        let n = batch.rows.len();
        let permits = Arc::new(Semaphore::new(self.policy.concurrency));
        let waiting = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let rows = self.spawn_limited(&mut tasks, batch.rows, &batch.owner, &permits, &waiting);
        if self.batched() {
            self.deliver_batches(rows, batch.owner).await;
        } else {
            for row in rows {
                self.spawn_one(&mut tasks, row, batch.owner.clone(), &permits, &waiting);
            }
        }
        while tasks.join_next().await.is_some() {}
        Ok(n)
    }

    /// The spawned relay's loop (see [`Relay::spawn`](super::Relay::spawn)), until `stop`.
    /// Ends with an error only when the database's schema is refused.
    pub(super) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) -> Result<(), Error> {
        self.warn_short_lease();
        if !self.schema_ready(&mut stop).await? {
            return Ok(());
        }
        // Dropped with this future when a shutdown's deadline aborts it:
        // the heartbeat then deletes its row in the background.
        let heartbeat = self.process_heartbeat();
        // Woken by the listener (push wake-up); a wake-up while the relay
        // is busy is kept as Notify's one permit.
        let wake = Arc::new(Notify::new());
        let listener = self.listen(&wake, &stop);
        let permits = Arc::new(Semaphore::new(self.policy.concurrency));
        let mut tasks = JoinSet::new();
        let refill = self.refill();
        // And, while there is a backlog, it claims up to as many messages
        // more than the free slots as there are slots: the next ones are
        // at hand when the running ones end, instead of their slots idling
        // through a claim (which takes about as long as a handler). They
        // wait for a slot with their leases renewed (see `queued`).
        // Measured (`bench_outbox`, 16 handlers): handler slots busy 53%
        // of the time claiming only free slots, 71% with half the slots
        // ahead, 86% with all.
        let waiting = Arc::new(AtomicUsize::new(0));
        let mut health = claim_health(self.policy.poll_interval);
        while !*stop.borrow() {
            while tasks.try_join_next().is_some() {}
            let backlog = self.claiming.backlog.load(Ordering::Relaxed);
            // Not with leases under a second: between two renewals of a
            // queued message, another relay would take it over (and a
            // short-leased relay claiming ahead mostly feeds the others).
            let ahead = match backlog && self.policy.lease >= AHEAD_MIN_LEASE {
                true => self.claim_ahead(),
                false => 0,
            };
            let room = (permits.available_permits().saturating_add(ahead))
                .saturating_sub(waiting.load(Ordering::Relaxed));
            let starved = backlog && room < refill && !tasks.is_empty();
            if room == 0 || starved {
                tokio::select! {
                    _ = tasks.join_next() => {}
                    changed = stop.changed() => if changed.is_err() { break },
                }
                continue;
            }
            if !self.release_kept().await {
                // The database is not back yet: no claim until every
                // outage attempt is given back.
                tokio::select! {
                    _ = tokio::time::sleep(self.policy.poll_interval) => {}
                    changed = stop.changed() => if changed.is_err() { break },
                }
                continue;
            }
            let Some(batch) = self
                .claim_or_recover(room, &mut tasks, &permits, &waiting, &mut health)
                .await
            else {
                continue;
            };
            if batch.is_empty() {
                let backoff = health.backoff();
                if self.idle(&wake, &mut stop, backoff).await {
                    break;
                }
                continue;
            }
            self.dispatch(&mut tasks, batch, &permits, &waiting);
            // Pushed to, a claim from the oldest that did not fill its
            // limit took every due message it could see: the next ones
            // announce themselves (the notifier's wake-up, or the poll),
            // so claiming again at once would only add an empty claim
            // transaction per wake-up, competing with the producers. A
            // notification that arrived during the claim is Notify's
            // stored permit: it wakes this wait at once. (A claim at a
            // spread offset that took fewer saw only the due set's end.)
            if listener.is_some()
                && self.claiming.emptied.load(Ordering::Relaxed)
                && self.idle(&wake, &mut stop, None).await
            {
                break;
            }
        }
        // Graceful shutdown: claim nothing more, finish what is in flight,
        // give back what an outage left.
        while tasks.join_next().await.is_some() {}
        self.release_kept().await;
        // The listener saw the same stop signal.
        if let Some(listener) = listener {
            let _ = listener.await;
        }
        // Its failure is logged by the heartbeat itself.
        let _ = heartbeat.stop().await;
        Ok(())
    }

    /// The spawned relay's row in `idem_process`, kept fresh (see
    /// [`Relay::heartbeat_interval`](super::Relay::heartbeat_interval)).
    fn process_heartbeat(&self) -> crate::process::Heartbeat {
        crate::process::Heartbeat::builder(
            self.claiming.owner.as_str(),
            "relay",
            self.routing.topics.join(","),
        )
        .interval(self.policy.heartbeat)
        .start(self.pool.clone())
    }

    /// Waits before the next claim: `backoff` while claims fail (no
    /// wake-up shortens it), otherwise until the idle wait is over (see
    /// [`idle_wait`](Self::idle_wait)), a notification, or a kick. `true`:
    /// the handle is gone (a dropped handle stops the relay like a
    /// shutdown).
    async fn idle(
        &self,
        wake: &Notify,
        stop: &mut watch::Receiver<bool>,
        backoff: Option<Duration>,
    ) -> bool {
        if let Some(backoff) = backoff {
            return tokio::select! {
                _ = tokio::time::sleep(backoff) => false,
                changed = stop.changed() => changed.is_err(),
            };
        }
        let idle = self.idle_wait().await;
        tokio::select! {
            _ = tokio::time::sleep(idle) => false,
            _ = wake.notified() => false,
            _ = self.waking.kick.notified() => false,
            changed = stop.changed() => changed.is_err(),
        }
    }

    /// How long an idle spawned relay waits before it claims again: the
    /// poll interval, or less when a relay that is pushed to (see
    /// [`Relay::push_wakeup`](super::Relay::push_wakeup)) knows of a pending message falling
    /// due sooner (a delayed message, or one waiting out its back-off): no
    /// notification announces those.
    async fn idle_wait(&self) -> Duration {
        let poll = self.policy.poll_interval;
        let Some(next_due) = self.claiming.claim.next_due.as_deref() else {
            return poll;
        };
        if !self.pushes() || self.routing.topics.is_empty() {
            return poll;
        }
        match DB::next_due(&self.pool, next_due, &self.routing.topics).await {
            Ok(Some(secs)) if secs.is_finite() => {
                // A millisecond late rather than early: a claim at the due
                // time itself may find it not yet due by the server's clock.
                poll.min(Duration::from_secs_f64(secs.max(0.0)) + Duration::from_millis(1))
            }
            Ok(_) => poll,
            Err(e) => {
                tracing::debug!(error = %format_args!("{e:#}"), "could not read when the next outbox message is due; polling");
                poll
            }
        }
    }

    /// Warns of a lease too short for the heartbeat to renew it in time.
    fn warn_short_lease(&self) {
        let lease = self.policy.lease;
        if lease < 3 * super::attempt::HEARTBEAT_MIN {
            tracing::warn!(
                ?lease,
                "the outbox lease is shorter than three heartbeats ({:?} each): a running handler's lease runs out between its renewals, and relays take its message from one another while it runs",
                super::attempt::HEARTBEAT_MIN
            );
        }
    }

    /// The push listener waking `wake`, if the relay is pushed to.
    fn listen(
        self: &Arc<Self>,
        wake: &Arc<Notify>,
        stop: &watch::Receiver<bool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        match self.pushes() && !self.routing.topics.is_empty() {
            true => wake::spawn_listener(
                &self.pool,
                wake::Listen {
                    owner: &self.claiming.owner,
                    catch_up: self.waking.listener_catch_up,
                },
                &self.routing.topics,
                wake.clone(),
                stop.clone(),
                self.stats_owner(),
            ),
            false => None,
        }
    }

    /// While there is a backlog, a claim waits for this many free slots
    /// rather than taking one message each time a handler ends: a claim
    /// is a transaction of its own, and one per message would cost as
    /// much as the handlers' own. (With no backlog, a claim takes what
    /// is free at once: a lone message does not wait.)
    /// With more claimed ahead than there are slots (see
    /// [`Relay::claim_ahead`](super::Relay::claim_ahead)), half of those.
    fn refill(&self) -> usize {
        let most = self.claiming.batch_size.max(1) as usize;
        let slots = self.policy.concurrency.min(most);
        let ahead = self.claim_ahead().min(most);
        (slots.max(ahead) / 2).max(1)
    }

    /// See [`Relay::claim_ahead`](super::Relay::claim_ahead).
    pub(super) fn claim_ahead(&self) -> usize {
        self.claiming.ahead.unwrap_or(self.policy.concurrency)
    }

    /// One claim of up to `room` messages: what it took (empty when it
    /// failed, to claim again after `health`'s back-off), or `None` when its
    /// outcome is unknown and its rows are read back in a task of `tasks`
    /// (what is read back waits for its slots as a claimed message does).
    async fn claim_or_recover(
        self: &Arc<Self>,
        room: usize,
        tasks: &mut JoinSet<()>,
        permits: &Arc<Semaphore>,
        waiting: &Arc<AtomicUsize>,
        health: &mut FailureLog,
    ) -> Option<Vec<(OutboxRow, Arc<str>)>> {
        // Bounded by the batch size in `claim_round`; never wrapped to a
        // negative LIMIT (which SQLite reads as none, PostgreSQL refuses).
        let round = self
            .claim_round(i64::try_from(room).unwrap_or(i64::MAX))
            .await;
        if round.is_ok() {
            health.succeeded();
        }
        match round {
            Ok(Round::Claimed(b)) => {
                Some(b.rows.into_iter().map(|r| (r, b.owner.clone())).collect())
            }
            Ok(Round::Lost {
                owner,
                chosen,
                error,
            }) => {
                let n = chosen.rows.len();
                let me = self.clone();
                let permits = permits.clone();
                waiting.fetch_add(n, Ordering::Relaxed);
                let waiting = waiting.clone();
                tasks.spawn(async move {
                    let Ok(batch) = me.recover(owner, chosen, error).await else {
                        waiting.fetch_sub(n, Ordering::Relaxed);
                        return;
                    };
                    waiting.fetch_sub(n - batch.rows.len().min(n), Ordering::Relaxed);
                    me.deliver_claimed(batch, permits, waiting).await;
                });
                None
            }
            Err(e)
                if crate::backend::classify::find_sqlx(&e)
                    .is_some_and(crate::backend::classify::is_conflict) =>
            {
                tracing::debug!(error = %format_args!("{e:#}"), retries = CONFLICT_RETRIES, "outbox claim kept losing conflicts; claiming again after the poll interval");
                Some(Vec::new())
            }
            Err(e) => {
                // Logged once per change (failing, succeeding again), and
                // backed off (see `claim_health`).
                health.failed(&e);
                Some(Vec::new())
            }
        }
    }

    /// Hands a claim's messages to their tasks in `tasks`, each counted in
    /// `waiting` until it has its handler slot: batched, one task for all
    /// of them, taking their slots at once (one claim: one owner);
    /// otherwise a task per message, at once when a slot is free.
    fn dispatch(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        batch: Vec<(OutboxRow, Arc<str>)>,
        permits: &Arc<Semaphore>,
        waiting: &Arc<AtomicUsize>,
    ) {
        // One claim: one owner.
        let owner = batch[0].1.clone();
        let rows: Vec<OutboxRow> = batch.into_iter().map(|(row, _)| row).collect();
        let rows = self.spawn_limited(tasks, rows, &owner, permits, waiting);
        if rows.is_empty() {
            return;
        }
        if self.batched() {
            // A claim ahead of the free slots can hold more messages than
            // there are slots: a task per group of at most the slots, each
            // taking its group's slots at once. (One key never has two
            // messages in one claim: the groups' order is free.)
            let slots = self.policy.concurrency.max(1);
            let mut rows = rows;
            while !rows.is_empty() {
                let rest = rows.split_off(rows.len().min(slots));
                self.spawn_group(tasks, rows, owner.clone(), permits, waiting);
                rows = rest;
            }
            return;
        }
        for row in rows {
            self.spawn_one(tasks, row, owner.clone(), permits, waiting);
        }
    }

    /// Spawns the batched delivery of `rows` (at most the relay's slots)
    /// in `tasks`, once it has a slot per message (counted in `waiting`
    /// until then, with their leases renewed while they wait).
    fn spawn_group(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        rows: Vec<OutboxRow>,
        owner: Arc<str>,
        permits: &Arc<Semaphore>,
        waiting: &Arc<AtomicUsize>,
    ) {
        let slots = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        self.in_flight.claimed(ids.iter().copied());
        let me = self.clone();
        let permits = permits.clone();
        waiting.fetch_add(rows.len(), Ordering::Relaxed);
        let waiting = waiting.clone();
        tasks.spawn(async move {
            let reserved = me
                .queued(permits.acquire_many_owned(slots), &owner, &ids)
                .await;
            waiting.fetch_sub(ids.len(), Ordering::Relaxed);
            let ordered = rows.iter().any(|r| r.ordering_key.is_some());
            me.deliver_batches(rows, owner).await;
            me.in_flight.settled(&ids);
            drop(reserved);
            if ordered {
                me.waking.kick.notify_one();
            }
        });
    }

    /// Spawns the delivery of each of `rows` whose topic has limits (see
    /// [`Relay::topic_limit`](super::Relay::topic_limit)) in `tasks`, alone
    /// (never in a batched commit: the limits are per message); returns
    /// the others.
    fn spawn_limited(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        rows: Vec<OutboxRow>,
        owner: &Arc<str>,
        permits: &Arc<Semaphore>,
        waiting: &Arc<AtomicUsize>,
    ) -> Vec<OutboxRow> {
        if !self.limits.any() {
            return rows;
        }
        let (limited, free): (Vec<_>, Vec<_>) =
            rows.into_iter().partition(|r| self.limits.limits(&r.topic));
        for row in limited {
            self.spawn_one(tasks, row, owner.clone(), permits, waiting);
        }
        free
    }

    /// Spawns one message's delivery in `tasks`: once its topic's limits
    /// let it start (if it has limits; meanwhile it is not counted in
    /// `waiting`, so that it takes no room from other topics' claims),
    /// then once it has a handler slot (counted in `waiting` until then),
    /// with its lease renewed while it waits.
    fn spawn_one(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        row: OutboxRow,
        owner: Arc<str>,
        permits: &Arc<Semaphore>,
        waiting: &Arc<AtomicUsize>,
    ) {
        let id = row.id;
        self.in_flight.claimed([id]);
        let held = self.limits.hold(&row.topic);
        if held.is_none() {
            waiting.fetch_add(1, Ordering::Relaxed);
        }
        let me = self.clone();
        let (permits, waiting) = (permits.clone(), waiting.clone());
        tasks.spawn(async move {
            let held = match held {
                Some(held) => {
                    let limited =
                        async { Ok::<_, tokio::sync::AcquireError>(held.acquire().await) };
                    let held = me.queued(limited, &owner, &[row.id]).await;
                    waiting.fetch_add(1, Ordering::Relaxed);
                    Some(held)
                }
                None => None,
            };
            // At once when a slot is free, as it is for all but the
            // claim's `ahead` messages.
            let permit = match permits.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => me.queued(permits.acquire_owned(), &owner, &[row.id]).await,
            };
            waiting.fetch_sub(1, Ordering::Relaxed);
            // The key's next message, or the topic's next start, is due.
            let kick = row.ordering_key.is_some() || held.is_some();
            me.deliver(row, owner).await;
            me.in_flight.settled(&[id]);
            drop(permit);
            drop(held);
            if kick {
                me.waking.kick.notify_one();
            }
        });
    }

    /// Delivers a read-back claim's messages (counted in `waiting` until
    /// each has its slot): batched, a group of at most the slots at once
    /// when their slots are free; otherwise each as soon as it has a slot.
    async fn deliver_claimed(
        self: &Arc<Self>,
        batch: Batch,
        permits: Arc<Semaphore>,
        waiting: Arc<AtomicUsize>,
    ) {
        let n = batch.rows.len();
        // Counted in `waiting` by the caller: counted again per message
        // below, as a fresh claim's are.
        waiting.fetch_sub(n, Ordering::Relaxed);
        let pairs = batch
            .rows
            .into_iter()
            .map(|r| (r, batch.owner.clone()))
            .collect::<Vec<_>>();
        if pairs.is_empty() {
            return;
        }
        let mut deliveries = JoinSet::new();
        self.dispatch(&mut deliveries, pairs, &permits, &waiting);
        while deliveries.join_next().await.is_some() {}
    }

    /// Waits for `slot` (handler slots for claimed messages `ids`),
    /// renewing the messages' leases every third of a lease meanwhile: a
    /// message claimed ahead of a free slot (see `run`) never waits out its
    /// lease in the queue, however slow the running handlers are.
    async fn queued<P>(
        &self,
        slot: impl Future<Output = Result<P, tokio::sync::AcquireError>>,
        owner: &str,
        ids: &[i64],
    ) -> P {
        let i = self;
        let every = (i.policy.lease / 3).max(Duration::from_millis(10));
        tokio::pin!(slot);
        loop {
            tokio::select! {
                got = &mut slot => return got.expect("never closed"),
                _ = tokio::time::sleep(every) => {
                    if crate::probe::broken(crate::probe::Break::QueuedRenewal) {
                        continue;
                    }
                    match DB::renew_leases(&i.pool, owner, ids, i.policy.lease.as_secs_f64()).await {
                        Ok(n) => crate::metrics::lease_renewals(n),
                        Err(e) => tracing::warn!(error = %format_args!("{e:#}"), messages = ids.len(), "could not renew the leases of messages waiting for a handler slot"),
                    }
                }
            }
        }
    }
}

impl<DB: Backend> Inner<DB> {
    /// Whether claims are delivered in batched commits
    /// ([`Relay::commit_batch`](super::Relay::commit_batch) of 2 or more): decided here, for every
    /// path that delivers claimed messages.
    fn batched(&self) -> bool {
        self.batching.commit_batch >= 2
    }
}
