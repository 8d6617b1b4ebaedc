//! How long records must live: [`RetentionPolicy`].

use idem_core::Error;
use idem_core::duration::human;
use idem_core::outbox::RelaySettings;
use std::time::Duration;

/// Whether records live long enough: a record must outlast every
/// duplicate of its call, or the duplicate finds no record and executes
/// again.
///
/// The longest duplicate window is the outbox's [retry
/// horizon](Self::retry_horizon) plus `broker_redelivery_allowance`: how
/// much later a broker redelivery, a payment platform's callback retry, or
/// a relay outage (messages wait, then are delivered late) can still bring
/// the same message. [`check`](Self::check) it at start-up;
/// [`for_relay`](Self::for_relay) fills in a relay's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// The record strategy's `ttl` (the shortest, if handlers differ).
    pub record_ttl: Duration,
    /// The relay's `max_attempts`.
    pub outbox_max_attempts: u32,
    /// The relay's back-off after the first failed attempt.
    pub backoff_base: Duration,
    /// The relay's longest back-off.
    pub backoff_max: Duration,
    /// The relay's lease.
    pub lease: Duration,
    /// How much later than the outbox a duplicate can still arrive.
    pub broker_redelivery_allowance: Duration,
}

impl RetentionPolicy {
    /// The retention policy of records written by a relay's handlers:
    /// their `ttl` (`record_ttl`) against the retry horizon of a relay
    /// with `settings` ([`Relay::settings`](idem_core::outbox::Relay::settings))
    /// plus `broker_redelivery_allowance` (how late a broker, a callback
    /// sender or a relay outage can still bring a duplicate). Call
    /// [`check`](Self::check) on it at start-up.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    /// use idem_runtime::archive::RetentionPolicy;
    /// use idem_runtime::outbox::Relay;
    /// use std::time::Duration;
    /// let relay = Relay::new(pool).max_attempts(10).lease(Duration::from_secs(30));
    /// let day = Duration::from_secs(86_400);
    /// let of = |ttl| RetentionPolicy::for_relay(&relay.settings(), ttl, day);
    /// assert!(of(7 * day).check().is_ok());
    /// assert!(of(Duration::from_secs(60)).check().is_err());
    /// # }
    /// ```
    pub fn for_relay(
        settings: &RelaySettings,
        record_ttl: Duration,
        broker_redelivery_allowance: Duration,
    ) -> Self {
        RetentionPolicy {
            record_ttl,
            outbox_max_attempts: settings.max_attempts,
            backoff_base: settings.backoff_base,
            backoff_max: settings.backoff_max,
            lease: settings.lease,
            broker_redelivery_allowance,
        }
    }

    /// The outbox's whole retry horizon: how long after its first attempt
    /// a message can still be attempted, as the relay behaves. Each of the
    /// `max_attempts` attempts can hold the message for a whole lease (a
    /// handler that hangs or a relay that dies is only noticed when the
    /// lease expires), and each failed attempt but the last (which
    /// dead-letters) waits `min(base · 2^(k-1), max)` before the next —
    /// the jitter only shortens that.
    ///
    /// ```
    /// use idem_runtime::archive::RetentionPolicy;
    /// use std::time::Duration;
    /// let p = RetentionPolicy {
    ///     record_ttl: Duration::from_secs(7 * 86_400),
    ///     outbox_max_attempts: 4,
    ///     backoff_base: Duration::from_secs(1),
    ///     backoff_max: Duration::from_secs(3),
    ///     lease: Duration::from_secs(10),
    ///     broker_redelivery_allowance: Duration::ZERO,
    /// };
    /// // 4 leases + back-offs of 1 s, 2 s, 3 s (capped).
    /// assert_eq!(p.retry_horizon(), Duration::from_secs(46));
    /// ```
    pub fn retry_horizon(&self) -> Duration {
        let attempts = self.outbox_max_attempts.max(1);
        let max = self.backoff_max.max(self.backoff_base);
        let mut total = self.lease.saturating_mul(attempts);
        // The relay caps the exponent at 30: from there on every back-off
        // is the same, so sum the first ones and multiply the rest.
        let waits = attempts - 1;
        for k in 1..=waits.min(31) {
            total = total.saturating_add(self.backoff_base.saturating_mul(1 << (k - 1)).min(max));
        }
        if waits > 31 {
            let last = self.backoff_base.saturating_mul(1 << 30).min(max);
            total = total.saturating_add(last.saturating_mul(waits - 31));
        }
        total
    }

    /// The longest duplicate window: the retry horizon plus the broker
    /// allowance.
    pub fn duplicate_window(&self) -> Duration {
        self.retry_horizon()
            .saturating_add(self.broker_redelivery_allowance)
    }

    /// `Ok` when records outlive the longest duplicate window; else an
    /// [`Error::Config`] that says the numbers.
    ///
    /// ```
    /// use idem_runtime::archive::RetentionPolicy;
    /// use std::time::Duration;
    /// let h = Duration::from_secs(3600);
    /// let p = RetentionPolicy {
    ///     record_ttl: h,
    ///     outbox_max_attempts: 10,
    ///     backoff_base: Duration::from_millis(200),
    ///     backoff_max: Duration::from_secs(60),
    ///     lease: Duration::from_secs(30),
    ///     broker_redelivery_allowance: h,
    /// };
    /// let err = p.check().unwrap_err().to_string();
    /// assert!(err.contains("record ttl 1h is shorter than the longest duplicate window"), "{err}");
    /// assert!(RetentionPolicy { record_ttl: 3 * h, ..p }.check().is_ok());
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        let horizon = self.retry_horizon();
        let window = self.duplicate_window();
        if self.record_ttl > window {
            return Ok(());
        }
        let relation = if self.record_ttl < window {
            "is shorter than"
        } else {
            "is no longer than"
        };
        Err(Error::Config {
            reason: format!(
                "record ttl {} {relation} the longest duplicate window {} \
                 (outbox retry horizon {} + broker allowance {}): a late retry would execute twice",
                human(self.record_ttl),
                human(window),
                human(horizon),
                human(self.broker_redelivery_allowance),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const M: Duration = Duration::from_secs(60);
    const H: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(86_400);

    fn policy(record_ttl: Duration, allowance: Duration) -> RetentionPolicy {
        // The relay's defaults.
        RetentionPolicy {
            record_ttl,
            outbox_max_attempts: 10,
            backoff_base: Duration::from_millis(200),
            backoff_max: 60 * S,
            lease: 30 * S,
            broker_redelivery_allowance: allowance,
        }
    }

    #[test]
    fn retry_horizon_sums_leases_and_capped_backoffs() {
        // 10 leases of 30 s; back-offs 0.2, 0.4, … 51.2 s after the first
        // nine failures (all below the 60 s cap): 102.2 s.
        let p = policy(DAY, Duration::ZERO);
        assert_eq!(p.retry_horizon(), Duration::from_millis(300_000 + 102_200));
        // Capped: 1 s doubling to 60 s over 12 attempts.
        let p = RetentionPolicy {
            outbox_max_attempts: 12,
            backoff_base: S,
            backoff_max: M,
            lease: M,
            ..p
        };
        let waits: u32 = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60].iter().sum();
        assert_eq!(p.retry_horizon(), 12 * M + waits * S);
        // One attempt: one lease, no back-off.
        let p = RetentionPolicy {
            outbox_max_attempts: 1,
            ..p
        };
        assert_eq!(p.retry_horizon(), M);
    }

    #[test]
    fn retry_horizon_of_huge_settings_saturates_without_looping() {
        let p = RetentionPolicy {
            outbox_max_attempts: u32::MAX,
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_secs(u64::MAX / 4),
            ..policy(DAY, Duration::ZERO)
        };
        assert!(p.retry_horizon() > 100 * 365 * DAY);
        assert!(p.check().is_err());
    }

    #[test]
    fn check_rejects_a_ttl_inside_the_duplicate_window_with_the_numbers() {
        let p = RetentionPolicy {
            outbox_max_attempts: 3,
            backoff_base: 30 * M,
            backoff_max: H,
            lease: 5 * M / 3,
            ..policy(H, H)
        };
        // 3 leases (5 min) + 30 min + 1 h = 1h 35m; + 1 h allowance.
        assert_eq!(p.retry_horizon(), H + 35 * M);
        let err = p.check().unwrap_err();
        assert!(!err.is_retryable());
        assert_eq!(err.kind(), idem_core::ErrorKind::Config);
        assert_eq!(
            err.to_string(),
            "unsafe configuration: record ttl 1h is shorter than the longest duplicate window \
             2h 35m (outbox retry horizon 1h 35m + broker allowance 1h): a late retry would \
             execute twice"
        );
        // Exactly the window is not enough either.
        let equal = RetentionPolicy {
            record_ttl: 2 * H + 35 * M,
            ..p
        };
        assert!(
            equal
                .check()
                .unwrap_err()
                .to_string()
                .contains("is no longer than")
        );
    }

    #[test]
    fn check_accepts_a_ttl_beyond_the_duplicate_window() {
        assert!(policy(7 * DAY, DAY).check().is_ok());
        assert!(policy(2 * DAY, DAY).check().is_ok());
        // The defaults' horizon is 6m 42s 200ms.
        assert!(policy(7 * M, Duration::ZERO).check().is_ok());
        let err = policy(6 * M, Duration::ZERO)
            .check()
            .unwrap_err()
            .to_string();
        assert!(err.contains("6m 42s 200ms"), "{err}");
    }

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(2 * H + 5 * M), "2h 5m");
        assert_eq!(human(DAY + 2 * H), "1d 2h");
        assert_eq!(human(Duration::from_millis(1500)), "1s 500ms");
    }
}
