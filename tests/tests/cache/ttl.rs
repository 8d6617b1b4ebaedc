//! The front cache's marker never outlives its record, against the real
//! Redis and the three databases: a `record` marker's TTL is the least of
//! the cache's TTL and what is left of its record's ttl, read from the
//! record in the call's transaction; a call answered `Duplicate` by a
//! record already expired writes no marker; once the record is gone
//! (archived), the same key through the cache executes again. A relay
//! batch's deferred markers carry the same bound; a `state_machine`
//! marker keeps the cache's TTL. Effects are counted in the database,
//! marker TTLs read from Redis (`PTTL`).
//!
//! The record's expiry is moved to the past with an `UPDATE` (never by
//! sleeping), and archiving is the archiver's `DELETE` of that one row
//! (an [`Archiver`](idem_runtime::archive::Archiver) would move every
//! expired record of the shared test database).

use crate::common::coupons::CouponState;
use idem_runtime::Dialect;
use idem_runtime::cache::RedisCache;
use idem_runtime::outbox::Relay;
use idem_runtime::{Outcome, Source, idempotent};
use idem_testkit::{ids, redis_get, redis_up, sql};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The cache's TTL: far longer than any record's here.
const CACHE_TTL: Duration = Duration::from_secs(3600);
/// The records' ttl (`ttl = "2s"` below), in milliseconds.
const RECORD_TTL_MS: i64 = 2000;
/// Whole milliseconds on both sides of a comparison of TTLs (see
/// `assert_bounded`).
const ROUNDING_MS: i64 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Remind {
    id: i64,
    /// The body moves its own record's expiry to the past, in the call's
    /// transaction: the marker must follow the record as written there.
    expire_in_body: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: i64,
}

fn cache() -> RedisCache {
    RedisCache::new(&idem_testkit::redis_url())
        .unwrap()
        .prefix(format!("idem-test:{}:", ids(1)))
        .ttl(CACHE_TTL)
}

/// One command to the test Redis, answered by an integer (`PTTL`): the
/// test crate speaks RESP itself rather than depend on a Redis client.
async fn redis_int(args: &[&str]) -> i64 {
    let url = idem_testkit::redis_url();
    let rest = url.strip_prefix("redis://").expect("a redis:// URL");
    let (addr, db) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = addr.rsplit('@').next().unwrap_or(addr);
    let stream = tokio::net::TcpStream::connect(addr).await.expect("redis");
    let mut stream = BufReader::new(stream);
    let mut send = Vec::new();
    let mut command = |args: &[&str]| {
        send.extend(format!("*{}\r\n", args.len()).into_bytes());
        for a in args {
            send.extend(format!("${}\r\n{a}\r\n", a.len()).into_bytes());
        }
    };
    let select = !db.is_empty() && db != "0";
    if select {
        command(&["SELECT", db]);
    }
    command(args);
    stream.get_mut().write_all(&send).await.expect("send");
    let mut line = String::new();
    if select {
        stream.read_line(&mut line).await.expect("SELECT");
        assert_eq!(line.trim_end(), "+OK", "SELECT {db}");
        line.clear();
    }
    stream.read_line(&mut line).await.expect("answer");
    let n = line.trim_end().strip_prefix(':');
    n.and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{args:?}: {line:?}"))
}

/// The marker's remaining TTL in milliseconds (`-2`: no marker).
async fn pttl(key: &str) -> i64 {
    redis_int(&["PTTL", key]).await
}

macro_rules! cache_ttl_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;
            const BIZ: &str = "cache_ttl_remind";

            async fn pool() -> Option<Pool<Db>> {
                if !redis_up().await {
                    return None;
                }
                let pool: Pool<Db> = $pool?;
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77031)")
                        .execute(&mut *tx)
                        .await
                        .expect("lock");
                }
                for stmt in [
                    "CREATE TABLE IF NOT EXISTS idem_ct_effect (id BIGINT NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_ct_coupon \
                     (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                ] {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create table");
                }
                tx.commit().await.expect("commit");
                Some(pool)
            }

            fn key(id: i64) -> String {
                format!("cache-ttl:{id}")
            }

            // The payload is the id alone: a retry with `expire_in_body` off is the
            // same call.
            #[idempotent(key = "cache-ttl:{n.id}", strategy = record, biz_type = "cache_ttl_remind", ttl = "2s", fingerprint = [n.id])]
            async fn remind(tx: &mut Transaction<'_, Db>, n: &Remind) -> Result<Receipt, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_ct_effect (id) VALUES (?)"))
                    .bind(n.id)
                    .execute(&mut **tx)
                    .await?;
                if n.expire_in_body {
                    sqlx::query(sql(D, expire_sql()))
                        .bind(key(n.id))
                        .bind(BIZ)
                        .execute(&mut **tx)
                        .await?;
                }
                Ok(Receipt { id: n.id })
            }

            #[idempotent(
                key = "cache-ttl-coupon:{id}",
                strategy = state_machine,
                table = "idem_ct_coupon",
                id = id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn consume(tx: &mut Transaction<'_, Db>, id: i64) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_ct_effect (id) VALUES (?)"))
                    .bind(id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// Moves a record's expiry an hour into the past (its
            /// creation two: `expire_time > create_time` holds).
            fn expire_sql() -> &'static str {
                match D {
                    Dialect::Postgres => "UPDATE idem_record SET create_time = now() - interval '2 hours', \
                        expire_time = now() - interval '1 hour' WHERE idempotency_key = ? AND biz_type = ?",
                    Dialect::MySql => "UPDATE idem_record SET create_time = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 2 HOUR), \
                        expire_time = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 HOUR) WHERE idempotency_key = ? AND biz_type = ?",
                    Dialect::Sqlite => "UPDATE idem_record SET create_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 hours'), \
                        expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hours') WHERE idempotency_key = ? AND biz_type = ?",
                }
            }

            async fn expire(pool: &Pool<Db>, id: i64) {
                let done = sqlx::query(sql(D, expire_sql()))
                    .bind(key(id))
                    .bind(BIZ)
                    .execute(pool)
                    .await
                    .unwrap();
                assert_eq!(done.rows_affected(), 1, "one record expired");
            }

            /// What the archiver does to an expired record: it leaves
            /// `idem_record`, and its key is free again.
            async fn archive(pool: &Pool<Db>, id: i64) {
                let gone = match D {
                    Dialect::Postgres => "DELETE FROM idem_record WHERE idempotency_key = ? AND biz_type = ? AND expire_time < now()",
                    Dialect::MySql => "DELETE FROM idem_record WHERE idempotency_key = ? AND biz_type = ? AND expire_time < UTC_TIMESTAMP(6)",
                    Dialect::Sqlite => "DELETE FROM idem_record WHERE idempotency_key = ? AND biz_type = ? \
                        AND expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now')",
                };
                let done = sqlx::query(sql(D, gone))
                    .bind(key(id))
                    .bind(BIZ)
                    .execute(pool)
                    .await
                    .unwrap();
                assert_eq!(done.rows_affected(), 1, "the expired record archived");
            }

            /// The record's remaining ttl in milliseconds, by the
            /// database's clock.
            async fn record_ttl_left(pool: &Pool<Db>, id: i64) -> i64 {
                let left = match D {
                    Dialect::Postgres => "SELECT CAST(EXTRACT(EPOCH FROM (expire_time - clock_timestamp())) * 1000 AS BIGINT) \
                        FROM idem_record WHERE idempotency_key = ? AND biz_type = ?",
                    Dialect::MySql => "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expire_time) DIV 1000 AS SIGNED) \
                        FROM idem_record WHERE idempotency_key = ? AND biz_type = ?",
                    Dialect::Sqlite => "SELECT CAST((julianday(expire_time) - julianday('now')) * 86400000 AS INTEGER) \
                        FROM idem_record WHERE idempotency_key = ? AND biz_type = ?",
                };
                sqlx::query_scalar(sql(D, left))
                    .bind(key(id))
                    .bind(BIZ)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn effects(pool: &Pool<Db>, id: i64) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_ct_effect WHERE id = ?"))
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            /// The marker's TTL is at most what is left of the record's
            /// (read first: the marker's can only have shrunk since), give
            /// or take the rounding to whole milliseconds: the database's
            /// figure is rounded down (at most 1 ms under), Redis's `PTTL`
            /// counts from its clock rounded down (at most 1 ms over).
            async fn assert_bounded(pool: &Pool<Db>, cache: &RedisCache, id: i64) {
                let left = record_ttl_left(pool, id).await;
                let marker = pttl(&cache.marker_key(BIZ, &key(id))).await;
                eprintln!("{}: record ttl left {left} ms, marker PTTL {marker} ms", stringify!($module));
                assert!(left > 0 && left <= RECORD_TTL_MS, "record ttl left: {left} ms");
                assert!(marker > 0, "a marker with a TTL, got PTTL {marker}");
                assert!(
                    marker <= left + ROUNDING_MS,
                    "the marker (PTTL {marker} ms) outlives its record ({left} ms left)"
                );
            }

            #[tokio::test]
            async fn a_record_marker_lives_no_longer_than_its_record() {
                let Some(pool) = pool().await else { return };
                let cache = cache();
                let n = Remind { id: ids(1), expire_in_body: false };
                let first = remind(Source::from(&pool).cache(&cache), &n).await.unwrap();
                assert_eq!(first, Outcome::Executed(Receipt { id: n.id }));
                assert_bounded(&pool, &cache, n.id).await;
                // The marker still answers while it lives.
                let again = remind(Source::from(&pool).cache(&cache), &n).await.unwrap();
                assert_eq!(again, Outcome::Duplicate(Some(Receipt { id: n.id })));
                assert_eq!(cache.stats().hits(), 1);
                assert_eq!(effects(&pool, n.id).await, 1);
            }

            #[tokio::test]
            async fn a_record_expired_in_its_own_transaction_leaves_no_marker() {
                let Some(pool) = pool().await else { return };
                let cache = cache();
                let n = Remind { id: ids(1), expire_in_body: true };
                let src = || Source::from(&pool).cache(&cache);
                assert!(remind(src(), &n).await.unwrap().is_executed());
                let marker = redis_get(&cache.marker_key(BIZ, &key(n.id))).await;
                // The record archived, the key is free: the same key
                // through the cache executes again.
                archive(&pool, n.id).await;
                let n = Remind { expire_in_body: false, ..n };
                let again = remind(src(), &n).await.unwrap();
                assert!(again.is_executed(), "executed again, got {again:?} (marker {marker:?})");
                assert_eq!(effects(&pool, n.id).await, 2);
                assert_eq!(marker, None, "a marker for a record that expired as it was written");
                assert_bounded(&pool, &cache, n.id).await;
            }

            #[tokio::test]
            async fn a_duplicate_of_an_expired_record_writes_no_marker() {
                let Some(pool) = pool().await else { return };
                let cache = cache();
                let n = Remind { id: ids(1), expire_in_body: false };
                let src = || Source::from(&pool).cache(&cache);
                // The first call without the cache: no marker yet.
                assert!(remind(&pool, &n).await.unwrap().is_executed());
                expire(&pool, n.id).await;
                // Expired, not archived: the database still answers
                // Duplicate, and the cache must not be re-warmed with it.
                let dup = remind(src(), &n).await.unwrap();
                assert_eq!(dup, Outcome::Duplicate(Some(Receipt { id: n.id })));
                let marker = pttl(&cache.marker_key(BIZ, &key(n.id))).await;
                // Archived: the same key through the cache executes again.
                archive(&pool, n.id).await;
                let again = remind(src(), &n).await.unwrap();
                assert!(again.is_executed(), "executed again, got {again:?} (marker PTTL {marker} ms)");
                assert_eq!(effects(&pool, n.id).await, 2);
                assert_eq!(marker, -2, "a marker re-warmed from an expired record");
            }

            #[tokio::test]
            async fn a_duplicate_re_warms_the_cache_within_the_record_ttl() {
                let Some(pool) = pool().await else { return };
                let cache = cache();
                let n = Remind { id: ids(1), expire_in_body: false };
                assert!(remind(&pool, &n).await.unwrap().is_executed());
                let dup = remind(Source::from(&pool).cache(&cache), &n).await.unwrap();
                assert_eq!(dup, Outcome::Duplicate(Some(Receipt { id: n.id })));
                assert_bounded(&pool, &cache, n.id).await;
                assert_eq!(effects(&pool, n.id).await, 1);
            }

            #[tokio::test]
            async fn a_state_machine_marker_keeps_the_cache_ttl() {
                let Some(pool) = pool().await else { return };
                let cache = cache();
                let id = ids(1);
                sqlx::query(sql(D, "INSERT INTO idem_ct_coupon (id, status) VALUES (?, 'UNUSED')"))
                    .bind(id)
                    .execute(&pool)
                    .await
                    .unwrap();
                assert!(consume(Source::from(&pool).cache(&cache), id).await.unwrap().is_executed());
                let marker = pttl(&cache.marker_key("consume", &format!("cache-ttl-coupon:{id}"))).await;
                let floor = (CACHE_TTL - Duration::from_secs(60)).as_millis() as i64;
                assert!(marker > floor, "the cache's TTL, got PTTL {marker} ms");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_batch_defers_bounded_markers() {
                let Some(pool) = pool().await else { return };
                let cache = cache();
                let topic = format!("cache.ttl.batch.{}", ids(1));
                let first = ids(3);
                let all: Vec<i64> = (first..first + 3).collect();
                for id in &all {
                    let mut tx = pool.begin().await.unwrap();
                    let payload = serde_json::json!({ "id": id, "expire_in_body": false });
                    idem_runtime::outbox::enqueue(&mut tx, &topic, &format!("m-{id}"), &payload)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
                let route_cache = cache.clone();
                let relay = Relay::new(pool.clone())
                    .commit_batch(3)
                    .max_attempts(1)
                    .route(topic, move |d, n: Remind| {
                        let cache = route_cache.clone();
                        async move { remind(d.source().cache(&cache), &n).await }
                    });
                assert_eq!(relay.run_once().await.unwrap(), 3);
                assert_eq!(relay.stats().batches(), 1);
                for id in all {
                    assert_eq!(effects(&pool, id).await, 1);
                    assert_bounded(&pool, &cache, id).await;
                }
            }
        }
    };
}

idem_testkit::for_each_backend!(cache_ttl_tests; postgres(8), mariadb(8), sqlite(8));
