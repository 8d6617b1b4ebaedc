//! What a database error means for a retry, read by the driver that raised
//! it.
//!
//! Each database's file classifies its own driver's errors (its
//! `classify`, which looks at its own driver's error type only and answers
//! `None` for any other); this module asks each compiled-in driver in turn
//! and applies the answer. A driver idem does not know (or one whose idem
//! feature is off) is read by its SQLSTATE, if it reports one, with
//! PostgreSQL's rules: never one database's numbering applied to
//! another's.

use super::class::{Class, PoolerFault};
use std::error::Error as StdError;

/// A driver's own classification: `None` when the error is not its
/// driver's.
type Classifier = fn(&dyn sqlx::error::DatabaseError) -> Option<Class>;

/// The compiled-in drivers, each classifying its own errors.
const DRIVERS: &[Classifier] = &[
    #[cfg(feature = "postgres")]
    super::postgres::classify,
    #[cfg(feature = "mysql")]
    super::mysql::classify,
    #[cfg(feature = "sqlite")]
    super::sqlite::classify,
];

/// What `db` means, by the driver it came from.
pub(crate) fn class_of(db: &dyn sqlx::error::DatabaseError) -> Class {
    DRIVERS
        .iter()
        .find_map(|classify| classify(db))
        .or_else(|| {
            db.code()
                .map(|code| super::postgres::sqlstate_class(&code, db.message()))
        })
        .unwrap_or_default()
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
/// primary result code; each database's rules live in its backend file),
/// never by applying one database's numbering to another's:
///
/// | database | transient codes | everything else |
/// |---|---|---|
/// | PostgreSQL | `40001` serialization failure, `40P01` deadlock, `55P03` lock not available, `57P01`/`57P02`/`57P03` shutdown, crash, not accepting connections yet, `57P05` idle session time-out, class `08` connection exception (but not `08P01` about a prepared statement or a bind message: a pooler in transaction mode, see [`pooler`](crate::pooler)), `53300` too many connections, `25006` read-only transaction (a standby, or a primary demoted in a failover) | permanent (e.g. `26000`/`42P05` a prepared statement missing or already there, which converting into [`Error`](crate::Error) reports as [`Error::Config`](crate::Error::Config) naming the pooler; `22021` a NUL byte in text, `23505` unique violation, `42501` insufficient privilege) |
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
        sqlx::Error::Database(db) => {
            let class = class_of(&**db);
            class.transient && class.pooler.is_none()
        }
        _ => false,
    }
}

/// Whether a database error means the database could not be reached: a
/// connection-level failure ([`sqlx::Error::Io`], `Tls`, `PoolTimedOut`,
/// `WorkerCrashed`), or the server's answer that it is going away or not
/// taking sessions (the errors that end a session: PostgreSQL
/// `57P01`–`57P05` and class `08`, but not `08P01` from a pooler;
/// MariaDB/MySQL `1053`, `1927`, `1158`–`1161`, MySQL 8's `4031`). A
/// deadlock, a lock wait, a read-only standby or any error about the
/// statement itself is not one (see [`Error::is_outage`](crate::Error::is_outage)).
pub(crate) fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let class = class_of(&**db);
            class.session_lost && class.pooler.is_none()
        }
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
/// rollback, and so is one a pooler causes: the session is alive, the
/// statement was refused.
pub(crate) fn commit_outcome_unknown(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            let class = class_of(&**db);
            class.session_lost && class.pooler.is_none()
        }
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
    match e {
        sqlx::Error::Database(db) => class_of(&**db).conflict,
        _ => false,
    }
}

/// Whether an error is one that a connection pooler in transaction mode
/// (pgbouncer `pool_mode = transaction`) causes: PostgreSQL's `26000`,
/// `42P05`, `08P01` about a prepared statement or a bind message, and
/// pgbouncer's `08P01 unsupported startup parameter` (PostgreSQL's driver,
/// or an unknown driver reporting a SQLSTATE; MariaDB's and SQLite's
/// errors are never taken for it). Returns the reason for an
/// [`Error::Config`](crate::Error::Config): what happened, the pooler, and
/// the option.
pub(crate) fn pooler_error(e: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    let fault = class_of(&**db).pooler?;
    let message = db.message();
    if fault == PoolerFault::StartupParameter {
        // pgbouncer refusing a parameter sqlx sends when it connects.
        return Some(format!(
            "the connection pooler answered 08P01 `{message}`: pgbouncer forwards only the \
             startup parameters it knows, and sqlx's PostgreSQL driver sends extra_float_digits; \
             add `ignore_startup_parameters = extra_float_digits` to pgbouncer.ini \
             (pgbouncer pool_mode=transaction also needs \
             idem_runtime::pooler::transaction_mode(true))"
        ));
    }
    let code = db.code().unwrap_or_default();
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
        "PostgreSQL answered {code} `{message}`: prepared statements of different client \
         connections meet on one server connection, or a statement prepared on one server \
         connection runs on another, which looks like a connection pooler in transaction mode \
         (pgbouncer pool_mode=transaction) between idem and PostgreSQL; {ours}. \
         (Session pooling, or a direct connection, needs none of this.)"
    ))
}

/// Whether `e` is a lock wait that timed out (PostgreSQL `55P03`,
/// MariaDB/MySQL `1205`; SQLite's busy is its own time-out, not one).
pub(crate) fn is_lock_wait(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => class_of(&**db).lock_wait,
        _ => false,
    }
}

/// Whether `e` (anywhere in its chain of sources) is a conflict with a
/// concurrent transaction: [`is_conflict`] or [`is_lock_wait`]. A relay
/// batch takes it for its own contention (see `Relay::commit_batch`), not
/// for a failure of the message's handler.
pub(crate) fn is_contention(e: &(dyn StdError + 'static)) -> bool {
    find_sqlx(e).is_some_and(|s| is_conflict(s) || is_lock_wait(s))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{BoxError, Error};
    use std::fmt;

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

    /// A database error with this SQLSTATE (read with PostgreSQL's rules).
    pub(crate) fn db(code: &'static str, message: &'static str) -> sqlx::Error {
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
            assert_eq!(err.kind(), crate::ErrorKind::Config);
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
        assert!(is_conflict(&db("40P01", "deadlock detected")));
        assert!(!is_conflict(&db("55P03", "lock not available")));
        assert!(is_lock_wait(&db("55P03", "lock not available")));
        assert!(!is_lock_wait(&db("40P01", "deadlock detected")));
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
