//! One outbox message, several handlers (`Relay::subscribe`), and the
//! misuses that must fail loudly, on every backend against the real
//! servers, per message and with batched commits. Counted in the
//! database: each subscriber's effect exactly once per coupon (a state
//! machine and a record), every message `success`, under producer
//! duplicates and lost commit acknowledgements; a subscriber failing its
//! first attempts acts once later while the other acts once; a handler
//! making two calls on one delivery's source is dead-lettered with the
//! reason (it used to end `success` with the second effect missing); a
//! handler failing after its own call committed has its message retried.
//!
//! Its tests run one at a time, and beside no other test of the binary
//! that commits through idem (`common::hooks`): the lost-acknowledgement
//! hook is process-wide.

use crate::common::hooks;
use crate::common::relay::*;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

/// The final settlements a relay's progress hook saw, per message id.
#[derive(Clone, Default)]
struct Finals(Arc<std::sync::Mutex<std::collections::HashMap<i64, u32>>>);

impl Finals {
    fn hook<DB: idem_runtime::Backend>(&self, relay: Relay<DB>) -> Relay<DB> {
        let seen = self.0.clone();
        relay.on_settled(move |s| {
            if s.settlement.is_final() {
                *seen.lock().unwrap().entry(s.id).or_default() += 1;
            }
        })
    }

    /// `(messages seen settled for good, messages seen so more than once)`.
    fn counts(&self) -> (usize, usize) {
        let seen = self.0.lock().unwrap();
        (seen.len(), seen.values().filter(|n| **n > 1).count())
    }
}

#[tokio::test]
#[should_panic(expected = "is routed twice")]
async fn a_second_route_for_a_topic_panics() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").expect("pool");
    let _ = Relay::new(pool)
        .route("t", |_d, _m: Deduct| async { Ok(Outcome::Executed(())) })
        .route("t", |_d, _m: Deduct| async { Ok(Outcome::Executed(())) });
}

#[tokio::test]
#[should_panic(expected = "has a route already")]
async fn a_subscriber_on_a_routed_topic_panics() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").expect("pool");
    let _ = Relay::new(pool)
        .route("t", |_d, _m: Deduct| async { Ok(Outcome::Executed(())) })
        .subscribe("t", "b", |_d, _m: Deduct| async {
            Ok(Outcome::Executed(()))
        });
}

#[tokio::test]
#[should_panic(expected = "is routed twice")]
async fn a_route_on_a_subscribed_topic_panics() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").expect("pool");
    let _ = Relay::new(pool)
        .subscribe("t", "a", |_d, _m: Deduct| async {
            Ok(Outcome::Executed(()))
        })
        .route("t", |_d, _m: Deduct| async { Ok(Outcome::Executed(())) });
}

#[tokio::test]
#[should_panic(expected = "subscriber named `a` already")]
async fn two_subscribers_of_one_name_panic() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").expect("pool");
    let _ = Relay::new(pool)
        .subscribe("t", "a", |_d, _m: Deduct| async {
            Ok(Outcome::Executed(()))
        })
        .subscribe("t", "a", |_d, _m: Deduct| async {
            Ok(Outcome::Executed(()))
        });
}

macro_rules! fanout_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            async fn mail_table(pool: &Pool<Db>) {
                sqlx::query("CREATE TABLE IF NOT EXISTS idem_f_mail (coupon_id BIGINT NOT NULL)")
                    .execute(pool)
                    .await
                    .expect("create table");
            }

            /// The second subscriber: a record in a scope of its own.
            #[idempotent(key = "fanout-mail:{msg.coupon_id}", strategy = record, biz_type = "fanout_mail")]
            async fn mail(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_f_mail (coupon_id) VALUES (?)"))
                    .bind(msg.coupon_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            async fn mails(pool: &Pool<Db>, coupon: i64) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_f_mail WHERE coupon_id = ?"))
                    .bind(coupon)
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            /// `n` coupons, each with its message, every third twice (a
            /// producer retry under another message id).
            async fn produce_n(pool: &Pool<Db>, topic: &str, n: usize) -> Vec<i64> {
                let mut coupons = Vec::with_capacity(n);
                for k in 0..n {
                    coupons.push(produce(pool, topic, if k % 3 == 0 { 2 } else { 1 }).await);
                }
                coupons
            }

            fn relay(pool: &Pool<Db>, batched: bool) -> Relay<Db> {
                let relay = Relay::new(pool.clone())
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(20), Duration::from_millis(50))
                    .max_attempts(30);
                match batched {
                    true => relay.commit_batch(8).batch_size(16).concurrency(16),
                    false => relay.concurrency(8),
                }
            }

            /// Each coupon's (deductions, mails).
            async fn effects(pool: &Pool<Db>, coupons: &[i64]) -> Vec<(i64, i64)> {
                let mut out = Vec::with_capacity(coupons.len());
                for c in coupons {
                    out.push((deductions(pool, *c).await, mails(pool, *c).await));
                }
                out
            }

            async fn each_subscriber_acts_once(batched: bool) {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                mail_table(&pool).await;
                let topic = topic(if batched { "fanbatch" } else { "fan" });
                let coupons = produce_n(&pool, &topic, 30).await;
                let messages = 40;
                let finals = Finals::default();
                let relay = finals.hook(relay(&pool, batched))
                    .subscribe(topic.clone(), "deduct", |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .subscribe(topic.clone(), "mail", |d, m: Deduct| async move { mail(d.source(), &m).await });
                idem_runtime::testing::set_lost_ack_rate(0.25);
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                idem_runtime::testing::set_lost_ack_rate(0.0);
                let got = effects(&pool, &coupons).await;
                let s = relay.stats();
                eprintln!(
                    "{} fan-out (batched {batched}): executed={} duplicates={} retried={} landed={} dead={}",
                    stringify!($module),
                    s.executed(),
                    s.duplicates(),
                    s.retried(),
                    s.landed(),
                    s.dead_lettered(),
                );
                assert_eq!(got, vec![(1, 1); coupons.len()], "each subscriber's effect once per coupon");
                assert_eq!(by_status(&pool, &topic, "success").await, messages);
                assert_eq!(by_status(&pool, &topic, "failed").await, 0);
                assert_eq!(finals.counts(), (messages as usize, 0), "one final settlement per message, seen by the hook");
            }

            /// `Relay::drain` empties what is due and reports it, the
            /// report matching the database.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drain_reports_what_it_delivered() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                mail_table(&pool).await;
                let topic = topic("drain");
                let coupons = produce_n(&pool, &topic, 6).await;
                let finals = Finals::default();
                let relay = finals.hook(relay(&pool, false))
                    .subscribe(topic.clone(), "deduct", |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .subscribe(topic.clone(), "mail", |d, m: Deduct| async move { mail(d.source(), &m).await });
                let mut first_try = true;
                let report = loop {
                    match relay.drain().await {
                        Ok(report) => break report,
                        // Two claims of parallel tests can deadlock on MariaDB.
                        Err(e) if e.is_retryable() => {
                            eprintln!("drain retried: {e}");
                            first_try = false;
                        }
                        Err(e) => panic!("drain: {e}"),
                    }
                };
                eprintln!("{} drain: {}", stringify!($module), serde_json::to_string(&report).unwrap());
                assert_eq!(by_status(&pool, &topic, "pending").await, 0, "nothing left due");
                assert_eq!(effects(&pool, &coupons).await, vec![(1, 1); 6]);
                // 6 coupons, 8 messages: a copy answers Duplicate, unless it
                // ran beside its first and one of its subscribers acted.
                let s = report.stats;
                assert_eq!((s.claimed, s.executed + s.duplicates, s.retried, s.dead_lettered), (8, 8, 0, 0));
                assert!(s.executed >= 6, "{s:?}");
                assert!(report.rounds >= 1);
                assert_eq!(finals.counts(), (8, 0), "the hook saw each message settled once");
                if first_try {
                    assert_eq!(report.stats, relay.stats().snapshot(), "a first drain reports everything counted");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_message_two_subscribers_each_act_once() {
                each_subscriber_acts_once(false).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_message_two_subscribers_each_act_once_batched() {
                each_subscriber_acts_once(true).await;
            }

            async fn a_failing_subscriber_acts_later(batched: bool) {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                mail_table(&pool).await;
                let topic = topic(if batched { "fanfailbatch" } else { "fanfail" });
                let coupon = produce(&pool, &topic, 1).await;
                let tries = Arc::new(AtomicU32::new(0));
                let t = tries.clone();
                // The first subscriber fails its first two attempts.
                let relay = relay(&pool, batched)
                    .subscribe(topic.clone(), "mail", move |d, m: Deduct| {
                        let t = t.clone();
                        async move {
                            if t.fetch_add(1, Ordering::SeqCst) < 2 {
                                return Err(Error::retryable(std::io::Error::other("mail server down")));
                            }
                            mail(d.source(), &m).await
                        }
                    })
                    .subscribe(topic.clone(), "deduct", |d, m: Deduct| async move { deduct(d.source(), &m).await });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                assert_eq!(effects(&pool, &[coupon]).await, vec![(1, 1)]);
                assert_eq!(by_status(&pool, &topic, "success").await, 1);
                assert_eq!(attempts_of(&pool, &topic).await, vec![3], "two failed attempts, then the success");
                // The deduction acted on the first attempt and answered
                // Duplicate on the two after.
                assert_eq!(relay.stats().retried(), 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failing_subscriber_acts_once_later_the_other_once() {
                a_failing_subscriber_acts_later(false).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failing_subscriber_acts_once_later_the_other_once_batched() {
                a_failing_subscriber_acts_later(true).await;
            }

            async fn two_calls_on_one_delivery_dead_letter(batched: bool) {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                mail_table(&pool).await;
                let topic = topic(if batched { "twocallsbatch" } else { "twocalls" });
                let coupon = produce(&pool, &topic, 1).await;
                // The misuse: two calls on one delivery's source.
                let relay = relay(&pool, batched).route(topic.clone(), |d, m: Deduct| async move {
                    let _first = deduct(d.source(), &m).await?;
                    mail(d.source(), &m).await
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let (status, reason): (String, Option<String>) =
                    sqlx::query_as(sql(D, "SELECT status, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .expect("the message");
                let reason = reason.unwrap_or_default();
                eprintln!("{} two calls (batched {batched}): {status}: {reason}", stringify!($module));
                assert_eq!(status, "failed", "never a success with the second effect missing");
                assert!(reason.contains("misuse") && reason.contains("Relay::subscribe"), "{reason}");
                assert_eq!(mails(&pool, coupon).await, 0);
                assert_eq!(relay.stats().dead_lettered(), 1);
                assert_eq!(relay.stats().landed(), 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_calls_on_one_delivery_are_dead_lettered() {
                two_calls_on_one_delivery_dead_letter(false).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_calls_on_one_delivery_are_dead_lettered_batched() {
                two_calls_on_one_delivery_dead_letter(true).await;
            }

            async fn a_failure_after_the_call_retries(batched: bool) {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic(if batched { "afterbatch" } else { "after" });
                let coupon = produce(&pool, &topic, 1).await;
                let after = Arc::new(AtomicU32::new(0));
                let a = after.clone();
                // The call commits (and marks the message), then the next
                // step fails once: the message must run again.
                let relay = relay(&pool, batched).route(topic.clone(), move |d, m: Deduct| {
                    let a = a.clone();
                    async move {
                        let done = deduct(d.source(), &m).await?;
                        if a.fetch_add(1, Ordering::SeqCst) == 0 {
                            return Err(Error::retryable(std::io::Error::other("the step after the call failed")));
                        }
                        Ok(done)
                    }
                });
                let running = relay.clone().spawn();
                // The first run's call commits its `success` before the
                // step after it fails and the relay sets the message
                // pending again: a drain seen in between would stop the
                // relay before the second run (1 loaded suite run in 3).
                // The second run's step counts only after its call
                // committed.
                let start = Instant::now();
                while after.load(Ordering::SeqCst) < 2 {
                    assert!(start.elapsed() < Duration::from_secs(60), "the step after the call never ran again");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                drained(&pool, &topic).await;
                running.shutdown().await;
                assert_eq!(deductions(&pool, coupon).await, 1);
                assert_eq!(after.load(Ordering::SeqCst), 2, "the step after the call ran again");
                assert_eq!(by_status(&pool, &topic, "success").await, 1);
                assert_eq!(attempts_of(&pool, &topic).await, vec![2]);
                assert_eq!(relay.stats().landed(), 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failure_after_the_handlers_call_is_retried() {
                a_failure_after_the_call_retries(false).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failure_after_the_handlers_call_is_retried_batched() {
                a_failure_after_the_call_retries(true).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(fanout_tests);
