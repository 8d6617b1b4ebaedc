//! MariaDB and MySQL: the archiver's statements and the operator's expressions.

use super::{AdminSql, ArchiveSql, MigrateLock, MigrateSql, OpsSql};

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
            locked_until, last_error, created_at, updated_at, ordering_key, headers, archived_at) \
            SELECT id, topic, msg_id, payload, status, attempts, next_attempt_at, lease_owner, \
            locked_until, last_error, created_at, updated_at, ordering_key, headers, UTC_TIMESTAMP(6) FROM idem_outbox \
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
        // The values are checked first (lengths): IGNORE skips only the
        // duplicate.
        pause: "INSERT IGNORE INTO idem_topic_pause (topic, reason, paused_by, paused_at) \
            VALUES (?, ?, ?, UTC_TIMESTAMP(6))",
    },
    schema: SCHEMA,
    migrate: MigrateSql {
        // DDL is not transactional: `GET_LOCK` on a connection of its own
        // (if anything fails it is closed, and the server releases the
        // lock with the session); each version is recorded as soon as its
        // statements are done.
        lock: MigrateLock::Session {
            acquire: "SELECT CAST(COALESCE(GET_LOCK('idem_migrate', 600), 0) AS SIGNED)",
            release: "SELECT CAST(COALESCE(RELEASE_LOCK('idem_migrate'), 0) AS SIGNED)",
            busy: "migrate: another migration held the `idem_migrate` lock for 600 s",
        },
        flavor_probe: Some(
            "SELECT COUNT(*) FROM information_schema.COLLATIONS \
             WHERE COLLATION_NAME = 'utf8mb4_nopad_bin'",
        ),
        upgrades: |mariadb| {
            let flavor = if mariadb > 0 {
                MySqlFlavor::MariaDb
            } else {
                MySqlFlavor::MySql8
            };
            vec![mysql_v2(flavor), mysql_v3(flavor), mysql_v4(flavor)]
        },
    },
};

/// The tables as the first release created them (schema version 1).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idem_record (
            id BIGINT AUTO_INCREMENT PRIMARY KEY,
            idempotency_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result MEDIUMTEXT NULL,
            create_time DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            expire_time DATETIME(6) NOT NULL,
            UNIQUE KEY uk_idem_record_key (idempotency_key),
            KEY idx_idem_record_expire (expire_time)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    "CREATE TABLE IF NOT EXISTS idem_outbox (
            id BIGINT AUTO_INCREMENT PRIMARY KEY,
            topic VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            msg_id VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            payload MEDIUMTEXT NOT NULL,
            status VARCHAR(16) NOT NULL DEFAULT 'pending',
            attempts INT NOT NULL DEFAULT 0,
            next_attempt_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            lease_owner VARCHAR(64) NULL,
            locked_until DATETIME(6) NULL,
            last_error TEXT NULL,
            created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            UNIQUE KEY uk_idem_outbox_msg (topic, msg_id),
            KEY idx_idem_outbox_due (status, next_attempt_at),
            CONSTRAINT ck_idem_outbox_status CHECK (status IN ('pending', 'success', 'failed'))
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    "CREATE TABLE IF NOT EXISTS idem_record_history (
            id BIGINT PRIMARY KEY,
            idempotency_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            biz_type VARCHAR(64) NOT NULL,
            biz_no VARCHAR(128) NOT NULL,
            fingerprint VARCHAR(64) NOT NULL,
            result MEDIUMTEXT NULL,
            create_time DATETIME(6) NOT NULL,
            expire_time DATETIME(6) NOT NULL,
            archived_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            KEY idx_idem_record_history_key (idempotency_key)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    "CREATE TABLE IF NOT EXISTS idem_outbox_history (
            id BIGINT PRIMARY KEY,
            topic VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            msg_id VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            payload MEDIUMTEXT NOT NULL,
            status VARCHAR(16) NOT NULL,
            attempts INT NOT NULL,
            next_attempt_at DATETIME(6) NOT NULL,
            lease_owner VARCHAR(64) NULL,
            locked_until DATETIME(6) NULL,
            last_error TEXT NULL,
            created_at DATETIME(6) NOT NULL,
            updated_at DATETIME(6) NOT NULL,
            archived_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
            KEY idx_idem_outbox_history_msg (topic, msg_id)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
];

/// Which MariaDB-protocol server: the collations and the DDL differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MySqlFlavor {
    /// MariaDB: `utf8mb4_nopad_bin`, `IF [NOT] EXISTS` on indexes and
    /// constraints.
    MariaDb,
    /// MySQL 8: `utf8mb4_0900_bin` (NO PAD); no `IF [NOT] EXISTS` there.
    MySql8,
}

/// Version 2 on MariaDB / MySQL: one `ALTER TABLE` per table (each atomic;
/// on MariaDB each can run again after a crash before the version was
/// recorded).
fn mysql_v2(flavor: MySqlFlavor) -> Vec<String> {
    let (c, if_exists, if_not_exists) = match flavor {
        MySqlFlavor::MariaDb => ("utf8mb4_nopad_bin", "IF EXISTS ", "IF NOT EXISTS "),
        MySqlFlavor::MySql8 => ("utf8mb4_0900_bin", "", ""),
    };
    let col = |name: &str, len: u32| {
        format!("MODIFY {name} VARCHAR({len}) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL")
    };
    let record_keys = [
        col("idempotency_key", 128),
        col("biz_type", 64),
        col("biz_no", 128),
    ]
    .join(", ");
    let outbox_keys = [col("topic", 128), col("msg_id", 128)].join(", ");
    vec![
        "UPDATE idem_record SET expire_time = DATE_ADD(create_time, INTERVAL 3650 DAY) \
         WHERE expire_time <= create_time"
            .to_string(),
        format!(
            "ALTER TABLE idem_record {record_keys}, \
             DROP INDEX {if_exists}uk_idem_record_key, \
             ADD UNIQUE KEY {if_not_exists}uk_idem_record_key_type (idempotency_key, biz_type), \
             ADD CONSTRAINT {if_not_exists}ck_idem_record_expire CHECK (expire_time > create_time)"
        ),
        format!("ALTER TABLE idem_outbox {outbox_keys}"),
        format!(
            "ALTER TABLE idem_record_history {record_keys}, \
             DROP INDEX {if_exists}idx_idem_record_history_key, \
             ADD KEY {if_not_exists}idx_idem_record_history_key_type (idempotency_key, biz_type)"
        ),
        format!("ALTER TABLE idem_outbox_history {outbox_keys}"),
    ]
}

/// Version 3 on MariaDB / MySQL: the ordering key and the headers of
/// outbox messages, online and archived, the index the claim's ordering
/// guard reads, and `idem_outbox_key`, the rows that serialize the
/// enqueues of one ordering key (one per key ever used). One statement
/// per table, each atomic; on MariaDB each can run again.
fn mysql_v3(flavor: MySqlFlavor) -> Vec<String> {
    let (c, if_not_exists) = match flavor {
        MySqlFlavor::MariaDb => ("utf8mb4_nopad_bin", "IF NOT EXISTS "),
        MySqlFlavor::MySql8 => ("utf8mb4_0900_bin", ""),
    };
    let columns = format!(
        "ADD COLUMN {if_not_exists}ordering_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {c} NULL, \
         ADD COLUMN {if_not_exists}headers MEDIUMTEXT NULL"
    );
    vec![
        format!(
            "ALTER TABLE idem_outbox {columns}, \
             ADD KEY {if_not_exists}idx_idem_outbox_order (ordering_key, status, id)"
        ),
        format!("ALTER TABLE idem_outbox_history {columns}"),
        format!(
            "CREATE TABLE IF NOT EXISTS idem_outbox_key ( \
             ordering_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL PRIMARY KEY \
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        ),
    ]
}

/// Version 4 on MariaDB / MySQL: the operator's tables (see the
/// PostgreSQL file's `PG_V4`), each statement safe to run again after a
/// crash between them; topics in the same binary collation as the
/// outbox's.
fn mysql_v4(flavor: MySqlFlavor) -> Vec<String> {
    let c = match flavor {
        MySqlFlavor::MariaDb => "utf8mb4_nopad_bin",
        MySqlFlavor::MySql8 => "utf8mb4_0900_bin",
    };
    vec![
        "CREATE TABLE IF NOT EXISTS idem_outbox_attempt ( \
         id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         outbox_id BIGINT NOT NULL, \
         attempt INT NOT NULL, \
         outcome VARCHAR(16) NOT NULL, \
         detail TEXT NULL, \
         actor VARCHAR(128) NULL, \
         at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         KEY idx_idem_outbox_attempt_msg (outbox_id, id) \
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            .to_string(),
        format!(
            "CREATE TABLE IF NOT EXISTS idem_topic_pause ( \
             topic VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL PRIMARY KEY, \
             reason TEXT NULL, \
             paused_by VARCHAR(128) NULL, \
             paused_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) \
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS idem_process ( \
             id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL PRIMARY KEY, \
             kind VARCHAR(16) NOT NULL, \
             name VARCHAR(256) NOT NULL, \
             host VARCHAR(128) NULL, \
             pid BIGINT NULL, \
             started_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
             heartbeat_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) \
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        ),
    ]
}
