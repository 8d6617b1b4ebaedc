//! SQLite: the archiver's statements and the operator's expressions.

use super::{AdminSql, ArchiveSql, MigrateLock, MigrateSql, OpsSql};

pub(crate) const SQL: OpsSql = OpsSql {
    numbered: false,
    micros: false,
    row_lock: "",
    archive_record: ArchiveSql {
        select: "SELECT id FROM idem_record WHERE expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') \
            ORDER BY expire_time LIMIT ?",
        count: "SELECT COUNT(*) FROM idem_record WHERE expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now')",
        copy: "INSERT INTO idem_record_history \
            (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, archived_at) \
            SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, \
            strftime('%Y-%m-%d %H:%M:%f', 'now') FROM idem_record \
            WHERE +expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') AND id IN (",
        delete: "DELETE FROM idem_record WHERE +expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now') AND id IN (",
    },
    archive_outbox: ArchiveSql {
        select: "SELECT id FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds') \
            ORDER BY id LIMIT ?",
        count: "SELECT COUNT(*) FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds')",
        copy: "INSERT INTO idem_outbox_history \
            (id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, ordering_key, headers, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, ordering_key, headers, strftime('%Y-%m-%d %H:%M:%f', 'now') \
            FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds') AND id IN (",
        delete: "DELETE FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds') AND id IN (",
    },
    find_online: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        CAST(create_time AS TEXT), CAST(expire_time AS TEXT) \
        FROM idem_record WHERE idempotency_key = ?",
    find_history: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        CAST(create_time AS TEXT), CAST(expire_time AS TEXT), CAST(archived_at AS TEXT) \
        FROM idem_record_history WHERE idempotency_key = ?",
    // The write lock up front: serialized with every handler.
    archive_begin: Some("BEGIN IMMEDIATE"),
    archive_prelude: None,
    admin: AdminSql {
        ts_text: |col| format!("CAST({col} AS TEXT)"),
        now: "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        pending_age: "CAST((julianday('now') - julianday(MIN(created_at))) * 86400.0 AS REAL)",
        requeued_error: "'requeued: ' || COALESCE(last_error, '')",
        age_secs: |col| format!("((julianday('now') - julianday({col})) * 86400.0)"),
        floor_int: |e| format!("CAST({e} AS INTEGER)"),
        ago: "strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ? || ' seconds')",
        pause: "INSERT INTO idem_topic_pause (topic, reason, paused_by, paused_at) \
            VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now')) ON CONFLICT (topic) DO NOTHING",
    },
    schema: SCHEMA,
    migrate: MigrateSql {
        // One `BEGIN IMMEDIATE` transaction: concurrent runs wait.
        lock: MigrateLock::Transaction {
            begin: Some("BEGIN IMMEDIATE"),
            lock: None,
        },
        flavor_probe: None,
        upgrades: |_| vec![owned(LITE_V2), owned(LITE_V3), owned(LITE_V4)],
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

/// Version 3 on SQLite (one `BEGIN IMMEDIATE` transaction): the ordering
/// key and the headers of outbox messages, online and archived, and the
/// indexes the claim's ordering guard reads (a key's pending rows, its
/// dead ones).
const LITE_V3: &[&str] = &[
    "ALTER TABLE idem_outbox ADD COLUMN ordering_key TEXT",
    "ALTER TABLE idem_outbox ADD COLUMN headers TEXT",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_order ON idem_outbox (ordering_key, id) \
     WHERE status = 'pending' AND ordering_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_order_dead ON idem_outbox (ordering_key, id) \
     WHERE status = 'failed' AND ordering_key IS NOT NULL",
    "ALTER TABLE idem_outbox_history ADD COLUMN ordering_key TEXT",
    "ALTER TABLE idem_outbox_history ADD COLUMN headers TEXT",
];

/// Version 4 on SQLite: the operator's tables (see the PostgreSQL file's
/// `PG_V4`).
const LITE_V4: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idem_outbox_attempt (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            outbox_id INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            detail TEXT,
            actor TEXT,
            at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_attempt_msg ON idem_outbox_attempt (outbox_id, id)",
    "CREATE TABLE IF NOT EXISTS idem_topic_pause (
            topic TEXT PRIMARY KEY,
            reason TEXT,
            paused_by TEXT,
            paused_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
    "CREATE TABLE IF NOT EXISTS idem_process (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            host TEXT,
            pid INTEGER,
            started_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
            heartbeat_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        )",
];

/// A version's statements, owned.
fn owned(step: &[&str]) -> Vec<String> {
    step.iter().map(|s| s.to_string()).collect()
}
