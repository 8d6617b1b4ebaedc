//! Every strategy on every backend, against the real servers: 64 concurrent
//! calls with one key give one effect; a replay after commit is a
//! duplicate; an error in the body rolls everything back and the retry
//! executes; an illegal state (or conflicting / invalid key) changes
//! nothing; the driving outbox message is marked in the same transaction.
//! Effects are counted in the database, never taken from return values.

use idem_runtime::__private::Dialect;
use idem_runtime::{Error, OutboxLease, Outcome, Source, State, idempotent};
use idem_tests::{concurrently, ids, sql};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
pub enum CouponState {
    Unused,
    Used,
    Expired,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deduct {
    pub msg_id: String,
    pub coupon_id: i64,
    pub order_id: i64,
    /// Makes the body fail after its write (a fault inside the transaction).
    pub fail: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Notice {
    pub msg_id: String,
    pub user_id: i64,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Receipt {
    pub notice_row: i64,
    pub text: String,
}

#[derive(Debug, Clone)]
pub struct Payment {
    pub serial: String,
    /// The platform's reference, unique too (another unique index).
    pub ext_ref: String,
    pub amount: i64,
    pub fail: bool,
}

fn digits_only(key: &str) -> Result<(), String> {
    let serial = key.rsplit(':').next().unwrap_or_default();
    if serial.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(format!("payment serial `{serial}` is not numeric"))
    }
}

/// A body error that is not a database error.
#[derive(Debug)]
pub struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("boom: injected failure after the write")
    }
}
impl std::error::Error for Boom {}

const CONCURRENCY: usize = 64;

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;

            async fn pool() -> Option<Pool<Db>> {
                let pool = $pool?;
                setup(&pool).await;
                Some(pool)
            }

            async fn setup(pool: &Pool<Db>) {
                let ddl = [
                    "CREATE TABLE IF NOT EXISTS idem_t_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_t_coupon_k (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, used_by VARCHAR(200))",
                    "CREATE TABLE IF NOT EXISTS idem_t_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_t_notice (user_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL, text VARCHAR(256) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_t_paid (serial VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
                    // A named unique index: the one portable way to name the
                    // action's constraint on all three databases.
                    "CREATE UNIQUE INDEX IF NOT EXISTS uk_idem_t_paid_serial ON idem_t_paid (serial)",
                    // The platform's references, unique too, in a ledger.
                    "CREATE TABLE IF NOT EXISTS idem_t_paid_ref (ext_ref VARCHAR(64) NOT NULL, serial VARCHAR(64) NOT NULL)",
                    "CREATE UNIQUE INDEX IF NOT EXISTS uk_idem_t_paid_ref ON idem_t_paid_ref (ext_ref)",
                ];
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77001)").execute(&mut *tx).await.expect("lock");
                }
                for stmt in ddl {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create test table");
                }
                tx.commit().await.expect("commit ddl");
            }

            // ---- handlers under test --------------------------------------

            #[idempotent(
                key = "coupon-deduct:{msg.msg_id}",
                strategy = state_machine,
                table = "idem_t_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
                sqlx::query(sql(D, "INSERT INTO idem_t_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .bind(&msg.msg_id)
                    .execute(&mut **tx)
                    .await?;
                if msg.fail {
                    return Err(Boom.into());
                }
                Ok(msg.order_id)
            }

            /// `deduct` bound to its message: the transition writes the key
            /// into `used_by`.
            #[idempotent(
                key = "coupon-deduct:{msg.msg_id}",
                strategy = state_machine,
                table = "idem_t_coupon_k",
                id = msg.coupon_id,
                key_column = "used_by",
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_bound(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<i64, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .bind(&msg.msg_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(msg.order_id)
            }

            #[idempotent(
                key = "notice:{msg.msg_id}",
                strategy = record,
                biz_type = "notice",
                biz_no = msg.user_id,
                ttl = "2d",
            )]
            async fn notify(tx: &mut Transaction<'_, Db>, msg: &Notice, fail: bool) -> Result<Receipt, Box<dyn std::error::Error + Send + Sync>> {
                sqlx::query(sql(D, "INSERT INTO idem_t_notice (user_id, msg_id, text) VALUES (?, ?, ?)"))
                    .bind(msg.user_id)
                    .bind(&msg.msg_id)
                    .bind(&msg.text)
                    .execute(&mut **tx)
                    .await?;
                if fail {
                    return Err(Boom.into());
                }
                let n: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_t_notice WHERE msg_id = ?"))
                    .bind(&msg.msg_id)
                    .fetch_one(&mut **tx)
                    .await?;
                Ok(Receipt { notice_row: n, text: msg.text.clone() })
            }

            #[idempotent(key = "pay:{p.serial}", strategy = unique_insert, constraint = "uk_idem_t_paid_serial", validate = digits_only)]
            async fn record_payment(tx: &mut Transaction<'_, Db>, p: &Payment) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_paid (serial, amount) VALUES (?, ?)"))
                    .bind(&p.serial)
                    .bind(p.amount)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query(sql(D, "INSERT INTO idem_t_paid_ref (ext_ref, serial) VALUES (?, ?)"))
                    .bind(&p.ext_ref)
                    .bind(&p.serial)
                    .execute(&mut **tx)
                    .await?;
                if p.fail {
                    // A non-unique database error after the insert.
                    sqlx::query("SELECT * FROM idem_t_no_such_table").execute(&mut **tx).await?;
                }
                Ok(())
            }

            // ---- helpers --------------------------------------------------

            async fn count(pool: &Pool<Db>, q: &'static str, bind: impl ToString) -> i64 {
                sqlx::query_scalar(sql(D, q))
                    .bind(bind.to_string())
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            async fn new_coupon(pool: &Pool<Db>, status: &str) -> i64 {
                let id = ids(1);
                sqlx::query(sql(D, "INSERT INTO idem_t_coupon (id, status) VALUES (?, ?)"))
                    .bind(id)
                    .bind(status)
                    .execute(pool)
                    .await
                    .expect("insert coupon");
                id
            }

            async fn coupon_status(pool: &Pool<Db>, id: i64) -> String {
                sqlx::query_scalar(sql(D, "SELECT status FROM idem_t_coupon WHERE id = ?"))
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .expect("coupon status")
            }

            async fn deductions(pool: &Pool<Db>, coupon: i64) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_t_deduction WHERE coupon_id = ?"))
                    .bind(coupon)
                    .fetch_one(pool)
                    .await
                    .expect("count deductions")
            }

            async fn enqueue(pool: &Pool<Db>, topic: &str, msg_id: &str) -> i64 {
                let mut tx = <Db as idem_runtime::Backend>::begin(pool).await.expect("begin");
                let id = idem_runtime::outbox::enqueue(&mut tx, topic, msg_id, &serde_json::json!({"m": msg_id}))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit enqueue");
                id
            }

            /// Claims outbox message `id` the way a relay does (owner, attempt
            /// + 1, a lease), for a call driven by it.
            async fn lease(pool: &Pool<Db>, id: i64) -> OutboxLease {
                let owner = format!("test-relay-{id}");
                let q = match D {
                    Dialect::Postgres => "UPDATE idem_outbox SET lease_owner = $1, attempts = attempts + 1, locked_until = now() + interval '1 hour' WHERE id = $2",
                    Dialect::MySql => "UPDATE idem_outbox SET lease_owner = ?, attempts = attempts + 1, locked_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL 1 HOUR) WHERE id = ?",
                    Dialect::Sqlite => "UPDATE idem_outbox SET lease_owner = ?, attempts = attempts + 1, locked_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour') WHERE id = ?",
                };
                sqlx::query(q).bind(&owner).bind(id).execute(pool).await.expect("lease");
                let (topic, attempts): (String, i32) = sqlx::query_as(sql(D, "SELECT topic, attempts FROM idem_outbox WHERE id = ?"))
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .expect("leased row");
                OutboxLease::new(id, topic, owner, attempts)
            }

            async fn outbox_status(pool: &Pool<Db>, id: i64) -> String {
                sqlx::query_scalar(sql(D, "SELECT status FROM idem_outbox WHERE id = ?"))
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .expect("outbox status")
            }

            async fn records(pool: &Pool<Db>, key: &str) -> i64 {
                count(pool, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?", key).await
            }

            fn deduct_msg(coupon: i64, fail: bool) -> Deduct {
                Deduct { msg_id: format!("m-{coupon}"), coupon_id: coupon, order_id: coupon + 7, fail }
            }

            // ---- state_machine --------------------------------------------

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn state_machine_64_concurrent_calls_one_effect() {
                let Some(pool) = pool().await else { return };
                let coupon = new_coupon(&pool, "UNUSED").await;
                let msg = deduct_msg(coupon, false);
                let outbox = enqueue(&pool, "coupon.deduct", &msg.msg_id).await;
                // One delivery of the outbox message among 63 redeliveries.
                let lease = lease(&pool, outbox).await;
                let first = std::sync::atomic::AtomicBool::new(true);
                let results = concurrently(CONCURRENCY, || {
                    let (pool, msg) = (pool.clone(), msg.clone());
                    let lease = first.swap(false, std::sync::atomic::Ordering::Relaxed).then(|| lease.clone());
                    async move {
                        match lease {
                            Some(l) => deduct(Source::outbox(&pool, l), &msg).await,
                            None => deduct(&pool, &msg).await,
                        }
                    }
                })
                .await;
                let executed = results.iter().filter(|r| matches!(r, Ok(Outcome::Executed(_)))).count();
                let duplicates = results.iter().filter(|r| matches!(r, Ok(Outcome::Duplicate(None)))).count();
                let errors: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
                assert!(errors.is_empty(), "errors: {errors:?}");
                assert_eq!((executed, duplicates), (1, CONCURRENCY - 1));
                assert_eq!(deductions(&pool, coupon).await, 1, "exactly one deduction in the database");
                assert_eq!(coupon_status(&pool, coupon).await, "USED");
                assert_eq!(outbox_status(&pool, outbox).await, "success");
            }

            #[tokio::test]
            async fn state_machine_replay_after_commit_is_duplicate() {
                let Some(pool) = pool().await else { return };
                let coupon = new_coupon(&pool, "UNUSED").await;
                let msg = deduct_msg(coupon, false);
                assert_eq!(deduct(&pool, &msg).await.unwrap(), Outcome::Executed(coupon + 7));
                // The poller's retry after a lost acknowledgement, and a
                // redelivery of the same message by another outbox row.
                assert_eq!(deduct(&pool, &msg).await.unwrap(), Outcome::Duplicate(None));
                let again = enqueue(&pool, "coupon.deduct.redelivery", &msg.msg_id).await;
                assert_eq!(deduct(Source::outbox(&pool, lease(&pool, again).await), &msg).await.unwrap(), Outcome::Duplicate(None));
                assert_eq!(outbox_status(&pool, again).await, "success", "a duplicate still acknowledges its message");
                assert_eq!(deductions(&pool, coupon).await, 1);
            }

            #[tokio::test]
            async fn state_machine_body_error_rolls_back_then_retry_executes() {
                let Some(pool) = pool().await else { return };
                let coupon = new_coupon(&pool, "UNUSED").await;
                let outbox = enqueue(&pool, "coupon.deduct", &format!("m-{coupon}")).await;
                let held = lease(&pool, outbox).await;
                let err = deduct(Source::outbox(&pool, held.clone()), &deduct_msg(coupon, true)).await.unwrap_err();
                assert!(matches!(err, Error::Handler { .. }), "{err:?}");
                assert!(!err.is_retryable(), "Boom is not a transient error");
                assert_eq!(deductions(&pool, coupon).await, 0, "the body's insert was rolled back");
                assert_eq!(coupon_status(&pool, coupon).await, "UNUSED");
                assert_eq!(outbox_status(&pool, outbox).await, "pending", "the message stays pending for its retry");
                let ok = deduct(Source::outbox(&pool, held), &deduct_msg(coupon, false)).await.unwrap();
                assert!(ok.is_executed());
                assert_eq!(deductions(&pool, coupon).await, 1);
                assert_eq!(outbox_status(&pool, outbox).await, "success");
            }

            #[tokio::test]
            async fn state_machine_illegal_state_changes_nothing() {
                let Some(pool) = pool().await else { return };
                let coupon = new_coupon(&pool, "EXPIRED").await;
                let outbox = enqueue(&pool, "coupon.deduct", &format!("m-{coupon}")).await;
                let err = deduct(Source::outbox(&pool, lease(&pool, outbox).await), &deduct_msg(coupon, false)).await.unwrap_err();
                match &err {
                    Error::IllegalState { found, expected, .. } => {
                        assert_eq!(found.as_deref(), Some("EXPIRED"));
                        assert_eq!(*expected, "UNUSED");
                    }
                    other => panic!("expected IllegalState, got {other:?}"),
                }
                assert!(!err.is_retryable());
                assert_eq!(deductions(&pool, coupon).await, 0);
                assert_eq!(coupon_status(&pool, coupon).await, "EXPIRED");
                assert_eq!(outbox_status(&pool, outbox).await, "pending");
                // No such entity at all.
                let missing = ids(1);
                let err = deduct(&pool, &deduct_msg(missing, false)).await.unwrap_err();
                assert!(matches!(err, Error::IllegalState { found: None, .. }), "{err:?}");
                assert_eq!(deductions(&pool, missing).await, 0);
            }

            #[tokio::test]
            async fn invalid_key_executes_nothing() {
                let Some(pool) = pool().await else { return };
                let coupon = new_coupon(&pool, "UNUSED").await;
                let mut msg = deduct_msg(coupon, false);
                msg.msg_id = String::new();
                let err = deduct(&pool, &msg).await.unwrap_err();
                assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
                msg.msg_id = "x".repeat(200);
                assert!(matches!(deduct(&pool, &msg).await, Err(Error::InvalidKey { .. })));
                msg.msg_id = "evil\u{0}id".into();
                assert!(matches!(deduct(&pool, &msg).await, Err(Error::InvalidKey { .. })));
                assert_eq!(deductions(&pool, coupon).await, 0);
                assert_eq!(coupon_status(&pool, coupon).await, "UNUSED");
            }

            #[tokio::test]
            async fn state_machine_key_column_tells_another_message_from_a_retry() {
                let Some(pool) = pool().await else { return };
                let coupon = ids(1);
                sqlx::query(sql(D, "INSERT INTO idem_t_coupon_k (id, status) VALUES (?, 'UNUSED')"))
                    .bind(coupon)
                    .execute(&pool)
                    .await
                    .unwrap();
                let first = Deduct { msg_id: format!("order-{coupon}-a"), coupon_id: coupon, order_id: 1, fail: false };
                assert_eq!(deduct_bound(&pool, &first).await.unwrap(), Outcome::Executed(1));
                // A second order reusing the used coupon: an error, not a success.
                let second = Deduct { msg_id: format!("order-{coupon}-b"), order_id: 2, ..first.clone() };
                let err = deduct_bound(&pool, &second).await.unwrap_err();
                match &err {
                    Error::IllegalState { found: Some(f), .. } => assert!(f.contains("another key"), "{f}"),
                    other => panic!("expected IllegalState, got {other:?}"),
                }
                assert!(!err.is_retryable());
                // The first order's retry is still a duplicate.
                assert_eq!(deduct_bound(&pool, &first).await.unwrap(), Outcome::Duplicate(None));
                assert_eq!(deductions(&pool, coupon).await, 1);
                let used_by: String = sqlx::query_scalar(sql(D, "SELECT used_by FROM idem_t_coupon_k WHERE id = ?"))
                    .bind(coupon)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(used_by, format!("coupon-deduct:order-{coupon}-a"));
                // The plain form cannot tell them apart: documented.
                let plain = new_coupon(&pool, "UNUSED").await;
                assert!(deduct(&pool, &Deduct { coupon_id: plain, ..first.clone() }).await.unwrap().is_executed());
                assert!(deduct(&pool, &Deduct { coupon_id: plain, ..second.clone() }).await.unwrap().is_duplicate());
            }

            // ---- the outbox source is checked (item 10) --------------------

            #[tokio::test]
            async fn an_outbox_source_must_hold_its_pending_message() {
                let Some(pool) = pool().await else { return };
                let coupon = new_coupon(&pool, "UNUSED").await;
                let msg = deduct_msg(coupon, false);
                // Another topic's message: never marked by this handler.
                let other = enqueue(&pool, "coupon.other-topic", &msg.msg_id).await;
                let held = lease(&pool, other).await;
                let wrong_topic = OutboxLease::new(other, "coupon.deduct", held.owner(), held.attempt());
                let err = deduct(Source::outbox(&pool, wrong_topic), &msg).await.unwrap_err();
                assert!(matches!(&err, Error::OutboxMessage { reason, .. } if reason.contains("coupon.other-topic")), "{err:?}");
                assert!(!err.is_retryable());
                assert_eq!(outbox_status(&pool, other).await, "pending");
                // A missing message: nothing executes.
                let missing = OutboxLease::new(i64::MAX - ids(1), "coupon.deduct", "nobody", 1);
                let err = deduct(Source::outbox(&pool, missing), &msg).await.unwrap_err();
                assert!(matches!(err, Error::OutboxMessage { .. }), "{err:?}");
                // A dead-lettered message: nothing executes.
                let dead = enqueue(&pool, "coupon.deduct", &format!("dead-{coupon}")).await;
                let dead_lease = lease(&pool, dead).await;
                sqlx::query(sql(D, "UPDATE idem_outbox SET status = 'failed' WHERE id = ?")).bind(dead).execute(&pool).await.unwrap();
                let err = deduct(Source::outbox(&pool, dead_lease), &msg).await.unwrap_err();
                assert!(matches!(&err, Error::OutboxMessage { reason, .. } if reason.contains("failed")), "{err:?}");
                // A lease another claim took over: retryable, nothing executes.
                let live = enqueue(&pool, "coupon.deduct", &format!("live-{coupon}")).await;
                let stale = lease(&pool, live).await;
                let _current = lease(&pool, live).await;
                let err = deduct(Source::outbox(&pool, stale), &msg).await.unwrap_err();
                assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
                assert!(err.is_retryable());
                assert_eq!(outbox_status(&pool, live).await, "pending");
                assert_eq!(deductions(&pool, coupon).await, 0, "no call executed");
                assert_eq!(coupon_status(&pool, coupon).await, "UNUSED");
            }

            // ---- record ---------------------------------------------------

            fn notice(tag: &str) -> Notice {
                Notice { msg_id: format!("n-{tag}-{}", ids(1)), user_id: ids(1), text: "your order shipped".into() }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn record_64_concurrent_calls_one_effect_and_stored_result() {
                let Some(pool) = pool().await else { return };
                let msg = notice("conc");
                let results = concurrently(CONCURRENCY, || {
                    let (pool, msg) = (pool.clone(), msg.clone());
                    async move { notify(&pool, &msg, false).await }
                })
                .await;
                let expected = Receipt { notice_row: 1, text: msg.text.clone() };
                let mut executed = 0;
                for r in &results {
                    match r {
                        Ok(Outcome::Executed(v)) => {
                            executed += 1;
                            assert_eq!(v, &expected);
                        }
                        // Every duplicate gets the first call's stored result back.
                        Ok(Outcome::Duplicate(Some(v))) => assert_eq!(v, &expected),
                        other => panic!("unexpected outcome {other:?}"),
                    }
                }
                assert_eq!(executed, 1);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_notice WHERE msg_id = ?", &msg.msg_id).await, 1);
                assert_eq!(records(&pool, &format!("notice:{}", msg.msg_id)).await, 1);
            }

            #[tokio::test]
            async fn record_replay_conflict_rollback_and_expiry() {
                let Some(pool) = pool().await else { return };
                let msg = notice("replay");
                let key = format!("notice:{}", msg.msg_id);
                // Body error: nothing written, not even the record.
                assert!(notify(&pool, &msg, true).await.is_err());
                assert_eq!(records(&pool, &key).await, 0);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_notice WHERE msg_id = ?", &msg.msg_id).await, 0);
                // The retry executes; the replay gets the stored result.
                let first = notify(&pool, &msg, false).await.unwrap();
                assert!(first.is_executed());
                let replay = notify(&pool, &msg, false).await.unwrap();
                assert_eq!(replay, Outcome::Duplicate(first.into_value()));
                // Same key, other payload: a conflict, and nothing executes.
                let mut other = msg.clone();
                other.text = "a different text".into();
                let err = notify(&pool, &other, false).await.unwrap_err();
                assert!(matches!(err, Error::KeyConflict { .. }), "{err:?}");
                assert!(!err.is_retryable());
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_notice WHERE msg_id = ?", &msg.msg_id).await, 1);
                // The record carries the article's columns; ttl = "2d".
                let (biz_type, biz_no): (String, String) = sqlx::query_as(sql(D, "SELECT biz_type, biz_no FROM idem_record WHERE idempotency_key = ?"))
                    .bind(&key)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!((biz_type.as_str(), biz_no), ("notice", msg.user_id.to_string()));
                let ttl_ok = match D {
                    Dialect::Postgres => "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ? AND expire_time - create_time BETWEEN interval '47 hours' AND interval '49 hours'",
                    Dialect::MySql => "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ? AND TIMESTAMPDIFF(HOUR, create_time, expire_time) BETWEEN 47 AND 48",
                    Dialect::Sqlite => "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ? AND (julianday(expire_time) - julianday(create_time)) * 24 BETWEEN 47.9 AND 48.1",
                };
                assert_eq!(count(&pool, ttl_ok, &key).await, 1, "expire_time is create_time + 2 days");
            }

            // ---- unique_insert --------------------------------------------

            fn payment(fail: bool) -> Payment {
                let serial = ids(1).to_string();
                Payment { ext_ref: format!("ref-{serial}"), serial, amount: 1999, fail }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn unique_insert_64_concurrent_calls_one_effect() {
                let Some(pool) = pool().await else { return };
                let p = payment(false);
                let outbox = enqueue(&pool, "payment.callback", &p.serial).await;
                let lease = lease(&pool, outbox).await;
                let first = std::sync::atomic::AtomicBool::new(true);
                let results = concurrently(CONCURRENCY, || {
                    let (pool, p) = (pool.clone(), p.clone());
                    let lease = first.swap(false, std::sync::atomic::Ordering::Relaxed).then(|| lease.clone());
                    async move {
                        match lease {
                            Some(l) => record_payment(Source::outbox(&pool, l), &p).await,
                            None => record_payment(&pool, &p).await,
                        }
                    }
                })
                .await;
                let executed = results.iter().filter(|r| matches!(r, Ok(Outcome::Executed(())))).count();
                let duplicates = results.iter().filter(|r| matches!(r, Ok(Outcome::Duplicate(None)))).count();
                let errors: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
                // MariaDB may break a lock cycle with a deadlock error, which
                // must be marked retryable; anything else is a failure.
                assert!(errors.iter().all(|e| e.is_retryable()), "errors: {errors:?}");
                assert_eq!(executed, 1);
                assert_eq!(executed + duplicates + errors.len(), CONCURRENCY);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_paid WHERE serial = ?", &p.serial).await, 1);
                assert_eq!(outbox_status(&pool, outbox).await, "success");
            }

            #[tokio::test]
            async fn unique_insert_other_unique_violations_are_errors() {
                let Some(pool) = pool().await else { return };
                let p = payment(false);
                assert_eq!(record_payment(&pool, &p).await.unwrap(), Outcome::Executed(()));
                // A new payment whose body hits another unique index (the
                // platform reused a reference): not a duplicate of anything.
                let mut other = payment(false);
                other.ext_ref = p.ext_ref.clone();
                let outbox = enqueue(&pool, "payment.callback", &other.serial).await;
                let err = record_payment(Source::outbox(&pool, lease(&pool, outbox).await), &other).await.unwrap_err();
                assert!(matches!(err, Error::Handler { .. }), "{err:?}");
                assert!(!err.is_retryable());
                assert!(err.to_string().contains("uk_idem_t_paid_serial"), "{err}");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_paid WHERE serial = ?", &other.serial).await, 0);
                assert_eq!(outbox_status(&pool, outbox).await, "pending", "the message was not acknowledged");
                // The action's own constraint is still a duplicate.
                assert_eq!(record_payment(&pool, &p).await.unwrap(), Outcome::Duplicate(None));
            }

            #[tokio::test]
            async fn unique_insert_replay_rollback_and_invalid_key() {
                let Some(pool) = pool().await else { return };
                let p = payment(true);
                let err = record_payment(&pool, &p).await.unwrap_err();
                assert!(matches!(err, Error::Handler { .. }), "{err:?}");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_paid WHERE serial = ?", &p.serial).await, 0, "rolled back");
                let p = Payment { fail: false, ..p };
                assert_eq!(record_payment(&pool, &p).await.unwrap(), Outcome::Executed(()));
                let outbox = enqueue(&pool, "payment.callback", &p.serial).await;
                assert_eq!(record_payment(Source::outbox(&pool, lease(&pool, outbox).await), &p).await.unwrap(), Outcome::Duplicate(None));
                assert_eq!(outbox_status(&pool, outbox).await, "success", "the duplicate committed its outbox update");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_paid WHERE serial = ?", &p.serial).await, 1);
                // An externally supplied serial that fails validation.
                let bad = Payment { serial: "12ab".into(), ext_ref: "ref-12ab".into(), amount: 1, fail: false };
                let err = record_payment(&pool, &bad).await.unwrap_err();
                assert!(matches!(&err, Error::InvalidKey { reason, .. } if reason.contains("not numeric")), "{err:?}");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_t_paid WHERE serial = ?", "12ab").await, 0);
            }
        }
    };
}

backend_tests!(
    postgres,
    sqlx::Postgres,
    Dialect::Postgres,
    idem_tests::postgres(16).await
);
backend_tests!(
    mariadb,
    sqlx::MySql,
    Dialect::MySql,
    idem_tests::mysql(16).await
);
backend_tests!(
    sqlite,
    sqlx::Sqlite,
    Dialect::Sqlite,
    Some(idem_tests::sqlite(8).await)
);

// The same suite through `sqlx::Any`: one handler, the dialect chosen by URL.
backend_tests!(
    any_postgres,
    sqlx::Any,
    Dialect::Postgres,
    idem_tests::any(&idem_tests::postgres_url(), 16).await
);
backend_tests!(
    any_mariadb,
    sqlx::Any,
    Dialect::MySql,
    idem_tests::any(&idem_tests::mysql_url(), 16).await
);
backend_tests!(
    any_sqlite,
    sqlx::Any,
    Dialect::Sqlite,
    idem_tests::any(&idem_tests::sqlite_url(), 8).await
);
