//! The previous release's DDL (idem-runtime/src/backend.rs at 838c97b),
//! verbatim, for `backend/upgrade.rs`: the tables `migrate` must upgrade in
//! place.
//! Data, not code: kept apart so that the test reads on its own.

pub(crate) const OLD_PG: &[&str] = &[
    // Concurrent migrations wait for each other instead of racing on
    // the catalog.
    "SELECT pg_advisory_xact_lock(4242424242)",
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

pub(crate) const OLD_MY: &[&str] = &[
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

pub(crate) const OLD_LITE: &[&str] = &[
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
