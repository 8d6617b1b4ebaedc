//! Handlers composed into the caller's code, on every backend (natively and
//! through `sqlx::Any`) against the real servers:
//!
//! - called on a transaction the caller holds (`handler(&mut tx, …)`): the
//!   call's effects commit or roll back with the caller's own writes; a
//!   failed or cancelled call leaves the caller's transaction as it was
//!   and usable; concurrent duplicates in separate caller transactions
//!   still act once;
//! - a body written like ordinary sqlx code, on the transaction's
//!   connection (`tx: &mut PgConnection`, queries on `&mut *tx`);
//! - an outbox handler keyed by its delivery's topic and message id
//!   (`{d.topic}:{d.msg_id}`), whose payload repeats neither.
//!
//! Effects are counted in the database, never taken from return values.

use crate::common::coupons::CouponState;
use idem_runtime::Dialect;
use idem_runtime::outbox::{Delivery, Relay, enqueue};
use idem_runtime::{CallerTx, Error, Outcome, idempotent};
use idem_testkit::{concurrently, ids, sql};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    order_id: i64,
    amount: i64,
    /// How the body fails after its write, if it does.
    fail: Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Fail {
    No,
    /// A body error that is not a database error.
    Boom,
    /// A statement the database rejects (PostgreSQL: the transaction is
    /// then aborted until the call rolls back to its savepoint).
    Sql,
    /// The body waits forever: the caller cancels the call.
    Hang,
    /// The body's second statement runs for a second: the caller cancels
    /// the call while the server is still executing it.
    SlowQuery,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charged: i64,
}

/// The outbox payload: neither the topic nor the message id.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ship {
    parcel: i64,
}

#[derive(Debug)]
struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("boom: injected failure after the write")
    }
}
impl std::error::Error for Boom {}

macro_rules! composition_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;

            async fn pool() -> Option<Pool<Db>> {
                let pool = $pool?;
                idem_runtime::migrate(&pool).await.expect("migrate");
                let ddl = [
                    "CREATE TABLE IF NOT EXISTS idem_t_cx_order (id BIGINT PRIMARY KEY, note VARCHAR(32) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_t_cx_charge (order_id BIGINT NOT NULL, amount BIGINT NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_t_cx_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_t_cx_parcel (parcel BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL)",
                ];
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77011)").execute(&mut *tx).await.expect("lock");
                }
                for stmt in ddl {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create test table");
                }
                tx.commit().await.expect("commit ddl");
                Some(pool)
            }

            /// The caller's transaction (SQLite: `BEGIN IMMEDIATE`).
            async fn caller(pool: &Pool<Db>) -> CallerTx<Db> {
                CallerTx::begin(pool).await.expect("begin")
            }

            // The body written like ordinary sqlx code: the parameter is
            // the transaction's connection, queries run on `&mut *tx`.
            #[idempotent(key = "cx-charge:{c.order_id}", strategy = record, biz_type = "cx_charge")]
            async fn charge(tx: &mut <$db as sqlx::Database>::Connection, c: &Charge) -> Result<Receipt, Box<dyn std::error::Error + Send + Sync>> {
                sqlx::query(sql(D, "INSERT INTO idem_t_cx_charge (order_id, amount) VALUES (?, ?)"))
                    .bind(c.order_id)
                    .bind(c.amount)
                    .execute(&mut *tx)
                    .await?;
                match c.fail {
                    Fail::No => {}
                    Fail::Boom => return Err(Boom.into()),
                    Fail::Sql => {
                        sqlx::query("INSERT INTO idem_t_cx_no_such_table (x) VALUES (1)").execute(&mut *tx).await?;
                    }
                    Fail::Hang => std::future::pending::<()>().await,
                    Fail::SlowQuery => {
                        let sleep = match D {
                            Dialect::Postgres => "SELECT 1 FROM pg_sleep(1)",
                            _ => "SELECT SLEEP(1)",
                        };
                        sqlx::query(sleep).execute(&mut *tx).await?;
                    }
                }
                Ok(Receipt { charged: c.amount })
            }

            #[idempotent(
                key = "cx-coupon:{coupon}",
                strategy = state_machine,
                table = "idem_t_cx_coupon",
                id = coupon,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn use_coupon(tx: &mut Transaction<'_, Db>, coupon: &i64) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_cx_charge (order_id, amount) VALUES (?, 0)"))
                    .bind(*coupon)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            // Keyed by the delivery: the payload repeats neither field.
            #[idempotent(key = "cx-ship:{d.topic}:{d.msg_id}", strategy = record, biz_type = "cx_ship")]
            async fn ship(tx: &mut <$db as sqlx::Database>::Connection, d: &Delivery<Db>, s: &Ship) -> Result<i64, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_cx_parcel (parcel, msg_id) VALUES (?, ?)"))
                    .bind(s.parcel)
                    .bind(&d.msg_id)
                    .execute(&mut *tx)
                    .await?;
                Ok(s.parcel)
            }

            async fn count(pool: &Pool<Db>, query: &'static str, id: i64) -> i64 {
                sqlx::query_scalar(sql(D, query)).bind(id).fetch_one(pool).await.expect("count")
            }

            async fn charges(pool: &Pool<Db>, order: i64) -> i64 {
                count(pool, "SELECT COUNT(*) FROM idem_t_cx_charge WHERE order_id = ?", order).await
            }

            /// The caller's own rows for `order` (the one written before
            /// the call, and the one written after it).
            async fn orders(pool: &Pool<Db>, order: i64) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_t_cx_order WHERE id IN (?, ?)"))
                    .bind(order)
                    .bind(order + 1_000_000_000)
                    .fetch_one(pool)
                    .await
                    .expect("count orders")
            }

            async fn records(pool: &Pool<Db>, order: i64) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ? AND biz_type = 'cx_charge'"))
                    .bind(format!("cx-charge:{order}"))
                    .fetch_one(pool)
                    .await
                    .expect("count records")
            }

            async fn try_own_write(tx: &mut CallerTx<Db>, id: i64, note: &str) -> Result<(), Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_cx_order (id, note) VALUES (?, ?)"))
                    .bind(id)
                    .bind(note)
                    .execute(tx.conn()?)
                    .await?;
                Ok(())
            }

            async fn own_write(tx: &mut CallerTx<Db>, id: i64, note: &str) {
                try_own_write(tx, id, note).await.expect("the caller's own write");
            }

            fn order(fail: Fail) -> Charge {
                Charge { order_id: ids(1), amount: 250, fail }
            }

            #[tokio::test]
            async fn the_call_commits_with_the_callers_writes_and_replays_in_the_next() {
                let Some(pool) = pool().await else { return };
                let c = order(Fail::No);
                let mut tx = caller(&pool).await;
                own_write(&mut tx, c.order_id, "placed").await;
                let first = charge(&mut tx, &c).await.expect("charge");
                assert_eq!(first, Outcome::Executed(Receipt { charged: 250 }));
                // Not visible outside before the caller commits.
                assert_eq!(charges(&pool, c.order_id).await, 0);
                tx.commit().await.expect("the caller commits");
                assert_eq!((orders(&pool, c.order_id).await, charges(&pool, c.order_id).await, records(&pool, c.order_id).await), (1, 1, 1));

                // A retry in another caller transaction: the stored result.
                let mut tx = caller(&pool).await;
                let again = charge(&mut tx, &c).await.expect("charge again");
                assert_eq!(again, Outcome::Duplicate(Some(Receipt { charged: 250 })));
                tx.commit().await.expect("commit");
                assert_eq!(charges(&pool, c.order_id).await, 1);
            }

            #[tokio::test]
            async fn the_call_rolls_back_with_the_caller_and_the_key_stays_free() {
                let Some(pool) = pool().await else { return };
                let c = order(Fail::No);
                let mut tx = caller(&pool).await;
                own_write(&mut tx, c.order_id, "placed").await;
                assert!(matches!(charge(&mut tx, &c).await.expect("charge"), Outcome::Executed(_)));
                tx.rollback().await.expect("the caller rolls back");
                assert_eq!((orders(&pool, c.order_id).await, charges(&pool, c.order_id).await, records(&pool, c.order_id).await), (0, 0, 0));
                // Nothing was recorded, so the next attempt executes.
                let mut tx = caller(&pool).await;
                assert!(matches!(charge(&mut tx, &c).await.expect("charge"), Outcome::Executed(_)));
                tx.commit().await.expect("commit");
                assert_eq!(charges(&pool, c.order_id).await, 1);
            }

            #[tokio::test]
            async fn a_failed_call_leaves_the_callers_transaction_as_it_was_and_usable() {
                let Some(pool) = pool().await else { return };
                for fail in [Fail::Boom, Fail::Sql] {
                    let c = order(fail);
                    let mut tx = caller(&pool).await;
                    own_write(&mut tx, c.order_id, "before").await;
                    let err = charge(&mut tx, &c).await.expect_err("the body fails");
                    assert!(matches!(err, Error::Handler { .. }), "{fail:?}: {err:?}");
                    // The caller goes on in the same transaction (PostgreSQL
                    // would refuse every statement of an aborted one).
                    own_write(&mut tx, c.order_id + 1_000_000_000, "after").await;
                    tx.commit().await.expect("the caller commits");
                    assert_eq!(orders(&pool, c.order_id).await, 2, "{fail:?}: the caller's writes");
                    assert_eq!(charges(&pool, c.order_id).await, 0, "{fail:?}: the body's write was rolled back");
                    assert_eq!(records(&pool, c.order_id).await, 0, "{fail:?}: no record");
                }
            }

            #[tokio::test]
            async fn an_illegal_state_changes_nothing_in_the_callers_transaction() {
                let Some(pool) = pool().await else { return };
                let coupon = ids(1);
                sqlx::query(sql(D, "INSERT INTO idem_t_cx_coupon (id, status) VALUES (?, 'EXPIRED')"))
                    .bind(coupon)
                    .execute(&pool)
                    .await
                    .expect("seed");
                let mut tx = caller(&pool).await;
                own_write(&mut tx, coupon, "placed").await;
                let err = use_coupon(&mut tx, &coupon).await.expect_err("expired coupon");
                assert!(matches!(err, Error::IllegalState { .. }), "{err:?}");
                tx.commit().await.expect("commit");
                assert_eq!((orders(&pool, coupon).await, charges(&pool, coupon).await), (1, 0));

                // An unused one moves in the caller's transaction.
                let coupon = ids(1);
                sqlx::query(sql(D, "INSERT INTO idem_t_cx_coupon (id, status) VALUES (?, 'UNUSED')"))
                    .bind(coupon)
                    .execute(&pool)
                    .await
                    .expect("seed");
                let mut tx = caller(&pool).await;
                assert!(use_coupon(&mut tx, &coupon).await.expect("use").is_executed());
                assert_eq!(use_coupon(&mut tx, &coupon).await.expect("use again"), Outcome::Duplicate(None));
                tx.commit().await.expect("commit");
                let status: String = sqlx::query_scalar(sql(D, "SELECT status FROM idem_t_cx_coupon WHERE id = ?"))
                    .bind(coupon)
                    .fetch_one(&pool)
                    .await
                    .expect("status");
                assert_eq!((status.as_str(), charges(&pool, coupon).await), ("USED", 1));
            }

            #[tokio::test]
            async fn a_cancelled_call_leaves_nothing_behind_in_the_callers_transaction() {
                let Some(pool) = pool().await else { return };
                let c = order(Fail::Hang);
                let mut tx = caller(&pool).await;
                own_write(&mut tx, c.order_id, "before").await;
                // The body wrote, then hangs; the caller gives up on it.
                let timed_out = tokio::time::timeout(Duration::from_millis(300), charge(&mut tx, &c)).await;
                assert!(timed_out.is_err(), "the call cannot finish");
                own_write(&mut tx, c.order_id + 1_000_000_000, "after").await;
                tx.commit().await.expect("the caller commits");
                assert_eq!(orders(&pool, c.order_id).await, 2);
                assert_eq!(charges(&pool, c.order_id).await, 0, "half a call was committed");
                assert_eq!(records(&pool, c.order_id).await, 0);
            }

            #[tokio::test]
            async fn a_call_cancelled_mid_statement_leaves_nothing_behind_in_the_callers_transaction() {
                let Some(pool) = pool().await else { return };
                if D == Dialect::Sqlite {
                    return; // no server-side sleep; the pending case above covers SQLite
                }
                let c = order(Fail::SlowQuery);
                let mut tx = caller(&pool).await;
                own_write(&mut tx, c.order_id, "before").await;
                let timed_out = tokio::time::timeout(Duration::from_millis(200), charge(&mut tx, &c)).await;
                assert!(timed_out.is_err(), "cancelled while the server runs the body's statement");
                own_write(&mut tx, c.order_id + 1_000_000_000, "after").await;
                tx.commit().await.expect("the caller commits");
                assert_eq!(orders(&pool, c.order_id).await, 2);
                assert_eq!(charges(&pool, c.order_id).await, 0, "half a call was committed");
                assert_eq!(records(&pool, c.order_id).await, 0);
            }

            /// The call cancelled while its SAVEPOINT is in flight (the
            /// proxy holds the server's reply): the caller's transaction
            /// must keep its writes, and its commit must commit them.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_call_cancelled_during_its_savepoint_leaves_the_callers_transaction_whole() {
                let Some(pool) = pool().await else { return };
                if D == Dialect::Sqlite {
                    return; // no network between the caller and SQLite
                }
                let url = if D == Dialect::Postgres { idem_testkit::postgres_url() } else { idem_testkit::mysql_url() };
                let proxy = idem_testkit::proxy::FaultProxy::for_url(&url, 0.0).await.expect("start proxy");
                let through = sqlx::pool::PoolOptions::<Db>::new()
                    .max_connections(1)
                    .connect(&proxy.url(&url))
                    .await
                    .expect("pool through the proxy");
                let c = order(Fail::No);
                let mut tx = caller(&through).await;
                own_write(&mut tx, c.order_id, "before").await;
                proxy.set_savepoint_hold(Duration::from_millis(1500));
                let timed_out = tokio::time::timeout(Duration::from_millis(300), charge(&mut tx, &c)).await;
                proxy.set_savepoint_hold(Duration::ZERO);
                assert!(timed_out.is_err(), "the call must still wait on its SAVEPOINT");
                assert_eq!(proxy.begins_held(), 1, "the SAVEPOINT's reply was not held");
                // Either the caller's transaction is whole, or every later
                // use of it fails.
                let after = try_own_write(&mut tx, c.order_id + 1_000_000_000, "after").await;
                let committed = match after {
                    Ok(()) => tx.commit().await,
                    Err(e) => {
                        assert!(matches!(e, Error::TransactionLost { .. }), "{e:?}");
                        tx.commit().await
                    }
                };
                through.close().await;
                // Either the caller's two writes commit, or its commit fails:
                // never an "Ok" that committed part of it, or nothing.
                let notes: Vec<String> = sqlx::query_scalar(sql(D, "SELECT note FROM idem_t_cx_order WHERE id IN (?, ?)"))
                    .bind(c.order_id)
                    .bind(c.order_id + 1_000_000_000)
                    .fetch_all(&pool)
                    .await
                    .expect("notes");
                match committed {
                    Ok(()) => assert_eq!(orders(&pool, c.order_id).await, 2, "the caller's commit lost writes: {notes:?}"),
                    Err(e) => assert_eq!(orders(&pool, c.order_id).await, 0, "a failed commit kept writes: {e}"),
                }
                assert_eq!((charges(&pool, c.order_id).await, records(&pool, c.order_id).await), (0, 0));
            }

            /// The control: the same body run straight on the caller's
            /// transaction, with no savepoint, leaves its half-done write to
            /// the caller's commit. The test above catches that.
            #[tokio::test]
            async fn control_a_body_on_the_callers_transaction_without_a_savepoint_commits_half_a_call() {
                let Some(pool) = pool().await else { return };
                let c = order(Fail::Hang);
                let mut tx = pool.begin().await.expect("begin");
                let body = async {
                    sqlx::query(sql(D, "INSERT INTO idem_t_cx_charge (order_id, amount) VALUES (?, ?)"))
                        .bind(c.order_id)
                        .bind(c.amount)
                        .execute(&mut *tx)
                        .await
                        .expect("write");
                    std::future::pending::<()>().await
                };
                assert!(tokio::time::timeout(Duration::from_millis(300), body).await.is_err());
                tx.commit().await.expect("commit");
                assert_eq!(charges(&pool, c.order_id).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_duplicates_in_separate_caller_transactions_act_once() {
                let Some(pool) = pool().await else { return };
                let c = order(Fail::No);
                let results = concurrently(8, || {
                    let (pool, c) = (pool.clone(), c.clone());
                    async move {
                        let mut tx = CallerTx::begin(&pool).await?;
                        let outcome = charge(&mut tx, &c).await?;
                        tx.commit().await?;
                        Ok::<_, Error>(outcome)
                    }
                })
                .await;
                let executed = results.iter().filter(|r| matches!(r, Ok(Outcome::Executed(_)))).count();
                for r in &results {
                    assert!(matches!(r, Ok(Outcome::Executed(_)) | Ok(Outcome::Duplicate(Some(_)))), "{r:?}");
                }
                assert_eq!(executed, 1);
                assert_eq!((charges(&pool, c.order_id).await, records(&pool, c.order_id).await), (1, 1));
            }

            #[tokio::test]
            async fn an_outbox_handler_keyed_by_its_delivery_acts_once_per_message() {
                let Some(pool) = pool().await else { return };
                let topic = idem_testkit::unique("cx.ship");
                let parcels: Vec<i64> = (0..3).map(|_| ids(1)).collect();
                let mut tx = pool.begin().await.expect("begin");
                for (n, parcel) in parcels.iter().enumerate() {
                    enqueue(&mut tx, &topic, &format!("ship-{n}"), &serde_json::json!({ "parcel": parcel }))
                        .await
                        .expect("enqueue");
                }
                tx.commit().await.expect("commit");
                let relay = Relay::new(pool.clone())
                    .route(&topic, |d, s: Ship| async move { ship(d.source(), &d, &s).await });
                assert_eq!(relay.run_once().await.expect("relay"), 3);
                for (n, parcel) in parcels.iter().enumerate() {
                    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_cx_parcel WHERE parcel = ?", *parcel).await, 1);
                    let key: String = sqlx::query_scalar(sql(D, "SELECT idempotency_key FROM idem_record WHERE biz_type = 'cx_ship' AND idempotency_key LIKE ?"))
                        .bind(format!("cx-ship:{topic}:ship-{n}"))
                        .fetch_one(&pool)
                        .await
                        .expect("the record keyed by the delivery");
                    assert_eq!(key, format!("cx-ship:{topic}:ship-{n}"));
                }
                let success: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'"))
                    .bind(&topic)
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                assert_eq!(success, 3);
            }
        }
    };
}

idem_testkit::for_each_backend!(composition_tests;
    postgres, mariadb, sqlite, any_postgres, any_mariadb, any_sqlite
);
