//! [`OutboxStore`] for every backend: enqueue, claim, lease, settle and
//! read back outbox messages, with the dialect's statements.

use super::super::sql::{Claim, InsertId, Renew, marks};
use super::super::types::{
    ClaimError, Claimed, NewMessage, OutboxInsert, OutboxRow, OutboxState, ProcessRow,
};
use super::super::{ClaimSql, OutboxStore, sealed::Sealed};
use super::{begin, persist, sql_of, stmt};
use crate::lease::OutboxLease;
use crate::status::Status;
use sqlx::{Database, Pool, Transaction};

/// The failure bookkeeping's statement (see
/// [`OutboxStore::outbox_settle_failure`]), bound: over a pending row this
/// attempt holds, or (`over_success`) over this attempt's own `success`.
macro_rules! settle_query {
    ($sql:expr, $over_success:expr, $id:expr, $owner:expr, $attempt:expr, $dead:expr, $delay_secs:expr, $error:expr) => {{
        let sql = $sql;
        let text = if $over_success {
            sql.outbox_revert
        } else {
            sql.outbox_settle
        };
        let q = sqlx::query(stmt(text)).persistent(persist()).bind(
            if $dead {
                Status::Failed
            } else {
                Status::Pending
            }
            .as_str(),
        );
        bind_secs!(q, sql, $delay_secs)
            .bind($error)
            .bind($id)
            .bind($owner)
            .bind($attempt)
    }};
}

/// Writes the attempt log's row of a failed attempt whose settle applied
/// in `tx` (outcome `dead` or `retry`, the error as `last_error` holds it,
/// the lease owner as the actor), and cuts the message's log to its
/// [`ATTEMPT_LOG_MAX`](crate::outbox::ATTEMPT_LOG_MAX) newest rows: in
/// the settle's transaction, so both commit or neither does.
async fn log_attempt<DB>(
    tx: &mut Transaction<'_, DB>,
    id: i64,
    attempt: i32,
    dead: bool,
    error: &str,
    owner: &str,
) -> Result<(), sqlx::Error>
where
    DB: Sealed,
    for<'c> &'c mut <DB as Database>::Connection: sqlx::Executor<'c, Database = DB>,
    <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
    str: sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB>,
    i64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB>,
    i32: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB>,
{
    let sql = sql_of(tx);
    let outcome = if dead { "dead" } else { "retry" };
    sqlx::query(stmt(sql.attempt_log))
        .persistent(persist())
        .bind(id)
        .bind(attempt)
        .bind(outcome)
        .bind(error)
        .bind(owner)
        .execute(&mut **tx)
        .await?;
    let kept = i64::try_from(crate::outbox::ATTEMPT_LOG_MAX).unwrap_or(i64::MAX);
    sqlx::query(stmt(sql.attempt_trim))
        .persistent(persist())
        .bind(id)
        .bind(id)
        .bind(kept - 1)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A row as read back: id, topic, msg_id, payload, attempts, ordering
/// key, headers, its age in seconds (the database's now minus its
/// `created_at`).
type RowTuple = (
    i64,
    String,
    String,
    String,
    i32,
    Option<String>,
    Option<String>,
    f64,
);

/// A claimed row and its lease owner before the claim.
type ClaimTuple = (
    i64,
    String,
    String,
    String,
    i32,
    Option<String>,
    Option<String>,
    f64,
    Option<String>,
);

/// `outbox_state`'s columns: topic, status, lease owner, attempts.
type StateRow = (String, String, Option<String>, i32);

/// A state row, or a decoding error for a status the schema does not know.
fn to_state((topic, status, lease_owner, attempts): StateRow) -> Result<OutboxState, sqlx::Error> {
    let status = Status::parse(&status).ok_or_else(|| {
        sqlx::Error::Decode(
            format!("unknown outbox status `{status}` (not pending, success or failed)").into(),
        )
    })?;
    Ok(OutboxState {
        topic,
        status,
        lease_owner,
        attempts,
    })
}

fn to_row(
    (id, topic, msg_id, payload, attempts, ordering_key, headers, age): RowTuple,
) -> OutboxRow {
    OutboxRow {
        // A clock stepped back between the insert and the claim: no age.
        age: std::time::Duration::try_from_secs_f64(age).unwrap_or_default(),
        claimed_at: std::time::Instant::now(),
        headers: crate::outbox::headers_of(id, headers.as_deref()),
        id,
        topic,
        msg_id,
        payload,
        attempts,
        ordering_key,
    }
}

/// A claimed row's lease owner before the claim, and the row.
fn split_claimed(
    (id, topic, msg_id, payload, attempts, key, headers, age, prev): ClaimTuple,
) -> (Option<String>, OutboxRow) {
    (
        prev,
        to_row((id, topic, msg_id, payload, attempts, key, headers, age)),
    )
}

for_every_backend! {
impl OutboxStore for DB {
    async fn outbox_insert<'a>(
        conn: &'a mut Self::Connection,
        m: &'a NewMessage<'a>,
        notify: bool,
    ) -> Result<OutboxInsert, sqlx::Error> {
        let sql = DB::dialect_of_conn(conn).sql();
        if let (Some(key), Some(lock)) = (m.ordering_key, sql.outbox_order_lock) {
            sqlx::query(stmt(lock)).persistent(persist()).bind(key).execute(&mut *conn).await?;
        }
        let insert = match sql.outbox_insert_notify {
            Some(with_notify) if notify => with_notify,
            _ => sql.outbox_insert,
        };
        macro_rules! bound {
            ($q:expr) => {{
                let q = $q
                    .persistent(persist())
                    .bind(m.topic)
                    .bind(m.msg_id)
                    .bind(m.payload)
                    .bind(m.ordering_key)
                    .bind(m.headers);
                bind_secs!(q, sql, m.delay_secs)
            }};
        }
        let new = match sql.insert_id {
            InsertId::Returning => {
                bound!(sqlx::query_scalar(stmt(insert))).fetch_optional(&mut *conn).await?
            }
            InsertId::LastInsertId => {
                let done = bound!(sqlx::query(stmt(insert))).execute(&mut *conn).await?;
                match DB::rows_affected(&done) {
                    0 => None,
                    _ => Some(DB::last_insert_id(&done)?),
                }
            }
        };
        if let Some(id) = new {
            return Ok(OutboxInsert::New(id));
        }
        let found: Option<(i64, String)> = sqlx::query_as(stmt(sql.outbox_find))
            .persistent(persist())
            .bind(m.topic)
            .bind(m.msg_id)
            .fetch_optional(conn)
            .await?;
        Ok(match found {
            Some((id, payload)) => OutboxInsert::Existing { id, payload },
            None => OutboxInsert::Missing,
        })
    }

    async fn outbox_success<'a>(
        tx: &'a mut Transaction<'_, Self>,
        lease: &'a OutboxLease,
    ) -> Result<u64, sqlx::Error> {
        Ok(DB::rows_affected(&sqlx::query(stmt(sql_of(tx).outbox_success))
            .persistent(persist())
            .bind(lease.id)
            .bind(lease.topic.as_str())
            .bind(lease.owner.as_str())
            .bind(lease.attempt)
            .execute(&mut **tx)
            .await?))
    }

    async fn outbox_success_pool<'a>(
        pool: &'a Pool<Self>,
        lease: &'a OutboxLease,
    ) -> Result<u64, sqlx::Error> {
        let q = sqlx::query(stmt(DB::dialect_of_pool(pool).sql().outbox_success))
            .persistent(persist())
            .bind(lease.id)
            .bind(lease.topic.as_str())
            .bind(lease.owner.as_str())
            .bind(lease.attempt);
        let done = on_pool!(pool, |conn| q.execute(conn));
        let done = crate::probe::after_commit(crate::probe::Commit::Success, done);
        Ok(DB::rows_affected(&done?))
    }

    async fn outbox_state(
        tx: &mut Transaction<'_, Self>,
        id: i64,
    ) -> Result<Option<OutboxState>, sqlx::Error> {
        let row: Option<StateRow> = sqlx::query_as(stmt(sql_of(tx).outbox_state))
            .persistent(persist())
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
        row.map(to_state).transpose()
    }

    async fn outbox_state_pool(
        pool: &Pool<Self>,
        id: i64,
    ) -> Result<Option<OutboxState>, sqlx::Error> {
        let q = sqlx::query_as(stmt(DB::dialect_of_pool(pool).sql().outbox_state))
            .persistent(persist())
            .bind(id);
        let row: Option<StateRow> = on_pool!(pool, |conn| q.fetch_optional(conn))?;
        row.map(to_state).transpose()
    }

    async fn next_due<'a>(
        pool: &'a Pool<Self>,
        next_due: &'a str,
        topics: &'a [String],
    ) -> Result<Option<f64>, sqlx::Error> {
        let mut q = sqlx::query_scalar::<_, Option<f64>>(sqlx::AssertSqlSafe(next_due))
            .persistent(persist());
        for t in topics {
            q = q.bind(t.as_str());
        }
        on_pool!(pool, |conn| q.fetch_one(conn))
    }

    async fn claim_outbox<'a>(
        pool: &'a Pool<Self>,
        claim: &'a ClaimSql,
        owner: &'a str,
        topics: &'a [String],
        limit: i64,
        offset: i64,
        lease_secs: f64,
    ) -> Result<Claimed, ClaimError> {
        // The claim's own BEGIN where its dialect has one (its settings in
        // the same round trip), the dialect's otherwise.
        let pool_sql = DB::dialect_of_pool(pool).sql();
        let opening = match &pool_sql.claim {
            Claim::Returning { begin: Some(b), .. } => Some(*b),
            _ => pool_sql.begin,
        };
        let mut tx = crate::tx::begin(pool, opening).await.map_err(ClaimError::Failed)?;
        let sql = sql_of(&tx);
        let chosen: Vec<ClaimTuple> = match &sql.claim {
            Claim::LockThenLease { lease, lock, .. } => {
                let mut rows = match lock {
                    None => {
                        let mut q =
                            sqlx::query_as::<_, ClaimTuple>(sqlx::AssertSqlSafe(claim.claim.as_str()))
                                .persistent(persist());
                        for t in topics {
                            q = q.bind(t.as_str());
                        }
                        q.bind(limit).bind(offset).fetch_all(&mut *tx).await.map_err(ClaimError::Failed)?
                    }
                    Some(lock) => {
                        let mut q =
                            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(claim.claim.as_str()))
                                .persistent(persist());
                        for t in topics {
                            q = q.bind(t.as_str());
                        }
                        let ids = q.bind(limit).bind(offset).fetch_all(&mut *tx).await.map_err(ClaimError::Failed)?;
                        if ids.is_empty() {
                            Vec::new()
                        } else {
                            let text = sql.render(&lock(&marks(ids.len())));
                            let mut q = sqlx::query_as::<_, ClaimTuple>(sqlx::AssertSqlSafe(text))
                                .persistent(persist());
                            for id in &ids {
                                q = q.bind(*id);
                            }
                            q.fetch_all(&mut *tx).await.map_err(ClaimError::Failed)?
                        }
                    }
                };
                if !rows.is_empty() {
                    let text = sql.render(&lease(&marks(rows.len())));
                    let q = sqlx::query(sqlx::AssertSqlSafe(text))
                        .persistent(persist())
                        .bind(owner);
                    let mut q = bind_secs!(q, sql, lease_secs);
                    for r in &rows {
                        q = q.bind(r.0);
                    }
                    q.execute(&mut *tx).await.map_err(ClaimError::Failed)?;
                    for r in &mut rows {
                        r.4 += 1;
                    }
                }
                rows
            }
            Claim::Returning { .. } => {
                let mut q =
                    sqlx::query_as::<_, ClaimTuple>(sqlx::AssertSqlSafe(claim.claim.as_str()))
                        .persistent(persist())
                        .bind(owner)
                        .bind(lease_secs);
                for t in topics {
                    q = q.bind(t.as_str());
                }
                q.bind(limit).bind(offset).fetch_all(&mut *tx).await.map_err(ClaimError::Failed)?
            }
        };
        let chosen: Vec<(Option<String>, OutboxRow)> = chosen.into_iter().map(split_claimed).collect();
        let claimed = Claimed {
            reclaimed: chosen.iter().filter(|(prev, _)| prev.is_some()).count(),
            rows: chosen.into_iter().map(|(_, row)| row).collect(),
        };
        let committed = tx.commit().await;
        let committed = crate::probe::after_commit(crate::probe::Commit::Claim, committed);
        match committed {
            Ok(()) => Ok(claimed),
            Err(e) if !crate::backend::classify::commit_outcome_unknown(&e) => Err(ClaimError::Failed(e)),
            // Nothing chosen, nothing leased: whatever the outcome.
            Err(e) if claimed.rows.is_empty() => Err(ClaimError::Failed(e)),
            Err(error) => Err(ClaimError::CommitUnknown { error, chosen: claimed }),
        }
    }

    async fn recover_claim<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        ids: &'a [i64],
    ) -> Result<Vec<OutboxRow>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = DB::dialect_of_pool(pool).sql();
        let text = sql.render(&(sql.claim_recover)(&marks(ids.len())));
        let mut q = sqlx::query_as::<_, RowTuple>(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(owner);
        for id in ids {
            q = q.bind(*id);
        }
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        Ok(rows.into_iter().map(to_row).collect())
    }

    async fn renew_leases<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        ids: &'a [i64],
        lease_secs: f64,
    ) -> Result<u64, sqlx::Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut tx = begin(pool).await?;
        let renewed = Self::renew_leases_in(&mut tx, owner, ids, lease_secs).await?.len() as u64;
        let committed = tx.commit().await;
        let committed = crate::probe::after_commit(crate::probe::Commit::Renew, committed);
        committed?;
        Ok(renewed)
    }

    async fn renew_held<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
        id: i64,
        lease_secs: f64,
    ) -> Result<bool, sqlx::Error> {
        let sql = DB::dialect_of_pool(pool).sql();
        let q = sqlx::query(stmt(sql.renew_held)).persistent(persist());
        let q = bind_secs!(q, sql, lease_secs).bind(id).bind(owner);
        let done = on_pool!(pool, |conn| q.execute(conn))?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn renew_leases_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        owner: &'a str,
        ids: &'a [i64],
        lease_secs: f64,
    ) -> Result<Vec<(i64, i32)>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = sql_of(tx);
        let renewed = match &sql.renew {
            Renew::LockThenUpdate { lock, update } => {
                let text = sql.render(&lock(&marks(ids.len())));
                let mut q = sqlx::query_as::<_, (i64, i32)>(sqlx::AssertSqlSafe(text))
                    .persistent(persist())
                    .bind(owner);
                for id in ids {
                    q = q.bind(*id);
                }
                let free: Vec<(i64, i32)> = q.fetch_all(&mut **tx).await?;
                if !free.is_empty() {
                    let text = sql.render(&update(&marks(free.len())));
                    let q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist());
                    let mut q = bind_secs!(q, sql, lease_secs);
                    for (id, _) in &free {
                        q = q.bind(*id);
                    }
                    q.execute(&mut **tx).await?;
                }
                free
            }
            Renew::Update(update) => {
                let text = sql.render(&update(&marks(ids.len())));
                let q = sqlx::query_as::<_, (i64, i32)>(sqlx::AssertSqlSafe(text))
                    .persistent(persist());
                let mut q = bind_secs!(q, sql, lease_secs).bind(owner);
                for id in ids {
                    q = q.bind(*id);
                }
                q.fetch_all(&mut **tx).await?
            }
        };
        Ok(renewed)
    }

    async fn outbox_success_batch<'a>(
        tx: &'a mut Transaction<'_, Self>,
        owner: &'a str,
        ids: &'a [i64],
    ) -> Result<u64, sqlx::Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let sql = sql_of(tx);
        let text = sql.render(&(sql.outbox_success_batch)(&marks(ids.len())));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(owner);
        for id in ids {
            q = q.bind(*id);
        }
        Ok(DB::rows_affected(&q.execute(&mut **tx).await?))
    }

    async fn outbox_settle_failure<'a>(
        pool: &'a Pool<Self>,
        over_success: bool,
        id: i64,
        owner: &'a str,
        attempt: i32,
        dead: bool,
        delay_secs: f64,
        error: &'a str,
    ) -> Result<bool, sqlx::Error> {
        // The settle and its attempt log's row in one transaction.
        let mut tx = begin(pool).await?;
        let applied = Self::outbox_settle_failure_in(
            &mut tx,
            over_success,
            id,
            owner,
            attempt,
            dead,
            delay_secs,
            error,
        )
        .await?;
        let committed = tx.commit().await;
        crate::probe::after_commit(crate::probe::Commit::Settle, committed)?;
        Ok(applied)
    }

    async fn outbox_release<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        owner: &'a str,
        attempt: i32,
        delay_secs: f64,
        error: &'a str,
    ) -> Result<bool, sqlx::Error> {
        let sql = DB::dialect_of_pool(pool).sql();
        let q = sqlx::query(stmt(sql.outbox_release))
            .persistent(persist())
            .bind(Status::Pending.as_str());
        let q = bind_secs!(q, sql, delay_secs)
            .bind(error)
            .bind(id)
            .bind(owner)
            .bind(attempt);
        let done = on_pool!(pool, |conn| q.execute(conn));
        let done = crate::probe::after_commit(crate::probe::Commit::Settle, done);
        Ok(DB::rows_affected(&done?) == 1)
    }

    async fn outbox_uncount<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        owner: &'a str,
        attempt: i32,
    ) -> Result<bool, sqlx::Error> {
        let sql = DB::dialect_of_pool(pool).sql();
        let q = sqlx::query(stmt(sql.outbox_uncount))
            .persistent(persist())
            .bind(id)
            .bind(owner)
            .bind(attempt);
        let done = on_pool!(pool, |conn| q.execute(conn));
        let done = crate::probe::after_commit(crate::probe::Commit::Settle, done);
        Ok(DB::rows_affected(&done?) == 1)
    }

    async fn outbox_settle_failure_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        over_success: bool,
        id: i64,
        owner: &'a str,
        attempt: i32,
        dead: bool,
        delay_secs: f64,
        error: &'a str,
    ) -> Result<bool, sqlx::Error> {
        let q = settle_query!(
            sql_of(tx),
            over_success,
            id,
            owner,
            attempt,
            dead,
            delay_secs,
            error
        );
        let applied = DB::rows_affected(&q.execute(&mut **tx).await?) == 1;
        // A settle whose lease was lost writes nothing: no attempt either.
        if applied {
            log_attempt(tx, id, attempt, dead, error, owner).await?;
        }
        Ok(applied)
    }

    async fn process_beat<'a>(
        pool: &'a Pool<Self>,
        row: &'a ProcessRow<'a>,
    ) -> Result<(), sqlx::Error> {
        let q = sqlx::query(stmt(DB::dialect_of_pool(pool).sql().process_beat))
            .persistent(persist())
            .bind(row.id)
            .bind(row.kind)
            .bind(row.name)
            .bind(row.host)
            .bind(row.pid);
        on_pool!(pool, |conn| q.execute(conn))?;
        Ok(())
    }

    async fn process_end<'a>(pool: &'a Pool<Self>, id: &'a str) -> Result<bool, sqlx::Error> {
        let q = sqlx::query(stmt(DB::dialect_of_pool(pool).sql().process_end))
            .persistent(persist())
            .bind(id);
        let done = on_pool!(pool, |conn| q.execute(conn))?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
}
