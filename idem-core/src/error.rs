//! The one error type of idem, and whether a retry can help.

use crate::backend::classify::{find_sqlx, is_outage, is_transient, pooler_error};
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
    /// wait time-out, or a busy SQLite database (see [`is_transient`](crate::is_transient) for
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
    /// A message broker (RabbitMQ, NATS, …) failed: a connection, a
    /// publish the broker did not confirm, a declaration it refused.
    /// Nothing of the handler's ran or it was rolled back. Retryable when
    /// the failure is the connection's or the broker's and a retry may
    /// find it back (see [`Error::broker`]).
    Broker {
        /// Which broker: `"amqp"`, `"nats"`, …
        broker: &'static str,
        /// What failed.
        source: BoxError,
        /// Whether a retry can help.
        retryable: bool,
    },
    /// The configuration is unsafe or invalid, for example a record ttl
    /// shorter than the longest window in which a duplicate can still
    /// arrive (see `RetentionPolicy` (`idem_runtime::archive`)),
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
            Error::Handler { retryable, .. } | Error::Broker { retryable, .. } => *retryable,
        }
    }

    /// A broker's failure (for entry-point crates): `broker` names it
    /// (`"amqp"`, `"nats"`, `"kafka"`), `retryable` says whether a retry
    /// may heal it (a lost connection) or not (access refused, a message
    /// too large).
    pub fn broker(broker: &'static str, source: impl Into<BoxError>, retryable: bool) -> Self {
        Error::Broker {
            broker,
            source: source.into(),
            retryable,
        }
    }

    /// A broker that cannot be reached (for entry-point crates): its
    /// connection or channel is gone, or connecting to it failed.
    /// Retryable, and an [outage](Error::is_outage): the outbox relay does
    /// not count the attempt against `max_attempts`.
    ///
    /// ```
    /// let e = idem_runtime::Error::broker_unavailable("amqp", "connection refused");
    /// assert!(e.is_retryable() && e.is_outage());
    /// assert!(!idem_runtime::Error::broker("amqp", "nack", true).is_outage());
    /// ```
    pub fn broker_unavailable(broker: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Broker {
            broker,
            source: Box::new(Unavailable(source.into())),
            retryable: true,
        }
    }

    /// Whether this error says that the infrastructure was down rather
    /// than that the attempt failed: the outbox relay puts the message back
    /// to pending without counting the attempt (a short, bounded delay,
    /// its `attempts` restored), so an outage of any length dead-letters
    /// nothing.
    ///
    /// An outage is, exactly:
    /// - an [`Error::Broker`] made by [`Error::broker_unavailable`]: the
    ///   entry point found its broker connection or channel gone, or could
    ///   not connect (the AMQP and NATS publishers and consumers use it for
    ///   every connection-level error, and only for those);
    /// - an [`Error::Database`], or an [`Error::Handler`] whose source
    ///   chain holds a [`sqlx::Error`], that is connection-level: `Io`,
    ///   `Tls`, `PoolTimedOut`, `WorkerCrashed`, or a server error that
    ///   ends the session (PostgreSQL `57P01`–`57P05`, class `08` except a
    ///   pooler's `08P01`; MariaDB/MySQL `1053`, `1927`, `1158`–`1161`,
    ///   MySQL 8's `4031`).
    ///
    /// Everything else counts as an attempt: a broker's refusal (a nack,
    /// an unroutable message, access refused), a deadlock or lock wait, a
    /// read-only standby (`25006`), [`Error::CommitUnknown`] (a lost
    /// commit acknowledgement, the case the relay reads back), any
    /// handler error without a connection-level cause.
    pub fn is_outage(&self) -> bool {
        match self {
            Error::Broker { source, .. } => source.downcast_ref::<Unavailable>().is_some(),
            Error::Database(e) => is_outage(e),
            Error::Handler { source, .. } => find_sqlx(&**source).is_some_and(is_outage),
            _ => false,
        }
    }

    /// A configuration error: `reason` says what is wrong, with the
    /// numbers.
    pub fn config(reason: impl Into<String>) -> Self {
        Error::Config {
            reason: reason.into(),
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

    /// Which variant this is, as a value to match or compare without its
    /// fields; [`ErrorKind::as_str`] is its stable name for logs and
    /// metrics.
    ///
    /// ```
    /// use idem_runtime::{Error, ErrorKind};
    /// let e = Error::retryable("downstream timed out");
    /// assert_eq!(e.kind(), ErrorKind::Handler);
    /// assert_eq!(e.kind().as_str(), "handler");
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidKey { .. } => ErrorKind::InvalidKey,
            Error::IllegalState { .. } => ErrorKind::IllegalState,
            Error::KeyConflict { .. } => ErrorKind::KeyConflict,
            Error::LeaseLost { .. } => ErrorKind::LeaseLost,
            Error::OutboxMessage { .. } => ErrorKind::OutboxMessage,
            Error::InvalidMessage { .. } => ErrorKind::InvalidMessage,
            Error::MessageConflict { .. } => ErrorKind::MessageConflict,
            Error::Database(_) => ErrorKind::Database,
            Error::CommitUnknown(_) => ErrorKind::CommitUnknown,
            Error::Handler { .. } => ErrorKind::Handler,
            Error::TransactionLost { .. } => ErrorKind::TransactionLost,
            Error::Serialization(_) => ErrorKind::Serialization,
            Error::Broker { .. } => ErrorKind::Broker,
            Error::Config { .. } => ErrorKind::Config,
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
            Error::Database(_) => f.write_str("database error"),
            Error::CommitUnknown(_) => {
                f.write_str("commit outcome unknown (the connection failed during COMMIT)")
            }
            Error::Handler { .. } => f.write_str("handler failed"),
            Error::Broker { broker, .. } => write!(f, "{broker} broker failed"),
            Error::TransactionLost { reason } => write!(
                f,
                "the caller's transaction was rolled back ({reason}); begin a new one and retry"
            ),
            Error::Serialization(_) => f.write_str("stored result could not be (de)serialized"),
            Error::Config { reason } => write!(f, "unsafe configuration: {reason}"),
        }?;
        // `{:#}`: the causes too, as `message: cause: its cause`.
        if f.alternate() {
            let mut cause = self.source();
            while let Some(c) = cause {
                write!(f, ": {c}")?;
                cause = c.source();
            }
        }
        Ok(())
    }
}

/// What kind of [`Error`] (see [`Error::kind`]): one per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidKey`].
    InvalidKey,
    /// [`Error::IllegalState`].
    IllegalState,
    /// [`Error::KeyConflict`].
    KeyConflict,
    /// [`Error::LeaseLost`].
    LeaseLost,
    /// [`Error::OutboxMessage`].
    OutboxMessage,
    /// [`Error::InvalidMessage`].
    InvalidMessage,
    /// [`Error::MessageConflict`].
    MessageConflict,
    /// [`Error::Database`].
    Database,
    /// [`Error::CommitUnknown`].
    CommitUnknown,
    /// [`Error::Handler`].
    Handler,
    /// [`Error::TransactionLost`].
    TransactionLost,
    /// [`Error::Serialization`].
    Serialization,
    /// [`Error::Broker`].
    Broker,
    /// [`Error::Config`].
    Config,
}

impl ErrorKind {
    /// The kind's stable name (`invalid_key`, `handler`, …), the `kind`
    /// label of `idem_errors_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidKey => "invalid_key",
            ErrorKind::IllegalState => "illegal_state",
            ErrorKind::KeyConflict => "key_conflict",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::OutboxMessage => "outbox_message",
            ErrorKind::InvalidMessage => "invalid_message",
            ErrorKind::MessageConflict => "message_conflict",
            ErrorKind::Database => "database",
            ErrorKind::CommitUnknown => "commit_unknown",
            ErrorKind::Handler => "handler",
            ErrorKind::TransactionLost => "transaction_lost",
            ErrorKind::Serialization => "serialization",
            ErrorKind::Broker => "broker",
            ErrorKind::Config => "config",
        }
    }
}

/// The source of [`Error::broker_unavailable`]: the broker's own error,
/// marked as an outage.
#[derive(Debug)]
struct Unavailable(BoxError);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unavailable: {}", self.0)
    }
}

impl StdError for Unavailable {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Database(e) | Error::CommitUnknown(e) => Some(e),
            Error::Handler { source, .. } | Error::Broker { source, .. } => Some(&**source),
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
