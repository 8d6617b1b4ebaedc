//! SQLite: its statements, schema and upgrade steps, and which of its
//! result codes a retry can heal.

#[cfg(feature = "sqlite")]
use super::class::Class;
use super::dialect::Dialect;
use super::sql::{Claim, InsertId, MigrateLock, MigrateSql, Renew, RequestSql, SqlSet};

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
        (topic, msg_id, payload, next_attempt_at, created_at, updated_at) \
        VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), \
        strftime('%Y-%m-%d %H:%M:%f', 'now')) \
        ON CONFLICT (topic, msg_id) DO NOTHING RETURNING id",
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
    outbox_revert: "UPDATE idem_outbox SET status = ?, \
        next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
        last_error = ?, lease_owner = NULL, locked_until = NULL, \
        updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
        WHERE id = ? AND status = 'success' AND (lease_owner IS NULL OR lease_owner = ?) AND attempts = ?",
    insert_id: InsertId::Returning,
    // BEGIN IMMEDIATE: the two statements run under the write lock.
    claim: Claim::LockThenLease {
        render: |topics| {
            format!(
                "SELECT id, topic, msg_id, payload, attempts, lease_owner FROM idem_outbox \
                 WHERE status = 'pending' AND topic IN ({topics}) \
                 AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 AND (locked_until IS NULL OR locked_until < strftime('%Y-%m-%d %H:%M:%f', 'now')) \
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
            "SELECT id, topic, msg_id, payload, attempts FROM idem_outbox \
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
    schema: SCHEMA,
    migrate: MigrateSql {
        // One `BEGIN IMMEDIATE` transaction: concurrent runs wait.
        lock: MigrateLock::Transaction {
            begin: Some("BEGIN IMMEDIATE"),
            lock: None,
        },
        flavor_probe: None,
        upgrades: |_| vec![LITE_V2.iter().map(|s| s.to_string()).collect()],
    },
};

/// The tables as the first release created them (schema version 1).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idem_record (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) <= 128),
            biz_type TEXT NOT NULL,
            biz_no TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            result TEXT,
            create_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            expire_time TEXT NOT NULL,
            CONSTRAINT uk_idem_record_key UNIQUE (idempotency_key)
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_expire ON idem_record (expire_time)",
    "CREATE TABLE IF NOT EXISTS idem_outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            topic TEXT NOT NULL,
            msg_id TEXT NOT NULL,
            payload TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'success', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            lease_owner TEXT,
            locked_until TEXT,
            last_error TEXT,
            created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            CONSTRAINT uk_idem_outbox_msg UNIQUE (topic, msg_id)
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_due ON idem_outbox (status, next_attempt_at)",
    // The relay's claim: pending rows of its topics, oldest first.
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_pending ON idem_outbox (topic, next_attempt_at, id) WHERE status = 'pending'",
    "CREATE TABLE IF NOT EXISTS idem_record_history (
            id INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL,
            biz_type TEXT NOT NULL,
            biz_no TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            result TEXT,
            create_time TEXT NOT NULL,
            expire_time TEXT NOT NULL,
            archived_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key ON idem_record_history (idempotency_key)",
    "CREATE TABLE IF NOT EXISTS idem_outbox_history (
            id INTEGER PRIMARY KEY,
            topic TEXT NOT NULL,
            msg_id TEXT NOT NULL,
            payload TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_at TEXT NOT NULL,
            lease_owner TEXT,
            locked_until TEXT,
            last_error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            archived_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_history_msg ON idem_outbox_history (topic, msg_id)",
];

/// Version 2 on SQLite (one `BEGIN IMMEDIATE` transaction): a constraint
/// cannot be changed in place, so `idem_record` is rebuilt, keeping its
/// ids and its AUTOINCREMENT sequence (an archived record's id is never
/// handed out again: the history's primary key is that id).
const LITE_V2: &[&str] = &[
    "UPDATE idem_record SET expire_time = strftime('%Y-%m-%d %H:%M:%f', create_time, '+3650 days') \
     WHERE expire_time <= create_time",
    "CREATE TABLE idem_record_v2 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) <= 128),
        biz_type TEXT NOT NULL,
        biz_no TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        result TEXT,
        create_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
        expire_time TEXT NOT NULL,
        CONSTRAINT uk_idem_record_key_type UNIQUE (idempotency_key, biz_type),
        CONSTRAINT ck_idem_record_expire CHECK (expire_time > create_time)
    )",
    "INSERT INTO idem_record_v2 \
     (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
     SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time \
     FROM idem_record",
    "DELETE FROM sqlite_sequence WHERE name = 'idem_record_v2'",
    "INSERT INTO sqlite_sequence (name, seq) \
     SELECT 'idem_record_v2', seq FROM sqlite_sequence WHERE name = 'idem_record'",
    "DROP TABLE idem_record",
    "ALTER TABLE idem_record_v2 RENAME TO idem_record",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_expire ON idem_record (expire_time)",
    "DROP INDEX IF EXISTS idx_idem_record_history_key",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key_type \
     ON idem_record_history (idempotency_key, biz_type)",
];

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
