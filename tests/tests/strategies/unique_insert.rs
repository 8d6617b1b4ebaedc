//! The `unique_insert` strategy on every backend, against the real servers:
//! 64 concurrent calls give one effect; other unique violations are errors;
//! a replay is a duplicate, an error rolls back, an invalid key executes
//! nothing. Effects are counted in the database, never taken from return
//! values.

use crate::common::strategies::*;
use idem_runtime::Source;

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures hold every strategy's handlers and
            // helpers; this module uses only its strategy's part.
            #![allow(dead_code)]
            strategy_fixtures!($db, $dialect, $pool);

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
                assert!(format!("{err:#}").contains("uk_idem_t_paid_serial"), "{err:#}");
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

idem_testkit::for_each_backend!(backend_tests;
    postgres, mariadb, sqlite, any_postgres, any_mariadb, any_sqlite
);
