//! [`RequestStore`] for every backend.

use super::super::types::{ClaimedRow, NewRecord};
use super::super::{RequestStore, sealed::Sealed};
use super::{persist, stmt};
use sqlx::{Database, Pool, Transaction};

/// `query` bound for an in-flight row: `key, biz_type, biz_no,
/// fingerprint, lease, lease_secs`, the order of `RequestSql`'s `insert`
/// and `claim` (and of an answered row: `answer, ttl_secs` last).
macro_rules! in_flight {
    ($query:expr, $row:expr, $lease:expr) => {
        $query
            .persistent(persist())
            .bind($row.key)
            .bind($row.biz_type)
            .bind($row.biz_no)
            .bind($row.fingerprint)
            .bind($lease)
            .bind($row.ttl_secs)
    };
}

for_every_backend! {
impl RequestStore for DB {
    async fn request_find<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: &'a str,
    ) -> Result<Option<(String, Option<String>, bool)>, sqlx::Error> {
        let q = sqlx::query_as::<_, (String, Option<String>, i64)>(stmt(
            DB::dialect_of_pool(pool).requests().find,
        ))
        .persistent(persist())
        .bind(key)
        .bind(biz_type);
        let row = on_pool!(pool, |conn| q.fetch_optional(conn))?;
        Ok(row.map(|(fingerprint, result, expired)| (fingerprint, result, expired != 0)))
    }

    async fn request_insert<'a>(
        pool: &'a Pool<Self>,
        row: &'a NewRecord<'a>,
        lease: &'a str,
    ) -> Result<Option<ClaimedRow>, sqlx::Error> {
        let sql = DB::dialect_of_pool(pool).requests();
        let q = in_flight!(sqlx::query(stmt(sql.insert)), row, lease);
        let done = on_pool!(pool, |conn| q.execute(conn))?;
        if DB::rows_affected(&done) != 1 {
            return Ok(None);
        }
        let id = match sql.by_id {
            Some(_) => Some(DB::last_insert_id(&done)?),
            None => None,
        };
        Ok(Some(ClaimedRow { id, unwritten: false }))
    }

    async fn request_claim<'a>(
        pool: &'a Pool<Self>,
        row: &'a NewRecord<'a>,
        lease: &'a str,
    ) -> Result<Result<ClaimedRow, Option<(String, Option<String>, bool)>>, sqlx::Error> {
        let sql = DB::dialect_of_pool(pool).requests();
        let Some(claim) = sql.claim else {
            if let Some(found) = DB::request_find(pool, row.key, row.biz_type).await? {
                return Ok(Err(Some(found)));
            }
            return Ok(DB::request_insert(pool, row, lease).await?.ok_or(None));
        };
        type Answer = (i64, Option<String>, Option<String>, Option<i64>);
        let q = in_flight!(sqlx::query_as::<_, Answer>(stmt(claim)), row, lease);
        let (claimed, fingerprint, result, expired) = on_pool!(pool, |conn| q.fetch_one(conn))?;
        Ok(match (claimed, fingerprint) {
            // A dialect with a one-statement claim fences by key (no ids).
            (1, _) if sql.by_id.is_none() => Ok(ClaimedRow { id: None, unwritten: false }),
            (1, _) => return Err(sqlx::Error::Protocol("a claim statement where rows are fenced by id".into())),
            (_, Some(fp)) => Err(Some((fp, result, expired.unwrap_or(0) != 0))),
            (_, None) => Err(None),
        })
    }

    async fn request_claim_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        row: &'a NewRecord<'a>,
    ) -> Result<Option<Result<ClaimedRow, (bool, Option<(String, Option<String>, bool)>)>>, sqlx::Error> {
        let sql = DB::dialect_of_tx(tx).requests();
        let Some(claim) = sql.claim_in else {
            return Ok(None);
        };
        type Answer = (i64, i64, Option<String>, Option<String>, Option<i64>);
        let q = sqlx::query_as::<_, Answer>(stmt(claim))
            .persistent(persist())
            .bind(row.key)
            .bind(row.biz_type);
        let (claimed, busy, fingerprint, result, expired) = q.fetch_one(&mut **tx).await?;
        Ok(Some(match (claimed, fingerprint) {
            // A dialect that claims in the transaction fences by key.
            (1, _) if sql.by_id.is_none() => Ok(ClaimedRow { id: None, unwritten: true }),
            (1, _) => return Err(sqlx::Error::Protocol("a claim statement where rows are fenced by id".into())),
            (_, Some(fp)) => Err((false, Some((fp, result, expired.unwrap_or(0) != 0)))),
            (_, None) => Err((busy != 0, None)),
        }))
    }

    async fn request_take_over_in<'a>(
        tx: &'a mut Transaction<'_, Self>,
        key: &'a str,
        biz_type: &'a str,
        old: &'a str,
        lease: &'a str,
        lease_secs: i64,
    ) -> Result<Option<ClaimedRow>, sqlx::Error> {
        let sql = DB::dialect_of_tx(tx).requests();
        // The row locked first: a row that a running handler's transaction
        // holds is skipped (`None`: the caller answers 409), where the
        // UPDATE alone would wait for that transaction.
        let mut id = None;
        if let Some(lock) = sql.lock {
            let row: Option<i64> = sqlx::query_scalar(stmt(lock))
                .persistent(persist())
                .bind(key)
                .bind(biz_type)
                .fetch_optional(&mut **tx)
                .await?;
            let Some(locked) = row else {
                return Ok(None);
            };
            id = sql.by_id.map(|_| locked);
        }
        let done = sqlx::query(stmt(sql.take_over))
            .persistent(persist())
            .bind(lease)
            .bind(lease_secs)
            .bind(key)
            .bind(biz_type)
            .bind(old)
            .execute(&mut **tx)
            .await?;
        Ok((DB::rows_affected(&done) == 1).then_some(ClaimedRow { id, unwritten: false }))
    }

    async fn request_fence<'a>(
        tx: &'a mut Transaction<'_, Self>,
        row: ClaimedRow,
        key: &'a str,
        biz_type: &'a str,
        lease: &'a str,
        lease_secs: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = DB::dialect_of_tx(tx).requests();
        let q = match (sql.by_id, row.id) {
            (Some((fence, _)), Some(id)) => sqlx::query(stmt(fence)).bind(lease_secs).bind(id),
            _ => sqlx::query(stmt(sql.fence)).bind(lease_secs).bind(key).bind(biz_type),
        };
        let done = q.persistent(persist()).bind(lease).execute(&mut **tx).await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn request_complete<'a>(
        tx: &'a mut Transaction<'_, Self>,
        row: ClaimedRow,
        record: &'a NewRecord<'a>,
        lease: &'a str,
        answer: &'a str,
        ttl_secs: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = DB::dialect_of_tx(tx).requests();
        if row.unwritten {
            // Claimed in this transaction, no row yet: the answered row,
            // unless the key has one (a request that committed it since
            // the claim; nothing is inserted, and the caller rolls back).
            let answered = NewRecord { ttl_secs, ..*record };
            let q = in_flight!(sqlx::query(stmt(sql.insert)), answered, answer);
            let done = q.execute(&mut **tx).await?;
            return Ok(DB::rows_affected(&done) == 1);
        }
        let (key, biz_type) = (record.key, record.biz_type);
        let q = match (sql.by_id, row.id) {
            (Some((_, complete)), Some(id)) => {
                sqlx::query(stmt(complete)).bind(answer).bind(ttl_secs).bind(id)
            }
            _ => sqlx::query(stmt(sql.complete)).bind(answer).bind(ttl_secs).bind(key).bind(biz_type),
        };
        let done = q.persistent(persist()).bind(lease).execute(&mut **tx).await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn request_release<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: &'a str,
        lease: &'a str,
    ) -> Result<bool, sqlx::Error> {
        let q = sqlx::query(stmt(DB::dialect_of_pool(pool).requests().release))
            .persistent(persist())
            .bind(key)
            .bind(biz_type)
            .bind(lease);
        let done = on_pool!(pool, |conn| q.execute(conn))?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
}
