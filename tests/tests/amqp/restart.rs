//! A broker restart under load (issue 38): a relay publishing through a
//! reconnecting `Publisher` and a reconnecting `Consumer` running the
//! `#[idempotent]` handler, while a RabbitMQ node of the test's own (its
//! own ports and data directory) is stopped (SIGTERM, SIGKILL) for far
//! longer than the relay's back-off budget (`max_attempts` 3) and started
//! again on the same port and data. Every message must end `success`, none
//! dead-lettered, every effect exactly once. The control turns the old
//! rule back on (an outage counts as an attempt) and sees dead letters.

use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::amqp::Connector;
use idem_runtime::outbox::{Relay, RelayHandle};
use idem_testkit::cluster::rabbitmq::RabbitCluster;
use idem_testkit::wait_for;
use sqlx::Postgres as Pg;

const N: usize = 300;

/// What one run found.
struct Run {
    outage: Duration,
    drain: Duration,
    dead: i64,
    settled: i64,
    effects: i64,
    coupons: i64,
    /// The publisher's and the consumer's reconnects.
    reconnects: (u64, u64),
}

/// The coupons, then a producer enqueueing their messages one every
/// 15 ms (about 4.5 s for all), so that messages keep arriving while the
/// broker is down.
async fn produce(pool: &PgPool, topic: &str) -> (Vec<Deduct>, tokio::task::JoinHandle<()>) {
    let mut coupons = Vec::with_capacity(N);
    for _ in 0..N {
        coupons.push(coupon(pool, "UNUSED").await);
    }
    let (pool, topic, all) = (pool.clone(), topic.to_owned(), coupons.clone());
    let producer = tokio::spawn(async move {
        for d in all {
            let mut tx = pool.begin().await.unwrap();
            idem_runtime::outbox::enqueue(
                &mut tx,
                &topic,
                &format!("order-{}", d.order_id),
                &serde_json::to_value(&d).unwrap(),
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    (coupons, producer)
}

async fn scalar(pool: &PgPool, sql: &'static str, topic: &str) -> i64 {
    sqlx::query_scalar::<Pg, i64>(sql)
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("count")
}

async fn effects(pool: &PgPool, coupons: &[i64]) -> (i64, i64) {
    sqlx::query_as::<Pg, (i64, i64)>(
        "SELECT COUNT(*), COUNT(DISTINCT coupon_id) FROM idem_q_deduction WHERE coupon_id = ANY($1)",
    )
    .bind(coupons)
    .fetch_one(pool)
    .await
    .expect("effects")
}

fn relay(pool: &PgPool, topic: &str, publisher: &Publisher) -> RelayHandle {
    Relay::new(pool.clone())
        .route(topic.to_owned(), publisher.route())
        .max_attempts(3)
        .backoff(Duration::from_millis(20), Duration::from_millis(80))
        .poll_interval(Duration::from_millis(20))
        .spawn()
}

/// Stops the node (`kill`: SIGKILL, else SIGTERM), waits until it has
/// been down 3 s and at least 30 of the relay's attempts failed in the
/// outage (far beyond `max_attempts` 3 with its back-off), and starts it
/// again on the same port and data. Returns the outage's length.
async fn outage(node: &Arc<RabbitCluster>, kill: bool, relay: &RelayHandle) -> Duration {
    let stopped = Instant::now();
    let n = node.clone();
    tokio::task::spawn_blocking(move || if kill { n.kill9(0) } else { n.terminate(0) })
        .await
        .unwrap();
    let failed = |s: &idem_runtime::outbox::RelayStats| s.retried() + s.dead_lettered();
    let before = failed(relay.stats());
    wait_for(
        "the relay to see the outage",
        Duration::from_secs(60),
        || {
            let seen = failed(relay.stats());
            let long = stopped.elapsed() >= Duration::from_secs(3);
            async move { long && seen >= before + 30 }
        },
    )
    .await;
    let n = node.clone();
    tokio::task::spawn_blocking(move || n.restart(0))
        .await
        .unwrap();
    stopped.elapsed()
}

/// One run: load, the node stopped (`kill`: SIGKILL, else SIGTERM) until
/// it has been down 3 s and at least 30 publishes failed in the outage,
/// started again, drained.
async fn run(kill: bool) -> Option<Run> {
    let pool = database().await?;
    let node = tokio::task::spawn_blocking(|| RabbitCluster::start(1))
        .await
        .expect("start")?;
    let node = Arc::new(node);
    let name = unique("restart");
    let (exchange, topic) = (format!("{name}.x"), format!("{name}.t"));
    let t = Topology::new(name.clone()).bind(exchange.clone(), topic.clone());
    let connector = |t: &Topology| {
        Connector::new(node.url(0))
            .backoff(Duration::from_millis(50), Duration::from_secs(1))
            .topology(t.clone())
    };
    let (pub_side, con_side) = (connector(&t), connector(&t));
    pub_side.connection().await.expect("declare");
    let (coupons, producer) = produce(&pool, &topic).await;
    let coupons: Vec<i64> = coupons.iter().map(|d| d.coupon_id).collect();
    let publisher = Publisher::new(pub_side.clone(), &exchange);
    let consumer = Consumer::new(con_side.clone(), &t.queue, deducting(&pool))
        .prefetch(16)
        .max_attempts(3)
        .spawn()
        .await
        .expect("consumer");
    let relay = relay(&pool, &topic, &publisher);
    // Under load: a quarter of the effects done, the rest in flight or
    // still to be enqueued.
    wait_for(
        "a quarter of the effects",
        Duration::from_secs(60),
        || async { effects(&pool, &coupons).await.0 >= (N / 4) as i64 },
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
            let dead = scalar(
                &pool,
                "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'failed'",
                &topic,
            )
            .await;
            open == 0 && effects(&pool, &coupons).await.1 + dead >= N as i64
        },
    )
    .await;
    let drain = back.elapsed();
    let stats = relay.stats().snapshot();
    let (executed, duplicates, ..) = counts(&consumer);
    relay.shutdown().await;
    let _ = consumer.shutdown().await;
    let (effects, distinct) = effects(&pool, &coupons).await;
    eprintln!(
        "restart ({}): {N} messages, outage {:.1} s, drained {:.1} s after the restart; relay outages {} (retried {}, dead {}), reconnects publisher {} consumer {}; consumer executed {executed}, answered Duplicate {duplicates}",
        if kill { "SIGKILL" } else { "SIGTERM" },
        outage.as_secs_f64(),
        drain.as_secs_f64(),
        stats.outages,
        stats.retried,
        stats.dead_lettered,
        pub_side.reconnects(),
        con_side.reconnects(),
    );
    Some(Run {
        outage,
        drain,
        dead: scalar(
            &pool,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'failed'",
            &topic,
        )
        .await,
        settled: scalar(
            &pool,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'success'",
            &topic,
        )
        .await,
        effects,
        coupons: distinct,
        reconnects: (pub_side.reconnects(), con_side.reconnects()),
    })
}

fn check(r: &Run) {
    assert_eq!(r.dead, 0, "dead letters");
    assert_eq!(r.settled, N as i64, "messages settled success");
    assert_eq!(r.coupons, N as i64, "lost effects");
    assert_eq!(r.effects, N as i64, "double effects");
    assert!(
        r.reconnects.0 >= 1 && r.reconnects.1 >= 1,
        "{:?}",
        r.reconnects
    );
    assert!(r.outage > Duration::from_secs(3) && r.drain < Duration::from_secs(120));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sigterm_restart_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    if let Some(r) = run(false).await {
        check(&r);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sigkill_restart_dead_letters_nothing_and_acts_once() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    if let Some(r) = run(true).await {
        check(&r);
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
    let Some(r) = r else { return };
    eprintln!("control: {} dead letters, {} effects", r.dead, r.effects);
    assert!(
        r.dead > 0,
        "the old rule dead-letters messages in the outage"
    );
}
