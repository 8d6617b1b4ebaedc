//! Exponential back-off, written once: the relay's retry delays (with
//! jitter), the AMQP consumer's retry-queue TTLs (without: the retry queue
//! expires in order), and the examples' simulated payment platform.

use std::hash::BuildHasher;
use std::time::Duration;

/// The largest exponent: from the 31st attempt on, every delay is the same.
const MAX_EXPONENT: u32 = 30;

/// `base · 2^(attempt-1)`, capped at `max`.
///
/// ```
/// use idem_runtime::backoff::Backoff;
/// use std::time::Duration;
/// let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(b.delay(1), Duration::from_millis(100));
/// assert_eq!(b.delay(3), Duration::from_millis(400));
/// assert_eq!(b.delay(10), Duration::from_secs(1));
/// let j = b.jittered(3, 42);
/// assert!(j >= Duration::from_millis(200) && j <= Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failed attempt.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// From `base`, doubling up to `max` (a `max` below `base` is `base`).
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max: max.max(base),
        }
    }

    /// The delay after the `attempt`-th failure (from 1; 0 counts as 1):
    /// `base · 2^(attempt-1)`, capped at `max`. No jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(MAX_EXPONENT);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// [`delay`](Self::delay) with jitter: between half and all of it,
    /// drawn afresh on each call (`salt`, such as a message id, spreads
    /// messages that failed together).
    pub fn jittered(&self, attempt: u32, salt: i64) -> Duration {
        let full = self.delay(attempt);
        let noise = std::collections::hash_map::RandomState::new().hash_one((salt, attempt));
        let frac = (noise % 1_000) as f64 / 1_000.0;
        full.mul_f64(0.5 + 0.5 * frac)
    }
}

/// A loop's repeated operation (a relay's claims, a consumer's pulls or
/// reads) failing and recovering, logged once per change of state rather
/// than once per try: a warning when it starts failing (with the error),
/// each further failure at debug level, an info line when it succeeds
/// again (with how many tries failed and for how long); and, while it
/// fails, the back-off before the next try.
///
/// ```
/// use idem_runtime::backoff::{Backoff, FailureLog};
/// use std::time::Duration;
/// let mut pulls = FailureLog::new("pulls", Backoff::new(Duration::from_millis(100), Duration::from_secs(5)));
/// assert_eq!(pulls.backoff(), None);
/// pulls.failed(&"connection refused"); // warns
/// pulls.failed(&"connection refused"); // debug only
/// assert_eq!(pulls.backoff(), Some(Duration::from_millis(200)));
/// pulls.succeeded(); // "pulls succeed again", failures=2
/// assert!(!pulls.is_failing());
/// ```
#[derive(Debug)]
pub struct FailureLog {
    what: &'static str,
    backoff: Backoff,
    failing: Option<(std::time::Instant, u32)>,
}

impl FailureLog {
    /// The log of `what` (plural: "outbox claims", "JetStream pulls"),
    /// backing off by `backoff` while it fails.
    pub fn new(what: &'static str, backoff: Backoff) -> Self {
        FailureLog {
            what,
            backoff,
            failing: None,
        }
    }

    /// A try failed with `error`: warns if the last one had succeeded.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        let what = self.what;
        match &mut self.failing {
            None => {
                tracing::warn!(error = %error, "{what} are failing; backing off, logged again once they succeed");
                self.failing = Some((std::time::Instant::now(), 1));
            }
            Some((_, failures)) => {
                *failures = failures.saturating_add(1);
                tracing::debug!(error = %error, failures = *failures, "{what} still failing");
            }
        }
    }

    /// A try succeeded: says so once, if tries had been failing.
    pub fn succeeded(&mut self) {
        if let Some((since, failures)) = self.failing.take() {
            let what = self.what;
            tracing::info!(failures, failing_for = ?since.elapsed(), "{what} succeed again");
        }
    }

    /// Whether the last try failed.
    pub fn is_failing(&self) -> bool {
        self.failing.is_some()
    }

    /// The wait before the next try while tries fail (the back-off's delay
    /// for the failures so far); `None` when the last one succeeded.
    pub fn backoff(&self) -> Option<Duration> {
        self.failing
            .map(|(_, failures)| self.backoff.delay(failures))
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn doubles_and_caps() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), b.max);
        assert_eq!(b.delay(u32::MAX), b.max);
    }

    #[test]
    fn max_below_base_is_base() {
        let b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.max, Duration::from_secs(2));
        assert_eq!(b.delay(7), Duration::from_secs(2));
    }

    #[test]
    fn huge_base_saturates() {
        let b = Backoff::new(Duration::MAX / 2, Duration::MAX);
        assert_eq!(b.delay(40), Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_half_and_full() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for attempt in 1..20u32 {
            let d = b.jittered(attempt, 7);
            let full = (b.base * 2u32.pow((attempt - 1).min(20))).min(b.max);
            assert!(d >= full / 2 && d <= full, "{attempt}: {d:?} vs {full:?}");
        }
    }
}
