//! The code that runs the statements of [`sql`](crate::sql), written once
//! for every backend, behind two traits (archiving, the operator's
//! queries) implemented for every [`Backend`] whose driver runs and binds
//! what they need: each of idem's four. They are reachable from nowhere
//! outside the crate; [`Operable`] names them.

use crate::admin::{
    Act, Acted, Attempt, MessageDetail, OutboxMessage, PausedTopic, Process, RequeueTarget,
};
use crate::archive::{ArchiveTable, RecordInfo};
use crate::sql::OpsSql;
use idem_core::{Backend, Dialect};
use sqlx::{Database, Pool};
use std::future::Future;

/// A database the archiver and the operator's queries run on: every
/// [`Backend`] (idem's four implement it).
///
/// Concrete pools need nothing; code generic over the database names
/// this bound where it calls [`archive`](crate::archive) or
/// [`admin`](crate::admin) functions:
///
/// ```
/// use idem_runtime::{Operable, outbox::admin};
///
/// async fn dead_letters<DB: Operable>(pool: &sqlx::Pool<DB>) -> Result<i64, idem_runtime::Error> {
///     Ok(admin::stats(pool, None).await?.totals.failed)
/// }
/// ```
pub trait Operable: Backend + ArchiveStore + AdminStore + ActionStore {}

impl<DB: Backend + ArchiveStore + AdminStore + ActionStore> Operable for DB {}

/// `impl<DB> $trait for DB` for every [`Backend`] whose driver runs and
/// binds what the statements need: the bounds are written once, here.
macro_rules! for_every_backend {
    (impl $tr:ident for DB { $($body:tt)* }) => {
        impl<DB> $tr for DB
        where
            DB: Backend,
            for<'c> &'c mut <DB as Database>::Connection: sqlx::Executor<'c, Database = DB>,
            <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
            usize: sqlx::ColumnIndex<<DB as Database>::Row>,
            str: sqlx::Type<DB>,
            for<'q> &'q str: sqlx::Encode<'q, DB>,
            for<'q> Option<&'q str>: sqlx::Encode<'q, DB>,
            String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
            i64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
            i32: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
            f64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
        {
            $($body)*
        }
    };
}

/// Runs a statement that goes to a pool in autocommit, `|conn| future`:
/// on the pool itself, or, where [`idem_core::pooler::wrap_autocommit`]
/// says so (transaction pooling on PostgreSQL), inside `BEGIN … COMMIT`
/// on one connection, as idem's own stores do.
macro_rules! on_pool {
    ($pool:expr, |$conn:ident| $body:expr) => {{
        let pool = $pool;
        if idem_core::pooler::wrap_autocommit(<DB as idem_core::Backend>::pool_dialect(pool)) {
            match <DB as idem_core::Backend>::begin(pool).await {
                Err(e) => Err(e),
                Ok(mut tx) => {
                    let out = {
                        let $conn = &mut *tx;
                        $body.await
                    };
                    match out {
                        Ok(v) => tx.commit().await.map(|()| v),
                        Err(e) => Err(e),
                    }
                }
            }
        } else {
            let $conn = pool;
            $body.await
        }
    }};
}

/// Binds an interval of `secs` seconds the dialect's way: fractional
/// seconds, or whole microseconds.
macro_rules! bind_secs {
    ($q:expr, $sql:expr, $secs:expr) => {
        if $sql.micros {
            $q.bind(($secs * 1e6) as i64)
        } else {
            $q.bind($secs)
        }
    };
}

/// A fixed statement (see the core's stores: the `&'static str` keeps
/// its lifetime visible to the `Send` check of the generic futures).
fn stmt(s: &'static str) -> sqlx::SqlStr {
    sqlx::SqlSafeStr::into_sql_str(s)
}

/// sqlx's `.persistent(…)` as idem's stores set it.
fn persist() -> bool {
    idem_core::pooler::persistent()
}

/// The statements of the pool's dialect.
fn sql_of_pool<DB: Backend>(pool: &Pool<DB>) -> &'static OpsSql {
    crate::sql::of(DB::pool_dialect(pool))
}

mod actions;
mod admin;
mod archive;

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
/// [`admin`](crate::admin), which guards and documents
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
    /// now, lease cleared, `last_error` prefixed with `requeued: `), each
    /// with a `requeued` entry by `actor` in its attempt log. Returns them (as they were) and how many changed (dry run: would
    /// change).
    fn outbox_requeue<'a>(
        pool: &'a Pool<Self>,
        target: &'a RequeueTarget,
        max_id: Option<i64>,
        dry_run: bool,
        actor: &'a str,
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
}

/// One message in full, its attempt log, the operator's actions on
/// messages and topics, and the processes (see [`admin`](crate::admin),
/// which guards and documents them).
pub trait ActionStore: Database {
    /// Message `id`: the online row, else the archived one.
    fn outbox_detail<'a>(
        pool: &'a Pool<Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<MessageDetail>, sqlx::Error>> + Send + 'a;

    /// Message `id`'s attempt log, newest first, at most `limit` entries.
    fn outbox_attempt_log<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Attempt>, sqlx::Error>> + Send + 'a;

    /// `what` on message `id`, in a transaction of its own that locks
    /// the row before it reads its status and lease.
    fn outbox_act<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        what: Act<'a>,
    ) -> impl Future<Output = Result<Acted, sqlx::Error>> + Send + 'a;

    /// Adds an entry to message `id`'s attempt log on `conn` (in the
    /// caller's transaction), keeping the newest
    /// [`ATTEMPT_LOG_MAX`](crate::admin::ATTEMPT_LOG_MAX).
    #[allow(clippy::too_many_arguments)]
    fn attempt_log_add<'a>(
        conn: &'a mut Self::Connection,
        d: Dialect,
        id: i64,
        attempt: i32,
        outcome: &'a str,
        detail: Option<&'a str>,
        actor: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Deletes all but the newest
    /// [`ATTEMPT_LOG_MAX`](crate::admin::ATTEMPT_LOG_MAX) entries of
    /// message `id`'s attempt log, on `conn`.
    fn attempt_log_trim<'a>(
        conn: &'a mut Self::Connection,
        d: Dialect,
        id: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Adds an entry `outcome` by `actor` (no detail) to the attempt log
    /// of each `(message id, attempt)` of `entries` (at most 500) on
    /// `conn`, keeping each message's newest
    /// [`ATTEMPT_LOG_MAX`](crate::admin::ATTEMPT_LOG_MAX).
    fn attempt_log_bulk<'a>(
        conn: &'a mut Self::Connection,
        d: Dialect,
        entries: &'a [(i64, i32)],
        outcome: &'a str,
        actor: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Pauses `topic` unless paused: true when newly paused.
    fn topic_pause<'a>(
        pool: &'a Pool<Self>,
        topic: &'a str,
        reason: Option<&'a str>,
        actor: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Resumes `topic`: true when it was paused.
    fn topic_resume<'a>(
        pool: &'a Pool<Self>,
        topic: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// The paused topics, in no order.
    fn topic_paused<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<Vec<PausedTopic>, sqlx::Error>> + Send + 'a;

    /// The registered processes, in no order.
    fn process_list<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<Vec<Process>, sqlx::Error>> + Send + 'a;
}
