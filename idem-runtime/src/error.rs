//! The one error type of idem, and whether a retry can help.

use std::error::Error as StdError;
use std::fmt;

/// A boxed error from a handler body.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything that can go wrong in an idempotent call.
///
/// Each variant says whether retrying the same call can succeed: see
/// [`Error::is_retryable`]. A retry is always safe — that is the point of
/// idem — but only a retryable error can be healed by one.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is empty, too long, has control characters, or was
    /// rejected by the handler's `validate` function. Nothing was executed.
    /// Not retryable.
    InvalidKey {
        /// The key as derived (possibly truncated for display).
        key: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The entity is not in the `from` state (nor already in `to`), or does
    /// not exist. Nothing was changed. Not retryable.
    IllegalState {
        /// The entity's table.
        table: &'static str,
        /// The entity id, as text.
        id: String,
        /// The state found, or `None` when no such entity exists.
        found: Option<String>,
        /// The state the transition starts from.
        expected: &'static str,
    },
    /// The same key was used before with a different payload (record
    /// strategy). Nothing was executed. Not retryable.
    KeyConflict {
        /// The reused key.
        key: String,
    },
    /// The outbox message driving the call is no longer held by this
    /// delivery: its lease was taken over by another claim (`holder`,
    /// `attempt`). Nothing ran; the current holder delivers it. Retryable
    /// (the relay's bookkeeping for this attempt is then a no-op).
    LeaseLost {
        /// The outbox message id.
        id: i64,
        /// The lease owner the message has now, if any.
        holder: Option<String>,
        /// The attempt number the message has now.
        attempt: i32,
    },
    /// The outbox message driving the call does not exist, belongs to
    /// another topic, or is already finished. Nothing ran. Not retryable.
    OutboxMessage {
        /// The outbox message id.
        id: i64,
        /// What is wrong with it.
        reason: String,
    },
    /// The database failed. Retryable when the failure is transient: lost
    /// connection, pool time-out, deadlock, serialization failure, lock
    /// wait time-out, or a busy SQLite database (see [`is_transient`] for
    /// the codes of each database).
    Database(sqlx::Error),
    /// The connection failed while committing: the transaction may or may
    /// not have committed. Retryable, and the retry is safe because the
    /// handler is idempotent; this is exactly the lost-acknowledgement case.
    CommitUnknown(sqlx::Error),
    /// The handler body returned an error. Everything was rolled back.
    /// Retryable when the body's error is a transient database error, or was
    /// marked retryable with [`Error::retryable`].
    Handler {
        /// The body's error.
        source: BoxError,
        /// Whether a retry can help.
        retryable: bool,
    },
    /// A stored result could not be serialized or read back (record
    /// strategy). Not retryable.
    Serialization(serde_json::Error),
    /// The configuration is unsafe or invalid, for example a record ttl
    /// shorter than the longest window in which a duplicate can still
    /// arrive (see [`RetentionPolicy`](crate::archive::RetentionPolicy)).
    /// Not retryable.
    Config {
        /// What is wrong, with the numbers.
        reason: String,
    },
}

impl Error {
    /// Whether retrying the same call can succeed.
    ///
    /// ```
    /// let e = idem_runtime::Error::retryable("broker busy");
    /// assert!(e.is_retryable());
    /// let e = idem_runtime::Error::permanent("bad payload");
    /// assert!(!e.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::InvalidKey { .. }
            | Error::IllegalState { .. }
            | Error::KeyConflict { .. }
            | Error::Serialization(_)
            | Error::Config { .. } => false,
            Error::Database(e) => is_transient(e),
            Error::CommitUnknown(_) | Error::LeaseLost { .. } => true,
            Error::OutboxMessage { .. } => false,
            Error::Handler { retryable, .. } => *retryable,
        }
    }

    /// A handler error that a retry may heal (for example a downstream
    /// service that timed out). Return it from a handler body.
    pub fn retryable(source: impl Into<BoxError>) -> Self {
        Error::Handler {
            source: source.into(),
            retryable: true,
        }
    }

    /// A handler error that no retry can heal (for example a payload that
    /// fails validation). Return it from a handler body.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Error::Handler {
            source: source.into(),
            retryable: false,
        }
    }

    /// A short, stable name of the variant, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidKey { .. } => "invalid_key",
            Error::IllegalState { .. } => "illegal_state",
            Error::KeyConflict { .. } => "key_conflict",
            Error::LeaseLost { .. } => "lease_lost",
            Error::OutboxMessage { .. } => "outbox_message",
            Error::Database(_) => "database",
            Error::CommitUnknown(_) => "commit_unknown",
            Error::Handler { .. } => "handler",
            Error::Serialization(_) => "serialization",
            Error::Config { .. } => "config",
        }
    }

    /// Turns a handler body's error into an [`Error`].
    ///
    /// An [`Error`] passes through unchanged; a [`sqlx::Error`] anywhere in
    /// the source chain decides retryability; anything else is permanent.
    pub(crate) fn from_handler(source: BoxError) -> Self {
        let source = match source.downcast::<Error>() {
            Ok(e) => return *e,
            Err(other) => other,
        };
        let retryable = find_sqlx(&*source).is_some_and(is_transient);
        Error::Handler { source, retryable }
    }
}

/// Finds a [`sqlx::Error`] in an error's source chain.
pub(crate) fn find_sqlx<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a sqlx::Error> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(s) = e.downcast_ref::<sqlx::Error>() {
            return Some(s);
        }
        cur = e.source();
    }
    None
}

/// Whether a database error is transient: a retry of the whole transaction
/// can succeed.
///
/// Connection-level failures are transient: [`sqlx::Error::Io`], `Tls`,
/// `Protocol`, `PoolTimedOut` and `WorkerCrashed`. An error the server
/// answered ([`sqlx::Error::Database`]) is classified by the code of the
/// database that raised it, read from the driver's own error type
/// (PostgreSQL: the SQLSTATE; MariaDB/MySQL: the error number; SQLite: the
/// primary result code), never by applying one database's numbering to
/// another's:
///
/// | database | transient codes | everything else |
/// |---|---|---|
/// | PostgreSQL | `40001` serialization failure, `40P01` deadlock, `55P03` lock not available, `57P01`/`57P02`/`57P03` shutdown, crash, not accepting connections yet, `57P05` idle session time-out, class `08` connection exception, `53300` too many connections | permanent (e.g. `22021` a NUL byte in text, `23505` unique violation, `42501` insufficient privilege) |
/// | MariaDB/MySQL | `1205` lock wait time-out, `1213` deadlock, `1020` record changed since last read (MariaDB 11.6+ snapshot isolation), `1614` XA branch rolled back on deadlock, `1040` too many connections, `1203` too many connections of the user, `1637` too many concurrent transactions, `1053` shutdown in progress, `1927` connection killed, `1158`–`1161` network read/write error or time-out, `4031` disconnected for inactivity (MySQL 8; on MariaDB `4031` is a missing trigger, permanent) | permanent (e.g. `1062` duplicate key, `1146` no such table) |
/// | SQLite | primary code `5` busy, `6` locked (any extended code of them, e.g. `517` busy snapshot) | permanent (e.g. `19` constraint) |
/// | other drivers | the SQLSTATE rules of PostgreSQL | permanent |
///
/// ```
/// assert!(idem_runtime::is_transient(&sqlx::Error::PoolTimedOut));
/// assert!(!idem_runtime::is_transient(&sqlx::Error::RowNotFound));
/// ```
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => database_is_transient(&**db),
        _ => false,
    }
}

/// Classifies an error the server answered, by the driver it came from.
fn database_is_transient(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg_sqlstate_is_transient(pg.code());
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql_error_is_transient(my.number(), my.message());
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // The driver reports the extended result code, in decimal.
        return db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(sqlite_code_is_transient);
    }
    // A driver idem does not know (or one whose idem feature is off):
    // its SQLSTATE, if it reports one.
    db.code()
        .is_some_and(|code| pg_sqlstate_is_transient(&code))
}

/// PostgreSQL (and standard SQL) SQLSTATEs a retry of the transaction can
/// heal.
pub(crate) fn pg_sqlstate_is_transient(code: &str) -> bool {
    matches!(
        code,
        // serialization_failure, deadlock_detected: the transaction was
        // rolled back so that another could go on.
        "40001" | "40P01"
        // lock_not_available: NOWAIT or lock_timeout hit a held lock.
        | "55P03"
        // admin_shutdown, crash_shutdown, cannot_connect_now (starting up
        // or in recovery), idle_session_timeout: the session ended, a new
        // connection works.
        | "57P01" | "57P02" | "57P03" | "57P05"
        // too_many_connections: a slot frees up.
        | "53300"
    ) || code.starts_with("08") // connection_exception and its subclasses
}

/// MariaDB/MySQL error numbers a retry of the transaction can heal. `4031`
/// is not here: its meaning depends on the server (see
/// [`mysql_error_is_transient`]).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn mysql_number_is_transient(number: u16) -> bool {
    matches!(
        number,
        // ER_LOCK_WAIT_TIMEOUT: a lock held longer than
        // innodb_lock_wait_timeout; ER_LOCK_DEADLOCK: the transaction was
        // rolled back; both say "try restarting transaction".
        1205 | 1213
        // ER_CHECKREAD "Record has changed since last read": a write
        // conflict under repeatable read with innodb_snapshot_isolation
        // (on by default from MariaDB 11.6); "try restarting transaction".
        | 1020
        // ER_XA_RBDEADLOCK: the XA branch was rolled back on a deadlock.
        | 1614
        // ER_CON_COUNT_ERROR, ER_TOO_MANY_USER_CONNECTIONS,
        // ER_TOO_MANY_CONCURRENT_TRXS: a slot frees up.
        | 1040 | 1203 | 1637
        // ER_SERVER_SHUTDOWN: a restarted (or failed-over) server answers.
        | 1053
        // ER_CONNECTION_KILLED (MariaDB): the session was killed, a new
        // connection works.
        | 1927
        // ER_NET_READ_ERROR, ER_NET_READ_INTERRUPTED, ER_NET_ERROR_ON_WRITE,
        // ER_NET_WRITE_INTERRUPTED: the network between client and server.
        | 1158..=1161
    )
}

/// [`mysql_number_is_transient`], and `4031` when it is MySQL 8's
/// ER_CLIENT_INTERACTION_TIMEOUT (disconnected for inactivity), told apart
/// from MariaDB's ER_REFERENCED_TRG_DOES_NOT_EXIST by its message.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn mysql_error_is_transient(number: u16, message: &str) -> bool {
    mysql_number_is_transient(number)
        || (number == 4031 && message.contains("because of inactivity"))
}

/// SQLite result codes (primary or extended) a retry can heal: the primary
/// code `SQLITE_BUSY` (5: another connection holds the lock) or
/// `SQLITE_LOCKED` (6: a conflict inside a shared cache), whatever the
/// extended code (`SQLITE_BUSY_SNAPSHOT` 517, `SQLITE_BUSY_RECOVERY` 261…).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn sqlite_code_is_transient(code: i32) -> bool {
    matches!(code & 0xff, 5 | 6)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey { key, reason } => {
                write!(f, "invalid idempotency key `{key}`: {reason}")
            }
            Error::IllegalState {
                table,
                id,
                found: Some(found),
                expected,
            } => write!(
                f,
                "illegal state: {table} {id} is `{found}`, the transition needs `{expected}`"
            ),
            Error::IllegalState {
                table,
                id,
                found: None,
                ..
            } => write!(f, "illegal state: no {table} with id {id}"),
            Error::KeyConflict { key } => write!(
                f,
                "idempotency key `{key}` was already used with a different payload"
            ),
            Error::LeaseLost {
                id,
                holder,
                attempt,
            } => write!(
                f,
                "outbox message {id} is no longer held by this delivery: it is now attempt \
                 {attempt} of {}; nothing ran",
                holder.as_deref().unwrap_or("no relay")
            ),
            Error::OutboxMessage { id, reason } => {
                write!(f, "outbox message {id} cannot drive this call: {reason}")
            }
            Error::Database(e) => write!(f, "database error: {e}"),
            Error::CommitUnknown(e) => write!(
                f,
                "commit outcome unknown (the connection failed during COMMIT): {e}"
            ),
            Error::Handler { source, .. } => write!(f, "handler failed: {source}"),
            Error::Serialization(e) => write!(f, "stored result could not be (de)serialized: {e}"),
            Error::Config { reason } => write!(f, "unsafe configuration: {reason}"),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Database(e) | Error::CommitUnknown(e) => Some(e),
            Error::Handler { source, .. } => Some(&**source),
            Error::Serialization(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_codes() {
        for code in [
            "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "57P05", "53300", "08000",
            "08003", "08006", "08001", "08004", "08P01",
        ] {
            assert!(pg_sqlstate_is_transient(code), "{code} should be transient");
        }
        for code in [
            "22021", "22022", "42501", "23505", "23503", "42P01", "42601", "22P02", "40002",
            "57014", "53100", "00000", "", "5", "261", "1205", "1213",
        ] {
            assert!(
                !pg_sqlstate_is_transient(code),
                "{code} should be permanent"
            );
        }
    }

    #[test]
    fn mysql_numbers() {
        for n in [
            1205, 1213, 1020, 1614, 1040, 1203, 1637, 1053, 1927, 1158, 1159, 1160, 1161,
        ] {
            assert!(mysql_number_is_transient(n), "{n} should be transient");
            assert!(mysql_error_is_transient(n, ""), "{n} should be transient");
        }
        for n in [
            1062, 1146, 1064, 1048, 1406, 1452, 1366, 1317, 1969, 1180, 1290, 1836, 4031, 5, 6,
            517, 2006, 2013,
        ] {
            assert!(!mysql_number_is_transient(n), "{n} should be permanent");
        }
        assert!(mysql_error_is_transient(
            4031,
            "The client was disconnected by the server because of inactivity."
        ));
        assert!(!mysql_error_is_transient(
            4031,
            "Referenced trigger 't1' for the given action time and event type does not exist"
        ));
    }

    #[test]
    fn sqlite_codes() {
        // SQLITE_BUSY, SQLITE_LOCKED and their extended codes.
        for code in [5, 6, 261, 517, 773, 262, 518] {
            assert!(sqlite_code_is_transient(code), "{code} should be transient");
        }
        // SQLITE_ERROR, CONSTRAINT (and UNIQUE 2067, PRIMARYKEY 1555),
        // READONLY, FULL, CORRUPT, MISMATCH.
        for code in [0, 1, 19, 2067, 1555, 8, 13, 11, 20] {
            assert!(
                !sqlite_code_is_transient(code),
                "{code} should be permanent"
            );
        }
    }

    #[test]
    fn connection_level_errors_are_transient() {
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::WorkerCrashed));
        assert!(is_transient(&sqlx::Error::Io(std::io::Error::other(
            "reset"
        ))));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::PoolClosed));
    }
}
