//! The `state_machine` strategy on every backend, against the real servers:
//! 64 concurrent calls with one key give one effect; a replay after commit
//! is a duplicate; an error in the body rolls everything back and the retry
//! executes; an illegal state (or invalid key) changes nothing; the key
//! column tells another message from a retry; an outbox source must hold
//! its pending message, which is marked in the same transaction. Effects
//! are counted in the database, never taken from return values.

use crate::common::strategies::*;
use idem_runtime::Source;

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures hold every strategy's handlers and
            // helpers; this module uses only its strategy's part.
            #![allow(dead_code)]
            strategy_fixtures!($db, $dialect, $pool);

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

        }
    };
}

idem_testkit::for_each_backend!(backend_tests;
    postgres, mariadb, sqlite, any_postgres, any_mariadb, any_sqlite
);
