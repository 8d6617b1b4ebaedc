//! The consumer's database goes down under load: the handlers'
//! connections are cut and refused (a `FaultProxy` taken down, as a
//! restart looks from the client) for far longer than two tries with
//! their back-off, then come back. A try that failed in the outage is no
//! try: it waits in place and runs again, so nothing is dead-lettered and
//! every effect lands once. The control turns the old rule back on (an
//! outage counted as a try) and sees dead letters.

use crate::common::hooks;
use crate::common::redis_streams::*;
use idem_testkit::proxy::FaultProxy;

#[derive(Debug)]
struct Run {
    dead: u64,
    lost: usize,
    outage_waits: u64,
}

async fn run() -> Option<Run> {
    let client = shared_redis().await?;
    let (pool, d) = database("postgres").await?;
    let base = idem_testkit::postgres_url();
    let proxy = FaultProxy::for_url(&base, 0.0).await.expect("proxy");
    // The handlers' pool goes through the proxy; a short acquire time-out
    // so that a refused connection is an error within a second.
    let handler_pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&proxy.url(&base))
        .await
        .expect("pool through the proxy");
    let stream = unique("idem_rs_dbo");
    let group = "effects";
    let consumer = consumer(&client, &stream, group, &handler_pool, d, "solo")
        .max_attempts(2)
        .backoff(Duration::from_millis(20), Duration::from_millis(80))
        .outage_retry(Duration::from_millis(200))
        .spawn()
        .await
        .expect("consumer");
    let coupons = coupons(&pool, d, 120).await;
    let (one, two) = coupons.split_at(coupons.len() / 2);
    let publisher = Publisher::new(client.clone());
    let job = |c| Use {
        coupon_id: c,
        ..Use::default()
    };
    publish(&publisher, &stream, one, 1, job).await;
    wait_for("a quarter of the effects", Duration::from_secs(60), || {
        let (pool, coupons) = (&pool, &coupons);
        async move { done(pool, d, coupons).await >= coupons.len() / 4 }
    })
    .await;
    // The outage: every connection cut, new ones refused, until the
    // handlers have failed in it 40 times (20 times max_attempts) and it
    // has lasted 4 s. The second half arrives meanwhile.
    let failed = |h: &ConsumerHandle| {
        let s = h.stats();
        s.outage_waits() + s.retried() + s.dead_lettered()
    };
    let before = failed(&consumer);
    proxy.set_down(true);
    let down = Instant::now();
    publish(&publisher, &stream, two, 1, job).await;
    // (Or, in the control, until every entry not yet done is dead.)
    wait_for(
        "the handlers to fail in the outage",
        Duration::from_secs(60),
        || {
            let (pool, coupons, consumer) = (&pool, &coupons, &consumer);
            async move {
                let lost = coupons.len() - done(pool, d, coupons).await;
                let settled = lost as u64 <= counts(consumer).4;
                let seen = failed(consumer) >= before + 40 || settled;
                seen && down.elapsed() >= Duration::from_secs(4)
            }
        },
    )
    .await;
    proxy.set_down(false);
    let back = Instant::now();
    wait_for("every entry settled", Duration::from_secs(120), || {
        let (pool, coupons, consumer) = (&pool, &coupons, &consumer);
        async move {
            let lost = coupons.len() - done(pool, d, coupons).await;
            lost as u64 <= counts(consumer).4
        }
    })
    .await;
    let drain = back.elapsed();
    let c = counts(&consumer);
    let outage_waits = consumer.stats().outage_waits();
    consumer.shutdown().await.expect("shutdown");
    delete(&client, &[&stream, &format!("{stream}:dlq")]).await;
    let lost = coupons.len() - done(&pool, d, &coupons).await;
    eprintln!(
        "redis streams consumer, database down {:.1} s: {} entries, drained {:.1} s after; (received, executed, duplicates, retried, dead, settle_failed) = {c:?}, tries waited in place {outage_waits}",
        back.duration_since(down).as_secs_f64(),
        coupons.len(),
        drain.as_secs_f64(),
    );
    if c.4 == 0 {
        assert_once(&pool, d, &coupons).await;
    }
    Some(Run {
        dead: c.4,
        lost,
        outage_waits,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_under_a_consumer_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(r) = run().await else { return };
    assert_eq!((r.dead, r.lost), (0, 0), "(dead letters, lost): {r:?}");
    assert!(r.outage_waits > 0, "tries waited in place: {r:?}");
}

/// The control: the old rule (an outage counts as a try) dead-letters
/// healthy entries in the same run.
#[cfg_attr(
    not(idem_broken),
    ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_outage_counted_by_a_consumer_dead_letters() {
    let _hooks = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    idem_runtime::testing::set_broken_outage_counted(true);
    let Some(r) = run().await else { return };
    eprintln!("control: {r:?}");
    assert!(
        r.dead > 0,
        "the old rule dead-letters entries in the outage: {r:?}"
    );
}
