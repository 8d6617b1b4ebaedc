//! The figures every live view shares: the outbox's counts, its
//! deliveries per bucket and its lease holders are read at most once per
//! sampling interval, however many browser tabs refresh the overview and
//! however often `/metrics` is scraped. One reader queries while the
//! others wait for its answer; a requeue made through the console clears
//! the counts, so its own effect shows at once.
//!
//! On a large outbox a read can take long (the counts scan the table):
//! a value is then kept for [`STRETCH`] times as long as its read took, if
//! that is longer than the interval, so that the console never spends
//! more than about a tenth of its time reading one figure, whatever the
//! outbox's size and however many viewers it has.

use crate::Inner;
use idem_runtime::outbox::admin::{self, LeaseHolder, OutboxStats};
use idem_runtime::{Backend, Error};
use std::future::Future;
use std::time::Duration;
use std::time::Instant;
use tokio::sync::Mutex;

/// A value is kept at least this many times as long as its read took.
pub(crate) const STRETCH: u32 = 10;

/// Whether a value read `age` ago, whose read took `took`, is still good
/// for a reader that wants it at most `max_age` old.
/// (`stretch`: [`STRETCH`], but in tests.)
fn keeps(age: Duration, max_age: Duration, took: Duration, stretch: u32) -> bool {
    age < max_age.max(took.saturating_mul(stretch))
}

/// One value, when it was read and how long the read took.
#[derive(Debug)]
struct Read<T> {
    at: Instant,
    took: Duration,
    value: T,
}

/// One value and when it was read.
#[derive(Debug)]
pub(crate) struct Cached<T> {
    cell: Mutex<Option<Read<T>>>,
    stretch: u32,
}

impl<T: Clone> Cached<T> {
    pub(crate) fn new() -> Self {
        Cached {
            cell: Mutex::new(None),
            stretch: STRETCH,
        }
    }

    /// A cell whose values age by the clock alone, however long their
    /// reads took (tests of the interval).
    #[cfg(test)]
    fn unstretched() -> Self {
        Cached {
            cell: Mutex::new(None),
            stretch: 0,
        }
    }

    /// The value if read less than `max_age` ago (or less than
    /// [`STRETCH`] times its read's duration ago), else `fetch`'s (kept).
    /// A reader dropped mid-fetch keeps nothing and lets the next one in.
    pub(crate) async fn get<F, Fut>(&self, max_age: Duration, fetch: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut cell = self.cell.lock().await;
        if let Some(r) = cell.as_ref()
            && keeps(r.at.elapsed(), max_age, r.took, self.stretch)
        {
            return Ok(r.value.clone());
        }
        let started = Instant::now();
        let value = fetch().await?;
        *cell = Some(Read {
            at: Instant::now(),
            took: started.elapsed(),
            value: value.clone(),
        });
        Ok(value)
    }

    /// Forgets the value: the next reader queries.
    pub(crate) async fn clear(&self) {
        *self.cell.lock().await = None;
    }
}

/// The shared figures of one console.
#[derive(Debug)]
pub(crate) struct Figures {
    pub(crate) stats: Cached<OutboxStats>,
    pub(crate) deliveries: Cached<Vec<u64>>,
    pub(crate) leases: Cached<Vec<LeaseHolder>>,
}

impl Figures {
    pub(crate) fn new() -> Self {
        Figures {
            stats: Cached::new(),
            deliveries: Cached::new(),
            leases: Cached::new(),
        }
    }
}

impl<DB: Backend> Inner<DB> {
    /// The outbox's counts, at most one sampling interval old.
    pub(crate) async fn stats(&self) -> Result<OutboxStats, Error> {
        self.figures
            .stats
            .get(self.sample_every, || admin::stats(&self.pool, None))
            .await
    }

    /// Deliveries per chart bucket, at most one sampling interval old.
    pub(crate) async fn deliveries(&self) -> Result<Vec<u64>, Error> {
        self.figures
            .deliveries
            .get(self.sample_every, || {
                admin::deliveries(&self.pool, crate::chart::WINDOW, crate::chart::BUCKET)
            })
            .await
    }

    /// The relays holding leases, at most one sampling interval old.
    pub(crate) async fn leases(&self) -> Result<Vec<LeaseHolder>, Error> {
        self.figures
            .leases
            .get(self.sample_every, || admin::leases(&self.pool))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_fresh_value_is_shared_and_a_cleared_one_read_again() {
        let reads = AtomicU32::new(0);
        let cell: Cached<u32> = Cached::unstretched();
        let read = || async { Ok(reads.fetch_add(1, Ordering::SeqCst) + 1) };
        let long = Duration::from_secs(60);
        assert_eq!(cell.get(long, read).await.unwrap(), 1);
        assert_eq!(
            cell.get(long, read).await.unwrap(),
            1,
            "fresh: not read again"
        );
        assert_eq!(
            cell.get(Duration::ZERO, read).await.unwrap(),
            2,
            "stale: read again"
        );
        cell.clear().await;
        assert_eq!(
            cell.get(long, read).await.unwrap(),
            3,
            "cleared: read again"
        );
        // Many readers at once: one read.
        let cell: Cached<u32> = Cached::new();
        let all = futures_join(&cell, &reads, long).await;
        assert!(all.iter().all(|v| *v == 4), "{all:?}");
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        // A failed read keeps nothing.
        let cell: Cached<u32> = Cached::new();
        let failed = cell
            .get(long, || async {
                Err(Error::Config {
                    reason: "down".into(),
                })
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(cell.get(long, || async { Ok(7) }).await.unwrap(), 7);
    }

    #[test]
    fn a_slow_read_is_kept_ten_times_as_long_as_it_took() {
        let ms = Duration::from_millis;
        let interval = ms(2000);
        // A fast read: the interval decides.
        assert!(keeps(ms(1999), interval, ms(5), STRETCH));
        assert!(!keeps(ms(2000), interval, ms(5), STRETCH));
        // A read of 3 s (the counts of a very large outbox): kept 30 s.
        assert!(keeps(ms(29_999), interval, ms(3000), STRETCH));
        assert!(!keeps(ms(30_000), interval, ms(3000), STRETCH));
        // No interval and no measured time: read again.
        assert!(!keeps(ms(1), Duration::ZERO, Duration::ZERO, STRETCH));
        // No overflow, however long a read took.
        assert!(keeps(ms(10), interval, Duration::MAX, STRETCH));
    }

    #[tokio::test]
    async fn a_read_that_took_long_is_not_read_again_at_once() {
        let reads = AtomicU32::new(0);
        let cell: Cached<u32> = Cached::new();
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(reads.fetch_add(1, Ordering::SeqCst) + 1)
        };
        assert_eq!(cell.get(Duration::ZERO, slow).await.unwrap(), 1);
        // Wanted fresh, but the last read took 300 ms: kept for 3 s.
        assert_eq!(cell.get(Duration::ZERO, slow).await.unwrap(), 1);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    async fn futures_join(cell: &Cached<u32>, reads: &AtomicU32, long: Duration) -> Vec<u32> {
        let read = || async {
            tokio::task::yield_now().await;
            Ok(reads.fetch_add(1, Ordering::SeqCst) + 1)
        };
        let (a, b, c) = tokio::join!(
            cell.get(long, read),
            cell.get(long, read),
            cell.get(long, read)
        );
        vec![a.unwrap(), b.unwrap(), c.unwrap()]
    }
}
