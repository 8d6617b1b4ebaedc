//! Key encoding against the real servers: message IDs an attacker chooses
//! cannot make a key collide with another message's key. With the template
//! `"coupon:{m.topic}:{m.msg_id}"`, (topic `a:b`, id `c`) and (topic `a`,
//! id `b:c`) once both gave `coupon:a:b:c`, so the second, legitimate
//! message was answered as a duplicate of the first and never ran (or, with
//! another payload, was a key conflict). Each part is now percent-encoded:
//! the keys are `coupon:a%3Ab:c` and `coupon:a:b%3Ac`. Effects are counted
//! in the database, never taken from return values.

use idem_runtime::Dialect;
use idem_runtime::{Outcome, idempotent};
use idem_testkit::{sql, unique};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Grant {
    pub(crate) topic: String,
    pub(crate) msg_id: String,
    pub(crate) payload: String,
}

/// A statement on this test's own table (`{t}` in `text`).
fn on_table(d: Dialect, table: &str, text: &str) -> sqlx::AssertSqlSafe<String> {
    sql(d, Box::leak(text.replace("{t}", table).into_boxed_str()))
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;

            #[idempotent(
                key = "coupon:{m.topic}:{m.msg_id}",
                strategy = record,
                biz_type = "coupon_grant",
                fingerprint = [m],
            )]
            async fn grant(tx: &mut Transaction<'_, Db>, m: &Grant, table: &str) -> Result<(), sqlx::Error> {
                sqlx::query(on_table(D, table, "INSERT INTO {t} (topic, msg_id, payload) VALUES (?, ?, ?)"))
                    .bind(&m.topic)
                    .bind(&m.msg_id)
                    .bind(&m.payload)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            async fn effects(pool: &Pool<Db>, table: &str) -> i64 {
                sqlx::query_scalar(on_table(D, table, "SELECT COUNT(*) FROM {t}"))
                    .fetch_one(pool)
                    .await
                    .expect("count effects")
            }

            #[tokio::test]
            async fn crafted_ids_do_not_collide() {
                let Some(pool) = $pool else { return };
                let table = unique("idem_t_keys");
                sqlx::query(on_table(
                    D,
                    &table,
                    "CREATE TABLE {t} (topic VARCHAR(64) NOT NULL, msg_id VARCHAR(64) NOT NULL, payload VARCHAR(64) NOT NULL)",
                ))
                .execute(&pool)
                .await
                .expect("create effect table");
                // A topic no earlier run used: `<u>:b` + `c` against `<u>` + `b:c`.
                let a = unique("a");
                let legit = Grant { topic: format!("{a}:b"), msg_id: "c".into(), payload: "legitimate".into() };
                let crafted = Grant { topic: a.clone(), msg_id: "b:c".into(), payload: "crafted".into() };
                assert_eq!(grant(&pool, &legit, &table).await.expect("first message"), Outcome::Executed(()));
                let second = grant(&pool, &crafted, &table).await;
                assert!(
                    matches!(second, Ok(Outcome::Executed(()))),
                    "the second message must run on its own key, got {second:?}"
                );
                assert_eq!(effects(&pool, &table).await, 2, "both messages must take effect");
                // Each is still deduplicated against itself.
                for m in [&crafted, &legit] {
                    let replay = grant(&pool, m, &table).await;
                    assert!(matches!(replay, Ok(Outcome::Duplicate(_))), "{replay:?}");
                }
                assert_eq!(effects(&pool, &table).await, 2);
                sqlx::query(on_table(D, &table, "DROP TABLE {t}")).execute(&pool).await.expect("drop");
            }
        }
    };
}

idem_testkit::for_each_backend!(backend_tests; postgres(4), mariadb(4), sqlite(4));
