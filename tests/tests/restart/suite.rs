//! One server's restart tests, written once for both (`restart_suite!`):
//! `$db` the database, `$dialect` its dialect, `$start` the harness's
//! constructor (`Single::postgres`, `Single::mariadb`), `$shared` a pool
//! on the machine's shared server of the same kind (the outbox's, in the
//! layout where only the handler's database restarts).

macro_rules! restart_suite {
    ($db:ty, $dialect:expr, $start:path, $shared:expr) => {
        use crate::clients::{self, Seen};
        use crate::common::coupons::{CouponState, Deduct};
        use crate::common::{hooks, http};
        use crate::hold::Hold;
        use crate::{Duration, Instant, wait_for};
        use axum::response::{IntoResponse, Response};
        use axum::{Json, Router, http::StatusCode, routing::post};
        use idem_runtime::http::{Idempotency, RequestTx};
        use idem_runtime::outbox::{Relay, RelayHandle, Settlement, enqueue};
        use idem_runtime::{Dialect, Error, idempotent};
        use idem_testkit::cluster::single::Single;
        use idem_testkit::{ids, sql, unique};
        use sqlx::{Pool, Transaction};
        use std::sync::Arc;

        type Db = $db;
        const D: Dialect = $dialect;
        /// Messages, enqueued one every 15 ms (about 4.5 s for all).
        const N: usize = 300;
        /// HTTP requests, half before the outage and half during it.
        const ORDERS: usize = 60;
        /// The relay's and the HTTP layer's lease: far shorter than the
        /// outage, so that the leases taken before it run out during it.
        const LEASE: Duration = Duration::from_secs(2);
        /// Messages whose handlers are held across the outage (claimed
        /// before it, leases expired during it).
        const HELD: usize = 4;

        #[idempotent(
            key = "restart-deduct:{msg.coupon_id}",
            strategy = state_machine,
            table = "idem_rs_coupon",
            id = msg.coupon_id,
            from = CouponState::Unused,
            to = CouponState::Used,
        )]
        async fn deduct(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<(), sqlx::Error> {
            sqlx::query(sql(D, "INSERT INTO idem_rs_deduction (coupon_id) VALUES (?)"))
                .bind(msg.coupon_id)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        #[derive(serde::Deserialize)]
        struct Order {
            id: i64,
        }

        /// `POST /orders` behind the layer: the order's effect, in the
        /// request's transaction. A failure answers 503 (not kept).
        async fn order(mut tx: RequestTx<Db>, Json(o): Json<Order>) -> Response {
            let q = sqlx::query(sql(D, "INSERT INTO idem_rs_order (id) VALUES (?)")).bind(o.id);
            let done = match tx.conn() {
                Ok(conn) => q.execute(conn).await.map_err(Error::from),
                Err(e) => Err(e),
            };
            match done {
                Ok(_) => StatusCode::CREATED.into_response(),
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
            }
        }

        fn api_key(parts: &axum::http::request::Parts) -> Option<String> {
            parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned)
        }

        /// A pool on `url` whose acquire fails after `acquire` while the
        /// server is down (`PoolTimedOut`, an outage), opened lazily.
        fn lazy_pool(url: &str, acquire: Duration) -> Pool<Db> {
            sqlx::pool::PoolOptions::<Db>::new()
                .max_connections(10)
                .acquire_timeout(acquire)
                .connect_lazy(url)
                .expect("a valid URL")
        }

        /// The restarted server's tables (idem's, the coupons, the
        /// effects), and `N` unused coupons.
        async fn setup(pool: &Pool<Db>) -> Vec<i64> {
            idem_runtime::migrate(pool).await.expect("migrate");
            for ddl in [
                "CREATE TABLE IF NOT EXISTS idem_rs_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                "CREATE TABLE IF NOT EXISTS idem_rs_deduction (coupon_id BIGINT NOT NULL)",
                "CREATE TABLE IF NOT EXISTS idem_rs_order (id BIGINT NOT NULL)",
            ] {
                sqlx::query(ddl).execute(pool).await.expect("create table");
            }
            let coupons: Vec<i64> = (0..N).map(|_| ids(1)).collect();
            for c in &coupons {
                sqlx::query(sql(D, "INSERT INTO idem_rs_coupon (id, status) VALUES (?, 'UNUSED')"))
                    .bind(*c)
                    .execute(pool)
                    .await
                    .expect("insert coupon");
            }
            coupons
        }

        /// The messages, enqueued one every 15 ms; an enqueue that fails
        /// (the outbox's server is down) is tried again every 100 ms
        /// (`enqueue` is idempotent by message id: a commit whose answer
        /// was lost is not doubled).
        fn produce(outbox: &Pool<Db>, topic: &str, coupons: &[i64]) -> tokio::task::JoinHandle<()> {
            let (pool, topic, all) = (outbox.clone(), topic.to_owned(), coupons.to_vec());
            tokio::spawn(async move {
                for c in all {
                    let msg = serde_json::json!({"coupon_id": c, "order_id": c});
                    let start = Instant::now();
                    loop {
                        let done = async {
                            let mut tx = pool.begin().await?;
                            enqueue(&mut tx, &topic, &format!("deduct-{c}"), &msg).await?;
                            tx.commit().await?;
                            Ok::<_, Error>(())
                        };
                        if done.await.is_ok() {
                            break;
                        }
                        assert!(start.elapsed() < Duration::from_secs(120), "enqueue for 120 s");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        }

        /// The relay: `max_attempts` 3 with a back-off budget of a few
        /// hundred milliseconds; its attempts whose bookkeeping could not
        /// be written counted in `hold`. `handler`: the handler's own database
        /// (its call in a transaction of its own there), else the
        /// outbox's (its call marks the message).
        fn relay(outbox: &Pool<Db>, handler: Option<Pool<Db>>, topic: &str, hold: &Arc<Hold>) -> RelayHandle {
            let (hold, unrecorded) = (hold.clone(), hold.clone());
            Relay::new(outbox.clone())
                .on_settled(move |s| {
                    if matches!(s.settlement, Settlement::Unrecorded) {
                        unrecorded.unrecorded(s.id);
                    }
                })
                .route(topic.to_owned(), move |d, m: Deduct| {
                    let (hold, handler) = (hold.clone(), handler.clone());
                    async move {
                        hold.pass(d.message().id).await;
                        let Some(pool) = handler else {
                            return deduct(d.source(), &m).await;
                        };
                        deduct(&pool, &m).await
                    }
                })
                .max_attempts(3)
                .backoff(Duration::from_millis(20), Duration::from_millis(80))
                .poll_interval(Duration::from_millis(20))
                .lease(LEASE)
                .concurrency(8)
                .spawn()
        }

        async fn count(pool: &Pool<Db>, q: &'static str, bind: &str) -> i64 {
            sqlx::query_scalar(sql(D, q)).bind(bind.to_owned()).fetch_one(pool).await.expect("count")
        }

        async fn by_status(outbox: &Pool<Db>, topic: &str, status: &'static str) -> i64 {
            let q = match status {
                "pending" => "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'pending'",
                "failed" => "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'failed'",
                _ => "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'",
            };
            count(outbox, q, topic).await
        }

        /// Effect rows and distinct ids of `table` (the deductions or the
        /// orders).
        async fn effects(pool: &Pool<Db>, table: &'static str) -> (i64, i64) {
            let q = match table {
                "deduction" => "SELECT COUNT(*), COUNT(DISTINCT coupon_id) FROM idem_rs_deduction",
                _ => "SELECT COUNT(*), COUNT(DISTINCT id) FROM idem_rs_order",
            };
            sqlx::query_as(sqlx::AssertSqlSafe(q)).fetch_one(pool).await.expect("effects")
        }

        restart_run!($start, $shared);
    };
}
