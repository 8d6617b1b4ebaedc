//! A delivery whose handler failed in an outage waits it out in place.

use super::failure::Verdict;
use super::stats::{ConsumerStats, Counter};
use crate::backoff::Backoff;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// The longest pause between two tries of a handler that failed in an
/// outage, unless a consumer sets its own (`outage_retry`): the relay's
/// default [`Relay::outage_retry`](crate::outbox::Relay::outage_retry) too.
pub const OUTAGE_RETRY: Duration = Duration::from_secs(1);

/// Runs `attempt` until its verdict is not an [outage](super::Failure::outage)
/// (nor a [commit whose outcome is unknown](super::Failure::commit_unknown):
/// the connection lost at `COMMIT`), pausing between tries (100 ms
/// doubling to `max`, jittered): a handler whose database is down waits in
/// place for it to come back, and its delivery is settled once, by the
/// first verdict that is not an outage.
/// Nothing is counted against the delivery's attempts meanwhile (the
/// broker is not told), so an outage, however long, never dead-letters a
/// message.
///
/// `ending` turning `true` (or its sender dropped: the consumer is
/// stopping, or its connection failed) ends the wait: the last verdict,
/// an outage, is returned and settled as a retry ([`Failure::next`](super::Failure::next)
/// never makes an outage a dead letter). Each try that failed in an
/// outage counts [`Counter::OutageWait`].
pub async fn through_outages<F, Fut>(
    mut attempt: F,
    ending: &mut watch::Receiver<bool>,
    max: Duration,
    stats: &ConsumerStats,
) -> Verdict
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Verdict>,
{
    let backoff = Backoff::new(Duration::from_millis(100).min(max), max);
    let mut tries = 0u32;
    loop {
        let verdict = attempt().await;
        // A commit whose outcome is unknown is a connection lost at
        // COMMIT: an outage too, and the next try's check in the database
        // tells whether it committed.
        let outage = matches!(&verdict, Err(f) if f.retryable && (f.outage || f.commit_unknown));
        if !outage || crate::probe::broken(crate::probe::Break::OutageCounted) {
            return verdict;
        }
        stats.count(Counter::OutageWait);
        tries = tries.saturating_add(1);
        if *ending.borrow() {
            return verdict;
        }
        let pause = backoff.jittered(tries, 0);
        if tries == 1 || tries.is_power_of_two() {
            let reason = verdict.as_ref().err().map_or("", |f| f.reason.as_str());
            tracing::warn!(tries, %reason, retry_in = ?pause, "handler failed in an outage; waiting for it in place (not counted as an attempt)");
        }
        tokio::select! {
            changed = ending.changed() => if changed.is_err() || *ending.borrow() {
                return verdict;
            },
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
