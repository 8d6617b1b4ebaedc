//! The `record` strategy on every backend, against the real servers: 64
//! concurrent calls give one effect and one stored result; an error in the
//! body writes nothing, not even the record, and the retry executes; a
//! replay gets the stored result; the same key with another payload is a
//! conflict; the record carries its business columns and expires after its
//! ttl. Effects are counted in the database, never taken from return
//! values.

use crate::common::strategies::*;

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures hold every strategy's handlers and
            // helpers; this module uses only its strategy's part.
            #![allow(dead_code)]
            strategy_fixtures!($db, $dialect, $pool);

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

        }
    };
}

idem_testkit::for_each_backend!(backend_tests;
    postgres, mariadb, sqlite, any_postgres, any_mariadb, any_sqlite
);
