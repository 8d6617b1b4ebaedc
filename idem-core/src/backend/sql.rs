//! The shape of one dialect's statements ([`SqlSet`]: each database file
//! fills one in), and the renderers every dialect shares.

use super::dialect::Dialect;
use idem_syntax::{is_identifier, numbered_placeholders};

/// The statements of a state machine spec, rendered for one dialect.
#[derive(Debug)]
pub struct StateSql {
    /// Reads the state and the key column (or NULL) under a row lock.
    pub lock: String,
    /// The guarded transition `from` → `to` (binds: to, the key when there is a key column, id, from).
    pub transition: String,
    /// Whether the transition writes the key column.
    pub with_key: bool,
    /// Where the dialect can (PostgreSQL): the fenced outbox update and
    /// the locking read in one statement, one round trip (binds: the
    /// outbox message's id, topic, lease owner and attempt, then the
    /// entity id). It returns the rows the update changed, the state and
    /// the key column (both NULL without the entity).
    pub lock_marked: Option<String>,
}

/// The claim statements of a relay, rendered once for its topics.
#[derive(Debug, Clone)]
pub struct ClaimSql {
    /// PostgreSQL: one `UPDATE … RETURNING`. SQLite: the locking
    /// `SELECT`. MariaDB: the `SELECT id …` picking the due rows (then
    /// locked by id).
    pub claim: String,
    /// See [`SqlSet::next_due`], rendered for the relay's topics.
    pub next_due: Option<String>,
}

/// Where each dialect's claim statement places the ordering guard
/// ([`order_guard`]); its scan of `idem_outbox` is aliased `q`.
pub(crate) const ORDER_GUARD: &str = "/*order*/";

/// Where each dialect's claim statement places the pause guard
/// ([`PAUSE_GUARD_SQL`]); its scan of `idem_outbox` is aliased `q`.
pub(crate) const PAUSE_GUARD: &str = "/*pause*/";

/// The claim's pause guard: no message of a topic in `idem_topic_pause`
/// is due. One probe of that table's primary key per candidate row.
pub(crate) const PAUSE_GUARD_SQL: &str =
    "AND NOT EXISTS (SELECT 1 FROM idem_topic_pause z WHERE z.topic = q.topic)";

/// The claim's ordering guard: a row with an ordering key is due only as
/// its key's head, when no other pending row of the key has a smaller id
/// or holds a running lease (and, `hold_after_dead`, no dead-lettered row
/// of the key has a smaller id). So one key has at most one message in
/// flight, and its messages are settled in id order.
pub(crate) fn order_guard(now: &str, hold_after_dead: bool) -> String {
    // Each probe reads one status of the key: the index of the key's
    // pending rows (or dead ones) by id, never its finished rows.
    let dead = match hold_after_dead {
        true => {
            " AND NOT EXISTS (SELECT 1 FROM idem_outbox d \
                 WHERE d.ordering_key = q.ordering_key AND d.status = 'failed' AND d.id < q.id)"
        }
        false => "",
    };
    format!(
        "AND (q.ordering_key IS NULL OR (NOT EXISTS (SELECT 1 FROM idem_outbox p \
         WHERE p.ordering_key = q.ordering_key AND p.status = 'pending' AND p.id <> q.id \
         AND (p.id < q.id OR p.locked_until > {now})){dead}))"
    )
}

/// A statement rendered for a number of ids or topics: given the list of
/// `?` placeholders (`?, ?, ?`), the statement written with `?`.
pub(crate) type Render = fn(&str) -> String;

/// Every statement of one dialect, and the few ways it runs them
/// differently. Statements are written with `?` placeholders unless their
/// field says otherwise; [`SqlSet::render`] numbers them for PostgreSQL.
#[derive(Debug)]
pub(crate) struct SqlSet {
    /// Which dialect this is.
    #[cfg_attr(not(test), allow(dead_code))]
    pub dialect: Dialect,
    /// The identifier quote (`"` or `` ` ``).
    pub quote: char,
    /// PostgreSQL: placeholders are `$1, $2, …`.
    pub numbered: bool,
    /// An expression cast to text.
    pub text: fn(&str) -> String,
    /// The row lock a read of rows about to change takes (`" FOR
    /// UPDATE"`, or empty where the transaction already holds the write
    /// lock).
    pub row_lock: &'static str,
    /// The statement beginning a call's transaction (`None`: `BEGIN`).
    pub begin: Option<&'static str>,
    /// Where a data-modifying `WITH` exists (PostgreSQL): the fenced
    /// outbox update ([`SqlSet::outbox_success`]) as the `WITH idem_mark
    /// AS (… RETURNING 1)` that the state machine's locking read is
    /// folded into ([`StateSql::lock_marked`]). `?` placeholders.
    pub mark_with: Option<&'static str>,
    /// Intervals are bound as whole microseconds (MariaDB's `INTERVAL ?
    /// MICROSECOND`), not as fractional seconds.
    pub micros: bool,

    /// Binds: key, biz_type. Native placeholders.
    pub fetch_record: &'static str,
    /// Binds: result, key, biz_type. Native placeholders.
    pub store_result: &'static str,
    /// What is left of a record's ttl, in whole milliseconds by the
    /// database's clock at this statement (the current time, not the
    /// transaction's start), negative once expired. Binds: key, biz_type.
    /// Native placeholders.
    pub record_ttl_left: &'static str,
    /// Binds: key, biz_type, biz_no, fingerprint, ttl seconds. Native.
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql",
            feature = "any"
        )),
        allow(dead_code)
    )]
    pub claim_record: &'static str,
    /// Inserts a pending message unless `(topic, msg_id)` exists; only the
    /// duplicate is ignored. Binds: topic, msg_id, payload, ordering key
    /// (or NULL), headers (JSON text, or NULL), delay (seconds; whole
    /// microseconds where `micros`) before it is due. Native placeholders.
    pub outbox_insert: &'static str,
    /// Serializes the enqueues of one ordering key until their
    /// transactions end (binds: the key), so that the key's messages get
    /// their ids in commit order: PostgreSQL a transaction-scoped advisory
    /// lock on the key's hash, MariaDB a row lock on the key's row in
    /// `idem_outbox_key`; `None` on SQLite, whose writers are serialized
    /// already. Native placeholders.
    pub outbox_order_lock: Option<&'static str>,
    /// The database's clock, as the claim's ordering guard reads it.
    pub now: &'static str,
    /// Where the relay listens (PostgreSQL): the seconds until the
    /// earliest pending message of the topics' list not due yet falls due
    /// (NULL: none), for the topics' list (binds: topics…).
    pub next_due: Option<Render>,
    /// The id and payload of the message `(topic, msg_id)`, read after an
    /// ignored insert. Binds: topic, msg_id. Native placeholders.
    pub outbox_find: &'static str,
    /// `outbox_insert` that also sends `pg_notify('idem_outbox', topic)`
    /// when it inserts (not for a duplicate), in the same statement, so
    /// the notification is delivered on commit only: the push wake-up of
    /// relays (see [`outbox::NOTIFY_CHANNEL`](crate::outbox::NOTIFY_CHANNEL)).
    /// `None` where the dialect has no `NOTIFY`. Same binds and result as
    /// `outbox_insert`.
    pub outbox_insert_notify: Option<&'static str>,
    /// How `outbox_insert` tells the new id (no row or no affected row:
    /// the duplicate).
    pub insert_id: InsertId,
    /// Binds: id, topic, owner, attempt. Native placeholders.
    pub outbox_success: &'static str,
    /// A relay batch's success marks, in one statement at its end, for the
    /// ids' list (binds: owner, ids…). The batch locked the rows when it
    /// renewed their leases, and checked their attempts then.
    pub outbox_success_batch: Render,
    /// Binds: id. Native placeholders.
    pub outbox_state: &'static str,
    /// Binds: status, delay, error, id, owner, attempt. Native.
    pub outbox_settle: &'static str,
    /// The same failure written over a `success` that this attempt's own
    /// handler marked before it failed (same binds; the owner matches the
    /// cleared lease or none). Native.
    pub outbox_revert: &'static str,
    /// An attempt that failed in an outage, given back: pending again
    /// after the delay, its claim's attempt taken back (`attempts - 1`),
    /// fenced as `outbox_settle`. Binds: status (always `pending`),
    /// delay, error, id, owner, attempt. Native.
    pub outbox_release: &'static str,
    /// An outage attempt taken back under a later claim that holds the
    /// message: `attempts - 1`, the lease kept. Binds: id, owner, attempt
    /// (the later claim's). Native.
    pub outbox_uncount: &'static str,
    /// One failed attempt's row in the attempt log, written with its
    /// settle (see [`ATTEMPT_LOG_MAX`](crate::outbox::ATTEMPT_LOG_MAX)), at
    /// the database's now. Binds: outbox id, attempt, outcome, detail,
    /// actor. Native placeholders.
    pub attempt_log: &'static str,
    /// The attempt log of one message cut to its newest rows: deletes
    /// those older than the one at the offset (binds: outbox id, outbox
    /// id, offset: the rows kept minus one). Native placeholders.
    pub attempt_trim: &'static str,
    /// A process's row in `idem_process` written or refreshed: inserted
    /// (`started_at` and `heartbeat_at` now), or its `heartbeat_at` set to
    /// now and its description rewritten. Binds: id, kind, name, host,
    /// pid. Native placeholders.
    pub process_beat: &'static str,
    /// A stopped process's row deleted. Binds: id. Native placeholders.
    pub process_end: &'static str,
    /// The relay's claim.
    pub claim: Claim,
    /// The rows a claim whose commit outcome is unknown leased, if it
    /// landed: `id, topic, msg_id, payload, attempts` of the rows among
    /// the ids still pending under the claim's owner with their lease
    /// running (binds: owner, ids…).
    pub claim_recover: Render,
    /// The relay's lease renewal.
    pub renew: Renew,
    /// One message's lease renewed before a delivery on the per-message
    /// path after a batch, waiting for a row lock rather than skipping it
    /// (binds: lease, id, owner). Native placeholders.
    pub renew_held: &'static str,

    /// SQLite: the columns of a named index (binds: name).
    pub index_columns: Option<&'static str>,
}

/// How an insert tells the id it gave the new row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InsertId {
    /// `INSERT … RETURNING id`.
    Returning,
    /// The driver's last insert id (MariaDB).
    LastInsertId,
}

/// How the relay claims due messages.
#[derive(Debug)]
pub(crate) enum Claim {
    /// One `UPDATE … RETURNING` (binds: owner, lease seconds, topics…,
    /// limit, offset), in a transaction opened by `begin`. It returns `id,
    /// topic, msg_id, payload, attempts` (as leased) and the row's previous
    /// `lease_owner`.
    Returning {
        /// The claim, for the topics' list.
        render: Render,
        /// The claim transaction's `BEGIN` (`None`: the dialect's), with
        /// the settings that go first in it, sent as one simple query: one
        /// round trip.
        begin: Option<&'static str>,
    },
    /// Two statements in one transaction (MariaDB: no `UPDATE …
    /// RETURNING`; SQLite: its `RETURNING` cannot tell the previous lease
    /// owner): lock the due rows (binds: topics…, limit, offset; returns `id,
    /// topic, msg_id, payload, attempts, lease_owner` before the claim),
    /// then lease them (binds: owner, lease interval, ids…).
    LockThenLease {
        /// The `SELECT … FOR UPDATE SKIP LOCKED`, for the topics' list
        /// (with `lock`: the plain `SELECT id …` picking them).
        render: Render,
        /// MariaDB: `render` picks the due ids without locking (a
        /// consistent read, binds: topics…, limit, offset; returns `id`),
        /// and this locks those still due by id (binds: ids…; returns what
        /// `render` returns otherwise) with `FOR UPDATE SKIP LOCKED`. The
        /// claim then locks its rows only: not the range it scanned, nor
        /// the rows its offset skipped, nor the leased rows it passed over
        /// (in REPEATABLE READ a locking scan keeps all of them locked),
        /// which on Galera are rows that the other nodes' write sets
        /// change (their claims, their handlers' success marks), and a
        /// local transaction holding a lock a replicated write set needs
        /// is aborted (1213).
        lock: Option<Render>,
        /// The `UPDATE`, for the ids' list.
        lease: Render,
    },
}

/// How the relay extends its leases.
#[derive(Debug)]
pub(crate) enum Renew {
    /// One statement skipping rows a handler holds (binds: lease, owner,
    /// ids…), returning the renewed rows' `id, attempts`.
    Update(Render),
    /// Lock the free rows (binds: owner, ids…), then extend those (binds:
    /// lease microseconds, ids…).
    LockThenUpdate {
        /// The `SELECT id, attempts … FOR UPDATE SKIP LOCKED`.
        lock: Render,
        /// The `UPDATE`.
        update: Render,
    },
}

impl SqlSet {
    /// `sql`, written with `?`, in the dialect's placeholders.
    pub(crate) fn render(&self, sql: &str) -> String {
        if self.numbered {
            numbered_placeholders(sql)
        } else {
            sql.to_string()
        }
    }

    /// See [`Dialect::state_sql`].
    pub(crate) fn state_sql(
        &self,
        table: &str,
        id_column: &str,
        state_column: &str,
        key_column: Option<&str>,
    ) -> StateSql {
        let q = self.quote;
        let (t, i, s) = (quote(table, q), quote(id_column, q), quote(state_column, q));
        let k = key_column.map(|k| quote(k, q));
        let key_read = (self.text)(k.as_deref().unwrap_or("NULL"));
        let lock = self.render(&format!(
            "SELECT {}, {key_read} FROM {t} WHERE {i} = ?{}",
            (self.text)(&s),
            self.row_lock
        ));
        let lock_marked = self.mark_with.map(|with| {
            self.render(&format!(
                "{with} SELECT (SELECT COUNT(*) FROM idem_mark), e.s, e.k \
                 FROM (SELECT 1) AS idem_one LEFT JOIN \
                 (SELECT {} AS s, {key_read} AS k FROM {t} WHERE {i} = ?{}) AS e ON true",
                (self.text)(&s),
                self.row_lock
            ))
        });
        let transition = self.render(&match &k {
            Some(k) => format!("UPDATE {t} SET {s} = ?, {k} = ? WHERE {i} = ? AND {s} = ?"),
            None => format!("UPDATE {t} SET {s} = ? WHERE {i} = ? AND {s} = ?"),
        });
        StateSql {
            lock,
            transition,
            with_key: k.is_some(),
            lock_marked,
        }
    }

    /// See [`Dialect::claim_sql`].
    pub(crate) fn claim_sql(&self, topics: usize, hold_after_dead: bool) -> ClaimSql {
        let list = vec!["?"; topics.max(1)].join(", ");
        let render = match self.claim {
            Claim::Returning { render, .. } | Claim::LockThenLease { render, .. } => render,
        };
        // The control `probe::Break::IgnorePause` claims paused topics too.
        let pause = match crate::probe::broken(crate::probe::Break::IgnorePause) {
            true => "",
            false => PAUSE_GUARD_SQL,
        };
        let claim = render(&list)
            .replace(ORDER_GUARD, &order_guard(self.now, hold_after_dead))
            .replace(PAUSE_GUARD, pause);
        let next_due = self.next_due.map(|render| self.render(&render(&list)));
        ClaimSql {
            claim: self.render(&claim),
            next_due,
        }
    }
}

/// `ident` quoted with `q`, each part of a qualified name on its own.
///
/// # Panics
/// If `ident` is not a plain identifier (see [`is_identifier`]).
pub(crate) fn quote(ident: &str, q: char) -> String {
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

/// `?, ?, …`: `n` unnumbered placeholders.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
#[path = "sql_tests.rs"]
mod tests;

/// The statements of HTTP requests made idempotent by an
/// `Idempotency-Key` (`idem_runtime::http`, feature `axum`): rows of
/// `idem_record` whose `result` holds an in-flight lease (`{"lease": …}`)
/// or the stored answer, and whose `expire_time` is the lease's end while
/// in flight and the key's expiry once answered. Every statement names its
/// row by `(idempotency_key, biz_type)`; the ones that change it are
/// fenced by the lease (`result = ?`). Bind order is given per statement.
#[derive(Debug)]
pub(crate) struct RequestSql {
    /// `key, biz_type` → `fingerprint, result, expired (0/1)`: a plain,
    /// non-locking read (it never waits for the request in flight).
    pub find: &'static str,
    /// `key, biz_type, biz_no, fingerprint, lease, lease_secs`: the
    /// in-flight row, unless the pair exists (0 rows, never an error). Also
    /// the completion of a key claimed in the handler's transaction
    /// ([`claim_in`](Self::claim_in)): `answer, ttl_secs` in place of
    /// `lease, lease_secs`.
    pub insert: &'static str,
    /// `key, biz_type, biz_no, fingerprint, lease, lease_secs` →
    /// `claimed (0/1), fingerprint, result, expired (0/1)`: [`insert`]
    /// and, where it inserted nothing, [`find`] in one statement, its
    /// commit asynchronous (see `postgres::REQUESTS`). `None`: the two
    /// statements in turn.
    ///
    /// [`insert`]: Self::insert
    /// [`find`]: Self::find
    pub claim: Option<&'static str>,
    /// `key, biz_type` → `claimed (0/1), busy (0/1), fingerprint, result,
    /// expired (0/1)`: the claim in the handler's transaction (see
    /// `postgres::REQUESTS`): the row found, or where there is none, the
    /// key's transaction lock tried (`busy`: another transaction holds it;
    /// `claimed`: this one does). It writes no row: the completion inserts
    /// the answered row ([`insert`](Self::insert), the answer in place of
    /// the lease). `None`: the claim commits on its own, before the
    /// handler's transaction.
    pub claim_in: Option<&'static str>,
    /// `lease, lease_secs, key, biz_type, old_lease`: takes over an
    /// in-flight row whose lease ran out, in a transaction of its own after
    /// [`lock`](Self::lock).
    pub take_over: &'static str,
    /// `key, biz_type` → `id`: before the take-over, in its transaction, the
    /// row locked, or no row when another transaction holds it (`FOR UPDATE
    /// SKIP LOCKED`: a request whose handler is still running, only slower
    /// than its lease), never a wait on that lock. `None` where there are no
    /// row locks (SQLite: a writer waits for the database's write lock).
    pub lock: Option<&'static str>,
    /// `lease_secs, key, biz_type, lease`: in the handler's transaction,
    /// the row still held by this lease, locked until the commit.
    pub fence: &'static str,
    /// `answer, ttl_secs, key, biz_type, lease`: the stored answer, in the
    /// handler's transaction.
    pub complete: &'static str,
    /// `lease_secs, id, lease` and `answer, ttl_secs, id, lease`: the fence
    /// and the answer by the row's primary key, where a locking statement
    /// by the unique key would lock the gap before the row too (InnoDB's
    /// next-key lock, taken by an `UPDATE` or `SELECT … FOR UPDATE` on
    /// `uk_idem_record_key_type` alike): held for the whole handler, that
    /// lock made every new key whose record sorts just before this one
    /// wait for the handler to commit. The id comes from the claim (the
    /// insert's `LAST_INSERT_ID`, the take-over's lock). `None`: by key.
    pub by_id: Option<(&'static str, &'static str)>,
    /// `key, biz_type, lease`: the in-flight row of a request that ended
    /// without an answer to keep.
    pub release: &'static str,
}
