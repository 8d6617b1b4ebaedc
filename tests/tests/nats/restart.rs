//! A nats-server restart under load (issue 38): a relay publishing through
//! the JetStream `Publisher` and a `Consumer` running the `#[idempotent]`
//! handler, while a nats-server of the test's own (`-js`, its own port
//! and store) is stopped (SIGTERM, SIGKILL) for far longer than the
//! relay's back-off budget (`max_attempts` 3) and started again on the
//! same port and store. The client reconnects on its own; a publish that
//! failed while it was disconnected is an outage, not an attempt. Every
//! message must end `success`, none dead-lettered, every effect once. The
//! control turns the old rule back on (an outage counts as an attempt).

use crate::common::hooks;
use crate::common::nats::*;
use idem_runtime::outbox::{Relay, RelayHandle, enqueue};
use idem_testkit::cluster::nats::NatsCluster;
use idem_testkit::wait_for;

const N: usize = 300;

async fn scalar(pool: &PgPool, sql: &'static str, topic: &str) -> i64 {
    sqlx::query_scalar::<Postgres, i64>(sql)
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// The items' messages enqueued one every 15 ms (about 4.5 s for all).
fn produce(pool: &PgPool, topic: &str) -> (Vec<i64>, tokio::task::JoinHandle<()>) {
    let items: Vec<i64> = (0..N).map(|_| ids(1)).collect();
    let (pool, topic, all) = (pool.clone(), topic.to_owned(), items.clone());
    let producer = tokio::spawn(async move {
        for item in all {
            let mut tx = pool.begin().await.unwrap();
            enqueue(
                &mut tx,
                &topic,
                &format!("job-{item}"),
                &Job::new(item).json(),
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    (items, producer)
}

/// Stops the server, waits until it has been down 3 s and 30 of the
/// relay's attempts failed in the outage, starts it again. Returns the
/// outage's length.
async fn outage(node: &NatsCluster, kill: bool, relay: &RelayHandle) -> Duration {
    let stopped = Instant::now();
    match kill {
        true => node.kill9(0),
        false => node.terminate(0),
    }
    let failed = |s: &idem_runtime::outbox::RelayStats| s.retried() + s.dead_lettered();
    let before = failed(relay.stats());
    wait_for(
        "the relay to see the outage",
        Duration::from_secs(90),
        || {
            let seen = failed(relay.stats());
            let long = stopped.elapsed() >= Duration::from_secs(3);
            async move { long && seen >= before + 30 }
        },
    )
    .await;
    node.restart(0).await;
    stopped.elapsed()
}

async fn run(kill: bool) -> Option<(i64, i64, i64, i64)> {
    let pool = idem_testkit::postgres(8).await?;
    let node = NatsCluster::start(1).await?;
    let mut js = node.connect().await;
    // Publishes acknowledged within 500 ms (default 5 s): while the server
    // is down each message fails many times, far past `max_attempts`.
    js.set_timeout(Duration::from_millis(500));
    let table = effects_table(&pool).await;
    let t = topology(&js, "restart", |t| t).await;
    let topic = t.subjects[0].clone();
    let (items, producer) = produce(&pool, &topic);
    let publisher = Publisher::new(js.clone()).expected_stream(&t.stream);
    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .spawn()
        .await
        .expect("consumer");
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .max_attempts(3)
        .backoff(Duration::from_millis(20), Duration::from_millis(80))
        .poll_interval(Duration::from_millis(20))
        .spawn();
    wait_for(
        "a quarter of the effects",
        Duration::from_secs(60),
        || async { all_effects(&pool, &table).await >= (N / 4) as i64 },
    )
    .await;
    let outage = outage(&node, kill, &relay).await;
    producer.await.expect("producer");
    let back = Instant::now();
    wait_for(
        "the drain after the restart",
        Duration::from_secs(120),
        || async {
            let open = scalar(
                &pool,
                "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'pending'",
                &topic,
            )
            .await;
            let (_, lost) = double_and_lost(&pool, &table, &items).await;
            open == 0 && lost == 0
        },
    )
    .await;
    let drain = back.elapsed();
    let stats = relay.stats().snapshot();
    relay.shutdown().await;
    let _ = consumer.shutdown().await;
    let (double, lost) = double_and_lost(&pool, &table, &items).await;
    let dead = scalar(
        &pool,
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'failed'",
        &topic,
    )
    .await;
    let success = scalar(
        &pool,
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'success'",
        &topic,
    )
    .await;
    eprintln!(
        "nats restart ({}): {N} messages, outage {:.1} s, drained {:.1} s after the restart; relay outages {} (retried {}, dead {}); success {success}, double {double}, lost {lost}",
        if kill { "SIGKILL" } else { "SIGTERM" },
        outage.as_secs_f64(),
        drain.as_secs_f64(),
        stats.outages,
        stats.retried,
        stats.dead_lettered,
    );
    drop_table(&pool, &table).await;
    Some((dead, success, double, lost))
}

fn check((dead, success, double, lost): (i64, i64, i64, i64)) {
    assert_eq!(dead, 0, "dead letters");
    assert_eq!(success, N as i64, "messages settled success");
    assert_eq!(lost, 0, "lost effects");
    assert_eq!(double, 0, "double effects");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sigterm_restart_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    if let Some(r) = run(false).await {
        check(r);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sigkill_restart_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    if let Some(r) = run(true).await {
        check(r);
    }
}

/// The control: the old rule (an outage counts as an attempt) dead-letters
/// healthy messages in the same run.
#[cfg_attr(
    not(idem_broken),
    ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_outage_counted_as_attempts_dead_letters() {
    let _hooks = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    idem_runtime::testing::set_broken_outage_counted(true);
    let r = run(true).await;
    idem_runtime::testing::set_broken_outage_counted(false);
    let Some((dead, ..)) = r else { return };
    eprintln!("control: {dead} dead letters");
    assert!(dead > 0, "the old rule dead-letters messages in the outage");
}
