//! PostgreSQL: the archiver's statements and the operator's expressions.

use super::{AdminSql, ArchiveSql, MigrateLock, MigrateSql, OpsSql};

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
            locked_until, last_error, created_at, updated_at, ordering_key, headers, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, ordering_key, headers, now() FROM idem_outbox \
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
        pause: "INSERT INTO idem_topic_pause (topic, reason, paused_by, paused_at) \
            VALUES (?, ?, ?, now()) ON CONFLICT (topic) DO NOTHING",
    },
    schema: SCHEMA,
    migrate: MigrateSql {
        // Concurrent migrations wait for each other instead of racing on
        // the catalog.
        lock: MigrateLock::Transaction {
            begin: None,
            lock: Some("SELECT pg_advisory_xact_lock(4242424242)"),
        },
        flavor_probe: None,
        upgrades: |_| vec![owned(PG_V2), owned(PG_V3), owned(PG_V4)],
    },
};

/// The tables as the first release created them (schema version 1).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idem_record (
            id BIGSERIAL PRIMARY KEY,
            idempotency_key VARCHAR(128) NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result TEXT,
            create_time TIMESTAMPTZ NOT NULL DEFAULT now(),
            expire_time TIMESTAMPTZ NOT NULL,
            CONSTRAINT uk_idem_record_key UNIQUE (idempotency_key)
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_expire ON idem_record (expire_time)",
    "CREATE TABLE IF NOT EXISTS idem_outbox (
            id BIGSERIAL PRIMARY KEY,
            topic VARCHAR(128) NOT NULL,
            msg_id VARCHAR(128) NOT NULL,
            payload TEXT NOT NULL,
            status VARCHAR(16) NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            lease_owner VARCHAR(64),
            locked_until TIMESTAMPTZ,
            last_error TEXT,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT uk_idem_outbox_msg UNIQUE (topic, msg_id),
            CONSTRAINT ck_idem_outbox_status CHECK (status IN ('pending', 'success', 'failed'))
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_due ON idem_outbox (status, next_attempt_at)",
    // The relay's claim: pending rows of its topics, oldest first.
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_pending ON idem_outbox (topic, next_attempt_at, id) WHERE status = 'pending'",
    // History: the same columns plus archived_at; `id` is the online
    // row's id. A key may be archived, reused once expired, and
    // archived again: indexed, not unique.
    "CREATE TABLE IF NOT EXISTS idem_record_history (
            id BIGINT PRIMARY KEY,
            idempotency_key VARCHAR(128) NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result TEXT,
            create_time TIMESTAMPTZ NOT NULL,
            expire_time TIMESTAMPTZ NOT NULL,
            archived_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key ON idem_record_history (idempotency_key)",
    "CREATE TABLE IF NOT EXISTS idem_outbox_history (
            id BIGINT PRIMARY KEY,
            topic VARCHAR(128) NOT NULL,
            msg_id VARCHAR(128) NOT NULL,
            payload TEXT NOT NULL,
            status VARCHAR(16) NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_at TIMESTAMPTZ NOT NULL,
            lease_owner VARCHAR(64),
            locked_until TIMESTAMPTZ,
            last_error TEXT,
            created_at TIMESTAMPTZ NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL,
            archived_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_history_msg ON idem_outbox_history (topic, msg_id)",
];

/// Version 2 on PostgreSQL (one transaction).
const PG_V2: &[&str] = &[
    "UPDATE idem_record SET expire_time = create_time + interval '3650 days' \
     WHERE expire_time <= create_time",
    "ALTER TABLE idem_record DROP CONSTRAINT IF EXISTS uk_idem_record_key",
    // (key, biz_type): the same uniqueness as (biz_type, key), and the
    // index also serves the operator's look-up by key alone.
    "ALTER TABLE idem_record ADD CONSTRAINT uk_idem_record_key_type UNIQUE (idempotency_key, biz_type)",
    "ALTER TABLE idem_record ADD CONSTRAINT ck_idem_record_expire CHECK (expire_time > create_time)",
    "DROP INDEX IF EXISTS idx_idem_record_history_key",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key_type \
     ON idem_record_history (idempotency_key, biz_type)",
];

/// Version 3 on PostgreSQL (one transaction): the ordering key and the
/// headers of outbox messages, online and archived, and the indexes the
/// claim's ordering guard reads: a key's pending rows by id, and its dead
/// ones (a dead-lettered head holds its key in `OnDeadHead::Hold`), never
/// its finished ones.
const PG_V3: &[&str] = &[
    "ALTER TABLE idem_outbox ADD COLUMN IF NOT EXISTS ordering_key VARCHAR(128), \
     ADD COLUMN IF NOT EXISTS headers TEXT",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_order ON idem_outbox (ordering_key, id) \
     WHERE status = 'pending' AND ordering_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_order_dead ON idem_outbox (ordering_key, id) \
     WHERE status = 'failed' AND ordering_key IS NOT NULL",
    "ALTER TABLE idem_outbox_history ADD COLUMN IF NOT EXISTS ordering_key VARCHAR(128), \
     ADD COLUMN IF NOT EXISTS headers TEXT",
];

/// Version 4 on PostgreSQL (one transaction): the operator's tables. The
/// attempt log (failed attempts and operator actions per message, bounded,
/// kept for archived messages until the history's retention removes
/// them), the paused topics the relays' claims skip, and the relays and
/// consumers alive with their heartbeats.
const PG_V4: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idem_outbox_attempt (
            id BIGSERIAL PRIMARY KEY,
            outbox_id BIGINT NOT NULL,
            attempt INTEGER NOT NULL,
            outcome VARCHAR(16) NOT NULL,
            detail TEXT,
            actor VARCHAR(128),
            at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    "CREATE INDEX IF NOT EXISTS idx_idem_outbox_attempt_msg ON idem_outbox_attempt (outbox_id, id)",
    "CREATE TABLE IF NOT EXISTS idem_topic_pause (
            topic VARCHAR(128) PRIMARY KEY,
            reason TEXT,
            paused_by VARCHAR(128),
            paused_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    "CREATE TABLE IF NOT EXISTS idem_process (
            id VARCHAR(64) PRIMARY KEY,
            kind VARCHAR(16) NOT NULL,
            name VARCHAR(256) NOT NULL,
            host VARCHAR(128),
            pid BIGINT,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
];

/// A version's statements, owned.
fn owned(step: &[&str]) -> Vec<String> {
    step.iter().map(|s| s.to_string()).collect()
}
