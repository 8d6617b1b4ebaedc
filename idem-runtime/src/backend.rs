//! The supported databases, and the few statements idem runs on each.
//!
//! Every statement that touches user tables is built from identifiers that
//! the macro validated at compile time (and that are checked again here),
//! quoted for the dialect; every value is a bind parameter.

use crate::archive::RecordInfo;
use crate::call::OutboxLease;
use crate::state::EntityIdValue;
use sqlx::{Database, Pool, Transaction};
use std::future::Future;

mod sealed {
    pub trait Sealed {}
}

/// The statements of a state machine spec, rendered for one dialect.
#[derive(Debug)]
pub struct StateSql {
    /// Reads the state and the key column (or NULL) under a row lock.
    pub lock: String,
    /// The guarded transition `from` → `to` (binds: to, [key], id, from).
    pub transition: String,
    /// Whether the transition writes the key column.
    pub with_key: bool,
}

/// An outbox message's status and lease, as the fenced update found it.
#[derive(Debug, Clone)]
pub struct OutboxState {
    /// The message's topic.
    pub topic: String,
    /// `pending`, `success` or `failed`.
    pub status: String,
    /// The relay holding its lease, if any.
    pub lease_owner: Option<String>,
    /// Attempts so far (the lease token of the latest claim).
    pub attempts: i32,
}

/// A new idempotency record.
#[derive(Debug)]
pub struct NewRecord<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The business type.
    pub biz_type: &'a str,
    /// The business document number.
    pub biz_no: &'a str,
    /// Hex SHA-256 of the canonical payload.
    pub fingerprint: &'a str,
    /// Seconds until the record may be archived.
    pub ttl_secs: i64,
}

/// A stored idempotency record.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    /// Hex SHA-256 of the payload of the call that wrote it.
    pub fingerprint: String,
    /// The serialized result, once the call committed.
    pub result: Option<String>,
}

/// A database idem runs on: PostgreSQL, MariaDB/MySQL or SQLite.
///
/// Sealed; enabled by the cargo features `postgres`, `mysql` and `sqlite`.
pub trait Backend: Database + sealed::Sealed {
    /// A short name, for traces.
    const NAME: &'static str;

    /// The SQL dialect the transaction speaks.
    fn dialect(tx: &Transaction<'static, Self>) -> Dialect;

    /// Begins the call's transaction (SQLite: `BEGIN IMMEDIATE`, taking
    /// the write lock up front so concurrent calls serialize instead of
    /// failing on lock upgrade).
    ///
    /// Cancellation-safe, unlike `Pool::begin`: a future dropped while
    /// `BEGIN` is in flight leaves no transaction open on the pooled
    /// connection (the `BEGIN` finishes in a task of its own and the
    /// transaction is rolled back before the connection returns to the
    /// pool).
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_;

    /// Runs the state machine's row-locking read: the state, and the key
    /// column's value (`None` without a key column).
    fn lock_state<'a>(
        tx: &'a mut Transaction<'static, Self>,
        sql: &'a StateSql,
        id: &'a EntityIdValue,
    ) -> impl Future<Output = Result<Option<(String, Option<String>)>, sqlx::Error>> + Send + 'a;

    /// Runs the guarded transition (writing `key` into the key column when
    /// the spec has one); returns the rows it changed.
    fn transition<'a>(
        tx: &'a mut Transaction<'static, Self>,
        sql: &'a StateSql,
        id: &'a EntityIdValue,
        from: &'static str,
        to: &'static str,
        key: Option<&'a str>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Inserts a record unless `(biz_type, key)` exists, waiting on the
    /// unique index for a concurrent insert of the same pair. True if
    /// inserted. Only the duplicate is ignored: any other failure (an
    /// expiry out of range, `expire_time` not after `create_time`) is an
    /// error.
    fn claim_record<'a>(
        tx: &'a mut Transaction<'static, Self>,
        rec: &'a NewRecord<'a>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Reads the record of `(biz_type, key)` (the latest committed version).
    fn fetch_record<'a>(
        tx: &'a mut Transaction<'static, Self>,
        biz_type: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<StoredRecord>, sqlx::Error>> + Send + 'a;

    /// Stores the serialized result in the record of `(biz_type, key)`.
    fn store_result<'a>(
        tx: &'a mut Transaction<'static, Self>,
        biz_type: &'a str,
        key: &'a str,
        result: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Marks the outbox message `lease` holds as delivered, fenced by the
    /// lease (pending, same topic, same owner and attempt); returns rows
    /// changed (1, or 0 when the lease does not hold).
    fn outbox_success<'a>(
        tx: &'a mut Transaction<'static, Self>,
        lease: &'a OutboxLease,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// The status and lease of outbox message `id`, if it exists.
    fn outbox_state<'a>(
        tx: &'a mut Transaction<'static, Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<OutboxState>, sqlx::Error>> + Send + 'a;

    /// Extends the leases of `owner`'s in-flight messages `ids` (still
    /// pending, not locked by a running handler transaction) by
    /// `lease_secs` from now; returns how many were extended.
    fn renew_leases<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        ids: &'a [i64],
        lease_secs: f64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Inserts a pending outbox message; returns its id.
    fn outbox_insert<'a>(
        conn: &'a mut Self::Connection,
        topic: &'a str,
        msg_id: &'a str,
        payload: &'a str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    /// The SQL dialect of a pool.
    fn pool_dialect(pool: &Pool<Self>) -> Dialect;

    /// The SQL dialect of a connection.
    fn conn_dialect(conn: &Self::Connection) -> Dialect;

    /// Claims up to `limit` due pending messages of `topics` under a lease
    /// of `lease_secs` for `owner` (attempts + 1 each). Concurrent claimers
    /// never get the same message while its lease runs.
    fn claim_outbox<'a>(
        pool: &'a Pool<Self>,
        claim: &'a ClaimSql,
        owner: &'a str,
        topics: &'a [String],
        limit: i64,
        lease_secs: f64,
    ) -> impl Future<Output = Result<Vec<OutboxRow>, sqlx::Error>> + Send + 'a;

    /// Records a failed attempt: back to `pending` after `delay_secs`, or
    /// `failed` when `dead`. Only while the message is still pending and
    /// leased by `owner` as attempt `attempt`: it never overwrites a
    /// success, nor lands on a message another claim took over. True if
    /// applied.
    #[allow(clippy::too_many_arguments)]
    fn outbox_settle_failure<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        owner: &'a str,
        attempt: i32,
        dead: bool,
        delay_secs: f64,
        error: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Marks a message `success` outside a handler transaction (the relay's
    /// fallback when a handler was not given its outbox source), fenced by
    /// its lease like [`Backend::outbox_success`].
    fn outbox_success_pool<'a>(
        pool: &'a Pool<Self>,
        lease: &'a OutboxLease,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// SQLite: the columns (`table.column`) of the index named `name`, in
    /// order; empty when there is no such index, and on other databases.
    fn sqlite_index_columns<'a>(
        tx: &'a mut Transaction<'static, Self>,
        name: &'a str,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + 'a;

    /// Runs a fixed statement (savepoints).
    fn exec<'a>(
        tx: &'a mut Transaction<'static, Self>,
        sql: &'static str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

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

    /// The records of `key`, one per business type (only `biz_type`'s
    /// when given), ordered by business type: the online one, else the
    /// latest archived one.
    fn lookup_record<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<RecordInfo>, sqlx::Error>> + Send + 'a;

    /// Runs one statement on a connection (the migration); returns the
    /// rows it changed.
    fn execute_on<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Runs a query answering one integer on a connection (the migration).
    fn fetch_i64<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;
}

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

/// The SQL dialects idem speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MariaDB and MySQL.
    MySql,
    /// SQLite.
    Sqlite,
}

impl Dialect {
    /// Renders the state machine's statements; `key_column`, when given,
    /// is read under the lock and written by the transition.
    ///
    /// # Panics
    /// If a name is not a plain identifier (see [`is_identifier`]); the
    /// generated code checks them before calling this.
    pub fn state_sql(
        self,
        table: &str,
        id_column: &str,
        state_column: &str,
        key_column: Option<&str>,
    ) -> StateSql {
        let q = if self == Dialect::MySql { '`' } else { '"' };
        let (t, i, s) = (quote(table, q), quote(id_column, q), quote(state_column, q));
        let k = key_column.map(|k| quote(k, q));
        let text = |e: &str| match self {
            Dialect::Postgres => format!("{e}::text"),
            Dialect::MySql => format!("CAST({e} AS CHAR)"),
            Dialect::Sqlite => format!("CAST({e} AS TEXT)"),
        };
        let key_read = k.as_deref().map_or_else(|| text("NULL"), text);
        // No FOR UPDATE on SQLite: BEGIN IMMEDIATE already holds the write lock.
        let lock_clause = if self == Dialect::Sqlite {
            ""
        } else {
            " FOR UPDATE"
        };
        let lock = format!(
            "SELECT {}, {key_read} FROM {t} WHERE {i} = {}{lock_clause}",
            text(&s),
            placeholders(self, 1, 1)
        );
        let n = if k.is_some() { 4 } else { 3 };
        let p: Vec<String> = (1..=n).map(|j| placeholders(self, j, 1)).collect();
        let transition = match &k {
            Some(k) => format!(
                "UPDATE {t} SET {s} = {}, {k} = {} WHERE {i} = {} AND {s} = {}",
                p[0], p[1], p[2], p[3]
            ),
            None => format!(
                "UPDATE {t} SET {s} = {} WHERE {i} = {} AND {s} = {}",
                p[0], p[1], p[2]
            ),
        };
        StateSql {
            lock,
            transition,
            with_key: k.is_some(),
        }
    }

    /// The dialect's fixed statements.
    pub(crate) fn sql(self) -> &'static SqlSet {
        match self {
            Dialect::Postgres => &PG,
            Dialect::MySql => &MY,
            Dialect::Sqlite => &LITE,
        }
    }

    /// The statements creating idem's tables as the first release did
    /// (schema version 1), in order; each is safe to run twice.
    /// [`migrate`](crate::migrate) runs them, then upgrades the tables
    /// to the current version.
    pub fn schema(self) -> &'static [&'static str] {
        self.sql().schema
    }
}

/// A claimed outbox row.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Primary key.
    pub id: i64,
    /// Topic (selects the handler).
    pub topic: String,
    /// The producer's message id; `(topic, msg_id)` is unique.
    pub msg_id: String,
    /// The JSON payload, as stored.
    pub payload: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

type RowTuple = (i64, String, String, String, i32);

fn to_row((id, topic, msg_id, payload, attempts): RowTuple) -> OutboxRow {
    OutboxRow {
        id,
        topic,
        msg_id,
        payload,
        attempts,
    }
}

/// The claim statements of a relay, rendered once for its topics.
#[derive(Debug, Clone)]
pub struct ClaimSql {
    /// PostgreSQL / SQLite: one `UPDATE … RETURNING`. MariaDB: the
    /// `SELECT … FOR UPDATE SKIP LOCKED`.
    pub claim: String,
}

impl Dialect {
    /// Renders the claim statement for `topics` topics.
    pub fn claim_sql(self, topics: usize) -> ClaimSql {
        let list = |first: usize| -> String {
            (0..topics.max(1))
                .map(|i| match self {
                    Dialect::Postgres => format!("${}", first + i),
                    _ => "?".to_string(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let claim = match self {
            Dialect::Postgres => format!(
                "UPDATE idem_outbox o SET lease_owner = $1, \
                 locked_until = now() + make_interval(secs => $2::float8), \
                 attempts = o.attempts + 1, updated_at = now() \
                 FROM (SELECT id FROM idem_outbox WHERE status = 'pending' AND topic IN ({}) \
                   AND next_attempt_at <= now() AND (locked_until IS NULL OR locked_until < now()) \
                   ORDER BY next_attempt_at, id LIMIT ${} FOR UPDATE SKIP LOCKED) c \
                 WHERE o.id = c.id \
                 RETURNING o.id, o.topic, o.msg_id, o.payload, o.attempts",
                list(3),
                3 + topics.max(1)
            ),
            Dialect::MySql => format!(
                "SELECT id, topic, msg_id, payload, attempts FROM idem_outbox \
                 WHERE status = 'pending' AND topic IN ({}) AND next_attempt_at <= UTC_TIMESTAMP(6) \
                 AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6)) \
                 ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
                list(1)
            ),
            Dialect::Sqlite => format!(
                "UPDATE idem_outbox SET lease_owner = ?, \
                 locked_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
                 attempts = attempts + 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 WHERE id IN (SELECT id FROM idem_outbox WHERE status = 'pending' \
                   AND topic IN ({}) AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
                   AND (locked_until IS NULL OR locked_until < strftime('%Y-%m-%d %H:%M:%f', 'now')) \
                   ORDER BY next_attempt_at, id LIMIT ?) \
                 RETURNING id, topic, msg_id, payload, attempts",
                list(1)
            ),
        };
        ClaimSql { claim }
    }
}

/// The fixed statements of one dialect.
#[derive(Debug)]
pub(crate) struct SqlSet {
    fetch_record: &'static str,
    store_result: &'static str,
    claim_record: &'static str,
    outbox_insert: &'static str,
    outbox_success: &'static str,
    outbox_state: &'static str,
    outbox_settle: &'static str,
    archive_record: ArchiveSql,
    archive_outbox: ArchiveSql,
    /// The online records of a key: key, biz_type, biz_no, fingerprint,
    /// result, create_time and expire_time as text. Ends with the key's
    /// condition (`AND biz_type = …` may follow).
    find_online: &'static str,
    /// The archived records of a key: the same, and archived_at; the same
    /// ending (`ORDER BY` follows).
    find_history: &'static str,
    /// The tables as the first release created them (schema version 1).
    schema: &'static [&'static str],
}

/// The statements of one archiving batch of one table.
#[derive(Debug)]
struct ArchiveSql {
    /// Locks the candidates' ids: `[retention,] limit`.
    select: &'static str,
    /// `INSERT INTO …_history … SELECT … WHERE <condition> AND id IN (`:
    /// `[retention,] ids…`; the id list and `)` are appended.
    copy: &'static str,
    /// `DELETE … WHERE <condition> AND id IN (`: the same binds.
    delete: &'static str,
}

impl SqlSet {
    fn archive(&self, table: ArchiveTable) -> &ArchiveSql {
        match table {
            ArchiveTable::Records => &self.archive_record,
            ArchiveTable::Outbox => &self.archive_outbox,
        }
    }
}

/// The connection of an archiving batch: closed instead of going back to
/// the pool unless the batch finished. A batch cancelled halfway (its task
/// aborted, its future dropped) can leave the server inside a transaction
/// that sqlx does not know about (cancelled during `BEGIN`), holding row
/// locks (or SQLite's write lock) for whoever gets the connection next;
/// closing the connection makes the server roll it back.
struct CloseUnlessDone<DB: Database> {
    conn: sqlx::pool::PoolConnection<DB>,
    done: bool,
}

impl<DB: Database> Drop for CloseUnlessDone<DB> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}

/// `n` placeholders, the first numbered `first` on PostgreSQL.
fn placeholders(dialect: Dialect, first: usize, n: usize) -> String {
    (0..n)
        .map(|i| match dialect {
            Dialect::Postgres => format!("${}", first + i),
            _ => "?".to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

type OnlineRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
);
type HistoryRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    String,
);

fn record_info(row: OnlineRow, archived_at: Option<String>) -> RecordInfo {
    let (key, biz_type, biz_no, fingerprint, result, create_time, expire_time) = row;
    RecordInfo {
        key,
        biz_type,
        biz_no,
        fingerprint,
        result,
        create_time,
        expire_time,
        archived: archived_at.is_some(),
        archived_at,
    }
}

/// Whether `s` is a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most
/// 63 bytes), optionally qualified once (`schema.table`).
pub fn is_identifier(s: &str) -> bool {
    let plain = |p: &str| {
        let mut b = p.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
            && p.len() <= 63
    };
    match s.split_once('.') {
        Some((a, b)) => plain(a) && plain(b),
        None => plain(s),
    }
}

fn quote(ident: &str, q: char) -> String {
    assert!(
        is_identifier(ident),
        "idem: `{ident}` is not a valid SQL identifier"
    );
    ident
        .split('.')
        .map(|p| format!("{q}{p}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}

macro_rules! bind_id {
    ($q:expr, $id:expr) => {
        match $id {
            EntityIdValue::Int(i) => $q.bind(*i),
            EntityIdValue::Text(s) => $q.bind(s.as_str()),
        }
    };
}

/// The methods whose code is the same on every backend; only the SQL differs.
macro_rules! common_methods {
    () => {
        async fn lock_state<'a>(
            tx: &'a mut Transaction<'static, Self>,
            sql: &'a StateSql,
            id: &'a EntityIdValue,
        ) -> Result<Option<(String, Option<String>)>, sqlx::Error> {
            let q = sqlx::query_as(sqlx::AssertSqlSafe(sql.lock.as_str()));
            bind_id!(q, id).fetch_optional(&mut **tx).await
        }

        async fn transition<'a>(
            tx: &'a mut Transaction<'static, Self>,
            sql: &'a StateSql,
            id: &'a EntityIdValue,
            from: &'static str,
            to: &'static str,
            key: Option<&'a str>,
        ) -> Result<u64, sqlx::Error> {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.transition.as_str())).bind(to);
            if sql.with_key {
                q = q.bind(key.unwrap_or_default());
            }
            let q = bind_id!(q, id).bind(from);
            Ok(q.execute(&mut **tx).await?.rows_affected())
        }

        async fn claim_record<'a>(
            tx: &'a mut Transaction<'static, Self>,
            rec: &'a NewRecord<'a>,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(Self::dialect(tx).sql().claim_record)
                .bind(rec.key)
                .bind(rec.biz_type)
                .bind(rec.biz_no)
                .bind(rec.fingerprint)
                .bind(rec.ttl_secs)
                .execute(&mut **tx)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn fetch_record<'a>(
            tx: &'a mut Transaction<'static, Self>,
            biz_type: &'a str,
            key: &'a str,
        ) -> Result<Option<StoredRecord>, sqlx::Error> {
            let row: Option<(String, Option<String>)> =
                sqlx::query_as(Self::dialect(tx).sql().fetch_record)
                    .bind(key)
                    .bind(biz_type)
                    .fetch_optional(&mut **tx)
                    .await?;
            Ok(row.map(|(fingerprint, result)| StoredRecord {
                fingerprint,
                result,
            }))
        }

        async fn store_result<'a>(
            tx: &'a mut Transaction<'static, Self>,
            biz_type: &'a str,
            key: &'a str,
            result: &'a str,
        ) -> Result<(), sqlx::Error> {
            sqlx::query(Self::dialect(tx).sql().store_result)
                .bind(result)
                .bind(key)
                .bind(biz_type)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        async fn outbox_success<'a>(
            tx: &'a mut Transaction<'static, Self>,
            lease: &'a OutboxLease,
        ) -> Result<u64, sqlx::Error> {
            Ok(sqlx::query(Self::dialect(tx).sql().outbox_success)
                .bind(lease.id)
                .bind(lease.topic.as_str())
                .bind(lease.owner.as_str())
                .bind(lease.attempt)
                .execute(&mut **tx)
                .await?
                .rows_affected())
        }

        async fn outbox_state(
            tx: &mut Transaction<'static, Self>,
            id: i64,
        ) -> Result<Option<OutboxState>, sqlx::Error> {
            let row: Option<(String, String, Option<String>, i32)> =
                sqlx::query_as(Self::dialect(tx).sql().outbox_state)
                    .bind(id)
                    .fetch_optional(&mut **tx)
                    .await?;
            Ok(row.map(|(topic, status, lease_owner, attempts)| OutboxState {
                topic,
                status,
                lease_owner,
                attempts,
            }))
        }

        async fn renew_leases<'a>(
            pool: &'a Pool<Self>,
            owner: &'a str,
            ids: &'a [i64],
            lease_secs: f64,
        ) -> Result<u64, sqlx::Error> {
            if ids.is_empty() {
                return Ok(0);
            }
            let dialect = Self::pool_dialect(pool);
            let mut tx = Self::begin(pool).await?;
            let renewed = match dialect {
                Dialect::MySql => {
                    // Rows a running handler transaction holds are skipped:
                    // no claim can take them while it runs.
                    let sql = format!(
                        "SELECT id FROM idem_outbox WHERE lease_owner = ? AND status = 'pending' \
                         AND id IN ({}) FOR UPDATE SKIP LOCKED",
                        placeholders(dialect, 1, ids.len())
                    );
                    let mut q = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).bind(owner);
                    for id in ids {
                        q = q.bind(*id);
                    }
                    let free: Vec<i64> = q.fetch_all(&mut *tx).await?;
                    if free.is_empty() {
                        0
                    } else {
                        let sql = format!(
                            "UPDATE idem_outbox SET locked_until = \
                             DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) WHERE id IN ({})",
                            placeholders(dialect, 1, free.len())
                        );
                        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind((lease_secs * 1e6) as i64);
                        for id in &free {
                            q = q.bind(*id);
                        }
                        q.execute(&mut *tx).await?.rows_affected()
                    }
                }
                Dialect::Postgres => {
                    let sql = format!(
                        "UPDATE idem_outbox o SET locked_until = now() + make_interval(secs => $1::float8) \
                         FROM (SELECT id FROM idem_outbox WHERE lease_owner = $2 AND status = 'pending' \
                         AND id IN ({}) FOR UPDATE SKIP LOCKED) c WHERE o.id = c.id",
                        placeholders(dialect, 3, ids.len())
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease_secs).bind(owner);
                    for id in ids {
                        q = q.bind(*id);
                    }
                    q.execute(&mut *tx).await?.rows_affected()
                }
                Dialect::Sqlite => {
                    // BEGIN IMMEDIATE: no handler transaction runs meanwhile.
                    let sql = format!(
                        "UPDATE idem_outbox SET locked_until = \
                         strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds') \
                         WHERE lease_owner = ? AND status = 'pending' AND id IN ({})",
                        placeholders(dialect, 1, ids.len())
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease_secs).bind(owner);
                    for id in ids {
                        q = q.bind(*id);
                    }
                    q.execute(&mut *tx).await?.rows_affected()
                }
            };
            tx.commit().await?;
            Ok(renewed)
        }

        async fn claim_outbox<'a>(
            pool: &'a Pool<Self>,
            claim: &'a ClaimSql,
            owner: &'a str,
            topics: &'a [String],
            limit: i64,
            lease_secs: f64,
        ) -> Result<Vec<OutboxRow>, sqlx::Error> {
            let mut tx = Self::begin(pool).await?;
            let rows = if Self::dialect(&tx) == Dialect::MySql {
                // No UPDATE … RETURNING: lock the due rows (skipping rows
                // other relays hold), then lease them, in one transaction.
                let mut q =
                    sqlx::query_as::<_, RowTuple>(sqlx::AssertSqlSafe(claim.claim.as_str()));
                for t in topics {
                    q = q.bind(t.as_str());
                }
                let mut rows: Vec<OutboxRow> = q
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?
                    .into_iter()
                    .map(to_row)
                    .collect();
                if !rows.is_empty() {
                    let marks = vec!["?"; rows.len()].join(", ");
                    let sql = format!(
                        "UPDATE idem_outbox SET lease_owner = ?, \
                         locked_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), \
                         attempts = attempts + 1, updated_at = UTC_TIMESTAMP(6) WHERE id IN ({marks})"
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(owner)
                        .bind((lease_secs * 1e6) as i64);
                    for r in &rows {
                        q = q.bind(r.id);
                    }
                    q.execute(&mut *tx).await?;
                    for r in &mut rows {
                        r.attempts += 1;
                    }
                }
                rows
            } else {
                if Self::dialect(&tx) == Dialect::Postgres {
                    // A lost claim only means the message is claimed again:
                    // no need to wait for its WAL flush.
                    sqlx::query("SET LOCAL synchronous_commit = off")
                        .execute(&mut *tx)
                        .await?;
                }
                let mut q =
                    sqlx::query_as::<_, RowTuple>(sqlx::AssertSqlSafe(claim.claim.as_str()))
                        .bind(owner)
                        .bind(lease_secs);
                for t in topics {
                    q = q.bind(t.as_str());
                }
                q.bind(limit)
                    .fetch_all(&mut *tx)
                    .await?
                    .into_iter()
                    .map(to_row)
                    .collect()
            };
            tx.commit().await?;
            Ok(rows)
        }

        async fn outbox_settle_failure<'a>(
            pool: &'a Pool<Self>,
            id: i64,
            owner: &'a str,
            attempt: i32,
            dead: bool,
            delay_secs: f64,
            error: &'a str,
        ) -> Result<bool, sqlx::Error> {
            let dialect = Self::pool_dialect(pool);
            let q = sqlx::query(dialect.sql().outbox_settle).bind(if dead {
                "failed"
            } else {
                "pending"
            });
            let q = if dialect == Dialect::MySql {
                q.bind((delay_secs * 1e6) as i64)
            } else {
                q.bind(delay_secs)
            };
            let done = q
                .bind(error)
                .bind(id)
                .bind(owner)
                .bind(attempt)
                .execute(pool)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn outbox_success_pool<'a>(
            pool: &'a Pool<Self>,
            lease: &'a OutboxLease,
        ) -> Result<u64, sqlx::Error> {
            Ok(sqlx::query(Self::pool_dialect(pool).sql().outbox_success)
                .bind(lease.id)
                .bind(lease.topic.as_str())
                .bind(lease.owner.as_str())
                .bind(lease.attempt)
                .execute(pool)
                .await?
                .rows_affected())
        }

        async fn sqlite_index_columns<'a>(
            tx: &'a mut Transaction<'static, Self>,
            name: &'a str,
        ) -> Result<Vec<String>, sqlx::Error> {
            if Self::dialect(tx) != Dialect::Sqlite {
                return Ok(Vec::new());
            }
            let rows: Vec<(String, Option<String>)> = sqlx::query_as(
                "SELECT m.tbl_name, i.name FROM sqlite_master m, pragma_index_info(m.name) i \
                 WHERE m.type = 'index' AND m.name = ? ORDER BY i.seqno",
            )
            .bind(name)
            .fetch_all(&mut **tx)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(t, c)| format!("{t}.{}", c.unwrap_or_default()))
                .collect())
        }

        async fn exec(
            tx: &mut Transaction<'static, Self>,
            sql: &'static str,
        ) -> Result<(), sqlx::Error> {
            sqlx::query(sql).execute(&mut **tx).await?;
            Ok(())
        }

        async fn archive_batch(
            pool: &Pool<Self>,
            table: ArchiveTable,
            limit: i64,
            retention_secs: f64,
        ) -> Result<u64, sqlx::Error> {
            use sqlx::Connection as _;
            let dialect = Self::pool_dialect(pool);
            let sql = dialect.sql().archive(table);
            // The outbox's condition has one bind, the retention: seconds,
            // or whole microseconds on MariaDB (DATE_SUB … MICROSECOND).
            let retention = match table {
                ArchiveTable::Records => None,
                ArchiveTable::Outbox => Some(retention_secs),
            };
            let micros = dialect == Dialect::MySql;
            let mut guard = CloseUnlessDone {
                conn: pool.acquire().await?,
                done: false,
            };
            let conn: &mut Self::Connection = &mut guard.conn;
            let mut tx = match dialect {
                // The write lock up front: serialized with every handler.
                Dialect::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
                // Read committed for this transaction only: no gap locks,
                // so handlers inserting records never wait on the scan.
                Dialect::MySql => {
                    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut *conn)
                        .await?;
                    conn.begin().await?
                }
                Dialect::Postgres => conn.begin().await?,
            };
            let mut q = sqlx::query_scalar::<_, i64>(sql.select);
            if let Some(r) = retention {
                q = if micros {
                    q.bind((r * 1e6) as i64)
                } else {
                    q.bind(r)
                };
            }
            let ids: Vec<i64> = q.bind(limit).fetch_all(&mut *tx).await?;
            if ids.is_empty() {
                tx.commit().await?;
                guard.done = true;
                return Ok(0);
            }
            let first = 1 + usize::from(retention.is_some());
            let list = placeholders(dialect, first, ids.len());
            let mut moved = [0u64; 2];
            for (n, prefix) in [sql.copy, sql.delete].into_iter().enumerate() {
                let text = format!("{prefix}{list})");
                let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
                if let Some(r) = retention {
                    q = if micros {
                        q.bind((r * 1e6) as i64)
                    } else {
                        q.bind(r)
                    };
                }
                for id in &ids {
                    q = q.bind(*id);
                }
                moved[n] = q.execute(&mut *tx).await?.rows_affected();
            }
            let [copied, deleted] = moved;
            if copied != deleted {
                // Impossible while the rows are locked and the clock moves
                // forward; never commit a half-moved batch.
                tx.rollback().await?;
                return Err(sqlx::Error::Protocol(format!(
                    "archive batch rolled back: {copied} rows copied to history but {deleted} deleted"
                )));
            }
            tx.commit().await?;
            guard.done = true;
            Ok(deleted)
        }

        async fn lookup_record<'a>(
            pool: &'a Pool<Self>,
            key: &'a str,
            biz_type: Option<&'a str>,
        ) -> Result<Vec<RecordInfo>, sqlx::Error> {
            let dialect = Self::pool_dialect(pool);
            let sql = dialect.sql();
            let typed = if biz_type.is_some() {
                format!(" AND biz_type = {}", placeholders(dialect, 2, 1))
            } else {
                String::new()
            };
            let text = format!("{}{typed}", sql.find_online);
            let mut q = sqlx::query_as::<_, OnlineRow>(sqlx::AssertSqlSafe(text)).bind(key);
            if let Some(t) = biz_type {
                q = q.bind(t);
            }
            let mut found: Vec<RecordInfo> = q
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(|row| record_info(row, None))
                .collect();
            // The history, newest first: the first row of each business
            // type without an online record is its latest archived one.
            let text = format!("{}{typed} ORDER BY archived_at DESC, id DESC", sql.find_history);
            let mut q = sqlx::query_as::<_, HistoryRow>(sqlx::AssertSqlSafe(text)).bind(key);
            if let Some(t) = biz_type {
                q = q.bind(t);
            }
            for (k, t, n, f, r, c, e, at) in q.fetch_all(pool).await? {
                if !found.iter().any(|i| i.biz_type == t) {
                    found.push(record_info((k, t, n, f, r, c, e), Some(at)));
                }
            }
            found.sort_by(|a, b| a.biz_type.cmp(&b.biz_type));
            Ok(found)
        }

        async fn execute_on<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a str,
        ) -> Result<u64, sqlx::Error> {
            Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(conn)
                .await?
                .rows_affected())
        }

        async fn fetch_i64<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a str,
        ) -> Result<i64, sqlx::Error> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(conn)
                .await
        }
    };
}

/// `INSERT … RETURNING id` (PostgreSQL, SQLite).
macro_rules! outbox_insert_returning {
    () => {
        async fn outbox_insert<'a>(
            conn: &'a mut Self::Connection,
            topic: &'a str,
            msg_id: &'a str,
            payload: &'a str,
        ) -> Result<i64, sqlx::Error> {
            sqlx::query_scalar(Self::conn_dialect(conn).sql().outbox_insert)
                .bind(topic)
                .bind(msg_id)
                .bind(payload)
                .fetch_one(conn)
                .await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use sqlx::Postgres;

    impl sealed::Sealed for Postgres {}

    impl Backend for Postgres {
        const NAME: &'static str = "postgres";

        fn dialect(_: &Transaction<'static, Self>) -> Dialect {
            Dialect::Postgres
        }

        fn pool_dialect(_: &Pool<Self>) -> Dialect {
            Dialect::Postgres
        }

        fn conn_dialect(_: &Self::Connection) -> Dialect {
            Dialect::Postgres
        }

        async fn begin(pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
            crate::tx::begin(pool, None).await
        }

        outbox_insert_returning!();
        common_methods!();
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use sqlx::MySql;

    impl sealed::Sealed for MySql {}

    impl Backend for MySql {
        const NAME: &'static str = "mysql";

        fn dialect(_: &Transaction<'static, Self>) -> Dialect {
            Dialect::MySql
        }

        fn pool_dialect(_: &Pool<Self>) -> Dialect {
            Dialect::MySql
        }

        fn conn_dialect(_: &Self::Connection) -> Dialect {
            Dialect::MySql
        }

        async fn begin(pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
            crate::tx::begin(pool, None).await
        }

        async fn outbox_insert<'a>(
            conn: &'a mut Self::Connection,
            topic: &'a str,
            msg_id: &'a str,
            payload: &'a str,
        ) -> Result<i64, sqlx::Error> {
            let done = sqlx::query(MY.outbox_insert)
                .bind(topic)
                .bind(msg_id)
                .bind(payload)
                .execute(conn)
                .await?;
            i64::try_from(done.last_insert_id()).map_err(|e| sqlx::Error::Decode(Box::new(e)))
        }

        common_methods!();
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use sqlx::Sqlite;

    impl sealed::Sealed for Sqlite {}

    impl Backend for Sqlite {
        const NAME: &'static str = "sqlite";

        fn dialect(_: &Transaction<'static, Self>) -> Dialect {
            Dialect::Sqlite
        }

        fn pool_dialect(_: &Pool<Self>) -> Dialect {
            Dialect::Sqlite
        }

        fn conn_dialect(_: &Self::Connection) -> Dialect {
            Dialect::Sqlite
        }

        async fn begin(pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
            crate::tx::begin(pool, Some("BEGIN IMMEDIATE")).await
        }

        outbox_insert_returning!();
        common_methods!();
    }
}

/// `sqlx::Any`: one handler for every database, the dialect chosen by the
/// URL the pool was opened with.
#[cfg(feature = "any")]
mod any {
    use super::*;
    use sqlx::Any;

    impl sealed::Sealed for Any {}

    fn dialect_of(name: &str) -> Dialect {
        match name {
            "PostgreSQL" | "postgres" | "postgresql" => Dialect::Postgres,
            "MySQL" | "mysql" | "mariadb" => Dialect::MySql,
            _ => Dialect::Sqlite,
        }
    }

    impl Backend for Any {
        const NAME: &'static str = "any";

        fn dialect(tx: &Transaction<'static, Self>) -> Dialect {
            dialect_of(tx.backend_name())
        }

        fn pool_dialect(pool: &Pool<Self>) -> Dialect {
            dialect_of(pool.connect_options().database_url.scheme())
        }

        fn conn_dialect(conn: &Self::Connection) -> Dialect {
            dialect_of(conn.backend_name())
        }

        async fn begin(pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
            let statement =
                (Self::pool_dialect(pool) == Dialect::Sqlite).then_some("BEGIN IMMEDIATE");
            crate::tx::begin(pool, statement).await
        }

        async fn outbox_insert<'a>(
            conn: &'a mut Self::Connection,
            topic: &'a str,
            msg_id: &'a str,
            payload: &'a str,
        ) -> Result<i64, sqlx::Error> {
            let dialect = Self::conn_dialect(conn);
            let q = sqlx::query(dialect.sql().outbox_insert)
                .bind(topic)
                .bind(msg_id)
                .bind(payload);
            if dialect == Dialect::MySql {
                let done = q.execute(conn).await?;
                done.last_insert_id()
                    .ok_or_else(|| sqlx::Error::Protocol("no insert id returned".into()))
            } else {
                use sqlx::Row;
                q.fetch_one(conn).await?.try_get(0)
            }
        }

        common_methods!();
    }
}

/// The PostgreSQL statements.
const PG: SqlSet = SqlSet {
    fetch_record: "SELECT fingerprint::text, result FROM idem_record \
        WHERE idempotency_key = $1 AND biz_type = $2",
    store_result: "UPDATE idem_record SET result = $1 WHERE idempotency_key = $2 AND biz_type = $3",
    claim_record: "INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
        VALUES ($1, $2, $3, $4, now(), now() + make_interval(secs => $5::float8)) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING",
    outbox_insert: "INSERT INTO idem_outbox \
        (topic, msg_id, payload, next_attempt_at, created_at, updated_at) \
        VALUES ($1, $2, $3, now(), now(), now()) RETURNING id",
    outbox_success: "UPDATE idem_outbox SET status = 'success', \
        updated_at = now(), lease_owner = NULL, locked_until = NULL \
        WHERE id = $1 AND topic = $2 AND status = 'pending' AND lease_owner = $3 AND attempts = $4",
    outbox_state: "SELECT topic::text, status::text, lease_owner::text, attempts \
        FROM idem_outbox WHERE id = $1",
    outbox_settle: "UPDATE idem_outbox SET status = $1, \
        next_attempt_at = now() + make_interval(secs => $2::float8), last_error = $3, \
        lease_owner = NULL, locked_until = NULL, updated_at = now() \
        WHERE id = $4 AND status = 'pending' AND lease_owner = $5 AND attempts = $6",
    archive_record: ArchiveSql {
        select: "SELECT id FROM idem_record WHERE expire_time < now() \
            ORDER BY expire_time LIMIT $1 FOR UPDATE SKIP LOCKED",
        copy: "INSERT INTO idem_record_history \
            (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, archived_at) \
            SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, now() \
            FROM idem_record WHERE expire_time + interval '0 seconds' < now() AND id IN (",
        // The re-check is written so that it cannot use the expire_time
        // index: the locked ids are few, the expired rows may be millions.
        delete: "DELETE FROM idem_record WHERE expire_time + interval '0 seconds' < now() AND id IN (",
    },
    archive_outbox: ArchiveSql {
        select: "SELECT id FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8) \
            ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
        copy: "INSERT INTO idem_outbox_history \
            (id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, now() FROM idem_outbox \
            WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8) AND id IN (",
        delete: "DELETE FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8) AND id IN (",
    },
    find_online: "SELECT idempotency_key::text, biz_type::text, biz_no::text, fingerprint::text, result, \
        to_char(create_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), \
        to_char(expire_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') \
        FROM idem_record WHERE idempotency_key = $1",
    find_history: "SELECT idempotency_key::text, biz_type::text, biz_no::text, fingerprint::text, result, \
        to_char(create_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), \
        to_char(expire_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), \
        to_char(archived_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') \
        FROM idem_record_history WHERE idempotency_key = $1",
    schema: &[
        "CREATE TABLE IF NOT EXISTS idem_record (
            id BIGSERIAL PRIMARY KEY,
            idempotency_key VARCHAR(128) NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result TEXT,
            create_time TIMESTAMPTZ NOT NULL DEFAULT now(),
            expire_time TIMESTAMPTZ NOT NULL,
            CONSTRAINT uk_idem_record_key UNIQUE (idempotency_key)
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_record_expire ON idem_record (expire_time)",
        "CREATE TABLE IF NOT EXISTS idem_outbox (
            id BIGSERIAL PRIMARY KEY,
            topic VARCHAR(128) NOT NULL,
            msg_id VARCHAR(128) NOT NULL,
            payload TEXT NOT NULL,
            status VARCHAR(16) NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            lease_owner VARCHAR(64),
            locked_until TIMESTAMPTZ,
            last_error TEXT,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT uk_idem_outbox_msg UNIQUE (topic, msg_id),
            CONSTRAINT ck_idem_outbox_status CHECK (status IN ('pending', 'success', 'failed'))
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_outbox_due ON idem_outbox (status, next_attempt_at)",
        // The relay's claim: pending rows of its topics, oldest first.
        "CREATE INDEX IF NOT EXISTS idx_idem_outbox_pending ON idem_outbox (topic, next_attempt_at, id) WHERE status = 'pending'",
        // History: the same columns plus archived_at; `id` is the online
        // row's id. A key may be archived, reused once expired, and
        // archived again: indexed, not unique.
        "CREATE TABLE IF NOT EXISTS idem_record_history (
            id BIGINT PRIMARY KEY,
            idempotency_key VARCHAR(128) NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result TEXT,
            create_time TIMESTAMPTZ NOT NULL,
            expire_time TIMESTAMPTZ NOT NULL,
            archived_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key ON idem_record_history (idempotency_key)",
        "CREATE TABLE IF NOT EXISTS idem_outbox_history (
            id BIGINT PRIMARY KEY,
            topic VARCHAR(128) NOT NULL,
            msg_id VARCHAR(128) NOT NULL,
            payload TEXT NOT NULL,
            status VARCHAR(16) NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_at TIMESTAMPTZ NOT NULL,
            lease_owner VARCHAR(64),
            locked_until TIMESTAMPTZ,
            last_error TEXT,
            created_at TIMESTAMPTZ NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL,
            archived_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_outbox_history_msg ON idem_outbox_history (topic, msg_id)",
    ],
};

/// The MariaDB / MySQL statements.
const MY: SqlSet = SqlSet {
    fetch_record: "SELECT fingerprint, result FROM idem_record \
        WHERE idempotency_key = ? AND biz_type = ? LOCK IN SHARE MODE",
    store_result: "UPDATE idem_record SET result = ? WHERE idempotency_key = ? AND biz_type = ?",
    // INSERT IGNORE waits on the unique index for a concurrent insert of
    // the same key. It can only ignore the duplicate: the values are
    // length-checked before, and an expiry out of range (IGNORE would store
    // a zero date) fails `ck_idem_record_expire`, which IGNORE does not
    // turn into a warning. (`ON DUPLICATE KEY UPDATE id = id` cannot tell a
    // claim from a duplicate: sqlx connects with CLIENT_FOUND_ROWS, and
    // both report one row.) Every time is UTC, whatever the session's
    // time zone.
    claim_record: "INSERT IGNORE INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
        VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND))",
    outbox_insert: "INSERT INTO idem_outbox \
        (topic, msg_id, payload, next_attempt_at, created_at, updated_at) \
        VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    outbox_success: "UPDATE idem_outbox SET status = 'success', \
        updated_at = UTC_TIMESTAMP(6), lease_owner = NULL, locked_until = NULL \
        WHERE id = ? AND topic = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_state: "SELECT topic, status, lease_owner, attempts FROM idem_outbox WHERE id = ?",
    outbox_settle: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), last_error = ?, \
        lease_owner = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    archive_record: ArchiveSql {
        select: "SELECT id FROM idem_record WHERE expire_time < UTC_TIMESTAMP(6) \
            ORDER BY expire_time LIMIT ? FOR UPDATE SKIP LOCKED",
        copy: "INSERT INTO idem_record_history \
            (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, archived_at) \
            SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, UTC_TIMESTAMP(6) \
            FROM idem_record WHERE TIMESTAMPADD(SECOND, 0, expire_time) < UTC_TIMESTAMP(6) AND id IN (",
        delete: "DELETE FROM idem_record WHERE TIMESTAMPADD(SECOND, 0, expire_time) < UTC_TIMESTAMP(6) AND id IN (",
    },
    archive_outbox: ArchiveSql {
        select: "SELECT id FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) \
            ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
        copy: "INSERT INTO idem_outbox_history \
            (id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, UTC_TIMESTAMP(6) FROM idem_outbox \
            WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) AND id IN (",
        delete: "DELETE FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) AND id IN (",
    },
    find_online: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        DATE_FORMAT(create_time, '%Y-%m-%d %H:%i:%s.%f'), \
        DATE_FORMAT(expire_time, '%Y-%m-%d %H:%i:%s.%f') \
        FROM idem_record WHERE idempotency_key = ?",
    find_history: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        DATE_FORMAT(create_time, '%Y-%m-%d %H:%i:%s.%f'), \
        DATE_FORMAT(expire_time, '%Y-%m-%d %H:%i:%s.%f'), \
        DATE_FORMAT(archived_at, '%Y-%m-%d %H:%i:%s.%f') \
        FROM idem_record_history WHERE idempotency_key = ?",
    schema: &[
        "CREATE TABLE IF NOT EXISTS idem_record (
            id BIGINT AUTO_INCREMENT PRIMARY KEY,
            idempotency_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result MEDIUMTEXT NULL,
            create_time DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            expire_time DATETIME(6) NOT NULL,
            UNIQUE KEY uk_idem_record_key (idempotency_key),
            KEY idx_idem_record_expire (expire_time)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        "CREATE TABLE IF NOT EXISTS idem_outbox (
            id BIGINT AUTO_INCREMENT PRIMARY KEY,
            topic VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            msg_id VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            payload MEDIUMTEXT NOT NULL,
            status VARCHAR(16) NOT NULL DEFAULT 'pending',
            attempts INT NOT NULL DEFAULT 0,
            next_attempt_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            lease_owner VARCHAR(64) NULL,
            locked_until DATETIME(6) NULL,
            last_error TEXT NULL,
            created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            UNIQUE KEY uk_idem_outbox_msg (topic, msg_id),
            KEY idx_idem_outbox_due (status, next_attempt_at),
            CONSTRAINT ck_idem_outbox_status CHECK (status IN ('pending', 'success', 'failed'))
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        "CREATE TABLE IF NOT EXISTS idem_record_history (
            id BIGINT PRIMARY KEY,
            idempotency_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result MEDIUMTEXT NULL,
            create_time DATETIME(6) NOT NULL,
            expire_time DATETIME(6) NOT NULL,
            archived_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            KEY idx_idem_record_history_key (idempotency_key)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        "CREATE TABLE IF NOT EXISTS idem_outbox_history (
            id BIGINT PRIMARY KEY,
            topic VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            msg_id VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            payload MEDIUMTEXT NOT NULL,
            status VARCHAR(16) NOT NULL,
            attempts INT NOT NULL,
            next_attempt_at DATETIME(6) NOT NULL,
            lease_owner VARCHAR(64) NULL,
            locked_until DATETIME(6) NULL,
            last_error TEXT NULL,
            created_at DATETIME(6) NOT NULL,
            updated_at DATETIME(6) NOT NULL,
            archived_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            KEY idx_idem_outbox_history_msg (topic, msg_id)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    ],
};

/// The SQLite statements.
const LITE: SqlSet = SqlSet {
    fetch_record: "SELECT fingerprint, result FROM idem_record \
        WHERE idempotency_key = ? AND biz_type = ?",
    store_result: "UPDATE idem_record SET result = ? WHERE idempotency_key = ? AND biz_type = ?",
    // Not `INSERT OR IGNORE`, which also drops the row on a NOT NULL or
    // CHECK violation (an expiry past strftime's range is NULL): only the
    // duplicate is ignored.
    claim_record: "INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
        VALUES (?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), \
        strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds')) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING",
    outbox_insert: "INSERT INTO idem_outbox \
        (topic, msg_id, payload, next_attempt_at, created_at, updated_at) \
        VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), \
        strftime('%Y-%m-%d %H:%M:%f', 'now')) RETURNING id",
    outbox_success: "UPDATE idem_outbox SET status = 'success', \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_owner = NULL, \
        locked_until = NULL \
        WHERE id = ? AND topic = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_state: "SELECT topic, status, lease_owner, attempts FROM idem_outbox WHERE id = ?",
    outbox_settle: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
        last_error = ?, lease_owner = NULL, locked_until = NULL, \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    archive_record: ArchiveSql {
        select: "SELECT id FROM idem_record WHERE expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') \
            ORDER BY expire_time LIMIT ?",
        copy: "INSERT INTO idem_record_history \
            (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, archived_at) \
            SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, \
            strftime('%Y-%m-%d %H:%M:%f', 'now') FROM idem_record \
            WHERE +expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') AND id IN (",
        delete: "DELETE FROM idem_record WHERE +expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') AND id IN (",
    },
    archive_outbox: ArchiveSql {
        select: "SELECT id FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds') \
            ORDER BY id LIMIT ?",
        copy: "INSERT INTO idem_outbox_history \
            (id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, strftime('%Y-%m-%d %H:%M:%f', 'now') \
            FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds') AND id IN (",
        delete: "DELETE FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds') AND id IN (",
    },
    find_online: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        CAST(create_time AS TEXT), CAST(expire_time AS TEXT) \
        FROM idem_record WHERE idempotency_key = ?",
    find_history: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        CAST(create_time AS TEXT), CAST(expire_time AS TEXT), CAST(archived_at AS TEXT) \
        FROM idem_record_history WHERE idempotency_key = ?",
    schema: &[
        "CREATE TABLE IF NOT EXISTS idem_record (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) <= 128),
            biz_type TEXT NOT NULL,
            biz_no TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            result TEXT,
            create_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            expire_time TEXT NOT NULL,
            CONSTRAINT uk_idem_record_key UNIQUE (idempotency_key)
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_record_expire ON idem_record (expire_time)",
        "CREATE TABLE IF NOT EXISTS idem_outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            topic TEXT NOT NULL,
            msg_id TEXT NOT NULL,
            payload TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'success', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            lease_owner TEXT,
            locked_until TEXT,
            last_error TEXT,
            created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            CONSTRAINT uk_idem_outbox_msg UNIQUE (topic, msg_id)
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_outbox_due ON idem_outbox (status, next_attempt_at)",
        // The relay's claim: pending rows of its topics, oldest first.
        "CREATE INDEX IF NOT EXISTS idx_idem_outbox_pending ON idem_outbox (topic, next_attempt_at, id) WHERE status = 'pending'",
        "CREATE TABLE IF NOT EXISTS idem_record_history (
            id INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL,
            biz_type TEXT NOT NULL,
            biz_no TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            result TEXT,
            create_time TEXT NOT NULL,
            expire_time TEXT NOT NULL,
            archived_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key ON idem_record_history (idempotency_key)",
        "CREATE TABLE IF NOT EXISTS idem_outbox_history (
            id INTEGER PRIMARY KEY,
            topic TEXT NOT NULL,
            msg_id TEXT NOT NULL,
            payload TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_at TEXT NOT NULL,
            lease_owner TEXT,
            locked_until TEXT,
            last_error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            archived_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
        "CREATE INDEX IF NOT EXISTS idx_idem_outbox_history_msg ON idem_outbox_history (topic, msg_id)",
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_sql_binds_the_key_column_when_asked() {
        let pg = Dialect::Postgres.state_sql("coupon", "id", "status", Some("used_by"));
        assert_eq!(
            pg.lock,
            r#"SELECT "status"::text, "used_by"::text FROM "coupon" WHERE "id" = $1 FOR UPDATE"#
        );
        assert_eq!(
            pg.transition,
            r#"UPDATE "coupon" SET "status" = $1, "used_by" = $2 WHERE "id" = $3 AND "status" = $4"#
        );
        assert!(pg.with_key);
        let my = Dialect::MySql.state_sql("shop.coupon", "id", "status", None);
        assert_eq!(
            my.lock,
            "SELECT CAST(`status` AS CHAR), CAST(NULL AS CHAR) FROM `shop`.`coupon` WHERE `id` = ? FOR UPDATE"
        );
        assert_eq!(
            my.transition,
            "UPDATE `shop`.`coupon` SET `status` = ? WHERE `id` = ? AND `status` = ?"
        );
        let lite = Dialect::Sqlite.state_sql("coupon", "id", "status", None);
        assert!(!lite.lock.contains("FOR UPDATE"), "{}", lite.lock);
        assert!(!lite.with_key);
    }
}
