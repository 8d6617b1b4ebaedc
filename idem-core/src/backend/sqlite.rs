//! SQLite: its statements, schema and upgrade steps, and which of its
//! result codes a retry can heal.

#[cfg(feature = "sqlite")]
use super::class::Class;
use super::dialect::Dialect;
use super::sql::{Claim, InsertId, Renew, RequestSql, SqlSet};

/// The SQLite statements.
pub(crate) const SQL: SqlSet = SqlSet {
    dialect: Dialect::Sqlite,
    quote: '"',
    numbered: false,
    text: |e| format!("CAST({e} AS TEXT)"),
    // No FOR UPDATE: BEGIN IMMEDIATE already holds the write lock.
    row_lock: "",
    begin: Some("BEGIN IMMEDIATE"),
    mark_with: None,
    micros: false,
    fetch_record: "SELECT fingerprint, result FROM idem_record \
        WHERE idempotency_key = ? AND biz_type = ?",
    store_result: "UPDATE idem_record SET result = ? WHERE idempotency_key = ? AND biz_type = ?",
    record_ttl_left: "SELECT CAST((julianday(expire_time) - julianday('now')) * 86400000 AS INTEGER) \
        FROM idem_record WHERE idempotency_key = ? AND biz_type = ?",
    // Not `INSERT OR IGNORE`, which also drops the row on a NOT NULL or
    // CHECK violation (an expiry past strftime's range is NULL): only the
    // duplicate is ignored.
    claim_record: "INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
        VALUES (?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), \
        strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds')) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING",
    outbox_insert: "INSERT INTO idem_outbox \
        (topic, msg_id, payload, ordering_key, headers, next_attempt_at, created_at, updated_at) \
        VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
        strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now')) \
        ON CONFLICT (topic, msg_id) DO NOTHING RETURNING id",
    // One writer at a time: enqueues are serialized already.
    outbox_order_lock: None,
    now: "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    next_due: None,
    outbox_find: "SELECT id, payload FROM idem_outbox WHERE topic = ? AND msg_id = ?",
    outbox_insert_notify: None,
    outbox_success: "UPDATE idem_outbox SET status = 'success', \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_owner = NULL, \
        locked_until = NULL \
        WHERE id = ? AND topic = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_success_batch: |ids| {
        format!(
            "UPDATE idem_outbox SET status = 'success', \
             updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_owner = NULL, \
             locked_until = NULL \
             WHERE lease_owner = ? AND status = 'pending' AND id IN ({ids})"
        )
    },
    outbox_state: "SELECT topic, status, lease_owner, attempts FROM idem_outbox WHERE id = ?",
    outbox_settle: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
        last_error = ?, lease_owner = NULL, locked_until = NULL, \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_release: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
        attempts = attempts - 1, last_error = ?, lease_owner = NULL, locked_until = NULL, \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_uncount: "UPDATE idem_outbox SET attempts = attempts - 1, \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
        WHERE id = ? AND status = 'pending' AND lease_owner = ? AND attempts = ?",
    outbox_revert: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
        last_error = ?, lease_owner = NULL, locked_until = NULL, \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
        WHERE id = ? AND status = 'success' AND (lease_owner IS NULL OR lease_owner = ?) AND attempts = ?",
    attempt_log: "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor, at) \
        VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'))",
    attempt_trim: "DELETE FROM idem_outbox_attempt WHERE outbox_id = ? AND id < \
        (SELECT id FROM idem_outbox_attempt WHERE outbox_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
    process_beat: "INSERT INTO idem_process (id, kind, name, host, pid, started_at, heartbeat_at) \
        VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now')) \
        ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, name = excluded.name, \
        host = excluded.host, pid = excluded.pid, heartbeat_at = strftime('%Y-%m-%d %H:%M:%f', 'now')",
    process_end: "DELETE FROM idem_process WHERE id = ?",
    insert_id: InsertId::Returning,
    // BEGIN IMMEDIATE: the two statements run under the write lock.
    claim: Claim::LockThenLease {
        render: |topics| {
            format!(
                "SELECT id, topic, msg_id, payload, attempts, ordering_key, headers, \
                 (julianday('now') - julianday(created_at)) * 86400.0, lease_owner \
                 FROM idem_outbox q \
                 WHERE status = 'pending' AND topic IN ({topics}) \
                 AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 AND (locked_until IS NULL OR locked_until < strftime('%Y-%m-%d %H:%M:%f', 'now')) /*order*/ /*pause*/ \
                 ORDER BY next_attempt_at, id LIMIT ? OFFSET ?"
            )
        },
        lock: None,
        lease: |ids| {
            format!(
                "UPDATE idem_outbox SET lease_owner = ?, \
                 locked_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
                 attempts = attempts + 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 WHERE id IN ({ids})"
            )
        },
    },
    claim_recover: |ids| {
        format!(
            "SELECT id, topic, msg_id, payload, attempts, ordering_key, headers, \
             (julianday('now') - julianday(created_at)) * 86400.0 FROM idem_outbox \
             WHERE lease_owner = ? AND status = 'pending' \
             AND locked_until > strftime('%Y-%m-%d %H:%M:%f', 'now') AND id IN ({ids})"
        )
    },
    // BEGIN IMMEDIATE: no handler transaction runs meanwhile.
    renew_held: "UPDATE idem_outbox SET locked_until = \
        strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds') \
        WHERE id = ? AND lease_owner = ? AND status = 'pending'",
    renew: Renew::Update(|ids| {
        format!(
            "UPDATE idem_outbox SET locked_until = \
             strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds') \
             WHERE lease_owner = ? AND status = 'pending' AND id IN ({ids}) \
             RETURNING id, attempts"
        )
    }),
    index_columns: Some(
        "SELECT m.tbl_name, i.name FROM sqlite_master m, pragma_index_info(m.name) i \
         WHERE m.type = 'index' AND m.name = ? ORDER BY i.seqno",
    ),
};

/// The SQLite statements of `Idempotency-Key` requests (times as the
/// record strategy writes them: UTC text with milliseconds).
pub(crate) const REQUESTS: RequestSql = RequestSql {
    find: "SELECT fingerprint, result, \
        CASE WHEN expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END \
        FROM idem_record WHERE idempotency_key = ? AND biz_type = ?",
    insert: "INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
        VALUES (?, ?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), \
        strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds')) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING",
    claim: None,
    claim_in: None,
    take_over: "UPDATE idem_record SET result = ?, \
        expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds') \
        WHERE idempotency_key = ? AND biz_type = ? AND result = ? \
        AND expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now')",
    // No row locks: the take-over's `BEGIN IMMEDIATE` waits (busy_timeout)
    // while a handler's transaction holds the write lock, as every writer.
    lock: None,
    fence: "UPDATE idem_record \
        SET expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds') \
        WHERE idempotency_key = ? AND biz_type = ? AND result = ?",
    complete: "UPDATE idem_record SET result = ?, \
        expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds') \
        WHERE idempotency_key = ? AND biz_type = ? AND result = ?",
    by_id: None,
    release: "DELETE FROM idem_record WHERE idempotency_key = ? AND biz_type = ? AND result = ?",
};

/// SQLite result codes (primary or extended) a retry can heal: the primary
/// code `SQLITE_BUSY` (5: another connection holds the lock) or
/// `SQLITE_LOCKED` (6: a conflict inside a shared cache), whatever the
/// extended code (`SQLITE_BUSY_SNAPSHOT` 517, `SQLITE_BUSY_RECOVERY` 261…).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn code_is_transient(code: i32) -> bool {
    matches!(code & 0xff, 5 | 6)
}

/// What a SQLite error means, if `db` is one of its driver: busy and
/// locked are transient, nothing is a conflict (the busy time-out already
/// waited) or a lost session (the database is in the process).
#[cfg(feature = "sqlite")]
pub(crate) fn classify(db: &dyn sqlx::error::DatabaseError) -> Option<Class> {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    // The driver reports the extended result code, in decimal.
    let transient = db
        .code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(code_is_transient);
    Some(Class {
        transient,
        ..Class::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_codes() {
        // SQLITE_BUSY, SQLITE_LOCKED and their extended codes.
        for code in [5, 6, 261, 517, 773, 262, 518] {
            assert!(code_is_transient(code), "{code} should be transient");
        }
        // SQLITE_ERROR, CONSTRAINT (and UNIQUE 2067, PRIMARYKEY 1555),
        // READONLY, FULL, CORRUPT, MISMATCH.
        for code in [0, 1, 19, 2067, 1555, 8, 13, 11, 20] {
            assert!(!code_is_transient(code), "{code} should be permanent");
        }
    }
}
