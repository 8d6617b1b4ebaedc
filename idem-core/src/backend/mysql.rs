//! MariaDB and MySQL: their statements, schema and upgrade steps, and
//! which of their error numbers a retry can heal.

#[cfg(feature = "mysql")]
use super::class::Class;
use super::dialect::Dialect;
use super::sql::{Claim, InsertId, Renew, RequestSql, SqlSet};

/// The MariaDB / MySQL statements.
pub(crate) const SQL: SqlSet = SqlSet {
    dialect: Dialect::MySql,
    quote: '`',
    numbered: false,
    text: |e| format!("CAST({e} AS CHAR)"),
    row_lock: " FOR UPDATE",
    begin: None,
    mark_with: None,
    micros: true,
    fetch_record: "SELECT fingerprint, result FROM idem_record \
        WHERE idempotency_key = ? AND biz_type = ? LOCK IN SHARE MODE",
    store_result: "UPDATE idem_record SET result = ? WHERE idempotency_key = ? AND biz_type = ?",
    // The latest committed version, as `fetch_record` reads it.
    record_ttl_left: "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expire_time) DIV 1000 AS SIGNED) \
        FROM idem_record WHERE idempotency_key = ? AND biz_type = ? LOCK IN SHARE MODE",
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
    // INSERT IGNORE: the duplicate is a warning (0 rows), not an error.
    // IGNORE would also turn a too-long value into a silently truncated
    // one (which could then collide with another message): `enqueue`
    // checks every length against the columns first (topic and msg_id at
    // most 128 bytes, VARCHAR(128) holds 128 characters; the payload at
    // most MEDIUMTEXT's 16 MiB - 1 bytes). Nothing else it could hide
    // applies: no value is NULL, the times are the server's own, every
    // string is UTF-8 into utf8mb4 columns, and CHECK violations stay
    // errors on MariaDB. If a row is still not found afterwards, `enqueue`
    // says so rather than answering "already enqueued".
    outbox_insert: "INSERT IGNORE INTO idem_outbox \
        (topic, msg_id, payload, ordering_key, headers, next_attempt_at, created_at, updated_at) \
        VALUES (?, ?, ?, ?, ?, DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), \
        UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    // The key's row, inserted or updated: either way locked exclusively
    // until the transaction ends (a plain `INSERT IGNORE` would take only
    // a shared lock on an existing row, and two such enqueuers would
    // deadlock on their inserts).
    outbox_order_lock: Some(
        "INSERT INTO idem_outbox_key (ordering_key) VALUES (?) \
         ON DUPLICATE KEY UPDATE ordering_key = VALUES(ordering_key)",
    ),
    now: "UTC_TIMESTAMP(6)",
    next_due: None,
    // A locking read: it sees the latest committed row, which a plain
    // read under repeatable read may not (its snapshot can predate the
    // other producer's commit that made the insert a duplicate).
    outbox_find: "SELECT id, payload FROM idem_outbox WHERE topic = ? AND msg_id = ? \
        LOCK IN SHARE MODE",
    outbox_insert_notify: None,
    outbox_success: "UPDATE idem_outbox SET status = 'success', \
        updated_at = UTC_TIMESTAMP(6), lease_owner = NULL, locked_until = NULL \
        WHERE id = ? AND topic = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_success_batch: |ids| {
        format!(
            "UPDATE idem_outbox SET status = 'success', \
             updated_at = UTC_TIMESTAMP(6), lease_owner = NULL, locked_until = NULL \
             WHERE lease_owner = ? AND status = 'pending' AND id IN ({ids})"
        )
    },
    outbox_state: "SELECT topic, status, lease_owner, attempts FROM idem_outbox WHERE id = ?",
    outbox_settle: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), last_error = ?, \
        lease_owner = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_release: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), attempts = attempts - 1, last_error = ?, \
        lease_owner = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_uncount: "UPDATE idem_outbox SET attempts = attempts - 1, updated_at = UTC_TIMESTAMP(6) \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_revert: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), last_error = ?, \
        lease_owner = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
        WHERE id = ? AND status = 'success' AND (lease_owner IS NULL OR lease_owner = ?) AND attempts = ?",
    attempt_log: "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor, at) \
        VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))",
    // The newest rows' boundary through a derived table: MariaDB refuses
    // a subquery on the table a DELETE changes (1093), not one on a
    // materialized copy of it.
    attempt_trim: "DELETE FROM idem_outbox_attempt WHERE outbox_id = ? AND id < \
        (SELECT b.id FROM (SELECT id FROM idem_outbox_attempt WHERE outbox_id = ? \
        ORDER BY id DESC LIMIT 1 OFFSET ?) b)",
    process_beat: "INSERT INTO idem_process (id, kind, name, host, pid, started_at, heartbeat_at) \
        VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE \
        kind = VALUES(kind), name = VALUES(name), host = VALUES(host), pid = VALUES(pid), \
        heartbeat_at = UTC_TIMESTAMP(6)",
    process_end: "DELETE FROM idem_process WHERE id = ?",
    insert_id: InsertId::LastInsertId,
    // No UPDATE … RETURNING: pick the due rows (a consistent read, no
    // locks), lock those still due (skipping rows other relays hold),
    // then lease them, in one transaction.
    claim: Claim::LockThenLease {
        render: |topics| {
            format!(
                "SELECT id FROM idem_outbox q \
                 WHERE status = 'pending' AND topic IN ({topics}) AND next_attempt_at <= UTC_TIMESTAMP(6) \
                 AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6)) /*order*/ /*pause*/ \
                 ORDER BY next_attempt_at, id LIMIT ? OFFSET ?"
            )
        },
        lock: Some(|ids| {
            format!(
                "SELECT id, topic, msg_id, payload, attempts, ordering_key, headers, \
                 TIMESTAMPDIFF(MICROSECOND, created_at, CURRENT_TIMESTAMP(6)) / 1e6, lease_owner \
                 FROM idem_outbox WHERE id IN ({ids}) AND status = 'pending' AND next_attempt_at <= UTC_TIMESTAMP(6) \
                 AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6)) \
                 ORDER BY next_attempt_at, id FOR UPDATE SKIP LOCKED"
            )
        }),
        lease: |ids| {
            format!(
                "UPDATE idem_outbox SET lease_owner = ?, \
                 locked_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), \
                 attempts = attempts + 1, updated_at = UTC_TIMESTAMP(6) WHERE id IN ({ids})"
            )
        },
    },
    claim_recover: |ids| {
        format!(
            "SELECT id, topic, msg_id, payload, attempts, ordering_key, headers, \
             TIMESTAMPDIFF(MICROSECOND, created_at, CURRENT_TIMESTAMP(6)) / 1e6 FROM idem_outbox \
             WHERE lease_owner = ? AND status = 'pending' AND locked_until > UTC_TIMESTAMP(6) \
             AND id IN ({ids})"
        )
    },
    // Rows a running handler transaction holds are skipped: no claim can
    // take them while it runs.
    renew_held: "UPDATE idem_outbox SET locked_until = \
        DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) \
        WHERE id = ? AND lease_owner = ? AND status = 'pending'",
    renew: Renew::LockThenUpdate {
        lock: |ids| {
            format!(
                "SELECT id, attempts FROM idem_outbox WHERE lease_owner = ? AND status = 'pending' \
                 AND id IN ({ids}) FOR UPDATE SKIP LOCKED"
            )
        },
        update: |ids| {
            format!(
                "UPDATE idem_outbox SET locked_until = \
                 DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) WHERE id IN ({ids})"
            )
        },
    },
    index_columns: None,
};

/// MariaDB/MySQL error numbers a retry of the transaction can heal. `4031`
/// is not here: its meaning depends on the server (see
/// [`error_is_transient`]).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn number_is_transient(number: u16) -> bool {
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

/// Error numbers of a transaction rolled back because another one won a
/// conflict on the same rows, so that an immediate retry is right: a
/// deadlock (1213; also how a Galera node reports a write set that failed
/// certification against another node's), "record has changed since last
/// read" (1020), an XA branch rolled back on a deadlock (1614).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn number_is_conflict(number: u16) -> bool {
    matches!(number, 1213 | 1020 | 1614)
}

/// [`number_is_transient`], and `4031` when it is MySQL 8's
/// ER_CLIENT_INTERACTION_TIMEOUT (disconnected for inactivity), told apart
/// from MariaDB's ER_REFERENCED_TRG_DOES_NOT_EXIST by its message.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn error_is_transient(number: u16, message: &str) -> bool {
    number_is_transient(number)
        || (number == 4031 && message.contains("because of inactivity"))
        || is_read_only(number, message)
}

/// The server refuses writes because it is read-only (a replica, or a
/// node demoted in a failover): ER_READ_ONLY_TRANSACTION (1792), and
/// ER_OPTION_PREVENTS_STATEMENT (1290) when the option is `--read-only` or
/// `--super-read-only` (1290 also names other options, e.g.
/// `--secure-file-priv`, which no retry heals).
fn is_read_only(number: u16, message: &str) -> bool {
    number == 1792 || (number == 1290 && message.contains("read-only"))
}

/// Error numbers that mean the session itself ended: an answer to
/// `COMMIT` with one of them says nothing about whether the commit
/// happened.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn error_is_connection_loss(number: u16, message: &str) -> bool {
    matches!(number, 1053 | 1927 | 1158..=1161)
        || (number == 4031 && message.contains("because of inactivity"))
}

/// What a MariaDB/MySQL error means, if `db` is one of its driver.
#[cfg(feature = "mysql")]
pub(crate) fn classify(db: &dyn sqlx::error::DatabaseError) -> Option<Class> {
    let my = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()?;
    let (number, message) = (my.number(), my.message());
    Some(Class {
        transient: error_is_transient(number, message),
        conflict: number_is_conflict(number),
        // ER_LOCK_WAIT_TIMEOUT
        lock_wait: number == 1205,
        session_lost: error_is_connection_loss(number, message),
        pooler: None,
    })
}

/// The MariaDB / MySQL statements of `Idempotency-Key` requests. The find
/// is a consistent read (no `LOCK IN SHARE MODE`): it must not wait for
/// the handler's transaction that holds the row. INSERT IGNORE can only
/// ignore the duplicate: every value is length-checked before. The
/// take-over's lock skips a row held by another transaction (`SKIP LOCKED`:
/// MariaDB 10.6, MySQL 8.0).
pub(crate) const REQUESTS: RequestSql = RequestSql {
    find: "SELECT fingerprint, result, \
        CAST(CASE WHEN expire_time < UTC_TIMESTAMP(6) THEN 1 ELSE 0 END AS SIGNED) \
        FROM idem_record WHERE idempotency_key = ? AND biz_type = ?",
    insert: "INSERT IGNORE INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
        VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND))",
    claim: None,
    claim_in: None,
    take_over: "UPDATE idem_record SET result = ?, \
        expire_time = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND) \
        WHERE idempotency_key = ? AND biz_type = ? AND result = ? \
        AND expire_time < UTC_TIMESTAMP(6)",
    lock: Some(
        "SELECT id FROM idem_record WHERE idempotency_key = ? AND biz_type = ? \
        FOR UPDATE SKIP LOCKED",
    ),
    fence: "UPDATE idem_record SET expire_time = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND) \
        WHERE idempotency_key = ? AND biz_type = ? AND result = ?",
    complete: "UPDATE idem_record SET result = ?, \
        expire_time = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND) \
        WHERE idempotency_key = ? AND biz_type = ? AND result = ?",
    by_id: Some((
        "UPDATE idem_record SET expire_time = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND) \
        WHERE id = ? AND result = ?",
        "UPDATE idem_record SET result = ?, \
        expire_time = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND) \
        WHERE id = ? AND result = ?",
    )),
    release: "DELETE FROM idem_record WHERE idempotency_key = ? AND biz_type = ? AND result = ?",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_are_the_rollbacks_for_a_concurrent_winner() {
        for n in [1213, 1020, 1614] {
            assert!(number_is_conflict(n) && number_is_transient(n), "{n}");
        }
        // Retryable, but not a lost conflict: a lock wait time-out already
        // waited, a lost connection is no conflict.
        for n in [1205, 1040, 1053, 1927, 1158, 1062, 1146, 1792] {
            assert!(!number_is_conflict(n), "{n}");
        }
    }

    #[test]
    fn mysql_numbers() {
        for n in [
            1205, 1213, 1020, 1614, 1040, 1203, 1637, 1053, 1927, 1158, 1159, 1160, 1161,
        ] {
            assert!(number_is_transient(n), "{n} should be transient");
            assert!(error_is_transient(n, ""), "{n} should be transient");
        }
        for n in [
            1062, 1146, 1064, 1048, 1406, 1452, 1366, 1317, 1969, 1180, 1290, 1836, 4031, 5, 6,
            517, 2006, 2013,
        ] {
            assert!(!number_is_transient(n), "{n} should be permanent");
        }
        assert!(error_is_transient(
            4031,
            "The client was disconnected by the server because of inactivity."
        ));
        assert!(!error_is_transient(
            4031,
            "Referenced trigger 't1' for the given action time and event type does not exist"
        ));
        // A read-only server (a replica, a demoted node): retryable.
        assert!(error_is_transient(
            1792,
            "Cannot execute statement in a READ ONLY transaction"
        ));
        assert!(error_is_transient(
            1290,
            "The MariaDB server is running with the --read-only option so it cannot execute this statement"
        ));
        assert!(!error_is_transient(
            1290,
            "The MariaDB server is running with the --secure-file-priv option so it cannot execute this statement"
        ));
        for n in [1053, 1927, 1158, 1161] {
            assert!(error_is_connection_loss(n, ""), "{n} ends the session");
        }
        for n in [1205, 1213, 1792, 1062] {
            assert!(!error_is_connection_loss(n, ""), "{n} leaves the session");
        }
    }
}
