//! PostgreSQL: the archiver's statements and the operator's expressions.

use super::{AdminSql, ArchiveSql, OpsSql};

pub(crate) const SQL: OpsSql = OpsSql {
    numbered: true,
    micros: false,
    row_lock: " FOR UPDATE",
    archive_record: ArchiveSql {
        select: "SELECT id FROM idem_record WHERE expire_time < now() \
            ORDER BY expire_time LIMIT $1 FOR UPDATE SKIP LOCKED",
        count: "SELECT COUNT(*) FROM idem_record WHERE expire_time < now()",
        copy: "INSERT INTO idem_record_history \
            (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, archived_at) \
            SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time, now() \
            FROM idem_record WHERE expire_time + interval '0 seconds' < now() AND id IN (",
        // The re-check is written so that it cannot use the expire_time
        // index: the locked ids are few, the expired rows may be millions.
        delete: "DELETE FROM idem_record WHERE expire_time + interval '0 seconds' < now() AND id IN (",
    },
    archive_outbox: ArchiveSql {
        select: "SELECT id FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8) \
            ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
        count: "SELECT COUNT(*) FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8)",
        copy: "INSERT INTO idem_outbox_history \
            (id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, now() FROM idem_outbox \
            WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8) AND id IN (",
        delete: "DELETE FROM idem_outbox WHERE status IN ('success', 'failed') \
            AND updated_at < now() - make_interval(secs => $1::float8) AND id IN (",
    },
    find_online: "SELECT idempotency_key::text, biz_type::text, biz_no::text, fingerprint::text, result, \
        to_char(create_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), \
        to_char(expire_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') \
        FROM idem_record WHERE idempotency_key = $1",
    find_history: "SELECT idempotency_key::text, biz_type::text, biz_no::text, fingerprint::text, result, \
        to_char(create_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), \
        to_char(expire_time AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), \
        to_char(archived_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') \
        FROM idem_record_history WHERE idempotency_key = $1",
    archive_begin: None,
    archive_prelude: None,
    admin: AdminSql {
        ts_text: |col| format!("to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"),
        now: "now()",
        pending_age: "CAST(EXTRACT(EPOCH FROM now() - MIN(created_at)) AS DOUBLE PRECISION)",
        requeued_error: "'requeued: ' || COALESCE(last_error, '')",
        age_secs: |col| format!("CAST(EXTRACT(EPOCH FROM now() - {col}) AS DOUBLE PRECISION)"),
        floor_int: |e| format!("CAST(FLOOR({e}) AS BIGINT)"),
        ago: "now() - make_interval(secs => ?::float8)",
    },
};
