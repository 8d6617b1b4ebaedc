//! Record lifecycle: expired idempotency records and finished outbox
//! messages move to history tables, in small batches, under live traffic.
//!
//! The online tables must stay small (a record table left alone reaches
//! 100M+ rows in half a year and slows every lookup), but a record is what
//! stops a duplicate: once it leaves `idem_record`, its key is free again
//! and a late duplicate would execute. So:
//!
//! - a record moves only after its `expire_time` (`ttl` in the attribute),
//!   re-checked in the same statement that deletes it;
//! - the ttl must outlast every way a duplicate can still arrive: the
//!   outbox's whole retry horizon plus what brokers, callback senders and
//!   relay outages add. [`RetentionPolicy::check`] says so at start-up,
//!   with the numbers;
//! - archived records stay queryable by key ([`find_record`]);
//! - an archived message keeps its id in `idem_outbox_history`, and its
//!   attempt log (`idem_outbox_attempt`, keyed by that id) stays where it
//!   is: the history of a finished message still shows its failed
//!   attempts. Nothing purges the history tables, so no attempt row is
//!   left without its message; a purge added later deletes the attempt
//!   rows of the messages it deletes, in its transaction.
//!
//! Each batch is one short transaction per table: lock up to `batch_size`
//! candidate rows (PostgreSQL and MariaDB: `FOR UPDATE SKIP LOCKED`, under
//! read committed on MariaDB, so the archiver never waits on handlers;
//! SQLite: `BEGIN IMMEDIATE`), `INSERT INTO …_history … SELECT … WHERE id
//! IN (…)` and `DELETE … WHERE id IN (…)`, both re-checking the condition,
//! then commit — or roll back if the two did not move the same rows. A
//! crash between or inside batches loses nothing and duplicates nothing;
//! re-running continues where it stopped.
//!
//! ```
//! use idem_runtime::archive::Archiver;
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_runtime::Error> {
//! let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
//! idem_runtime::migrate(&pool).await?;
//! let archiver = Archiver::new(pool.clone())
//!     .batch_size(500)
//!     .outbox_retention(Duration::from_secs(3 * 86_400))
//!     .pause(Duration::from_millis(50));
//! // A one-off drain (an operator's command): progress after each batch.
//! let done = archiver.run_once(|so_far| println!("{so_far:?}")).await?;
//! assert_eq!(done.records, 0);
//! // Or in the background, every 10 minutes.
//! let handle = archiver.spawn(Duration::from_secs(600));
//! handle.shutdown().await;
//! # Ok(()) }
//! ```

use crate::Operable;
use idem_core::Error;
use idem_core::backoff::Backoff;
use idem_core::task::{TaskError, TaskHandle, TaskStatus};
use serde::Serialize;
use sqlx::Pool;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use tokio::sync::watch;

mod retention;
pub use retention::RetentionPolicy;

/// A table the archiver moves rows out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveTable {
    /// `idem_record` → `idem_record_history`: records whose `expire_time`
    /// has passed.
    Records,
    /// `idem_outbox` → `idem_outbox_history`: finished (`success`,
    /// `failed`) messages last updated before the retention.
    Outbox,
}

/// An idempotency record, online or archived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RecordInfo {
    /// The idempotency key.
    pub key: String,
    /// The business type.
    pub biz_type: String,
    /// The business document number.
    pub biz_no: String,
    /// Hex SHA-256 of the payload of the call that wrote it.
    pub fingerprint: String,
    /// The handler's serialized result (JSON).
    pub result: Option<String>,
    /// When the record was written, in UTC (SQLite keeps milliseconds;
    /// MariaDB: as stored, UTC since schema version 2 — rows an earlier
    /// release wrote from a session in another time zone keep that zone's
    /// local time).
    #[serde(with = "time::serde::rfc3339")]
    pub create_time: OffsetDateTime,
    /// When it may be archived.
    #[serde(with = "time::serde::rfc3339")]
    pub expire_time: OffsetDateTime,
    /// Whether it was found in `idem_record_history`.
    pub archived: bool,
    /// When it was archived.
    #[serde(with = "time::serde::rfc3339::option")]
    pub archived_at: Option<OffsetDateTime>,
}

/// The outbox retention of [`Archiver::new`]: finished messages last
/// updated longer ago than this move to `idem_outbox_history`.
pub const DEFAULT_OUTBOX_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// The largest batch (bind parameters per statement stay far below every
/// database's limit).
const MAX_BATCH: u32 = 10_000;
/// The longest outbox retention honoured (longer is this).
const MAX_RETENTION: Duration = Duration::from_secs(100 * 365 * 86_400);
/// Transient failures in a row that [`Archiver::run_once`] rides out.
const RETRIES: u32 = 5;

/// Rows moved to history.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ArchiveReport {
    /// `idem_record` rows moved to `idem_record_history`.
    pub records: u64,
    /// `idem_outbox` rows moved to `idem_outbox_history`.
    pub outbox: u64,
    /// Batches run (one batch = one bounded transaction per table).
    pub batches: u64,
}

impl std::ops::AddAssign for ArchiveReport {
    fn add_assign(&mut self, o: Self) {
        self.records += o.records;
        self.outbox += o.outbox;
        self.batches += o.batches;
    }
}

/// Moves expired records and finished outbox messages to the history
/// tables. Cheap to clone.
pub struct Archiver<DB: Operable> {
    pool: Pool<DB>,
    batch_size: u32,
    outbox_retention: Duration,
    pause: Duration,
}

impl<DB: Operable> Clone for Archiver<DB> {
    fn clone(&self) -> Self {
        Archiver {
            pool: self.pool.clone(),
            batch_size: self.batch_size,
            outbox_retention: self.outbox_retention,
            pause: self.pause,
        }
    }
}

impl<DB: Operable> std::fmt::Debug for Archiver<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archiver")
            .field("backend", &<DB as idem_core::Backend>::NAME)
            .field("batch_size", &self.batch_size)
            .field("outbox_retention", &self.outbox_retention)
            .field("pause", &self.pause)
            .finish()
    }
}

impl<DB: Operable> Archiver<DB> {
    /// An archiver on `pool`: batches of 1000, outbox retention 7 days, no
    /// pause between batches.
    pub fn new(pool: Pool<DB>) -> Self {
        Archiver {
            pool,
            batch_size: 1000,
            outbox_retention: DEFAULT_OUTBOX_RETENTION,
            pause: Duration::ZERO,
        }
    }

    /// Rows per batch and table (default 1000, at most 10 000). Smaller
    /// batches hold their locks for less time.
    pub fn batch_size(mut self, n: u32) -> Self {
        self.batch_size = n.clamp(1, MAX_BATCH);
        self
    }

    /// Finished (`success` / `failed`) outbox messages last updated longer
    /// ago than this move to `idem_outbox_history` (default 7 days,
    /// [`DEFAULT_OUTBOX_RETENTION`]). Pending messages never move. Once a
    /// message has moved, its `(topic, msg_id)` can be enqueued again.
    pub fn outbox_retention(mut self, d: Duration) -> Self {
        self.outbox_retention = retention(d);
        self
    }

    /// Sleep between batches (default none), to stay gentle on a busy
    /// database.
    pub fn pause(mut self, d: Duration) -> Self {
        self.pause = d;
        self
    }

    /// One bounded batch of each table, each in its own short transaction.
    pub async fn run_batch(&self) -> Result<ArchiveReport, Error> {
        let mut report = ArchiveReport::default();
        self.batch_into(&mut report).await?;
        Ok(report)
    }

    /// Runs one batch, adding to `report` as each table's transaction
    /// commits (so a failure of the second keeps the first's count).
    async fn batch_into(&self, report: &mut ArchiveReport) -> Result<(), Error> {
        let limit = i64::from(self.batch_size);
        let records = DB::archive_batch(&self.pool, ArchiveTable::Records, limit, 0.0).await?;
        report.records += records;
        metrics::counter!("idem_archived_total", "table" => "record").increment(records);
        let retention = self.outbox_retention.as_secs_f64();
        let outbox = DB::archive_batch(&self.pool, ArchiveTable::Outbox, limit, retention).await?;
        report.outbox += outbox;
        metrics::counter!("idem_archived_total", "table" => "outbox").increment(outbox);
        report.batches += 1;
        Ok(())
    }

    /// Whether the last batch found more than it could take.
    fn full(&self, batch: &ArchiveReport) -> bool {
        let n = u64::from(self.batch_size);
        batch.records >= n || batch.outbox >= n
    }

    /// Batches until no table has more to move (a batch that was not full),
    /// calling `progress` with the running totals after each. Rides out a
    /// few transient failures in a row (a deadlock victim, a busy SQLite
    /// database); returns the error after that. Rows locked by live
    /// traffic are skipped, and moved by a later run.
    pub async fn run_once(
        &self,
        mut progress: impl FnMut(&ArchiveReport),
    ) -> Result<ArchiveReport, Error> {
        let mut total = ArchiveReport::default();
        let mut failures = 0;
        loop {
            let mut batch = ArchiveReport::default();
            let result = self.batch_into(&mut batch).await;
            total += batch;
            match result {
                Ok(()) => failures = 0,
                Err(e) if e.is_retryable() && failures < RETRIES => {
                    failures += 1;
                    tracing::debug!(error = %format_args!("{e:#}"), failures, "archive batch failed; retrying");
                    let wait = Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
                        .delay(failures);
                    tokio::time::sleep(wait.max(self.pause)).await;
                    continue;
                }
                Err(e) => return Err(e),
            }
            progress(&total);
            if !self.full(&batch) {
                return Ok(total);
            }
            if !self.pause.is_zero() {
                tokio::time::sleep(self.pause).await;
            }
        }
    }

    /// Runs the archiver as a tokio task: drains (like
    /// [`run_once`](Self::run_once)), then sleeps `every`, until
    /// [`ArchiverHandle::shutdown`] or the handle is dropped. A failed
    /// batch is logged and counted, and the next round tries again.
    pub fn spawn(self, every: Duration) -> ArchiverHandle {
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let task = TaskHandle::spawn(move |stop| self.run(every, stop, c));
        ArchiverHandle { task, counters }
    }

    async fn run(self, every: Duration, mut stop: watch::Receiver<bool>, c: Arc<Counters>) {
        loop {
            loop {
                if *stop.borrow() {
                    return;
                }
                let mut batch = ArchiveReport::default();
                let result = self.batch_into(&mut batch).await;
                c.add(&batch);
                if let Err(e) = result {
                    c.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %format_args!("{e:#}"), "archive batch failed; the next round retries");
                    break;
                }
                if !self.full(&batch) {
                    break;
                }
                if !self.pause.is_zero() {
                    tokio::select! {
                        _ = tokio::time::sleep(self.pause) => {}
                        changed = stop.changed() => if changed.is_err() { return },
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                // A dropped handle stops the archiver like a shutdown.
                changed = stop.changed() => if changed.is_err() { return },
            }
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    records: AtomicU64,
    outbox: AtomicU64,
    batches: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn add(&self, r: &ArchiveReport) {
        self.records.fetch_add(r.records, Ordering::Relaxed);
        self.outbox.fetch_add(r.outbox, Ordering::Relaxed);
        self.batches.fetch_add(r.batches, Ordering::Relaxed);
    }
}

/// A running archiver (see [`Archiver::spawn`]). Dropping it stops the
/// archiver as [`shutdown`](Self::shutdown) does, without waiting.
#[derive(Debug)]
#[must_use = "dropping the handle stops the archiver"]
pub struct ArchiverHandle {
    task: TaskHandle<()>,
    counters: Arc<Counters>,
}

impl ArchiverHandle {
    /// Stops after the batch in flight (which commits or rolls back as a
    /// whole) and returns the totals.
    pub async fn shutdown(self) -> ArchiveReport {
        let ArchiverHandle { task, counters } = self;
        let _ = task.shutdown().await;
        ArchiverHandle::report(&counters)
    }

    /// Rows moved and batches run since it started.
    pub fn stats(&self) -> ArchiveReport {
        ArchiverHandle::report(&self.counters)
    }

    fn report(c: &Counters) -> ArchiveReport {
        ArchiveReport {
            records: c.records.load(Ordering::Relaxed),
            outbox: c.outbox.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
        }
    }

    /// Batches that failed (each logged; the next round retried).
    pub fn errors(&self) -> u64 {
        self.counters.errors.load(Ordering::Relaxed)
    }

    /// [`shutdown`](Self::shutdown), waiting at most `deadline` for the
    /// batch in flight; then the archiver's task is aborted, and that
    /// batch's transaction rolls back (its rows stay where they were, for
    /// the next run: nothing is lost or moved twice). An `Err` if its task
    /// had panicked.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # idem_runtime::migrate(&pool).await?;
    /// use idem_runtime::archive::Archiver;
    /// use std::time::Duration;
    /// let token = tokio_util::sync::CancellationToken::new();
    /// let archiver = Archiver::new(pool)
    ///     .spawn(Duration::from_secs(600))
    ///     .stop_on(token.clone().cancelled_owned());
    /// assert!(archiver.status().is_running());
    /// token.cancel();
    /// let stopped = archiver.shutdown_within(Duration::from_secs(10)).await?;
    /// assert!(!stopped.abandoned);
    /// # Ok(()) }
    /// ```
    pub async fn shutdown_within(
        self,
        deadline: Duration,
    ) -> Result<ArchiverStopReport, TaskError> {
        let ArchiverHandle { task, counters } = self;
        let started = Instant::now();
        let ended = task.shutdown_within(deadline).await?;
        Ok(ArchiverStopReport {
            elapsed: started.elapsed(),
            abandoned: ended.is_none(),
            totals: ArchiverHandle::report(&counters),
        })
    }

    /// Stops the archiver (as [`shutdown`](Self::shutdown), without
    /// waiting) once `signal` completes: a `CancellationToken`'s
    /// `cancelled_owned()`, `tokio::signal::ctrl_c()`… (its output is
    /// ignored).
    pub fn stop_on<S>(self, signal: S) -> Self
    where
        S: Future + Send + 'static,
    {
        self.task.stop_on(signal);
        self
    }

    /// Where the archiver stands: running, stopping, stopped, or panicked
    /// (a failed batch does not end it: see [`errors`](Self::errors)).
    pub fn status(&self) -> TaskStatus {
        self.task.status()
    }

    /// Whether the archiver's task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// What an archiver's
/// [`shutdown_within`](ArchiverHandle::shutdown_within) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchiverStopReport {
    /// From the stop request to the archiver's end.
    pub elapsed: Duration,
    /// Whether the deadline passed and the batch in flight was rolled back.
    pub abandoned: bool,
    /// Rows moved and batches run since it started.
    pub totals: ArchiveReport,
}

/// The records of `key`, one per business type, ordered by `biz_type`:
/// records are unique per `(biz_type, key)`, so handlers sharing a key
/// template (`send_email` and `award_points` both keyed
/// `"order-paid:{order_id}"`) each have their own. For each business type,
/// the online record if the key is live, else the latest archived one (a
/// key can be archived, reused once expired, and archived again). With
/// `biz_type`, only that business type's record: at most one. Empty when
/// neither online nor archived.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// # idem_runtime::migrate(&pool).await?;
/// use idem_runtime::archive::find_record;
/// let all = find_record(&pool, "order-paid:42", None).await?;
/// let mail = find_record(&pool, "order-paid:42", Some("send_email")).await?;
/// assert!(all.is_empty() && mail.is_empty());
/// # Ok(()) }
/// ```
pub async fn find_record<DB: Operable>(
    pool: &Pool<DB>,
    key: &str,
    biz_type: Option<&str>,
) -> Result<Vec<RecordInfo>, Error> {
    Ok(DB::lookup_record(pool, key, biz_type).await?)
}

/// The outbox retention honoured for `d`.
fn retention(d: Duration) -> Duration {
    d.min(MAX_RETENTION)
}

/// What the archiver would move now, and what it moved (see [`status`]).
#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct ArchiveStatus {
    /// `idem_record` rows an archiver would move now (expired records).
    pub records_eligible: i64,
    /// `idem_outbox` rows an archiver with the given retention would move
    /// now (finished messages last updated longer ago than it).
    pub outbox_eligible: i64,
    /// Rows in `idem_record_history`.
    pub record_history: i64,
    /// Rows in `idem_outbox_history`.
    pub outbox_history: i64,
    /// The latest `archived_at` of `idem_record_history`; none when empty.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_record_archived_at: Option<OffsetDateTime>,
    /// The latest `archived_at` of `idem_outbox_history`.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_outbox_archived_at: Option<OffsetDateTime>,
    /// The outbox retention counted with, in seconds (the one an
    /// [`Archiver`] honours: at most 100 years).
    pub outbox_retention_secs: f64,
}

/// The archive's state: the rows an [`Archiver`] with `outbox_retention`
/// would move now (the same condition as its batches: records whose
/// `expire_time` has passed; `success` and `failed` messages last updated
/// longer ago than the retention, never pending ones), the rows already in
/// the history tables, and when each last received one. Counted without
/// locks: rows live traffic holds are counted, and a run moves them later.
/// Pass [`DEFAULT_OUTBOX_RETENTION`] for an archiver left at its default.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// # idem_runtime::migrate(&pool).await?;
/// use idem_runtime::archive::{self, DEFAULT_OUTBOX_RETENTION};
/// let status = archive::status(&pool, DEFAULT_OUTBOX_RETENTION).await?;
/// assert_eq!((status.records_eligible, status.outbox_history), (0, 0));
/// assert_eq!(status.last_outbox_archived_at, None);
/// # Ok(()) }
/// ```
pub async fn status<DB: Operable>(
    pool: &Pool<DB>,
    outbox_retention: Duration,
) -> Result<ArchiveStatus, Error> {
    let secs = retention(outbox_retention).as_secs_f64();
    let (
        records_eligible,
        outbox_eligible,
        record_history,
        outbox_history,
        last_record,
        last_outbox,
    ) = DB::archive_status(pool, secs).await?;
    Ok(ArchiveStatus {
        records_eligible,
        outbox_eligible,
        record_history,
        outbox_history,
        last_record_archived_at: crate::timestamp::parse_opt(last_record)?,
        last_outbox_archived_at: crate::timestamp::parse_opt(last_outbox)?,
        outbox_retention_secs: secs,
    })
}
