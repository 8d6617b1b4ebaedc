//! The running consumer: claims and reads sized to the free slots, a
//! task per entry (settled in [`settle`](super::settle)), and the keeper
//! that holds the entries in hand.

use super::commands::{self, Entry};
use super::shared::Shared;
use idem_core::Error;
use idem_core::backoff::{Backoff, FailureLog};
use idem_core::consume::Counter;
use redis::RedisError;
use redis::aio::ConnectionManager;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Where the claims are: `XAUTOCLAIM`'s cursor, and when the last scan
/// ended.
struct Claims {
    cursor: String,
    last: Option<Instant>,
}

impl Claims {
    fn due(&self, every: Duration) -> bool {
        // A scan that did not go round goes on at once.
        self.cursor != "0-0" || self.last.is_none_or(|l| l.elapsed() >= every)
    }
}

/// The consumer's task: claims, then reads, as many entries as it has
/// free slots, a task per entry, until stopped.
pub(super) async fn run(
    shared: Arc<Shared>,
    mut reader: ConnectionManager,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let slots = Arc::new(Semaphore::new(shared.max_in_flight));
    let mut tasks = JoinSet::new();
    // Ends the waits of handlers in an outage or a back-off once the
    // consumer stops.
    let (ending, ending_rx) = watch::channel(false);
    let keeper = tokio::spawn(keep(shared.clone()));
    // Failing reads: one warning, then one line when they succeed again
    // (read again every second meanwhile).
    let mut reads = FailureLog::new(
        "Redis Streams reads",
        Backoff::new(Duration::from_secs(1), Duration::from_secs(1)),
    );
    let mut claims = Claims {
        cursor: "0-0".to_owned(),
        last: None,
    };
    loop {
        while tasks.try_join_next().is_some() {}
        let first = tokio::select! {
            biased;
            _ = stop.changed() => break,
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        // Not cancelled by a stop (a read is short: `tick`): what it
        // returns is this consumer's, and is handled.
        match shared.fetch(&mut reader, &mut claims, permits.len()).await {
            Ok(batch) => {
                reads.succeeded();
                for (entry, delivered) in batch {
                    if !shared.take(&entry.id) {
                        continue;
                    }
                    let Some(permit) = permits.pop() else { break };
                    let (s, ending) = (shared.clone(), ending_rx.clone());
                    tasks.spawn(async move { s.process(entry, delivered, permit, ending).await });
                }
            }
            Err(e) => {
                let mut conn = shared.conn.clone();
                match commands::recreate_if_lost(&mut conn, &shared.stream, &shared.group, &e).await
                {
                    Ok(true) => continue,
                    Ok(false) => shared.read_failed(&mut reads, &e),
                    Err(e) => shared.read_failed(&mut reads, &e),
                }
                drop(permits);
                if pause(&mut stop, Duration::from_secs(1)).await {
                    break;
                }
            }
        }
    }
    ending.send_replace(true);
    // In-flight handlers finish and settle their entries.
    while tasks.join_next().await.is_some() {}
    keeper.abort();
    Ok(())
}

/// Sleeps `d`; `true` when a stop came first.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = stop.changed() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// Every `tick`, resets the idle time of the entries in hand (`XCLAIM …
/// JUSTID`), so that no consumer claims them while their handlers run.
async fn keep(shared: Arc<Shared>) {
    let mut conn = shared.conn.clone();
    let mut tick = tokio::time::interval(shared.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ids: Vec<String> = shared.hand().iter().cloned().collect();
        if ids.is_empty() {
            continue;
        }
        let kept = commands::keep(&mut conn, &shared.stream, &shared.group, &shared.name, &ids);
        match kept.await {
            Ok(()) => shared.stats.count(Counter::ProgressAck),
            Err(e) => tracing::debug!(error = %e, "could not keep the entries in hand"),
        }
    }
}

impl Shared {
    /// Claimed entries first (every `tick`, or at once while a scan goes
    /// on), else new ones: each with the times it was handed out.
    async fn fetch(
        &self,
        reader: &mut ConnectionManager,
        claims: &mut Claims,
        count: usize,
    ) -> Result<Vec<(Entry, u32)>, RedisError> {
        if claims.due(self.tick) {
            let mut conn = self.conn.clone();
            let (next, entries) = commands::auto_claim(
                &mut conn,
                &self.stream,
                &self.group,
                &self.name,
                self.claim_after,
                &claims.cursor,
                count,
            )
            .await?;
            claims.cursor = next;
            claims.last = Some(Instant::now());
            // Entries this consumer holds already (their idle time not
            // reset while Redis was away) are not claimed again.
            let mut entries = entries;
            entries.retain(|e| !self.hand().contains(&e.id));
            if !entries.is_empty() {
                let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
                // Claimed: handed out twice at least.
                let counts = commands::delivery_counts(&mut conn, &self.stream, &self.group, &ids)
                    .await
                    .unwrap_or_else(|_| vec![2; ids.len()]);
                self.claimed
                    .fetch_add(entries.len() as u64, Ordering::Relaxed);
                tracing::info!(stream = %self.stream, group = %self.group, claimed = entries.len(), "claimed entries left pending by another consumer");
                return Ok(entries.into_iter().zip(counts).collect());
            }
        }
        let entries = commands::read_new(
            reader,
            &self.stream,
            &self.group,
            &self.name,
            count,
            self.tick,
        )
        .await?;
        Ok(entries.into_iter().map(|e| (e, 1)).collect())
    }

    /// Counts a failed read; logged once per change of state (`log`).
    fn read_failed(&self, log: &mut FailureLog, e: &dyn std::fmt::Display) {
        self.stats.count(Counter::PullFailure);
        log.failed(&format!(
            "{e} (stream {}, group {})",
            self.stream, self.group
        ));
    }
}
