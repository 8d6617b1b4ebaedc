//! A broker consumer (Redis Streams, on each database) stopped by a
//! cancellation token: its status says running, then stopped; its report
//! has the counters; in the database each coupon was used and awarded
//! once, and in Redis nothing is left pending. Skipped when Redis is down.

use crate::common::redis_streams::*;
use idem_runtime::task::TaskStatus;
use tokio_util::sync::CancellationToken;

async fn stops_on_a_token(backend: &str) {
    let Some(client) = shared_redis().await else {
        return;
    };
    let Some((pool, d)) = database(backend).await else {
        return;
    };
    let stream = unique("idem_lc_consumer");
    let group = "effects";
    let coupons = coupons(&pool, d, 5).await;
    let publisher = Publisher::new(client.clone());
    publish(&publisher, &stream, &coupons, 1, |c| Use {
        coupon_id: c,
        ..Use::default()
    })
    .await;
    let token = CancellationToken::new();
    let running = consumer(&client, &stream, group, &pool, d, "lifecycle")
        .spawn()
        .await
        .expect("consumer")
        .stop_on(token.clone().cancelled_owned());
    wait_for(
        "every coupon used and awarded",
        Duration::from_secs(60),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { done(pool, d, coupons).await == coupons.len() }
        },
    )
    .await;
    let n = coupons.len() as u64;
    wait_for("every entry settled", Duration::from_secs(30), || {
        let (_, executed, ..) = counts(&running);
        async move { executed >= n }
    })
    .await;
    assert_eq!(running.status(), TaskStatus::Running);
    token.cancel();
    tokio::time::timeout(Duration::from_secs(30), running.finished())
        .await
        .expect("the consumer stops on its token");
    assert_eq!(running.status(), TaskStatus::Stopped);
    let report = running
        .shutdown_within(Duration::from_secs(5))
        .await
        .expect("a clean stop");
    let left = pending(&client, &stream, group).await;
    delete(&client, &[&stream, &format!("{stream}:dlq")]).await;
    assert!(!report.abandoned, "{report:?}");
    assert_eq!(report.stats.executed(), n, "{report:?}");
    assert_eq!(left, 0, "every entry acknowledged");
    assert_once(&pool, d, &coupons).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stops_on_a_token_postgres() {
    stops_on_a_token("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stops_on_a_token_mariadb() {
    stops_on_a_token("mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stops_on_a_token_sqlite() {
    stops_on_a_token("sqlite").await;
}
