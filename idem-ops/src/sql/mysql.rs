//! MariaDB and MySQL: the archiver's statements and the operator's expressions.

use super::{AdminSql, ArchiveSql, OpsSql};

pub(crate) const SQL: OpsSql = OpsSql {
    numbered: false,
    micros: true,
    row_lock: " FOR UPDATE",
    archive_record: ArchiveSql {
        select: "SELECT id FROM idem_record WHERE expire_time < UTC_TIMESTAMP(6) \
            ORDER BY expire_time LIMIT ? FOR UPDATE SKIP LOCKED",
        count: "SELECT COUNT(*) FROM idem_record WHERE expire_time < UTC_TIMESTAMP(6)",
        copy: "INSERT INTO idem_record_history \
            (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, archived_at) \
            SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, UTC_TIMESTAMP(6) \
            FROM idem_record WHERE TIMESTAMPADD(SECOND, 0, expire_time) < UTC_TIMESTAMP(6) AND id IN (",
        delete: "DELETE FROM idem_record WHERE TIMESTAMPADD(SECOND, 0, expire_time) < UTC_TIMESTAMP(6) AND id IN (",
    },
    archive_outbox: ArchiveSql {
        select: "SELECT id FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) \
            ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
        count: "SELECT COUNT(*) FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)",
        copy: "INSERT INTO idem_outbox_history \
            (id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, UTC_TIMESTAMP(6) FROM idem_outbox \
            WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) AND id IN (",
        delete: "DELETE FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) AND id IN (",
    },
    find_online: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        DATE_FORMAT(create_time, '%Y-%m-%d %H:%i:%s.%f'), \
        DATE_FORMAT(expire_time, '%Y-%m-%d %H:%i:%s.%f') \
        FROM idem_record WHERE idempotency_key = ?",
    find_history: "SELECT idempotency_key, biz_type, biz_no, fingerprint, result, \
        DATE_FORMAT(create_time, '%Y-%m-%d %H:%i:%s.%f'), \
        DATE_FORMAT(expire_time, '%Y-%m-%d %H:%i:%s.%f'), \
        DATE_FORMAT(archived_at, '%Y-%m-%d %H:%i:%s.%f') \
        FROM idem_record_history WHERE idempotency_key = ?",
    archive_begin: None,
    // Read committed for this transaction only: no gap locks, so handlers
    // inserting records never wait on the scan.
    archive_prelude: Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
    admin: AdminSql {
        ts_text: |col| format!("DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s.%f')"),
        now: "UTC_TIMESTAMP(6)",
        pending_age: "TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6",
        requeued_error: "CONCAT('requeued: ', COALESCE(last_error, ''))",
        age_secs: |col| format!("(TIMESTAMPDIFF(MICROSECOND, {col}, UTC_TIMESTAMP(6)) / 1e6)"),
        floor_int: |e| format!("CAST(FLOOR({e}) AS SIGNED)"),
        ago: "DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND)",
    },
};
