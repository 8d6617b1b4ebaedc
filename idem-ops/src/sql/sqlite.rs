//! SQLite: the archiver's statements and the operator's expressions.

use super::{AdminSql, ArchiveSql, OpsSql};

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
            locked_until, last_error, created_at, updated_at, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, strftime('%Y-%m-%d %H:%M:%f', 'now') \
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
    },
};
