//! The figures every live view shares: the outbox's backlog, its
//! delivered counts, its deliveries per bucket and its lease holders are
//! read at most once per sampling interval, however many browser tabs
//! refresh the overview and however often `/metrics` is scraped. One
//! reader queries; while it does, the others get the value it replaces
//! (or, when there is none yet, wait for its answer). A requeue made
//! through the console clears the backlog, so its own effect shows at
//! once.
//!
//! On a large outbox a read can take long (the delivered counts scan the
//! table): a value is then kept for [`STRETCH`] times as long as its read
//! took, if that is longer than the interval, so that the console never
//! spends more than about a tenth of its time reading one figure, whatever
//! the outbox's size and however many viewers it has. The backlog is read
//! apart from the delivered counts, through the status index, so it stays
//! fresh on an outbox of any size.

use crate::Inner;
use crate::chart::{BUCKET, WINDOW};
use crate::read::{READ_TIMEOUT, SCAN_TIMEOUT, bounded};
use idem_runtime::outbox::admin::{self, LeaseHolder, OutboxStats, TopicStats};
use idem_runtime::{Error, Operable};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use std::time::Instant;

/// A value is kept at least this many times as long as its read took.
pub(crate) const STRETCH: u32 = 10;

/// How many sampling intervals old a page or scrape takes the delivered
/// counts, which the sampler refreshes every interval.
const COUNTS_AGE: u32 = 15;

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
    /// The last value read (locked only to look or to store, never across
    /// a read).
    cell: Mutex<Option<Read<T>>>,
    /// Held by the reader that queries.
    reading: tokio::sync::Mutex<()>,
    stretch: u32,
}

impl<T: Clone> Cached<T> {
    pub(crate) fn new() -> Self {
        Self::stretched(STRETCH)
    }

    fn stretched(stretch: u32) -> Self {
        Cached {
            cell: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            stretch,
        }
    }

    /// A cell whose values age by the clock alone, however long their
    /// reads took (tests of the interval).
    #[cfg(test)]
    fn unstretched() -> Self {
        Self::stretched(0)
    }

    fn cell(&self) -> MutexGuard<'_, Option<Read<T>>> {
        // A panic while storing leaves a whole value or none: still usable.
        self.cell.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value if still good for `max_age`.
    fn fresh(&self, max_age: Duration) -> Option<T> {
        self.cell()
            .as_ref()
            .filter(|r| keeps(r.at.elapsed(), max_age, r.took, self.stretch))
            .map(|r| r.value.clone())
    }

    /// The value if read less than `max_age` ago (or less than
    /// [`STRETCH`] times its read's duration ago), else `fetch`'s (kept).
    /// While another reader fetches, the value it replaces is returned
    /// when there is one. A reader dropped mid-fetch keeps nothing and
    /// lets the next one in.
    pub(crate) async fn get<F, Fut>(&self, max_age: Duration, fetch: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        if let Some(v) = self.fresh(max_age) {
            return Ok(v);
        }
        let _reading = match self.reading.try_lock() {
            Ok(guard) => guard,
            Err(_) => {
                if let Some(r) = self.cell().as_ref() {
                    return Ok(r.value.clone());
                }
                self.reading.lock().await
            }
        };
        // The reader before may have just stored a fresh value.
        if let Some(v) = self.fresh(max_age) {
            return Ok(v);
        }
        let started = Instant::now();
        let value = fetch().await?;
        *self.cell() = Some(Read {
            at: Instant::now(),
            took: started.elapsed(),
            value: value.clone(),
        });
        Ok(value)
    }

    /// The last value read, however old, and its age (none: never read,
    /// or cleared).
    pub(crate) fn last(&self) -> Option<(T, Duration)> {
        self.cell()
            .as_ref()
            .map(|r| (r.value.clone(), r.at.elapsed()))
    }

    /// Forgets the value once the read under way, if any, is done (so that
    /// it cannot store what it read before): the next reader queries.
    pub(crate) async fn clear(&self) {
        let _reading = self.reading.lock().await;
        *self.cell() = None;
    }
}

/// The shared figures of one console.
#[derive(Debug)]
pub(crate) struct Figures {
    /// Pending and failed messages, the oldest pending age.
    pub(crate) backlog: Cached<OutboxStats>,
    /// Every message's count, for the delivered ones.
    pub(crate) counts: Cached<OutboxStats>,
    pub(crate) deliveries: Cached<Vec<u64>>,
    pub(crate) leases: Cached<Vec<LeaseHolder>>,
    /// `/metrics` scrapes that could not read the database.
    pub(crate) scrape_errors: AtomicU64,
}

impl Figures {
    pub(crate) fn new() -> Self {
        Figures {
            backlog: Cached::new(),
            counts: Cached::new(),
            deliveries: Cached::new(),
            leases: Cached::new(),
            scrape_errors: AtomicU64::new(0),
        }
    }
}

/// The backlog's figures (pending, failed, oldest pending age), with the
/// delivered counts of `counts`, which may be older; the totals summed
/// again. A topic of `counts` with no backlog now keeps its delivered
/// messages only.
pub(crate) fn merge(backlog: &OutboxStats, counts: &OutboxStats) -> OutboxStats {
    let mut by_topic: BTreeMap<&str, TopicStats> = BTreeMap::new();
    for t in &counts.topics {
        if t.success > 0 {
            by_topic.insert(
                &t.topic,
                TopicStats {
                    topic: t.topic.clone(),
                    success: t.success,
                    ..TopicStats::default()
                },
            );
        }
    }
    for t in &backlog.topics {
        let e = by_topic.entry(&t.topic).or_insert_with(|| TopicStats {
            topic: t.topic.clone(),
            ..TopicStats::default()
        });
        e.pending = t.pending;
        e.failed = t.failed;
        e.oldest_pending_age_secs = t.oldest_pending_age_secs;
    }
    let mut totals = TopicStats {
        topic: backlog.totals.topic.clone(),
        oldest_pending_age_secs: backlog.totals.oldest_pending_age_secs,
        ..TopicStats::default()
    };
    let topics: Vec<TopicStats> = by_topic
        .into_values()
        .map(|mut t| {
            t.total = t.pending + t.failed + t.success;
            totals.pending += t.pending;
            totals.failed += t.failed;
            totals.success += t.success;
            totals.total += t.total;
            t
        })
        .collect();
    OutboxStats { topics, totals }
}

impl<DB: Operable> Inner<DB> {
    /// The outbox's backlog, at most one sampling interval old.
    pub(crate) async fn backlog(&self) -> Result<OutboxStats, Error> {
        self.figures
            .backlog
            .get(self.sample_every, || {
                bounded(READ_TIMEOUT, admin::backlog(&self.pool, None))
            })
            .await
    }

    /// The outbox's counts: the backlog at most one sampling interval old,
    /// the delivered messages as the sampler last counted them (at most an
    /// interval ago, or ten times as long as counting took). A reader
    /// counts them itself only when they were never counted, or not for
    /// [`COUNTS_AGE`] intervals (no sampler runs).
    pub(crate) async fn stats(&self) -> Result<OutboxStats, Error> {
        let backlog = self.backlog().await?;
        let counts = self
            .figures
            .counts
            .get(self.sample_every * COUNTS_AGE, || {
                bounded(SCAN_TIMEOUT, admin::stats(&self.pool, None))
            })
            .await?;
        Ok(merge(&backlog, &counts))
    }

    /// Deliveries per chart bucket, at most one sampling interval old.
    pub(crate) async fn deliveries(&self) -> Result<Vec<u64>, Error> {
        self.figures
            .deliveries
            .get(self.sample_every, || {
                bounded(READ_TIMEOUT, admin::deliveries(&self.pool, WINDOW, BUCKET))
            })
            .await
    }

    /// The relays holding leases, at most one sampling interval old.
    pub(crate) async fn leases(&self) -> Result<Vec<LeaseHolder>, Error> {
        self.figures
            .leases
            .get(self.sample_every, || {
                bounded(READ_TIMEOUT, admin::leases(&self.pool))
            })
            .await
    }

    /// The figures as last read, however old, for `/metrics` when this
    /// scrape's read failed: the outbox's counts (the backlog with the
    /// delivered counts as last counted) and how old the backlog is, and
    /// the lease holders.
    pub(crate) fn last_figures(
        &self,
    ) -> (Option<(OutboxStats, Duration)>, Option<Vec<LeaseHolder>>) {
        let stats = self.figures.backlog.last().map(|(backlog, age)| {
            let stats = match self.figures.counts.last() {
                Some((counts, _)) => merge(&backlog, &counts),
                None => backlog,
            };
            (stats, age)
        });
        (stats, self.figures.leases.last().map(|(l, _)| l))
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

    #[tokio::test]
    async fn while_one_reader_reads_the_others_get_the_value_it_replaces() {
        let cell: Cached<u32> = Cached::unstretched();
        cell.get(Duration::ZERO, || async { Ok(1) }).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // `join!` polls in order: the first reader starts its (blocked)
        // read, then the second asks.
        let first = cell.get(Duration::ZERO, || async {
            rx.await.expect("released");
            Ok(2)
        });
        let second = async {
            tokio::task::yield_now().await;
            let v = cell.get(Duration::ZERO, || async { Ok(99) }).await;
            tx.send(()).expect("the first reader waits");
            v
        };
        let both = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(first, second)
        });
        let (first, second) = both.await.expect("the second reader waited for the first");
        assert_eq!(second.unwrap(), 1, "the value being replaced, at once");
        assert_eq!(first.unwrap(), 2);
        let long = Duration::from_secs(60);
        assert_eq!(cell.get(long, || async { Ok(99) }).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_read_under_way_cannot_store_over_a_clear() {
        let cell: Cached<u32> = Cached::unstretched();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let read = cell.get(Duration::ZERO, || async {
            rx.await.expect("released");
            Ok(1) // what it read before the requeue
        });
        let clear = async {
            tokio::task::yield_now().await;
            cell.clear().await;
        };
        let release = async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            tx.send(()).expect("the read waits");
        };
        let (read, (), ()) = tokio::join!(read, clear, release);
        assert_eq!(read.unwrap(), 1);
        let long = Duration::from_secs(60);
        assert_eq!(
            cell.get(long, || async { Ok(2) }).await.unwrap(),
            2,
            "cleared after the read stored: read again"
        );
    }

    #[test]
    fn the_backlog_is_fresh_and_the_delivered_counts_as_last_counted() {
        let t = |topic: &str, pending, failed, success, age: Option<f64>| TopicStats {
            topic: topic.into(),
            pending,
            failed,
            success,
            total: pending + failed + success,
            oldest_pending_age_secs: age,
        };
        let stats = |topics: Vec<TopicStats>, age| OutboxStats {
            totals: TopicStats {
                topic: "(all)".into(),
                oldest_pending_age_secs: age,
                ..TopicStats::default()
            },
            topics,
        };
        let backlog = stats(
            vec![t("a", 2, 1, 0, Some(7.0)), t("b", 0, 3, 0, None)],
            Some(7.0),
        );
        // Older: `a` had 9 pending then, `d` 1 pending and nothing delivered.
        let counts = stats(
            vec![
                t("a", 9, 0, 5, Some(60.0)),
                t("c", 0, 0, 4, None),
                t("d", 1, 0, 0, Some(3.0)),
            ],
            Some(60.0),
        );
        let m = merge(&backlog, &counts);
        assert_eq!(
            m.topics,
            vec![
                t("a", 2, 1, 5, Some(7.0)),
                t("b", 0, 3, 0, None),
                t("c", 0, 0, 4, None)
            ]
        );
        assert_eq!(
            (
                m.totals.pending,
                m.totals.failed,
                m.totals.success,
                m.totals.total
            ),
            (2, 4, 9, 15)
        );
        assert_eq!(m.totals.oldest_pending_age_secs, Some(7.0));
        assert_eq!(m.totals.topic, "(all)");
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
