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
