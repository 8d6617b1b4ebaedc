//! The consumer's database goes down under load (issue 38): the handler's
//! connections are cut and refused (a `FaultProxy` taken down, as a
//! restart looks from the client) for far longer than the consumer's
//! back-off budget (`max_attempts` 2), then come back. A try that failed
//! in the outage is no attempt: the delivery waits in place and runs again,
//! so nothing is dead-lettered and every effect lands once. The control
//! turns the old rule back on (an outage counts as an attempt) and sees
//! dead letters.

use crate::common::amqp::*;
use crate::common::hooks;
use idem_testkit::proxy::FaultProxy;
use idem_testkit::wait_for;
use sqlx::postgres::PgPoolOptions;

const N: usize = 120;

struct Run {
    dead: u64,
    effects: i64,
    distinct: i64,
    outage_waits: u64,
}

async fn effects(pool: &PgPool, coupons: &[i64]) -> (i64, i64) {
    sqlx::query_as::<sqlx::Postgres, (i64, i64)>(
        "SELECT COUNT(*), COUNT(DISTINCT coupon_id) FROM idem_q_deduction WHERE coupon_id = ANY($1)",
    )
    .bind(coupons)
    .fetch_one(pool)
    .await
    .expect("effects")
}

async fn run() -> Option<Run> {
    let (pool, conn) = servers().await?;
    let base = idem_testkit::postgres_url();
    let proxy = FaultProxy::for_url(&base, 0.0).await.expect("proxy");
    // The handler's pool goes through the proxy; a short acquire time-out
    // so that a refused connection is an error within a second.
    let handler_pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&proxy.url(&base))
        .await
        .expect("pool through the proxy");
    let (t, exchange, routing_key) = topology(&conn, "db_outage").await;
    let mut coupons = Vec::with_capacity(N);
    for _ in 0..N {
        coupons.push(coupon(&pool, "UNUSED").await);
    }
    let ids: Vec<i64> = coupons.iter().map(|d| d.coupon_id).collect();
    let consumer = Consumer::new(conn.clone(), &t.queue, deducting(&handler_pool))
        .prefetch(8)
        .max_attempts(2)
        .backoff(Duration::from_millis(20), Duration::from_millis(80))
        .outage_retry(Duration::from_millis(200))
        .spawn()
        .await
        .expect("consumer");
    let publisher = Publisher::new(conn.clone(), &exchange);
    let (first, second) = coupons.split_at(N / 2);
    for d in first {
        publish_json(&publisher, &routing_key, &format!("dbo-{}", d.coupon_id), d).await;
    }
    wait_for(
        "a quarter of the effects",
        Duration::from_secs(60),
        || async { effects(&pool, &ids).await.1 >= (N / 4) as i64 },
    )
    .await;
    // The outage: every connection cut, new ones refused, until the
    // handlers have failed in it 40 times (20 times their max_attempts)
    // and it has lasted 2 s. The second half arrives meanwhile.
    let failed = |h: &ConsumerHandle| {
        let s = h.stats();
        s.outage_waits() + s.retried() + s.dead_lettered()
    };
    let before = failed(&consumer);
    proxy.set_down(true);
    let down = Instant::now();
    for d in second {
        publish_json(&publisher, &routing_key, &format!("dbo-{}", d.coupon_id), d).await;
    }
    // (Or, in the control, until every message not yet done is dead.)
    wait_for(
        "the handlers to fail in the outage",
        Duration::from_secs(60),
        || async {
            let settled = effects(&pool, &ids).await.1 as u64 + counts(&consumer).3 >= N as u64;
            let seen = failed(&consumer) >= before + 40 || settled;
            seen && down.elapsed() >= Duration::from_secs(2)
        },
    )
    .await;
    proxy.set_down(false);
    let back = Instant::now();
    wait_for("every coupon settled", Duration::from_secs(120), || async {
        let done = effects(&pool, &ids).await.1 as u64 + counts(&consumer).3;
        done >= N as u64
            && ready(&conn, &t.queue).await == 0
            && ready(&conn, &t.retry_queue).await == 0
    })
    .await;
    let drain = back.elapsed();
    let (executed, duplicates, retried, dead, _) = counts(&consumer);
    let outage_waits = consumer.stats().outage_waits();
    consumer.shutdown().await.expect("shutdown");
    let (effects, distinct) = effects(&pool, &ids).await;
    let dead_queued = ready(&conn, &t.dead_letter_queue).await;
    teardown(&conn, &t).await;
    eprintln!(
        "amqp consumer, database down {:.1} s: {N} messages, drained {:.1} s after; executed {executed}, Duplicate {duplicates}, retried {retried}, dead {dead} ({dead_queued} in the dead-letter queue), tries waited in place {outage_waits}",
        back.duration_since(down).as_secs_f64(),
        drain.as_secs_f64(),
    );
    Some(Run {
        dead: dead.max(u64::from(dead_queued)),
        effects,
        distinct,
        outage_waits,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_under_a_consumer_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let Some(r) = run().await else { return };
    assert_eq!(r.dead, 0, "dead letters");
    assert_eq!(r.distinct, N as i64, "lost effects");
    assert_eq!(r.effects, N as i64, "double effects");
    assert!(
        r.outage_waits > 0,
        "tries waited in place: {}",
        r.outage_waits
    );
}

/// The control: the old rule (an outage counts as an attempt) dead-letters
/// healthy messages in the same run.
#[cfg_attr(
    not(idem_broken),
    ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_outage_counted_by_a_consumer_dead_letters() {
    let _hooks = hooks::exclusive().await;
    idem_runtime::testing::set_broken_outage_counted(true);
    let r = run().await;
    idem_runtime::testing::set_broken_outage_counted(false);
    let Some(r) = r else { return };
    eprintln!("control: {} dead letters, {} effects", r.dead, r.distinct);
    assert!(
        r.dead > 0,
        "the old rule dead-letters messages in the outage"
    );
}
