//! The supported databases, and the few statements idem runs on each.
//!
//! One room per concept:
//!
//! - [`sql`]: the shape of a dialect's statements ([`SqlSet`](sql::SqlSet))
//!   and the renderers shared by every dialect (quoting, placeholders,
//!   the state machine's and the relay's statements);
//! - `postgres.rs`, `mysql.rs`, `sqlite.rs`: each database's statements,
//!   schema and upgrade steps, and error-code classification — adding a
//!   database never edits another's file; `any.rs`: `sqlx::Any`, which
//!   picks one of them at run time;
//! - `store.rs`: the code that runs those statements, written once for
//!   every backend, behind one small trait per concept ([`CallStore`],
//!   [`OutboxStore`], [`RequestStore`], [`Migrate`]); archiving and the
//!   operator's queries have their own in `idem-ops`, on the public API.
//!
//! Every statement that touches user tables is built from identifiers that
//! the macro validated at compile time (and that are checked again here),
//! quoted for the dialect; every value is a bind parameter.

use crate::lease::OutboxLease;
use crate::state::EntityIdValue;
use sqlx::{Database, Pool, Transaction};
use std::future::Future;

#[cfg(feature = "any")]
mod any;
mod class;
pub(crate) mod classify;
pub(crate) mod dialect;
mod drivers;
// Always compiled: the statements are plain data (`sqlx::Any` may need
// any of them), and the error codes classify errors of any driver; only
// each `impl Backend` needs its driver's feature.
mod migrate;
pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod sql;
pub(crate) mod sqlite;
mod store;
pub(crate) mod types;

pub use dialect::Dialect;
// The stores are the supertraits of the public, sealed `Backend`, so they
// are `pub` where they are defined, and reachable from nowhere outside the
// crate: their methods and argument types are not API.
pub(crate) use migrate::Migrate;
pub(crate) use sql::{ClaimSql, StateSql};
pub(crate) use types::{
    ClaimError, Claimed, NewMessage, OutboxInsert, OutboxState, ProcessRow, StoredRecord,
};
pub use types::{ClaimedRow, NewRecord, OutboxRow};

pub(crate) mod sealed {
    /// Implemented by the four backends only; also holds the one thing
    /// their drivers expose differently.
    use super::dialect::Dialect;
    use sqlx::{Pool, Transaction};

    /// Implemented by the four backends only: what their drivers do
    /// differently. The stores' code (`store/`) is written over this
    /// trait, not over `Backend`, which is their union. (Every one of
    /// them can choose, per statement, between a named prepared statement
    /// and the unnamed one: `HasStatementCache`, see
    /// [`pooler`](crate::pooler).)
    pub trait Sealed: sqlx::Database + sqlx::database::HasStatementCache {
        /// The dialect of a transaction.
        fn dialect_of_tx(tx: &Transaction<'_, Self>) -> Dialect;
        /// The dialect of a pool.
        fn dialect_of_pool(pool: &Pool<Self>) -> Dialect;
        /// The dialect of a connection.
        fn dialect_of_conn(conn: &Self::Connection) -> Dialect;

        /// The rows a statement changed.
        fn rows_affected(done: &Self::QueryResult) -> u64;

        /// The id the driver reports for the row an `INSERT` created
        /// (only asked where the dialect has no `RETURNING`).
        fn last_insert_id(_done: &Self::QueryResult) -> Result<i64, sqlx::Error> {
            Err(sqlx::Error::Protocol("no insert id returned".into()))
        }
    }
}

/// A database idem runs on: PostgreSQL, MariaDB/MySQL or SQLite (or
/// `sqlx::Any`, one of them chosen at run time).
///
/// Sealed; enabled by the cargo features `postgres`, `mysql`, `sqlite` and
/// `any`. Name it to write handlers or services generic over the database
/// (`DB: Backend`); its own methods say which [`Dialect`] a pool speaks and
/// begin a call's transaction the cancellation-safe way.
///
/// Inside the crate it is the union of the stores, one sealed trait per
/// concept (`CallStore`, `OutboxStore`, `RequestStore`, `Migrate`), whose code is written once in `store/`;
/// they are not reachable from outside. `claim_record` is here rather than
/// in `CallStore` because callers name it `<DB as Backend>::claim_record`
/// (a qualified path does not look into supertraits); its code too is the
/// shared one.
pub trait Backend:
    Database + sealed::Sealed + CallStore + OutboxStore + Migrate + RequestStore
{
    /// A short name, for traces.
    const NAME: &'static str;

    /// The SQL dialect the transaction speaks.
    fn dialect(tx: &Transaction<'_, Self>) -> Dialect {
        <Self as sealed::Sealed>::dialect_of_tx(tx)
    }

    /// The SQL dialect of a pool.
    fn pool_dialect(pool: &Pool<Self>) -> Dialect {
        <Self as sealed::Sealed>::dialect_of_pool(pool)
    }

    /// The SQL dialect of a connection.
    fn conn_dialect(conn: &Self::Connection) -> Dialect {
        <Self as sealed::Sealed>::dialect_of_conn(conn)
    }

    /// The rows a statement changed (each driver's `rows_affected`, which
    /// sqlx offers on its own result types only).
    fn rows_changed(done: &Self::QueryResult) -> u64 {
        <Self as sealed::Sealed>::rows_affected(done)
    }

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
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        store::begin(pool)
    }

    /// Inserts a record unless `(biz_type, key)` exists, waiting on the
    /// unique index for a concurrent insert of the same pair. True if
    /// inserted. Only the duplicate is ignored: any other failure (an
    /// expiry out of range, `expire_time` not after `create_time`) is an
    /// error.
    #[doc(hidden)]
    fn claim_record<'a>(
        tx: &'a mut Transaction<'_, Self>,
        rec: &'a NewRecord<'a>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;
}

/// What the state machine's locking read found: the state and the key
/// column's value (`None` without a key column).
pub(crate) type LockedState = (String, Option<String>);

/// The statements of the `#[idempotent]` strategies, inside the call's
/// transaction.
pub trait CallStore: Database {
    /// Runs the state machine's row-locking read: the state, and the key
    /// column's value (`None` without a key column).
    fn lock_state<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'a StateSql,
        id: &'a EntityIdValue,
    ) -> impl Future<Output = Result<Option<(String, Option<String>)>, sqlx::Error>> + Send + 'a;

    /// Runs [`StateSql::lock_marked`] (the dialect has it): the fenced
    /// outbox update of `lease` and the state machine's locking read in
    /// one statement. Returns the outbox rows updated (1: held) and what
    /// [`CallStore::lock_state`] returns.
    fn mark_lock_state<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'a StateSql,
        lease: &'a OutboxLease,
        id: &'a EntityIdValue,
    ) -> impl Future<Output = Result<(i64, Option<LockedState>), sqlx::Error>> + Send + 'a;

    /// Runs the guarded transition (writing `key` into the key column when
    /// the spec has one); returns the rows it changed.
    fn transition<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'a StateSql,
        id: &'a EntityIdValue,
        from: &'static str,
        to: &'static str,
        key: Option<&'a str>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Reads the record of `(biz_type, key)` (the latest committed version).
    fn fetch_record<'a>(
        tx: &'a mut Transaction<'_, Self>,
        biz_type: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<StoredRecord>, sqlx::Error>> + Send + 'a;

    /// What is left of the ttl of the record of `(biz_type, key)`, in
    /// milliseconds by the database's clock now (negative once expired);
    /// `None` without a record. Bounds the front cache's marker.
    fn record_ttl_left<'a>(
        tx: &'a mut Transaction<'_, Self>,
        biz_type: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a;

    /// Stores the serialized result in the record of `(biz_type, key)`.
    fn store_result<'a>(
        tx: &'a mut Transaction<'_, Self>,
        biz_type: &'a str,
        key: &'a str,
        result: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// SQLite: the columns (`table.column`) of the index named `name`, in
    /// order; empty when there is no such index, and on other databases.
    fn sqlite_index_columns<'a>(
        tx: &'a mut Transaction<'_, Self>,
        name: &'a str,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + 'a;

    /// Runs a fixed statement (savepoints).
    fn exec<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'static str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;
}

/// The statements of HTTP requests made idempotent by an `Idempotency-Key`
/// (`idem_runtime::http`, feature `axum`, through [`crate::requests`]). The
/// row is `idem_record`'s `(key, biz_type)`; the in-flight lease `lease` is
/// the `result` column's text while the request runs.
pub trait RequestStore: Database {
    /// The row: its fingerprint, its `result` (the lease or the stored
    /// answer) and whether `expire_time` has passed. Never waits on locks.
    fn request_find<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: &'a str,
    ) -> impl Future<Output = Result<Option<(String, Option<String>, bool)>, sqlx::Error>> + Send + 'a;

    /// Inserts the in-flight row unless the pair exists; `Some` if inserted.
    fn request_insert<'a>(
        pool: &'a Pool<Self>,
        row: &'a NewRecord<'a>,
        lease: &'a str,
    ) -> impl Future<Output = Result<Option<ClaimedRow>, sqlx::Error>> + Send + 'a;

    /// [`request_insert`](Self::request_insert), and where it inserted
    /// nothing, [`request_find`](Self::request_find): `Ok(row)` if
    /// inserted, else `Err` of the row found (`None`: neither, a
    /// concurrent insert of the pair committed in between).
    #[allow(clippy::type_complexity)]
    fn request_claim<'a>(
        pool: &'a Pool<Self>,
        row: &'a NewRecord<'a>,
        lease: &'a str,
    ) -> impl Future<
        Output = Result<Result<ClaimedRow, Option<(String, Option<String>, bool)>>, sqlx::Error>,
    > + Send
    + 'a;

    /// The claim in the handler's transaction `tx`, where the dialect has
    /// one (`None` where it has not: [`request_claim`](Self::request_claim)
    /// before the transaction). `Ok(row)` if the key is this call's (no
    /// row, the key's transaction lock held; the row is
    /// [`unwritten`](ClaimedRow::unwritten) until the completion); else
    /// `Err` of `(busy, row found)`: `busy` when there is no row and
    /// another transaction holds the key's lock, neither busy nor a row
    /// when a concurrent request committed the key in between.
    #[allow(clippy::type_complexity)]
    fn request_claim_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        row: &'a NewRecord<'a>,
    ) -> impl Future<
        Output = Result<
            Option<Result<ClaimedRow, (bool, Option<(String, Option<String>, bool)>)>>,
            sqlx::Error,
        >,
    > + Send
    + 'a;

    /// Replaces the expired lease `old` by `lease` in `tx`; `Some` if it
    /// did. Never waits on a row lock (where there are row locks): `None`
    /// when another transaction holds the row. The row stays locked until
    /// `tx` ends, as after [`request_fence`](Self::request_fence).
    fn request_take_over_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        key: &'a str,
        biz_type: &'a str,
        old: &'a str,
        lease: &'a str,
        lease_secs: i64,
    ) -> impl Future<Output = Result<Option<ClaimedRow>, sqlx::Error>> + Send + 'a;

    /// In the handler's transaction: the row, still held by `lease`,
    /// locked until the commit; true if it is.
    fn request_fence<'a>(
        tx: &'a mut Transaction<'_, Self>,
        row: ClaimedRow,
        key: &'a str,
        biz_type: &'a str,
        lease: &'a str,
        lease_secs: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// In the handler's transaction: the stored answer in place of the
    /// lease, expiring in `ttl_secs`; true if the lease still held. A row
    /// claimed [`unwritten`](ClaimedRow::unwritten) is inserted answered
    /// (`record`'s fields, its `ttl_secs` ignored); true if the key had no
    /// row.
    fn request_complete<'a>(
        tx: &'a mut Transaction<'_, Self>,
        row: ClaimedRow,
        record: &'a NewRecord<'a>,
        lease: &'a str,
        answer: &'a str,
        ttl_secs: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Deletes the in-flight row held by `lease` (a request that ended
    /// without an answer to keep); true if it did.
    fn request_release<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: &'a str,
        lease: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;
}

/// The outbox's statements: enqueue, claim, renew, settle.
pub trait OutboxStore: Database {
    /// Inserts a pending outbox message unless `(topic, msg_id)` exists
    /// (never a unique-violation error, which would abort a PostgreSQL
    /// transaction); then reads the existing one. `notify`: in the same
    /// statement, notify a new message where the dialect can.
    ///
    /// A message with an ordering key first takes the key's enqueue lock
    /// (see `SqlSet::outbox_order_lock`) until the transaction ends.
    fn outbox_insert<'a>(
        conn: &'a mut Self::Connection,
        message: &'a NewMessage<'a>,
        notify: bool,
    ) -> impl Future<Output = Result<OutboxInsert, sqlx::Error>> + Send + 'a;

    /// Marks the outbox message `lease` holds as delivered, fenced by the
    /// lease (pending, same topic, same owner and attempt); returns rows
    /// changed (1, or 0 when the lease does not hold).
    fn outbox_success<'a>(
        tx: &'a mut Transaction<'_, Self>,
        lease: &'a OutboxLease,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Marks a message `success` outside a handler transaction (the relay's
    /// fallback when a handler was not given its outbox source), fenced by
    /// its lease like [`OutboxStore::outbox_success`].
    fn outbox_success_pool<'a>(
        pool: &'a Pool<Self>,
        lease: &'a OutboxLease,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// The status and lease of outbox message `id`, if it exists.
    fn outbox_state<'a>(
        tx: &'a mut Transaction<'_, Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<OutboxState>, sqlx::Error>> + Send + 'a;

    /// The status and lease of outbox message `id`, read on `pool`.
    fn outbox_state_pool<'a>(
        pool: &'a Pool<Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<OutboxState>, sqlx::Error>> + Send + 'a;

    /// Seconds until the earliest pending message of `topics` is due
    /// (negative: due already; `None`: none pending), by `next_due` (see
    /// `ClaimSql::next_due`).
    fn next_due<'a>(
        pool: &'a Pool<Self>,
        next_due: &'a str,
        topics: &'a [String],
    ) -> impl Future<Output = Result<Option<f64>, sqlx::Error>> + Send + 'a;

    /// Claims up to `limit` due pending messages of `topics` under a lease
    /// of `lease_secs` for `owner` (attempts + 1 each), oldest first after
    /// skipping `offset` of them (the relay's claim spread). Concurrent
    /// claimers never get the same message while its lease runs.
    #[allow(clippy::too_many_arguments)]
    fn claim_outbox<'a>(
        pool: &'a Pool<Self>,
        claim: &'a ClaimSql,
        owner: &'a str,
        topics: &'a [String],
        limit: i64,
        offset: i64,
        lease_secs: f64,
    ) -> impl Future<Output = Result<Claimed, ClaimError>> + Send + 'a;

    /// The rows among `ids` that a claim by `owner` leased, if its commit
    /// landed: still pending, still held by `owner`, lease not expired.
    /// After a claim whose commit outcome is unknown ([`ClaimError::CommitUnknown`]);
    /// with an owner unique to that claim, exactly the rows it leased.
    fn recover_claim<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        ids: &'a [i64],
    ) -> impl Future<Output = Result<Vec<OutboxRow>, sqlx::Error>> + Send + 'a;

    /// Extends the leases of `owner`'s in-flight messages `ids` (still
    /// pending, not locked by a running handler transaction) by
    /// `lease_secs` from now; returns how many were extended.
    fn renew_leases<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        ids: &'a [i64],
        lease_secs: f64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Extends the lease of message `id` if `owner` still holds it,
    /// waiting for a transaction that locks its row (a batch rolling back,
    /// a claim) rather than skipping it; true if extended.
    fn renew_held<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        id: i64,
        lease_secs: f64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Like [`OutboxStore::renew_leases`], inside `tx` (a relay's batch
    /// transaction): the renewed rows stay locked by `tx` until it ends.
    /// Returns the renewed rows' `(id, attempts)`.
    fn renew_leases_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        owner: &'a str,
        ids: &'a [i64],
        lease_secs: f64,
    ) -> impl Future<Output = Result<Vec<(i64, i32)>, sqlx::Error>> + Send + 'a;

    /// Marks the messages `ids` of a relay batch `success`, in the batch's
    /// transaction `tx`, which locked them (with
    /// [`OutboxStore::renew_leases_in`]) and checked their attempts;
    /// fenced by `owner` all the same. Returns how many were marked.
    fn outbox_success_batch<'a>(
        tx: &'a mut Transaction<'_, Self>,
        owner: &'a str,
        ids: &'a [i64],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Records a failed attempt: back to `pending` after `delay_secs`, or
    /// `failed` when `dead`. Only while the message is still pending and
    /// leased by `owner` as attempt `attempt`: it never overwrites a
    /// success, nor lands on a message another claim took over. True if
    /// applied; then, in the same transaction, the attempt is logged in
    /// `idem_outbox_attempt` (outcome `retry` or `dead`, `error` as the
    /// detail, `owner` as the actor), the message's log cut to its
    /// [`ATTEMPT_LOG_MAX`](crate::outbox::ATTEMPT_LOG_MAX) newest rows.
    ///
    /// With `over_success`, the failure is written over a `success` of
    /// this attempt (`attempt`) instead: its handler's call marked the
    /// message, then the handler failed (or misused its delivery), so the
    /// message must run again rather than end a success with an effect
    /// missing.
    #[allow(clippy::too_many_arguments)]
    fn outbox_settle_failure<'a>(
        pool: &'a Pool<Self>,
        over_success: bool,
        id: i64,
        owner: &'a str,
        attempt: i32,
        dead: bool,
        delay_secs: f64,
        error: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Gives back the attempt of message `id` that `owner` claimed as
    /// attempt `attempt` and that failed in an outage
    /// ([`Error::is_outage`](crate::Error::is_outage)): pending again
    /// after `delay_secs`, `attempts` back to `attempt - 1`, the lease
    /// cleared, fenced as
    /// [`outbox_settle_failure`](OutboxStore::outbox_settle_failure).
    /// Not logged in `idem_outbox_attempt`: the attempt is taken back,
    /// not counted (its number is used again by the next claim), and an
    /// outage must not push a message's real failures out of its log.
    fn outbox_release<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        owner: &'a str,
        attempt: i32,
        delay_secs: f64,
        error: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Takes back one attempt of message `id` that `owner` holds as
    /// attempt `attempt`, leaving it held: `attempts` back to `attempt - 1`
    /// (`true`), fenced by the owner and the attempt (`false`: no longer
    /// held so). A claim that took a message over from an outage attempt
    /// whose [`outbox_release`](OutboxStore::outbox_release) could not be
    /// written yet counts only its own attempt so.
    fn outbox_uncount<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        owner: &'a str,
        attempt: i32,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// [`outbox_settle_failure`](OutboxStore::outbox_settle_failure) in
    /// `tx`, which holds the message's row: over the `success` mark of
    /// this transaction's own call (`over_success`), or over a pending row
    /// this transaction locked (a relay batch).
    #[allow(clippy::too_many_arguments)]
    fn outbox_settle_failure_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        over_success: bool,
        id: i64,
        owner: &'a str,
        attempt: i32,
        dead: bool,
        delay_secs: f64,
        error: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Writes a process's row in `idem_process`, or refreshes its
    /// `heartbeat_at` (see [`crate::process`]).
    fn process_beat<'a>(
        pool: &'a Pool<Self>,
        row: &'a ProcessRow<'a>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Deletes a process's row; true if there was one.
    fn process_end<'a>(
        pool: &'a Pool<Self>,
        id: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;
}

impl Dialect {
    /// The dialect's statements: data, one table per database, read by
    /// the code of `store.rs`.
    pub(crate) fn sql(self) -> &'static sql::SqlSet {
        match self {
            Dialect::Postgres => &postgres::SQL,
            Dialect::MySql => &mysql::SQL,
            Dialect::Sqlite => &sqlite::SQL,
        }
    }

    /// The dialect's statements of `Idempotency-Key` requests.
    pub(crate) fn requests(self) -> &'static sql::RequestSql {
        match self {
            Dialect::Postgres => &postgres::REQUESTS,
            Dialect::MySql => &mysql::REQUESTS,
            Dialect::Sqlite => &sqlite::REQUESTS,
        }
    }

    /// Renders the state machine's statements; `key_column`, when given,
    /// is read under the lock and written by the transition.
    ///
    /// # Panics
    /// If a name is not a plain identifier (see [`is_identifier`](idem_syntax::is_identifier)); the
    /// generated code checks them before calling this.
    pub fn state_sql(
        self,
        table: &str,
        id_column: &str,
        state_column: &str,
        key_column: Option<&str>,
    ) -> StateSql {
        self.sql()
            .state_sql(table, id_column, state_column, key_column)
    }

    /// Renders the claim statement for `topics` topics; `hold_after_dead`:
    /// a dead-lettered message holds back the rest of its ordering key.
    pub fn claim_sql(self, topics: usize, hold_after_dead: bool) -> ClaimSql {
        self.sql().claim_sql(topics, hold_after_dead)
    }

    /// The claim statement without its ordering guard: the control
    /// `probe::Break::Unordered`.
    #[cfg_attr(not(idem_broken), allow(dead_code))]
    pub(crate) fn unordered_claim_sql(self, topics: usize) -> String {
        let sql = self.sql();
        let claim = sql.claim_sql(topics, false).claim;
        claim.replace(
            &sql.render(&crate::backend::sql::order_guard(sql.now, false)),
            "",
        )
    }
}
