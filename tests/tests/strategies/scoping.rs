//! What counts as "the same" record or message, on every backend, against
//! the real servers: two record handlers sharing a key template keep a
//! record each (records are unique per `(biz_type, key)`), and keys differ
//! by their exact bytes — a trailing space is another key (MariaDB's
//! `utf8mb4_bin` is PAD SPACE and used to treat them as equal). Every
//! assertion counts rows in the database.

use idem_runtime::Dialect;
use idem_runtime::outbox::enqueue;
use idem_runtime::{Outcome, idempotent};
use idem_testkit::{ids, sql};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OrderPaid {
    pub(crate) order_id: String,
}

macro_rules! scoping_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;

            async fn pool() -> Option<Pool<Db>> {
                let pool: Pool<Db> = $pool?;
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77021)")
                        .execute(&mut *tx)
                        .await
                        .expect("lock");
                }
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS idem_s_effect \
                     (kind VARCHAR(16) NOT NULL, order_id VARCHAR(64) NOT NULL)",
                )
                .execute(&mut *tx)
                .await
                .expect("create table");
                tx.commit().await.expect("commit");
                Some(pool)
            }

            #[idempotent(key = "order-paid:{m.order_id}", strategy = record, biz_type = "send_email", ttl = "1h")]
            async fn send_email(tx: &mut Transaction<'_, Db>, m: &OrderPaid) -> Result<String, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_s_effect (kind, order_id) VALUES ('email', ?)"))
                    .bind(m.order_id.clone())
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("mailed {}", m.order_id))
            }

            #[idempotent(key = "order-paid:{m.order_id}", strategy = record, biz_type = "award_points", ttl = "1h")]
            async fn award_points(tx: &mut Transaction<'_, Db>, m: &OrderPaid) -> Result<i64, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_s_effect (kind, order_id) VALUES ('points', ?)"))
                    .bind(m.order_id.clone())
                    .execute(&mut **tx)
                    .await?;
                Ok(10)
            }

            async fn effects(pool: &Pool<Db>, kind: &str, order_id: &str) -> i64 {
                // Compared in Rust: the column's collation must not decide.
                let rows: Vec<String> = sqlx::query_scalar(sql(
                    D,
                    "SELECT order_id FROM idem_s_effect WHERE kind = ?",
                ))
                .bind(kind.to_string())
                .fetch_all(pool)
                .await
                .expect("count");
                rows.iter().filter(|o| o.as_str() == order_id).count() as i64
            }

            #[tokio::test]
            async fn two_record_handlers_sharing_a_key_template_each_act_once() {
                let Some(pool) = pool().await else { return };
                let m = OrderPaid { order_id: format!("ORD-{}", ids(1)) };
                assert_eq!(send_email(&pool, &m).await.expect("email"), Outcome::Executed(format!("mailed {}", m.order_id)));
                assert_eq!(award_points(&pool, &m).await.expect("points"), Outcome::Executed(10));
                assert_eq!(effects(&pool, "email", &m.order_id).await, 1);
                assert_eq!(effects(&pool, "points", &m.order_id).await, 1);
                // Replays: each gets its own stored result back, nothing runs.
                assert_eq!(
                    send_email(&pool, &m).await.expect("email replay"),
                    Outcome::Duplicate(Some(format!("mailed {}", m.order_id)))
                );
                assert_eq!(award_points(&pool, &m).await.expect("points replay"), Outcome::Duplicate(Some(10)));
                assert_eq!(effects(&pool, "email", &m.order_id).await, 1);
                assert_eq!(effects(&pool, "points", &m.order_id).await, 1);
                let key = format!("order-paid:{}", m.order_id);
                let records: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?"))
                    .bind(key.clone())
                    .fetch_one(&pool)
                    .await
                    .expect("records");
                assert_eq!(records, 2);
                // The operator's look-up: one record per biz_type, or the one asked for.
                let found = idem_runtime::archive::find_record(&pool, &key, None).await.expect("find");
                let types: Vec<&str> = found.iter().map(|r| r.biz_type.as_str()).collect();
                assert_eq!(types, ["award_points", "send_email"]);
                let one = idem_runtime::archive::find_record(&pool, &key, Some("send_email")).await.expect("find one");
                assert_eq!(one.len(), 1);
                assert_eq!(one[0].result.as_deref(), Some(format!("\"mailed {}\"", m.order_id).as_str()));
            }

            #[tokio::test]
            async fn a_key_with_a_trailing_space_is_another_key() {
                let Some(pool) = pool().await else { return };
                let base = format!("ORD-{}", ids(1));
                let spaced = format!("{base} ");
                let a = OrderPaid { order_id: base.clone() };
                let b = OrderPaid { order_id: spaced.clone() };
                assert!(send_email(&pool, &a).await.expect("first").is_executed());
                let second = send_email(&pool, &b).await.expect("second");
                assert_eq!(second, Outcome::Executed(format!("mailed {spaced}")));
                assert_eq!(effects(&pool, "email", &base).await, 1);
                assert_eq!(effects(&pool, "email", &spaced).await, 1);
            }

            #[tokio::test]
            async fn a_msg_id_with_a_trailing_space_is_another_message() {
                let Some(pool) = pool().await else { return };
                let topic = format!("scoping.{}", ids(1));
                let mut tx = <Db as idem_runtime::Backend>::begin(&pool).await.expect("begin");
                let first = enqueue(&mut tx, &topic, "m-1", &serde_json::json!({ "n": 1 })).await.expect("m-1");
                let second = enqueue(&mut tx, &topic, "m-1 ", &serde_json::json!({ "n": 2 })).await.expect("m-1 with a space");
                tx.commit().await.expect("commit");
                assert!(first.is_new() && second.is_new(), "{first:?} {second:?}");
                assert_ne!(first.id(), second.id());
                let n: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ?"))
                    .bind(topic.clone())
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                assert_eq!(n, 2);
                // A topic with a trailing space is another topic too.
                let mut tx = <Db as idem_runtime::Backend>::begin(&pool).await.expect("begin");
                let other = enqueue(&mut tx, &format!("{topic} "), "m-1", &serde_json::json!({ "n": 3 })).await.expect("other topic");
                assert!(other.is_new());
                tx.commit().await.expect("commit");
            }
        }
    };
}

idem_testkit::for_each_backend!(scoping_tests; postgres(4), mariadb(4) as mysql, sqlite(2));
