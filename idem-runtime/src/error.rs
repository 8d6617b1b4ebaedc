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
    /// An outbox message's `topic` or `msg_id` is empty, longer than
    /// [`outbox::MAX_ID_LEN`](crate::outbox::MAX_ID_LEN) bytes or has
    /// control characters, or its payload is longer than
    /// [`outbox::MAX_PAYLOAD_LEN`](crate::outbox::MAX_PAYLOAD_LEN) bytes:
    /// checked before any SQL, so nothing was written and the caller's
    /// transaction is untouched. (Also, and then after the insert: the
    /// database neither stored the message nor holds one of this topic and
    /// id, an error it turned into a warning.) Not retryable.
    InvalidMessage {
        /// The topic (possibly truncated and escaped for display).
        topic: String,
        /// The message id (possibly truncated and escaped for display).
        msg_id: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A message with this `topic` and `msg_id` is already enqueued with
    /// another payload (the same payload answers
    /// [`Enqueued::Already`](crate::outbox::Enqueued::Already)). Nothing
    /// was written; the caller's transaction is still usable. Not
    /// retryable: a message id names one message.
    MessageConflict {
        /// The topic.
        topic: String,
        /// The message id.
        msg_id: String,
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
    /// The caller's transaction ([`CallerTx`](crate::CallerTx)) is gone:
    /// a call inside it was cancelled or failed in a way that rolled the
    /// whole transaction back, so none of its writes will commit. Retryable:
    /// begin a new transaction and run it all again.
    TransactionLost {
        /// What happened to it.
        reason: String,
    },
    /// A stored result could not be serialized or read back (record
    /// strategy). Not retryable.
    Serialization(serde_json::Error),
    /// The configuration is unsafe or invalid, for example a record ttl
    /// shorter than the longest window in which a duplicate can still
    /// arrive (see [`RetentionPolicy`](crate::archive::RetentionPolicy)),
    /// or a connection pooler in transaction mode (pgbouncer
    /// `pool_mode = transaction`) without
    /// [`pooler::transaction_mode`](crate::pooler::transaction_mode): the
    /// PostgreSQL errors it causes (`26000`, `42P05`, `08P01` about a
    /// prepared statement) become this variant, naming the pooler and the
    /// option. Not retryable.
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
            Error::CommitUnknown(_) | Error::LeaseLost { .. } | Error::TransactionLost { .. } => {
                true
            }
            Error::OutboxMessage { .. }
            | Error::InvalidMessage { .. }
            | Error::MessageConflict { .. } => false,
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
            Error::InvalidMessage { .. } => "invalid_message",
            Error::MessageConflict { .. } => "message_conflict",
            Error::Database(_) => "database",
            Error::CommitUnknown(_) => "commit_unknown",
            Error::Handler { .. } => "handler",
            Error::TransactionLost { .. } => "transaction_lost",
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
        let found = find_sqlx(&*source);
        // The body's own statement hit a pooler in transaction mode.
        if let Some(reason) = found.and_then(pooler_error) {
            return Error::Config { reason };
        }
        let retryable = found.is_some_and(is_transient);
        Error::Handler { source, retryable }
    }
}

impl Error {
    /// A database error as an [`Error`]: [`Error::Database`], or
    /// [`Error::Config`] when it is one a connection pooler in transaction
    /// mode causes ([`pooler_error`]).
    pub(crate) fn database(e: sqlx::Error) -> Self {
        match pooler_error(&e) {
            Some(reason) => Error::Config { reason },
            None => Error::Database(e),
        }
    }
}

/// Whether a PostgreSQL error is one that a connection pooler in
/// transaction mode (pgbouncer `pool_mode = transaction`) causes when
/// statements are prepared as named statements, or when the two round
/// trips of one statement land on two server connections: `26000`
/// (`prepared statement "sqlx_s_3" does not exist`), `42P05`
/// (`… already exists`), and `08P01` about a prepared statement or a bind
/// message (`bind message supplies 2 parameters, but prepared statement ""
/// requires 1`: the statement parsed on one server connection, bound on
/// another). Returns the reason for an [`Error::Config`]: what happened,
/// the pooler, and the option ([`pooler`](crate::pooler)).
///
/// Also pgbouncer's `08P01 unsupported startup parameter: extra_float_digits`
/// (a parameter sqlx sends on connecting, which pgbouncer refuses unless
/// listed in its `ignore_startup_parameters`).
///
/// Only PostgreSQL's codes (PostgreSQL's driver, or an unknown driver
/// reporting a SQLSTATE); MariaDB's and SQLite's errors are never taken
/// for it.
pub(crate) fn pooler_error(e: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    let db = &**db;
    #[cfg(feature = "mysql")]
    if db
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .is_some()
    {
        return None;
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return None;
    }
    let code = db.code()?;
    if code == "08P01" && db.message().starts_with("unsupported startup parameter") {
        // pgbouncer refusing a parameter sqlx sends when it connects.
        return Some(format!(
            "the connection pooler answered 08P01 `{}`: pgbouncer forwards only the startup \
             parameters it knows, and sqlx's PostgreSQL driver sends extra_float_digits; add \
             `ignore_startup_parameters = extra_float_digits` to pgbouncer.ini \
             (pgbouncer pool_mode=transaction also needs \
             idem_runtime::pooler::transaction_mode(true))",
            db.message()
        ));
    }
    if !sqlstate_is_pooler(&code, db.message()) {
        return None;
    }
    let ours = if crate::pooler::transaction_mode_enabled() {
        "idem's own statements are already unnamed and transactional \
         (idem_runtime::pooler::transaction_mode is on), so one of yours is not: \
         prepare your statements with .persistent(false) (or \
         .persistent(idem_runtime::pooler::persistent())) and run them inside a transaction"
    } else {
        "enable idem_runtime::pooler::transaction_mode(true) (or IDEM_TRANSACTION_POOLING=1, \
         or `idem --transaction-pooling`) before the first call, and prepare your own \
         statements with .persistent(false) (or .persistent(idem_runtime::pooler::persistent()))"
    };
    Some(format!(
        "PostgreSQL answered {code} `{}`: prepared statements of different client connections \
         meet on one server connection, or a statement prepared on one server connection runs \
         on another, which looks like a connection pooler in transaction mode \
         (pgbouncer pool_mode=transaction) between idem and PostgreSQL; {ours}. \
         (Session pooling, or a direct connection, needs none of this.)",
        db.message()
    ))
}

/// The SQLSTATEs (and, for `08P01`, the messages) of [`pooler_error`].
fn sqlstate_is_pooler(code: &str, message: &str) -> bool {
    match code {
        // invalid_sql_statement_name, duplicate_prepared_statement
        "26000" | "42P05" => true,
        // protocol_violation: PostgreSQL's own answer to a Bind meant for
        // a statement prepared elsewhere (parameter or result-format count).
        "08P01" => {
            let m = message.to_ascii_lowercase();
            m.contains("prepared statement") || m.contains("bind message")
        }
        _ => false,
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
/// primary result code; each database's rules live in its backend file), never by applying one database's numbering to
/// another's:
///
/// | database | transient codes | everything else |
/// |---|---|---|
/// | PostgreSQL | `40001` serialization failure, `40P01` deadlock, `55P03` lock not available, `57P01`/`57P02`/`57P03` shutdown, crash, not accepting connections yet, `57P05` idle session time-out, class `08` connection exception (but not `08P01` about a prepared statement or a bind message: a pooler in transaction mode, see [`pooler`](crate::pooler)), `53300` too many connections, `25006` read-only transaction (a standby, or a primary demoted in a failover) | permanent (e.g. `26000`/`42P05` a prepared statement missing or already there, which converting into [`Error`] reports as [`Error::Config`] naming the pooler; `22021` a NUL byte in text, `23505` unique violation, `42501` insufficient privilege) |
/// | MariaDB/MySQL | `1205` lock wait time-out, `1213` deadlock, `1020` record changed since last read (MariaDB 11.6+ snapshot isolation), `1614` XA branch rolled back on deadlock, `1040` too many connections, `1203` too many connections of the user, `1637` too many concurrent transactions, `1053` shutdown in progress, `1927` connection killed, `1158`–`1161` network read/write error or time-out, `4031` disconnected for inactivity (MySQL 8; on MariaDB `4031` is a missing trigger, permanent), `1792` read-only transaction and `1290` for `--read-only` (a replica, a demoted node) | permanent (e.g. `1062` duplicate key, `1146` no such table) |
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
        sqlx::Error::Database(_) if pooler_error(e).is_some() => false,
        sqlx::Error::Database(db) => database_is_transient(&**db),
        _ => false,
    }
}

/// Whether a failed `COMMIT` (or a failure right after sending it) leaves
/// the outcome unknown: the connection failed ([`is_transient`]'s
/// connection-level errors), or the server answered with an error that
/// ends the session (PostgreSQL `57P01`–`57P05` shutdown/termination and
/// class `08`; MariaDB/MySQL `1053`, `1927`, `1158`–`1161`, MySQL 8's
/// `4031`). A session terminated while its `COMMIT` ran (an administrator,
/// a failover) may have committed or not. Any other error the server
/// answered (a deferred constraint, a serialization failure) is a definite
/// rollback.
pub(crate) fn commit_outcome_unknown(e: &sqlx::Error) -> bool {
    match e {
        // The session is alive: the statement was refused (see
        // `pooler_error`).
        sqlx::Error::Database(_) if pooler_error(e).is_some() => false,
        sqlx::Error::Database(db) => database_is_connection_loss(&**db),
        _ => true,
    }
}

/// Whether `e` is a conflict with a concurrent transaction (a deadlock, a
/// serialization failure, a Galera certification failure: PostgreSQL
/// `40001`, `40P01`; MariaDB/MySQL `1213`, `1020`, `1614`): the
/// transaction was rolled back so that the other could go on, and an
/// immediate retry is right. SQLite's busy is not one: its busy time-out
/// already waited.
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return crate::backend::postgres::sqlstate_is_conflict(pg.code());
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return crate::backend::mysql::number_is_conflict(my.number());
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return false;
    }
    db.code()
        .is_some_and(|code| crate::backend::postgres::sqlstate_is_conflict(&code))
}

fn database_is_connection_loss(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return crate::backend::postgres::sqlstate_is_connection_loss(pg.code());
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return crate::backend::mysql::error_is_connection_loss(my.number(), my.message());
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return false;
    }
    db.code()
        .is_some_and(|code| crate::backend::postgres::sqlstate_is_connection_loss(&code))
}

/// Classifies an error the server answered, by the driver it came from.
fn database_is_transient(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return crate::backend::postgres::sqlstate_is_transient(pg.code());
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return crate::backend::mysql::error_is_transient(my.number(), my.message());
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // The driver reports the extended result code, in decimal.
        return db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(crate::backend::sqlite::code_is_transient);
    }
    // A driver idem does not know (or one whose idem feature is off):
    // its SQLSTATE, if it reports one.
    db.code()
        .is_some_and(|code| crate::backend::postgres::sqlstate_is_transient(&code))
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
            Error::InvalidMessage {
                topic,
                msg_id,
                reason,
            } => write!(
                f,
                "invalid outbox message (topic `{topic}`, msg_id `{msg_id}`): {reason}; \
                 nothing was enqueued"
            ),
            Error::MessageConflict { topic, msg_id } => write!(
                f,
                "outbox message `{msg_id}` of topic `{topic}` is already enqueued with a \
                 different payload; nothing was enqueued"
            ),
            Error::Database(e) => write!(f, "database error: {e}"),
            Error::CommitUnknown(e) => write!(
                f,
                "commit outcome unknown (the connection failed during COMMIT): {e}"
            ),
            Error::Handler { source, .. } => write!(f, "handler failed: {source}"),
            Error::TransactionLost { reason } => write!(
                f,
                "the caller's transaction was rolled back ({reason}); begin a new one and retry"
            ),
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
    /// [`Error::Database`]; [`Error::Config`] for the errors a connection
    /// pooler in transaction mode causes (PostgreSQL `26000`, `42P05`, and
    /// `08P01` about prepared statements: see [`pooler`](crate::pooler)).
    fn from(e: sqlx::Error) -> Self {
        Error::database(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A server error with a SQLSTATE, from a driver idem does not know
    /// (the path PostgreSQL's codes take when no driver claims them).
    #[derive(Debug)]
    struct Coded(&'static str, &'static str);
    impl fmt::Display for Coded {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.1)
        }
    }
    impl StdError for Coded {}
    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            self.1
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> BoxError {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn db(code: &'static str, message: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Coded(code, message)))
    }

    #[test]
    fn pooler_errors_are_a_config_error_naming_the_pooler_and_the_option() {
        for (code, message) in [
            ("26000", r#"prepared statement "sqlx_s_12" does not exist"#),
            ("42P05", r#"prepared statement "sqlx_s_3" already exists"#),
            (
                "08P01",
                r#"bind message supplies 2 parameters, but prepared statement "" requires 1"#,
            ),
            (
                "08P01",
                "bind message has 2 result formats but query has 1 columns",
            ),
        ] {
            let e = db(code, message);
            assert!(!is_transient(&e), "{code} is not transient");
            assert!(!commit_outcome_unknown(&e), "{code}: the session is alive");
            let err = Error::from(e);
            let Error::Config { reason } = &err else {
                panic!("{code}: {err:?}");
            };
            assert!(!err.is_retryable());
            assert_eq!(err.kind(), "config");
            for part in [
                code,
                message,
                "pgbouncer pool_mode=transaction",
                "idem_runtime::pooler::transaction_mode",
                ".persistent(false)",
            ] {
                assert!(reason.contains(part), "{part} missing from: {reason}");
            }
            // The same error from a handler body's own statement.
            let body: BoxError = Box::new(db(code, message));
            assert!(matches!(Error::from_handler(body), Error::Config { .. }));
        }
        // pgbouncer refusing sqlx's startup parameter.
        let e = db("08P01", "unsupported startup parameter: extra_float_digits");
        assert!(!is_transient(&e));
        let err = Error::from(e);
        assert!(
            matches!(&err, Error::Config { reason } if reason.contains("ignore_startup_parameters = extra_float_digits")),
            "{err:?}"
        );
    }

    #[test]
    fn other_errors_keep_their_classification() {
        // 08P01 that is not about a prepared statement: a connection
        // exception like the rest of class 08.
        let e = db("08P01", "invalid frontend message type 0");
        assert!(is_transient(&e));
        assert!(commit_outcome_unknown(&e));
        assert!(matches!(Error::from(e), Error::Database(_)));
        for (code, transient) in [("40001", true), ("23505", false), ("42P01", false)] {
            let e = db(code, "x");
            assert_eq!(is_transient(&e), transient, "{code}");
            assert!(matches!(Error::from(e), Error::Database(_)), "{code}");
        }
        let body: BoxError = Box::new(db("40001", "could not serialize access"));
        assert!(matches!(
            Error::from_handler(body),
            Error::Handler {
                retryable: true,
                ..
            }
        ));
    }
}
