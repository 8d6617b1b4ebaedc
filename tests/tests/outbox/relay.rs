//! The outbox relay on every backend, against the real servers: it drains
//! every message through its `#[idempotent]` handler exactly once in
//! effect; poison messages are dead-lettered with their reason without
//! holding up the others; failures back off and retry; bookkeeping after a
//! failed attempt never overwrites a success. Every assertion counts rows
//! in the database. Leases, crashes and shutdown: `outbox/leases.rs`.

use crate::common::hooks;
use crate::common::relay::*;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

macro_rules! relay_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures serve every relay module; this one uses
            // only part of them.
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn relay_drains_every_message_once_in_effect() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("drain");
                let mut coupons = Vec::new();
                for n in 0..60 {
                    // Every third coupon has its message twice (a producer retry).
                    coupons.push(produce(&pool, &topic, if n % 3 == 0 { 2 } else { 1 }).await);
                }
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .batch_size(16)
                    .concurrency(8)
                    .spawn();
                drained(&pool, &topic).await;
                // A message is `success` once its handler's call committed;
                // the relay counts it in its bookkeeping just after: wait
                // for the counts rather than race them.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while relay.stats().executed() + relay.stats().duplicates() < 80
                    && std::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let (executed, duplicates) = (
                    relay.stats().executed(),
                    relay.stats().duplicates(),
                );
                relay.shutdown().await;
                for c in &coupons {
                    assert_eq!(deductions(&pool, *c).await, 1, "coupon {c}");
                }
                assert_eq!(by_status(&pool, &topic, "success").await, 80);
                assert_eq!((executed, duplicates), (60, 20));
            }

            /// 200 messages through a relay of 4 handler slots that claims
            /// `ahead` messages beyond its free slots (`None`: its
            /// default, as many as its slots), up to 64 a claim, oldest
            /// first, committing `commit_batch` messages to a transaction.
            /// Returns its claims, once every message was settled once in
            /// effect.
            async fn claims_with(ahead: Option<usize>, commit_batch: usize) -> Option<u64> {
                let pool = pool().await?;
                let topic = topic("ahead");
                let mut coupons = Vec::new();
                for _ in 0..200 {
                    coupons.push(produce(&pool, &topic, 1).await);
                }
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .concurrency(4)
                    .batch_size(64)
                    .commit_batch(commit_batch)
                    .claim_spread(1)
                    // The claims that find nothing once the table is
                    // drained: one, then one per poll.
                    .poll_interval(Duration::from_secs(5));
                let relay = match ahead {
                    Some(a) => relay.claim_ahead(a),
                    None => relay,
                };
                let relay = relay.spawn();
                drained(&pool, &topic).await;
                let claims = relay.stats().claims();
                relay.shutdown().await;
                for c in &coupons {
                    assert_eq!(deductions(&pool, *c).await, 1, "coupon {c}");
                }
                assert_eq!(attempts_of(&pool, &topic).await, vec![1; 200]);
                Some(claims)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claiming_further_ahead_takes_fewer_larger_claims() {
                let _hooks = hooks::shared().await;
                // 4 slots, 4 ahead: claims of at most 8.
                let Some(default) = claims_with(None, 1).await else { return };
                // 60 ahead: 64 first, then at least 30 (half of those
                // ahead) while there is a backlog.
                let Some(far) = claims_with(Some(60), 1).await else { return };
                eprintln!("claims of 200 messages: {default} claiming 4 ahead, {far} claiming 60 ahead");
                assert!(default >= 25, "claims of at most 8: {default}");
                assert!(far <= 10, "claims of 30 or more: {far}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batched_claims_ahead_take_more_than_the_slots() {
                let _hooks = hooks::shared().await;
                // Batches of 4 on 4 slots, 60 ahead: claims of 64 (16
                // groups of 4, each one batch), then at least 30 while the
                // backlog lasts: 7 claims as a rule (once 10, under load:
                // a claim that finds fewer than its limit ends the backlog
                // and the claims after it take the free slots until one
                // fills again). Far from the control's 50 either way.
                let Some(far) = claims_with(Some(60), 4).await else { return };
                // The control, claiming only the free slots: claims of at
                // most 4, as every batched claim took before.
                let Some(slots) = claims_with(Some(0), 4).await else { return };
                eprintln!("batched claims of 200 messages: {far} claiming 60 ahead, {slots} claiming the free slots");
                assert!(far <= 16, "claims of 30 or more: {far}");
                assert!(slots >= 50, "claims of at most 4: {slots}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claiming_ahead_without_bound_is_bounded_by_the_batch_size() {
                let _hooks = hooks::shared().await;
                // `usize::MAX` ahead: each claim takes the batch size, and
                // every message still acts once (asserted inside).
                let Some(claims) = claims_with(Some(usize::MAX), 1).await else { return };
                assert!(claims <= 10, "claims of 64 and then 32 or more: {claims}");
                // No claim of more than 64: at least four for 200 messages.
                assert!(claims >= 4, "a claim took more than the batch size: {claims}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn poison_messages_are_dead_lettered_without_holding_up_others() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("poison");
                let mut tx = <Db as idem_runtime::Backend>::begin(&pool).await.unwrap();
                // Unparsable for the route's payload type, and a key that is invalid (empty part).
                let bad = idem_runtime::outbox::enqueue(&mut tx, &topic, "bad-shape", &serde_json::json!({"coupon": "x"})).await.unwrap().id();
                tx.commit().await.unwrap();
                let mut good = Vec::new();
                for _ in 0..20 {
                    good.push(produce(&pool, &topic, 1).await);
                }
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                assert_eq!(by_status(&pool, &topic, "failed").await, 1);
                assert_eq!(by_status(&pool, &topic, "success").await, 20);
                let reason: String = sqlx::query_scalar(sql(D, "SELECT last_error FROM idem_outbox WHERE id = ?"))
                    .bind(bad)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert!(reason.contains("unparsable payload"), "{reason}");
                for c in good {
                    assert_eq!(deductions(&pool, c).await, 1);
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn non_retryable_errors_dead_letter_at_once_with_their_reason() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("illegal");
                // A coupon that is neither UNUSED nor USED: illegal state.
                let coupon = produce(&pool, &topic, 1).await;
                sqlx::query(sql(D, "UPDATE idem_r_coupon SET status = 'EXPIRED' WHERE id = ?"))
                    .bind(coupon)
                    .execute(&pool)
                    .await
                    .unwrap();
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await });
                while relay.run_once().await.unwrap() > 0 {}
                let (status, attempts, reason): (String, i32, String) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), attempts), ("failed", 1), "dead-lettered on the first attempt");
                assert!(reason.starts_with("illegal_state"), "{reason}");
                assert_eq!(deductions(&pool, coupon).await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failed_attempts_back_off_then_succeed_or_give_up() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("retry");
                let flaky = produce(&pool, &topic, 1).await;
                let tries = Arc::new(AtomicUsize::new(0));
                let t = tries.clone();
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), move |d, m: Deduct| {
                        let n = t.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if n < 2 {
                                return Err(Error::retryable("downstream busy"));
                            }
                            deduct(d.source(), &m).await
                        }
                    })
                    .backoff(Duration::from_millis(20), Duration::from_millis(100))
                    .max_attempts(5)
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                let (status, attempts, reason): (String, i32, Option<String>) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), attempts), ("success", 3));
                assert!(reason.unwrap_or_default().contains("downstream busy"));
                assert_eq!(deductions(&pool, flaky).await, 1);

                // Always failing: dead-lettered after max_attempts.
                let topic = format!("{topic}.hopeless");
                let hopeless = produce(&pool, &topic, 1).await;
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |_d, _m: Deduct| async move { Err::<Outcome<()>, _>(Error::retryable("still down")) })
                    .backoff(Duration::from_millis(10), Duration::from_millis(20))
                    .max_attempts(3)
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                let (status, attempts, reason): (String, i32, String) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), attempts), ("failed", 3));
                assert!(reason.contains("gave up after 3 attempts"), "{reason}");
                assert_eq!(deductions(&pool, hopeless).await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failure_reported_after_commit_never_overwrites_success() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("lostack");
                let coupon = produce(&pool, &topic, 1).await;
                // The handler commits (marking the message), then its caller
                // sees the commit's outcome unknown: the lost acknowledgement,
                // from the relay's view. (Any other error after the commit
                // retries the message: outbox/fanout.rs.)
                let relay = Relay::new(pool.clone()).route(topic.clone(), |d, m: Deduct| async move {
                    let _executed = deduct(d.source(), &m).await?;
                    Err::<Outcome<()>, _>(Error::CommitUnknown(sqlx::Error::Io(std::io::Error::other(
                        "commit acknowledgement lost",
                    ))))
                });
                relay.run_once().await.unwrap();
                assert_eq!(by_status(&pool, &topic, "success").await, 1, "the success stays");
                assert_eq!(relay.stats().stale(), 1);
                assert_eq!(relay.stats().landed(), 1, "found a success");
                assert_eq!(relay.stats().retried(), 0, "nothing put back");
                assert_eq!(relay.run_once().await.unwrap(), 0, "nothing left to retry");
                assert_eq!(deductions(&pool, coupon).await, 1);
            }

        }
    };
}

idem_testkit::for_each_backend!(relay_tests);
