//! PostgreSQL: its statements, its schema and upgrade steps, and which of
//! its SQLSTATEs a retry can heal.

use super::class::{Class, PoolerFault};
use super::dialect::Dialect;
use super::sql::{Claim, InsertId, PAUSE_GUARD_SQL, Renew, RequestSql, SqlSet};

/// The PostgreSQL statements.
pub(crate) const SQL: SqlSet = SqlSet {
    dialect: Dialect::Postgres,
    quote: '"',
    numbered: true,
    text: |e| format!("{e}::text"),
    row_lock: " FOR UPDATE",
    begin: None,
    mark_with: Some(
        "WITH idem_mark AS (UPDATE idem_outbox SET status = 'success', \
         updated_at = now(), lease_owner = NULL, locked_until = NULL \
         WHERE id = ? AND topic = ? AND status = 'pending' AND lease_owner = ? AND attempts = ? \
         RETURNING 1)",
    ),
    micros: false,
    fetch_record: "SELECT fingerprint::text, result FROM idem_record \
        WHERE idempotency_key = $1 AND biz_type = $2",
    store_result: "UPDATE idem_record SET result = $1 WHERE idempotency_key = $2 AND biz_type = $3",
    // clock_timestamp(), not now(): now() is the transaction's start, and a
    // relay batch's transaction may be older than the call.
    record_ttl_left: "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM (expire_time - clock_timestamp())) * 1000) AS BIGINT) \
        FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2",
    claim_record: "INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, create_time, expire_time) \
        VALUES ($1, $2, $3, $4, now(), now() + make_interval(secs => $5::float8)) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING",
    // DO NOTHING, not an error: a unique violation would abort the
    // caller's whole transaction. It waits for a concurrent insert of the
    // same message; read committed then sees that row in `outbox_find`
    // (repeatable read fails with 40001, which is retryable).
    outbox_insert: "INSERT INTO idem_outbox \
        (topic, msg_id, payload, ordering_key, headers, next_attempt_at, created_at, updated_at) \
        VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6::float8), now(), now()) \
        ON CONFLICT (topic, msg_id) DO NOTHING RETURNING id",
    // A transaction-scoped lock on the key's 64-bit hash: two keys that
    // share a hash only wait for each other.
    outbox_order_lock: Some("SELECT 1 FROM pg_advisory_xact_lock(hashtextextended($1, 4242))"),
    now: "now()",
    // Per topic, the first row of the pending index due in the future:
    // one index probe each, however many messages wait. Rows due already
    // but not claimed (in flight, or behind their ordering key's head) are
    // no reason to wake: their claim, settlement or lease expiry is.
    next_due: Some(|topics| {
        let firsts: Vec<String> = topics
            .split(", ")
            .map(|t| {
                format!(
                    "(SELECT next_attempt_at AS t FROM idem_outbox q \
                     WHERE status = 'pending' AND topic = {t} AND next_attempt_at > now() \
                     {PAUSE_GUARD_SQL} ORDER BY next_attempt_at LIMIT 1)"
                )
            })
            .collect();
        format!(
            "SELECT CAST(EXTRACT(EPOCH FROM MIN(d.t) - now()) AS DOUBLE PRECISION) \
             FROM ({}) d",
            firsts.join(" UNION ALL ")
        )
    }),
    // The insert and its notification in one statement (no extra round
    // trip): the lateral `pg_notify` runs once per inserted row, so a
    // duplicate notifies nobody. The channel is `outbox::NOTIFY_CHANNEL`
    // (checked by a unit test); NOTIFY is sent at commit, never on
    // rollback, and works through a transaction-mode pooler.
    outbox_insert_notify: Some(
        "WITH ins AS (INSERT INTO idem_outbox \
        (topic, msg_id, payload, ordering_key, headers, next_attempt_at, created_at, updated_at) \
        VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6::float8), now(), now()) \
        ON CONFLICT (topic, msg_id) DO NOTHING RETURNING id, topic) \
        SELECT ins.id FROM ins, LATERAL pg_notify('idem_outbox', ins.topic::text) AS n",
    ),
    outbox_find: "SELECT id, payload FROM idem_outbox WHERE topic = $1 AND msg_id = $2",
    outbox_success: "UPDATE idem_outbox SET status = 'success', \
        updated_at = now(), lease_owner = NULL, locked_until = NULL \
        WHERE id = $1 AND topic = $2 AND status = 'pending' AND lease_owner = $3 AND attempts = $4",
    outbox_success_batch: |ids| {
        format!(
            "UPDATE idem_outbox SET status = 'success', \
             updated_at = now(), lease_owner = NULL, locked_until = NULL \
             WHERE lease_owner = ? AND status = 'pending' AND id IN ({ids})"
        )
    },
    outbox_state: "SELECT topic::text, status::text, lease_owner::text, attempts \
        FROM idem_outbox WHERE id = $1",
    outbox_settle: "UPDATE idem_outbox SET status = $1, \
        next_attempt_at = now() + make_interval(secs => $2::float8), last_error = $3, \
        lease_owner = NULL, locked_until = NULL, updated_at = now() \
        WHERE id = $4 AND status = 'pending' AND lease_owner = $5 AND attempts = $6",
    outbox_release: "UPDATE idem_outbox SET status = $1, \
        next_attempt_at = now() + make_interval(secs => $2::float8), attempts = attempts - 1, last_error = $3, \
        lease_owner = NULL, locked_until = NULL, updated_at = now() \
        WHERE id = $4 AND status = 'pending' AND lease_owner = $5 AND attempts = $6",
    outbox_uncount: "UPDATE idem_outbox SET attempts = attempts - 1, updated_at = now() \
        WHERE id = $1 AND status = 'pending' AND lease_owner = $2 AND attempts = $3",
    outbox_revert: "UPDATE idem_outbox SET status = $1, \
        next_attempt_at = now() + make_interval(secs => $2::float8), last_error = $3, \
        lease_owner = NULL, locked_until = NULL, updated_at = now() \
        WHERE id = $4 AND status = 'success' AND (lease_owner IS NULL OR lease_owner = $5) AND attempts = $6",
    attempt_log: "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor, at) \
        VALUES ($1, $2, $3, $4, $5, now())",
    attempt_trim: "DELETE FROM idem_outbox_attempt WHERE outbox_id = $1 AND id < \
        (SELECT id FROM idem_outbox_attempt WHERE outbox_id = $2 ORDER BY id DESC LIMIT 1 OFFSET $3)",
    process_beat: "INSERT INTO idem_process (id, kind, name, host, pid, started_at, heartbeat_at) \
        VALUES ($1, $2, $3, $4, $5, now(), now()) ON CONFLICT (id) DO UPDATE SET \
        kind = EXCLUDED.kind, name = EXCLUDED.name, host = EXCLUDED.host, pid = EXCLUDED.pid, \
        heartbeat_at = now()",
    process_end: "DELETE FROM idem_process WHERE id = $1",
    insert_id: InsertId::Returning,
    claim: Claim::Returning {
        render: |topics| {
            format!(
                "UPDATE idem_outbox o SET lease_owner = ?, \
                 locked_until = now() + make_interval(secs => ?::float8), \
                 attempts = o.attempts + 1, updated_at = now() \
                 FROM (SELECT id, lease_owner AS prev FROM idem_outbox q WHERE status = 'pending' \
                   AND topic IN ({topics}) \
                   AND next_attempt_at <= now() AND (locked_until IS NULL OR locked_until < now()) \
                   /*order*/ /*pause*/ \
                   ORDER BY next_attempt_at, id LIMIT ? OFFSET ? FOR UPDATE SKIP LOCKED) c \
                 WHERE o.id = c.id \
                 RETURNING o.id, o.topic, o.msg_id, o.payload, o.attempts, o.ordering_key, o.headers, \
                 EXTRACT(EPOCH FROM now() - o.created_at)::float8, c.prev"
            )
        },
        // A claim lost in a crash only means the message is claimed
        // again: no need to wait for its WAL flush. (A lost
        // acknowledgement is recovered: the read-back sees the commit.)
        // Set in the BEGIN's round trip.
        //
        // And no JIT: the claim's cost estimate grows with the topic's
        // pending rows (the ordering guard's subquery is costed per row, the
        // LIMIT not trusted), past `jit_above_cost` from about 20,000 of
        // them, and PostgreSQL then compiles the statement on every claim:
        // 65–170 ms of compilation for a claim that runs in 1 ms
        // (`EXPLAIN ANALYZE` of a claim of 16 over 20,000 pending messages).
        begin: Some("BEGIN; SET LOCAL synchronous_commit = off; SET LOCAL jit = off"),
    },
    claim_recover: |ids| {
        format!(
            "SELECT id, topic::text, msg_id::text, payload, attempts, ordering_key::text, headers, \
             EXTRACT(EPOCH FROM now() - created_at)::float8 \
             FROM idem_outbox \
             WHERE lease_owner = ? AND status = 'pending' AND locked_until > now() AND id IN ({ids})"
        )
    },
    renew_held: "UPDATE idem_outbox SET locked_until = now() + make_interval(secs => $1::float8) \
        WHERE id = $2 AND lease_owner = $3 AND status = 'pending'",
    renew: Renew::Update(|ids| {
        format!(
            "UPDATE idem_outbox o SET locked_until = now() + make_interval(secs => ?::float8) \
             FROM (SELECT id FROM idem_outbox WHERE lease_owner = ? AND status = 'pending' \
             AND id IN ({ids}) FOR UPDATE SKIP LOCKED) c WHERE o.id = c.id \
             RETURNING o.id, o.attempts"
        )
    }),
    index_columns: None,
};

/// PostgreSQL (and standard SQL) SQLSTATEs a retry of the transaction can
/// heal.
pub(crate) fn sqlstate_is_transient(code: &str) -> bool {
    matches!(
        code,
        // serialization_failure, deadlock_detected: the transaction was
        // rolled back so that another could go on.
        "40001" | "40P01"
        // lock_not_available: NOWAIT or lock_timeout hit a held lock.
        | "55P03"
        // admin_shutdown, crash_shutdown, cannot_connect_now (starting up
        // or in recovery), idle_session_timeout: the session ended, a new
        // connection works.
        | "57P01" | "57P02" | "57P03" | "57P05"
        // too_many_connections: a slot frees up.
        | "53300"
        // read_only_sql_transaction: the server is a standby (or was
        // demoted in a failover); the promoted primary, reached by a new
        // connection, takes the write.
        | "25006"
    ) || code.starts_with("08") // connection_exception and its subclasses
}

/// SQLSTATEs of a transaction rolled back because another one won a
/// conflict (serialization_failure, deadlock_detected): an immediate retry
/// is right.
pub(crate) fn sqlstate_is_conflict(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
}

/// SQLSTATEs that mean the session itself ended (or never was): an answer
/// to `COMMIT` with one of them says nothing about whether the commit
/// happened.
pub(crate) fn sqlstate_is_connection_loss(code: &str) -> bool {
    matches!(code, "57P01" | "57P02" | "57P03" | "57P05") || code.starts_with("08")
}

/// What a PostgreSQL error means, if `db` is one of PostgreSQL's driver.
#[cfg(feature = "postgres")]
pub(crate) fn classify(db: &dyn sqlx::error::DatabaseError) -> Option<Class> {
    let pg = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
    Some(sqlstate_class(pg.code(), pg.message()))
}

/// What a SQLSTATE (and its message) means by PostgreSQL's rules: also
/// how an error of a driver idem does not know is read.
pub(crate) fn sqlstate_class(code: &str, message: &str) -> Class {
    Class {
        transient: sqlstate_is_transient(code),
        conflict: sqlstate_is_conflict(code),
        // lock_not_available
        lock_wait: code == "55P03",
        session_lost: sqlstate_is_connection_loss(code),
        pooler: pooler_fault(code, message),
    }
}

/// The errors a connection pooler in transaction mode (pgbouncer
/// `pool_mode = transaction`) causes: `26000` (`prepared statement
/// "sqlx_s_3" does not exist`) and `42P05` (`… already exists`) when
/// statements are prepared as named statements; `08P01` about a prepared
/// statement or a bind message (`bind message supplies 2 parameters, but
/// prepared statement "" requires 1`: the statement parsed on one server
/// connection, bound on another); and pgbouncer's `08P01 unsupported
/// startup parameter` (one sqlx sends on connecting, which pgbouncer
/// refuses unless listed in its `ignore_startup_parameters`).
fn pooler_fault(code: &str, message: &str) -> Option<PoolerFault> {
    match code {
        // invalid_sql_statement_name, duplicate_prepared_statement
        "26000" | "42P05" => Some(PoolerFault::Statements),
        "08P01" if message.starts_with("unsupported startup parameter") => {
            Some(PoolerFault::StartupParameter)
        }
        // protocol_violation: PostgreSQL's own answer to a Bind meant for
        // a statement prepared elsewhere (parameter or result-format count).
        "08P01" => {
            let m = message.to_ascii_lowercase();
            (m.contains("prepared statement") || m.contains("bind message"))
                .then_some(PoolerFault::Statements)
        }
        _ => None,
    }
}

/// The PostgreSQL statements of `Idempotency-Key` requests.
pub(crate) const REQUESTS: RequestSql = RequestSql {
    find: "SELECT fingerprint::text, result, \
        CAST(CASE WHEN expire_time < now() THEN 1 ELSE 0 END AS BIGINT) \
        FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2",
    insert: "INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
        VALUES ($1, $2, $3, $4, $5, now(), now() + make_interval(secs => $6::float8)) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING",
    // One round trip for a new key and for a replay alike: the row as the
    // statement's snapshot sees it (a plain read: a row that a running
    // handler's transaction holds is never waited for), and the insert
    // where there is none. A row inserted by a concurrent claim that
    // committed since is in neither: the caller's next round finds it.
    //
    // The commit does not wait for the WAL flush (`synchronous_commit` off
    // for this statement's transaction alone: the setting in force at
    // commit decides). A crash can lose an in-flight row committed so,
    // never an answer: the answer's transaction updates this row and
    // commits synchronously, and its flush takes all earlier WAL, this
    // insert's too (a standby, receiving WAL in order, likewise). A lost
    // row is a key whose request failed with the server: its retry claims
    // it anew. A new key then waits for one flush, not two.
    claim: Some(
        "WITH idem_async AS (SELECT set_config('synchronous_commit', 'off', true)), \
        idem_found AS (SELECT fingerprint::text AS fingerprint, result, \
        CAST(CASE WHEN expire_time < now() THEN 1 ELSE 0 END AS BIGINT) AS expired \
        FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2), \
        idem_claim AS (INSERT INTO idem_record \
        (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
        SELECT $1, $2, $3, $4, $5, now(), now() + make_interval(secs => $6::float8) \
        FROM idem_async WHERE NOT EXISTS (SELECT 1 FROM idem_found) \
        ON CONFLICT (idempotency_key, biz_type) DO NOTHING RETURNING 1) \
        SELECT CAST((SELECT COUNT(*) FROM idem_claim) AS BIGINT), f.fingerprint, f.result, \
        f.expired FROM (SELECT 1) AS one LEFT JOIN idem_found f ON true",
    ),
    // The claim in the handler's transaction, which the layer uses here:
    // one statement for a new key and a replay alike, and no commit of its
    // own. The row found is returned as it is (an answer replayed, a
    // lease answered 409 or taken over). Where there is none, the key's
    // transaction-scoped advisory lock is tried (never waited for) and,
    // held, the key is this request's: no row is written now. The answered
    // row is inserted by the completion (`insert`, the answer in place of
    // a lease), committing with the effects; a rollback or a crash leaves
    // nothing. An in-flight row inserted here would be seen by no other
    // transaction before the answer's commit anyway, and writing it, then
    // updating it with the answer, cost a second row version and its
    // index entries (`expire_time` is indexed: no HOT update) per new key.
    // A concurrent duplicate finds no row and the lock held: `busy` (409),
    // without waiting for the handler. The lock is the guard against a
    // second run; the unique key stays the guard against a second row: a
    // request that committed the key between this statement's snapshot
    // and its lock, or one of the other protocol (which takes no lock),
    // makes the completion's insert do nothing (the effects roll back,
    // 409, and the retry finds the answer). Two keys whose lock ids
    // collide (64 bits of a hash) at worst answer 409 to a retry. Binds
    // `$1` the key and `$2` the scope only.
    claim_in: Some(
        "WITH idem_found AS (SELECT fingerprint::text AS fingerprint, result, \
        CAST(CASE WHEN expire_time < now() THEN 1 ELSE 0 END AS BIGINT) AS expired \
        FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2), \
        idem_lock AS (SELECT pg_try_advisory_xact_lock(\
        hashtextextended(length($2) || ':' || $2 || $1, 4243)) AS got \
        WHERE NOT EXISTS (SELECT 1 FROM idem_found)) \
        SELECT CAST(CASE WHEN (SELECT got FROM idem_lock) THEN 1 ELSE 0 END AS BIGINT), \
        CAST(CASE WHEN (SELECT got FROM idem_lock) IS FALSE THEN 1 ELSE 0 END AS BIGINT), \
        f.fingerprint, f.result, f.expired FROM (SELECT 1) AS one LEFT JOIN idem_found f ON true",
    ),
    take_over: "UPDATE idem_record SET result = $1, \
        expire_time = now() + make_interval(secs => $2::float8) \
        WHERE idempotency_key = $3 AND biz_type = $4 AND result = $5 AND expire_time < now()",
    lock: Some(
        "SELECT id FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2 \
        FOR UPDATE SKIP LOCKED",
    ),
    fence: "UPDATE idem_record SET expire_time = now() + make_interval(secs => $1::float8) \
        WHERE idempotency_key = $2 AND biz_type = $3 AND result = $4",
    complete: "UPDATE idem_record SET result = $1, \
        expire_time = now() + make_interval(secs => $2::float8) \
        WHERE idempotency_key = $3 AND biz_type = $4 AND result = $5",
    // No gap locks: a row lock by the unique key locks that row alone.
    by_id: None,
    release: "DELETE FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2 AND result = $3",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_are_serialization_failures_and_deadlocks() {
        assert!(sqlstate_is_conflict("40001") && sqlstate_is_conflict("40P01"));
        for code in ["55P03", "57P01", "08006", "23505", "25006"] {
            assert!(!sqlstate_is_conflict(code), "{code}");
        }
    }

    #[test]
    fn postgres_codes() {
        for code in [
            "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "57P05", "53300", "08000",
            "08003", "08006", "08001", "08004", "08P01", "25006",
        ] {
            assert!(sqlstate_is_transient(code), "{code} should be transient");
        }
        for code in [
            "57P01", "57P02", "57P03", "57P05", "08000", "08006", "08P01",
        ] {
            assert!(sqlstate_is_connection_loss(code), "{code} ends the session");
        }
        for code in ["40001", "40P01", "25006", "23505", "57014", "53300"] {
            assert!(
                !sqlstate_is_connection_loss(code),
                "{code} leaves the session"
            );
        }
        for code in [
            "22021", "22022", "42501", "23505", "23503", "42P01", "42601", "22P02", "40002",
            "57014", "53100", "00000", "", "5", "261", "1205", "1213",
        ] {
            assert!(!sqlstate_is_transient(code), "{code} should be permanent");
        }
    }
}
