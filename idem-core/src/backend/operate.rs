//! The stores of operating idem: archiving and record look-ups, the
//! operator's queries, and the migration's primitives. (The stores of the
//! calls and the outbox are in the backend module.)

use super::types::{ArchiveTable, OutboxMessage, RecordInfo, RequeueTarget};
use sqlx::{Database, Pool};
use std::future::Future;

/// The archiver's statements, and the look-up of a record online or
/// archived.
pub trait ArchiveStore: Database {
    /// One archiving batch of `table`, in one short transaction of its
    /// own: locks up to `limit` rows that may move (PostgreSQL, MariaDB:
    /// `FOR UPDATE SKIP LOCKED` under read committed, so it never waits on
    /// live traffic; SQLite: `BEGIN IMMEDIATE`), copies them to the
    /// history table and deletes them from the online table, both
    /// re-checking the condition; rolls back unless both moved the same
    /// rows. Returns the rows moved. `retention_secs` is the outbox's
    /// retention (unused for records, which move once `expire_time` has
    /// passed).
    fn archive_batch<'a>(
        pool: &'a Pool<Self>,
        table: ArchiveTable,
        limit: i64,
        retention_secs: f64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// What the archiver would move now with an outbox retention of
    /// `retention_secs`, and what it moved: the rows of `idem_record` and
    /// of `idem_outbox` its batches' condition takes, the rows of
    /// `idem_record_history` and `idem_outbox_history`, and the latest
    /// `archived_at` of each history table as text.
    #[allow(clippy::type_complexity)]
    fn archive_status<'a>(
        pool: &'a Pool<Self>,
        retention_secs: f64,
    ) -> impl Future<
        Output = Result<(i64, i64, i64, i64, Option<String>, Option<String>), sqlx::Error>,
    > + Send
    + 'a;

    /// The records of `key`, one per business type (only `biz_type`'s
    /// when given), ordered by business type: the online one, else the
    /// latest archived one.
    fn lookup_record<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<RecordInfo>, sqlx::Error>> + Send + 'a;
}

/// The operator's queries on the outbox (see
/// [`outbox::admin`](crate::outbox::admin), which guards and documents
/// them).
pub trait AdminStore: Database {
    /// Messages per `(topic, status)`, of `topic` only when given.
    fn outbox_counts<'a>(
        pool: &'a Pool<Self>,
        topic: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<(String, String, i64)>, sqlx::Error>> + Send + 'a;

    /// Pending and failed messages per `(topic, status)`, of `topic` only
    /// when given: read through the status index, so without touching the
    /// delivered rows.
    fn outbox_open_counts<'a>(
        pool: &'a Pool<Self>,
        topic: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<(String, String, i64)>, sqlx::Error>> + Send + 'a;

    /// Per topic with pending messages, the age in seconds of its oldest
    /// pending message.
    fn outbox_pending_age<'a>(
        pool: &'a Pool<Self>,
        topic: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<(String, Option<f64>)>, sqlx::Error>> + Send + 'a;

    /// Messages of `status` (and `topic`; with `after`, only ids above
    /// it), oldest first, at most `limit`.
    fn outbox_list<'a>(
        pool: &'a Pool<Self>,
        status: &'a str,
        topic: Option<&'a str>,
        after: Option<i64>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<OutboxMessage>, sqlx::Error>> + Send + 'a;

    /// The failed messages `target` selects (with `max_id`, only ids up to
    /// it), locked; unless `dry_run`, set back to pending (attempts 0, due
    /// now, lease cleared, `last_error` prefixed with `requeued: `).
    /// Returns them (as they were) and how many changed (dry run: would
    /// change).
    fn outbox_requeue<'a>(
        pool: &'a Pool<Self>,
        target: &'a RequeueTarget,
        max_id: Option<i64>,
        dry_run: bool,
    ) -> impl Future<Output = Result<(Vec<OutboxMessage>, u64), sqlx::Error>> + Send + 'a;

    /// What [`outbox_requeue`](Self::outbox_requeue) of `target` would
    /// take, without locking or loading it all: how many failed messages,
    /// the highest id, and the first `shown` of them by id.
    fn outbox_requeue_preview<'a>(
        pool: &'a Pool<Self>,
        target: &'a RequeueTarget,
        shown: i64,
    ) -> impl Future<Output = Result<(u64, Option<i64>, Vec<OutboxMessage>), sqlx::Error>> + Send + 'a;

    /// Per lease owner of pending messages, ordered by owner: its
    /// messages, how many of their leases still run, and the earliest and
    /// latest `locked_until` as text.
    #[allow(clippy::type_complexity)]
    fn outbox_leases<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<
        Output = Result<Vec<(String, i64, i64, Option<String>, Option<String>)>, sqlx::Error>,
    > + Send
    + 'a;

    /// Messages that reached `success` less than `window_secs` ago, per
    /// bucket of `bucket_secs` by the age of their `updated_at`: `(bucket,
    /// messages)`, bucket 0 the newest, one row per bucket with messages.
    fn outbox_deliveries<'a>(
        pool: &'a Pool<Self>,
        window_secs: f64,
        bucket_secs: f64,
    ) -> impl Future<Output = Result<Vec<(i64, i64)>, sqlx::Error>> + Send + 'a;

    /// The status of outbox message `id`, if it exists.
    fn outbox_status<'a>(
        pool: &'a Pool<Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send + 'a;

    /// Whether `table` (a plain identifier) exists and can be read.
    fn table_exists<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;
}

/// The migration's two primitives, on the connection that holds the
/// migration's lock (see [`migrate`](crate::migrate)).
pub trait Migrate: Database {
    /// Runs one statement on a connection; returns the rows it changed.
    fn execute_on<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Runs a query answering one integer on a connection.
    fn fetch_i64<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;
}
