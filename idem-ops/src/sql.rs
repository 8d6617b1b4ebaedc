//! The statements of archiving and of the operator's queries, one
//! [`OpsSql`] per dialect (each database's file fills one in), beside the
//! core's own statements and written in the same way: `?` placeholders
//! unless a field says otherwise, numbered for PostgreSQL by
//! [`OpsSql::render`].

use crate::archive::ArchiveTable;
use idem_core::Dialect;
use idem_syntax::numbered_placeholders;

mod mysql;
mod postgres;
mod sqlite;

/// One dialect's statements.
#[derive(Debug)]
pub(crate) struct OpsSql {
    /// PostgreSQL: placeholders are `$1, $2, …`.
    pub numbered: bool,
    /// Intervals are bound as whole microseconds (MariaDB's `INTERVAL ?
    /// MICROSECOND`), not as fractional seconds.
    pub micros: bool,
    /// The row lock a read of rows about to change takes (`" FOR
    /// UPDATE"`, or empty where the transaction already holds the write
    /// lock).
    pub row_lock: &'static str,
    /// The archiver's statements for `idem_record`.
    pub archive_record: ArchiveSql,
    /// The archiver's statements for `idem_outbox`.
    pub archive_outbox: ArchiveSql,
    /// The statement beginning an archiving batch (`None`: `BEGIN`).
    pub archive_begin: Option<&'static str>,
    /// Run on the connection before the batch's `BEGIN`.
    pub archive_prelude: Option<&'static str>,
    /// The online records of a key: key, biz_type, biz_no, fingerprint,
    /// result, create_time and expire_time as text. Ends with the key's
    /// condition (`AND biz_type = …` may follow). Native placeholders.
    pub find_online: &'static str,
    /// The archived records of a key: the same, and archived_at; the same
    /// ending (`ORDER BY` follows). Native placeholders.
    pub find_history: &'static str,
    /// The operator's expressions.
    pub admin: AdminSql,
    /// The tables as the first release created them (schema version 1).
    pub schema: &'static [&'static str],
    /// How the migration locks and upgrades.
    pub migrate: MigrateSql,
}

/// The statements of `dialect`.
pub(crate) fn of(dialect: Dialect) -> &'static OpsSql {
    match dialect {
        Dialect::Postgres => &postgres::SQL,
        Dialect::MySql => &mysql::SQL,
        Dialect::Sqlite => &sqlite::SQL,
    }
}

/// The statements of one archiving batch of one table (native
/// placeholders).
#[derive(Debug)]
pub(crate) struct ArchiveSql {
    /// Locks the candidates' ids: `[retention,] limit`.
    pub select: &'static str,
    /// Counts the rows `select` would find now, without locking (the
    /// same condition, no limit): `[retention]`.
    pub count: &'static str,
    /// `INSERT INTO …_history … SELECT … WHERE <condition> AND id IN (`:
    /// `[retention,] ids…`; the id list and `)` are appended.
    pub copy: &'static str,
    /// `DELETE … WHERE <condition> AND id IN (`: the same binds.
    pub delete: &'static str,
}

/// The dialect's pieces of the operator's queries.
#[derive(Debug)]
pub(crate) struct AdminSql {
    /// A timestamp column as text, `YYYY-MM-DD HH:MM:SS.ffffff`.
    pub ts_text: fn(&str) -> String,
    /// "Now", in the format of the timestamp columns.
    pub now: &'static str,
    /// Seconds since `MIN(created_at)` (an aggregate), as a float.
    pub pending_age: &'static str,
    /// `last_error` prefixed with `requeued: `.
    pub requeued_error: &'static str,
    /// Seconds since a timestamp column (not an aggregate), as a float.
    pub age_secs: fn(&str) -> String,
    /// A float expression rounded down to a 64-bit integer (SQLite:
    /// truncated toward zero, the same for the non-negative values it is
    /// given).
    pub floor_int: fn(&str) -> String,
    /// "Now" minus an interval of one bind, bound as `bind_secs!` binds it
    /// (fractional seconds, or whole microseconds where `micros`), in the
    /// format of the timestamp columns: the archiver's way.
    pub ago: &'static str,
    /// Pauses a topic unless it is paused already (then changes nothing,
    /// 0 rows): `topic, reason, paused_by`.
    pub pause: &'static str,
}

/// How the migration serializes with itself, and upgrades.
#[derive(Debug)]
pub(crate) struct MigrateSql {
    /// The lock concurrent migrations wait on.
    pub lock: MigrateLock,
    /// A query answering a number that tells server flavours apart
    /// (MariaDB / MySQL 8), passed to `upgrades`.
    pub flavor_probe: Option<&'static str>,
    /// The statements of versions 2, 3, …: `upgrades(probe)[v - 2]`
    /// brings version `v - 1` to `v`.
    pub upgrades: fn(i64) -> Vec<Vec<String>>,
}

/// The migration's lock.
#[derive(Debug)]
pub(crate) enum MigrateLock {
    /// One transaction, begun with `begin` (`None`: `BEGIN`), then `lock`.
    Transaction {
        /// The `BEGIN` statement.
        begin: Option<&'static str>,
        /// A lock taken first in the transaction.
        lock: Option<&'static str>,
    },
    /// DDL is not transactional: a session lock on a dedicated
    /// connection (`acquire` answers 1 when taken).
    Session {
        /// Answers 1 once the lock is held.
        acquire: &'static str,
        /// Releases it.
        release: &'static str,
        /// The error when `acquire` gave up.
        busy: &'static str,
    },
}

impl OpsSql {
    /// `sql`, written with `?`, in the dialect's placeholders.
    pub(crate) fn render(&self, sql: &str) -> String {
        if self.numbered {
            numbered_placeholders(sql)
        } else {
            sql.to_string()
        }
    }

    /// `n` placeholders, the first numbered `first` on PostgreSQL.
    pub(crate) fn placeholders(&self, first: usize, n: usize) -> String {
        (0..n)
            .map(|i| {
                if self.numbered {
                    format!("${}", first + i)
                } else {
                    "?".to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The archiving statements of `table`.
    pub(crate) fn archive(&self, table: ArchiveTable) -> &ArchiveSql {
        match table {
            ArchiveTable::Records => &self.archive_record,
            ArchiveTable::Outbox => &self.archive_outbox,
        }
    }
}

/// `?, ?, …`: `n` unnumbered placeholders.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
#[path = "sql_tests.rs"]
mod tests;
