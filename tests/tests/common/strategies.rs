//! What the three strategies' tests share (`strategies/state_machine.rs`,
//! `strategies/record.rs`, `strategies/unique_insert.rs`): the messages, the
//! handlers under test and the helpers that count effects in the database.
//! Every suite runs on six backends (`idem_testkit::for_each_backend!`):
//! PostgreSQL, MariaDB and SQLite natively, then the same three through
//! `sqlx::Any` (one handler, the dialect chosen by URL).
//!
//! Each module uses only part of it (`strategy_fixtures!`).

pub(crate) use super::coupons::CouponState;
pub(crate) use idem_runtime::Dialect;
pub(crate) use idem_runtime::outbox::OutboxLease;
pub(crate) use idem_runtime::{Error, Outcome, idempotent};
pub(crate) use idem_testkit::{concurrently, ids, sql};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deduct {
    pub msg_id: String,
    pub coupon_id: i64,
    pub order_id: i64,
    /// Makes the body fail after its write (a fault inside the transaction).
    pub fail: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Notice {
    pub msg_id: String,
    pub user_id: i64,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Receipt {
    pub notice_row: i64,
    pub text: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Payment {
    pub serial: String,
    /// The platform's reference, unique too (another unique index).
    pub ext_ref: String,
    pub amount: i64,
    pub fail: bool,
}

pub(crate) fn digits_only(key: &str) -> Result<(), String> {
    let serial = key.rsplit(':').next().unwrap_or_default();
    if serial.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(format!("payment serial `{serial}` is not numeric"))
    }
}

/// A body error that is not a database error.
#[derive(Debug)]
pub(crate) struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("boom: injected failure after the write")
    }
}
impl std::error::Error for Boom {}

pub(crate) const CONCURRENCY: usize = 64;

/// The tables, the handlers under test and the helpers of one backend's
/// module: `$db` the database, `$dialect` its dialect, `$pool` an
/// `Option<Pool<$db>>` expression (`None`: skipped).
macro_rules! strategy_fixtures {
    ($db:ty, $dialect:expr, $pool:expr) => {
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
                    .expect("enqueue")
                    .id();
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

    };
}
