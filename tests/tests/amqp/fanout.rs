//! One RabbitMQ delivery, several handlers (`Consumer::fan_out`), against
//! the real broker and PostgreSQL: a state machine (the coupon deduction)
//! and a record (an e-mail) subscribed to one queue. Counted in the
//! database: each subscriber's effect exactly once per coupon under
//! duplicate publishes and lost commit acknowledgements, every delivery
//! acknowledged, nothing dead-lettered; a subscriber failing its first
//! attempts acts once later while the other acts once; the misuses
//! (a subscriber on a one-handler consumer, two of one name, a fan-out
//! without subscribers) are loud.
//!
//! Its tests run one at a time, and beside no other test of the binary
//! that commits through idem (`common::hooks`): the lost-acknowledgement
//! hook is process-wide.

use crate::common::amqp::*;
use crate::common::hooks;

async fn mail_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_q_mail (coupon_id BIGINT NOT NULL, attempt INT NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("create table");
}

/// The second subscriber: a record in a scope of its own, failing (after
/// its write, so that the write must roll back) on attempts up to
/// `fail_until`.
#[idempotent(key = "mail:{d.coupon_id}", strategy = record, biz_type = "amqp_fanout_mail")]
async fn mail(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message,
    d: &Deduct,
    fail_until: u32,
) -> Result<(), Error> {
    sqlx::query("INSERT INTO idem_q_mail (coupon_id, attempt) VALUES ($1, $2)")
        .bind(d.coupon_id)
        .bind(m.attempt as i32)
        .execute(&mut **tx)
        .await?;
    if m.attempt <= fail_until {
        return Err(Error::retryable(format!(
            "mail server unavailable (attempt {})",
            m.attempt
        )));
    }
    Ok(())
}

async fn mails(pool: &PgPool, coupon: i64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_q_mail WHERE coupon_id = $1")
        .bind(coupon)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// The two subscribers on `queue`, the mail failing up to `fail_until`.
fn consumer(conn: &Arc<Connection>, queue: &str, pool: &PgPool, fail_until: u32) -> Consumer {
    let p = pool.clone();
    Consumer::fan_out(conn.clone(), queue)
        .subscribe("deduct", deducting(pool))
        .subscribe("mail", move |m: Message, d: Deduct| {
            let pool = p.clone();
            async move { mail(&pool, &m, &d, fail_until).await }
        })
        .backoff(Duration::from_millis(20), Duration::from_millis(50))
        .max_attempts(30)
}

/// `n` coupons published, every third twice (a republish after a lost
/// confirm: same message id).
async fn publish_n(
    conn: &Arc<Connection>,
    exchange: &str,
    topic: &str,
    pool: &PgPool,
    n: usize,
) -> (Vec<Deduct>, usize) {
    let publisher = Publisher::new(conn.clone(), exchange);
    let mut coupons = Vec::new();
    let mut published = 0;
    for k in 0..n {
        let d = coupon(pool, "UNUSED").await;
        let id = format!("order-{}", d.order_id);
        for _ in 0..(if k % 3 == 0 { 2 } else { 1 }) {
            publish_json(&publisher, topic, &id, &d).await;
            published += 1;
        }
        coupons.push(d);
    }
    (coupons, published)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscriber_acts_once_under_duplicates_and_lost_acknowledgements() {
    let _one = hooks::exclusive().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    mail_table(&pool).await;
    let (t, exchange, topic) = topology(&conn, "fanout").await;
    let (coupons, published) = publish_n(&conn, &exchange, &topic, &pool, 24).await;
    idem_runtime::testing::set_lost_ack_rate(0.25);
    let running = consumer(&conn, &t.queue, &pool, 0)
        .prefetch(8)
        .spawn()
        .await
        .expect("consumer");
    until("every delivery acked", Duration::from_secs(30), || {
        let (e, d, ..) = counts(&running);
        e + d >= published as u64
    })
    .await;
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "amqp fan-out: (executed, duplicates, retried, dead, settle_failed) = {c:?}, lost acks {}",
        idem_runtime::testing::lost_acks()
    );
    for d in &coupons {
        assert_eq!(
            (
                deductions(&pool, d.coupon_id).await,
                mails(&pool, d.coupon_id).await
            ),
            (1, 1),
            "coupon {}",
            d.coupon_id
        );
        assert_eq!(status(&pool, d.coupon_id).await, "USED");
    }
    assert_eq!(c.3, 0, "nothing dead-lettered");
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_subscriber_acts_later_and_the_other_acts_once() {
    let _one = hooks::exclusive().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    mail_table(&pool).await;
    let (t, exchange, topic) = topology(&conn, "fanfail").await;
    let (coupons, published) = publish_n(&conn, &exchange, &topic, &pool, 6).await;
    // The mail fails its first two attempts of each delivery.
    let running = consumer(&conn, &t.queue, &pool, 2)
        .spawn()
        .await
        .expect("consumer");
    until("every delivery acked", Duration::from_secs(30), || {
        let (e, d, ..) = counts(&running);
        e + d >= published as u64
    })
    .await;
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    for d in &coupons {
        assert_eq!(deductions(&pool, d.coupon_id).await, 1, "deducted once");
        // The failed attempts' writes rolled back: one row, of attempt 3.
        let attempts: Vec<i32> =
            sqlx::query_scalar("SELECT attempt FROM idem_q_mail WHERE coupon_id = $1")
                .bind(d.coupon_id)
                .fetch_all(&pool)
                .await
                .expect("mail rows");
        assert_eq!(attempts, vec![3], "mailed once, on its third attempt");
    }
    assert!(c.2 >= 2 * coupons.len() as u64, "retried: {c:?}");
    assert_eq!(c.3, 0, "nothing dead-lettered");
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test]
async fn a_fan_out_without_subscribers_is_refused() {
    let Some(conn) = broker().await else {
        return;
    };
    let e = Consumer::fan_out(conn, "idem_q_nobody")
        .spawn()
        .await
        .expect_err("a fan-out without subscribers");
    assert!(matches!(e, Error::Config { .. }), "{e:#}");
    assert!(format!("{e:#}").contains("without subscribers"), "{e:#}");
}

/// The panic message of `build`, which must panic.
fn panic_of(build: impl FnOnce()) -> String {
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build))
        .expect_err("the builder must panic");
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[tokio::test]
async fn a_subscriber_on_a_one_handler_consumer_or_two_of_one_name_panic() {
    let Some(conn) = broker().await else {
        return;
    };
    let c = conn.clone();
    let why = panic_of(move || {
        let _ = Consumer::new(c, "q", |_m: Message, _d: Deduct| async {
            Ok(Outcome::Executed(()))
        })
        .subscribe("b", |_m: Message, _d: Deduct| async {
            Ok(Outcome::Executed(()))
        });
    });
    assert!(why.contains("has a handler already"), "{why}");
    let why = panic_of(move || {
        let _ = Consumer::fan_out(conn, "q")
            .subscribe("a", |_m: Message, _d: Deduct| async {
                Ok(Outcome::Executed(()))
            })
            .subscribe("a", |_m: Message, _d: Deduct| async {
                Ok(Outcome::Executed(()))
            });
    });
    assert!(why.contains("subscriber named `a` already"), "{why}");
}
