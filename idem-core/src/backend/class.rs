//! What a database error means for idem: the answer each database's
//! classification of its own driver's errors gives (see `classify`).

/// What an error the server answered means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Class {
    /// A retry of the whole transaction can succeed.
    pub(crate) transient: bool,
    /// The transaction was rolled back so that a concurrent one could go
    /// on (a deadlock, a serialization or certification failure): an
    /// immediate retry is right.
    pub(crate) conflict: bool,
    /// A lock wait that timed out (or a `NOWAIT` lock not granted):
    /// nothing of the transaction committed.
    pub(crate) lock_wait: bool,
    /// The session itself ended: an answer to `COMMIT` with it says
    /// nothing about whether the commit happened.
    pub(crate) session_lost: bool,
    /// Caused by a connection pooler in transaction mode (PostgreSQL only;
    /// see [`pooler`](crate::pooler)).
    pub(crate) pooler: Option<PoolerFault>,
}

/// How a connection pooler in transaction mode shows (see `pooler_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolerFault {
    /// Named prepared statements of several clients meet on one server
    /// connection, or one statement's two round trips land on two.
    Statements,
    /// pgbouncer refuses a startup parameter sqlx sends.
    StartupParameter,
}
