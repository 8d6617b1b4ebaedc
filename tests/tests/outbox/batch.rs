//! Batched commits in the relay (`Relay::commit_batch`), on every backend
//! against the real servers: a batch's handlers run in one transaction,
//! each under its own savepoint, and the batch commits once. Counted in
//! the database: every coupon deducted exactly once (double 0, lost 0),
//! every message's status and attempts; a failing message in the middle
//! of a batch rolls back alone, is retried alone and dead-letters with its
//! reason; a panicking handler takes down nothing; lost acknowledgements
//! of batch commits (the `testing` hook, on every backend) are read back;
//! a batch slower than its lease is never taken over; a call cancelled
//! mid-body leaves nothing in the batch. SIGKILL mid-batch:
//! `clusters/processes.rs` (`*_batched_relay_killed_mid_batch_loses_nothing`).
//!
//! Hot rows: every handler also updates one shared counter row, and
//! batch commits lose deadlocks (the `testing` hook
//! `set_batch_conflicts`, deterministic): the counter equals the number
//! of messages, each deduction once, and the batch size shrank (AIMD);
//! also with lost acknowledgements. Its control turns the shrinking off.
//!
//! After four clean batches in a row a relay runs its batches without
//! savepoints; a failing call there undoes its batch, whose messages go one
//! by one (the failing one dead-letters alone, the others commit once).
//!
//! The control breaks the savepoints (a failed call in a batch releases
//! its savepoint instead of rolling back to it; in a batch without
//! savepoints, keeps its effects) and shows both failing-message tests
//! catching it.
//!
//! Its tests run one at a time, and beside no other test of the binary
//! that commits through idem (`common::hooks`): the `testing` hooks (lost
//! acknowledgements, broken savepoints) are process-wide.

use crate::common::hooks;
use crate::common::relay::*;
use std::sync::Arc;

/// The trap of the deadlock test: the first call seen on each of two
/// connections (the first call of each of two batches) takes stock row A or
/// B and waits for the other; the second call on each connection takes the
/// other one's row. Sprung once both batches made their second call; every
/// later call takes the row it is given.
struct Trap {
    rows: [i64; 2],
    on: bool,
    met: tokio::sync::Barrier,
    /// (connection, calls) of the two batches, in order of arrival.
    batches: std::sync::Mutex<Vec<(i64, u32)>>,
    /// The first calls did not meet (they were not in two batches at once).
    missed: std::sync::atomic::AtomicBool,
}

impl Trap {
    fn new(rows: [i64; 2]) -> Self {
        Trap {
            rows,
            on: true,
            met: tokio::sync::Barrier::new(2),
            batches: Default::default(),
            missed: Default::default(),
        }
    }

    fn off() -> Self {
        Trap {
            on: false,
            ..Trap::new([0, 0])
        }
    }

    fn sprung(&self) -> bool {
        let b = self.batches.lock().expect("trap");
        b.len() == 2
            && b.iter().all(|(_, calls)| *calls >= 2)
            && !self.missed.load(Ordering::Relaxed)
    }

    fn state(&self) -> (Vec<(i64, u32)>, bool) {
        (
            self.batches.lock().expect("trap").clone(),
            self.missed.load(Ordering::Relaxed),
        )
    }

    /// The row a call on connection `conn` takes (`given` once sprung),
    /// and whether it then waits for the other batch.
    fn row(&self, conn: i64, given: i64) -> (i64, bool) {
        let mut b = self.batches.lock().expect("trap");
        if !self.on || (b.len() == 2 && b.iter().all(|(_, calls)| *calls >= 2)) {
            return (given, false);
        }
        match b.iter().position(|(c, _)| *c == conn) {
            None if b.len() < 2 => {
                b.push((conn, 1));
                (self.rows[b.len() - 1], true)
            }
            Some(i) if b[i].1 == 1 => {
                b[i].1 = 2;
                (self.rows[1 - i], false)
            }
            _ => (given, false),
        }
    }

    /// Waits (at most 20 s) for the other batch's first call.
    async fn meet(&self) {
        if tokio::time::timeout(Duration::from_secs(20), self.met.wait())
            .await
            .is_err()
        {
            self.missed.store(true, Ordering::Relaxed);
        }
    }
}

macro_rules! batch_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);
            use idem_runtime::testing::{Kind, lost_acks_on};

            /// The deduction, then a refusal: its effects must roll back.
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_then_fail(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<(), Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                Err(Error::retryable("downstream refused the deduction"))
            }

            /// The deduction, then a panic (on the first attempt only).
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_then_panic(tx: &mut Transaction<'_, Db>, msg: &Deduct, attempt: i32) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                if attempt == 1 {
                    panic!("handler bug (attempt 1)");
                }
                Ok(())
            }

            /// The deduction, then a stall longer than its caller waits.
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_then_stall(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok(())
            }

            /// A handler whose body makes a second call on its delivery's
            /// source, inside its own call: a call inside a call.
            #[idempotent(key = "nested:{d.topic}:{d.msg_id}", strategy = record, biz_type = "nested")]
            async fn deduct_nested(tx: &mut Transaction<'_, Db>, d: &idem_runtime::outbox::Delivery<Db>, msg: &Deduct) -> Result<(), Error> {
                let _ = &tx;
                let _inner = deduct(d.source(), msg).await?;
                Ok(())
            }

            /// `n` coupons, each with its message (every third twice).
            async fn produce_n(pool: &Pool<Db>, topic: &str, n: usize, copies_every_third: bool) -> Vec<i64> {
                let mut coupons = Vec::with_capacity(n);
                for k in 0..n {
                    let copies = if copies_every_third && k % 3 == 0 { 2 } else { 1 };
                    coupons.push(produce(pool, topic, copies).await);
                }
                coupons
            }

            /// (double, lost) deductions among `coupons`.
            async fn double_and_lost(pool: &Pool<Db>, coupons: &[i64]) -> (usize, usize) {
                let (mut double, mut lost) = (0, 0);
                for c in coupons {
                    let n = deductions(pool, *c).await;
                    double += usize::from(n > 1);
                    lost += usize::from(n == 0);
                }
                (double, lost)
            }

            fn batched(pool: &Pool<Db>) -> Relay<Db> {
                Relay::new(pool.clone())
                    .commit_batch(16)
                    .batch_size(32)
                    .concurrency(32)
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(50), Duration::from_millis(100))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batched_drain_delivers_every_message_once() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("batchdrain");
                // 90 coupons, 120 messages: the copies answer Duplicate,
                // often inside the same batch as the first.
                let coupons = produce_n(&pool, &topic, 90, true).await;
                let relay = batched(&pool)
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let s = relay.stats();
                let (executed, duplicates, batches) = (
                    s.executed(),
                    s.duplicates(),
                    s.batches(),
                );
                let (double, lost) = double_and_lost(&pool, &coupons).await;
                eprintln!(
                    "{}: batch drain: double={double} lost={lost} executed={executed} duplicates={duplicates} batch_commits={batches} messages_per_commit={:.1}",
                    stringify!($module),
                    120.0 / batches.max(1) as f64
                );
                assert_eq!((double, lost), (0, 0), "double and lost deductions");
                assert_eq!(by_status(&pool, &topic, "success").await, 120);
                assert_eq!(attempts_of(&pool, &topic).await, vec![1; 120], "one attempt each");
                assert_eq!((executed, duplicates), (90, 30));
                assert!(batches > 0 && batches < 60, "messages shared their commits: {batches} commits");
                assert_eq!(s.lost_batches(), 0);
            }

            /// 31 good coupons and one whose handler deducts and then fails,
            /// in the middle of the first batch; `broken`: the control's
            /// broken savepoints. Returns the failing coupon's (deductions,
            /// status, attempts, reason) and the good ones' (double, lost).
            async fn failing_message_mid_batch(broken: bool) -> Option<((i64, String, i32, String), (usize, usize), i64)> {
                let pool = pool().await?;
                let topic = topic(if broken { "batchfailctl" } else { "batchfail" });
                let mut good = produce_n(&pool, &topic, 8, false).await;
                let bad = produce(&pool, &topic, 1).await;
                good.extend(produce_n(&pool, &topic, 23, false).await);
                idem_runtime::testing::set_broken_batch_savepoints(broken);
                let relay = batched(&pool).max_attempts(3).route(topic.clone(), move |d, m: Deduct| async move {
                    if m.coupon_id == bad {
                        return deduct_then_fail(d.source(), &m).await;
                    }
                    deduct(d.source(), &m).await
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                idem_runtime::testing::set_broken_batch_savepoints(false);
                let (status, attempts, reason): (String, i32, Option<String>) = sqlx::query_as(sql(
                    D,
                    "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ? AND msg_id = ?",
                ))
                .bind(&topic)
                .bind(format!("m-{bad}-0"))
                .fetch_one(&pool)
                .await
                .expect("the failing message");
                let bad_row = (deductions(&pool, bad).await, status, attempts, reason.unwrap_or_default());
                let good_counts = double_and_lost(&pool, &good).await;
                let success = by_status(&pool, &topic, "success").await;
                eprintln!(
                    "{}: failing message mid-batch{}: its deductions={} status={} attempts={} good double={} lost={} successes={success} batch_commits={}",
                    stringify!($module),
                    if broken { " (control: broken savepoints)" } else { "" },
                    bad_row.0,
                    bad_row.1,
                    bad_row.2,
                    good_counts.0,
                    good_counts.1,
                    relay.stats().batches(),
                );
                Some((bad_row, good_counts, success))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failing_message_mid_batch_rolls_back_alone_and_dead_letters() {
                let _one = hooks::exclusive().await;
                let Some(((deducted, status, attempts, reason), good, success)) = failing_message_mid_batch(false).await else { return };
                assert_eq!(good, (0, 0), "the others committed, once each");
                assert_eq!(success, 31);
                assert_eq!(deducted, 0, "the failed message's effects rolled back to its savepoint");
                assert_eq!(status, "failed", "dead-lettered after max_attempts");
                assert_eq!(attempts, 3);
                assert!(reason.contains("gave up after 3 attempts") && reason.contains("downstream refused"), "{reason}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(idem_broken), ignore = "a control of a deliberately broken build: RUSTFLAGS=\"--cfg idem_broken\"")]
            async fn control_broken_savepoints_are_caught() {
                let _one = hooks::exclusive().await;
                let Some(((deducted, status, _, _), _, _)) = failing_message_mid_batch(true).await else { return };
                // The failed call's deduction committed with the batch, on
                // every attempt (the call failed before its transition): the
                // real test's `deducted == 0` fails.
                assert!(deducted >= 1, "the broken build was not caught: deductions={deducted} status={status}");
            }

            /// A relay that earned its trust (64 good messages: four clean
            /// batches of 16 and more, after which its batches run without
            /// savepoints), then 31 good coupons and one whose handler
            /// deducts and fails mid-batch; `broken`: the control's broken
            /// savepoints (a failed call keeps its effects). Returns the
            /// failing coupon's (deductions, status, attempts), the good
            /// ones' (double, lost) and the lost batches of the second part.
            async fn failing_message_in_a_trusted_batch(broken: bool) -> Option<((i64, String, i32), (usize, usize), u64)> {
                let pool = pool().await?;
                let topic = topic(if broken { "trustfailctl" } else { "trustfail" });
                let warm = produce_n(&pool, &topic, 64, false).await;
                let bad = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(-1));
                let b = bad.clone();
                let relay = batched(&pool).max_attempts(3).route(topic.clone(), move |d, m: Deduct| {
                    let b = b.clone();
                    async move {
                        if m.coupon_id == b.load(Ordering::SeqCst) {
                            return deduct_then_fail(d.source(), &m).await;
                        }
                        deduct(d.source(), &m).await
                    }
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                let before = relay.stats().lost_batches();
                // Before the failing message exists: the running relay may
                // take it, and use up its three attempts, while the rest is
                // still being produced.
                idem_runtime::testing::set_broken_batch_savepoints(broken);
                let mut good = produce_n(&pool, &topic, 8, false).await;
                let bad_coupon = produce(&pool, &topic, 1).await;
                bad.store(bad_coupon, Ordering::SeqCst);
                good.extend(produce_n(&pool, &topic, 23, false).await);
                good.extend(warm);
                drained(&pool, &topic).await;
                running.shutdown().await;
                idem_runtime::testing::set_broken_batch_savepoints(false);
                let lost = relay.stats().lost_batches() - before;
                let (status, attempts): (String, i32) = sqlx::query_as(sql(
                    D,
                    "SELECT status, attempts FROM idem_outbox WHERE topic = ? AND msg_id = ?",
                ))
                .bind(&topic)
                .bind(format!("m-{bad_coupon}-0"))
                .fetch_one(&pool)
                .await
                .expect("the failing message");
                let bad_row = (deductions(&pool, bad_coupon).await, status, attempts);
                let good_counts = double_and_lost(&pool, &good).await;
                eprintln!(
                    "{}: failing message in a trusted batch{}: its deductions={} status={} attempts={} good double={} lost={} batches undone={lost}",
                    stringify!($module),
                    if broken { " (control: broken savepoints)" } else { "" },
                    bad_row.0,
                    bad_row.1,
                    bad_row.2,
                    good_counts.0,
                    good_counts.1,
                );
                Some((bad_row, good_counts, lost))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failing_call_undoes_its_trusted_batch_and_fails_alone() {
                let _one = hooks::exclusive().await;
                let Some(((deducted, status, attempts), good, undone)) = failing_message_in_a_trusted_batch(false).await else { return };
                assert_eq!(good, (0, 0), "the others committed, once each");
                assert_eq!(deducted, 0, "the failed message's effects rolled back with its batch");
                assert_eq!((status.as_str(), attempts), ("failed", 3), "dead-lettered after max_attempts");
                // The batch without savepoints was undone (its messages then
                // went one by one): the path this test is about ran.
                assert!(undone >= 1, "no batch ran without savepoints");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(idem_broken), ignore = "a control of a deliberately broken build: RUSTFLAGS=\"--cfg idem_broken\"")]
            async fn control_a_trusted_batch_keeping_a_failed_call_is_caught() {
                let _one = hooks::exclusive().await;
                let Some(((deducted, status, _), _, _)) = failing_message_in_a_trusted_batch(true).await else { return };
                // The failed call's deduction committed with its batch: the
                // real test's `deducted == 0` fails.
                assert!(deducted >= 1, "the broken build was not caught: deductions={deducted} status={status}");
            }

            /// A call cancelled mid-body (its caller's time-out) after its
            /// deduction: the batch rolls back to the call's savepoint
            /// before its next statement, and goes on.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_call_cancelled_mid_body_leaves_nothing_in_the_batch() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("batchcancel");
                let coupons = produce_n(&pool, &topic, 12, false).await;
                let culprit = coupons[4];
                let relay = batched(&pool).route(topic.clone(), move |d, m: Deduct| async move {
                    if m.coupon_id == culprit && d.message().attempts == 1 {
                        let timed = tokio::time::timeout(Duration::from_millis(100), deduct_then_stall(d.source(), &m)).await;
                        return match timed {
                            Ok(outcome) => outcome,
                            Err(_) => Err(Error::retryable("handler timed out")),
                        };
                    }
                    deduct(d.source(), &m).await
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let (double, lost) = double_and_lost(&pool, &coupons).await;
                let attempts = attempts_of(&pool, &topic).await;
                let lost_batches = relay.stats().lost_batches();
                eprintln!(
                    "{}: a call cancelled mid-body: double={double} lost={lost} lost_batches={lost_batches} attempts={attempts:?}",
                    stringify!($module)
                );
                assert_eq!((double, lost), (0, 0), "double and lost deductions");
                assert_eq!(by_status(&pool, &topic, "success").await, 12);
                assert_eq!(lost_batches, 0, "the batch went on");
                assert_eq!(attempts.iter().filter(|a| **a == 2).count(), 1, "{attempts:?}");
                assert_eq!(attempts.iter().filter(|a| **a == 1).count(), 11, "{attempts:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_call_inside_a_call_fails_fast_instead_of_waiting_forever() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("batchnested");
                let good = produce_n(&pool, &topic, 6, false).await;
                let nested = produce(&pool, &topic, 1).await;
                let relay = batched(&pool).max_attempts(2).route(topic.clone(), move |d, m: Deduct| async move {
                    if m.coupon_id == nested {
                        return deduct_nested(d.source(), &d, &m).await;
                    }
                    deduct(d.source(), &m).await
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let (status, reason): (String, Option<String>) = sqlx::query_as(sql(
                    D,
                    "SELECT status, last_error FROM idem_outbox WHERE topic = ? AND msg_id = ?",
                ))
                .bind(&topic)
                .bind(format!("m-{nested}-0"))
                .fetch_one(&pool)
                .await
                .expect("the nested message");
                let reason = reason.unwrap_or_default();
                eprintln!("{}: a call inside a call: status={status} reason={reason}", stringify!($module));
                assert_eq!(double_and_lost(&pool, &good).await, (0, 0));
                assert_eq!(deductions(&pool, nested).await, 0, "the inner call never ran");
                assert_eq!(status, "failed");
                assert!(reason.contains("another call of this delivery"), "{reason}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn panicking_handler_mid_batch_takes_down_nothing() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("batchpanic");
                let coupons = produce_n(&pool, &topic, 40, false).await;
                let panicky: Vec<i64> = vec![coupons[5], coupons[20]];
                let relay = batched(&pool).route(topic.clone(), move |d, m: Deduct| {
                    let panics = panicky.contains(&m.coupon_id);
                    async move {
                        if panics {
                            return deduct_then_panic(d.source(), &m, d.message().attempts).await;
                        }
                        deduct(d.source(), &m).await
                    }
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let (double, lost) = double_and_lost(&pool, &coupons).await;
                let attempts = attempts_of(&pool, &topic).await;
                let retried = relay.stats().retried();
                eprintln!(
                    "{}: panicking handlers mid-batch: double={double} lost={lost} retried={retried} attempts_total={}",
                    stringify!($module),
                    attempts.iter().sum::<i32>()
                );
                assert_eq!((double, lost), (0, 0), "double and lost deductions");
                assert_eq!(by_status(&pool, &topic, "success").await, 40);
                assert_eq!(retried, 2, "the two panicking messages, retried once each");
                assert_eq!(attempts.iter().filter(|a| **a == 2).count(), 2, "{attempts:?}");
                assert_eq!(attempts.iter().filter(|a| **a == 1).count(), 38, "{attempts:?}");
            }

            /// On its first attempt, the culprit's handler cancels its call
            /// (a time-out) while the call's savepoint is being opened: the
            /// batch's transaction is lost (rolled back as a whole).
            ///
            /// One thread, so that the cancellation always lands there: the
            /// call opens its savepoint in a task of its own, which cannot
            /// run before the handler, polling the call once and dropping
            /// it without yielding in between, returns. On two workers the
            /// other one could run that task and have the `SAVEPOINT`
            /// answered before the poll looked (a preempted thread, on a
            /// loaded machine): the call was then dropped inside its
            /// savepoint, rolled back to it, the batch committed without
            /// it, and no batch was lost.
            #[tokio::test(flavor = "current_thread")]
            async fn a_lost_batch_transaction_redelivers_its_messages_alone() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("batchgone");
                let coupons = produce_n(&pool, &topic, 16, false).await;
                let culprit = coupons[6];
                let relay = batched(&pool).route(topic.clone(), move |d, m: Deduct| async move {
                    if m.coupon_id == culprit && d.message().attempts == 1 {
                        // Polled once (it waits for its SAVEPOINT, whose task
                        // has not run yet), then dropped.
                        let mut call = Box::pin(deduct(d.source(), &m));
                        if let std::task::Poll::Ready(outcome) = futures::poll!(call.as_mut()) {
                            return outcome;
                        }
                        drop(call);
                        return Err(Error::retryable("handler timed out"));
                    }
                    deduct(d.source(), &m).await
                });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let (double, lost) = double_and_lost(&pool, &coupons).await;
                let attempts = attempts_of(&pool, &topic).await;
                let s = relay.stats();
                let lost_batches = s.lost_batches();
                eprintln!(
                    "{}: lost batch transaction: double={double} lost={lost} lost_batches={lost_batches} attempts={attempts:?}",
                    stringify!($module)
                );
                assert_eq!((double, lost), (0, 0), "double and lost deductions");
                assert_eq!(by_status(&pool, &topic, "success").await, 16);
                assert!(lost_batches >= 1, "the batch's transaction was lost");
                // The others were delivered again under the same lease: no
                // attempt burnt. The culprit failed alone and was retried.
                assert_eq!(attempts.iter().filter(|a| **a == 1).count(), 15, "{attempts:?}");
                assert_eq!(attempts.iter().filter(|a| **a == 2).count(), 1, "{attempts:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_batch_commit_acks_are_read_back() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("batchlost");
                let coupons = produce_n(&pool, &topic, 64, false).await;
                let before = lost_acks_on(Kind::Batch);
                // 16 batch commits (and the claims' and bookkeeping's
                // commits between them): some lose their acknowledgement.
                let relay = Relay::new(pool.clone())
                    .commit_batch(4)
                    .batch_size(16)
                    .concurrency(16)
                    .lease(Duration::from_secs(60))
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(500), Duration::from_secs(1))
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await });
                idem_runtime::testing::set_lost_ack_rate(0.3);
                let running = relay.clone().spawn();
                let start = Instant::now();
                while by_status(&pool, &topic, "pending").await > 0 {
                    assert!(start.elapsed() < Duration::from_secs(20), "the drain waited for a lease to expire");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                idem_runtime::testing::set_lost_ack_rate(0.0);
                running.shutdown().await;
                let lost_batches = lost_acks_on(Kind::Batch) - before;
                let s = relay.stats();
                let (double, lost) = double_and_lost(&pool, &coupons).await;
                let (landed, retried, duplicates, stale) = (
                    s.landed(),
                    s.retried(),
                    s.duplicates(),
                    s.stale(),
                );
                eprintln!(
                    "{}: lost batch-commit acks: double={double} lost={lost} batch_acks_lost={lost_batches} landed={landed} retried={retried} duplicates={duplicates} stale={stale} executed={}",
                    stringify!($module),
                    s.executed()
                );
                assert!(lost_batches > 0, "no batch commit lost its acknowledgement");
                assert_eq!((double, lost), (0, 0), "double and lost deductions");
                assert_eq!(by_status(&pool, &topic, "success").await, 64);
                assert!(landed > 0, "the lost batches' messages were read back as landed");
                assert_eq!(retried, 0, "a landed batch is not retried");
            }

            /// One batch of 8 handlers of 150 ms (1.2 s, twice its lease)
            /// and a rival relay claiming meanwhile; `broken`: the
            /// control's unlocked leases. Returns the attempts of the
            /// messages, the rival's claims, and (double, lost).
            async fn slow_batch(broken: bool) -> Option<(Vec<i32>, u64, (usize, usize))> {
                let pool = pool().await?;
                let topic = topic(if broken { "batchslowctl" } else { "batchslow" });
                idem_runtime::testing::set_broken_batch_leases(broken);
                let coupons = produce_n(&pool, &topic, 8, false).await;
                let lease = Duration::from_millis(600);
                // One batch of 8 handlers of 150 ms: 1.2 s, twice its lease.
                let owner = format!("batch-slow-{}", ids(1));
                let slow = Relay::new(pool.clone())
                    .owner(owner.clone())
                    .commit_batch(8)
                    .batch_size(8)
                    .concurrency(8)
                    .lease(lease)
                    .route(topic.clone(), |d, m: Deduct| async move {
                        deduct_slow(d.source(), &m, Duration::from_millis(150)).await
                    });
                let rival = Relay::new(pool.clone())
                    .lease(lease)
                    .poll_interval(Duration::from_millis(20))
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await });
                // The rival starts once the batch holds the messages, and
                // keeps claiming while the batch outlives its lease.
                let held = async {
                    let start = Instant::now();
                    loop {
                        let n: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND lease_owner LIKE ?"))
                            .bind(&topic)
                            .bind(format!("{owner}#%"))
                            .fetch_one(&pool)
                            .await
                            .expect("count");
                        if n == 8 {
                            break;
                        }
                        assert!(start.elapsed() < Duration::from_secs(20), "the batch never claimed");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let running = rival.clone().spawn();
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    running.shutdown().await;
                };
                let (claimed, ()) = tokio::join!(run_once_retrying(&slow, true), held);
                assert_eq!(claimed, 8);
                let rival_claims = rival.stats().claimed();
                let attempts = attempts_of(&pool, &topic).await;
                let (double, lost) = double_and_lost(&pool, &coupons).await;
                idem_runtime::testing::set_broken_batch_leases(false);
                assert_eq!(by_status(&pool, &topic, "success").await, 8);
                eprintln!(
                    "{}: slow batch (1.2 s, lease 0.6 s){}: double={double} lost={lost} attempts={attempts:?} rival_claims={rival_claims}",
                    stringify!($module),
                    if broken { " (control: leases not locked)" } else { "" }
                );
                Some((attempts, rival_claims, (double, lost)))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batch_slower_than_its_lease_is_not_taken_over() {
                let _one = hooks::exclusive().await;
                let Some((attempts, rival_claims, double_lost)) = slow_batch(false).await else { return };
                assert_eq!(double_lost, (0, 0));
                assert_eq!(attempts, vec![1; 8], "nobody took a message of the running batch over");
                assert_eq!(rival_claims, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(idem_broken), ignore = "a control of a deliberately broken build: RUSTFLAGS=\"--cfg idem_broken\"")]
            async fn control_unlocked_batch_leases_are_taken_over() {
                let _one = hooks::exclusive().await;
                let Some((attempts, rival_claims, _)) = slow_batch(true).await else { return };
                if D == Dialect::Sqlite {
                    // The batch holds SQLite's write lock from BEGIN
                    // IMMEDIATE: nobody claims meanwhile, locked or not.
                    assert_eq!(rival_claims, 0);
                    return;
                }
                assert!(
                    rival_claims > 0 && attempts.iter().any(|a| *a == 2),
                    "the broken build was not caught: attempts={attempts:?} rival_claims={rival_claims}"
                );
            }

            /// The deduction, then the shared counter row `hot` (last, as
            /// `Relay::commit_batch` advises).
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_hot(tx: &mut Transaction<'_, Db>, msg: &Deduct, hot: i64) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query(sql(D, "UPDATE idem_r_hot SET n = n + 1 WHERE id = ?"))
                    .bind(hot)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// What a hot-row drain came to.
            struct HotRun {
                counter: i64,
                double_lost: (usize, usize),
                success: i64,
                shrinks: u64,
                now: usize,
                lost_batches: u64,
            }

            /// 64 messages whose handlers all update one counter row,
            /// batches of 16, the next `conflicts` batch commits losing a
            /// deadlock; `lost_acks`: a rate of lost acknowledgements.
            async fn hot_run(name: &str, conflicts: u64, lost_acks: f64) -> Option<HotRun> {
                let pool = pool().await?;
                sqlx::query("CREATE TABLE IF NOT EXISTS idem_r_hot (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)")
                    .execute(&pool)
                    .await
                    .expect("create table");
                let hot = ids(1);
                sqlx::query(sql(D, "INSERT INTO idem_r_hot (id, n) VALUES (?, 0)"))
                    .bind(hot)
                    .execute(&pool)
                    .await
                    .expect("insert the hot row");
                let topic = topic(name);
                let coupons = produce_n(&pool, &topic, 64, false).await;
                let relay = Relay::new(pool.clone())
                    .commit_batch(16)
                    .batch_size(32)
                    .concurrency(32)
                    .lease(Duration::from_secs(60))
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(500), Duration::from_secs(1))
                    // Batches wait for the one row as long as they must:
                    // only the injected conflicts halve the size.
                    .batch_lock_wait(Duration::from_secs(30))
                    .route(topic.clone(), move |d, m: Deduct| async move { deduct_hot(d.source(), &m, hot).await });
                let before = lost_acks_on(Kind::Batch);
                idem_runtime::testing::set_batch_conflicts(conflicts);
                idem_runtime::testing::set_lost_ack_rate(lost_acks);
                let running = relay.clone().spawn();
                let start = Instant::now();
                while by_status(&pool, &topic, "pending").await > 0 {
                    assert!(start.elapsed() < Duration::from_secs(30), "the hot-row drain did not finish");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                idem_runtime::testing::set_lost_ack_rate(0.0);
                idem_runtime::testing::set_batch_conflicts(0);
                running.shutdown().await;
                let counter: i64 = sqlx::query_scalar(sql(D, "SELECT n FROM idem_r_hot WHERE id = ?"))
                    .bind(hot)
                    .fetch_one(&pool)
                    .await
                    .expect("the counter");
                let run = HotRun {
                    counter,
                    double_lost: double_and_lost(&pool, &coupons).await,
                    success: by_status(&pool, &topic, "success").await,
                    shrinks: relay.commit_batch_shrinks(),
                    now: relay.commit_batch_now(),
                    lost_batches: lost_acks_on(Kind::Batch) - before,
                };
                eprintln!(
                    "{}: hot row ({name}): counter={} double_lost={:?} success={} shrinks={} commit_batch_now={} batch_acks_lost={} in {:?}",
                    stringify!($module),
                    run.counter, run.double_lost, run.success, run.shrinks, run.now, run.lost_batches, start.elapsed()
                );
                Some(run)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hot_row_batches_shrink_on_conflicts_and_count_each_message_once() {
                let _one = hooks::exclusive().await;
                let Some(run) = hot_run("hot", 3, 0.0).await else { return };
                assert_eq!(run.counter, 64, "the shared counter counts every message once");
                assert_eq!(run.double_lost, (0, 0), "double and lost deductions");
                assert_eq!(run.success, 64);
                assert_eq!(run.shrinks, 3, "each conflict halved the batch size");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hot_row_lost_acks_under_adaptive_batching_stay_exactly_once() {
                let _one = hooks::exclusive().await;
                let Some(run) = hot_run("hotlost", 2, 0.3).await else { return };
                assert_eq!(run.counter, 64, "the shared counter counts every message once");
                assert_eq!(run.double_lost, (0, 0), "double and lost deductions");
                assert_eq!(run.success, 64);
                assert!(run.shrinks >= 2, "the conflicts halved the batch size: {}", run.shrinks);
            }

            /// The control: with the shrinking off, the hot-row test's
            /// assertion on it fails.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(idem_broken), ignore = "a control of a deliberately broken build: RUSTFLAGS=\"--cfg idem_broken\"")]
            async fn control_hot_row_without_adaptive_batching_is_caught() {
                let _one = hooks::exclusive().await;
                idem_runtime::testing::set_broken_adaptive_batching(true);
                let Some(run) = hot_run("hotctl", 3, 0.0).await else { return };
                assert_eq!(run.counter, 64);
                assert_ne!(run.shrinks, 3, "the broken build was not caught");
                assert_eq!(run.now, 16, "the batch size never shrank");
            }

            /// The deduction, then one unit off the stock row the trap
            /// picks (`row` once the trap is sprung or off).
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_stock(tx: &mut Transaction<'_, Db>, msg: &Deduct, trap: &Trap, row: i64) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                let (row, meet) = match D {
                    Dialect::Sqlite => (row, false),
                    _ => trap.row(connection_id(tx).await?, row),
                };
                take_unit(tx, row, trap, meet).await
            }

            /// The server's id of the transaction's connection.
            async fn connection_id(tx: &mut Transaction<'_, Db>) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar(match D {
                    Dialect::Postgres => "SELECT CAST(pg_backend_pid() AS BIGINT)",
                    _ => "SELECT CAST(CONNECTION_ID() AS SIGNED)",
                })
                .fetch_one(&mut **tx)
                .await
            }

            /// One unit off stock row `row`; then, with `meet`, waits for the
            /// trap's other call.
            async fn take_unit(tx: &mut Transaction<'_, Db>, row: i64, trap: &Trap, meet: bool) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "UPDATE idem_r_stock SET n = n - 1 WHERE id = ?"))
                    .bind(row)
                    .execute(&mut **tx)
                    .await?;
                if meet {
                    trap.meet().await;
                }
                Ok(())
            }

            /// Stock rows `n` units each, the table made first.
            async fn stock_rows(pool: &Pool<Db>, count: usize, n: i64) -> Vec<i64> {
                sqlx::query("CREATE TABLE IF NOT EXISTS idem_r_stock (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)")
                    .execute(pool)
                    .await
                    .expect("create table");
                let mut rows = Vec::with_capacity(count);
                for _ in 0..count {
                    let id = ids(1);
                    sqlx::query(sql(D, "INSERT INTO idem_r_stock (id, n) VALUES (?, ?)"))
                        .bind(id)
                        .bind(n)
                        .execute(pool)
                        .await
                        .expect("insert a stock row");
                    rows.push(id);
                }
                rows
            }

            /// Units left on `rows`, in all.
            async fn stock_left(pool: &Pool<Db>, rows: &[i64]) -> i64 {
                let mut left = 0;
                for r in rows {
                    let n: i64 = sqlx::query_scalar(sql(D, "SELECT n FROM idem_r_stock WHERE id = ?"))
                        .bind(*r)
                        .fetch_one(pool)
                        .await
                        .expect("a stock row");
                    left += n;
                }
                left
            }

            /// A relay for the trap tests: `n` messages claimed and run at
            /// once, a lease no run outlives, and a back-off of 30 s (a
            /// burnt attempt shows in `attempts`, and no quick retry hides
            /// it).
            fn trap_relay(pool: &Pool<Db>, n: u32) -> Relay<Db> {
                Relay::new(pool.clone())
                    .batch_size(n)
                    .concurrency(n as usize)
                    .lease(Duration::from_secs(60))
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_secs(30), Duration::from_secs(60))
            }

            /// Two batches of two, each message taking one unit off a stock
            /// row, deadlock for sure: the first call of each batch takes
            /// a row (A, B) and waits for the other batch's first call, the
            /// second of each takes the other batch's row. The deadlock is
            /// raised inside a handler's savepoint (the loser's statement),
            /// not at the batch's commit: it is the batch's conflict all the
            /// same, so no attempt is burnt and the batch size halves.
            /// SQLite cannot deadlock (a batch holds the write lock from its
            /// `BEGIN IMMEDIATE`): the same drain, without the trap.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_deadlock_inside_a_handler_is_the_batch_conflict_and_burns_no_attempt() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let rows = stock_rows(&pool, 2, 10).await;
                let topic = topic("deadlock");
                let coupons = produce_n(&pool, &topic, 4, false).await;
                let trap = Arc::new(Trap::new([rows[0], rows[1]]));
                let t = trap.clone();
                let relay = trap_relay(&pool, 4)
                    .commit_batch(2)
                    .route(topic.clone(), move |d, m: Deduct| {
                        let t = t.clone();
                        async move { deduct_stock(d.source(), &m, &t, t.rows[0]).await }
                    });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let attempts = attempts_of(&pool, &topic).await;
                eprintln!(
                    "{}: deadlock in a batch: trap={:?} attempts={attempts:?} shrinks={} commit_batch_now={}",
                    stringify!($module),
                    trap.state(),
                    relay.commit_batch_shrinks(),
                    relay.commit_batch_now()
                );
                assert_eq!(by_status(&pool, &topic, "success").await, 4);
                assert_eq!(double_and_lost(&pool, &coupons).await, (0, 0), "double and lost deductions");
                assert_eq!(stock_left(&pool, &rows).await, 20 - 4, "each message took one unit, once");
                assert_eq!(attempts, vec![1; 4], "a conflict burnt an attempt");
                if D == Dialect::Sqlite {
                    assert_eq!(relay.commit_batch_shrinks(), 0);
                    return;
                }
                assert!(trap.sprung(), "the trap did not close: {:?}", trap.state());
                assert!(relay.commit_batch_shrinks() >= 1, "the deadlock did not halve the batch size");
            }

            /// The deduction, then one unit off each of two stock rows, in
            /// the order the trap gives (its first row, then the other).
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_two_rows(tx: &mut Transaction<'_, Db>, msg: &Deduct, trap: &Trap) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                let conn = connection_id(tx).await?;
                for given in trap.rows {
                    let (row, meet) = trap.row(conn, given);
                    take_unit(tx, row, trap, meet).await?;
                }
                Ok(())
            }

            /// Without batches: two handlers each take two stock rows, in
            /// opposite orders, and meet in between: a deadlock for sure.
            /// The loser's transaction is rolled back by the database; it
            /// runs again at once under the same attempt (no attempt
            /// burnt, no back-off: the back-off here is 30 s). SQLite
            /// serializes its transactions: nothing to test there.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_deadlock_in_a_lone_handler_runs_it_again_under_the_same_attempt() {
                let _one = hooks::exclusive().await;
                if D == Dialect::Sqlite {
                    return;
                }
                let Some(pool) = pool().await else { return };
                let rows = stock_rows(&pool, 2, 10).await;
                let topic = topic("lonedeadlock");
                let coupons = produce_n(&pool, &topic, 2, false).await;
                let trap = Arc::new(Trap::new([rows[0], rows[1]]));
                let t = trap.clone();
                let relay = trap_relay(&pool, 2)
                    .route(topic.clone(), move |d, m: Deduct| {
                        let t = t.clone();
                        async move { deduct_two_rows(d.source(), &m, &t).await }
                    });
                let running = relay.clone().spawn();
                drained(&pool, &topic).await;
                running.shutdown().await;
                let attempts = attempts_of(&pool, &topic).await;
                let reruns = relay.stats().conflict_reruns();
                eprintln!(
                    "{}: deadlock of two lone handlers: trap={:?} attempts={attempts:?} reruns={reruns}",
                    stringify!($module),
                    trap.state(),
                );
                assert!(trap.sprung(), "the trap did not close: {:?}", trap.state());
                assert_eq!(by_status(&pool, &topic, "success").await, 2);
                assert_eq!(double_and_lost(&pool, &coupons).await, (0, 0), "double and lost deductions");
                assert_eq!(stock_left(&pool, &rows).await, 20 - 4, "each message took two units, once");
                assert_eq!(attempts, vec![1; 2], "the deadlock burnt an attempt");
                assert!(reruns >= 1, "the loser ran again at once");
            }

            /// The shape of an order service: each message takes one unit off
            /// one of 10 stock rows, so concurrent batches lock them in
            /// varying order (and deadlock). Per message, then batched 16,
            /// one after the other; counted in the database, no attempt
            /// burnt; the rates are printed (`bench_peers` compares them).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hot_rows_in_varying_order_drain_per_message_and_batched() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let mut rates = Vec::new();
                for n in [1usize, 16] {
                    let rows = stock_rows(&pool, 10, 1_000).await;
                    let topic = topic(&format!("hotrows{n}"));
                    let coupons = produce_n(&pool, &topic, 320, false).await;
                    let (trap, picks) = (Arc::new(Trap::off()), rows.clone());
                    let relay = Relay::new(pool.clone())
                        .commit_batch(n)
                        .batch_size(if n > 1 { 128 } else { 64 })
                        .concurrency(if n > 1 { 128 } else { 16 })
                        .lease(Duration::from_secs(60))
                        .poll_interval(Duration::from_millis(5))
                        .backoff(Duration::from_secs(30), Duration::from_secs(60))
                        .route(topic.clone(), move |d, m: Deduct| {
                            let (t, row) = (trap.clone(), picks[(m.coupon_id.unsigned_abs() % 10) as usize]);
                            async move { deduct_stock(d.source(), &m, &t, row).await }
                        });
                    let start = Instant::now();
                    let running = relay.clone().spawn();
                    drained(&pool, &topic).await;
                    let rate = 320.0 / start.elapsed().as_secs_f64();
                    running.shutdown().await;
                    assert_eq!(by_status(&pool, &topic, "success").await, 320);
                    assert_eq!(double_and_lost(&pool, &coupons).await, (0, 0), "double and lost deductions");
                    assert_eq!(stock_left(&pool, &rows).await, 10_000 - 320, "each message took one unit, once");
                    let burnt = attempts_of(&pool, &topic).await.into_iter().filter(|a| *a != 1).count();
                    eprintln!(
                        "{}: 10 hot rows, commit_batch({n}): {rate:.0} msg/s, shrinks={} commit_batch_now={} attempts burnt={burnt}",
                        stringify!($module),
                        relay.commit_batch_shrinks(),
                        relay.commit_batch_now()
                    );
                    assert_eq!(burnt, 0, "a conflict burnt an attempt");
                    rates.push(rate);
                }
                eprintln!(
                    "{}: 10 hot rows: batched 16 / per-message {:.2}",
                    stringify!($module),
                    rates[1] / rates[0]
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drain_rate_per_message_vs_batch_16() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let mut rates = Vec::new();
                for n in [1usize, 16] {
                    let topic = topic(&format!("batchrate{n}"));
                    produce_n(&pool, &topic, 320, false).await;
                    // Per-message: the default 16 handlers at once; batched:
                    // up to eight batches of 16 at once.
                    let relay = Relay::new(pool.clone())
                        .commit_batch(n)
                        .batch_size(if n > 1 { 128 } else { 64 })
                        .concurrency(if n > 1 { 128 } else { 16 })
                        .poll_interval(Duration::from_millis(5))
                        .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await });
                    let start = Instant::now();
                    let running = relay.spawn();
                    drained(&pool, &topic).await;
                    let rate = 320.0 / start.elapsed().as_secs_f64();
                    running.shutdown().await;
                    assert_eq!(by_status(&pool, &topic, "success").await, 320);
                    rates.push(rate);
                }
                eprintln!(
                    "{}: drain rate: per-message {:.0} msg/s, commit_batch(16) {:.0} msg/s ({:.1}x)",
                    stringify!($module),
                    rates[0],
                    rates[1],
                    rates[1] / rates[0]
                );
            }
        }
    };
}

idem_testkit::for_each_backend!(batch_tests);
